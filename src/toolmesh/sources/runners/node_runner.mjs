// toolmesh's runner for tools written as JavaScript packages (see toolmesh/sources/worker.py).
// Usage: node runner.mjs ENTRY_FILE
// Speaks one JSON object per line: calls on stdin, answers on stdout. Whatever the tool code
// prints goes to stderr, so it cannot break the protocol.
import { pathToFileURL } from "node:url";
import { createInterface } from "node:readline";

const protocol = process.stdout.write.bind(process.stdout);
// The tool's process.stdout is stderr, fd included: `fs.writeSync(process.stdout.fd, ...)`
// must not reach the protocol, and `process.stdout.end()` must not close it.
Object.defineProperty(process, "stdout", { configurable: true, get: () => process.stderr });
for (const name of ["log", "info", "debug"]) console[name] = console.error;
// A stray rejection in the tool's background work must not kill the calls running beside it.
process.on("unhandledRejection", (reason) => console.error("unhandled rejection:", describe(reason)));

function send(message) {
  // The leading newline ends whatever partial line the tool wrote to fd 1 itself, so that the
  // message always starts a line of its own (the host skips the blank lines).
  protocol("\n" + JSON.stringify(message) + "\n");
}

function describe(error) {
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

async function load(entry) {
  const module = await import(pathToFileURL(entry).href);
  // A package may export its tools as a promise (tools built asynchronously).
  let found = await (module.default ?? module.tools ?? module.tool);
  if (found && !Array.isArray(found) && found.tools) found = await found.tools;
  const tools = Array.isArray(found) ? found : [found];
  for (const tool of tools) {
    if (!tool || typeof tool.name !== "string" || typeof tool.execute !== "function") {
      throw new Error(
        "the package must export a tool { name, description, parameters, execute(input) } " +
          "(as default, `tool` or `tools`)",
      );
    }
  }
  return tools;
}

async function run(tools, message) {
  const tool = tools.get(message.tool);
  if (!tool) return send({ type: "error", id: message.id, message: `no tool ${message.tool}` });
  const emit = (kind, data) => send({ type: "event", id: message.id, kind, data: data ?? {} });
  const input = {
    args: message.args ?? {},
    state: message.state ?? {},
    emit,
    activity: (activityType, patch) => emit("activity", { activity_type: activityType, patch }),
  };
  try {
    // null and undefined are the output null, as a Python tool's None is (not `{}`)
    const answer = await tool.execute(input);
    const shaped =
      answer !== null && typeof answer === "object" && "output" in answer ? answer : { output: answer };
    send({ type: "result", id: message.id, output: shaped.output ?? null, state_update: shaped.state_update ?? null });
  } catch (error) {
    send({ type: "error", id: message.id, message: describe(error) });
  }
}

async function main() {
  let tools;
  try {
    tools = await load(process.argv[2]);
  } catch (error) {
    send({ type: "fatal", message: describe(error) });
    process.exit(1);
  }
  send({
    type: "ready",
    tools: tools.map((t) => ({
      name: t.name,
      description: t.description ?? "",
      parameters: t.parameters ?? { type: "object", properties: {} },
      capabilities: t.capabilities ?? [],
    })),
  });
  const byName = new Map(tools.map((t) => [t.name, t]));
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
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
