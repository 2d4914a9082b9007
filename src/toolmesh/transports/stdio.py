"""A2E as NDJSON over stdio: the host reads stdin and writes stdout; the client runs the host
as a child process.

While serving, the host keeps the real stdout for protocol messages only and points file
descriptor 1 at stderr, so a tool that prints (or a child process it starts) cannot corrupt the
message stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolmesh.errors import ProtocolError, TransportError
from toolmesh.host import Host
from toolmesh.protocol import DEFAULT_MAX_MESSAGE_BYTES, ErrorCode, ErrorMessage, decode, encode
from toolmesh.transports.lines import Oversized, read_lines

__all__ = ["StdioChannel", "StdioStreams", "open_stdio", "serve_stdio"]


async def serve_stdio(
    host: Host, *, stdin_fd: int | None = None, stdout_fd: int | None = None
) -> None:
    """Serve ``host`` on this process's stdin/stdout until stdin closes or a shutdown arrives."""
    streams = await open_stdio(host.max_message_bytes, stdin_fd=stdin_fd, stdout_fd=stdout_fd)

    def deliver(message: Any) -> None:
        streams.write(encode(message))

    await host.start()
    connection = host.connect(deliver, transport="stdio")
    try:
        async for line in read_lines(streams.reader, host.max_message_bytes):
            if isinstance(line, Oversized):
                deliver(_too_large(line.size, host.max_message_bytes))
                continue
            await connection.receive_line(line)
            if connection._closed:
                break
        # End of input means no more requests, not that the peer stopped reading (a pipe is
        # half-closed): calls still running finish (each within its deadline) and answer.
        await connection.drain(timeout=None)
    finally:
        await connection.close()
        streams.close()


def _pipe_like(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


async def _reader_for(fd: int, limit: int) -> tuple[asyncio.StreamReader, Callable[[], None]]:
    """A stream over ``fd``: the event loop watches pipes and sockets; a regular file (input
    redirected from disk) is read on a thread instead."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit + 1)
    if _pipe_like(fd):
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader),
            os.fdopen(fd, "rb", buffering=0, closefd=False),
        )
        return reader, transport.close

    def pump() -> None:
        while chunk := os.read(fd, 1 << 16):
            loop.call_soon_threadsafe(reader.feed_data, chunk)
        loop.call_soon_threadsafe(reader.feed_eof)

    threading.Thread(target=pump, name="toolmesh-stdin", daemon=True).start()
    return reader, lambda: None


async def _writer_for(fd: int) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """Writing lines to ``fd``: through the event loop for pipes and sockets, directly for a
    regular file (output redirected to disk never blocks for long)."""
    if not _pipe_like(fd):

        def write_file(data: bytes) -> None:
            os.write(fd, data)

        return write_file, lambda: None
    loop = asyncio.get_running_loop()
    transport, _protocol = await loop.connect_write_pipe(
        asyncio.Protocol, os.fdopen(fd, "wb", buffering=0, closefd=False)
    )

    def write_pipe(data: bytes) -> None:
        if not transport.is_closing():
            transport.write(data)

    def close() -> None:
        with contextlib.suppress(Exception):
            transport.close()

    return write_pipe, close


@dataclass(frozen=True, slots=True)
class StdioStreams:
    """This process's stdin as a stream and stdout as a line writer, for one protocol."""

    reader: asyncio.StreamReader
    write: Callable[[bytes], None]
    close: Callable[[], None]


async def open_stdio(
    limit: int, *, stdin_fd: int | None = None, stdout_fd: int | None = None
) -> StdioStreams:
    """stdin and stdout (pipes, sockets, terminals or regular files) for a protocol. stdout is
    kept for protocol lines only: file descriptor 1 then writes to stderr."""
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = _claim_stdout() if stdout_fd is None else stdout_fd
    reader, stop_reading = await _reader_for(in_fd, limit)
    write, stop_writing = await _writer_for(out_fd)

    def close() -> None:
        stop_reading()
        stop_writing()

    return StdioStreams(reader, write, close)


def _too_large(size: int, limit: int) -> ErrorMessage:
    return ErrorMessage(
        code=ErrorCode.MESSAGE_TOO_LARGE,
        message=f"message of {size} bytes exceeds the limit of {limit} bytes",
        detail={"size": size, "limit": limit},
    )


def _claim_stdout() -> int:
    """A private copy of stdout for protocol messages; fd 1 then writes to stderr."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(os.dup(2), "w", buffering=1)
    return protocol_fd


class StdioChannel:
    """Runs a host command as a child process and speaks NDJSON over its stdin/stdout."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if not command:
            raise TransportError("a stdio target needs a command to run")
        self.command = list(command)
        self.env = env
        self.cwd = cwd
        self.max_message_bytes = max_message_bytes
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def open(
        self, on_message: Callable[[Any], None], on_close: Callable[[str], None]
    ) -> None:
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                limit=self.max_message_bytes + 1,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {self.command[0]!r}: {exc}") from exc
        self._reader = asyncio.ensure_future(self._read(on_message, on_close))

    async def _read(
        self, on_message: Callable[[Any], None], on_close: Callable[[str], None]
    ) -> None:
        process = self.process
        if process is None or process.stdout is None:
            return
        async for line in read_lines(process.stdout, self.max_message_bytes):
            if isinstance(line, Oversized):
                continue
            try:
                on_message(decode(line, max_bytes=self.max_message_bytes))
            except ProtocolError:
                continue  # a host that prints garbage: ignore the line, keep the session
        code = await process.wait()
        on_close(f"host process exited with code {code}")

    async def send(self, message: Any) -> None:
        process = self.process
        if process is None or process.stdin is None or process.stdin.is_closing():
            raise TransportError("the host process is not running")
        process.stdin.write(encode(message))

    async def close(self) -> None:
        process = self.process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()  # EOF: the host drains and exits
        try:
            await asyncio.wait_for(process.wait(), timeout=5.0)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
