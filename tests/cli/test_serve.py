"""``toolmesh serve`` with neither --tools nor --config: the built-in tools in ./workspace."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import run
from tests.conftest import REPO, toolmesh_command
from toolmesh import connect_async
from toolmesh.cli import main
from toolmesh.cli.loading import DEFAULT_AUDIT
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


DEMO = "tests.fixtures.demo_tools:TOOLS"


def _served(
    command: list[str], *, cwd: Path, env: dict[str, str] | None = None, input: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run a ``toolmesh serve`` over stdio to its end: ``input`` is all it reads."""
    return subprocess.run(
        command,
        input=input,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--audit", "{tmp}/afile"], "cannot use {tmp}/afile as a toolmesh database"),
        (["--audit", "{tmp}/nodir/a.db"], "audit database folder {tmp}/nodir does not exist"),
        (["--http", "256.1.1.1:80", "--auth-token", "x"], "'256.1.1.1' is not an IP address"),
        (["--http", "127.0.0.1:99999"], "port from 0 to 65535"),
        (["--http", "127.0.0.1:²"], "port from 0 to 65535"),
        (["--http", "127.0.0.1:{taken}"], "cannot listen on 127.0.0.1:{taken}: address "),
    ],
)
def test_serve_http_startup_failures_are_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("hi\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        given = {"tmp": str(tmp_path), "taken": str(taken.getsockname()[1])}
        argv = ["serve", "--http", "127.0.0.1:0", "--tools", DEMO, "--audit", ":memory:"]
        assert main(argv + [word.format(**given) for word in extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolmesh: error: "), lines
    assert message.format(**given) in lines[0]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-message-bytes", "0", "wants a whole number above 0, not '0'"),
        ("--max-message-bytes", "-1", "wants a whole number above 0, not '-1'"),
        ("--max-parallel", "0", "wants a whole number above 0, not '0'"),
        ("--approval-timeout", "nan", "wants a number of seconds above 0, not 'nan'"),
        ("--mcp-defer-over", "-1", "wants a whole number, 0 or more, not '-1'"),
    ],
)
def test_serve_refuses_numbers_that_would_refuse_everything(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--stdio", "--tools", DEMO, option, value])
    assert exited.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_serve_refuses_a2a_over_mcp_stdio(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "--mcp-stdio", "--a2a", "desk", "--llm", "http://127.0.0.1:9", "--model", "m"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "toolmesh: error: --a2a serves over HTTP and cannot be combined with --mcp-stdio"
    )


def test_serve_audit_wins_over_the_manifest_even_at_the_default(tmp_path: Path) -> None:
    (tmp_path / "toolmesh.toml").write_text('[toolkit]\naudit = "from-manifest.db"\n')
    environment = {k: v for k, v in os.environ.items() if k != "TOOLMESH_AUDIT"}
    for given, written in [([], "from-manifest.db"), (["--audit", DEFAULT_AUDIT], DEFAULT_AUDIT)]:
        served = _served(
            toolmesh_command("serve", "--stdio", "--config", "toolmesh.toml", *given),
            cwd=tmp_path,
            env=environment,
        )
        assert served.returncode == 0, served.stderr
        assert sorted(p.name for p in tmp_path.glob("*.db")) == [written]
        (tmp_path / written).unlink()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--llm", "http://127.0.0.1:9", "--model", "m"], "--llm and --model configure the A2A"),
        (["--llm-style", "anthropic"], "--llm-style configures the A2A agent: give --a2a NAME"),
        (["--a2a-description", "d"], "--a2a-description configures the A2A agent"),
        (["--tools", DEMO, "--workspace", "w"], "--workspace confines the built-in tools"),
        (["--skills", "examples/skills", "--workspace", "w"], "served only without --tools"),
        (["--mcp-defer-over", "3"], "--mcp-defer-over defers the tools of --mcp-config servers"),
        (["--mcp-stdio", "--auth-token", "t"], "--auth-token has no effect with --mcp-stdio"),
    ],
)
def test_serve_refuses_options_it_would_ignore(extra: list[str], says: str) -> None:
    """Refused before anything is served. Over stdio (no input): were one ignored again, the
    server would end at once with 0 rather than serve on."""
    mode = [] if "--mcp-stdio" in extra else ["--stdio"]
    served = _served(toolmesh_command("serve", *mode, *extra, "--audit", ":memory:"), cwd=REPO)
    lines = served.stderr.strip().splitlines()
    assert served.returncode == 2 and len(lines) == 1, served.stderr
    assert lines[0].startswith("toolmesh: error: ") and says in lines[0]


