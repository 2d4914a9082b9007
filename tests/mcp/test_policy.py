"""Capabilities and approvals over MCP: the same denial as A2E, approvals by elicitation (2025)
and input requests (2026-07-28), and the capability override extension."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import ElicitResult

from tests.conftest import APPROVAL_TIMEOUT, REPO
from tests.fixtures.demo_tools import TOOLS
from tests.mcp.test_server import raw_mcp_stdio
from toolmesh import Host, Limits
from toolmesh.mcp.http import mcp_routes
from toolmesh.transports.http import HttpServer

pytestmark = [pytest.mark.network_server]

VARIANTS = ["stdio-auto", "stdio-legacy", "http-auto", "http-legacy"]
Answer = Callable[[Any, Any], Any]


@contextlib.asynccontextmanager
async def serving(
    variant: str, audit: Path, on_elicit: Answer, policy: str = "locked"
) -> AsyncIterator[Client]:
    transport, mode = variant.split("-")
    if transport == "stdio":
        args = [
            "-m",
            "toolmesh",
            "serve",
            "--mcp-stdio",
            "--audit",
            str(audit),
            "--capability",
            "demo",
            "--capability-policy",
            policy,
        ]
        args += [
            "--tools",
            "tests.fixtures.demo_tools:TOOLS",
            "--approval-timeout",
            str(APPROVAL_TIMEOUT),
        ]
        params = StdioServerParameters(command=sys.executable, args=args, cwd=REPO)
        async with Client(params, mode=mode, elicitation_callback=on_elicit) as client:
            yield client
        return
    host = Host(
        *TOOLS,
        audit=audit,
        capabilities=["demo"],
        capability_policy=policy,  # type: ignore[arg-type]
        limits=Limits(approval_timeout=APPROVAL_TIMEOUT),
    )
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        async with Client(f"{url}/mcp", mode=mode, elicitation_callback=on_elicit) as client:
            yield client
    finally:
        await server.stop()
        await host.close()


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


@pytest.mark.parametrize("variant", VARIANTS)
async def test_the_same_denial_as_a2e(variant: str, tmp_path: Path) -> None:
    async def never(context: Any, params: Any) -> ElicitResult:
        raise AssertionError("no approval is asked for here")

    async with serving(variant, tmp_path / "a.db", never) as client:
        listing = await client.list_tools(cache_mode="bypass")
        assert "secret" not in {t.name for t in listing.tools}
        denied = await client.call_tool("secret", {})
        assert denied.is_error and "requires capability 'secret::read'" in text_of(denied)


@pytest.mark.parametrize("variant", VARIANTS)
async def test_approvals_by_elicitation(variant: str, tmp_path: Path) -> None:
    answers: list[str] = ["approve", "deny", "decline"]
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        answer = answers.pop(0)
        if answer == "decline":
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"approve": answer == "approve"})

    audit = tmp_path / "a.db"
    async with serving(variant, audit, on_elicit) as client:
        ok = await client.call_tool("deploy", {"env": "staging"})
        assert not ok.is_error and text_of(ok) == "deployed to staging"
        assert "'deploy'" in asked[0] and "staging" in asked[0]
        denied = await client.call_tool("deploy", {"env": "prod"})
        assert denied.is_error and "denied" in text_of(denied)
        declined = await client.call_tool("deploy", {"env": "moon"})
        assert declined.is_error
    rows = (
        sqlite3.connect(audit)
        .execute("SELECT decision FROM audit WHERE tool_name = 'deploy'")
        .fetchall()
    )
    assert [r[0] for r in rows] == ["approval:approved", "approval:denied", "approval:denied"]


@pytest.mark.parametrize("variant", ["stdio-legacy", "http-legacy"])
async def test_an_unanswered_elicitation_times_out(variant: str, tmp_path: Path) -> None:
    async def silent(context: Any, params: Any) -> ElicitResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with serving(variant, tmp_path / "a.db", silent) as client:
        result = await client.call_tool("deploy", {"env": "x"})
        assert result.is_error and f"within {APPROVAL_TIMEOUT:g}s" in text_of(result)


async def raw_session(
    url: str, capabilities: dict[str, Any]
) -> tuple[httpx.AsyncClient, dict[str, str], dict[str, Any]]:
    http = httpx.AsyncClient(timeout=30)
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    answer = await http.post(f"{url}/mcp", json=init, headers=headers)
    body = _payload(answer)
    if "result" in body:
        headers = {
            **headers,
            "Mcp-Session-Id": answer.headers["mcp-session-id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
    return http, headers, body


def _payload(answer: httpx.Response) -> dict[str, Any]:
    import json

    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in answer.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(answer.json())


@pytest.mark.parametrize("policy", ["locked", "extensible"])
async def test_capability_override(policy: str, tmp_path: Path) -> None:
    host = Host(*TOOLS, audit=tmp_path / "a.db", capabilities=["demo"], capability_policy=policy)  # type: ignore[arg-type]
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    override = {
        "experimental": {
            "toolmesh/capability_override": {"strategy": "extend", "capabilities": ["secret"]}
        }
    }
    http, headers, answer = await raw_session(url, override)
    try:
        if policy == "locked":
            assert answer["error"]["code"] == -32600 and "locked" in answer["error"]["message"]
            return
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "secret", "arguments": {}},
        }
        result = _payload(await http.post(f"{url}/mcp", json=call, headers=headers))
        assert result["result"]["content"][0]["text"] == "classified"
    finally:
        await http.aclose()
        await server.stop()
        await host.close()


@pytest.mark.parametrize("variant", ["stdio-auto", "http-auto"])
async def test_a_sealed_approval_runs_one_call_only(variant: str, tmp_path: Path) -> None:
    from toolmesh.mcp.approvals import APPROVAL_INPUT

    async def never(context: Any, params: Any) -> ElicitResult:
        raise AssertionError("the test answers the input request itself")

    async with serving(variant, tmp_path / "a.db", never) as client:
        assert client.protocol_version == "2026-07-28"
        asked = await client.session.call_tool("deploy", {"env": "prod"}, allow_input_required=True)
        state = asked.request_state
        approve = {APPROVAL_INPUT: ElicitResult(action="accept", content={"approve": True})}
        ran = await client.call_tool(
            "deploy", {"env": "prod"}, input_responses=approve, request_state=state
        )
        assert not ran.is_error and text_of(ran) == "deployed to prod"
        again = await client.call_tool(  # the same approval sent back: not a second deploy
            "deploy", {"env": "prod"}, input_responses=approve, request_state=state
        )
        assert again.is_error and "used already" in text_of(again)


EXTEND_SECRET = {"toolmesh/capability_override": {"strategy": "extend", "capabilities": ["secret"]}}
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


async def _no_approval(context: Any, params: Any) -> ElicitResult:
    raise AssertionError("no approval is asked for here")


@pytest.mark.parametrize("variant", ["stdio-auto", "http-auto"])
@pytest.mark.parametrize("policy", ["locked", "extensible"])
async def test_a_2026_override_holds_for_its_request_alone(
    variant: str, policy: str, tmp_path: Path
) -> None:
    # Over stdio the override used to be kept for the connection, and only the connection's
    # first request settled its session: one on a later request was ignored (no error from a
    # locked host either).
    async with serving(variant, tmp_path / "a.db", _no_approval, policy) as client:
        assert client.protocol_version == "2026-07-28"
        plain = await client.call_tool("secret", {})
        assert plain.is_error and "requires capability 'secret::read'" in text_of(plain)
        if policy == "locked":
            with pytest.raises(MCPError) as refused:
                await client.call_tool("secret", {}, meta=EXTEND_SECRET)
            assert refused.value.code == -32600 and "locked" in str(refused.value)
            with pytest.raises(MCPError) as refused:
                await client.list_tools(meta=EXTEND_SECRET, cache_mode="bypass")
            assert refused.value.code == -32600 and "locked" in str(refused.value)
        else:
            extended = await client.call_tool("secret", {}, meta=EXTEND_SECRET)
            assert not extended.is_error and text_of(extended) == "classified"
            listing = await client.list_tools(meta=EXTEND_SECRET, cache_mode="bypass")
            assert "secret" in {t.name for t in listing.tools}
        again = await client.call_tool("secret", {})  # the next request holds the host's set
        assert again.is_error and "requires capability 'secret::read'" in text_of(again)
        listing = await client.list_tools(cache_mode="bypass")
        assert "secret" not in {t.name for t in listing.tools}


async def _raw_stdio(tmp_path: Path, policy: str) -> asyncio.subprocess.Process:
    """`toolmesh serve --mcp-stdio` of the demo tools holding `demo`, spoken to in JSON lines."""
    return await raw_mcp_stdio(tmp_path, "--capability", "demo", "--capability-policy", policy)


async def _exchange(
    process: asyncio.subprocess.Process, request_id: int, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None
    request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    process.stdin.write(json.dumps(request).encode() + b"\n")
    answer = dict(json.loads(await asyncio.wait_for(process.stdout.readline(), 30)))
    assert answer["id"] == request_id, answer
    return answer


def _call_secret(meta: dict[str, Any]) -> dict[str, Any]:
    return {"name": "secret", "arguments": {}, "_meta": meta}


@pytest.mark.parametrize("policy", ["locked", "extensible"])
async def test_a_2026_override_on_the_first_request_does_not_stick(
    policy: str, tmp_path: Path
) -> None:
    # The first request settled the connection's session with its override: an extensible
    # host extended every later request, a locked one refused every later request.
    process = await _raw_stdio(tmp_path, policy)
    try:
        first = await _exchange(
            process, 1, "tools/call", _call_secret({**ENVELOPE, **EXTEND_SECRET})
        )
        if policy == "locked":
            assert first["error"]["code"] == -32600 and "locked" in first["error"]["message"]
        else:
            assert first["result"]["content"][0]["text"] == "classified"
        plain = await _exchange(process, 2, "tools/call", _call_secret(ENVELOPE))
        assert plain["result"]["isError"] is True
        assert "requires capability 'secret::read'" in plain["result"]["content"][0]["text"]
        listing = await _exchange(process, 3, "tools/list", {"_meta": ENVELOPE})
        assert "secret" not in {t["name"] for t in listing["result"]["tools"]}
    finally:
        assert process.stdin is not None
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0


@pytest.mark.parametrize("policy", ["locked", "extensible"])
async def test_a_2025_override_holds_for_the_connection(policy: str, tmp_path: Path) -> None:
    # The initialize-time override is the connection's; a refused one is not kept for the
    # client's next initialize.
    process = await _raw_stdio(tmp_path, policy)
    hello = {"protocolVersion": "2025-11-25", "clientInfo": {"name": "raw", "version": "1"}}
    asking = {**hello, "capabilities": {"experimental": EXTEND_SECRET}}
    try:
        opened = await _exchange(process, 1, "initialize", asking)
        if policy == "locked":
            assert opened["error"]["code"] == -32600 and "locked" in opened["error"]["message"]
            retried = await _exchange(process, 2, "initialize", {**hello, "capabilities": {}})
            assert retried["result"]["protocolVersion"] == "2025-11-25"
        expected = "classified" if policy == "extensible" else "requires capability 'secret::read'"
        for request_id in (3, 4):
            called = await _exchange(process, request_id, "tools/call", _call_secret({}))
            assert expected in called["result"]["content"][0]["text"]
    finally:
        assert process.stdin is not None
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0
