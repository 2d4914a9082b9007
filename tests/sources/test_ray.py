"""Tools placed on a local Ray cluster: the same call contract, the pipeline stays in the host."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import ray_tools
from toolmesh import ConfigError, Host, ToolContext, Toolkit, connect_async, tool
from toolmesh.manifest import load_manifest
from toolmesh.models import ToolEvent
from toolmesh.sources.functions import tools_of
from toolmesh.sources.ray import OnRay
from toolmesh.store import SqliteStore

pytestmark = [pytest.mark.slow, pytest.mark.network_server]


@pytest.fixture
async def client(ray_cluster: Any, tmp_path: Path) -> AsyncIterator[Any]:
    host = Host(OnRay(tools_of(ray_tools.TOOLS)), audit=tmp_path / "audit.db")
    connected = await connect_async(host, agent_id="tester")
    yield connected
    await connected.close()
    await host.close()


def process_ends(pid: int, timeout: float) -> bool:
    """Wait (without polling) for a process that is not our child to end."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([handle], [], [], timeout)
        return bool(ready)
    finally:
        os.close(handle)


async def test_a_call_runs_in_a_ray_worker_with_events_streamed(client: Any) -> None:
    events: list[ToolEvent] = []
    result = await client.call_tool("where", {"steps": 3}, on_event=events.append)
    assert result.success, result.error
    assert result.data["pid"] != os.getpid()  # another process ran it
    assert result.data["session_id"] == client.session_id
    assert [(e.kind, e.seq, e.data["pct"]) for e in events] == [
        ("progress", 0, 33),
        ("progress", 1, 66),
        ("progress", 2, 100),
    ]


async def test_state_validation_and_errors_stay_in_the_host(client: Any) -> None:
    assert (await client.call_tool("note", {"key": "k", "value": "v"})).success
    seen = await client.call_tool("where", {"steps": 1})
    assert seen.data["state"] == {"context": {"k": "v"}}  # the host's snapshot went along
    bad = await client.call_tool("where", {"steps": "many"})
    assert bad.error_code == "invalid_arguments"  # refused before any task was started
    failed = await client.call_tool("fail", {"message": "boom"})
    assert (failed.error_code, failed.error) == ("tool_error", "ValueError: boom")


async def test_the_deadline_cancels_the_task(client: Any) -> None:
    pids: list[int] = []

    def on_event(event: ToolEvent) -> None:
        pids.append(int(event.data["message"]))

    result = await client.call_tool("stall", {"seconds": 60}, on_event=on_event, timeout=2)
    assert result.error_code == "timeout"
    assert pids and process_ends(pids[0], 30)  # force-cancelled: the worker is gone


async def test_a_killed_worker_is_a_retryable_error_and_the_host_goes_on(client: Any) -> None:
    def kill_the_worker(event: ToolEvent) -> None:
        os.kill(int(event.data["message"]), signal.SIGKILL)

    result = await client.call_tool("stall", {"seconds": 60}, on_event=kill_the_worker)
    assert (result.success, result.error_code) == (False, "tool_error")
    assert result.metadata == {"placement": "ray", "retryable": True}
    assert "was lost" in (result.error or "")
    again = await client.call_tool("where", {"steps": 1})
    assert again.success


async def test_placement_ray_in_the_manifest(ray_cluster: Any, tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[[tools]]\nkind = "python"\nmodule = "tests.fixtures.ray_tools:TOOLS"\n'
        'placement = "ray"\nray = { num_cpus = 1 }\n'
    )
    toolkit = load_manifest(manifest).toolkit()
    async with Host(toolkit, owns_toolkit=True) as host:
        client = await connect_async(host)
        result = await client.call_tool("where", {"steps": 1})
        assert result.success and result.data["pid"] != os.getpid()
        await client.close()


