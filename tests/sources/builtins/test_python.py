"""The python tool: code in a child interpreter, isolated by default."""

from __future__ import annotations

import os
from pathlib import Path

from tests.sources.builtins.conftest import Make, requires_bwrap
from toolmesh import ToolErrorCode


@requires_bwrap
async def test_runs_isolated_by_default(make_kit: Make, workspace: Path) -> None:
    (workspace / "data.txt").write_text("21\n")
    kit = await make_kit()
    code = (
        "import os, socket\n"
        "print(int(open('data.txt').read()) * 2)\n"
        "open('made.txt', 'w').write('x')\n"
        "print(os.path.exists('made.txt'))\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "except OSError as exc:\n    print('no network:', type(exc).__name__)\n"
    )
    result = await kit.execute("python", {"code": code})
    assert result.success, result
    lines = result.data["stdout"].splitlines()
    assert lines[:2] == ["42", "True"] and lines[2].startswith("no network:")
    assert sorted(os.listdir(workspace)) == ["data.txt"]  # the write stayed in the overlay


async def test_exit_code_stderr_and_timeout(make_kit: Make) -> None:
    kit = await make_kit({"python": {"isolation": "none"}})
    failed = await kit.execute(
        "python", {"code": "import sys\nprint('out')\nsys.exit('bad input')"}
    )
    assert not failed.success and failed.exit_code == 1
    assert failed.data["stdout"] == "out\n" and failed.data["stderr"] == "bad input\n"
    slow = await kit.execute("python", {"code": "import time\ntime.sleep(100)", "timeout": 0.5})
    assert slow.error_code == ToolErrorCode.TIMEOUT


async def test_code_size_limit(make_kit: Make) -> None:
    kit = await make_kit({"python": {"isolation": "none", "max_code_bytes": 10}})
    result = await kit.execute("python", {"code": "print('this is too long')"})
    assert not result.success and "limit is 10" in result.error
