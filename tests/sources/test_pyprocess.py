"""The python kind, isolated: a package in its own virtual environment, over the JSON protocol."""

from __future__ import annotations

import asyncio
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.gate import PYTHON_GATE, PidGate, Snapshot, gone
from toolmesh import ConfigError, ToolEvent, Toolkit, create_toolkit, tool
from toolmesh.sources.pyprocess import PythonPackageSource, ensure_venv, sources_from_manifest

TOOL = """
import sys


def count(input):
    print("prints go to stderr, not the protocol")
    now = input["state"].get("context", {}).get("count", 0) + input["args"].get("by", 1)
    input["activity"]("counter", [{"op": "replace", "path": "/value", "value": now}])
    return {"output": {"count": now, "prefix": sys.prefix},
            "state_update": [{"op": "add", "path": "/context/count", "value": now}]}


async def where(input):
    try:
        import toolmesh  # noqa: F401
        seen = "toolmesh"
    except ImportError:
        seen = "alone"
    return {"output": seen}


def fail(input):
    raise KeyError("missing")


tools = [
    {"name": "count", "description": "Counts.", "execute": count,
     "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}}},
    {"name": "where", "description": "Says what it can import.", "execute": where,
     "parameters": {"type": "object", "properties": {}}},
    {"name": "fail", "description": "Fails.", "execute": fail,
     "parameters": {"type": "object", "properties": {}}},
]
"""


def package(folder: Path, dependencies: list[str] | None = None, body: str = TOOL) -> Path:
    (folder / "src" / "counter_tool").mkdir(parents=True)
    deps = ", ".join(f'"{d}"' for d in dependencies or [])
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "counter-tool"\nversion = "1.0"\ndependencies = [{deps}]\n'
    )
    (folder / "src" / "counter_tool" / "__init__.py").write_text(body)
    return folder


async def test_round_trip_with_state_and_events(tmp_path: Path) -> None:
    source = PythonPackageSource(package(tmp_path / "pkg"), cache_dir=tmp_path / "cache")
    async with await create_toolkit(tools=[source]) as kit:
        assert kit.names() == ["count", "where", "fail"], source.status
        events: list[ToolEvent] = []
        first = await kit.execute("count", {"by": 2}, on_event=events.append)
        assert first.success and first.data["count"] == 2, first
        assert [e.kind for e in events] == ["activity", "state"]
        second = await kit.execute("count", {})
        assert second.data["count"] == 3
        assert Path(second.data["prefix"]).parent == tmp_path / "cache"  # its own environment
        assert (await kit.execute("where", {})).data == "alone"  # toolmesh's packages are not there
        failed = await kit.execute("fail", {})
        assert not failed.success and "KeyError: 'missing'" in failed.error


