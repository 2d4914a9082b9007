"""Process limits: the deadline kills the whole tree, output is bounded, the environment set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sources.builtins.conftest import Make
from toolmesh import ToolErrorCode

ANY = {"allow": "*"}


def running_with(marker: str) -> list[str]:
    """Processes (not zombies) whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\x00", b" ")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in (b"Z", b"X"):
            found.append(cmdline.decode(errors="replace"))
    return found


def zombie_children() -> list[int]:
    me = str(os.getpid()).encode()
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == b"Z" and fields[1] == me:
                zombies.append(int(entry))
    return zombies


@pytest.mark.slow
async def test_the_deadline_kills_sleep_and_its_children(make_kit: Make) -> None:
    kit = await make_kit({"shell": ANY})
    marker = "100.4217"  # a unique argument to find the processes by
    command = (
        f"echo started; sleep {marker} & (sleep {marker}; echo never) & "
        f"setsid sleep {marker} & sleep {marker}"
    )
    result = await kit.execute("shell", {"command": command, "timeout": 0.5})
    assert not result.success and result.error_code == ToolErrorCode.TIMEOUT
    assert result.data["timed_out"] is True and result.exit_code is None
    assert result.data["stdout"] == "started\n"  # what it printed before the deadline is kept
    assert "killed after 0.5s" in result.output
    assert running_with(marker) == []
    assert zombie_children() == []


async def test_the_call_deadline_also_stops_the_command(make_kit: Make) -> None:
    kit = await make_kit({"shell": ANY})
    result = await kit.execute("shell", {"command": "sleep 100.4218"}, timeout=0.3)
    assert result.error_code == ToolErrorCode.TIMEOUT
    assert running_with("100.4218") == []


async def test_background_jobs_do_not_outlive_the_command(make_kit: Make) -> None:
    kit = await make_kit({"shell": ANY})
    result = await kit.execute("shell", {"command": "sleep 100.4219 >/dev/null 2>&1 & echo done"})
    assert result.success and result.data["stdout"] == "done\n"
    assert running_with("100.4219") == []


async def test_output_is_truncated_with_a_note(make_kit: Make) -> None:
    kit = await make_kit({"shell": {"allow": "*", "max_output": 1000}})
    command = "head -c 300000 /dev/zero | tr '\\0' x; echo; echo THE-END; echo err >&2"
    result = await kit.execute("shell", {"command": command})
    assert result.success and result.truncated is True
    data = result.data
    assert data["stdout_cut"] == 300000 + 9 - 1000 and data["stderr_cut"] == 0
    assert data["stdout"].startswith("x" * 500) and data["stdout"].endswith("THE-END\n")
    assert f"[... {data['stdout_cut']} bytes cut ...]" in data["stdout"]
    assert f"output truncated: {data['stdout_cut']} bytes of stdout" in result.output
    assert data["stderr"] == "err\n"


async def test_exit_codes_and_stderr(make_kit: Make) -> None:
    kit = await make_kit({"shell": ANY})
    result = await kit.execute("shell", {"command": "echo out; echo oops >&2; exit 3"})
    assert not result.success and result.exit_code == 3
    assert result.error == "the command exited with status 3"
    assert result.output == "out\n[stderr]\noops\n[the command exited with status 3]"


async def test_environment_modes(make_kit: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLMESH_TEST_SECRET", "hunter2")
    command = {"command": "echo [$TOOLMESH_TEST_SECRET] [$FIXED] $PATH"}
    default = await (await make_kit({"shell": ANY})).execute("shell", command)
    assert default.data["stdout"] == "[] [] /usr/local/bin:/usr/bin:/bin\n"
    listed = {"allow": "*", "env": ["TOOLMESH_TEST_SECRET"], "set_env": {"FIXED": "1"}}
    chosen = await (await make_kit({"shell": listed})).execute("shell", command)
    assert chosen.data["stdout"].startswith("[hunter2] [1]")
    inherit = {"allow": "*", "env": "inherit"}
    inherited = await (await make_kit({"shell": inherit})).execute("shell", command)
    assert inherited.data["stdout"].startswith("[hunter2] []")
    empty = {"allow": "*", "env": "empty"}
    nothing = await (await make_kit({"shell": empty})).execute("shell", {"command": "env"})
    assert sorted(line.split("=")[0] for line in nothing.data["stdout"].split()) == [
        "HOME", "LANG", "PATH", "PWD", "SHLVL", "TOOLMESH_RUN", "_",
    ]  # fmt: skip


async def test_working_folder_inside_the_workspace(make_kit: Make, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    kit = await make_kit({"shell": {"cwd": "sub"}})
    result = await kit.execute("shell", {"command": "pwd"})
    assert result.data["stdout"] == f"{workspace / 'sub'}\n"


async def test_working_folder_outside_is_a_config_error(make_kit: Make) -> None:
    from toolmesh import ConfigError

    with pytest.raises(ConfigError, match="leave the workspace"):
        await make_kit({"shell": {"cwd": "../"}})


async def test_resource_limits(make_kit: Make) -> None:
    kit = await make_kit({"shell": {"allow": "*", "max_file_mb": 1}})
    result = await kit.execute("shell", {"command": "head -c 2000000 /dev/zero > big; echo $?"})
    assert result.data["stdout"].strip() != "0"
