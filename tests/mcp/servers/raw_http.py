"""A hand-written streamable-HTTP MCP endpoint (2025 handshake, JSON answers) whose tool calls
answer with broken JSON-RPC envelopes, for what the SDK's own server would never send. An ASGI
app: serve it with tests.fixtures.web.serve_app and connect to ``<url>/mcp``."""

from __future__ import annotations

import json
from typing import Any

BROKEN_ANSWERS: dict[str, Any] = {
    "text_result": lambda i: {"jsonrpc": "2.0", "id": i, "result": "plain text"},
    "bad_error": lambda i: {"jsonrpc": "2.0", "id": i, "error": {"code": "boom"}},
}


def _answer(message: dict[str, Any]) -> dict[str, Any] | None:
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        return None  # a notification
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw-http", "version": "1"},
        }
    elif method == "tools/list":
        names = [*BROKEN_ANSWERS, "not_json", "good"]
        result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in names]}
    elif method == "tools/call":
        name = (message.get("params") or {}).get("name")
        if name in BROKEN_ANSWERS:
            answer: dict[str, Any] = BROKEN_ANSWERS[name](request_id)
            return answer
        result = {"content": [{"type": "text", "text": f"called {name}"}]}
    elif method == "ping":
        result = {}
    else:
        error = {"code": -32601, "message": f"unknown method {method}"}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    if scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    message = json.loads(body)
    if (message.get("params") or {}).get("name") == "not_json":
        await _respond(send, 200, b"<html>oops</html>")
        return
    reply = _answer(message)
    if reply is None:
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await _respond(send, 200, json.dumps(reply).encode())


async def _respond(send: Any, status: int, data: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
