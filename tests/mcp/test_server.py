"""toolmesh serving a toolkit over MCP, against the official Python SDK client in both protocol
modes (2026-07-28 and the 2025 handshake), over stdio (`toolmesh serve --mcp-stdio`) and
streamable HTTP (`/mcp` beside A2E)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import httpx
import pytest
from mcp import Client, MCPError, StdioServerParameters

from tests.conftest import REPO
from tests.fixtures.demo_tools import RELEASE, TOOLS
from tests.fixtures.waiting import Waiting
from tests.mcp.conftest import open_2025_session
from toolmesh import Host, ToolContext, tool
from toolmesh.mcp.http import mcp_routes
from toolmesh.transports.http import HttpServer

pytestmark = [pytest.mark.network_server]

SIGNALS: dict[str, asyncio.Event] = {}  # made by each test, on its own event loop


@tool
async def linger(ctx: ToolContext) -> str:
    """Waits until cancelled, and says so."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        SIGNALS["cancelled"].set()
        raise
    return "never"


@dataclass
class Served:
    client: Client
    audit: Path
    transport: str
    notifications: list[Any] = field(default_factory=list)
    host: Host | None = None
    list_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def audit_rows(self) -> list[dict[str, Any]]:
        db = sqlite3.connect(self.audit)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute("SELECT * FROM audit ORDER BY id")]
        finally:
            db.close()


VARIANTS = ["stdio-auto", "stdio-legacy", "http-auto", "http-legacy"]


@contextlib.asynccontextmanager
async def serving(variant: str, tmp_path: Path) -> AsyncIterator[Served]:
    """A client of the demo toolkit (the SDK's client runs on anyio task groups, so it is
    entered and left inside each test's own task, never in a fixture)."""
    transport, mode = variant.split("-")
    audit = tmp_path / "audit.db"
    notes: list[Any] = []
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        notes.append(message)
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            changed.set()

    if transport == "stdio":
        command = ["-m", "toolmesh", "serve", "--mcp-stdio", "--audit", str(audit)]
        command += ["--tools", "tests.fixtures.demo_tools:TOOLS", "--capability", "demo"]
        params = StdioServerParameters(command=sys.executable, args=command, cwd=REPO)
        async with Client(params, mode=mode, message_handler=on_message) as client:
            yield Served(client, audit, transport, notes, list_changed=changed)
        return
    host = Host(*TOOLS, linger, audit=audit, capabilities=["demo"])
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with Client(f"{url}/mcp", mode=mode, message_handler=on_message) as client:
            yield Served(client, audit, transport, notes, host, changed)
    finally:
        RELEASE.set()
        await server.stop()
        await host.close()


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


@pytest.mark.parametrize("variant", VARIANTS)
async def test_tools_are_listed_with_schemas_and_annotations(variant: str, tmp_path: Path) -> None:
    async with serving(variant, tmp_path) as served:
        listing = await served.client.list_tools(cache_mode="bypass")
        tools = {t.name: t for t in listing.tools}
        assert {"echo", "add", "count", "read_file", "search_tools"} <= set(tools)
        assert "secret" not in tools  # needs a capability this host does not grant
        assert "github_search" not in tools  # deferred: found through search_tools
        assert tools["echo"].input_schema["properties"]["text"]["type"] == "string"
        assert tools["echo"].input_schema["required"] == ["text"]
        assert tools["read_file"].annotations is not None
        assert tools["read_file"].annotations.idempotent_hint is True
        assert tools["count"].output_schema is not None
        assert served.client.server_info is not None
        assert served.client.server_info.name == "toolmesh"


@pytest.mark.parametrize("variant", VARIANTS)
async def test_calls_go_through_the_pipeline(variant: str, tmp_path: Path) -> None:
    async with serving(variant, tmp_path) as served:
        client = served.client
        echoed = await client.call_tool("echo", {"text": "hi"})
        assert not echoed.is_error and text_of(echoed) == "hi"

        counted = await client.call_tool("count", {"n": 2})
        assert counted.structured_content == {"counted": 2}

        invalid = await client.call_tool("add", {"a": "one", "b": 2})
        assert invalid.is_error  # a result the model can read, not a protocol error
        assert "$.a" in text_of(invalid)

        failed = await client.call_tool("boom", {})
        assert failed.is_error and "kaboom" in text_of(failed)

        denied = await client.call_tool("secret", {})
        assert denied.is_error and "secret::read" in text_of(denied)

        with pytest.raises(MCPError) as unknown:
            await client.call_tool("nope", {})
        assert unknown.value.code == -32602

        await client.__aexit__(None, None, None)  # end the session so the audit log is complete
        if served.host is not None:
            await served.host.close()
        rows = served.audit_rows()
        assert {r["transport"] for r in rows} == {"mcp"}
        codes = [(r["tool_name"], r["error_code"]) for r in rows]
        assert ("add", "invalid_arguments") in codes
        assert ("secret", "tool_denied") in codes
        assert ("nope", "unknown_tool") in codes


