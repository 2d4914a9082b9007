"""Reading and writing server-sent events (the ``text/event-stream`` format)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from toolmesh.errors import TransportError

__all__ = ["MAX_EVENT_BYTES", "EventTooLarge", "encode_event", "read_events"]

MAX_EVENT_BYTES = 16 * 1024 * 1024  # of one event's data (and of any one line); past it, refused

_LINE_END = re.compile(rb"\r\n|\r|\n")


class EventTooLarge(TransportError, ValueError):
    """An event (or a line) of a stream is larger than its reader's bound. A ValueError too: a
    reader that checks the answers it reads (the LLM client) takes it for a bad answer."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an event of the stream is larger than {limit} bytes; not read on")
        self.limit = limit


async def read_events(
    response: Any, max_event_bytes: int = MAX_EVENT_BYTES
) -> AsyncIterator[tuple[str, str]]:
    """``(event name, data)`` for each event of a streaming response (httpx's, or anything with
    ``aiter_bytes``). An event whose data, or a line, passes ``max_event_bytes`` raises
    ``EventTooLarge`` as soon as it does: a peer cannot make the reader hold more."""
    event = ""
    data: list[str] = []
    size = 0
    async for line in _lines(response, max_event_bytes):
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data, size = "", [], 0
        elif line.startswith(b"data:"):
            size += len(line)
            if size > max_event_bytes:
                raise EventTooLarge(max_event_bytes)
            data.append(line[5:].removeprefix(b" ").decode("utf-8", "replace"))
        elif line.startswith(b"event:"):
            event = line[6:].decode("utf-8", "replace").strip()
    if data:
        yield event, "\n".join(data)


async def _lines(response: Any, limit: int) -> AsyncIterator[bytes]:
    """The body's lines (ended by CR LF, LF or CR), without their ends. A line still growing past
    ``limit`` raises, not read whole first."""
    pending = bytearray()
    after_cr = False  # the last chunk ended in CR: an LF opening this one ends that same line
    async for chunk in response.aiter_bytes():
        if not chunk:
            continue
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        after_cr = chunk.endswith(b"\r")
        start = 0
        for end in _LINE_END.finditer(chunk):
            pending += chunk[start : end.start()]
            yield bytes(pending)
            pending.clear()
            start = end.end()
        pending += chunk[start:]
        if len(pending) > limit:
            raise EventTooLarge(limit)
    if pending:
        yield bytes(pending)


def encode_event(data: bytes, event: str = "") -> bytes:
    """One event carrying ``data`` (which must not contain a newline)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"