def test_serve_still_reads_the_token_and_workspace_defaults(tmp_path: Path) -> None:
    """Not given, --auth-token is TOOLMESH_AUTH_TOKEN (now read when serving, not parsing) and
    --workspace is ./workspace."""
    command = toolmesh_command("serve", "--stdio", "--audit", ":memory:")
    environment = {**os.environ, "TOOLMESH_AUTH_TOKEN": "s3cret"}
    hello = {"type": "handshake/req", "id": "h", "agent_caps": ["tools"]}
    served = _served(command, cwd=tmp_path, env=environment, input=json.dumps(hello) + "\n")
    assert served.returncode == 0, served.stderr
    answer = json.loads(served.stdout.splitlines()[0])
    assert answer["ok"] is False and answer["reason"] == "auth_token is missing or wrong"
    assert (tmp_path / "workspace").is_dir()


def test_a_name_conflict_is_told_once() -> None:
    """Logged as one line; its warning said it again, with a line of toolmesh's source."""
    served = _served(
        toolmesh_command(
            "serve", "--stdio", "--tools", DEMO, "--tools", DEMO, "--audit", ":memory:"
        ),
        cwd=REPO,
    )
    assert served.returncode == 0, served.stderr
    lines = served.stderr.strip().splitlines()
    assert lines and all("WARNING toolmesh.toolkit: tool name" in line for line in lines), lines
    assert len(lines) == len(set(lines)) and "from source #1 " in lines[0]


# -- a lone --tools Toolkit is served as it is --------------------------------------------------

GOVERNED = "tests.fixtures.governed_kit:governed"


async def test_a_lone_toolkit_is_served_with_its_policy_and_capabilities(tmp_path: Path) -> None:
    """It was flattened into a toolkit of the command's own, its policy and capabilities lost:
    `rm` ran, and the tool needing `admin` was listed and ran."""
    audit = tmp_path / "audit.db"
    command = toolmesh_command("serve", "--stdio", "--tools", GOVERNED, "--audit", str(audit))
    client = await connect_async(command, agent_id="tester")
    try:
        assert [d.name for d in await client.list_tools()] == ["shell"]
        denied = await client.call_tool("shell", {"command": "rm -rf /"})
        assert (denied.error_code, denied.error) == ("tool_denied", "no deleting")
        admin = await client.call_tool("drop_database", {})
        assert admin.error_code == "tool_denied"
        assert (await client.call_tool("shell", {"command": "ls"})).data == "ran ls"
    finally:
        await client.close()
    rows = sqlite3.connect(audit).execute("SELECT tool_name, error_code FROM audit").fetchall()
    assert rows == [("shell", "tool_denied"), ("drop_database", "tool_denied"), ("shell", None)]


def test_call_applies_a_lone_toolkits_policy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["call", "shell", "--args", '{"command": "rm x"}', "--tools", GOVERNED]
    assert main(argv) == 1
    assert "no deleting" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--tools", DEMO], "serve it alone, or add the other sources to it"),
        (["--skills", "examples/skills"], "serve it alone, or add the other sources to it"),
        (["--config", "{tmp}/toolmesh.toml"], "serve it alone, or add the other sources to it"),
    ],
)
def test_a_governed_toolkit_beside_other_sources_is_refused(
    extra: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "toolmesh.toml").write_text('[toolkit]\nname = "desk"\n')
    command = "tools" if "--tools" in extra else "serve"  # `tools` has no --skills
    argv = [command, "--tools", GOVERNED, *(word.format(tmp=tmp_path) for word in extra)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"--tools {GOVERNED} is a Toolkit with its own policy hooks, capabilities" in error
    assert says in error


def test_serve_a2a_refuses_a_governed_toolkit_it_would_not_govern() -> None:
    """`serve --a2a` builds a toolkit of its own (in a process: served, it would not end)."""
    llm = ["--llm", "http://127.0.0.1:9", "--model", "m"]
    served = _served(
        toolmesh_command(
            "serve", "--a2a", "desk", *llm, "--http", "127.0.0.1:0", "--tools", GOVERNED
        ),
        cwd=REPO,
    )
    assert served.returncode == 2
    assert "capabilities, which would not apply here: declare them in a manifest" in served.stderr


def test_a_toolkit_of_no_settings_of_its_own_joins_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tools", "--tools", "tests.fixtures.governed_kit:plain", "--tools", DEMO]) == 0
    assert "drop_database" in capsys.readouterr().out
