"""A toolkit served over MCP on stdin/stdout (``toolmesh serve --mcp-stdio``).

One JSON-RPC message per line. Calls run concurrently (so a cancellation or a ping is read while
a tool runs); everything else is answered in order. While serving, file descriptor 1 points at
stderr, so a tool that prints cannot corrupt the message stream. At end of input, running calls
finish (each within its deadline) and answer before the server exits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from toolmesh import strictjson
from toolmesh.eager import start_eagerly
from toolmesh.host import Host
from toolmesh.mcp.server import INVALID_REQUEST, PARSE_ERROR, MCPService, _error
from toolmesh.transports.lines import LineFeed, Oversized
from toolmesh.transports.stdio import open_stdio

__all__ = ["serve_mcp_stdio"]

_LONG_RUNNING = frozenset({"tools/call", "subscriptions/listen"})


async def serve_mcp_stdio(
    host: Host,
    *,
    stdin_fd: int | None = None,
    stdout_fd: int | None = None,
    instructions: str | None = None,
) -> None:
    """Serve ``host`` over MCP on this process's stdin/stdout until stdin closes."""
    streams = await open_stdio(stdin_fd=stdin_fd, stdout_fd=stdout_fd)
    write = streams.write

    def send(data: bytes) -> None:
        write(data + b"\n")

    service = MCPService(host, instructions=instructions)
    await service.start()
    peer = service.peer(send)
    running: set[asyncio.Future[None]] = set()

    async def answer(message: Any) -> None:
        reply = await peer.handle(message)
        if reply is not None:
            send(reply)

    def handle(line: bytes | Oversized) -> Awaitable[None] | None:
        if isinstance(line, Oversized):
            send(_error(None, INVALID_REQUEST, f"message of {line.size} bytes is too large"))
            return None
        try:
            message = strictjson.loads(line)
        except ValueError as exc:
            send(_error(None, PARSE_ERROR, f"not valid JSON: {exc}"))
            return None
        if isinstance(message, list) or (
            isinstance(message, dict) and message.get("method") in _LONG_RUNNING
        ):  # a batch may hold calls: it runs beside the reading, as a call does
            task = start_eagerly(answer(message))
            if not task.done():
                running.add(task)
                task.add_done_callback(running.discard)
            return None
        return answer(message)

    feed = LineFeed(handle, host.max_message_bytes)
    try:
        await streams.read_into(feed)
        await feed.finished
        if running:
            await asyncio.wait(running)
    finally:
        await peer.close()
        streams.close()
