"""``toolmesh serve`` with neither --tools nor --config: the built-in tools in ./workspace."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.cli.test_cli import run
from tests.conftest import toolmesh_command
from toolmesh import connect_async
from toolmesh.sources.builtins import BUILTIN_NAMES


def test_the_default_toolkit_is_the_builtins_in_workspace(tmp_path: Path) -> None:
    listed = run("tools", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [d["name"] for d in json.loads(listed.stdout)] == list(BUILTIN_NAMES)
    assert (tmp_path / "workspace").is_dir()


async def test_serving_the_default_toolkit_over_stdio(tmp_path: Path) -> None:
    audit = tmp_path / "audit.db"
    command = toolmesh_command(
        "serve", "--stdio", "--workspace", str(tmp_path / "ws"), "--audit", str(audit)
    )
    client = await connect_async(command, agent_id="tester")
    try:
        written = await client.call_tool("write_file", {"path": "hi.txt", "content": "hello"})
        assert written.success, written
        escaped = await client.call_tool("read_file", {"path": "../audit.db"})
        assert escaped.error_code == "tool_denied"
    finally:
        await client.close()
    assert (tmp_path / "ws" / "hi.txt").read_text() == "hello"
    rows = sqlite3.connect(audit).execute("SELECT tool_name, success FROM audit").fetchall()
    assert rows == [("write_file", 1), ("read_file", 0)]
