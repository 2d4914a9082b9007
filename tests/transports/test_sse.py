"""Reading server-sent events: events split anywhere across chunks, and a bound on an event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from toolmesh import TransportError
from toolmesh.transports import sse
from toolmesh.transports.sse import encode_event, read_events


def streamed(*chunks: bytes, stall: bool = False) -> httpx.Response:
    """A response whose body comes as ``chunks`` (and then never ends, with ``stall``)."""

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk
        if stall:
            await asyncio.Event().wait()

    return httpx.Response(200, content=body())


async def events_of(response: httpx.Response, **bound: int) -> list[tuple[str, str]]:
    async with asyncio.timeout(10):  # a reader waiting for a line's end never returns
        return [e async for e in read_events(response, **bound)]


async def test_events_split_anywhere_across_chunks() -> None:
    body = b"event: a\r\ndata: x\r\ndata:y\n\n: a comment\n\ndata: z\r\rdata: last"
    expected = [("a", "x\ny"), ("", "z"), ("", "last")]
    assert await events_of(streamed(body)) == expected
    for cut in range(1, len(body)):  # every place a chunk may end, CR LF split included
        assert await events_of(streamed(body[:cut], body[cut:])) == expected, cut
    assert await events_of(streamed(*(bytes([b]) for b in body))) == expected


async def test_what_encode_event_writes_reads_back() -> None:
    body = encode_event(b'{"a": 1}', "update") + encode_event("é".encode())
    assert await events_of(streamed(body)) == [("update", '{"a": 1}'), ("", "é")]


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([b"data: " + b"x" * 3000], id="one line"),
        pytest.param([b"data: x\n" * 500], id="many lines of one event"),
    ],
)
async def test_an_event_past_the_bound_raises_without_reading_on(chunks: list[bytes]) -> None:
    """An event was read whole, whatever its size (a 300 MB data line took 900 MB). Past the
    bound the reader raises at once, naming it; the stream here stalls after it, so reading on
    would wait for ever."""
    with pytest.raises(sse.EventTooLarge, match="larger than 1000 bytes; not read on") as raised:
        await events_of(streamed(*chunks, stall=True), max_event_bytes=1000)
    assert raised.value.limit == 1000
    # a TransportError, and a ValueError for readers that take it for a bad answer (the LLM
    # client turns those into a ProviderError)
    assert isinstance(raised.value, TransportError) and isinstance(raised.value, ValueError)


async def test_events_within_the_bound_and_comments_beyond_it_are_read() -> None:
    keepalive = b": ping\n" * 2000  # comments hold nothing: they count for no event
    body = keepalive + b"data: " + b"y" * 900 + b"\n\n"
    assert await events_of(streamed(body), max_event_bytes=1000) == [("", "y" * 900)]
    assert sse.MAX_EVENT_BYTES == 16 * 1024 * 1024  # the default: a model's whole answer may be one
