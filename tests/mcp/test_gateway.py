"""toolmesh as an MCP gateway: several upstream MCP servers behind one MCP endpoint, with
collision-free names, one policy, one audit log and search over every tool."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import REPO
from tests.mcp.conftest import SERVERS, live_children
from toolmesh.mcp.gateway import gateway_configs, gateway_host

pytestmark = [pytest.mark.network_server, pytest.mark.slow]


def upstreams(tmp_path: Path) -> Path:
    config = {
        "mcpServers": {
            "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
            "fx": {
                "command": sys.executable,
                "args": [str(SERVERS / "sdk_server.py"), "tools"],
                "defer_loading": True,
                "capabilities": ["fx"],
            },
            "gone": {"command": "/nonexistent/server"},
        }
    }
    path = tmp_path / "servers.json"
    path.write_text(json.dumps(config))
    return path


async def test_one_endpoint_for_many_servers(tmp_path: Path) -> None:
    audit = tmp_path / "audit.db"
    command = ["-m", "toolmesh", "serve", "--mcp-stdio", "--audit", str(audit)]
    command += ["--mcp-config", str(upstreams(tmp_path)), "--capability", "fx"]
    params = StdioServerParameters(command=sys.executable, args=command, cwd=REPO)
    async with Client(params) as client:
        listed = {t.name for t in (await client.list_tools(cache_mode="bypass")).tools}
        assert listed == {"time_get_current_time", "time_convert_time", "search_tools"}

        now = await client.call_tool("time_get_current_time", {"timezone": "Europe/Oslo"})
        assert now.structured_content is not None
        assert now.structured_content["timezone"] == "Europe/Oslo"

        found = await client.call_tool("search_tools", {"query": "echo the text"})
        assert found.structured_content is not None
        assert found.structured_content["tools"][0]["name"] == "fx_echo"
        echoed = await client.call_tool("fx_echo", {"text": "through the gateway"})
        assert echoed.content[0].text == "through the gateway"  # type: ignore[union-attr]

        denied = await client.call_tool("time_convert_time", {})
        assert denied.is_error  # policy and validation apply before the upstream is reached

    db = sqlite3.connect(audit)
    rows = db.execute("SELECT tool_name, source, transport, success FROM audit").fetchall()
    db.close()
    assert ("time_get_current_time", "mcp", "mcp", 1) in rows
    assert ("fx_echo", "mcp", "mcp", 1) in rows


async def test_gateway_host_defers_big_catalogues(tmp_path: Path) -> None:
    before = live_children()
    host = gateway_host(upstreams(tmp_path), defer_over=1, capabilities=["fx"])
    async with host:
        toolkit = host.toolkit
        assert toolkit.name == "toolmesh-gateway"
        states = {s.name: s.status.state for s in toolkit.sources}
        assert states == {"time": "connected", "fx": "connected", "gone": "failed"}
        assert toolkit.definitions() == []  # both catalogues exceed one tool: all deferred
        ranked = [t.name for t in toolkit.search("current time in a timezone")]
        assert ranked[0] == "time_get_current_time"
    assert live_children() == before
    configs = gateway_configs(upstreams(tmp_path), defer_over=10)
    assert [c.defer_loading for c in configs] == [10, True, 10]


async def test_a_client_cancelling_a_call_cancels_it_upstream(tmp_path: Path) -> None:
    # The upstream call runs in the task of the gateway's call: notifications/cancelled from the
    # client cancels that task, the upstream request with it, and the call is audited cancelled.
    config = {
        "mcpServers": {
            "fx": {"command": sys.executable, "args": [str(SERVERS / "sdk_server.py"), "tools"]}
        }
    }
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps(config))
    audit = tmp_path / "audit.db"
    command = ["-m", "toolmesh", "serve", "--mcp-stdio", "--audit", str(audit)]
    params = StdioServerParameters(
        command=sys.executable, args=[*command, "--mcp-config", str(servers)], cwd=REPO
    )
    async with Client(params) as client:
        running = asyncio.Event()

        async def relayed(progress: float, total: float | None, message: str | None) -> None:
            running.set()  # relayed from the upstream: the call is running there

        call = asyncio.ensure_future(
            client.call_tool("fx_hold", {"seconds": 30}, progress_callback=relayed)
        )
        await running.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        seen = await client.call_tool("fx_cancelled_calls", {})
        assert seen.structured_content == {"result": 1}  # the upstream's own call was cancelled

    db = sqlite3.connect(audit)
    rows = db.execute("SELECT tool_name, error_code FROM audit").fetchall()
    db.close()
    assert ("fx_hold", "cancelled") in rows
