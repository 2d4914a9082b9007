// toolmesh's runner for tools written as JavaScript packages (see toolmesh/sources/worker.py).
// Usage: node runner.mjs ENTRY_FILE
// Speaks one JSON object per line: calls on stdin, answers on stdout. Whatever the tool code
// prints goes to stderr, so it cannot break the protocol.
import { pathToFileURL } from "node:url";
import { createInterface } from "node:readline";
import { Readable } from "node:stream";

const protocol = process.stdout.write.bind(process.stdout);
// The tool's process.stdout is stderr, fd included: `fs.writeSync(process.stdout.fd, ...)`
// must not reach the protocol, and `process.stdout.end()` must not close it.
Object.defineProperty(process, "stdout", { configurable: true, get: () => process.stderr });
// Likewise the calls come in on the real stdin, which the tool does not see: a tool that
// paused, closed or read it would stop the worker (or read the other calls' arguments).
const calls = process.stdin;
const nothing = new Readable({ read() { this.push(null); } });
Object.defineProperty(process, "stdin", { configurable: true, get: () => nothing });
for (const name of ["log", "info", "debug"]) console[name] = console.error;
// A stray rejection or exception in the tool's background work (a timer, an event handler)
// must not kill the calls running beside it.
process.on("unhandledRejection", (reason) => console.error("unhandled rejection:", describe(reason)));
process.on("uncaughtException", (error) => console.error("uncaught exception:", describe(error)));

const MESSAGE_LIMIT = 16 * 1024; // characters kept of an error's message

function send(message) {
  // The leading newline ends whatever partial line the tool wrote to fd 1 itself, so that the
  // message always starts a line of its own (the host skips the blank lines).
  protocol("\n" + encode(message) + "\n");
}

class NotJSON extends TypeError {}

function encode(message) {
  // JSON.stringify turns what JSON cannot hold into something else without a word: NaN and
  // Infinity into null, a Map or a Set into {}, a typed array into {"0": ...}. Sets, Maps with
  // string keys and typed arrays are sent as what they hold; the rest is refused, by its path
  // (found in a second pass, so that what is sent pays for no path).
  try {
    return JSON.stringify(message, convert);
  } catch (error) {
    if (!(error instanceof NotJSON)) throw error;
    JSON.stringify(message, tracked());
    throw new NotJSON(`a value ${error.message}`);
  }
}

function convert(key, value) {
  switch (typeof value) {
    case "bigint":
      throw new NotJSON(`is a BigInt (${value}n), which JSON cannot hold; convert it with Number() or String()`);
    case "number":
      if (!Number.isFinite(value)) throw new NotJSON(`is ${value}, which JSON cannot hold`);
      return value;
    case "object":
      if (value === null || Array.isArray(value)) return value;
      if (value instanceof Set) return [...value];
      if (value instanceof Map) {
        for (const k of value.keys()) {
          if (typeof k !== "string" && typeof k !== "number") {
            throw new NotJSON(`is a Map with ${typeName(k)} key; JSON objects have only string keys`);
          }
        }
        return Object.fromEntries(value);
      }
      if (ArrayBuffer.isView(value) && !(value instanceof DataView)) return Array.from(value);
  }
  return value;
}

function tracked() {
  const paths = new WeakMap(); // each object met: its path
  return function (key, value) {
    const parent = paths.get(this);
    const path =
      parent === undefined ? "" : Array.isArray(this) ? `${parent}[${key}]` : parent ? `${parent}.${key}` : key;
    let converted;
    try {
      converted = convert(key, value);
    } catch (error) {
      throw error instanceof NotJSON ? new NotJSON(`${path || "the value"} ${error.message}`) : error;
    }
    if (converted !== null && typeof converted === "object") paths.set(converted, path);
    return converted;
  };
}

function describe(error) {
  const text = describeFully(error);
  if (text.length <= MESSAGE_LIMIT) return text;
  let end = MESSAGE_LIMIT;
  const last = text.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end -= 1; // not half a surrogate pair
  return `${text.slice(0, end)} [... ${text.length - end} more characters cut]`;
}

