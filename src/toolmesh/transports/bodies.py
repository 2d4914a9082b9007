"""Reading a peer's answer with a bound: a peer sending without end cannot make the reader hold
more than it allows."""

from __future__ import annotations

from typing import Any

__all__ = ["read_at_most"]


async def read_at_most(response: Any, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of a streamed body (httpx's, or anything with ``aiter_bytes``),
    and whether there was more (not read on)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False
