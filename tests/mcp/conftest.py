"""Shared pieces of the MCP tests: real servers, their configurations, child-process counting."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolmesh.mcp.config import MCPServerConfig, parse_mcp_server

REPO = Path(__file__).resolve().parents[2]
SERVERS = Path(__file__).resolve().parent / "servers"
NODE_MODULES = REPO / "node_modules"
EVERYTHING = NODE_MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
NODE = shutil.which("node") or "node"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN_HELLO = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"},
}


async def open_2025_session(http: httpx.AsyncClient) -> dict[str, str]:
    """The request headers of a new 2025-11-25 session, opened over ``http``'s /mcp."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": MODERN_HELLO}
    opened = await http.post("/mcp", json=init, headers=MCP_HEADERS)
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    return {**MCP_HEADERS, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"}


def fixture_server(kind: str = "tools", **settings: Any) -> MCPServerConfig:
    """The SDK-built fixture server (tests/mcp/servers/sdk_server.py) of ``kind``."""
    name = settings.pop("name", "fx")
    table = {"command": sys.executable, "args": [str(SERVERS / "sdk_server.py"), kind], **settings}
    return parse_mcp_server(name, table)


def raw_server(kind: str, **settings: Any) -> MCPServerConfig:
    """The hand-written misbehaving server (tests/mcp/servers/raw_server.py) of ``kind``."""
    name = settings.pop("name", "raw")
    table = {"command": sys.executable, "args": [str(SERVERS / "raw_server.py"), kind], **settings}
    return parse_mcp_server(name, table)


def time_server(name: str = "time", **settings: Any) -> MCPServerConfig:
    """mcp-server-time, the PyPI package, over stdio."""
    table = {
        "command": sys.executable,
        "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        **settings,
    }
    return parse_mcp_server(name, table)


def everything_stdio(name: str = "every", **settings: Any) -> MCPServerConfig:
    """@modelcontextprotocol/server-everything (npm) under node, over stdio."""
    return parse_mcp_server(name, {"command": NODE, "args": [str(EVERYTHING), "stdio"], **settings})


def live_children() -> set[int]:
    """PIDs of this process's children that have not exited (zombies excluded)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


@pytest.fixture(scope="module")
def everything_http() -> Iterator[str]:
    """The everything server over streamable HTTP on 127.0.0.1; yields its /mcp URL."""
    process = subprocess.Popen(
        [NODE, str(SERVERS / "everything_http.mjs")],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # {"port": N} once it listens
    try:
        port = json.loads(line)["port"]
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if process.stdin is not None:
            process.stdin.close()  # it exits at end of input
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