def test_the_environment_is_cached_by_content(tmp_path: Path) -> None:
    first = ensure_venv([], tmp_path)
    assert ensure_venv([], tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built leftovers


@pytest.mark.slow
async def test_dependencies_are_installed_into_its_own_environment(tmp_path: Path) -> None:
    wheel = tmp_path / "tinydep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("tinydep.py", "ANSWER = 42\n")
        archive.writestr(
            "tinydep-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinydep\nVersion: 1.0\n"
        )
        archive.writestr(
            "tinydep-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr("tinydep-1.0.dist-info/RECORD", "")
    body = TOOL.replace(
        "def fail(input):",
        "def fail(input):\n    import tinydep\n    return {'output': tinydep.ANSWER}\n\n\ndef unused(input):",
    )
    folder = package(tmp_path / "pkg", [f"tinydep @ {wheel.as_uri()}"], body)
    source = PythonPackageSource(folder, cache_dir=tmp_path / "cache")
    async with await create_toolkit(tools=[source]) as kit:
        result = await kit.execute("fail", {})
        assert result.success and result.data == 42, (result, source.status)


async def test_broken_packages_fail_the_source(tmp_path: Path) -> None:
    no_project = PythonPackageSource(tmp_path / "nothing", cache_dir=tmp_path / "cache")
    bad_entry = PythonPackageSource(
        package(tmp_path / "pkg"), entry="counter_tool:nope", cache_dir=tmp_path / "cache"
    )
    async with await create_toolkit(tools=[no_project, bad_entry]) as kit:
        assert len(kit) == 0
    assert "no pyproject.toml" in no_project.status.reason
    assert "AttributeError" in bad_entry.status.reason


def test_manifest_entries(tmp_path: Path) -> None:
    (source,) = sources_from_manifest(
        {"kind": "python", "path": "tools/pkg", "entry": "m:tools"}, base_dir=tmp_path
    )
    assert isinstance(source, PythonPackageSource) and source.folder == tmp_path / "tools" / "pkg"
    with pytest.raises(ConfigError, match="unknown setting 'module'"):
        sources_from_manifest({"kind": "python", "path": "x", "module": "a:b"}, base_dir=tmp_path)


ODD = """
import sys


def leave(input):
    sys.exit(3)


def circular(input):
    loop = {}
    loop["loop"] = loop
    return {"output": loop}


def echo(input):
    return "echo"


tools = [{"name": n, "execute": f} for n, f in [("leave", leave), ("circular", circular)]]
tools += [{"name": "echo", "execute": echo}]
"""


async def test_sys_exit_and_an_output_that_is_not_json_answer_at_once(tmp_path: Path) -> None:
    source = PythonPackageSource(package(tmp_path / "pkg", body=ODD), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        left = await kit.execute("leave", {}, timeout=20)
        assert left.error_code == "tool_error" and "SystemExit: 3" in (left.error or ""), left
        circular = await kit.execute("circular", {}, timeout=20)
        assert circular.error_code == "tool_error" and "not JSON" in (circular.error or "")
        assert (await kit.execute("echo", {})).data == "echo"


async def test_a_worker_that_ends_says_how(tmp_path: Path) -> None:
    """The error said only "the worker exited": not the code it gave, nor the signal."""
    body = (
        "import os, signal\n"
        "def bye(input):\n    os._exit(4)\n"
        "def killed(input):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        'tools = [{"name": "bye", "execute": bye}, {"name": "killed", "execute": killed}]\n'
    )
    source = PythonPackageSource(package(tmp_path / "pkg", body=body), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        bye = await kit.execute("bye", {}, timeout=20)
        assert "the worker exited with code 4" in (bye.error or ""), bye
        killed = await kit.execute("killed", {}, timeout=20)
        assert "the worker exited (killed by SIGKILL)" in (killed.error or ""), killed


async def test_closing_ends_what_a_tool_started_outside_the_worker_s_group(
    tmp_path: Path,
) -> None:
    """The close killed the worker's process group only: a process a tool started in a session
    of its own (a daemon) outlived the toolkit."""
    from tests.sources.builtins.test_process import running_with

    body = (
        "import subprocess\n"
        "def spawn(input):\n"
        "    return {'output': subprocess.Popen(['sleep', input['args']['marker']],\n"
        "        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "        stderr=subprocess.DEVNULL).pid}\n"
        'marker = {"type": "object", "properties": {"marker": {"type": "string"}}}\n'
        'tools = [{"name": "spawn", "execute": spawn, "parameters": marker}]\n'
    )
    source = PythonPackageSource(package(tmp_path / "pkg", body=body), cache_dir=tmp_path / "c")
    marker = "300.4301"
    async with await create_toolkit(tools=[source]) as kit:
        spawned = await kit.execute("spawn", {"marker": marker}, timeout=20)
        assert spawned.success, spawned
        assert running_with(marker) != []
    assert running_with(marker) == []


async def test_tools_of_one_name_fail_the_source(tmp_path: Path) -> None:
    body = ODD + 'tools += [{"name": "echo", "execute": leave}]\n'
    source = PythonPackageSource(package(tmp_path / "pkg", body=body), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        assert len(kit) == 0
    assert "two tools are named 'echo'" in source.status.reason


async def test_parameters_that_are_no_json_schema_fail_only_their_source(tmp_path: Path) -> None:
    """``properties: 3`` raised AttributeError out of create_toolkit: every source was lost."""
    body = ODD + 'tools += [{"name": "odd", "execute": leave, "parameters": {"properties": 3}}]\n'
    source = PythonPackageSource(package(tmp_path / "pkg", body=body), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        assert len(kit) == 0
    assert source.status.state == "failed"
    assert "tool 'odd': its parameters are not a usable JSON Schema" in source.status.reason


@pytest.mark.parametrize(
    ("pyproject", "reason"),
    [("project = 5\n", "`project` must be a table"),
     ('[project]\nname = "p"\n[tool]\ntoolmesh = 5\n', "`tool.toolmesh` must be a table"),
     (b'[project]\nname = "\xff"\n', "can't decode")],
)  # fmt: skip
async def test_a_malformed_pyproject_fails_only_its_source(
    tmp_path: Path, pyproject: str | bytes, reason: str
) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    data = pyproject if isinstance(pyproject, bytes) else pyproject.encode()
    (folder / "pyproject.toml").write_bytes(data)
    source = PythonPackageSource(folder, cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        assert len(kit) == 0
    assert source.status.state == "failed" and reason in source.status.reason
    assert "pyproject.toml" in source.status.reason


ODDER = """
import math
import subprocess
import sys


def nan(input):
    return {"output": [math.nan, math.inf]}


def bad_update(input):
    return {"output": "kept", "state_update": {"op": "add", "path": "/context/n", "value": 1}}


def detach(input):
    # a child in a session of its own, holding the worker's stderr
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             stdin=subprocess.DEVNULL, start_new_session=True)
    return child.pid


tools = [{"name": n, "execute": f} for n, f in [("nan", nan), ("bad_update", bad_update),
                                                 ("detach", detach)]]
"""


async def test_nan_and_a_state_update_that_is_not_a_patch_are_refused(tmp_path: Path) -> None:
    source = PythonPackageSource(package(tmp_path / "pkg", body=ODDER), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        nan = await kit.execute("nan", {}, timeout=20)  # was the float nan, which no peer reads
        assert nan.error_code == "tool_error" and "not JSON" in (nan.error or ""), nan
        bad = await kit.execute("bad_update", {}, timeout=20)  # was dropped, the call a success
        assert bad.error_code == "invalid_state_update", bad
        assert bad.error == (
            "state_update must be a list of JSON Patch operations (objects), not an object"
        )
        assert bad.data == "kept"


CLOSE_WITH_A_DETACHED_CHILD = """
import asyncio, gc, os, signal, sys
from toolmesh import create_toolkit
from toolmesh.sources.pyprocess import PythonPackageSource

async def main():
    source = PythonPackageSource(sys.argv[1], cache_dir=sys.argv[2])
    async with await create_toolkit(tools=[source]) as kit:
        return (await kit.execute("detach", {}, timeout=20)).data

child = asyncio.run(main())
try:
    gc.collect()  # the loop is closed; the child still holds the pipe
finally:
    try:  # the close killed it too: ended here only if it was not reaped yet
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        pass
print("done", flush=True)
"""


def test_closing_beside_a_detached_child_prints_no_traceback(tmp_path: Path) -> None:
    # The child kept the worker's stderr open, so the pipe transport outlived the event loop
    # and asyncio printed "RuntimeError: Event loop is closed" with a traceback at exit.
    import subprocess
    import sys

    folder = package(tmp_path / "pkg", body=ODDER)
    script = tmp_path / "close.py"
    script.write_text(CLOSE_WITH_A_DETACHED_CHILD)
    done = subprocess.run(
        [sys.executable, str(script), str(folder), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert "Traceback" not in done.stderr, done.stderr


async def test_closing_while_the_worker_starts_stops_it(tmp_path: Path) -> None:
    # As for JavaScript packages (the same WorkerSource): close() did not see a worker that
    # had not sent its tools yet, and it went on running after the toolkit was closed.
    folder = package(tmp_path / "pkg", body=PYTHON_GATE + TOOL)
    before = Snapshot()
    async with PidGate() as gate:
        source = PythonPackageSource(
            folder, cache_dir=tmp_path / "cache", env={"GATE_PORT": str(gate.port)}
        )
        toolkit = Toolkit(source)
        starting = asyncio.ensure_future(toolkit.start())
        pid = await gate.arrival(starting)
        await toolkit.close()
        assert gone(pid)
        await starting
    assert source.status.state == "failed" and "closed" in source.status.reason
    assert await before.left() == (set(), set())


# A Python that builds environments slowly: `-m venv` makes what looks like one (a bin/python),
# reports to the gate and, once let go, hands over to the real Python; all else goes there at
# once.
SLOW_PYTHON = (
    """
import os, sys
REAL = "REAL_PYTHON"
if sys.argv[1:3] == ["-m", "venv"]:
    made = os.path.join(sys.argv[-1], "bin", "python")
    os.makedirs(os.path.dirname(made), exist_ok=True)
    open(made, "w").close()  # looks made, is not
"""
    + PYTHON_GATE.replace("\n", "\n    ")
    + """
    os.remove(made)
os.execv(REAL, [REAL, *sys.argv[1:]])
"""
)


async def test_closing_while_the_environment_is_built_kills_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The build (python -m venv, then pip: up to 15 minutes each) ran on in a thread after
    # the toolkit was closed.
    import sys

    folder = package(tmp_path / "pkg")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!{sys.executable}\n" + SLOW_PYTHON.replace("REAL_PYTHON", sys.executable))
    python.chmod(0o755)
    cache = tmp_path / "cache"
    before = Snapshot()
    async with PidGate() as gate:
        monkeypatch.setenv("GATE_PORT", str(gate.port))
        source = PythonPackageSource(folder, python=str(python), cache_dir=cache)
        toolkit = Toolkit(source)
        starting = asyncio.ensure_future(toolkit.start())
        pid = await gate.arrival(starting)
        [building] = cache.iterdir()
        assert building.name.startswith(".building-") and (building / "bin" / "python").exists()
        await toolkit.close()
        assert gone(pid)  # killed and reaped by the time close() returns
        await starting
        assert source.status.state == "failed" and "closed" in source.status.reason
        assert list(cache.iterdir()) == []  # the half-built environment is gone

        again = Toolkit(PythonPackageSource(folder, python=str(python), cache_dir=cache))
        starting = asyncio.ensure_future(again.start())
        gate.release(await gate.arrival(starting))  # built again, to its end this time
        async with await starting:
            result = await again.execute("count", {})
            assert result.success and result.data["count"] == 1, result
        [built] = cache.iterdir()
        assert Path(result.data["prefix"]) == built and not built.name.startswith(".")
    assert await before.left() == (set(), set())


# -- settings of the wrong kind are refused, never read as "no sandbox" ------------------------


@pytest.mark.parametrize("isolation", ["bwrap", "Bubblewrap", "sandbox", None])
def test_an_unknown_isolation_is_refused_not_run_unsandboxed(
    tmp_path: Path, isolation: object
) -> None:
    # Only "bubblewrap" was looked at: any other value ran the tool on the host, unsandboxed.
    with pytest.raises(ConfigError, match=r"isolation: .* is not one of 'none', 'bubblewrap'"):
        PythonPackageSource(tmp_path, isolation=isolation)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="isolation"):
        sources_from_manifest(
            {"kind": "python", "path": "pkg", "isolation": isolation}, base_dir=tmp_path
        )


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("network", "false", "network: expected bool, not str"),  # was true: --share-net
        ("network", 1, "network: expected bool, not int"),
        ("env", {"DEBUG": True}, "env: "),
        ("entry", 3, "entry: "),
        ("python", ["python3"], "python: "),
        ("name", 7, "name: "),
    ],
)
def test_settings_of_the_wrong_kind_are_refused_naming_them(
    tmp_path: Path, setting: str, value: object, says: str
) -> None:
    with pytest.raises(ConfigError, match=f"^python:pkg.{says}"):
        sources_from_manifest(
            {"kind": "python", "path": "pkg", "isolation": "bubblewrap", setting: value},
            base_dir=tmp_path,
        )


def hello() -> str:
    """Answers while a broken package fails beside it."""
    return "fine"


@pytest.mark.parametrize(
    ("python", "says"),
    [
        ("/bin/false", "returned non-zero exit status 1"),
        ("#!/bin/sh\necho 'this is no python' >&2; exit 3", "status 3.: this is no python"),
    ],
)
async def test_a_python_that_cannot_be_asked_its_version_fails_only_its_source(
    tmp_path: Path, python: str, says: str
) -> None:
    # Its CalledProcessError raised out of Toolkit.start: the whole toolkit failed.
    if python.startswith("#!"):
        script = tmp_path / "bin" / "python"
        script.parent.mkdir()
        script.write_text(python)
        script.chmod(0o755)
        python = str(script)
    broken = PythonPackageSource(package(tmp_path / "pkg"), python=python, cache_dir=tmp_path)
    async with Toolkit(tool(hello), broken) as kit:
        assert (await kit.execute("hello", {})).data == "fine"
        assert kit.names() == ["hello"]
    assert broken.status.state == "failed"
    assert broken.status.reason.startswith("python:pkg: Command ")
    assert says in broken.status.reason


async def test_isolation_without_bubblewrap_fails_only_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SandboxUnavailable raised out of Toolkit.start: the whole toolkit failed.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no bwrap on it
    source = PythonPackageSource(
        package(tmp_path / "pkg"), isolation="bubblewrap", cache_dir=tmp_path / "cache"
    )
    async with Toolkit(tool(hello), source) as kit:
        assert kit.names() == ["hello"]
    assert source.status.state == "failed"
    assert "isolation needs bubblewrap, which is not installed" in source.status.reason


DAEMON = """
import os, subprocess
def spawn(input):
    # The intermediate shell exits at once: the sleeper loses its parent, has a session of
    # its own and an empty environment (no TOOLMESH_RUN mark). Its pid stays the same
    # through setsid and env, which exec what they run.
    done = subprocess.run(["/bin/sh", "-c", "setsid env -i sleep 300.4302"
                           " </dev/null >/dev/null 2>&1 & echo $!"],
                          start_new_session=True, env={}, capture_output=True, text=True)
    return {"output": int(done.stdout)}
def bye(input):
    os._exit(4)
tools = [{"name": "spawn", "execute": spawn}, {"name": "bye", "execute": bye}]
"""


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")


async def test_closing_ends_a_daemon_that_dropped_its_parent_session_and_mark(
    tmp_path: Path,
) -> None:
    """Found neither by session, live parent nor environment mark, it outlived the toolkit."""
    source = PythonPackageSource(package(tmp_path / "pkg", body=DAEMON), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        spawned = await kit.execute("spawn", {}, timeout=20)
        assert spawned.success and running(spawned.data), spawned
    assert not running(spawned.data)


async def test_a_worker_that_ends_by_itself_ends_the_daemons_it_left(tmp_path: Path) -> None:
    source = PythonPackageSource(package(tmp_path / "pkg", body=DAEMON), cache_dir=tmp_path / "c")
    async with await create_toolkit(tools=[source]) as kit:
        spawned = await kit.execute("spawn", {}, timeout=20)
        assert spawned.success and running(spawned.data), spawned
        ended = await kit.execute("bye", {}, timeout=20)
        assert "the worker exited with code 4" in (ended.error or ""), ended
        assert not running(spawned.data)  # before any close
        again = await kit.execute("spawn", {}, timeout=20)
        assert again.success and running(again.data), again  # a fresh worker
    assert not running(again.data)


FORKING = """
import multiprocessing, subprocess, sys

def _exit_five():
    import os
    os._exit(5)

def forked(input):
    process = multiprocessing.get_context("fork").Process(target=_exit_five)
    process.start()
    process.join(20)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        squares = pool.map(abs, [-1, -2, -3])
    heard = subprocess.run([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"],
                           capture_output=True, text=True).stdout.strip()
    return {"output": {"exitcode": process.exitcode, "pool": squares, "stdin": heard}}

tools = [{"name": "forked", "description": "Forks.", "execute": forked,
          "parameters": {"type": "object", "properties": {}}}]
"""


async def test_a_tool_may_fork_and_its_children_read_no_calls(tmp_path: Path) -> None:
    """multiprocessing's fork start hung (the child closed sys.stdin, whose lock the runner's
    reading thread held), and a subprocess inherited the calls' pipe as its stdin."""
    source = PythonPackageSource(
        package(tmp_path / "pkg", body=FORKING), cache_dir=tmp_path / "cache"
    )
    async with await create_toolkit(tools=[source]) as kit:
        result = await kit.execute("forked", {}, timeout=60)
        assert result.success, result
        assert result.data == {"exitcode": 5, "pool": [1, 2, 3], "stdin": "''"}
        assert (await kit.execute("forked", {}, timeout=60)).success  # the worker reads on
