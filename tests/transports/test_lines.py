"""LineFeed: NDJSON framing on the loop's callback, in order, with a size limit and pacing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from toolmesh.transports.lines import LineFeed, Oversized


class Recorder:
    def __init__(self) -> None:
        self.lines: list[bytes | Oversized] = []

    def __call__(self, line: bytes | Oversized) -> None:
        self.lines.append(line)


async def test_lines_split_across_chunks_are_joined_and_blank_lines_skipped() -> None:
    seen = Recorder()
    feed = LineFeed(seen, 100)
    for chunk in (b'{"a":', b'1}\n\n  \n{"b"', b":2}\n{", b'"c":3}'):
        feed.feed(chunk)
    assert seen.lines == [b'{"a":1}', b'{"b":2}']
    feed.end()  # the last line needs no newline
    assert seen.lines[-1] == b'{"c":3}'
    await feed.finished


async def test_an_oversized_line_is_reported_once_and_the_next_line_survives() -> None:
    seen = Recorder()
    feed = LineFeed(seen, 10)
    feed.feed(b"x" * 8)
    feed.feed(b"y" * 8)  # past the limit mid-line: discarded as it arrives
    feed.feed(b"z" * 4 + b"\nok\n" + b"w" * 12 + b"\n")
    feed.feed(b"q" * 11)
    feed.end()
    assert seen.lines == [Oversized(20), b"ok", Oversized(12), Oversized(11)]


async def test_lines_wait_behind_a_handler_that_returns_an_awaitable() -> None:
    order: list[str] = []
    gate = asyncio.Event()

    async def slow(name: str) -> None:
        order.append(f"{name} started")
        await gate.wait()
        order.append(f"{name} done")

    def handle(line: bytes | Oversized) -> Awaitable[None] | None:
        name = line.decode() if isinstance(line, bytes) else "?"
        if name.startswith("slow"):
            return slow(name)
        order.append(name)
        return None

    feed = LineFeed(handle, 100)
    feed.feed(b"first\nslow1\nafter\n")
    assert order == ["first", "slow1 started"]  # "after" waits for slow1
    feed.end()
    assert not feed.finished.done()
    gate.set()
    await feed.finished
    assert order == ["first", "slow1 started", "slow1 done", "after"]


async def test_a_failing_handler_fails_the_feed() -> None:
    async def broken() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("handler broke")

    feed = LineFeed(lambda line: broken(), 100)
    feed.feed(b"one\n")
    with pytest.raises(RuntimeError, match="handler broke"):
        await feed.finished


class Gated:
    """A handler that keeps the line ``wait`` (and so every line after it) until ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.handled: list[bytes | Oversized] = []

    def __call__(self, line: bytes | Oversized) -> Awaitable[bool] | None:
        self.handled.append(line)
        return self.gate.wait() if line == b"wait" else None


async def test_stop_ends_the_feed_and_drops_waiting_lines() -> None:
    handle = Gated()
    feed = LineFeed(handle, 100)
    feed.feed(b"wait\nlater\n")
    feed.stop()
    handle.gate.set()
    await feed.finished
    feed.feed(b"more\n")
    assert handle.handled == [b"wait"]


class FakePipe(asyncio.ReadTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.pauses = 0

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True


async def test_a_long_backlog_pauses_the_pipe_until_it_drains() -> None:
    handle = Gated()
    feed = LineFeed(handle, 100)
    pipe = FakePipe()
    feed.connection_made(pipe)
    feed.feed(b"wait\n" + b"x\n" * 1000)
    assert not pipe.reading and pipe.pauses == 1
    handle.gate.set()
    feed.end()
    await feed.finished
    assert pipe.reading and len(handle.handled) == 1001


async def test_a_crlf_line_end_does_not_count_against_the_limit() -> None:
    seen = Recorder()
    feed = LineFeed(seen, 10)
    feed.feed(b"x" * 10 + b"\r")  # at the limit, its LF still to come
    feed.feed(b"\n" + b"y" * 10 + b"\r\n" + b"z" * 11 + b"\r\n")
    feed.end()
    assert seen.lines == [b"x" * 10, b"y" * 10, Oversized(11)]
    await feed.finished


async def test_a_byte_order_mark_before_a_line_is_dropped() -> None:
    """Windows tools start a file with a BOM (and cat joins such files): not JSON."""
    seen = Recorder()
    feed = LineFeed(seen, 10)
    feed.feed(b"\xef\xbb")  # split across reads
    feed.feed(b'\xbf{"a":1}\n\xef\xbb\xbf{"b":2}\r\n')
    feed.end()
    assert seen.lines == [b'{"a":1}', b'{"b":2}']
    await feed.finished