def test_placement_settings_are_checked(tmp_path: Path) -> None:
    manifest = tmp_path / "toolmesh.toml"
    entry = '[[tools]]\nkind = "python"\nmodule = "tests.fixtures.ray_tools:TOOLS"\n'
    manifest.write_text(entry + 'placement = "moon"\n')
    with pytest.raises(ConfigError, match='placement must be "local" or "ray"'):
        load_manifest(manifest)
    manifest.write_text(entry + 'placement = "ray"\nray = { cpus = 2 }\n')
    with pytest.raises(ConfigError, match=r"tools\[0\].*unknown Ray option\(s\) cpus"):
        load_manifest(manifest)
    manifest.write_text(entry + "ray = { num_cpus = 2 }\n")
    with pytest.raises(ConfigError, match='need placement = "ray"'):
        load_manifest(manifest)
    with pytest.raises(ConfigError, match="unknown Ray option"):
        OnRay(Toolkit(), gpus=1)  # type: ignore[arg-type]


STARTS_ITS_OWN = """
import asyncio, os, shutil, sys, tempfile
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # stay on 127.0.0.1
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import ray
from tests.fixtures import ray_tools
from toolmesh import Toolkit
from toolmesh.sources.functions import tools_of
from toolmesh.sources.ray import OnRay

TEMP = tempfile.mkdtemp(prefix="tm-ray-")

async def main() -> None:
    options = {
        "num_cpus": 1,
        "include_dashboard": False,
        "object_store_memory": 100 * 1024 * 1024,
        "_temp_dir": TEMP,  # short: Ray's socket paths must fit in 107 bytes
        "_node_ip_address": "127.0.0.1",
    }
    kit = Toolkit(OnRay(tools_of(ray_tools.TOOLS), address="local", init_options=options))
    await kit.start()
    result = await kit.execute("where", {"steps": 1})
    assert result.success, result
    await kit.close()
    print("initialized after close:", ray.is_initialized())

try:
    asyncio.run(main())
finally:
    shutil.rmtree(TEMP, ignore_errors=True)
"""


def test_a_ray_it_started_is_stopped_when_it_closes() -> None:
    """A host that started Ray itself (no cluster was running) stops it when its last Ray
    source closes: the local cluster's processes must not outlive it."""
    done = _run_script(STARTS_ITS_OWN)
    assert "initialized after close: False" in done.stdout


