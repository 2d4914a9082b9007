"""The toolmesh command, run as users run it."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, serve_stdio_command, toolmesh_command


def run(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        toolmesh_command(*args),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def stdio_target(audit: Path) -> str:
    return " ".join(serve_stdio_command(audit))


COMMANDS = ["serve", "tools", "call", "audit", "skills", "agents", "mcp"]


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS), ["-v", "call"]])
def test_help_everywhere(command: list[str]) -> None:
    shown = run(*command, "--help")
    assert shown.returncode == 0 and "usage: toolmesh" in shown.stdout
    if command:
        assert shown.stdout.startswith(f"usage: toolmesh {command[-1]} ")


def test_the_top_help_lists_every_command() -> None:
    listed = run("--help").stdout.split("positional arguments:")[1].split("options:")[0]
    assert [line.split()[0] for line in listed.splitlines()[2:] if line.strip()] == COMMANDS


def test_a_command_loads_only_its_own_module() -> None:
    """`toolmesh serve` builds its own parser alone: the other commands' modules stay off a
    server's start-up."""
    code = (
        "import sys\n"
        "from toolmesh.cli import main\n"
        "try:\n"
        "    main(['-v', 'serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "others = ('audit', 'inspect', 'mcp', 'skills')\n"
        "print([m for m in others if 'toolmesh.cli.' + m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--http"], "toolmesh serve: error: argument --http: expected one argument"),
        (["audit", "postgresql://u@127.0.0.1:1/db"], "toolmesh: error: unrecognized arguments"),
        (["bogus"], "toolmesh: error: argument COMMAND: invalid choice: 'bogus'"),
    ],
)
def test_a_usage_error_is_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse printed the usage, then the error: two lines, where every other error is one."""
    from toolmesh.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(says) and lines[0].endswith("--help)")


def test_tools_list_and_search_over_stdio(tmp_path: Path) -> None:
    target = stdio_target(tmp_path / "a.db")
    listed = run("tools", "--target", target)
    assert listed.returncode == 0, listed.stderr
    assert "echo" in listed.stdout and "github_search" not in listed.stdout
    found = run("tools", "--target", target, "--search", "github repositories")
    assert found.stdout.splitlines()[0].startswith("github_search")
    assert "(deferred)" in found.stdout


def test_tools_in_process_as_json() -> None:
    shown = run("tools", "--tools", "tests.fixtures.demo_tools:TOOLS", "--json")
    assert shown.returncode == 0, shown.stderr
    names = [d["name"] for d in json.loads(shown.stdout)]
    assert "read_file" in names


def test_call_streams_and_prints_the_result(tmp_path: Path) -> None:
    called = run(
        "call",
        "count",
        "--args",
        '{"n": 4}',
        "--stream",
        "--target",
        stdio_target(tmp_path / "a.db"),
    )
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["data"] == {"counted": 4}
    assert "100%" in called.stderr and "[####" in called.stderr


def test_call_failure_exits_1(tmp_path: Path) -> None:
    failed = run("call", "boom", "--tools", "tests.fixtures.demo_tools:TOOLS")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["error"] == "ValueError: kaboom"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["call", "echo", "--args", "{not json", "--tools", "tests.fixtures.demo_tools:TOOLS"],
            "--args is not valid JSON",
        ),
        (
            ["call", "echo", "--args", "[1]", "--tools", "tests.fixtures.demo_tools:TOOLS"],
            "must be a JSON object",
        ),
        (["serve", "--stdio", "--workspace", "/dev/null/ws"], "workspace"),
        (["serve", "--stdio", "--tools", "no_such_module:x"], "cannot import 'no_such_module'"),
        (
            ["serve", "--stdio", "--tools", "tests.fixtures.demo_tools:nope"],
            "has no attribute 'nope'",
        ),
        (["serve", "--stdio", "--tools", "not-a-spec"], "MODULE:ATTR"),
        (
            ["serve", "--http", "0.0.0.0:0", "--tools", "tests.fixtures.demo_tools:TOOLS"],
            "without authentication",
        ),
        (["tools", "--target", "http://127.0.0.1:9"], "cannot reach"),
        (["audit", "--db", "/nonexistent/a.db"], "no audit database"),
    ],
)
def test_errors_are_one_clear_line(args: list[str], message: str) -> None:
    failed = run(*args)
    assert failed.returncode == 2
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolmesh: error:") and message in lines[0]


def test_serve_http_prints_its_url_first(tmp_path: Path) -> None:
    audit = tmp_path / "a.db"
    process = subprocess.Popen(
        toolmesh_command(
            "serve",
            "--http",
            "127.0.0.1:0",
            "--tools",
            "tests.fixtures.demo_tools:TOOLS",
            "--audit",
            str(audit),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        called = run("call", "echo", "--args", '{"text": "over http"}', "--target", url)
        assert json.loads(called.stdout)["output"] == "over http"
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode == 0
    rows = sqlite3.connect(audit).execute("SELECT tool_name, transport FROM audit").fetchall()
    assert rows == [("echo", "http")]
    shown = run("audit", "--db", str(audit))
    assert shown.returncode == 0 and "echo" in shown.stdout and "ok" in shown.stdout
    as_json = run("audit", "--db", str(audit), "--json")
    assert json.loads(as_json.stdout.splitlines()[0])["tool_name"] == "echo"


def test_skills_command_shows_skills_and_skipped_files(tmp_path: Path) -> None:
    shown = run("skills", "examples/skills")
    assert shown.returncode == 0 and shown.stdout.startswith("hello-world")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "SKILL.md").write_text("no front matter")
    broken = run("skills", str(tmp_path))
    assert broken.returncode == 1 and "skipped" in broken.stdout and "front matter" in broken.stdout


@pytest.mark.network_server
def test_serve_and_tools_with_a_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        "[toolkit]\n"
        'audit = "from-manifest.db"\n'
        "[[tools]]\n"
        'kind = "python"\n'
        'module = "tests.fixtures.demo_tools:add"\n'
        'prefix = "calc"\n'
    )
    shown = run("tools", "--config", str(manifest), "--json")
    assert shown.returncode == 0, shown.stderr
    assert [d["name"] for d in json.loads(shown.stdout)] == ["calc_add"]
    target = " ".join(toolmesh_command("serve", "--stdio", "--config", str(manifest)))
    called = run("call", "calc_add", "--args", '{"a": 2, "b": 3}', "--target", target)
    assert called.returncode == 0, called.stderr
    assert "5" in called.stdout
    rows = (
        sqlite3.connect(tmp_path / "from-manifest.db")
        .execute("SELECT tool_name FROM audit")
        .fetchall()
    )
    assert rows == [("calc_add",)]
    broken = tmp_path / "broken.toml"
    broken.write_text('[[tools]]\nkind = "ruby"\n')
    failed = run("serve", "--stdio", "--config", str(broken))
    assert failed.returncode == 2
    assert 'broken.toml: tools[0] (kind "ruby"): unknown kind' in failed.stderr
