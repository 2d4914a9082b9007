"""What issue 2's HTTP and cold-start targets leave to spend: the same work with no toolmesh in it.

    python bench/floor.py http     # A2E's HTTP binding on uvicorn, the echo answered inline
    python bench/floor.py import   # import asyncio and pydantic, validate one model, exit

`http` serves POST /session, POST /send ({"ok":true}, the answer pushed to the session's stream)
and GET /stream (SSE) on the same stack `toolmesh serve --http` uses (uvicorn with httptools, on
uvloop), with none of the pipeline: no validation, policy, deadline, events or audit. It prints
its URL as its first line, as `toolmesh serve --http` does, and exits when stdin closes. Against
the MCP SDK with the same load client it shows the most any server speaking this binding on this
stack can reach.

`import` is the least a server built on asyncio and pydantic does before it can answer anything;
its time from spawn to its "ready" line, against the MCP SDK's time from spawn to the first list, is the
lowest fraction of it such a server's cold start can be.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from typing import Any

OK_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"11")]
STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    envelope = {
        "id": uuid.uuid4().hex,
        "version": "1.0",
        "ts": time.time(),
        "req_id": message["id"],
    }
    if message["type"] == "handshake/req":
        return {"type": "handshake/resp", **envelope, "session_id": "floor", "ok": True}
    result = {
        "success": True,
        "data": message["arguments"]["text"],
        "error": None,
        "error_code": None,
        "duration_ms": 0,
        "events": [],
    }
    return {"type": "tool/call/resp", **envelope, "data": result}


async def _json(send: Any, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class FloorApp:
    """The A2E HTTP binding's three endpoints as a bare ASGI app."""

    def __init__(self) -> None:
        self.streams: dict[str, asyncio.Queue[bytes]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/send":
            body = b""
            while True:
                part = await receive()
                body += part.get("body", b"")
                if not part.get("more_body"):
                    break
            session = dict(scope["headers"])[b"x-session-id"].decode()
            answer = json.dumps(_answer(json.loads(body))).encode()
            self.streams[session].put_nowait(b"data: " + answer + b"\n\n")
            await send({"type": "http.response.start", "status": 200, "headers": OK_HEADERS})
            await send({"type": "http.response.body", "body": b'{"ok":true}'})
        elif path == "/session":
            session = uuid.uuid4().hex
            self.streams[session] = asyncio.Queue()
            await _json(send, {"session_id": session})
        elif path == "/stream":
            queue = self.streams[dict(scope["headers"])[b"x-session-id"].decode()]
            await send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
            while True:
                data = await queue.get()
                await send({"type": "http.response.body", "body": data, "more_body": True})


async def serve_http() -> None:
    import uvicorn

    config = uvicorn.Config(
        FloorApp(), host="127.0.0.1", port=0, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    await task


def import_floor() -> None:
    import asyncio  # noqa: F401, the event loop every toolmesh transport runs on

    from pydantic import BaseModel

    class Message(BaseModel):
        type: str
        id: str

    Message.model_validate_json('{"type": "tool/list/req", "id": "1"}')
    print("ready", flush=True)  # the time to here is measured, not the interpreter's exit


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "import":
        import_floor()
    elif mode == "http":

        def exit_on_eof() -> None:
            sys.stdin.buffer.read()
            import os

            os._exit(0)

        threading.Thread(target=exit_on_eof, daemon=True).start()
        import uvloop

        uvloop.run(serve_http())
    else:
        sys.exit("usage: floor.py http|import")


if __name__ == "__main__":
    main()
