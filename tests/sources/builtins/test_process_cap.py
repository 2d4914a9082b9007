"""max_processes: a pids cgroup per call caps the processes, for root too."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sources.builtins.conftest import Make, requires_bwrap
from tests.sources.builtins.test_process import running_with
from toolmesh.sources.builtins import cgroups

# Forks up to 40 children, each blocked reading a pipe until the parent closes its end; prints
# how many forks succeeded.
FORKS = """
import os
r, w = os.pipe()
n = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
print(n, flush=True)
os.close(w)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders of the pids cgroups the calls make (skips where none can be made)."""
    if cgroups.pids_parent() is None:
        pytest.skip("no writable pids cgroup here (cgroup v2 with pids delegated, or v1 pids)")
    paths: list[str] = []
    create = cgroups.PidsCgroup.create

    def recorded(limit: int, name: str) -> cgroups.PidsCgroup | None:
        group = create(limit, name)
        paths.append(group.path if group else "")
        return group

    monkeypatch.setattr(cgroups.PidsCgroup, "create", recorded)
    return paths


def kill_running(marker: str) -> None:
    """SIGKILL what a failed test left running (found by a unique argument)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                os.kill(int(entry), signal.SIGKILL)


@pytest.mark.parametrize("isolation", ["none", pytest.param("bubblewrap", marks=requires_bwrap)])
async def test_max_processes_holds_for_root_too(
    make_kit: Make, made: list[str], isolation: str
) -> None:
    # RLIMIT_NPROC alone: as root (as CI runs) all 40 forks succeeded
    kit = await make_kit({"python": {"max_processes": 10, "isolation": isolation}})
    result = await kit.execute("python", {"code": FORKS, "timeout": 60})
    assert result.success, result
    forked = int(result.data["stdout"])
    assert forked <= 9  # the interpreter itself is the tenth; bubblewrap's own are not counted
    assert forked >= (9 if isolation == "none" else 7)
    assert len(made) == 1 and not os.path.exists(made[0])  # the call's cgroup is gone


async def test_what_escaped_the_session_dies_with_the_cgroup(
    make_kit: Make, made: list[str]
) -> None:
    # a daemon that left the session and dropped its environment mark: only its cgroup finds it
    marker = "300.5813"
    code = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.closerange(0, 3)\n"
        f"        os.execve('/bin/sleep', ['sleep', '{marker}'], {{}})\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    kit = await make_kit({"python": {"max_processes": 10, "isolation": "none"}})
    try:
        result = await kit.execute("python", {"code": code})
        assert result.success, result
        assert running_with(marker) == []
        assert len(made) == 1 and not os.path.exists(made[0])
    finally:
        kill_running(marker)


@pytest.fixture
def no_cgroups(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A machine without cgroups, as root."""
    monkeypatch.setattr(cgroups, "_mounts", list)
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 0)
    cgroups.pids_parent.cache_clear()
    yield
    cgroups.pids_parent.cache_clear()


async def test_root_is_warned_once_where_no_cgroup_can_cap(
    make_kit: Make, no_cgroups: None, caplog: pytest.LogCaptureFixture, workspace: Path
) -> None:
    kit = await make_kit({"python": {"max_processes": 10, "isolation": "none"}})
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        for _ in range(2):
            result = await kit.execute("python", {"code": "print('ran')"})
            assert result.success and result.data["stdout"] == "ran\n"
    warnings = [r.getMessage() for r in caplog.records if r.name == cgroups.__name__]
    assert len(warnings) == 1 and "max_processes cannot be enforced" in warnings[0]


@pytest.mark.parametrize("enabled", ["pids", ""])
def test_a_cgroup2_with_pids_delegated_is_used_and_none_is_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: str
) -> None:
    # cgroup v2 cannot be tried for real where pids is bound to v1; its discovery can
    mount = tmp_path / "unified"
    own = mount / "user.slice" / "app.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text(enabled)
    proc = {
        "/proc/self/cgroup": "1:name=systemd:/\n0::/user.slice/app.scope\n",
        "/proc/self/mountinfo": f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n",
    }
    real_read = cgroups._read
    monkeypatch.setattr(cgroups, "_read", lambda path: proc.get(path) or real_read(path))
    found = cgroups._v2_parent(cgroups._mounts(), cgroups._own_cgroups())
    assert found == (str(own) if enabled else None)
    assert (own / "cgroup.subtree_control").read_text() == enabled