@pytest.mark.parametrize("variant", VARIANTS)
async def test_progress_events_become_progress_notifications(variant: str, tmp_path: Path) -> None:
    async with serving(variant, tmp_path) as served:
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        result = await served.client.call_tool("count", {"n": 4}, progress_callback=on_progress)
        assert not result.is_error
        assert [p for p, _, _ in seen] == [25, 50, 75, 100]
        assert seen[0][1] == 100 and seen[0][2] == "step 1 of 4"


@pytest.mark.parametrize("variant", VARIANTS)
async def test_search_tools_loads_deferred_tools(variant: str, tmp_path: Path) -> None:
    async with serving(variant, tmp_path) as served:
        client = served.client
        modern = client.protocol_version == "2026-07-28"
        changed = asyncio.Event()

        async def listen() -> None:
            async with client.listen(tools_list_changed=True) as subscription:
                listening.set()
                async for _event in subscription:
                    changed.set()
                    return

        listening = asyncio.Event()
        listener = asyncio.ensure_future(listen()) if modern else None
        if listener is not None:
            await listening.wait()
        found = await client.call_tool("search_tools", {"query": "search github repositories"})
        assert not found.is_error
        assert found.structured_content is not None
        assert found.structured_content["tools"][0]["name"] == "github_search"
        if modern:  # on the listen stream
            await asyncio.wait_for(changed.wait(), 10)
        else:  # on the connection (stdio) or the session's GET stream (HTTP)
            await asyncio.wait_for(served.list_changed.wait(), 10)
        listing = await client.list_tools(cache_mode="bypass")
        assert "github_search" in {t.name for t in listing.tools}
        result = await client.call_tool("github_search", {"q": "toolmesh"})
        assert result.structured_content == {"results": ["repo matching toolmesh"]}
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)


@pytest.mark.parametrize("variant", ["stdio-auto", "http-auto"])
async def test_search_tools_checks_its_arguments_and_is_audited(
    variant: str, tmp_path: Path
) -> None:
    async with serving(variant, tmp_path) as served:
        client = served.client
        bad = await client.call_tool("search_tools", {"query": "github", "limit": 500})
        assert bad.is_error and "limit" in text_of(bad)  # not silently the default
        assert (bad.meta or {})["io.toolmesh/errorCode"] == "invalid_arguments"
        found = await client.call_tool("search_tools", {"query": "github", "limit": 1})
        assert not found.is_error and found.structured_content is not None
        assert len(found.structured_content["tools"]) == 1
    rows = [r for r in served.audit_rows() if r["tool_name"] == "search_tools"]
    assert [(r["success"], r["error_code"], r["transport"]) for r in rows] == [
        (0, "invalid_arguments", "mcp"),
        (1, None, "mcp"),
    ]


@pytest.mark.parametrize("variant", ["stdio-auto", "http-auto"])
async def test_search_tools_takes_a_whole_float_limit(variant: str, tmp_path: Path) -> None:
    # 2.0 is an integer for JSON Schema: it passed the check, then raised a TypeError inside
    # the search, and the request was never answered.
    async with serving(variant, tmp_path) as served:
        found = await asyncio.wait_for(
            served.client.call_tool("search_tools", {"query": "seconds", "limit": 1.0}), 10
        )
        assert not found.is_error and found.structured_content is not None, text_of(found)
        assert len(found.structured_content["tools"]) == 1  # of the two, block and hold