function describeFully(error) {
  // Anything may be thrown: an Error, a string, null, an object without a prototype.
  try {
    if (error instanceof Error || (error && typeof error.message === "string")) {
      return `${error.name || "Error"}: ${error.message}`;
    }
    if (error !== null && typeof error === "object") return JSON.stringify(error);
    return String(error);
  } catch {
    return Object.prototype.toString.call(error);
  }
}

const USAGE =
  "the package must export a tool { name, description, parameters, execute(input) } " +
  "(as default, `tool` or `tools`)";

async function load(entry) {
  const module = await import(pathToFileURL(entry).href);
  // A package may export its tools as a promise (tools built asynchronously).
  let found = await (module.default ?? module.tools ?? module.tool);
  if (found && !Array.isArray(found) && found.tools) found = await found.tools;
  if (found === undefined) throw new Error(`${USAGE}; it exports none of them`);
  const tools = Array.isArray(found) ? found : [found];
  tools.forEach((tool, index) => {
    const which = tools.length > 1 ? `tool ${index + 1} of ${tools.length}` : "its tool";
    if (!tool || typeof tool !== "object") {
      throw new Error(`${USAGE}; ${which} is ${typeName(tool)}`);
    }
    if (typeof tool.name !== "string") {
      throw new Error(`${USAGE}; ${which} has no name (a string), but ${typeName(tool.name)}`);
    }
    if (typeof tool.execute !== "function") {
      throw new Error(`${USAGE}; tool ${JSON.stringify(tool.name)}: execute is ${typeName(tool.execute)}, not a function`);
    }
  });
  return tools;
}

function typeName(value) {
  if (value === null || value === undefined) return String(value);
  if (Array.isArray(value)) return "an array";
  return /^[aeiou]/.test(typeof value) ? `an ${typeof value}` : `a ${typeof value}`;
}

function spec(tool) {
  // Read (a getter may throw) and encoded (a schema may hold a BigInt, or itself) one by one,
  // so that the package's error names the tool.
  try {
    const described = {
      name: tool.name,
      description: tool.description ?? "",
      parameters: tool.parameters ?? { type: "object", properties: {} },
      capabilities: tool.capabilities ?? [],
    };
    encode(described);
    return described;
  } catch (error) {
    const why = error instanceof NotJSON ? error.message : describe(error);
    throw new Error(`tool ${JSON.stringify(tool.name)} cannot be described as JSON: ${why}`);
  }
}

async function run(tools, message) {
  const tool = tools.get(message.tool);
  if (!tool) return send({ type: "error", id: message.id, message: `no tool ${message.tool}` });
  const emit = (kind, data) => {
    try {
      send({ type: "event", id: message.id, kind, data: data ?? {} });
    } catch (error) {
      if (!(error instanceof TypeError)) throw error; // a NotJSON, or a circle
      throw new TypeError(`the ${JSON.stringify(kind)} event is not JSON: ${error.message}`);
    }
  };
  const input = {
    args: message.args ?? {},
    state: message.state ?? {},
    emit,
    activity: (activityType, patch) => emit("activity", { activity_type: activityType, patch }),
  };
  let answer;
  try {
    answer = await tool.execute(input);
  } catch (error) {
    return send({ type: "error", id: message.id, message: describe(error) });
  }
  try {
    // null and undefined are the output null, as a Python tool's None is (not `{}`)
    const shaped =
      answer !== null && typeof answer === "object" && "output" in answer ? answer : { output: answer };
    send({ type: "result", id: message.id, output: shaped.output ?? null, state_update: shaped.state_update ?? null });
  } catch (error) {
    const why = error instanceof NotJSON ? error.message : describe(error);
    send({ type: "error", id: message.id, message: `the tool's answer is not JSON: ${why}` });
  }
}

async function main() {
  let specs;
  let tools;
  try {
    tools = await load(process.argv[2]);
    specs = tools.map(spec);
  } catch (error) {
    send({ type: "fatal", message: describe(error) });
    process.exit(1);
  }
  send({ type: "ready", tools: specs });
  const byName = new Map(tools.map((t) => [t.name, t]));
  const lines = createInterface({ input: calls, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      continue;
    }
    if (message.type === "call") run(byName, message);
  }
  process.exit(0);
}

main();