async def test_sys_exit_on_a_worker_fails_its_call_not_the_host(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """A tool calling sys.exit() on its Ray worker was shipped back as SystemExit and raised in
    the host, which then left the caller (and the host's loop) instead of answering. A result
    that cannot travel back was "failed before running the tool" with Ray's coloured
    traceback as the error a model reads."""

    @tool
    def leave(code: int) -> str:
        """Exit the worker's tool with ``code``."""
        raise SystemExit(code)

    @tool
    def opaque() -> Any:
        """Return a value that cannot travel back (a lock)."""
        import threading

        return threading.Lock()

    host = Host(OnRay(tools_of([leave, opaque])), audit=tmp_path / "audit.db")
    client = await connect_async(host, agent_id="tester")
    try:
        result = await client.call_tool("leave", {"code": 3})
        assert (result.success, result.error_code) == (False, "tool_error")
        assert "SystemExit: 3" in (result.error or "")
        odd = await client.call_tool("opaque", {})  # it ran; its result could not travel
        assert odd.error_code == "tool_error"
        assert "cannot pickle" in (odd.error or "") and "\x1b" not in (odd.error or "")
        assert "before running the tool" not in (odd.error or "")
        print("OPAQUE", repr(odd.error))
        again = await client.call_tool("leave", {"code": 0})
        assert again.error_code == "tool_error"  # the host still answers
    finally:
        await client.close()
        await host.close()
    entries = await SqliteStore(tmp_path / "audit.db").recent_audit(10)
    assert [e.tool_name for e in entries].count("leave") == 2


CLOSED_WHILE_CONNECTING = """
import asyncio, os, shutil, sys, tempfile, threading
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # stay on 127.0.0.1
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import ray
from tests.fixtures import ray_tools
from toolmesh import Toolkit
from toolmesh.sources.functions import tools_of
from toolmesh.sources.ray import OnRay

TEMP = tempfile.mkdtemp(prefix="tm-ray-")
OPTIONS = {
    "num_cpus": 1,
    "include_dashboard": False,
    "object_store_memory": 100 * 1024 * 1024,
    "_temp_dir": TEMP,  # short: Ray's socket paths must fit in 107 bytes
    "_node_ip_address": "127.0.0.1",
}

# The open's thread is held where it is about to connect (before it takes the lock), and
# Ray's start is held until the source's close is under way.
entered, release, finished = threading.Event(), threading.Event(), threading.Event()
starting, closing = threading.Event(), threading.Event()
connect, init, disconnect = OnRay._connect, ray.init, OnRay._disconnect

def held_connect(self, *args, **kwargs):
    entered.set()
    release.wait()
    try:
        return connect(self, *args, **kwargs)
    finally:
        finished.set()

def held_init(*args, **kwargs):
    starting.set()
    closing.wait()
    return init(*args, **kwargs)

def watched_disconnect(self):
    closing.set()  # the close has begun: it waits for the lock the connecting thread holds
    return disconnect(self)

def ray_processes():
    found = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and TEMP.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                found += 1
        except OSError:
            pass
    return found

def source():
    return OnRay(tools_of(ray_tools.TOOLS), address="local", init_options=OPTIONS)

async def main() -> None:
    # 1. A cancelled start closes its sources while the open's thread has not connected yet.
    OnRay._connect = held_connect
    kit = Toolkit(source())
    start = asyncio.ensure_future(kit.start())
    await asyncio.to_thread(entered.wait)
    start.cancel()
    try:
        await start
    except asyncio.CancelledError:
        pass
    await kit.close()  # (closes nothing again: the cancelled start closed its sources)
    release.set()  # the closes are done: now the thread connects
    await asyncio.to_thread(finished.wait)
    print("cancelled start:", ray.is_initialized(), ray_processes(), flush=True)
    if ray.is_initialized():
        ray.shutdown()

    # 2. Closed while the Ray it starts is starting: stopped as soon as it has started.
    OnRay._connect = connect
    ray.init, OnRay._disconnect = held_init, watched_disconnect
    placed = source()
    opening = asyncio.ensure_future(placed.open())
    await asyncio.to_thread(starting.wait)
    await placed.close()
    await opening
    print("closed while starting:", ray.is_initialized(), ray_processes(), flush=True)

try:
    asyncio.run(main())
finally:
    shutil.rmtree(TEMP, ignore_errors=True)
"""


def test_a_source_closed_while_it_connects_leaves_no_ray_running() -> None:
    """A close that took the connect lock before the open's thread did (a cancelled start,
    or another source connecting meanwhile) found nothing to stop; the thread then started a
    local Ray that nothing would ever stop."""
    done = _run_script(CLOSED_WHILE_CONNECTING)
    assert "cancelled start: False 0\n" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert "closed while starting: False 0\n" in done.stdout, (done.stdout, done.stderr[-2000:])


async def test_a_call_after_close_connects_to_no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call reaching a closed placement connected lazily, starting a local Ray that no
    close would stop."""
    connects: list[Any] = []
    monkeypatch.setattr(OnRay, "_connect", lambda self, closes=None: connects.append(closes))
    placed = OnRay(tools_of(ray_tools.TOOLS))
    await placed.close()
    where = next(t for t in placed.tools() if t.name == "where")
    with pytest.raises(RuntimeError, match="the Ray placement is closed"):
        await where.run({"steps": 1}, ToolContext(tool_name="where"))
    assert connects == []


def _run_script(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter (a Ray of its own, not the session's cluster)."""
    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done
