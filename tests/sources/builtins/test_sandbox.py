"""Isolation with bubblewrap: views of the workspace, no network, fail closed without bwrap."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sources.builtins.conftest import SECRET, Make, requires_bwrap
from tests.sources.builtins.test_process import running_with
from toolmesh import ToolErrorCode
from toolmesh.sources.builtins.sandbox import Sandbox

pytestmark = requires_bwrap


def isolated(**extra: object) -> dict[str, object]:
    return {"shell": {"allow": "*", "isolation": "bubblewrap", **extra}}


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on the host's loopback that accepts connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


async def test_overlay_writes_do_not_reach_the_host(
    make_kit: Make, workspace: Path, outside: Path
) -> None:
    (workspace / "file.txt").write_text("original\n")
    kit = await make_kit(isolated(view="overlay"))
    host_tmp = f"/tmp/toolmesh-test-{uuid.uuid4().hex}"
    command = (
        f"echo changed > file.txt; echo new > new.txt; cat file.txt new.txt; "
        f"echo x > {host_tmp} && cat {host_tmp}; "
        f"echo pwned > {outside}/secret.txt; echo pwned > /etc/toolmesh-test; true"
    )
    result = await kit.execute("shell", {"command": command})
    assert result.success, result
    assert result.data["stdout"] == "changed\nnew\nx\n"  # inside, the writes are seen
    assert "Read-only file system" in result.data["stderr"]  # /etc
    assert "No such file or directory" in result.data["stderr"]  # the outside folder is not there
    assert (workspace / "file.txt").read_text() == "original\n"
    assert sorted(os.listdir(workspace)) == ["file.txt"]
    assert not os.path.exists(host_tmp) and not os.path.exists("/etc/toolmesh-test")
    assert (outside / "secret.txt").read_text() == SECRET


async def test_read_only_and_read_write_views(make_kit: Make, workspace: Path) -> None:
    (workspace / "file.txt").write_text("original\n")
    read_only = await make_kit(isolated(view="read-only"))
    refused = await read_only.execute("shell", {"command": "cat file.txt; echo x > file.txt"})
    assert refused.data["stdout"] == "original\n" and "Read-only" in refused.data["stderr"]
    read_write = await make_kit(isolated(view="read-write"))
    written = await read_write.execute("shell", {"command": "echo kept > file.txt"})
    assert written.success and (workspace / "file.txt").read_text() == "kept\n"


async def test_the_network_is_off_unless_allowed(make_kit: Make, listener: int) -> None:
    probe = {"command": f"echo > /dev/tcp/127.0.0.1/{listener} && echo connected"}
    offline = await (await make_kit(isolated())).execute("shell", probe)
    assert not offline.success and "connected" not in offline.data["stdout"]
    online = await (await make_kit(isolated(network=True))).execute("shell", probe)
    assert online.success and online.data["stdout"] == "connected\n"


async def test_private_tmp_and_no_host_processes(make_kit: Make, workspace: Path) -> None:
    marker = Path("/tmp") / f"toolmesh-host-{uuid.uuid4().hex}"
    marker.write_text("host")
    try:
        kit = await make_kit(isolated())
        result = await kit.execute("shell", {"command": "ls -A /tmp; ps -e --no-headers | wc -l"})
    finally:
        marker.unlink()
    *tmp_entries, processes = result.data["stdout"].split()
    mounted = [workspace.parts[2]] if workspace.parts[1] == "tmp" else []
    assert tmp_entries == mounted  # only the way to the workspace, when it lies under /tmp
    assert int(processes) <= 4  # bash, ps, wc and the sandbox's init


async def test_the_deadline_kills_the_sandbox(make_kit: Make) -> None:
    kit = await make_kit(isolated())
    result = await kit.execute(
        "shell", {"command": "sleep 100.5317 & sleep 100.5317", "timeout": 0.5}
    )
    assert result.error_code == ToolErrorCode.TIMEOUT
    assert running_with("100.5317") == []


async def test_missing_bubblewrap_fails_closed(
    make_kit: Make, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = await make_kit(isolated())
    monkeypatch.setenv("PATH", str(workspace))  # no bwrap on this PATH
    result = await kit.execute("shell", {"command": "touch ran"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED
    assert "apt-get install bubblewrap" in result.error
    assert not (workspace / "ran").exists()


async def test_a_workspace_reached_through_a_symlink_is_there_by_both_names(
    tmp_path: Path,
) -> None:
    """The path checks accept the configured spelling of a symlinked workspace; inside the
    sandbox only the resolved folder was mounted, so such a path was "No such file"."""
    from toolmesh import create_toolkit

    real = tmp_path / "real"
    real.mkdir()
    (real / "a.txt").write_text("inside\n")
    link = tmp_path / "ws"
    link.symlink_to(real)
    kit = await create_toolkit(builtins=isolated(view="read-only"), workspace=link)
    try:
        result = await kit.execute("shell", {"command": f"cat {link}/a.txt {real}/a.txt"})
    finally:
        await kit.close()
    assert result.success, result
    assert result.data["stdout"] == "inside\ninside\n"


def test_writable_paths_are_writable_inside_read_only_ones(tmp_path: Path) -> None:
    """A package's allow_write folders were passed as read-only paths: no write reached them."""
    package = tmp_path / "package"
    (package / "out").mkdir(parents=True)
    link = tmp_path / "out-link"
    link.symlink_to(package / "out")  # bound by where it leads
    sandbox = Sandbox(
        (), str(package), view="read-only", read_only_paths=[str(package)],
        writable_paths=[str(link)],
    )  # fmt: skip
    script = "echo kept > out/new.txt; echo lost > elsewhere.txt; cat out/new.txt"
    done = subprocess.run(
        sandbox.wrap(["/bin/sh", "-c", script]), capture_output=True, text=True, timeout=30
    )
    assert done.stdout == "kept\n" and "Read-only file system" in done.stderr, done
    assert (package / "out" / "new.txt").read_text() == "kept\n"
    assert not (package / "elsewhere.txt").exists()