async def test_a_failing_search_is_an_error_result_not_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving("http-auto", tmp_path) as served:
        assert served.host is not None

        def broken(*args: Any, **kwargs: Any) -> list[Any]:
            raise RuntimeError("the index is gone")

        monkeypatch.setattr(served.host.toolkit, "search", broken)
        failed = await asyncio.wait_for(
            served.client.call_tool("search_tools", {"query": "github"}), 10
        )
        assert failed.is_error and "RuntimeError: the index is gone" in text_of(failed)
        assert (failed.meta or {})["io.toolmesh/errorCode"] == "tool_error"
        assert "search_tools failed" in caplog.text
    rows = [r for r in served.audit_rows() if r["tool_name"] == "search_tools"]
    assert [(r["success"], r["error_code"]) for r in rows] == [(0, "tool_error")]


@pytest.mark.parametrize("variant", ["http-auto", "http-legacy"])  # stdio: the next test
async def test_client_cancellation_cancels_the_tool(variant: str, tmp_path: Path) -> None:
    async with serving(variant, tmp_path) as served:
        cancelled = SIGNALS["cancelled"] = asyncio.Event()
        with pytest.raises(MCPError):
            await served.client.call_tool("linger", {}, read_timeout_seconds=0.3)
        await asyncio.wait_for(cancelled.wait(), 10)


async def test_stdio_cancellation_is_audited(tmp_path: Path) -> None:
    audit = tmp_path / "audit.db"
    command = ["-m", "toolmesh", "serve", "--mcp-stdio", "--audit", str(audit)]
    command += ["--tools", "tests.fixtures.demo_tools:TOOLS"]
    params = StdioServerParameters(command=sys.executable, args=command, cwd=REPO)
    async with Client(params) as client:
        with pytest.raises(MCPError):
            await client.call_tool("hold", {"seconds": 60}, read_timeout_seconds=0.3)
    # The server drains running calls at end of input: it only exited (and wrote this entry)
    # because the client's cancellation had stopped `hold` already.
    served = Served(client, audit, "stdio")
    rows = [r for r in served.audit_rows() if r["tool_name"] == "hold"]
    assert [r["error_code"] for r in rows] == ["cancelled"]


async def test_http_endpoint_checks_origin_token_and_sessions(tmp_path: Path) -> None:
    host = Host(*TOOLS, audit=tmp_path / "a.db")
    server = HttpServer(
        host, "127.0.0.1:0", auth_token="s3cret", extra_routes=mcp_routes(host, auth_token="s3cret")
    )
    url = await server.start()
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.post("/mcp", json=body)).status_code == 401
            auth = {"Authorization": "Bearer s3cret"}
            evil = await http.post(
                "/mcp", json=body, headers={**auth, "Origin": "https://evil.example"}
            )
            assert evil.status_code == 403
            no_session = await http.post("/mcp", json=body, headers=auth)
            assert no_session.status_code == 400
            unknown = await http.post("/mcp", json=body, headers={**auth, "Mcp-Session-Id": "x"})
            assert unknown.status_code == 404
            garbage = await http.post("/mcp", content=b"{not json", headers=auth)
            assert garbage.status_code == 400 and garbage.json()["error"]["code"] == -32700
            modern = {**auth, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}
            mismatch = await http.post(
                "/mcp", json={**body, "method": "tools/list"}, headers=modern
            )
            assert mismatch.status_code == 400  # no _meta envelope: the SDK's classifier refuses
    finally:
        await server.stop()
        await host.close()


async def raw_mcp_stdio(tmp_path: Path, *extra: str) -> asyncio.subprocess.Process:
    """`toolmesh serve --mcp-stdio` of the demo tools, for tests that speak JSON-RPC lines."""
    command = ["-m", "toolmesh", "serve", "--mcp-stdio", "--audit", str(tmp_path / "a.db")]
    command += ["--tools", "tests.fixtures.demo_tools:TOOLS", *extra]
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *command,
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )


DEEP = b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"a": ' + b"[" * 5000
DEEP += b"]" * 5000 + b"}}"
NOT_STRICT_JSON = [
    DEEP,  # json.loads would raise RecursionError, which is not a ValueError
    b'{"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": {"protocolVersion": '
    b'"2025-11-25", "capabilities": {}, "clientInfo": {"name": "a\\ud800", "version": "1"}}}',
    b'{"jsonrpc": "2.0", "id": 9, "method": "ping", "params": {"x": NaN}}',
]


