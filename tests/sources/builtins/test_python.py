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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")  # a zombie has ended


async def test_a_daemon_the_code_detaches_does_not_outlive_the_call(
    make_kit: Make, tmp_path: Path
) -> None:
    """Double fork, setsid, stdio closed: out of the process group and holding no pipe, it
    used to run on after a clean exit (only a deadline looked for such processes)."""
    pid_file = tmp_path / "daemon.pid"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.close(0); os.close(1); os.close(2)\n"
        f"        open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        f"while not os.path.exists({str(pid_file)!r}) or not open({str(pid_file)!r}).read():\n"
        "    time.sleep(0.01)\n"
        "print('parent done')\n"
    )
    kit = await make_kit({"python": {"isolation": "none"}})
    result = await kit.execute("python", {"code": code, "timeout": 20})
    daemon = int(pid_file.read_text())
    try:
        assert result.success and result.data["stdout"] == "parent done\n", result
        assert not _alive(daemon)
    finally:
        if _alive(daemon):
            os.kill(daemon, 9)
