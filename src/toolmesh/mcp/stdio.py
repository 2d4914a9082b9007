"""A toolkit served over MCP on stdin/stdout (``toolmesh serve --mcp-stdio``).

One JSON-RPC message per line. Calls run concurrently (so a cancellation or a ping is read while
a tool runs); everything else is answered in order. While serving, file descriptor 1 points at
stderr, so a tool that prints cannot corrupt the message stream. At end of input, running calls
finish (each within its deadline) and answer before the server exits.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from toolmesh.host import Host
from toolmesh.mcp.server import INVALID_REQUEST, PARSE_ERROR, MCPService, _error
from toolmesh.transports.lines import Oversized, read_lines
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
    streams = await open_stdio(host.max_message_bytes, stdin_fd=stdin_fd, stdout_fd=stdout_fd)

    def send(data: bytes) -> None:
        streams.write(data + b"\n")

    service = MCPService(host, instructions=instructions)
    await service.start()
    peer = service.peer(send)
    running: set[asyncio.Task[None]] = set()

    async def answer(message: Any) -> None:
        reply = await peer.handle(message)
        if reply is not None:
            send(reply)

    try:
        async for line in read_lines(streams.reader, host.max_message_bytes):
            if isinstance(line, Oversized):
                send(_error(None, INVALID_REQUEST, f"message of {line.size} bytes is too large"))
                continue
            try:
                message = json.loads(line)
            except ValueError:
                send(_error(None, PARSE_ERROR, "not valid JSON"))
                continue
            if isinstance(message, dict) and message.get("method") in _LONG_RUNNING:
                task = asyncio.ensure_future(answer(message))
                running.add(task)
                task.add_done_callback(running.discard)
            else:
                await answer(message)
        if running:
            await asyncio.wait(running)
    finally:
        await peer.close()
        streams.close()
