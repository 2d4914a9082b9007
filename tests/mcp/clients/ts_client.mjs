// The MCP TypeScript SDK's client against a toolmesh server: list tools, call `echo` and
// `count`, call `add` badly, print what it saw as one JSON line.
//   node ts_client.mjs stdio COMMAND [ARGS...]
//   node ts_client.mjs http URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [kind, target, ...rest] = process.argv.slice(2);
const transport =
  kind === "stdio"
    ? new StdioClientTransport({ command: target, args: rest, stderr: "inherit" })
    : new StreamableHTTPClientTransport(new URL(target));

const client = new Client({ name: "ts-client", version: "1.0.0" });
client.onerror = (error) => process.stderr.write(`ts-client error: ${error}\n`);
await client.connect(transport);
const listed = await client.listTools();
const echo = await client.callTool({ name: "echo", arguments: { text: "from node" } });
const count = await client.callTool({ name: "count", arguments: { n: 2 } });
const bad = await client.callTool({ name: "add", arguments: { a: "x", b: 1 } });
process.stdout.write(
  JSON.stringify({
    protocol: transport.protocolVersion ?? null,
    server: client.getServerVersion()?.name,
    tools: listed.tools.map((t) => t.name),
    echo: echo.content[0].text,
    count: count.structuredContent,
    bad: { isError: bad.isError, text: bad.content[0].text },
  }) + "\n",
);
await client.close();
