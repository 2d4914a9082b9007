"""The javascript kind: packages run by Node.js with limited permissions, state and events."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.fixtures.gate import NODE_GATE, PYTHON_GATE, PidGate, Snapshot, gone
from tests.sources.builtins.conftest import requires_bwrap
from toolmesh import ConfigError, ToolEvent, Toolkit, create_toolkit
from toolmesh.sources.javascript import JavaScriptSource, sources_from_manifest

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")

COUNTER = """
import fs from "node:fs";
export default {
  name: "counter",
  description: "Adds to a counter kept in the session state.",
  parameters: { type: "object", properties: { by: { type: "integer" } }, required: ["by"] },
  async execute({ args, state, activity, emit }) {
    console.log("tool output goes to stderr, not the protocol");
    const now = (state.context?.count ?? 0) + args.by;
    activity("counter", [{ op: "replace", path: "/value", value: now }]);
    emit("progress", { pct: 100, message: "done" });
    return { output: { count: now }, state_update: [{ op: "add", path: "/context/count", value: now }] };
  },
};
"""

PROBE = """
import fs from "node:fs";
import { execSync } from "node:child_process";
const attempt = (fn) => { try { fn(); return "allowed"; } catch (e) { return e.code || e.message; } };
export const tools = [{
  name: "probe",
  description: "Tries what it should not be able to do.",
  parameters: { type: "object", properties: { target: { type: "string" } } },
  execute({ args }) {
    return { output: {
      read: attempt(() => fs.readFileSync(args.target)),
      write: attempt(() => fs.writeFileSync(args.target + ".pwned", "x")),
      spawn: attempt(() => execSync("true")),
    } };
  },
}, {
  name: "fail",
  description: "Throws.",
  parameters: { type: "object", properties: {} },
  execute() { throw new TypeError("bad thing"); },
}];
"""


def package(folder: Path, source: str, entry: str = "index.mjs") -> Path:
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(
        json.dumps({"name": folder.name, "main": entry, "type": "module"})
    )
    (folder / entry).write_text(source)
    return folder


async def test_round_trip_with_state_and_activity(tmp_path: Path) -> None:
    source = JavaScriptSource(package(tmp_path / "counter", COUNTER))
    async with await create_toolkit(tools=[source]) as kit:
        assert kit["counter"].definition.kind == "javascript"
        assert kit["counter"].input_schema["required"] == ["by"]
        events: list[ToolEvent] = []
        first = await kit.execute("counter", {"by": 2}, on_event=events.append)
        assert first.success and first.data == {"count": 2}, first
        assert [e.kind for e in events] == ["activity", "progress", "state"]
        assert events[0].data == {
            "activity_type": "counter",
            "patch": [{"op": "replace", "path": "/value", "value": 2}],
        }
        second = await kit.execute("counter", {"by": 3})
        assert second.data == {"count": 5}  # it read the state the first call left
        bad = await kit.execute("counter", {"by": "x"})
        assert bad.error_code == "invalid_arguments"
    # `async with` on a started toolkit opened no second worker: none is left running
    assert _processes_naming(tmp_path / "counter") == []


def _processes_naming(folder: Path) -> list[int]:
    """The live processes whose command line names ``folder``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder).encode() in command and state != "Z":
            found.append(int(entry))
    return found


