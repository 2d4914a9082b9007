"""toolmesh's MCP server against the MCP TypeScript SDK's client (node), over stdio and HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.fixtures.demo_tools import TOOLS
from tests.mcp.conftest import NODE
from toolmesh import Host
from toolmesh.mcp.http import mcp_routes
from toolmesh.transports.http import HttpServer

pytestmark = [pytest.mark.network_server, pytest.mark.slow]

CLIENT = Path(__file__).resolve().parent / "clients" / "ts_client.mjs"


async def run_client(*args: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        NODE,
        str(CLIENT),
        *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return report


def check(report: dict[str, Any]) -> None:
    assert report["server"] == "toolmesh"
    assert {"echo", "add", "count", "search_tools"} <= set(report["tools"])
    assert report["echo"] == "from node"
    assert report["count"] == {"counted": 2}
    assert report["bad"]["isError"] is True
    assert "$.a" in report["bad"]["text"]


async def test_typescript_client_over_stdio(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "toolmesh", "serve", "--mcp-stdio"]
    command += ["--tools", "tests.fixtures.demo_tools:TOOLS", "--audit", str(tmp_path / "a.db")]
    check(await run_client("stdio", *command))


async def test_typescript_client_over_http(tmp_path: Path) -> None:
    host = Host(*TOOLS, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        report = await run_client("http", f"{url}/mcp")
    finally:
        await server.stop()
        await host.close()
    check(report)
    assert report["protocol"] == "2025-11-25"