async def test_stdio_refuses_what_is_not_strict_json_and_goes_on(tmp_path: Path) -> None:
    process = await raw_mcp_stdio(tmp_path)
    assert process.stdin is not None and process.stdout is not None
    try:
        for line in NOT_STRICT_JSON:
            process.stdin.write(line + b"\n")
            answer = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
            assert answer["error"]["code"] == -32700, answer
        process.stdin.write(b'{"jsonrpc": "2.0", "id": 10, "method": "ping"}\n')
        answer = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
        assert answer == {"jsonrpc": "2.0", "id": 10, "result": {}}
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0


async def test_http_refuses_what_is_not_strict_json(tmp_path: Path) -> None:
    host = Host(*TOOLS, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            for body in NOT_STRICT_JSON:
                answer = await http.post("/mcp", content=body)
                assert answer.status_code == 400 and answer.json()["error"]["code"] == -32700
    finally:
        await server.stop()
        await host.close()


CLIENT = {"name": "raw", "version": "1"}


async def test_a_session_runs_at_most_max_parallel_calls(tmp_path: Path) -> None:
    process = await raw_mcp_stdio(tmp_path, "--max-parallel", "2")
    assert process.stdin is not None and process.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    try:
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}}
        send({"id": 0, "method": "initialize", "params": {**hello, "clientInfo": CLIENT}})
        assert json.loads(await asyncio.wait_for(process.stdout.readline(), 30))["id"] == 0
        send({"method": "notifications/initialized"})
        for n in (1, 2, 3):
            hold = {"name": "hold", "arguments": {"seconds": 60}}
            send({"id": n, "method": "tools/call", "params": hold})
        answer = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
        assert answer["id"] == 3 and answer["error"]["code"] == -32000
        assert "2 calls at once" in answer["error"]["message"]
        # Cancelled calls free their slots at once: a call right after them (in the same
        # read) is admitted, though their tools have not stopped yet.
        echo = {"name": "echo", "arguments": {"text": "next"}}
        batch = [
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}},
            {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": echo},
        ]
        process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in batch))
        answer = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
        assert answer["id"] == 4 and "error" not in answer, answer
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0
    db = sqlite3.connect(tmp_path / "a.db")
    rows = db.execute("SELECT tool_name, error_code FROM audit").fetchall()
    db.close()
    # the refused one never ran
    assert sorted(rows, key=str) == [("echo", None), ("hold", "cancelled"), ("hold", "cancelled")]


