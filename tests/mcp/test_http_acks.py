"""A streamable-HTTP MCP server that never answers a POST owed only a status (a notification's
202) cannot stall the connection, nor a DELETE never answered the close; long calls still run as
long as their tools do. The SDK's own server, behind an ASGI gate that holds one kind of exchange,
served by uvicorn on 127.0.0.1 in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer

from tests.fixtures.web import serve_app
from toolmesh import ToolEvent, Toolkit
from toolmesh.mcp import source as mcp_source_module
from toolmesh.mcp.config import parse_mcp_server
from toolmesh.mcp.source import mcp_source

pytestmark = [pytest.mark.network_server]

ACK_BOUND = 0.5  # ACK_TIMEOUT in these tests: each stall they provoke lasts this long
LONG_CALL = 1.0  # longer than ACK_BOUND


@pytest.fixture(autouse=True)
def _short_ack_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_source_module, "ACK_TIMEOUT", ACK_BOUND)


def tools_server() -> MCPServer:
    server = MCPServer("gated")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    async def wait(seconds: float) -> str:
        """Wait (until cancelled)."""
        await asyncio.sleep(seconds)
        return "waited"

    @server.tool()
    async def work(seconds: float, ctx: Context) -> str:
        """Report progress (the answer becomes an event stream, unless JSON is asked for),
        then work for `seconds`."""
        await ctx.report_progress(0, 1, "working")
        await asyncio.sleep(seconds)
        return "worked"

    return server


class Gate:
    """ASGI middleware that holds the exchanges named ``held`` (a POSTed notification's method,
    or "DELETE"): the server acts on them but its answer is dropped, the client left waiting, or,
    with ``delay``, the server gets to them that many seconds late."""

    def __init__(self, app: Any, held: str, delay: float | None = None) -> None:
        self.app = app
        self.held = held
        self.delay = delay
        self.arrived = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await _body(receive) if scope["method"] == "POST" else b""
        replay = _replay(body, receive)
        if not self._holds(scope["method"], body):
            await self.app(scope, replay, send)
            return
        self.arrived.set()
        if self.delay is not None:
            await asyncio.sleep(self.delay)  # a slow server, not a synchronisation
            await self.app(scope, replay, send)
            return
        await self.app(scope, replay, _dropped)
        while (await receive())["type"] != "http.disconnect":
            pass

    def _holds(self, method: str, body: bytes) -> bool:
        if method != "POST":
            return method == self.held
        message = json.loads(body)
        return "id" not in message and message.get("method") == self.held


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives the body already read, then the client's own events."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again() -> Any:
        return pending.pop() if pending else await receive()

    return receive_again


async def _dropped(message: Any) -> None:
    pass


@contextlib.asynccontextmanager
async def gated(
    held: str, *, delay: float | None = None, json_response: bool = False
) -> AsyncIterator[tuple[str, Gate]]:
    """The tools server's /mcp URL behind a gate holding ``held``, and the gate."""
    server = tools_server()
    gate = Gate(server.streamable_http_app(json_response=json_response), held, delay)
    async with server.session_manager.run(), serve_app(gate) as url:
        yield f"{url}/mcp", gate


async def started(url: str, **settings: Any) -> Toolkit:
    config = parse_mcp_server("gated", {"url": url, "mode": "legacy", **settings})
    return await Toolkit(mcp_source(config)).start()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_an_unanswered_cancellation_does_not_hold_up_later_calls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with gated("notifications/cancelled") as (url, gate), await started(url) as toolkit:
        timed_out = await toolkit.execute("gated_wait", {"seconds": 30}, timeout=0.2)
        assert timed_out.error_code == "timeout"
        async with asyncio.timeout(5):
            await gate.arrived.wait()  # the notice is posted, its answer held back
        echoed = await toolkit.execute("gated_echo", {"text": "after"}, timeout=5)
        assert echoed.success, echoed.error
        assert echoed.output == "after"
        assert toolkit.sources[0].status.state == "connected"
    assert (
        "MCP server 'gated' did not answer the POST of notification notifications/cancelled "
        f"within {ACK_BOUND:g}s; stopped waiting for it"
    ) in warnings_of(caplog)


async def test_an_unanswered_initialized_notification_does_not_fail_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        gated("notifications/initialized") as (url, _gate),
        await started(url, connect_timeout=5) as toolkit,
    ):
        assert toolkit.sources[0].status.state == "connected"
        echoed = await toolkit.execute("gated_echo", {"text": "hi"}, timeout=5)
        assert echoed.success, echoed.error
    assert any("notification notifications/initialized within" in w for w in warnings_of(caplog))


async def test_an_unanswered_delete_does_not_hold_up_the_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with gated("DELETE") as (url, gate):
        # A connect timeout below ACK_TIMEOUT is the bound itself.
        toolkit = await started(url, connect_timeout=0.4)
        assert toolkit.sources[0].status.state == "connected"
        async with asyncio.timeout(5):
            await toolkit.close()
        assert gate.arrived.is_set()
    assert (
        "MCP server 'gated' did not answer the DELETE that ends the session within 0.4s; "
        "stopped waiting for it"
    ) in warnings_of(caplog)


async def test_a_cancellation_answered_slowly_within_the_bound_is_waited_for(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp_source_module, "ACK_TIMEOUT", 3.0)
    async with (
        gated("notifications/cancelled", delay=0.3) as (url, gate),
        await started(url) as toolkit,
    ):
        timed_out = await toolkit.execute("gated_wait", {"seconds": 30}, timeout=0.2)
        assert timed_out.error_code == "timeout"
        async with asyncio.timeout(5):
            await gate.arrived.wait()
        echoed = await toolkit.execute("gated_echo", {"text": "after"}, timeout=5)
        assert echoed.success, echoed.error
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("json_response", [False, True], ids=["event-stream", "json"])
async def test_a_call_may_take_longer_than_the_bound(
    json_response: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The bound is for answers owed only a status: a call's answer, streamed or (headers and
    all) sent as JSON at the end, takes as long as its tool."""
    events: list[ToolEvent] = []
    async with (
        gated("notifications/cancelled", json_response=json_response) as (url, _gate),
        await started(url) as toolkit,
    ):
        worked = await toolkit.execute(
            "gated_work", {"seconds": LONG_CALL}, timeout=10, on_event=events.append
        )
        assert worked.success, worked.error
        assert worked.output == "worked"
    if not json_response:
        assert [e.kind for e in events].count("progress") == 1  # it came as an event stream
    assert warnings_of(caplog) == []
