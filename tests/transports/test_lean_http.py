"""The lean plain-HTTP transport against a real asyncio server answering from a script."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from toolmesh.transports.lean_http import LeanTransport

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


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=LeanTransport(), timeout=5) as http:
        yield http


async def test_keep_alive_reuses_one_connection(client: httpx.AsyncClient) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            writer.write(answer(body, b"Content-Type: application/json"))

    server = Server(echo)
    async with server as url:
        for n in range(3):
            response = await client.post(url + "/x", json={"n": n})
            assert response.status_code == 200 and response.json() == {"n": n}
    assert server.connections == 1


async def test_chunked_and_gzip_bodies(client: httpx.AsyncClient) -> None:
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
        response = await client.get(url)
    assert response.text == "hello, world"


async def test_a_body_that_ends_with_the_connection(client: httpx.AsyncClient) -> None:
    async def old_style(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
        await writer.drain()

    async with Server(old_style) as url:
        assert (await client.get(url)).text == "until the end"


async def test_streaming_reads_as_it_arrives(client: httpx.AsyncClient) -> None:
    more = asyncio.Event()

    async def events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"7\r\ndata: 1\r\n")
        await writer.drain()
        await more.wait()
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")

    async with Server(events) as url, client.stream("GET", url) as response:
        seen = []
        async for chunk in response.aiter_bytes():
            seen.append(chunk)
            more.set()  # the second chunk is sent only after the first was read
    assert seen == [b"data: 1", b"data: 2"]


async def test_an_idle_connection_the_server_closed_is_replaced(
    client: httpx.AsyncClient,
) -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"ok"))
        await writer.drain()  # then close: the idle connection in the pool goes stale

    server = Server(once)
    async with server as url:
        assert (await client.get(url)).text == "ok"
        assert (await client.get(url)).text == "ok"
    assert server.connections == 2


async def test_errors_are_httpx_errors(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.ConnectError):
        await client.get("http://127.0.0.1:9/")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.Event().wait()

    async with Server(silent) as url:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(url, timeout=0.2)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")

    async with Server(garbage) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(url)


async def test_other_schemes_go_to_the_fallback() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, text="from the fallback")

    transport = LeanTransport(fallback=httpx.MockTransport(handler))
    async with httpx.AsyncClient(transport=transport) as http:
        assert (await http.get("https://example.invalid/x")).text == "from the fallback"
    assert seen == ["https://example.invalid/x"]
