"""``--tools``/``--target MODULE:ATTR``: modules and plugins that fail say so in one line."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.failing_plugins import SOURCE as FAILING_PLUGINS
from toolmesh.cli import main

TOOLS = '''
from toolmesh import tool

@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b

@tool
def neg(a: int) -> int:
    """Negate."""
    return -a

TOOLS = [add, neg]
'''

_numbers = itertools.count()
Write = Callable[[str], str]


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Write]:
    """Writes a module into the current folder; its name is new each time, so that one test's
    import does not answer for another's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(source: str) -> str:
        name = f"qa_module_{next(_numbers)}"
        (tmp_path / f"{name}.py").write_text(source)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolmesh: error: "), lines
    return lines[0]


@pytest.mark.parametrize("option", ["--tools", "--target"])
@pytest.mark.parametrize(
    ("source", "attr", "message"),
    [
        ('raise RuntimeError("blew up")', "x", "importing '{m}' failed: RuntimeError: blew up"),
        ("def f(:\n", "x", "importing '{m}' failed: SyntaxError: "),
        ("import sys; sys.exit(3)", "x", "importing '{m}' failed: SystemExit: 3"),
        (FAILING_PLUGINS, "NeedsArg", "cannot make a plugin of {m}:NeedsArg: TypeError: "),
        (FAILING_PLUGINS, "IN_A_LIST", "cannot make a plugin of {m}:IN_A_LIST: TypeError: "),
        (
            FAILING_PLUGINS,
            "BadList",
            "{m}:BadList could not list its tools: RuntimeError: cannot list",
        ),
        ("X = 42", "X", "{m}:X: cannot serve 42: expected a ToolPlugin"),
    ],
)
def test_a_failing_module_or_plugin_is_one_line(
    option: str,
    source: str,
    attr: str,
    message: str,
    write_module: Write,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = write_module(source)
    line = one_error_line(["tools", option, f"{name}:{attr}"], capsys)
    assert message.format(m=name) in line


@pytest.mark.parametrize(("attr", "names"), [("TOOLS", ["add", "neg"]), ("add", ["add"])])
def test_target_takes_what_tools_takes(
    attr: str, names: list[str], write_module: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    name = write_module(TOOLS)
    assert main(["tools", "--target", f"{name}:{attr}", "--json"]) == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)] == names
    argv = ["call", "add", "--args", '{"a": 2, "b": 3}', "--target", f"{name}:{attr}"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["output"] == "5"


def test_a_message_of_many_lines_prints_as_one(
    write_module: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printer's own guarantee, whoever built the message (a peer's HTML page, say)."""
    name = write_module('raise RuntimeError("first line\\n  second line\\r\\nthird")')
    line = one_error_line(["tools", "--tools", f"{name}:x"], capsys)
    assert line.endswith("RuntimeError: first line second line third")


@pytest.mark.parametrize("target", ["toolmesh serve --stdio --tools 'mytools:TOOLS", "toolmesh \\"])
def test_a_target_command_that_cannot_be_split_is_one_line(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unbalanced quote (a typo in a host command) raised a ValueError traceback."""
    line = one_error_line(["tools", "--target", target], capsys)
    assert f"--target {target!r} cannot be read as a command: No " in line
