"""A2E as NDJSON over stdio: the host reads stdin and writes stdout; the client runs the host
as a child process.

While serving, the host keeps the real stdout for protocol messages only and points file
descriptor 1 at stderr, so a tool that prints (or a child process it starts) cannot corrupt the
message stream. Lines are read by a ``LineFeed`` protocol on both sides: a message is handled on
the event loop's callback for the bytes that carried it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import stat
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from toolmesh.errors import ProtocolError, TransportError
from toolmesh.host import Connection, Host
from toolmesh.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ErrorCode,
    ErrorMessage,
    decode,
    encode,
    request_id_of,
)
from toolmesh.transports.lines import LineFeed, Oversized
from toolmesh.transports.unreadable import unreadable_answer

__all__ = ["StdioChannel", "StdioStreams", "open_stdio", "serve_stdio"]


async def serve_stdio(
    host: Host, *, stdin_fd: int | None = None, stdout_fd: int | None = None
) -> None:
    """Serve ``host`` on this process's stdin/stdout until stdin closes or a shutdown arrives."""
    streams = await open_stdio(stdin_fd=stdin_fd, stdout_fd=stdout_fd)
    write = streams.write
    await host.start()
    connection = host.connect(lambda message: write(encode(message)), transport="stdio")
    limit = host.max_message_bytes

    def handle(line: bytes | Oversized) -> Awaitable[None] | None:
        if isinstance(line, Oversized):
            write(encode(_too_large(line, limit)))
            return None
        pending = connection.take_line(line)
        return None if pending is None else _then_stop_if_closed(pending, connection, feed)

    feed = LineFeed(handle, limit)
    # A peer that closed our stdout reads no answers: stop reading requests (its stdin may
    # stay open, say held by a process it started), and cancel what runs.
    streams.output_lost.add_done_callback(lambda _lost: feed.stop())
    try:
        await streams.read_into(feed)
        await feed.finished
        # End of input means no more requests, not that the peer stopped reading (a pipe is
        # half-closed): calls still running finish (each within its deadline) and answer.
        await _unless_lost(connection.drain(timeout=None), streams.output_lost)
    finally:
        await connection.close()
        streams.close()


async def _then_stop_if_closed(
    pending: Awaitable[None], connection: Connection, feed: LineFeed
) -> None:
    await pending
    if connection.closed:  # a shutdown message: read no further
        feed.stop()


