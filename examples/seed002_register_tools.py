import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from toolmesh import agent, agent_tools, create_client, create_toolkit


class StubServer:
    def __init__(self, handler):
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                outer._send(self, handler(body))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @staticmethod
    def _send(req, payload):
        body = json.dumps(payload).encode("utf-8")
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()


def reply(body):
    return {
        "choices": [{"message": {"role": "assistant", "content": "resolved manually"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


async def main():
    with StubServer(reply) as llm:
        client = create_client(base_url=llm.base_url, style="openai", model="test-model", api_key="test-key")
        served = await create_toolkit(builtins=False, skills_dir="examples/skills")
        srv = await served.serve("127.0.0.1:0", client=client, a2a={"name": "video-desk"})
        try:
            caller = await create_toolkit(builtins=False)  # no `agents=` at construction time
            try:
                tools = await agent_tools(agent(srv.url + "/.well-known/agent-card.json", poll_every=10))
                caller.register(*tools)  # the same registration path add_agent uses internally

                r = await caller.execute("video-desk_hello-world", {"task": "go"})
                assert r.is_error is False
                assert r.output == "resolved manually"

                print("ok:", r.output)
            finally:
                await caller.close()
        finally:
            await srv.stop()
            await served.close()


asyncio.run(main())
