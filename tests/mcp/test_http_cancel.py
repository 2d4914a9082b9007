"""Calls cancelled at their deadline over streamable HTTP leave no exchange open. On a 2025-era
connection the SDK POSTs notifications/cancelled but goes on reading the request's own response,
which a server that honours the cancellation may never end (the spec has it not answer a
cancelled request; the TypeScript SDK's server does not), and one whose tool ignores it ends
only with the tool: an open connection, and an SDK task, per timed-out call, unless toolmesh
ends the exchange. The SDK's own server, served by uvicorn on 127.0.0.1 in the test's loop,
behind an ASGI gate that counts the calls' exchanges still open: neither answered in full nor
left by the client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx2
import pytest
from mcp.server.mcpserver import MCPServer

from tests.fixtures.web import serve_app
from tests.mcp.test_http_acks import _body, _replay
from toolmesh import Toolkit
from toolmesh.mcp._http_client import AckBoundClient
from toolmesh.mcp.config import parse_mcp_server
from toolmesh.mcp.source import mcp_source

pytestmark = [pytest.mark.network_server]

CALLS = 10
# The answer the SDK's server gives a cancelled request on a 2025-era connection
CANCELLED_ANSWER = b'"code":-32800'


class Watch:
    """Counters a test waits on, set in the test's loop by the server and the gate."""

    def __init__(self) -> None:
        self.started = 0  # calls of `hang` the server ran
        self.cancelled = 0  # calls of `hang` cancelled at the server
        self.release = anyio.Event()  # ends the calls still running at the end
        self._changed = asyncio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def settle(self, condition: Callable[[], bool], timeout: float = 5) -> None:
        """Wait until ``condition`` holds, or ``timeout`` seconds (the caller asserts it)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not condition():
                    self._changed.clear()
                    await self._changed.wait()


def cancel_server(watch: Watch) -> MCPServer:
    server = MCPServer("gated")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    async def hang() -> str:
        """Wait until cancelled (or released)."""
        watch.started += 1
        try:
            await watch.release.wait()
        except anyio.get_cancelled_exc_class():
            watch.cancelled += 1
            watch.changed()
            raise
        return "released"

    @server.tool()
    async def stubborn() -> str:
        """Ignore cancellation until released."""
        with anyio.CancelScope(shield=True):
            await watch.release.wait()
        return "released"

    return server


class ExchangeGate:
    """ASGI middleware that counts the open exchanges of tools/call and the cancellation notices
    POSTed. With ``silent``, it drops a cancelled request's answer, and keeps its exchange open
    until the client leaves, as a server that never answers a cancelled request does."""

    def __init__(self, app: Any, watch: Watch, *, silent: bool) -> None:
        self.app = app
        self.watch = watch
        self.silent = silent
        self.open = 0
        self.notices = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        method = json.loads(body).get("method")
        if method == "notifications/cancelled":
            self.notices += 1
            self.watch.changed()
        if method != "tools/call":
            await self.app(scope, _replay(body, receive), send)
            return
        self.open += 1
        left = asyncio.ensure_future(_client_left(receive))
        left.add_done_callback(self._closed)
        silencer = Silencer(send)
        try:
            await self.app(scope, _replay(body, receive), silencer if self.silent else send)
            if silencer.silenced:
                await left
        finally:
            left.cancel()

    def _closed(self, _left: object) -> None:
        self.open -= 1
        self.watch.changed()


async def _client_left(receive: Any) -> None:
    """Returns once the client has left, or its answer was sent in full (the body is read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Silencer:
    """The ``send`` of one exchange, dropping a cancelled request's answer and all after it (a
    JSON answer's headers come with it; an event stream's at once)."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._start: Any = None
        self.silenced = False

    async def __call__(self, message: Any) -> None:
        if self.silenced:
            return
        if message["type"] == "http.response.start" and _is_json(message):
            self._start = message
            return
        if CANCELLED_ANSWER in message.get("body", b""):
            self.silenced = True
            return
        if self._start is not None:
            start, self._start = self._start, None
            await self._send(start)
        await self._send(message)


def _is_json(start: Any) -> bool:
    return any(
        name.lower() == b"content-type" and value.startswith(b"application/json")
        for name, value in start["headers"]
    )


@contextlib.asynccontextmanager
async def served(
    watch: Watch, *, silent: bool, json_response: bool
) -> AsyncIterator[tuple[str, ExchangeGate]]:
    server = cancel_server(watch)
    gate = ExchangeGate(
        server.streamable_http_app(json_response=json_response), watch, silent=silent
    )
    async with server.session_manager.run(), serve_app(gate) as url:
        try:
            yield f"{url}/mcp", gate
        finally:
            watch.release.set()  # else the server's close would wait for them


SERVERS = {
    # tool, and whether the gate silences the answer to a cancelled request
    "honours-unanswered": ("hang", True),
    "honours-answered": ("hang", False),  # the SDK's server ends the stream itself
    "ignores": ("stubborn", False),
}


@pytest.mark.parametrize("json_response", [False, True], ids=["event-stream", "json"])
@pytest.mark.parametrize("kind", list(SERVERS))
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_calls_cancelled_at_their_deadline_leave_no_exchange_open(
    mode: str, kind: str, json_response: bool, caplog: pytest.LogCaptureFixture
) -> None:
    tool, silent = SERVERS[kind]
    watch = Watch()
    async with served(watch, silent=silent, json_response=json_response) as (url, gate):
        config = parse_mcp_server("gated", {"url": url, "mode": mode})
        async with await Toolkit(mcp_source(config)).start() as toolkit:
            calls = [toolkit.execute(f"gated_{tool}", {}, timeout=0.2) for _ in range(CALLS)]
            results = await asyncio.gather(*calls)
            assert [r.error_code for r in results] == ["timeout"] * CALLS

            notices = CALLS if mode == "legacy" else 0  # 2026: the abort is the cancellation
            # (a tool ignoring cancellation may end its exchange before its notice arrives)
            await watch.settle(lambda: gate.open == 0 and gate.notices == notices)
            assert gate.open == 0  # every exchange ended
            assert gate.notices == notices
            # The server stopped them; but the SDK's 2026-07-28 server answering in JSON does
            # not notice the client leaving (its modern handler never reads the ASGI receive).
            # Every call the server ran was cancelled there; on a loaded machine some calls do
            # not reach it within their 0.2 s, and those the server never runs.
            if tool == "hang" and (mode == "legacy" or not json_response):
                await watch.settle(lambda: watch.cancelled == watch.started > 0)
                assert watch.cancelled == watch.started > 0

            echoed = await toolkit.execute("gated_echo", {"text": "after"}, timeout=5)
            assert echoed.success, echoed.error
            assert echoed.output == "after"
            assert toolkit.sources[0].status.state == "connected"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_an_exchange_ended_mid_event_closes_that_event_then_answers() -> None:
    """The notice may end a request's event stream in the middle of an event: that event is
    closed first (the SDK reads it, or fails to), so the answer after it is read whole."""
    waiting = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b'event: message\ndata: {"jsonrpc":"2.0","method":"notifi'
        waiting.set()
        await asyncio.Event().wait()  # the server sends no more

    def handler(request: httpx2.Request) -> httpx2.Response:
        if json.loads(request.content)["method"] != "tools/call":
            return httpx2.Response(202)
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, content=body())

    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}
    notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
    client = AckBoundClient("raw", 1.0, transport=httpx2.MockTransport(handler))
    async with client, client.stream("POST", "http://mcp.test/", json=call) as response:
        events = asyncio.ensure_future(_events(response))
        await waiting.wait()
        assert (await client.post("http://mcp.test/", json=notice)).status_code == 202
        async with asyncio.timeout(5):
            cut, answer = [e.data for e in await events]
    assert cut == '{"jsonrpc":"2.0","method":"notifi'
    assert json.loads(answer) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32800, "message": "Request cancelled"},
    }


async def _events(response: httpx2.Response) -> list[httpx2.ServerSentEvent]:
    return [event async for event in httpx2.EventSource(response)]


async def test_an_exchange_ended_before_its_headers_answers_and_is_forgotten() -> None:
    """A notice that comes while the request still waits for the server's headers ends the
    wait with the request's answer; a notice naming no open exchange changes nothing."""
    arrived = asyncio.Event()

    async def handler(request: httpx2.Request) -> httpx2.Response:
        if json.loads(request.content)["method"] != "tools/call":
            return httpx2.Response(202)
        arrived.set()
        await asyncio.Event().wait()  # the server never answers
        raise AssertionError("unreachable")

    def notice(request_id: object) -> dict[str, Any]:
        params = {"requestId": request_id}
        return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}

    async def call() -> tuple[str, bytes]:
        request = {"jsonrpc": "2.0", "id": "c-1", "method": "tools/call", "params": {}}
        async with client.stream("POST", "http://mcp.test/", json=request) as response:
            return response.headers["content-type"], await response.aread()

    client = AckBoundClient("raw", 1.0, transport=httpx2.MockTransport(handler))
    async with client:
        calling = asyncio.ensure_future(call())
        await arrived.wait()
        for unknown in (99, "c-2"):
            assert (await client.post("http://mcp.test/", json=notice(unknown))).status_code == 202
        assert not calling.done() and list(client._exchanges) == ["c-1"]
        assert (await client.post("http://mcp.test/", json=notice("c-1"))).status_code == 202
        async with asyncio.timeout(5):
            kind, body = await calling
    assert kind == "application/json" and client._exchanges == {}
    assert json.loads(body) == {
        "jsonrpc": "2.0",
        "id": "c-1",
        "error": {"code": -32800, "message": "Request cancelled"},
    }
