"""toolmesh's MCP streamable HTTP endpoint (`/mcp`) with clients that misbehave or are merely
slow: a call's event stream stays bounded and a closed one cancels the call; 2025-era
sessions send each message on one stream, fail an approval they cannot ask for at once, and
are not reaped while a call runs. Raw httpx on 127.0.0.1, so each test controls what the
client reads and when."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mcp.conftest import MCP_HEADERS, MODERN_HELLO
from toolmesh import Host, Limits, ToolContext, tool
from toolmesh.mcp.http import MAX_QUEUED_MESSAGES, mcp_routes
from toolmesh.transports.http import HttpServer

pytestmark = [pytest.mark.network_server]

BURST = 5000  # progress notifications a tool emits at once, many more than a stream holds


@contextlib.asynccontextmanager
async def serving(host: Host) -> AsyncIterator[httpx.AsyncClient]:
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            yield http
    finally:
        await server.stop()
        await host.close()


async def open_session(http: httpx.AsyncClient, **capabilities: Any) -> dict[str, str]:
    hello = {**MODERN_HELLO, "capabilities": capabilities}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    opened = await http.post("/mcp", json=init, headers=MCP_HEADERS)
    assert opened.status_code == 200, opened.text
    return {
        **MCP_HEADERS,
        "Mcp-Session-Id": opened.headers["mcp-session-id"],
        "MCP-Protocol-Version": "2025-11-25",
    }


def call(request_id: int, name: str, *, progress: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": {}}
    if progress:
        params["_meta"] = {"progressToken": "p"}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_burst_of_progress_is_coalesced_and_the_answer_kept(tmp_path: Path) -> None:
    """More progress than a stream holds, before the client reads any: the newest progress
    and the answer arrive, the backlog does not (it grew without bound)."""

    @tool
    async def burst(ctx: ToolContext) -> str:
        """Emits a burst of progress, all before the stream sends any."""
        for step in range(BURST):
            ctx.emit("progress", {"pct": step * 100 // BURST, "message": f"step {step}"})
        return "done"

    async with serving(Host(burst, audit=tmp_path / "a.db")) as http:
        session = await open_session(http)
        answer = await http.post("/mcp", json=call(2, "burst", progress=True), headers=session)
    messages = events(answer.text)
    steps = [int(m["params"]["message"].split()[1]) for m in messages if "method" in m]
    assert 0 < len(steps) <= MAX_QUEUED_MESSAGES
    assert steps == sorted(steps) and steps[-1] == BURST - 1  # in order, the newest kept
    assert messages[-1]["result"]["content"][0]["text"] == "done"


async def test_closing_a_chatty_calls_stream_cancels_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool that never stops emitting: the client closing its response still cancels it
    (the disconnect went unseen while messages waited), and stopping logs no traceback."""
    cancelled = asyncio.Event()

    @tool
    async def chatty(ctx: ToolContext) -> str:
        """Emits progress until cancelled."""
        try:
            while True:
                for _ in range(50):
                    ctx.emit("progress", {"pct": 1, "message": "z" * 200})
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with caplog.at_level(logging.ERROR):
        async with serving(Host(chatty, audit=tmp_path / "a.db")) as http:
            session = await open_session(http)
            request = call(2, "chatty", progress=True)
            async with http.stream("POST", "/mcp", json=request, headers=session) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        break  # the first progress: the client has seen enough
            await asyncio.wait_for(cancelled.wait(), 10)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def read_stream(
    http: httpx.AsyncClient,
    session: dict[str, str],
    seen: list[dict[str, Any]],
    attached: asyncio.Event,
) -> None:
    """A GET stream of ``session``, read into ``seen`` until it ends, answering an approval's
    request; ``attached`` is set once the server sends on it."""
    headers = {**session, "Accept": "text/event-stream"}
    async with http.stream("GET", "/mcp", headers=headers) as stream:
        assert stream.status_code == 200
        attached.set()
        async for line in stream.aiter_lines():
            if not line.startswith("data: "):
                continue
            message = json.loads(line[6:])
            seen.append(message)
            if message.get("method") == "elicitation/create":
                answer = {"action": "accept", "content": {"approve": True}}
                reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer}
                await http.post("/mcp", json=reply, headers=session)


@tool(requires_approval=True)
def deploy() -> str:
    """Deploys (needs approval)."""
    return "deployed"


async def test_each_message_goes_on_one_get_stream(tmp_path: Path) -> None:
    """Two GET streams and a JSON-only POST needing approval: the approval's request goes on
    one stream (the newest), not on both, so it is answered once."""
    host = Host(deploy, audit=tmp_path / "a.db", limits=Limits(approval_timeout=10))
    async with serving(host) as http:
        session = await open_session(http, elicitation={})
        json_only = {**session, "Accept": "application/json"}
        seen: list[list[dict[str, Any]]] = [[], []]
        readers = []
        for received in seen:  # one after the other: the second is the newest
            attached = asyncio.Event()
            readers.append(asyncio.ensure_future(read_stream(http, session, received, attached)))
            await asyncio.wait_for(attached.wait(), 10)
        answer = await http.post("/mcp", json=call(2, "deploy"), headers=json_only)
        assert answer.json()["result"]["content"][0]["text"] == "deployed"
        deleted = await http.delete("/mcp", headers=session)  # ends both streams
        assert deleted.status_code == 200
        await asyncio.wait_for(asyncio.gather(*readers), 10)
    asks = [[m["method"] for m in received if "method" in m] for received in seen]
    assert asks == [[], ["elicitation/create"]]


async def test_an_approval_with_no_channel_fails_at_once(tmp_path: Path) -> None:
    """No GET stream and a JSON-only POST: there is nowhere to ask, so the approval fails now
    (the request was dropped, and the call waited out the approval timeout)."""
    host = Host(deploy, audit=tmp_path / "a.db", limits=Limits(approval_timeout=5))
    async with serving(host) as http:
        session = await open_session(http, elicitation={})
        json_only = {**session, "Accept": "application/json"}
        answer = await http.post("/mcp", json=call(2, "deploy"), headers=json_only)
    result = answer.json()["result"]
    assert result["isError"] is True
    assert "no channel to ask the client on" in result["content"][0]["text"]


async def test_a_session_with_a_call_running_is_not_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolmesh.mcp.http as mcp_http

    release = asyncio.Event()
    started = asyncio.Event()

    @tool
    async def long_call() -> str:
        """Runs until released."""
        started.set()
        await release.wait()
        return "finished"

    monkeypatch.setattr(mcp_http, "REAP_EVERY_SECONDS", 0.0)  # the reaper looks all the time
    async with serving(Host(long_call, audit=tmp_path / "a.db")) as http:
        session = await open_session(http)
        json_only = {**session, "Accept": "application/json"}
        running = asyncio.ensure_future(
            http.post("/mcp", json=call(2, "long_call"), headers=json_only)
        )
        await asyncio.wait_for(started.wait(), 10)
        monkeypatch.setattr(mcp_http, "IDLE_SESSION_SECONDS", -1.0)  # idle at once, but busy
        ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
        assert (await http.post("/mcp", json=ping, headers=json_only)).status_code == 200
        release.set()
        answer = await asyncio.wait_for(running, 10)
    assert answer.json()["result"]["content"][0]["text"] == "finished"