async def test_http_names_an_unsupported_or_incomplete_protocol_version(tmp_path: Path) -> None:
    host = Host(*TOOLS, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            old = await http.post(
                "/mcp", json=listing, headers={"MCP-Protocol-Version": "1999-01-01"}
            )
            assert old.status_code == 400 and old.json()["error"]["code"] == -32022
            assert "'1999-01-01'" in old.json()["error"]["message"]
            modern = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "initialize"}
            hello = {"protocolVersion": "2026-07-28", "capabilities": {}, "clientInfo": CLIENT}
            init = {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": hello}
            refused = await http.post("/mcp", json=init, headers=modern)
            assert refused.json()["error"]["code"] == -32022  # no handshake in 2026-07-28
            assert "initialize is not accepted" in refused.json()["error"]["message"]
    finally:
        await server.stop()
        await host.close()


async def test_idle_http_sessions_are_closed_on_a_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolmesh.mcp.http as mcp_http

    monkeypatch.setattr(mcp_http, "IDLE_SESSION_SECONDS", -1.0)  # idle at once
    monkeypatch.setattr(mcp_http, "REAP_EVERY_SECONDS", 0.0)
    host = Host(*TOOLS, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            session = await open_2025_session(http)
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            later = await http.post("/mcp", json=ping, headers=session)
            assert later.status_code == 404  # closed by the timer: no new session was opened
    finally:
        await server.stop()
        await host.close()


@pytest.mark.parametrize("ending", ["delete", "stop"])
async def test_ending_a_session_answers_its_running_calls(tmp_path: Path, ending: str) -> None:
    """A DELETE of the session, or the server stopping, with a call running: the call is
    cancelled and its POST answered as such (it was a 500 with a traceback, or a wait for the
    server's shutdown timeout)."""
    waiting = Waiting()
    host = Host(waiting.tool, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            session = await open_2025_session(http)
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
            call["params"] = {"name": "wait_forever", "arguments": {}}
            running = asyncio.ensure_future(http.post("/mcp", json=call, headers=session))
            await waiting.until_started()
            if ending == "delete":
                deleted = await http.delete("/mcp", headers=session)
                assert deleted.status_code == 200
            else:
                await server.stop()
            answer = await asyncio.wait_for(running, 30)
    finally:
        await server.stop()
        await host.close()
    assert answer.status_code == 200
    result = answer.json()["result"]
    assert result["isError"] is True
    assert result["_meta"]["io.toolmesh/errorCode"] == "cancelled"
    assert "shutting down" in result["content"][0]["text"]
    db = sqlite3.connect(tmp_path / "a.db")
    rows = db.execute("SELECT tool_name, error_code FROM audit").fetchall()
    db.close()
    assert rows == [("wait_forever", "cancelled")]


async def test_a_stateless_call_is_answered_as_the_server_stops(tmp_path: Path) -> None:
    """A 2026-07-28 request has no session to DELETE; stopping the server answers it too."""
    from mcp import Client

    waiting = Waiting()
    host = Host(waiting.tool, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with Client(f"{url}/mcp", mode="auto") as client:
            assert client.protocol_version == "2026-07-28"
            running = asyncio.ensure_future(client.call_tool("wait_forever", {}))
            await waiting.until_started()
            await server.stop()
            result = await asyncio.wait_for(running, 30)
    finally:
        await server.stop()
        await host.close()
    assert result.is_error
    assert "shutting down" in result.content[0].text  # type: ignore[union-attr]


async def test_stdio_answers_its_running_calls_when_terminated(tmp_path: Path) -> None:
    process = await raw_mcp_stdio(tmp_path)
    assert process.stdin is not None and process.stdout is not None
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": CLIENT}
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hold"}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},  # answered once the call is running
    ]
    lines[2]["params"]["arguments"] = {"seconds": 60}
    process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    try:
        answers = [json.loads(await asyncio.wait_for(process.stdout.readline(), 30))]
        answers.append(json.loads(await asyncio.wait_for(process.stdout.readline(), 30)))
        assert [a["id"] for a in answers] == [0, 2]
        process.terminate()
        last = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
    finally:
        await asyncio.wait_for(process.wait(), 30)
    assert last["id"] == 1 and last["result"]["isError"] is True
    assert last["result"]["_meta"]["io.toolmesh/errorCode"] == "cancelled"


async def test_stdio_answers_a_2025_03_26_batch_in_one_line(tmp_path: Path) -> None:
    process = await raw_mcp_stdio(tmp_path)
    assert process.stdin is not None and process.stdout is not None
    hello = {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": CLIENT}
    echo = {"name": "echo", "arguments": {"text": "in a batch"}}
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello},
        [
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": echo},
        ],
    ]
    process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    try:
        opened = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
        assert opened["result"]["protocolVersion"] == "2025-03-26"
        answers = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)
    assert isinstance(answers, list)
    by_id = {a["id"]: a for a in answers}
    assert by_id[1]["result"] == {}
    assert by_id[2]["result"]["content"][0]["text"] == "in a batch"


class Point(TypedDict):
    x: int
    y: int


@tool
def point() -> Point:
    """A point, as listed."""
    return {"x": 1, "y": 2}


@tool
def half_point() -> Point:
    """A point without its y: not what its outputSchema lists."""
    return {"x": 1}  # type: ignore[typeddict-item]


@tool
def ratio(a: float, b: float) -> dict[str, float]:
    """a/b; NaN when b is 0, which the wire carries as null."""
    return {"ratio": a / b if b else float("nan")}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_structured_results_conform_to_the_listed_output_schema(
    mode: str, tmp_path: Path
) -> None:
    """A result the tool's own outputSchema refuses is an isError result naming where, not
    structuredContent the SDK's client raises on ("Invalid structured content")."""
    host = Host(point, half_point, ratio, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with Client(f"{url}/mcp", mode=mode) as client:
            good = await client.call_tool("point", {})
            half = await client.call_tool("half_point", {})
            nan = await client.call_tool("ratio", {"a": 1, "b": 0})
    finally:
        await server.stop()
        await host.close()
    assert not good.is_error and good.structured_content == {"x": 1, "y": 2}
    assert half.is_error and "outputSchema refuses (at $.y: missing" in text_of(half)
    assert nan.is_error and "at $.ratio: must be number" in text_of(nan)
