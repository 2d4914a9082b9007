"""Switching built-ins on and off, their settings, capabilities, and toolmesh.toml entries."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
from pathlib import Path

import pytest

from tests.fixtures.gate import PYTHON_GATE, PidGate, gone
from tests.sources.builtins.conftest import Make
from toolmesh import ConfigError, Session, ToolErrorCode, create_toolkit
from toolmesh.capabilities import CapabilitySet
from toolmesh.sources.builtins import BUILTIN_NAMES, builtin_source, sources_from_manifest
from toolmesh.sources.builtins.shell import sources_from_manifest as bash_from_manifest

CAPABILITIES = {
    "read_file": ["fs::read"],
    "write_file": ["fs::write"],
    "edit_file": ["fs::write"],
    "list_files": ["fs::read"],
    "glob": ["fs::read"],
    "grep": ["fs::read"],
    "apply_patch": ["fs::write"],
    "shell": ["shell::exec"],
    "http_request": ["net::http"],
    "python": ["code::python"],
}


async def test_all_ten_with_their_capabilities(make_kit: Make) -> None:
    kit = await make_kit()
    assert kit.names() == list(BUILTIN_NAMES)
    assert {t.name: t.capabilities for t in kit.tools} == CAPABILITIES
    assert all(t.definition.kind == "builtin" for t in kit.tools)


async def test_switching_single_tools(make_kit: Make) -> None:
    kit = await make_kit({"shell": {"allow": ["git", "ls"]}, "http_request": False})
    assert "http_request" not in kit and "shell" in kit and "read_file" in kit
    assert "git, ls" in kit["shell"].description
    only = await make_kit({"default": False, "read_file": True, "grep": {"max_results": 5}})
    assert only.names() == ["read_file", "grep"]


async def test_capabilities_are_enforced_and_configurable(make_kit: Make, workspace: Path) -> None:
    kit = await make_kit({"read_file": {"capabilities": ["files"]}})
    assert kit["read_file"].capabilities == ["files"]
    reader = Session(capabilities=CapabilitySet(["fs::read", "files"]))
    (workspace / "a.txt").write_text("a")
    assert (await kit.execute("read_file", {"path": "a.txt"}, session=reader)).success
    denied = await kit.execute("write_file", {"path": "b", "content": ""}, session=reader)
    assert denied.error_code == ToolErrorCode.TOOL_DENIED and "fs::write" in denied.error


@pytest.mark.parametrize(
    ("builtins", "message"),
    [
        ({"shel": True}, "unknown built-in 'shel'"),
        ({"shell": {"alow": ["ls"]}}, "unknown setting 'alow'"),
        ({"shell": {"timeout": "soon"}}, "shell.timeout"),
        ({"shell": {"timeout": -1}}, "must be positive"),
        ({"shell": {"allow": "ls"}}, "shell.allow"),
        ({"shell": {"operators": ["&"]}}, "unknown shell operators"),
        ({"http_request": {"allow": ["ftp://x"]}}, "must be an http(s) URL"),
        ({"http_request": {"html": "pdf"}}, "html"),
        ({"python": 3}, "expected true, false or a table"),
        ({"read_file": {"max_lines": True}}, "not a boolean"),
    ],
)
async def test_bad_settings_are_config_errors(
    workspace: Path, builtins: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        builtin_source(builtins, workspace=workspace)


async def test_default_workspace_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with await create_toolkit(builtins=True) as kit:
        assert (tmp_path / "workspace").is_dir()
        written = await kit.execute("write_file", {"path": "x.txt", "content": "x"})
        assert written.success and (tmp_path / "workspace" / "x.txt").exists()


async def test_workspace_needs_builtins(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="enable builtins"):
        await create_toolkit(workspace=tmp_path)


def test_the_builtins_table_of_a_manifest(tmp_path: Path) -> None:
    table = {"workspace": "ws", "shell": {"allow": ["ls"]}, "python": False, "roots": ["docs"]}
    (tmp_path / "docs").mkdir()
    (source,) = sources_from_manifest(table, base_dir=tmp_path)
    assert [t.name for t in source.tools()] == [n for n in BUILTIN_NAMES if n != "python"]
    assert source.roots.paths == (str(tmp_path / "ws"), str(tmp_path / "docs"))
    assert sources_from_manifest({"enabled": False}, base_dir=tmp_path) == []
    with pytest.raises(ConfigError, match=r"^builtins.shell: unknown setting"):
        sources_from_manifest({"shell": {"nope": 1}}, base_dir=tmp_path)


async def test_the_bash_kind_of_a_manifest(tmp_path: Path) -> None:
    entry = {"kind": "bash", "name": "sh", "allow": ["s*"], "config": {"allow": ["echo"]}}
    (source,) = bash_from_manifest(entry, base_dir=tmp_path)
    (tool,) = source.tools()
    assert tool.name == "sh" and (tmp_path / "workspace").is_dir()
    async with await create_toolkit(tools=[source]) as kit:
        ok = await kit.execute("sh", {"command": "echo hi"})
        assert ok.data["stdout"] == "hi\n"
        refused = await kit.execute("sh", {"command": "ls"})
        assert refused.error_code == ToolErrorCode.TOOL_DENIED


async def test_a_bash_entry_of_a_toolmesh_toml_keeps_its_allow_list(tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[[tools]]\nkind = "bash"\nallow = ["b*"]\nconfig = { allow = ["id", "echo"] }\n'
    )
    async with await create_toolkit(config=manifest) as kit:
        assert [t.name for t in kit.tools] == ["bash"]
        ran = await kit.execute("bash", {"command": "id -u"})
        assert ran.success, ran.error  # `id` is on the entry's allow-list (not the default)
        refused = await kit.execute("bash", {"command": "ls"})
        assert refused.error_code == ToolErrorCode.TOOL_DENIED


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"workspace": 5}, r"builtins.workspace: expected a folder path, not 5"),
        ({"roots": "docs"}, r"builtins.roots: expected a list of folder paths"),
    ],
)
def test_workspace_and_roots_of_the_wrong_type_are_named(
    table: dict[str, object], says: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=says):
        sources_from_manifest(table, base_dir=tmp_path)


async def test_closing_the_toolkit_ends_a_running_shell_command(workspace: Path) -> None:
    async with PidGate() as gate:
        shell = {"allow": "*", "set_env": {"GATE_PORT": str(gate.port)}, "timeout": 600}
        kit = await create_toolkit(builtins={"default": False, "shell": shell}, workspace=workspace)
        script = PYTHON_GATE + "import time; time.sleep(600)\n"
        call = asyncio.ensure_future(
            kit.execute("shell", {"command": f"{sys.executable} -c {shlex.quote(script)}"})
        )
        pid = await gate.arrival(call)
        await kit.close()
        try:
            assert gone(pid)
        finally:
            call.cancel()  # the command is killed when its call ends
            with contextlib.suppress(asyncio.CancelledError):
                await call