async def test_permissions_are_limited(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    source = JavaScriptSource(package(tmp_path / "probe", PROBE))
    async with await create_toolkit(tools=[source]) as kit:
        result = await kit.execute("probe", {"target": str(secret)})
        assert result.data == {
            "read": "ERR_ACCESS_DENIED",
            "write": "ERR_ACCESS_DENIED",
            "spawn": "ERR_ACCESS_DENIED",
        }
        failed = await kit.execute("fail", {})
        assert not failed.success and "TypeError: bad thing" in failed.error
    assert not (tmp_path / "secret.txt.pwned").exists()


async def test_a_stuck_call_is_killed_and_the_worker_restarts(tmp_path: Path) -> None:
    stuck = COUNTER.replace(
        "async execute(",
        "async execute(input) { if (input.args.by < 0) { while (true) {} } return this.run(input); },\n  async run(",
    )
    source = JavaScriptSource(package(tmp_path / "stuck", stuck))
    async with await create_toolkit(tools=[source]) as kit:
        hung = await kit.execute("counter", {"by": -1}, timeout=0.5)
        assert hung.error_code == "timeout"
        again = await kit.execute("counter", {"by": 1})
        assert again.success and again.data == {"count": 1}


async def test_broken_packages_fail_the_source_not_the_toolkit(tmp_path: Path) -> None:
    missing = JavaScriptSource(tmp_path / "nowhere")
    broken = JavaScriptSource(package(tmp_path / "broken", "export default 42;"))
    syntax = JavaScriptSource(package(tmp_path / "syntax", "export default {"))
    async with await create_toolkit(tools=[missing, broken, syntax]) as kit:
        assert len(kit) == 0
    assert missing.status.state == "failed" and "no package.json" in missing.status.reason
    assert "must export a tool" in broken.status.reason
    assert "SyntaxError" in syntax.status.reason


ESBUILD = Path(sys.prefix) / "node" / "node_modules" / ".bin" / "esbuild"
needs_esbuild = pytest.mark.skipif(
    not ESBUILD.exists() and not os.environ.get("CI"), reason="make setup installs esbuild"
)


def ts_package(folder: Path, index: str) -> Path:
    """A TypeScript package at ``folder`` whose entry, index.ts, is ``index``."""
    folder.mkdir()
    (folder / "package.json").write_text(json.dumps({"name": "ts", "main": "index.ts"}))
    (folder / "index.ts").write_text(index)
    return folder


@needs_esbuild
async def test_typescript_is_bundled_with_esbuild(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    folder.mkdir()
    (folder / "package.json").write_text(json.dumps({"name": "ts", "main": "src/index.ts"}))
    (folder / "src").mkdir()
    (folder / "src" / "double.ts").write_text(
        "export const double = (n: number): number => n * 2;\n"
    )
    (folder / "src" / "index.ts").write_text(
        'import { double } from "./double";\n'
        "interface Input { args: { n: number } }\n"
        'export default { name: "double", description: "Doubles.", '
        'parameters: { type: "object", properties: { n: { type: "number" } } },\n'
        "  execute: ({ args }: Input) => ({ output: double(args.n) }) };\n"
    )
    source = JavaScriptSource(folder, esbuild=str(ESBUILD), cache_dir=tmp_path / "cache")
    async with await create_toolkit(tools=[source]) as kit:
        result = await kit.execute("double", {"n": 21})
        assert result.data == 42, source.status


def leaking_package(tmp_path: Path) -> tuple[Path, Path]:
    """A TypeScript package whose tool ``leak`` imports ../private/secret.txt, and that folder."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.txt").write_text("TOP SECRET")
    folder = ts_package(
        tmp_path / "ts",
        'import secret from "../private/secret.txt";\n'
        'export default { name: "leak", description: "Leaks.", '
        'parameters: { type: "object" }, execute: () => ({ output: secret }) };\n',
    )
    return folder, private


@needs_esbuild
async def test_a_typescript_import_from_outside_what_the_tool_may_read_fails_the_source(
    tmp_path: Path,
) -> None:
    """esbuild runs with the host's rights: importing ../private/secret.txt baked that file
    into the bundle, and the tool read it."""
    folder, private = leaking_package(tmp_path)
    source = JavaScriptSource(folder, esbuild=str(ESBUILD), cache_dir=tmp_path / "cache")
    async with await create_toolkit(tools=[source]) as kit:
        assert len(kit) == 0
    assert source.status.state == "failed"
    assert "secret.txt" in source.status.reason and "allow_read" in source.status.reason
    granted = JavaScriptSource(
        folder, esbuild=str(ESBUILD), cache_dir=tmp_path / "cache", allow_read=[str(private)]
    )
    async with await create_toolkit(tools=[granted]) as kit:
        assert (await kit.execute("leak")).data == "TOP SECRET"


@needs_esbuild
async def test_a_cached_bundle_is_checked_against_each_sources_own_grants(tmp_path: Path) -> None:
    """The cache is keyed by the package's content: a bundle built by a source granted the
    private folder was used as it was by one that is not, and gave it the file."""
    folder, private = leaking_package(tmp_path)
    cache = tmp_path / "cache"
    granted = JavaScriptSource(
        folder, esbuild=str(ESBUILD), cache_dir=cache, allow_read=[str(private)]
    )
    async with await create_toolkit(tools=[granted]) as kit:
        assert (await kit.execute("leak")).data == "TOP SECRET"
    ungranted = JavaScriptSource(folder, esbuild=str(ESBUILD), cache_dir=cache)
    async with await create_toolkit(tools=[ungranted]) as kit:
        assert len(kit) == 0
    assert ungranted.status.state == "failed"
    assert "secret.txt" in ungranted.status.reason

    # A granted file changed since the build: the bundle is built again, not served stale.
    secret = private / "secret.txt"
    secret.write_text("NEW SECRET")
    os.utime(secret, ns=(secret.stat().st_atime_ns, secret.stat().st_mtime_ns + 10**9))
    again = JavaScriptSource(
        folder, esbuild=str(ESBUILD), cache_dir=cache, allow_read=[str(private)]
    )
    async with await create_toolkit(tools=[again]) as kit:
        assert (await kit.execute("leak")).data == "NEW SECRET"


@needs_esbuild
async def test_a_cached_bundle_with_no_metafile_beside_it_is_built_again(tmp_path: Path) -> None:
    """A bundle an earlier toolmesh cached has no record of its inputs to check."""
    folder = ts_package(
        tmp_path / "ts",
        'export default { name: "hi", description: "Hi.", '
        'parameters: { type: "object" }, execute: () => ({ output: "hi" }) };\n',
    )
    cache = tmp_path / "cache"
    async with await create_toolkit(
        tools=[JavaScriptSource(folder, esbuild=str(ESBUILD), cache_dir=cache)]
    ) as kit:
        assert (await kit.execute("hi")).data == "hi"
    [bundle] = cache.glob("*.mjs")
    bundle.with_suffix(".meta.json").unlink()
    bundle.write_text(
        'export default { name: "hi", description: "Hi.", '
        'parameters: { type: "object" }, execute: () => ({ output: "old" }) };\n'
    )
    async with await create_toolkit(
        tools=[JavaScriptSource(folder, esbuild=str(ESBUILD), cache_dir=cache)]
    ) as kit:
        assert (await kit.execute("hi")).data == "hi"
    assert bundle.with_suffix(".meta.json").is_file()


@needs_esbuild
async def test_a_typescript_package_loads_with_a_cache_folder_reached_through_a_link(
    tmp_path: Path,
) -> None:
    """The cache folder was used as given: through a symlink, the bundle's folder failed the
    symlink check (and Node's read grant, before it)."""
    folder = ts_package(
        tmp_path / "ts",
        'export default { name: "hi", description: "Hi.", '
        'parameters: { type: "object" }, execute: () => ({ output: "hi" }) };\n',
    )
    (tmp_path / "real-cache").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "real-cache")
    source = JavaScriptSource(folder, esbuild=str(ESBUILD), cache_dir=tmp_path / "cache")
    async with await create_toolkit(tools=[source]) as kit:
        assert (await kit.execute("hi")).data == "hi", source.status


def test_manifest_entries(tmp_path: Path) -> None:
    package(tmp_path / "tools" / "counter", COUNTER)
    (source,) = sources_from_manifest(
        {"kind": "javascript", "path": "tools/counter", "allow_read": ["data"]}, base_dir=tmp_path
    )
    assert isinstance(source, JavaScriptSource) and source.folder == tmp_path / "tools" / "counter"
    assert source.allow_read == [str(tmp_path / "data")]

    with pytest.raises(ConfigError, match="needs `path`"):
        sources_from_manifest({"kind": "javascript"}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        sources_from_manifest({"kind": "javascript", "path": "x", "colour": 1}, base_dir=tmp_path)


GATED = """
let release;
const gate = new Promise((resolve) => { release = resolve; });
const none = { type: "object", properties: {} };
export default [
  { name: "wait_gate", description: "Answers once the gate opens.", parameters: none,
    async execute() { await gate; return { output: process.pid }; } },
  { name: "open_gate", description: "Opens the gate.", parameters: none,
    execute() { release(); return { output: process.pid }; } },
  { name: "pid", description: "The worker's pid.", parameters: none,
    execute() { return { output: process.pid }; } },
  { name: "hang", description: "Never answers.", parameters: none,
    execute() { return new Promise(() => {}); } },
  { name: "huge", description: "Answers more than the 32 MiB a message may have.",
    parameters: none, execute() { return { output: "y".repeat(33 * 1024 * 1024) }; } },
];
"""


async def test_a_timed_out_call_leaves_the_other_calls_on_the_worker_running(
    tmp_path: Path,
) -> None:
    source = JavaScriptSource(package(tmp_path / "gated", GATED))
    async with await create_toolkit(tools=[source]) as kit:
        waiting = asyncio.ensure_future(kit.execute("wait_gate", {}, timeout=60))
        pid = (await kit.execute("pid", {})).data  # meanwhile wait_gate reached the worker
        hung = await kit.execute("hang", {}, timeout=0.5)
        assert hung.error_code == "timeout", hung
        opened = await kit.execute("open_gate", {})
        assert opened.success and opened.data == pid  # the same worker, still running
        waited = await waiting
        assert waited.success and waited.data == pid, waited
        # Idle now, and still owing the abandoned call: it was replaced.
        assert gone(pid)
        again = await kit.execute("pid", {})
        assert again.success and again.data != pid


async def test_an_oversize_answer_fails_its_call_at_once(tmp_path: Path) -> None:
    source = JavaScriptSource(package(tmp_path / "gated", GATED))
    async with await create_toolkit(tools=[source]) as kit:
        waiting = asyncio.ensure_future(kit.execute("wait_gate", {}, timeout=60))
        pid = (await kit.execute("pid", {})).data
        huge = await kit.execute("huge", {}, timeout=60)
        assert huge.error_code == "tool_error", huge
        assert "too large" in (huge.error or "") and "32 MiB" in (huge.error or "")
        # The message was skipped, not the worker: the other call and later ones go on.
        assert (await kit.execute("open_gate", {})).data == pid
        assert (await waiting).data == pid
        assert (await kit.execute("pid", {})).data == pid


async def test_a_rejected_tool_list_leaves_no_worker_running(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    source = JavaScriptSource(
        package(
            tmp_path / "badparams",
            'import fs from "node:fs";\n'
            "fs.writeFileSync(process.env.PID_FILE, String(process.pid));\n"
            'export default { name: "bp", description: "", parameters: "notaschema",\n'
            "  execute() { return { output: 1 }; } };\n",
        ),
        allow_write=[str(out)],
        env={"PID_FILE": str(out / "pid")},
    )
    async with await create_toolkit(tools=[source]) as kit:
        assert len(kit) == 0
        assert source.status.state == "failed" and "'parameters'" in source.status.reason
        pid = int((out / "pid").read_text())
        assert gone(pid)
    assert gone(pid)


async def test_a_package_json_that_is_not_an_object_fails_only_its_source(
    tmp_path: Path,
) -> None:
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "package.json").write_text("[1, 2]")
    broken = JavaScriptSource(listed)
    counter = JavaScriptSource(package(tmp_path / "counter", COUNTER))
    async with await create_toolkit(tools=[broken, counter]) as kit:
        assert broken.status.state == "failed"
        assert "must hold a JSON object, not list" in broken.status.reason
        assert (await kit.execute("counter", {"by": 1})).data == {"count": 1}


PID = '{ name: "pid", description: "", execute() { return process.pid; } }'


async def test_tools_of_one_name_fail_the_source(tmp_path: Path) -> None:
    # The runner would run the second under the first one's definition.
    twice = JavaScriptSource(package(tmp_path / "twice", f"export const tools = [{PID}, {PID}];"))
    async with await create_toolkit(tools=[twice]) as kit:
        assert len(kit) == 0
        assert twice.status.state == "failed" and "two tools are named 'pid'" in (
            twice.status.reason
        )


async def test_a_package_may_export_a_promise_of_its_tools(tmp_path: Path) -> None:
    source = JavaScriptSource(
        package(tmp_path / "later", f"export default Promise.resolve({PID});")
    )
    async with await create_toolkit(tools=[source]) as kit:
        assert (await kit.execute("pid", {})).success, source.status


async def test_whatever_is_thrown_fails_only_its_call(tmp_path: Path) -> None:
    thrower = (
        "export const tools = ["
        f"{PID},"
        '{ name: "bare", description: "", execute() { throw Object.create(null); } },'
        '{ name: "plain", description: "", execute() { throw { code: 42 }; } },'
        '{ name: "stray", description: "",'
        '  execute() { Promise.reject(new Error("in the background")); return 1; } }];'
    )
    source = JavaScriptSource(package(tmp_path / "thrower", thrower))
    async with await create_toolkit(tools=[source]) as kit:
        pid = (await kit.execute("pid", {})).data
        bare = await kit.execute("bare", {})
        assert bare.error_code == "tool_error" and "exited" not in (bare.error or ""), bare
        plain = await kit.execute("plain", {})
        assert plain.error_code == "tool_error" and '{"code":42}' in (plain.error or "")
        assert (await kit.execute("stray", {})).data == 1
        assert (await kit.execute("pid", {})).data == pid  # the same worker throughout


async def test_the_tools_own_writes_to_stdout_do_not_break_the_protocol(tmp_path: Path) -> None:
    writer = (
        'import fs from "node:fs";\n'
        'export default { name: "write", description: "", execute() {\n'
        '  fs.writeSync(process.stdout.fd, "through process.stdout.fd, no newline");\n'
        '  fs.writeSync(1, "straight to fd 1, no newline");\n'
        "  process.stdout.end();\n"
        '  return "answer"; } };\n'
    )
    source = JavaScriptSource(package(tmp_path / "writer", writer))
    async with await create_toolkit(tools=[source]) as kit:
        first = await kit.execute("write", {}, timeout=30)
        assert first.success and first.data == "answer", first
        again = await kit.execute("write", {}, timeout=30)
        assert again.success and again.data == "answer", again


@pytest.mark.parametrize(
    ("manifest", "entry"),
    [
        ({"main": "lib"}, "lib/index.js"),  # a folder
        ({"main": "dist/tool"}, "dist/tool.js"),  # no extension
        ({"exports": {".": {"import": {"types": "./t.d.ts", "default": "./dist/i.mjs"}}}},
         "dist/i.mjs"),  # nested conditions
        ({"exports": ["./dist/i.mjs"]}, "dist/i.mjs"),  # fallbacks
    ],
)  # fmt: skip
async def test_the_entry_is_found_as_node_finds_it(
    tmp_path: Path, manifest: dict[str, object], entry: str
) -> None:
    folder = tmp_path / "pkg"
    (folder / entry).parent.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps(manifest))
    common_js = entry.endswith(".js")
    (folder / entry).write_text(
        f"module.exports = {PID};" if common_js else f"export default {PID};"
    )
    source = JavaScriptSource(folder)
    async with await create_toolkit(tools=[source]) as kit:
        assert (await kit.execute("pid", {})).success, source.status


async def test_a_package_json_may_start_with_a_bom(tmp_path: Path) -> None:
    folder = package(tmp_path / "bom", f"export default {PID};")
    manifest = folder / "package.json"
    manifest.write_bytes(b"\xef\xbb\xbf" + manifest.read_bytes())  # as Node, which accepts it
    source = JavaScriptSource(folder)
    async with await create_toolkit(tools=[source]) as kit:
        assert (await kit.execute("pid", {})).success, source.status


SHAPES = """
export default [
  { name: "nothing", parameters: { type: "object" }, execute() { return null; } },
  { name: "undefined", parameters: { type: "object" }, execute() {} },
  { name: "one_op", parameters: { type: "object" },
    execute() { return { output: "kept", state_update: { op: "add", path: "/context/n", value: 1 } }; } },
  { name: "texts", parameters: { type: "object" },
    execute() { return { output: 1, state_update: ["add /context/n"] }; } },
];
"""


async def test_null_outputs_and_state_updates_that_are_not_patches(tmp_path: Path) -> None:
    source = JavaScriptSource(package(tmp_path / "shapes", SHAPES))
    async with await create_toolkit(tools=[source]) as kit:
        for name in ("nothing", "undefined"):  # were `{}`; a Python tool's None is null
            result = await kit.execute(name, {})
            assert result.success and result.data is None, result
        one_op = await kit.execute("one_op", {})  # was dropped, the call a success
        assert one_op.error_code == "invalid_state_update" and one_op.data == "kept", one_op
        assert one_op.error == (
            "state_update must be a list of JSON Patch operations (objects), not an object"
        )
        texts = await kit.execute("texts", {})  # was a pydantic dump as a tool_error
        assert texts.error_code == "invalid_state_update", texts
        assert texts.error.endswith("not a list holding a string")


# -- nothing is left behind: a worker still starting, opened twice, or restarting at close -----

GATED_START = (
    NODE_GATE
    + """
const none = { type: "object", properties: {} };
export default gate.then(() => [
  { name: "pid", description: "The worker's pid.", parameters: none,
    execute() { return process.pid; } },
  { name: "crash", description: "Exits the worker.", parameters: none,
    execute() { process.exit(3); } },
]);
"""
)


def gated(folder: Path, gate: PidGate) -> JavaScriptSource:
    """A package that reports to ``gate`` as it loads and sends its tools once let go."""
    return JavaScriptSource(package(folder, GATED_START), env={"GATE_PORT": str(gate.port)})


async def test_closing_while_the_worker_starts_stops_it(tmp_path: Path) -> None:
    # The worker was the source's only once it sent its tools: close() did not see it, and it
    # went on running (and, once ready, serving) after the toolkit was closed.
    before = Snapshot()
    async with PidGate() as gate:
        source = gated(tmp_path / "slow", gate)
        toolkit = Toolkit(source)
        starting = asyncio.ensure_future(toolkit.start())
        pid = await gate.arrival(starting)
        await toolkit.close()
        assert gone(pid)  # stopped and reaped by the time close() returns
        await starting  # the start ends too, without an error of its own
    assert source.status.state == "failed" and "closed" in source.status.reason
    assert await before.left() == (set(), set())


async def test_a_cancelled_open_stops_the_worker_it_was_starting(tmp_path: Path) -> None:
    # Cancelled while it waited for the tool list (a timeout around create_toolkit, say), the
    # start left the process and its pipes and reader tasks behind.
    before = Snapshot()
    async with PidGate() as gate:
        source = gated(tmp_path / "slow", gate)
        opening = asyncio.ensure_future(source.open())
        pid = await gate.arrival(opening)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert gone(pid)
    assert await before.left() == (set(), set())


async def test_opening_twice_starts_one_worker(tmp_path: Path) -> None:
    # A second open() started a second worker over the first, which nothing closed.
    before = Snapshot()
    folder = tmp_path / "twice"
    async with PidGate(release_all=True) as gate:
        source = gated(folder, gate)
        await source.open()
        await source.open()
        await asyncio.gather(source.open(), source.open())
        assert source.status.state == "connected", source.status
        [pid] = _processes_naming(folder)
        await source.close()
        assert gone(pid) and _processes_naming(folder) == []
    assert await before.left() == (set(), set())


async def test_closing_while_a_call_restarts_the_worker_stops_it(tmp_path: Path) -> None:
    # The call's restart finished after close() and kept its worker: running, and serving
    # the call, after the toolkit had closed.
    before = Snapshot()
    async with PidGate() as gate:
        source = gated(tmp_path / "restart", gate)
        toolkit = Toolkit(source)
        starting = asyncio.ensure_future(toolkit.start())
        first = await gate.arrival(starting)
        gate.release(first)
        await starting
        crashed = await toolkit.execute("crash", {})
        assert not crashed.success and "exited with code 3" in (crashed.error or ""), crashed
        call = asyncio.ensure_future(toolkit.execute("pid", {}))
        restarted = await gate.arrival(call)  # the call is starting a fresh worker
        await source.close()  # the source itself (a toolkit's close ends its calls first)
        assert gone(first) and gone(restarted)
        result = await call
        await toolkit.close()
    assert not result.success and "closed" in (result.error or ""), result
    assert await before.left() == (set(), set())


async def test_a_cancelled_create_toolkit_leaves_no_worker_running(tmp_path: Path) -> None:
    async with PidGate() as gate:
        fast, slow = gated(tmp_path / "fast", gate), gated(tmp_path / "slow", gate)
        connected = asyncio.Event()
        fast.subscribe(lambda _source: connected.set())
        slow.subscribe(lambda _source: connected.set())
        creating = asyncio.ensure_future(create_toolkit(tools=[fast, slow]))
        first = await gate.arrival(creating)
        second = await gate.arrival(creating)
        gate.release(first)  # one source opens; the other is still starting
        await connected.wait()
        creating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await creating
        try:
            assert gone(second)  # the one still starting: stopped by its cancelled open
            assert gone(first)  # the one already open: nobody closes it
        finally:
            await fast.close()
            await slow.close()


# -- setup steps (npm install, esbuild) end with a close or a cancelled open -------------------


def command(path: Path, body: str) -> Path:
    """An executable Python script at ``path``, standing in for npm or esbuild."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


# Makes half an install, reports to the gate, and finishes the install once let go.
NPM = (
    """
import pathlib
half = pathlib.Path("node_modules", "dep")
half.mkdir(parents=True, exist_ok=True)  # an install under way: the package is not there yet
"""
    + PYTHON_GATE
    + """
(half / "package.json").write_text('{"name": "dep", "main": "index.js"}')
(half / "index.js").write_text("module.exports = 42;")
"""
)

USES_DEP = """
import answer from "dep";
export default { name: "answer", description: "", parameters: { type: "object" },
                 execute() { return answer; } };
"""


async def test_closing_while_npm_installs_kills_it_and_drops_the_half_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # npm ran in a thread, to its end (up to 10 minutes) after the toolkit was closed; and
    # a node_modules it left half made would have been taken for an install by the next open.
    folder = package(tmp_path / "deps", USES_DEP)
    (folder / "package.json").write_text(
        json.dumps({"name": "deps", "main": "index.mjs", "dependencies": {"dep": "1.0.0"}})
    )
    command(tmp_path / "bin" / "npm", NPM)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    before = Snapshot()
    async with PidGate() as gate:
        monkeypatch.setenv("GATE_PORT", str(gate.port))
        source = JavaScriptSource(folder)
        toolkit = Toolkit(source)
        starting = asyncio.ensure_future(toolkit.start())
        pid = await gate.arrival(starting)
        assert (folder / "node_modules" / "dep").is_dir()  # half made
        await toolkit.close()
        assert gone(pid)  # killed and reaped by the time close() returns
        await starting
        assert source.status.state == "failed" and "closed" in source.status.reason
        assert not (folder / "node_modules").exists()
        assert sorted(p.name for p in folder.iterdir()) == ["index.mjs", "package.json"]

        again = Toolkit(JavaScriptSource(folder))  # installs again, and is let finish
        starting = asyncio.ensure_future(again.start())
        gate.release(await gate.arrival(starting))
        async with await starting:
            result = await again.execute("answer", {})
            assert result.success and result.data == 42, result
    assert await before.left() == (set(), set())


# Writes half a bundle, reports to the gate, and writes the whole one once let go.
ESBUILD_STANDIN = (
    """
import sys
[outfile] = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--outfile=")]
with open(outfile, "w") as out:
    out.write("export default {")  # half written
"""
    + PYTHON_GATE
    + """
with open(outfile, "w") as out:
    out.write('export default { name: "built", description: "", parameters: { type: "object" },'
              ' execute() { return "bundled"; } };')
[metafile] = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--metafile=")]
with open(metafile, "w") as meta:  # what went into the bundle, written last as esbuild does
    meta.write('{"inputs": {"index.ts": {}}}')
"""
)


async def test_a_cancelled_open_kills_esbuild_and_keeps_no_partial_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # esbuild ran on in a thread after the open that started it was cancelled.
    folder = tmp_path / "ts"
    folder.mkdir()
    (folder / "package.json").write_text(json.dumps({"name": "ts", "main": "index.ts"}))
    (folder / "index.ts").write_text("export default {};\n")
    esbuild = str(command(tmp_path / "bin" / "esbuild", ESBUILD_STANDIN))
    cache = tmp_path / "cache"
    before = Snapshot()
    async with PidGate() as gate:
        monkeypatch.setenv("GATE_PORT", str(gate.port))
        source = JavaScriptSource(folder, esbuild=esbuild, cache_dir=cache)
        opening = asyncio.ensure_future(source.open())
        pid = await gate.arrival(opening)
        [partial] = cache.iterdir()
        assert partial.name.endswith(".tmp.mjs") and partial.read_text() == "export default {"
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert gone(pid)
        assert list(cache.iterdir()) == []  # neither the half-written file nor a bundle

        again = Toolkit(JavaScriptSource(folder, esbuild=esbuild, cache_dir=cache))
        starting = asyncio.ensure_future(again.start())
        gate.release(await gate.arrival(starting))  # bundled again, to its end this time
        async with await starting:
            result = await again.execute("built", {})
            assert result.success and result.data == "bundled", result
        bundle, meta = sorted(cache.iterdir(), key=lambda p: p.suffix != ".mjs")
        assert bundle.name.startswith("ts-") and not bundle.name.endswith(".tmp.mjs")
        assert meta.name == bundle.name.removesuffix(".mjs") + ".meta.json"
    assert await before.left() == (set(), set())


# -- what goes in and out of a call: values JSON cannot hold, background failures, stdin -------

NOT_JSON = """
const none = { type: "object", properties: {} };
const t = (name, execute) => ({ name, description: "", parameters: none, execute });
export default [
  t("pid", () => process.pid),
  t("nan", () => ({ output: { mean: NaN } })),
  t("infinity", () => [1, -Infinity]),
  t("bigint", () => ({ output: { id: 10n } })),
  t("bigint_update", () => ({ output: 1, state_update: [{ op: "add", path: "/n", value: 2n }] })),
  t("bigint_event", ({ emit }) => { emit("progress", { done: 1n }); return "emitted"; }),
  t("circle", () => { const a = {}; a.self = a; return a; }),
  t("collections", () => ({
    map: new Map([["a", 1]]), set: new Set([1, 2]), bytes: new Uint8Array([1, 2]), when: new Date(0),
  })),
  t("object_keys", () => new Map([[{}, 1]])),
];
"""


async def test_values_json_cannot_hold_fail_their_call_naming_where_they_are(
    tmp_path: Path,
) -> None:
    # NaN and Infinity were sent as null and a Map, a Set or a typed array as {} (or
    # {"0": ...}), all without a word; a BigInt failed as a bare "Do not know how to
    # serialize a BigInt", naming neither the answer nor where in it.
    source = JavaScriptSource(package(tmp_path / "notjson", NOT_JSON))
    async with await create_toolkit(tools=[source]) as kit:
        pid = (await kit.execute("pid", {})).data
        expected = {
            "nan": "output.mean is NaN, which JSON cannot hold",
            "infinity": "output[1] is -Infinity, which JSON cannot hold",
            "bigint": "output.id is a BigInt (10n), which JSON cannot hold",
            "bigint_update": "state_update[0].value is a BigInt (2n)",
            "circle": "TypeError: Converting circular structure to JSON",
            "object_keys": "output is a Map with an object key",
        }
        for name, message in expected.items():
            result = await kit.execute(name, {})
            assert result.error_code == "tool_error", result
            assert "the tool's answer is not JSON: " + message in (result.error or ""), result
        event = await kit.execute("bigint_event", {})  # emit() throws in the tool
        assert event.error_code == "tool_error", event
        assert 'the "progress" event is not JSON: data.done is a BigInt' in (event.error or "")
        collections = await kit.execute("collections", {})
        assert collections.success, collections
        assert collections.data == {
            "map": {"a": 1},
            "set": [1, 2],
            "bytes": [1, 2],
            "when": "1970-01-01T00:00:00.000Z",
        }
        assert (await kit.execute("pid", {})).data == pid  # the same worker throughout


BACKGROUND = """
const none = { type: "object", properties: {} };
export default [
  { name: "pid", description: "", parameters: none, execute() { return process.pid; } },
  { name: "timer_throws", description: "", parameters: none, execute() {
      // Both run in the order they were queued: the exception, then the answer.
      return new Promise((resolve) => {
        setImmediate(() => { throw new Error("in a timer"); });
        setImmediate(() => resolve(process.pid));
      });
  } },
];
"""


async def test_an_exception_in_the_tools_background_work_does_not_kill_the_worker(
    tmp_path: Path,
) -> None:
    # An exception thrown in a timer (no call's to catch) ended the worker, and with it every
    # call running on it; a stray rejection was already only logged.
    source = JavaScriptSource(package(tmp_path / "background", BACKGROUND))
    async with await create_toolkit(tools=[source]) as kit:
        pid = (await kit.execute("pid", {})).data
        result = await kit.execute("timer_throws", {}, timeout=30)
        assert result.success and result.data == pid, result
        assert (await kit.execute("pid", {})).data == pid


STDIN = """
const none = { type: "object", properties: {} };
export default [
  { name: "pid", description: "", parameters: none, execute() { return process.pid; } },
  { name: "read_stdin", description: "", parameters: none, execute() {
      return new Promise((resolve) => {
        let text = "";
        process.stdin.on("data", (chunk) => { text += chunk; });
        process.stdin.on("end", () => resolve(text));
      });
  } },
  { name: "close_stdin", description: "", parameters: none, execute() {
      process.stdin.pause();
      process.stdin.destroy();
      return "closed";
  } },
];
"""


async def test_the_tools_stdin_is_not_the_protocol_channel(tmp_path: Path) -> None:
    # process.stdin was the stream the calls come in on: a tool reading it saw the next calls
    # (and waited for an end that never came); one closing it ended the worker.
    source = JavaScriptSource(package(tmp_path / "stdin", STDIN))
    async with await create_toolkit(tools=[source]) as kit:
        pid = (await kit.execute("pid", {})).data
        read = await kit.execute("read_stdin", {}, timeout=30)
        assert read.success and read.data == "", read  # an empty stdin, as /dev/null
        closed = await kit.execute("close_stdin", {}, timeout=30)
        assert closed.success and closed.data == "closed", closed
        assert (await kit.execute("pid", {}, timeout=30)).data == pid


async def test_an_error_with_a_huge_message_is_cut(tmp_path: Path) -> None:
    # All 40 MB of it were sent: over the message limit, the call failed as "the tool's
    # output is too large", which hid the tool's own error.
    huge = (
        "export const tools = ["
        f"{PID},"
        '{ name: "huge", description: "",'
        '  execute() { throw new RangeError("m".repeat(40 * 1024 * 1024)); } }];'
    )
    source = JavaScriptSource(package(tmp_path / "huge", huge))
    async with await create_toolkit(tools=[source]) as kit:
        pid = (await kit.execute("pid", {})).data
        result = await kit.execute("huge", {}, timeout=60)
        assert result.error_code == "tool_error", result
        error = result.error or ""
        assert "RangeError: mmmm" in error and "more characters cut]" in error, error[:300]
        assert len(error) < 20_000
        assert (await kit.execute("pid", {})).data == pid


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ('{ type: "object", properties: 3 }', "'int' object has no attribute 'items'"),
        ('{ type: "frob" }', "cannot compile schema"),
    ],
)
async def test_parameters_that_are_no_json_schema_fail_only_their_source(
    tmp_path: Path, parameters: str, reason: str
) -> None:
    # `properties: 3` raised an AttributeError out of create_toolkit (every source lost); an
    # unknown type opened, and then failed each call as "tool schema is broken".
    broken = JavaScriptSource(
        package(
            tmp_path / "schema",
            f'export default {{ name: "odd", description: "", parameters: {parameters},'
            " execute() { return 1; } };",
        )
    )
    counter = JavaScriptSource(package(tmp_path / "counter", COUNTER))
    async with await create_toolkit(tools=[broken, counter]) as kit:
        assert broken.status.state == "failed", broken.status
        assert "tool 'odd': its parameters are not a usable JSON Schema" in broken.status.reason
        assert reason in broken.status.reason
        assert (await kit.execute("counter", {"by": 1})).data == {"count": 1}


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            'export default { name: "a", parameters: { type: "object", maximum: 10n },'
            " execute() {} };",
            'tool "a" cannot be described as JSON: parameters.maximum is a BigInt (10n)',
        ),
        (
            'const p = { type: "object" }; p.self = p;'
            ' export default { name: "a", parameters: p, execute() {} };',
            'tool "a" cannot be described as JSON: TypeError: Converting circular structure',
        ),
        (
            'export default { name: "a", get description() { throw new Error("no text"); },'
            " execute() {} };",
            'tool "a" cannot be described as JSON: Error: no text',
        ),
        (
            'export default { name: "a", execute: 42 };',
            'must export a tool { name, description, parameters, execute(input) } (as default, '
            '`tool` or `tools`); tool "a": execute is a number, not a function',
        ),
        ('export default [{ name: "a", execute() {} }, { execute() {} }];',
         "tool 2 of 2 has no name (a string), but undefined"),
        ("export const x = 1;", "it exports none of them"),
    ],
)  # fmt: skip
async def test_what_is_wrong_with_a_packages_tools_is_named(
    tmp_path: Path, source: str, reason: str
) -> None:
    # A tool list JSON could not hold ended the worker before it sent its tools ("the worker
    # exited", its stderr the only clue); a bad export did not say which tool, nor what.
    js = JavaScriptSource(package(tmp_path / "pkg", source))
    async with await create_toolkit(tools=[js]) as kit:
        assert len(kit) == 0
        assert js.status.state == "failed" and reason in js.status.reason, js.status
        assert "exited" not in js.status.reason


async def test_a_main_that_is_not_built_yet_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "unbuilt"
    folder.mkdir()
    (folder / "package.json").write_text(json.dumps({"name": "u", "main": "dist/index.js"}))
    source = JavaScriptSource(folder)
    async with await create_toolkit(tools=[source]) as kit:
        assert len(kit) == 0
    assert source.status.state == "failed"
    assert "package.json names 'dist/index.js', but the package holds no such file" in (
        source.status.reason
    )


ECHO_NUMBERS = """
export default {
  name: "numbers", description: "Echoes its numbers.",
  parameters: { type: "object", properties: { values: { type: "array" } } },
  execute: ({ args }) => ({ output: args.values.map(String) }),
};
"""


async def test_integers_javascript_cannot_keep_exact_are_refused(tmp_path: Path) -> None:
    """2**70 reached the tool as 1180591620717411303424 and -2**63 came back as
    -9223372036854776000: changed without a word."""
    source = JavaScriptSource(package(tmp_path / "numbers", ECHO_NUMBERS))
    async with await create_toolkit(tools=[source]) as kit:
        exact = await kit.execute("numbers", {"values": [2**53, -(2**53), 1.5]})
        assert exact.success and exact.data == ["9007199254740992", "-9007199254740992", "1.5"]
        refused = await kit.execute("numbers", {"values": [1, {"n": -(2**63)}]})
        assert refused.error_code == "invalid_arguments"
        assert refused.metadata == {"path": "$.values[1].n"}
        assert "beyond what the tool's language keeps exact" in (refused.error or "")


# -- settings of the wrong kind are refused, never read as "no sandbox" ------------------------


@pytest.mark.parametrize("isolation", ["bwrap", "Bubblewrap", "sandbox", "", None, True])
def test_an_unknown_isolation_is_refused_not_run_unsandboxed(
    tmp_path: Path, isolation: object
) -> None:
    # Only "bubblewrap" was looked at: any other value ran the tool on the host, unsandboxed.
    folder = package(tmp_path / "counter", COUNTER)
    with pytest.raises(ConfigError, match=r"isolation: .* is not one of 'none', 'bubblewrap'"):
        JavaScriptSource(folder, isolation=isolation)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="isolation"):
        sources_from_manifest(
            {"kind": "javascript", "path": "counter", "isolation": isolation}, base_dir=tmp_path
        )


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("network", "false", "network: expected bool, not str"),  # was true: --share-net
        ("network", 0, "network: expected bool, not int"),
        ("install", "false", "install: expected bool, not str"),
        ("env", {"DEBUG": 1}, "env: "),
        ("env", ["A=1"], "env: "),
        ("node", 20, "node: expected str, not int"),
        ("esbuild", ["esbuild"], "esbuild: "),
        ("name", 7, "name: "),
    ],
)
def test_settings_of_the_wrong_kind_are_refused_naming_them(
    tmp_path: Path, setting: str, value: object, says: str
) -> None:
    package(tmp_path / "counter", COUNTER)
    with pytest.raises(ConfigError, match=f"^javascript:counter.{says}"):
        sources_from_manifest(
            {"kind": "javascript", "path": "counter", "isolation": "bubblewrap", setting: value},
            base_dir=tmp_path,
        )


def test_isolation_and_network_of_the_right_kind_are_kept(tmp_path: Path) -> None:
    source = JavaScriptSource(
        package(tmp_path / "counter", COUNTER), isolation="bubblewrap", network=True
    )
    assert (source.isolation, source.network) == ("bubblewrap", True)


READER = """
import fs from "node:fs";
export default {
  name: "read", description: "Reads a file.",
  parameters: { type: "object", properties: { p: { type: "string" } }, required: ["p"] },
  execute: ({ args }) => ({ output: fs.readFileSync(args.p, "utf8") }),
};
"""


async def test_a_lone_folder_to_allow_is_one_folder_not_its_letters(tmp_path: Path) -> None:
    # allow_read = "data" granted d, a, t and a next to the manifest, and denied data.
    package(tmp_path / "reader", READER)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "file.txt").write_text("inside data")
    (source,) = sources_from_manifest(
        {"kind": "javascript", "path": "reader", "allow_read": "data", "allow_write": "out"},
        base_dir=tmp_path,
    )
    assert isinstance(source, JavaScriptSource)
    assert source.allow_read == [str(tmp_path / "data")]
    assert source.allow_write == [str(tmp_path / "out")]
    async with await create_toolkit(tools=[source]) as kit:
        result = await kit.execute("read", {"p": str(tmp_path / "data" / "file.txt")})
        assert result.success and result.data == "inside data", (result, source.status)
    with pytest.raises(ConfigError, match="allow_read must be a string or a list of strings"):
        sources_from_manifest(
            {"kind": "javascript", "path": "reader", "allow_read": 3}, base_dir=tmp_path
        )


DEEP = GATED.replace(
    "\n];\n",
    """
  { name: "deep", description: "Answers JSON nested 1500 levels deep.", parameters: none,
    execute() { let v = 1; for (let i = 0; i < 1500; i++) v = [v]; return v; } },
  { name: "deep_event", description: "Emits an event nested 1500 levels deep.",
    parameters: none, execute({ emit }) {
      let v = 1; for (let i = 0; i < 1500; i++) v = [v];
      emit("progress", { v }); return "went on"; } },
  { name: "emits", description: "Emits an event.", parameters: none,
    execute({ emit }) { emit("progress", { pct: 1 }); return "emitted"; } },
];
""",
)


async def test_an_answer_nested_too_deeply_fails_its_call_at_once(tmp_path: Path) -> None:
    """Python's JSON reader raised RecursionError, which killed the reader of the worker's
    messages: that call and every other one on the worker hung until their deadlines."""
    source = JavaScriptSource(package(tmp_path / "deep", DEEP))
    async with await create_toolkit(tools=[source]) as kit:
        waiting = asyncio.ensure_future(kit.execute("wait_gate", {}, timeout=60))
        pid = (await kit.execute("pid", {})).data  # meanwhile wait_gate reached the worker
        deep = await kit.execute("deep", {}, timeout=20)
        assert deep.error_code == "tool_error", deep
        assert "could not be read: it is nested too deeply" in (deep.error or "")
        events: list[ToolEvent] = []
        went_on = await kit.execute("deep_event", {}, timeout=20, on_event=events.append)
        assert went_on.success and went_on.data == "went on", went_on
        assert any("dropped an event" in str(e.data.get("message")) for e in events), events
        # The one message was skipped, not the worker: the call beside them goes on.
        assert (await kit.execute("open_gate", {})).data == pid
        waited = await waiting
        assert waited.success and waited.data == pid, waited


async def test_a_tool_list_nested_too_deeply_fails_the_source_at_once(tmp_path: Path) -> None:
    deep = (
        "let v = {}; for (let i = 0; i < 1500; i++) v = { v };\n"
        'export default { name: "t", description: "", parameters: { type: "object", "x-v": v },'
        " execute() { return 1; } };\n"
    )
    source = JavaScriptSource(package(tmp_path / "deeplist", deep))
    source.start_timeout = 20  # the old reader died: the start waited for this long
    async with await create_toolkit(tools=[source]) as kit:
        assert kit.names() == []
    assert source.status.state == "failed"
    assert "its list of tools could not be read: it is nested too deeply" in source.status.reason


async def test_a_failure_reading_the_messages_fails_the_pending_calls_and_restarts_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong reading the worker's messages, no call is left waiting for its
    deadline: all fail at once, and the next call gets a fresh worker."""

    def broken(ctx: object, message: object) -> None:
        raise RuntimeError("a bug in toolmesh")

    source = JavaScriptSource(package(tmp_path / "deep", DEEP))
    async with await create_toolkit(tools=[source]) as kit:
        waiting = asyncio.ensure_future(kit.execute("wait_gate", {}, timeout=20))
        pid = (await kit.execute("pid", {})).data
        monkeypatch.setattr("toolmesh.sources.worker._emit", broken)
        emitted = await kit.execute("emits", {}, timeout=20)
        waited = await waiting
        for failed in (emitted, waited):
            assert failed.error_code == "tool_error", failed
            assert "failed reading the worker's messages (RuntimeError: a bug in toolmesh)" in (
                failed.error or ""
            )
        monkeypatch.undo()
        again = await kit.execute("pid", {})
        assert again.success and again.data != pid, again
        assert gone(pid)


LINKED = """
import fs from "node:fs";
export default [{
  name: "read", description: "Reads a file.",
  parameters: { type: "object", properties: { p: { type: "string" } }, required: ["p"] },
  execute: ({ args }) => fs.readFileSync(new URL(args.p, import.meta.url), "utf8"),
}, {
  name: "bye", description: "Ends the worker.", parameters: { type: "object" },
  execute() { process.exit(3); },
}];
"""


def linked(tmp_path: Path) -> tuple[Path, Path]:
    """A package with the links npm makes (inside node_modules), and a private folder."""
    folder = package(tmp_path / "linked", LINKED)
    (folder / "node_modules" / "dep").mkdir(parents=True)
    (folder / "node_modules" / "dep" / "cli.js").write_text("// a dependency's command")
    (folder / "node_modules" / ".bin").mkdir()
    (folder / "node_modules" / ".bin" / "cli").symlink_to("../dep/cli.js")
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.txt").write_text("secret")
    return folder, private


async def test_a_symlink_leading_out_of_what_the_tool_may_read_fails_the_source(
    tmp_path: Path,
) -> None:
    """Node's permissions check the path as written: a link the package ships in its own
    folder let the tool read any file through it."""
    folder, private = linked(tmp_path)
    (folder / "link").symlink_to("../private")
    source = JavaScriptSource(folder)
    async with await create_toolkit(tools=[source]) as kit:
        assert kit.names() == []
    assert source.status.state == "failed"
    assert f"{folder / 'link'} is a symbolic link to {private}" in source.status.reason
    assert "may not read" in source.status.reason and "allow_read" in source.status.reason
    # Granted, its target may be read through it; npm's own links inside were never refused.
    granted = JavaScriptSource(folder, allow_read=[str(private)])
    async with await create_toolkit(tools=[granted]) as kit:
        result = await kit.execute("read", {"p": "./link/secret.txt"})
        assert result.success and result.data == "secret", (result, granted.status)
        bin_link = await kit.execute("read", {"p": "./node_modules/.bin/cli"})
        assert bin_link.data == "// a dependency's command", bin_link


async def test_a_symlink_in_allow_write_leading_where_the_tool_may_not_write_is_refused(
    tmp_path: Path,
) -> None:
    folder, _private = linked(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "into-the-package").symlink_to(folder)  # readable there, not writable
    source = JavaScriptSource(folder, allow_write=[str(out)])
    async with await create_toolkit(tools=[source]) as kit:
        assert kit.names() == []
    assert f"{out / 'into-the-package'} is a symbolic link to {folder}" in source.status.reason
    assert "may not write" in source.status.reason and "allow_write" in source.status.reason


async def test_a_symlink_made_after_the_start_stops_the_next_start(tmp_path: Path) -> None:
    folder, private = linked(tmp_path)
    source = JavaScriptSource(folder)
    async with await create_toolkit(tools=[source]) as kit:
        assert (await kit.execute("read", {"p": "./package.json"})).success
        (folder / "link").symlink_to(private)
        ended = await kit.execute("bye", {}, timeout=20)
        assert "the worker exited with code 3" in (ended.error or ""), ended
        refused = await kit.execute("read", {"p": "./link/secret.txt"}, timeout=20)
        assert refused.error_code == "tool_error", refused
        assert f"{folder / 'link'} is a symbolic link to {private}" in (refused.error or "")


WRITER = """
import fs from "node:fs";
export default {
  name: "write", description: "Writes a file.",
  parameters: { type: "object", properties: { p: { type: "string" } }, required: ["p"] },
  execute({ args }) {
    try { fs.writeFileSync(args.p, "hello"); return "written"; }
    catch (e) { return e.code || e.message; }
  },
};
"""


@requires_bwrap
async def test_allow_write_is_writable_in_bubblewrap(tmp_path: Path) -> None:
    """The allow_write folders were mounted read-only in the sandbox (EROFS)."""
    out = tmp_path / "out"
    out.mkdir()
    folder = package(tmp_path / "writer", WRITER)
    source = JavaScriptSource(folder, allow_write=[str(out)], isolation="bubblewrap")
    async with await create_toolkit(tools=[source]) as kit:
        written = await kit.execute("write", {"p": str(out / "new.txt")}, timeout=30)
        assert written.data == "written", (written, source.status)
        assert (out / "new.txt").read_text() == "hello"
        refused = await kit.execute("write", {"p": str(folder / "new.txt")}, timeout=30)
        assert refused.data in ("ERR_ACCESS_DENIED", "EROFS"), refused
    assert not (folder / "new.txt").exists()