async def _unless_lost(work: Awaitable[None], lost: asyncio.Future[None]) -> None:
    """``work``, cut short once ``lost`` resolves."""
    task = asyncio.ensure_future(work)
    await asyncio.wait([task, lost], return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _pipe_like(fd: int) -> bool:
    """Pipes and sockets are watched by the event loop. Character devices are not: epoll refuses
    /dev/null, uvloop aborts on it, and a terminal reads fine on a thread."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def _read_into(fd: int, feed: LineFeed) -> Callable[[], None]:
    """Start reading ``fd`` into ``feed``; returns how to stop. The event loop watches pipes and
    sockets; a regular file or a device (input from disk, a terminal, /dev/null) is read on a
    thread instead."""
    loop = asyncio.get_running_loop()
    if _pipe_like(fd):
        transport, _ = await loop.connect_read_pipe(
            lambda: feed, os.fdopen(fd, "rb", buffering=0, closefd=False)
        )
        return transport.close

    def pump() -> None:
        while chunk := os.read(fd, 1 << 16):
            loop.call_soon_threadsafe(feed.feed, chunk)
        loop.call_soon_threadsafe(feed.end)

    threading.Thread(target=pump, name="toolmesh-stdin", daemon=True).start()
    return lambda: None


class _Output(asyncio.Protocol):
    """The protocol of a pipe we write: ``lost`` resolves once it is gone (its reader closed
    it: the write end sees EPIPE, which asyncio handles without a traceback)."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


Writer = tuple[Callable[[bytes], None], Callable[[], None], "asyncio.Future[None]"]


async def _writer_for(fd: int, *, reads_too: bool = False) -> Writer:
    """Writing lines to ``fd``: through the event loop for pipes and sockets, directly for a
    regular file or a device (output to disk, a terminal or /dev/null never blocks for long).
    Also returns how to stop, and a future resolved when the pipe's reader went away.

    ``reads_too``: ``fd`` is the very socket stdin reads (socat ``EXEC:``, systemd socket
    activation). The event loop's write transport would watch it for reading, and take the
    requests (uvloop) or the end of the file (asyncio) meant for stdin; it is written directly.
    """
    loop = asyncio.get_running_loop()
    if reads_too:
        return functools.partial(_write_all, fd), lambda: None, loop.create_future()
    if not _pipe_like(fd):

        def write_file(data: bytes) -> None:
            os.write(fd, data)

        return write_file, lambda: None, loop.create_future()
    transport, output = await loop.connect_write_pipe(
        _Output, os.fdopen(fd, "wb", buffering=0, closefd=False)
    )

    def write_pipe(data: bytes) -> None:
        if not transport.is_closing():
            transport.write(data)

    def close() -> None:
        with contextlib.suppress(Exception):
            transport.close()

    return write_pipe, close, output.lost


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``, waiting while the socket is full (stdin's reader made it
    non-blocking, and the file description is shared)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def _same_socket(first: int, second: int) -> bool:
    a, b = os.fstat(first), os.fstat(second)
    return stat.S_ISSOCK(a.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class StdioStreams:
    """This process's stdin and stdout for one protocol: lines are written with ``write``, and
    stdin is read into a ``LineFeed`` from ``read_into`` on."""

    def __init__(
        self,
        in_fd: int,
        write: Callable[[bytes], None],
        close: Callable[[], None],
        output_lost: asyncio.Future[None] | None = None,
    ):
        self._in_fd = in_fd
        self.write = write
        self._closers = [close]
        self.output_lost = output_lost or asyncio.get_running_loop().create_future()
        """Resolves when the reader of stdout went away (no answer can reach the peer)."""

    async def read_into(self, feed: LineFeed) -> None:
        self._closers.insert(0, await _read_into(self._in_fd, feed))

    def close(self) -> None:
        for close in self._closers:
            close()


async def open_stdio(*, stdin_fd: int | None = None, stdout_fd: int | None = None) -> StdioStreams:
    """stdin and stdout (pipes, sockets, terminals or regular files) for a protocol. stdout is
    kept for protocol lines only: file descriptor 1 then writes to stderr."""
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = _claim_stdout() if stdout_fd is None else stdout_fd
    shared = _same_socket(in_fd, out_fd)
    write, stop_writing, output_lost = await _writer_for(out_fd, reads_too=shared)
    return StdioStreams(in_fd, write, stop_writing, output_lost)


def _too_large(line: Oversized, limit: int) -> ErrorMessage:
    """The refusal of an oversized line, naming its request when its start shows the ``id``
    (the caller's call then fails at once, not at its timeout)."""
    return ErrorMessage.from_exception(
        _oversized(line, limit), request_id_of(line.head, partial=True)
    )


def _oversized(line: Oversized, limit: int) -> ProtocolError:
    return ProtocolError(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"message of {line.size} bytes exceeds the limit of {limit} bytes",
        detail={"size": line.size, "limit": limit},
    )


def _claim_stdout() -> int:
    """A private copy of stdout for protocol messages; fd 1 then writes to stderr."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(os.dup(2), "w", buffering=1)
    return protocol_fd


class _HostProcess(asyncio.SubprocessProtocol):
    """Tells when the child exits (its stdout is read by a line feed of its own)."""

    def __init__(self) -> None:
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class StdioChannel:
    """Runs a host command as a child process and speaks NDJSON over its stdin/stdout."""

    close_grace = 5.0
    """Seconds ``close`` waits for the host to exit after end of input (then after SIGTERM)."""
    exit_grace = 0.5
    """Seconds the host's last lines may take to arrive once it exited, when a process it
    started keeps its stdout open (no end of file comes until that one exits too)."""

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
        self.transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._stdout: asyncio.ReadTransport | None = None
        self._process: _HostProcess | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.transport is None else self.transport.get_pid()

    async def open(
        self, on_message: Callable[[Any], None], on_close: Callable[[str], None]
    ) -> None:
        limit = self.max_message_bytes

        def handle(line: bytes | Oversized) -> None:
            if isinstance(line, Oversized):
                message = unreadable_answer(line.head, _oversized(line, limit))
            else:
                try:
                    message = decode(line, max_bytes=limit)
                except ProtocolError as exc:
                    # A host that prints garbage: the line is ignored, the session kept. An
                    # answer that cannot be read fails its request now, not at its timeout.
                    message = unreadable_answer(line, exc)
            if message is not None:
                on_message(message)

        feed = LineFeed(handle, limit)
        process = _HostProcess()
        loop = asyncio.get_running_loop()
        # The child's stdout is a pipe of our own, read by the line feed directly: asyncio's
        # subprocess pipes would hand each chunk on through one more turn of the loop.
        read_fd, write_fd = os.pipe()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: process,
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=write_fd,
                stderr=None,
                env=self.env,
                cwd=self.cwd,
            )
        except OSError as exc:
            os.close(read_fd)
            raise TransportError(f"cannot start {self.command[0]!r}: {exc}") from exc
        finally:
            os.close(write_fd)
        stdout, _ = await loop.connect_read_pipe(lambda: feed, os.fdopen(read_fd, "rb", 0))
        self.transport = transport
        self._process = process
        self._stdout = stdout
        self._stdin = cast("asyncio.WriteTransport", transport.get_pipe_transport(0))  # a PIPE
        self._watcher = asyncio.ensure_future(self._watch(feed, process, transport, on_close))

    async def _watch(
        self,
        feed: LineFeed,
        process: _HostProcess,
        transport: asyncio.SubprocessTransport,
        on_close: Callable[[str], None],
    ) -> None:
        """Report the host's end once it exited and its output was read: to the end of file,
        or for ``exit_grace`` when something else still holds the pipe."""
        await asyncio.wait([feed.finished, process.exited], return_when=asyncio.FIRST_COMPLETED)
        with contextlib.suppress(Exception):  # a handler's failure, or the grace ran out
            await asyncio.wait_for(asyncio.shield(feed.finished), self.exit_grace)
        await process.exited
        on_close(f"host process exited with code {transport.get_returncode()}")

    async def send(self, message: Any) -> None:
        stdin = self._stdin
        if stdin is None or stdin.is_closing():
            raise TransportError("the host process is not running")
        stdin.write(encode(message))

    async def close(self) -> None:
        transport, process = self.transport, self._process
        if transport is None or process is None:
            return
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()  # EOF: the host drains and exits
        # A host still busy past the grace (a long call) is asked to stop (SIGTERM: it cancels
        # its calls, audits each as cancelled and exits), and killed only if it will not: a
        # SIGKILL at once would lose the audit entries of the calls it was running.
        for stop in (transport.terminate, transport.kill):
            try:
                await asyncio.wait_for(asyncio.shield(process.exited), self.close_grace)
                break
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    stop()
        await process.exited
        if self._stdout is not None:
            self._stdout.close()  # a grandchild may still hold the pipe open
        if self._watcher is not None:
            await asyncio.gather(self._watcher, return_exceptions=True)
        transport.close()
