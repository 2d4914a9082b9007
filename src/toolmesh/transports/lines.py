"""NDJSON line framing for pipes, with a size limit that skips an oversized line cleanly.

``LineFeed`` is an asyncio protocol: bytes go in as the pipe delivers them, and each complete line
goes to its handler at once, on the event loop's own callback, with no reader task in between
(one wake-up per message, not two). A handler may return an awaitable: the lines after it wait
until it is done, so messages that need the loop (a handshake, say) keep their order, while a
handler that starts work and returns at once (a tool call) lets the next line in. An oversized
line is discarded whole and reported once, as ``Oversized``, and the feed carries on.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from toolmesh.eager import start_eagerly

__all__ = ["HEAD_BYTES", "LineFeed", "LineHandler", "Oversized"]


@dataclass(frozen=True, slots=True)
class Oversized:
    """Stands in for a line longer than the limit; ``size`` is how long it was, and ``head``
    its first bytes (where a message's ``id`` is, so the refusal can name the request)."""

    size: int
    head: bytes = field(default=b"", compare=False, repr=False)


LineHandler = Callable[["bytes | Oversized"], "Awaitable[Any] | None"]
"""Takes one line; returns None when done with it, or an awaitable the next lines wait for."""

_BACKLOG = 256  # lines waiting behind a busy handler before the pipe is paused
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark: Windows tools start files with it
_FRAMING_SLACK = len(_BOM) + 1  # a BOM and the CR of a CRLF are not part of the message
HEAD_BYTES = 1024  # kept of an oversized line: enough for a message's envelope


class LineFeed(asyncio.Protocol):
    """Splits a byte stream into non-empty lines (without their newline) for ``handle``, in order.

    ``finished`` resolves once the input ended and every line was handled, or at ``stop()``; it
    fails if a handler raised.
    """

    def __init__(self, handle: LineHandler, max_bytes: int) -> None:
        self._handle = handle
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        self._skipping = 0  # bytes of an oversized line discarded so far (0: not skipping)
        self._head = b""  # the start of the oversized line being skipped
        self._lines: collections.deque[bytes | Oversized] = collections.deque()
        self._busy: asyncio.Future[Any] | None = None
        self._ended = False
        self._transport: asyncio.BaseTransport | None = None
        self._paused = False
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def eof_received(self) -> bool:
        self.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.end()

    # -- feeding ---------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take more bytes; complete lines are handled at once (or queued behind a busy one)."""
        if self.finished.done():
            return
        start = 0
        buffer = self._buffer
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                rest = len(data) - start
                if self._skipping:
                    self._skipping += rest
                elif rest:
                    buffer += data[start:]
                    if len(buffer) > self._max_bytes + _FRAMING_SLACK:
                        self._skipping = len(buffer)
                        self._head = bytes(buffer[:HEAD_BYTES])
                        buffer.clear()
                break
            if self._skipping:
                self._lines.append(Oversized(self._skipping + end - start, self._head))
                self._skipping = 0
            elif buffer:
                buffer += data[start:end]
                self._take(bytes(buffer))
                buffer.clear()
            else:
                self._take(data[start:end])
            start = end + 1
        self._drain()

    def end(self) -> None:
        """No more input: a last line without its newline still counts."""
        if self._ended:
            return
        self._ended = True
        if self._skipping:
            self._lines.append(Oversized(self._skipping, self._head))
        elif self._buffer:
            self._take(bytes(self._buffer))
        self._buffer.clear()
        self._drain()

    def stop(self) -> None:
        """Handle no more lines (a shutdown): ``finished`` resolves now."""
        self._lines.clear()
        if not self.finished.done():
            self.finished.set_result(None)

    # -- handling --------------------------------------------------------------------------------

    def _take(self, line: bytes) -> None:
        # The limit is the message's: a CRLF line end or a leading BOM (a file saved on
        # Windows, or files joined by cat) does not count, and JSON would refuse the BOM.
        line = line.removeprefix(_BOM).removesuffix(b"\r")
        if len(line) > self._max_bytes:
            self._lines.append(Oversized(len(line), line[:HEAD_BYTES]))
        elif line.strip():
            self._lines.append(line)

    def _drain(self) -> None:
        lines = self._lines
        while self._busy is None and lines and not self.finished.done():
            pending = self._handle(lines.popleft())
            if pending is None:
                continue
            task = start_eagerly(pending if asyncio.iscoroutine(pending) else _awaited(pending))
            if task.done():
                self._check(task)
            else:
                self._busy = task
                task.add_done_callback(self._resume)
        self._pace()
        if self._ended and not lines and self._busy is None and not self.finished.done():
            self.finished.set_result(None)

    def _resume(self, task: asyncio.Future[Any]) -> None:
        self._busy = None
        self._check(task)
        self._drain()

    def _check(self, task: asyncio.Future[Any]) -> None:
        if self.finished.done():
            return
        if task.cancelled():
            self.finished.cancel()
        elif (error := task.exception()) is not None:
            self.finished.set_exception(error)

    def _pace(self) -> None:
        """Pause the pipe while many lines wait behind a busy handler; resume when they drain."""
        transport = self._transport
        if not isinstance(transport, asyncio.ReadTransport):
            return
        waiting = len(self._lines)
        if not self._paused and waiting > _BACKLOG and transport.is_reading():
            self._paused = True
            transport.pause_reading()
        elif self._paused and waiting <= _BACKLOG // 2:
            self._paused = False
            transport.resume_reading()


async def _awaited(pending: Awaitable[Any]) -> Any:
    return await pending
