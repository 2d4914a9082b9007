"""``toolmesh tools``/``call``: bad targets and options are one clear error, exit 2."""

from __future__ import annotations

import io
import json
import os
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_loading import one_error_line
from tests.conftest import REPO, toolmesh_command
from tests.fixtures.sites import static_site
from toolmesh import a2a
from toolmesh.cli import main
from toolmesh.cli.agents import looks_like_card
from toolmesh.cli.loading import DEFAULT_AUDIT

DEMO = "tests.fixtures.demo_tools:TOOLS"


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_call_refuses_a_timeout_that_is_no_deadline(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["call", "echo", "--tools", DEMO, "--timeout", timeout])
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument --timeout: wants a number of seconds above 0, not {timeout!r}" in last


def test_an_empty_target_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--target is empty" in one_error_line(["tools", "--target", ""], capsys)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://127.0.0.1:99999", "port out of range 0-65535"),
        ("http://127.0.0.1:abc", "port could not be cast"),
        ("http://127.0.0.1:99999/.well-known/agent-card.json", "port out of range 0-65535"),
    ],
)
def test_a_target_url_with_a_bad_port_is_named(
    target: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_error_line(["tools", "--target", target], capsys)
    assert f"cannot connect to {target!r}: {reason}" in line


MARKED = '''
from pathlib import Path

from toolmesh import tool
from toolmesh.sources.base import ToolSet


@tool
def ping() -> str:
    """Pong."""
    return "pong"


class Marked(ToolSet):
    async def close(self) -> None:
        Path(__file__).with_name("closed.txt").write_text("closed")
        await super().close()


TOOLS = Marked([ping], name="marked")
'''


@pytest.mark.parametrize("how", ["--tools", "--target"])
@pytest.mark.parametrize("command", [["tools"], ["call", "ping"]])
def test_the_host_made_for_a_command_is_closed(
    how: str,
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = f"marked_{tmp_path.name}"  # a module of its own for each case
    (tmp_path / f"{module}.py").write_text(MARKED)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main([*command, how, f"{module}:TOOLS"]) == 0
    assert "pong" in capsys.readouterr().out or command == ["tools"]
    assert (tmp_path / "closed.txt").read_text() == "closed"  # its sources were closed


# -- a target that is no A2E host, and card targets ----------------------------------------------

CARD = {"name": "desk", "skills": [{"id": "greet", "name": "Greet", "description": "Says hi."}]}


@pytest.fixture
def site(tmp_path: Path) -> Iterator[str]:
    """A static web site holding ``ok.json``, an agent card (of an agent not running)."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "ok.json").write_text(json.dumps({**CARD, "url": "http://127.0.0.1:9/a2a"}))
    with static_site(folder) as url:
        yield url


def test_a_web_site_is_not_an_a2e_host(site: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It answered POST /session with its whole 501 page: 14 lines, and no hint of the fix."""
    line = one_error_line(["tools", "--target", site], capsys)
    assert line.startswith(f"toolmesh: error: {site} is not an A2E host (POST /session answered")
    assert line.endswith(f"give its card's URL: --target {site}/.well-known/agent-card.json")
    assert "<!DOCTYPE HTML> <html" in line and len(line) < 400  # the page's start, squashed


def test_a_missing_card_is_one_short_line(site: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["agents", "add", f"{site}/missing.json", "--config", "unused.toml"]
    line = one_error_line(argv, capsys)
    assert f"the agent card {site}/missing.json answered 404: <!DOCTYPE HTML> <html" in line
    assert len(line) < 320 and line.endswith("...")


@pytest.mark.parametrize("command", [["tools"], ["call", "desk_greet", "--timeout", "5"]])
def test_a_json_url_is_a_card_target(
    command: list[str], site: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agents add` took ok.json; `--target` tried it as an A2E host (`ok.json/session`)."""
    code = main([*command, "--target", f"{site}/ok.json"])
    out = capsys.readouterr().out
    if command == ["tools"]:
        assert code == 0 and out.split()[0] == "desk_greet"
    else:  # the card was read: the call went to the agent's endpoint, which is down
        assert code == 1 and json.loads(out)["tool_name"] == "desk_greet"


@pytest.mark.parametrize(
    ("target", "card"),
    [
        ("http://h/.well-known/agent-card.json", True),
        ("http://h/.well-known/agent.json?v=1", True),
        ("https://h/cards/desk.json", True),
        ("https://h/cards/DESK.JSON#top", True),
        ("http://h/ok.json?x=/y", True),
        ("http://h", False),
        ("http://h/api/", False),
        ("http://h/api?format=.json", False),  # the query is no part of the path
        ("cards/desk.json", False),  # no URL
    ],
)
def test_which_targets_are_cards(target: str, card: bool) -> None:
    assert looks_like_card(target) is card


# -- options that would be ignored ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["call", "add", "--target", DEMO, "--tools", DEMO], "with --tools: --target names"),
        (["tools", "--target", DEMO, "--config", "t.toml"], "combined with --config:"),
        (
            ["tools", "--target", DEMO, "--mcp-config", "m.json", "--mcp-defer-over", "3"],
            "combined with --mcp-config or --mcp-defer-over:",
        ),
        (["tools", "--tools", DEMO, "--mcp-defer-over", "3"], "give --mcp-config FILE"),
        (["tools", "--tools", DEMO, "--auth-token", "t"], "a host run in this process takes"),
        (["call", "add", "--target", DEMO, "--auth-token", "t"], "--auth-token is for a host"),
    ],
)
def test_an_option_that_would_be_ignored_is_refused(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in one_error_line(argv, capsys)


# -- the token -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked_host() -> Iterator[str]:
    """`toolmesh serve --http` requiring the token it read from TOOLMESH_AUTH_TOKEN."""
    environment = {**os.environ, "TOOLMESH_AUTH_TOKEN": "s3cret"}
    argv = ["serve", "--http", "127.0.0.1:0", "--tools", DEMO, "--audit", ":memory:"]
    process = subprocess.Popen(
        toolmesh_command(*argv),
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.network_server
def test_the_clients_send_the_token_serve_reads(
    locked_host: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TOOLMESH_AUTH_TOKEN", raising=False)
    assert "answered 401" in one_error_line(["tools", "--target", locked_host], capsys)
    monkeypatch.setenv("TOOLMESH_AUTH_TOKEN", "s3cret")
    argv = ["call", "echo", "--args", '{"text": "hi"}', "--target", locked_host]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["output"] == "hi"
    assert "answered 401" in one_error_line([*argv, "--auth-token", "wrong"], capsys)


def test_a_card_target_gets_the_given_token_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--auth-token was dropped for a card target; TOOLMESH_AUTH_TOKEN, the A2E host's token,
    is not handed to whichever agent a card names."""
    sent: list[dict[str, str]] = []

    async def fetch_card(url: str, headers: dict[str, str], timeout: float) -> dict[str, Any]:
        sent.append(headers)
        return CARD

    monkeypatch.setattr(a2a, "_fetch_card", fetch_card)
    monkeypatch.setenv("TOOLMESH_AUTH_TOKEN", "for-the-a2e-host")
    card = "http://127.0.0.1:9/.well-known/agent-card.json"
    assert main(["tools", "--target", card, "--auth-token", "for-the-agent"]) == 0
    assert main(["tools", "--target", card]) == 0
    assert sent == [{"Authorization": "Bearer for-the-agent"}, {}]
    assert capsys.readouterr().out.split()[0] == "desk_greet"


# -- the audit of a call made here -----------------------------------------------------------------


def test_a_call_made_here_is_audited_where_serve_audits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`call` without --target (the built-ins in ./workspace) wrote no audit at all."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOOLMESH_AUDIT")
    assert main(["tools"]) == 0  # listing is no call: nothing to audit
    assert not (tmp_path / DEFAULT_AUDIT).exists()
    assert main(["call", "write_file", "--args", '{"path": "a.txt", "content": "hi"}']) == 0
    assert main(["call", "echo", "--args", '{"text": "x"}', "--tools", DEMO]) == 0
    capsys.readouterr()
    assert main(["audit"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in shown] == ["write_file", "echo"]
    monkeypatch.setenv("TOOLMESH_AUDIT", str(tmp_path / "chosen.db"))
    assert main(["call", "add", "--args", '{"a": 1, "b": 2}', "--target", DEMO]) == 0
    rows = sqlite3.connect(tmp_path / "chosen.db").execute("SELECT tool_name FROM audit")
    assert rows.fetchall() == [("add",)]


# -- `call --stream`: the events as they arrive --------------------------------------------------

STEPS = '''
from toolmesh import ToolContext, tool


@tool
def steps(ctx: ToolContext) -> str:
    """Reports progress between other events, some of it far outside 0..100."""
    ctx.progress(25, "starting up slowly")
    ctx.progress(50, "half way")
    ctx.status("working")
    ctx.emit("progress", {"pct": 10**15, "message": "way over"})
    ctx.log("a line of log")
    ctx.emit("progress", {"pct": -5, "message": "under"})
    return "done"


TOOLS = [steps]
'''
HALF, FULL, EMPTY = "#" * 15 + "-" * 15, "#" * 30, "-" * 30


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _as_a_terminal_shows(written: str) -> list[str]:
    """The lines a terminal shows for ``written``: a carriage return goes back to the line's
    start, and what follows overwrites it."""
    screen, column = [""], 0
    for char in written:
        if char == "\n":
            screen.append("")
            column = 0
        elif char == "\r":
            column = 0
        else:
            line = screen[-1]
            screen[-1] = line[:column] + char + line[column + 1 :]
            column += 1
    return [line.rstrip() for line in screen]


def test_streamed_progress_is_one_line_per_bar_outside_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pct of 10**15 built a string of that many characters (a MemoryError traceback), and
    every bar began with a carriage return, in a file too."""
    (tmp_path / "steps_plain.py").write_text(STEPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["call", "steps", "--stream", "--tools", "steps_plain:TOOLS"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == [
        f"[{'#' * 7}{'-' * 23}]  25% starting up slowly",
        f"[{HALF}]  50% half way",
        "status: working",
        f"[{FULL}] 100% way over",
        "log: a line of log",
        f"[{EMPTY}]   0% under",
    ]


def test_streamed_progress_on_a_terminal_redraws_its_bar_but_no_other_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bar was drawn over whatever line was last, a status or log line too."""
    (tmp_path / "steps_tty.py").write_text(STEPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["call", "steps", "--stream", "--tools", "steps_tty:TOOLS"]) == 0
    assert json.loads(capsys.readouterr().out)["data"] == "done"
    assert _as_a_terminal_shows(terminal.getvalue()) == [
        f"[{HALF}]  50% half way",  # drawn over the 25% bar, whose longer tail is gone
        "status: working",
        f"[{FULL}] 100% way over",
        "log: a line of log",
        f"[{EMPTY}]   0% under",
        "",
    ]


ODD_PROGRESS = """
import sys

from toolmesh.models import ToolEvent, ToolResult
from toolmesh.protocol import HandshakeResponse, ToolCallResponse, decode, encode

ODD = [{"pct": "half", "message": "as text"}, {"pct": None}, {"pct": 12.7, "message": "a float"}]
for line in sys.stdin.buffer:
    message = decode(line)
    if message.type == "handshake/req":
        sys.stdout.buffer.write(encode(HandshakeResponse(req_id=message.id, session_id="s1")))
    elif message.type == "tool/call/req":
        for seq, data in enumerate(ODD):
            event = ToolEvent(kind="progress", req_id=message.id, data=data, seq=seq)
            sys.stdout.buffer.write(encode(event))
        done = ToolResult(success=True, tool_name=message.tool_name, data="ok", duration_ms=1)
        sys.stdout.buffer.write(encode(ToolCallResponse(req_id=message.id, data=done)))
    else:
        break
    sys.stdout.flush()
"""


def test_a_progress_event_whose_pct_is_no_number_is_shown_as_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host that is no toolmesh sent pct "half" or null: the bar raised a traceback."""
    host = tmp_path / "odd_progress.py"
    host.write_text(ODD_PROGRESS)
    assert main(["call", "x", "--stream", "--target", shlex.join([sys.executable, str(host)])]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "progress: as text",
        'progress: {"pct": null}',
        f"[{'#' * 3}{'-' * 27}]  12% a float",
    ]
