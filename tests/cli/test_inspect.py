"""``toolmesh tools``/``call``: bad targets and options are one clear error, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_loading import one_error_line
from toolmesh.cli import main

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
