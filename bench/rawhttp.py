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


def request_bytes(host: str, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """One HTTP/1.1 request as it goes on the wire (a POST always says its length)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


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
        self.writer.write(request_bytes(self.host, method, path, headers, body))

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


class BlockingConnection:
    """The same HTTP/1.1 exchanges on a blocking socket, for sequential runs.

    An asyncio client costs 100-200 µs of CPU a call here (the event loop's turns, StreamReader's
    line reads), as much as a lean server spends answering, so ratios measured with it are
    squeezed toward 1. This one costs about 60 µs: a send and one or two recv() calls a
    message, as a load tool such as wrk does."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host = f"{host}:{port}"
        self.buffer = b""
        self.chunked = False
        self.pending = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buffer += data

    def _send(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        self.sock.sendall(request_bytes(self.host, method, path, headers, body))

    def _head(self) -> tuple[int, dict[str, str]]:
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._fill()
        head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4 :]
        first, *lines = head.split("\r\n")
        headers: dict[str, str] = {}
        for line in lines:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return int(first.split()[1]), headers

    def _chunk(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            self._fill()
        size = int(self.buffer[:end].split(b";")[0], 16)
        while len(self.buffer) < end + 2 + size + 2:
            self._fill()
        data = self.buffer[end + 2 : end + 2 + size]
        self.buffer = self.buffer[end + 2 + size + 2 :]
        return data

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        self._send(method, path, headers or {}, body)
        status, head = self._head()
        if head.get("transfer-encoding") == "chunked":
            parts = []
            while chunk := self._chunk():
                parts.append(chunk)
            return status, head, b"".join(parts)
        length = int(head.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill()
        data, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, head, data

    def open_events(self, path: str, headers: dict[str, str]) -> None:
        """GET an SSE stream; ``next_event`` then reads its ``data:`` payloads in order."""
        self._send("GET", path, {**headers, "Accept": "text/event-stream"}, b"")
        status, head = self._head()
        if status != 200:
            raise ConnectionError(f"stream answered {status}")
        self.chunked = head.get("transfer-encoding") == "chunked"

    def next_event(self) -> dict[str, Any]:
        while True:
            while (end := self.pending.find(b"\n\n")) >= 0:
                event, self.pending = self.pending[:end], self.pending[end + 2 :]
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        return json.loads(line[5:])  # type: ignore[no-any-return]
            if self.chunked:
                self.pending += self._chunk()
            else:
                if not self.buffer:
                    self._fill()
                self.pending, self.buffer = self.pending + self.buffer, b""

    def close(self) -> None:
        self.sock.close()
