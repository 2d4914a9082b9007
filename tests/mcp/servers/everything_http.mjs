// The reference "everything" MCP server over streamable HTTP, on 127.0.0.1 and a port the
// system picks; prints {"port": N} once listening. Mirrors the package's own HTTP launcher,
// which always listens on every interface and does not report an ephemeral port.
import { randomUUID } from "node:crypto";
import http from "node:http";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { createServer } from "@modelcontextprotocol/server-everything/dist/server/index.js";

const transports = new Map();

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : undefined;
}

const server = http.createServer(async (req, res) => {
  const sessionId = req.headers["mcp-session-id"];
  const body = req.method === "POST" ? await readBody(req) : undefined;
  let transport = sessionId ? transports.get(sessionId) : undefined;
  if (!transport) {
    if (sessionId || req.method !== "POST") {
      res.writeHead(sessionId ? 404 : 400).end();
      return;
    }
    const { server: mcp } = createServer();
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => transports.set(id, transport),
    });
    transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
    await mcp.connect(transport);
  }
  await transport.handleRequest(req, res, body);
});

server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
