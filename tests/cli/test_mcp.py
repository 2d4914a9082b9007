"""``toolmesh mcp status`` and the MCP options of ``toolmesh serve``, run as users run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, toolmesh_command


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        toolmesh_command(*args), capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


def config_file(tmp_path: Path, servers: dict[str, object]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@pytest.mark.network_server
def test_status_reports_every_server(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        {
            "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
            "broken": {"command": "/nonexistent/server"},
            "off": {"command": "whatever", "disabled": True},
        },
    )
    shown = run("mcp", "status", str(path))
    assert shown.returncode == 1  # one failed
    lines = {line.split()[0]: line for line in shown.stdout.splitlines()}
    assert "connected" in lines["time"] and "2 tools" in lines["time"]
    assert "failed" in lines["broken"] and "cannot start" in lines["broken"]
    assert "disabled" in lines["off"]

    as_json = run("mcp", "status", "--json", str(path))
    report = {row["name"]: row for row in json.loads(as_json.stdout)}
    assert report["time"]["state"] == "connected" and report["time"]["tools"] == 2


@pytest.mark.network_server
def test_status_counts_the_tools_served_after_allow_and_deny(tmp_path: Path) -> None:
    """It counted every tool the server listed, also those its allow or deny leave out."""
    server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    path = config_file(
        tmp_path,
        {"allowed": {**server, "allow": ["get_*"]}, "denied": {**server, "deny": ["*"]}},
    )
    shown = run("mcp", "status", str(path))
    lines = {line.split()[0]: line for line in shown.stdout.splitlines()}
    assert "1 tool (of 2)" in lines["allowed"] and "0 tools (of 2)" in lines["denied"]
    report = {
        row["name"]: row for row in json.loads(run("mcp", "status", "--json", str(path)).stdout)
    }
    assert (report["allowed"]["tools"], report["allowed"]["listed"]) == (1, 2)
    assert (report["denied"]["tools"], report["denied"]["listed"]) == (0, 2)


def test_status_needs_a_configuration(tmp_path: Path) -> None:
    shown = run("mcp", "status", cwd=tmp_path)
    assert shown.returncode == 2
    assert "no MCP configuration" in shown.stderr
    bad = config_file(tmp_path, {"x": {"url": "ftp://nowhere"}})
    refused = run("mcp", "status", str(bad))
    assert refused.returncode == 2 and "http:// or https://" in refused.stderr


def test_serve_mcp_needs_http() -> None:
    shown = run("serve", "--mcp", "--tools", "tests.fixtures.demo_tools:TOOLS")
    assert shown.returncode == 2 and "--http" in shown.stderr


@pytest.mark.network_server
async def test_serve_http_with_mcp_answers_mcp_clients(tmp_path: Path) -> None:
    from mcp import Client

    command = toolmesh_command(
        "serve", "--http", "127.0.0.1:0", "--mcp", "--audit", str(tmp_path / "a.db")
    )
    command += ["--tools", "tests.fixtures.demo_tools:TOOLS"]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()  # the first line is the URL
        async with Client(f"{url}/mcp") as client:
            result = await client.call_tool("echo", {"text": "over /mcp"})
            assert result.content[0].text == "over /mcp"  # type: ignore[union-attr]
    finally:
        process.terminate()
        process.wait(timeout=10)
