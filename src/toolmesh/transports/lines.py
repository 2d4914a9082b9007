"""NDJSON line reading with a size limit that skips an oversized line cleanly.

``asyncio.StreamReader.readline`` drops what it buffered of an over-long line and then returns
the line's tail as if it were a new line. This reader discards the whole oversized line, reports
its size once, and carries on with the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["Oversized", "read_lines"]

_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Oversized:
    """Stands in for a line longer than the limit; ``size`` is how long it was."""

    size: int


async def read_lines(
    reader: asyncio.StreamReader, max_bytes: int
) -> AsyncIterator[bytes | Oversized]:
    """Yield each non-empty line (without its newline), or ``Oversized`` for one too long."""
    buffer = bytearray()
    skipping = 0  # bytes of an oversized line discarded so far (0: not skipping)
    while True:
        chunk = await reader.read(_CHUNK)
        if not chunk:
            if skipping:
                yield Oversized(skipping)
            elif buffer.strip():
                yield bytes(buffer)
            return
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                rest = len(chunk) - start
                if skipping:
                    skipping += rest
                else:
                    buffer += chunk[start:]
                    if len(buffer) > max_bytes:
                        skipping = len(buffer)
                        buffer.clear()
                break
            if skipping:
                yield Oversized(skipping + end - start)
                skipping = 0
            else:
                buffer += chunk[start:end]
                if len(buffer) > max_bytes:
                    yield Oversized(len(buffer))
                elif buffer.strip():
                    yield bytes(buffer)
                buffer.clear()
            start = end + 1
