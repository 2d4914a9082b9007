"""The lean plain-HTTP client against a real asyncio server answering from a script."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable

import pytest

from toolmesh.transports.lean_http import (
    LeanClient,
    LeanConnectError,
    LeanProtocolError,
    LeanTimeout,
    lean_suits,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0

    async def __aenter__(self) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.script(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


def answer(body: bytes, *extra: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    head = [version + b" 200 OK", b"Content-Length: " + str(len(body)).encode(), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def post(url: str, body: bytes = b"{}", **options: float) -> tuple[int, bytes]:
    client = LeanClient(url, **options)
    try:
        async with await client.post(url + "/x", body) as response:
            return response.status_code, await response.aread()
    finally:
        await client.aclose()


async def test_keep_alive_reuses_one_connection() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            writer.write(answer(body, b"Content-Type: application/json"))

    server = Server(echo)
    async with server as url:
        client = LeanClient(url)
        for n in range(3):
            async with await client.post(url + "/x", b'{"n": %d}' % n) as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "application/json"
                assert await response.aread() == b'{"n": %d}' % n
        await client.aclose()
    assert server.connections == 1


async def test_the_request_carries_the_given_headers_once() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        writer.write(answer(b"ok"))
        await writer.drain()

    async with Server(record) as url:
        client = LeanClient(url, {"Authorization": "Bearer t", "content-type": "text/x"})
        async with await client.post(url + "/v1/x?q=1", b"body") as response:
            assert await response.aread() == b"ok"
        await client.aclose()
    lines = seen[0].decode().split("\r\n")
    assert lines[0] == "POST /v1/x?q=1 HTTP/1.1"
    assert "Authorization: Bearer t" in lines and "Content-Type: text/x" in lines
    assert "Content-Length: 4" in lines and "Accept-Encoding: identity" in lines
    assert sum(line.lower().startswith("content-type") for line in lines) == 1


def test_headers_that_would_break_the_request_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot carry"):
        LeanClient("http://127.0.0.1:1", {"X-Evil": "a\r\nHost: elsewhere"})
    with pytest.raises(ValueError, match="plain http"):
        LeanClient("https://127.0.0.1:1")


async def test_chunked_and_gzip_bodies() -> None:
    packed = gzip.compress(b"hello, world")

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
        )
        for piece in (packed[:5], packed[5:]):
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        writer.write(b"0\r\n\r\n")

    async with Server(chunked) as url:
        assert await post(url) == (200, b"hello, world")


async def test_a_body_that_ends_with_the_connection() -> None:
    async def old_style(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
        await writer.drain()

    async with Server(old_style) as url:
        assert await post(url) == (200, b"until the end")


async def test_streaming_reads_lines_as_they_arrive() -> None:
    more = asyncio.Event()

    async def events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

        def chunk(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunk(b"data: 1\r\ndata: 2\r"))
        await writer.drain()
        await more.wait()
        # the second line's end is cut between CR and LF, and "é" between its two bytes
        writer.write(chunk(b"\n\r\n\xc3") + chunk(b"\xa9\r\n") + b"0\r\n\r\n")

    async with Server(events) as url:
        client = LeanClient(url)
        seen = []
        async with await client.post(url, b"{}") as response:
            async for line in response.aiter_lines():
                seen.append(line)
                more.set()  # the rest is sent only after the first line was read
        await client.aclose()
    assert seen == ["data: 1", "data: 2", "", "é"]


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"ok"))
        await writer.drain()  # then close: the idle connection in the pool goes stale

    server = Server(once)
    async with server as url:
        client = LeanClient(url)
        for _ in range(2):
            async with await client.post(url, b"{}") as response:
                assert await response.aread() == b"ok"
        await client.aclose()
    assert server.connections == 2


async def test_failures_are_lean_errors() -> None:
    with pytest.raises(LeanConnectError):
        await post("http://127.0.0.1:9")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.Event().wait()

    async with Server(silent) as url:
        with pytest.raises(LeanTimeout):
            await post(url, read_timeout=0.2)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")

    async with Server(garbage) as url:
        with pytest.raises(LeanProtocolError):
            await post(url)


async def test_a_get_carries_no_body_fields_and_its_own_headers_win() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer(b"ok"))
        await writer.drain()

    async with Server(record) as url:
        client = LeanClient(url, {"Accept": "application/json", "X-Team": "a"})
        headers = {"accept": "text/event-stream", "X-Session-Id": "s1"}
        async with await client.request("GET", url + "/stream", headers=headers) as response:
            assert await response.aread() == b"ok"
        await client.aclose()
    lines = seen[0].decode().split("\r\n")
    assert lines[0] == "GET /stream HTTP/1.1"
    assert "accept: text/event-stream" in lines and "X-Session-Id: s1" in lines
    assert "X-Team: a" in lines
    assert not any(line.lower().startswith(("content-length", "content-type")) for line in lines)
    assert sum(line.lower().startswith("accept:") for line in lines) == 1


async def test_a_stream_may_wait_longer_than_the_read_timeout() -> None:
    late = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await late.wait()
        writer.write(b"5\r\nlate\n\r\n0\r\n\r\n")

    async with Server(slow) as url:
        client = LeanClient(url, read_timeout=0.01)
        async with await client.request("GET", url, read_timeout=None) as response:
            lines = response.aiter_lines()
            waiting = asyncio.ensure_future(anext(lines))
            # Well past the client's own read timeout, the read is still waiting.
            done, _ = await asyncio.wait([waiting], timeout=0.2)
            assert not done
            late.set()
            assert await waiting == "late"
        await client.aclose()


def test_which_urls_the_lean_client_can_carry(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert lean_suits("http://127.0.0.1:8765")
    assert not lean_suits("https://127.0.0.1:8765")
    assert not lean_suits("http://user:secret@127.0.0.1:8765")  # httpx sends basic auth
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert not lean_suits("http://models.internal:8000")  # httpx goes through the proxy
    monkeypatch.setenv("NO_PROXY", "models.internal")
    assert lean_suits("http://models.internal:8000")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc"])
def test_a_bad_port_is_named(url: str) -> None:
    with pytest.raises(ValueError, match="is not a usable URL") as refused:
        LeanClient(url)
    assert repr(url) in str(refused.value)


@pytest.mark.parametrize(
    "interim",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"],
)
async def test_interim_1xx_answers_are_skipped(interim: bytes) -> None:
    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(interim + answer(b"final"))

    async with Server(early) as url:
        assert await post(url) == (200, b"final")


async def test_chunked_framing_wins_over_a_content_length() -> None:
    async def both(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2;ext=1\r\nok\r\n0\r\n\r\n"
        )

    async with Server(both) as url:
        assert await post(url) == (200, b"ok")


async def test_conflicting_content_lengths_are_refused_and_not_resent() -> None:
    requests = 0

    async def conflicting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            requests += 1
            if requests == 1:
                writer.write(answer(b"ok"))
            else:
                writer.write(answer(b"hello", b"Content-Length: 2"))

    async with Server(conflicting) as url:
        client = LeanClient(url)
        async with await client.post(url, b"{}") as response:
            assert await response.aread() == b"ok"
        with pytest.raises(LeanProtocolError, match="conflicting lengths"):
            await client.post(url, b"{}")  # on the reused connection
        await client.aclose()
    assert requests == 2  # an unusable answer is no reason to send the request again
