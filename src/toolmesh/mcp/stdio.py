"""A toolkit served over MCP on stdin/stdout (``toolmesh serve --mcp-stdio``).

One JSON-RPC message per line. Calls run concurrently (so a cancellation or a ping is read while
a tool runs); everything else is answered in order. While serving, file descriptor 1 points at
stderr, so a tool that prints cannot corrupt the message stream. At end of input, running calls
finish (each within its deadline) and answer before the server exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

from toolmesh.host import Host
from toolmesh.mcp.server import INVALID_REQUEST, PARSE_ERROR, MCPService, _error
from toolmesh.transports.lines import Oversized, read_lines
from toolmesh.transports.stdio import _claim_stdout

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
    loop = asyncio.get_running_loop()
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = _claim_stdout() if stdout_fd is None else stdout_fd
    reader = asyncio.StreamReader(limit=host.max_message_bytes + 1)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader),
        os.fdopen(in_fd, "rb", buffering=0, closefd=False),
    )
    write_transport, _protocol = await loop.connect_write_pipe(
        asyncio.Protocol, os.fdopen(out_fd, "wb", buffering=0, closefd=False)
    )

    def send(data: bytes) -> None:
        if not write_transport.is_closing():
            write_transport.write(data + b"\n")

    service = MCPService(host, instructions=instructions)
    await service.start()
    peer = service.peer(send)
    running: set[asyncio.Task[None]] = set()

    async def answer(message: Any) -> None:
        reply = await peer.handle(message)
        if reply is not None:
            send(reply)

    try:
        async for line in read_lines(reader, host.max_message_bytes):
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
        read_transport.close()
        with contextlib.suppress(Exception):
            write_transport.close()
