"""Reading and writing server-sent events (the ``text/event-stream`` format)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

__all__ = ["encode_event", "read_events"]


async def read_events(response: Any) -> AsyncIterator[tuple[str, str]]:
    """``(event name, data)`` for each event of an httpx streaming response."""
    event = ""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "", []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("event:"):
            event = line[6:].strip()
    if data:
        yield event, "\n".join(data)


def encode_event(data: bytes, event: str = "") -> bytes:
    """One event carrying ``data`` (which must not contain a newline)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"
