"""A minimal HTTP/1.1 client on asyncio streams: the same load client for every HTTP server.

httpx costs more per request than a lean server does (see peers/README.md), so with it as the load
client every server looks alike. This client keeps connections alive, sets TCP_NODELAY, parses
Content-Length and chunked bodies, and reads Server-Sent Events. It is for benchmarks only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any


class Connection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.host = host

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, f"{host}:{port}")

    def _send(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    async def _head(self) -> tuple[int, dict[str, str]]:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return status, headers
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()

    async def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        self._send(method, path, headers or {}, body)
        status, head = await self._head()
        if head.get("transfer-encoding") == "chunked":
            chunks = bytearray()
            async for chunk in self._chunks():
                chunks += chunk
            return status, head, bytes(chunks)
        length = int(head.get("content-length", "0"))
        return status, head, await self.reader.readexactly(length) if length else b""

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self.reader.readline()
                return
            data = await self.reader.readexactly(size)
            await self.reader.readline()
            yield data

    async def events(self, path: str, headers: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """GET an SSE stream; yield each ``data:`` payload as JSON."""
        self._send("GET", path, {**headers, "Accept": "text/event-stream"}, b"")
        status, head = await self._head()
        if status != 200:
            raise ConnectionError(f"stream answered {status}")
        pending = b""
        source = self._chunks() if head.get("transfer-encoding") == "chunked" else self._raw()
        async for chunk in source:
            pending += chunk
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield json.loads(line[5:])

    async def _raw(self) -> AsyncIterator[bytes]:
        while chunk := await self.reader.read(65536):
            yield chunk

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def sse_payloads(body: bytes) -> list[dict[str, Any]]:
    """The JSON ``data:`` payloads of a complete SSE body."""
    return [json.loads(line[5:]) for line in body.split(b"\n") if line.startswith(b"data:")]
