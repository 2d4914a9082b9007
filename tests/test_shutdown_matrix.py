"""What a user expects when a server stops while a call runs, in every serving mode: the stop
ends within a few seconds (not at the call's deadline), the client is answered (cancelled), the
call has one audit row saying so, and nothing is left: the process exits 0 and the tool's own
child process (the shell tool running ``sleep``) is gone; in-process, no file descriptor or
asyncio task either.

Four tools, each reporting to a loopback gate once it runs (the test acts then, no sleeps): the
shell tool of a manifest running ``exec sleep 30`` after sending its pid through bash's
/dev/tcp (a child process to clean up), an async and a thread-blocking tool given by
``--tools`` (the other way the CLI builds its toolkit), and a JavaScript tool (a worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, toolmesh_command
from tests.fixtures.gate import PidGate, Snapshot, gone
from tests.fixtures.llm_stub import Answer, StubLLM, openai_calls, openai_text
from tests.mcp.conftest import MODERN_HELLO, open_2025_session
from toolmesh import connect_async, create_client, create_toolkit, tool

pytestmark = [pytest.mark.network_server]

STOP_WITHIN = 5.0  # seconds from SIGTERM / stop() to the end; the call's deadline is 30 s
ANSWERED_WITHIN = 5.0  # seconds from then to the client's answer
MANIFEST = '[[tools]]\nkind = "bash"\nname = "bash"\nconfig = { allow = "*", timeout = 30 }\n'
# the shell tool (a child process), an async and a thread-blocking --tools tool, and a
# JavaScript tool (a worker process)
NO_NODE = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
KINDS = ["shell", "python", "blocking", pytest.param("node", marks=NO_NODE)]
ENDED = {"TASK_STATE_CANCELED", "TASK_STATE_FAILED"}


def sleeper(port: int) -> dict[str, Any]:
    """The shell call: tell the gate its pid, then become ``sleep 30`` (same pid)."""
    return {"command": f"exec 3<>/dev/tcp/127.0.0.1/{port}; echo $$ >&3; exec sleep 30"}


@tool
async def gated_wait() -> str:
    """Tells the gate at $GATE_PORT its process's pid, then waits until cancelled."""
    _, told = await asyncio.open_connection("127.0.0.1", int(os.environ["GATE_PORT"]))
    try:
        told.write(b"%d\n" % os.getpid())
        await told.drain()
        await asyncio.Event().wait()
    finally:
        told.close()
    return "never"


@tool
def gated_block() -> str:
    """Tells the gate at $GATE_PORT its pid, then blocks its thread until let go (a tool that
    cannot be cancelled: the server must exit without waiting for it)."""
    with socket.create_connection(("127.0.0.1", int(os.environ["GATE_PORT"]))) as told:
        told.sendall(b"%d\n" % os.getpid())
        told.settimeout(60)
        told.recv(1)
    return "let go"


NODE_WAIT = """
import net from "node:net";
export default {
  name: "node_wait",
  description: "Tells the gate its pid, then waits until its worker is stopped.",
  parameters: { type: "object", properties: {} },
  execute() {
    return new Promise(() => {
      const told = net.connect(Number(process.env.GATE_PORT), "127.0.0.1");
      told.on("connect", () => told.write(process.pid + "\\n"));
    });
  },
};
"""
NAMES = {"shell": "bash", "python": "gated_wait", "blocking": "gated_block", "node": "node_wait"}


def the_call(kind: str, port: int) -> tuple[str, dict[str, Any]]:
    return NAMES[kind], sleeper(port) if kind == "shell" else {}


def source_options(kind: str, tmp_path: Path, port: int) -> list[str]:
    if kind in ("python", "blocking"):
        return ["--tools", f"tests.test_shutdown_matrix:{NAMES[kind]}"]
    return ["--config", str(manifest(tmp_path, kind, port))]


def manifest(tmp_path: Path, kind: str, port: int) -> Path:
    """The toolmesh.toml of the shell tool, or of the JavaScript one (its worker is told the
    gate's port by $GATE_PORT, set when the test starts)."""
    path = tmp_path / "toolmesh.toml"
    if kind == "shell":
        path.write_text(MANIFEST)
        return path
    folder = tmp_path / "nodewait"
    folder.mkdir(exist_ok=True)
    (folder / "package.json").write_text('{"main": "index.mjs", "type": "module"}')
    (folder / "index.mjs").write_text(NODE_WAIT)
    entry = f'[[tools]]\nkind = "javascript"\npath = "nodewait"\nenv = {{ GATE_PORT = "{port}" }}\n'
    path.write_text(entry)
    return path


def audit_rows(audit: Path) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(audit)
    try:
        return db.execute("SELECT tool_name, error_code FROM audit ORDER BY id").fetchall()
    finally:
        db.close()


def a2a_answer(body: dict[str, Any], index: int) -> Answer:
    """The stub model: make the call the user's message names once, then finish."""
    if index == 0:
        said = json.dumps(body["messages"]).split("RUN ", 1)[1]
        kind, port = said.split()[:2]
        port = "".join(c for c in port if c.isdigit())
        name, arguments = the_call(kind, int(port))
        return openai_calls(("c1", name, arguments))
    return openai_text("done")


def a2a_send(kind: str, port: int, method: str) -> dict[str, Any]:
    message = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": f"RUN {kind} {port} ."}],
    }
    return {"jsonrpc": "2.0", "id": "r1", "method": method, "params": {"message": message}}


async def a2a_exchange(http: httpx.AsyncClient, body: dict[str, Any]) -> str:
    """The state the task ends in, as a SendMessage answer or a stream's last event says."""
    if body["method"] == "SendMessage":
        answer = await http.post("/a2a", json=body)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["result"]["task"]["status"]["state"])
    events = []
    async with http.stream("POST", "/a2a", json=body) as stream:
        assert stream.status_code == 200
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:])["result"])
    last = events[-1]
    status = last["task"]["status"] if "task" in last else last["statusUpdate"]["status"]
    return str(status["state"])


A2A_METHODS = ["SendMessage", "SendStreamingMessage"]


def mcp_call(kind: str, port: int, id_: int = 2) -> dict[str, Any]:
    name, arguments = the_call(kind, port)
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


def check_mcp_cancelled(answer: dict[str, Any]) -> None:
    result = answer["result"]
    assert result["isError"] is True, result
    assert result["_meta"]["io.toolmesh/errorCode"] == "cancelled", result


# -- the CLI, as a subprocess stopped by SIGTERM -------------------------------------------------


@dataclass
class Stopped:
    returncode: int
    seconds: float  # from SIGTERM to exit
    stdout: bytes  # what was printed after the lines read before
    stderr: str


class Server:
    """``toolmesh serve MODE`` of one kind of tool, run from the repository (the process, its
    audit file, its stderr file)."""

    def __init__(self, tmp_path: Path, kind: str, *mode: str) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.mode = mode
        self.audit = tmp_path / "audit.db"
        self.errors = tmp_path / "stderr.txt"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, gate: PidGate) -> asyncio.subprocess.Process:
        sources = source_options(self.kind, self.tmp_path, gate.port)
        command = toolmesh_command("serve", *self.mode, *sources, "--audit", str(self.audit))
        with self.errors.open("wb") as errors:
            self.process = await asyncio.create_subprocess_exec(
                *command,
                cwd=REPO,
                env={**os.environ, "GATE_PORT": str(gate.port)},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
            )
        return self.process

    async def url(self) -> str:
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        url = line.decode().strip()
        assert url.startswith("http://127.0.0.1:"), self.errors.read_text()
        return url

    async def write(self, *messages: Any) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        await self.process.stdin.drain()

    async def line(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        return dict(json.loads(await asyncio.wait_for(self.process.stdout.readline(), 30)))

    async def terminate(self) -> Stopped:
        """SIGTERM, then what it printed until it exited (stdin stays open meanwhile)."""
        process = self.process
        assert process is not None and process.stdout is not None
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            out = await asyncio.wait_for(process.stdout.read(), 10)
            code = await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(f"no exit 10 s after SIGTERM: {self.errors.read_text()}") from None
        return Stopped(code, time.monotonic() - began, out, self.errors.read_text())

    async def close(self) -> None:
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            process.kill()
            await process.wait()
        if process.stdin is not None:
            process.stdin.close()

    def check_clean_stop(self, stopped: Stopped, pid: int) -> None:
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.seconds < STOP_WITHIN, f"took {stopped.seconds:.1f}s: {stopped.stderr}"
        assert "Traceback" not in stopped.stderr, stopped.stderr
        assert gone(pid), f"the tool's process {pid} outlived the server"
        assert audit_rows(self.audit) == [(NAMES[self.kind], "cancelled")]


def lines_of(stopped: Stopped) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stopped.stdout.splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a2e_stdio_sigterm_mid_call(tmp_path: Path, kind: str) -> None:
    server = Server(tmp_path, kind, "--stdio")
    async with PidGate() as gate:
        name, arguments = the_call(kind, gate.port)
        await server.start(gate)
        try:
            await server.write(
                {"type": "handshake/req", "id": "h", "agent_caps": ["tools"]},
                {"type": "tool/call/req", "id": "c1", "tool_name": name, "arguments": arguments},
            )
            assert (await server.line())["type"] == "handshake/resp"
            pid = await gate.arrival()
            stopped = await server.terminate()
        finally:
            await server.close()
    calls = [a for a in lines_of(stopped) if a.get("req_id") == "c1"]
    assert len(calls) == 1 and calls[0]["type"] == "tool/call/resp", lines_of(stopped)
    assert calls[0]["data"]["error_code"] == "cancelled", calls[0]
    server.check_clean_stop(stopped, pid)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a2e_http_sigterm_mid_call(tmp_path: Path, kind: str) -> None:
    server = Server(tmp_path, kind, "--http", "127.0.0.1:0")
    async with PidGate() as gate:
        await server.start(gate)
        try:
            client = await connect_async(await server.url())
            try:
                call = asyncio.ensure_future(client.call_tool(*the_call(kind, gate.port)))
                pid = await gate.arrival(call)
                stopped = await server.terminate()
                result = await asyncio.wait_for(call, ANSWERED_WITHIN)
            finally:
                await client.close()
        finally:
            await server.close()
    assert result.error_code == "cancelled", result
    server.check_clean_stop(stopped, pid)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_mcp_stdio_sigterm_mid_call(tmp_path: Path, kind: str) -> None:
    server = Server(tmp_path, kind, "--mcp-stdio")
    hello = MODERN_HELLO
    async with PidGate() as gate:
        await server.start(gate)
        try:
            await server.write(
                {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                mcp_call(kind, gate.port, 1),
            )
            assert (await server.line())["id"] == 0
            pid = await gate.arrival()
            stopped = await server.terminate()
        finally:
            await server.close()
    calls = [a for a in lines_of(stopped) if a.get("id") == 1]
    assert len(calls) == 1, lines_of(stopped)
    check_mcp_cancelled(calls[0])
    server.check_clean_stop(stopped, pid)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_mcp_http_sigterm_mid_call(tmp_path: Path, kind: str) -> None:
    server = Server(tmp_path, kind, "--http", "127.0.0.1:0", "--mcp")
    async with PidGate() as gate:
        await server.start(gate)
        try:
            async with httpx.AsyncClient(base_url=await server.url(), timeout=60) as http:
                session = await open_2025_session(http)
                call = mcp_call(kind, gate.port)
                running = asyncio.ensure_future(http.post("/mcp", json=call, headers=session))
                pid = await gate.arrival(running)
                stopped = await server.terminate()
                answer = await asyncio.wait_for(running, ANSWERED_WITHIN)
        finally:
            await server.close()
    assert answer.status_code == 200, answer.text
    check_mcp_cancelled(answer.json())
    server.check_clean_stop(stopped, pid)


@pytest.mark.slow
@pytest.mark.parametrize("method", A2A_METHODS)
@pytest.mark.parametrize("kind", KINDS)
async def test_a2a_sigterm_mid_task(tmp_path: Path, kind: str, method: str) -> None:
    with StubLLM(a2a_answer) as llm:
        agent = ["--a2a", "desk", "--llm", llm.base_url, "--model", "m"]
        server = Server(tmp_path, kind, "--http", "127.0.0.1:0", *agent)
        async with PidGate() as gate:
            await server.start(gate)
            try:
                async with httpx.AsyncClient(base_url=await server.url(), timeout=60) as http:
                    sent = a2a_send(kind, gate.port, method)
                    running = asyncio.ensure_future(a2a_exchange(http, sent))
                    pid = await gate.arrival(running)
                    stopped = await server.terminate()
                    state = await asyncio.wait_for(running, ANSWERED_WITHIN)
            finally:
                await server.close()
    assert state in ENDED, state
    server.check_clean_stop(stopped, pid)


# -- in-process: Toolkit.serve() then ServeHandle.stop() -----------------------------------------


@contextlib.asynccontextmanager
async def served_kit(tmp_path: Path, kind: str, port: int) -> AsyncIterator[Any]:
    audit = tmp_path / "audit.db"
    if kind in ("shell", "node"):
        kit = await create_toolkit(config=manifest(tmp_path, kind, port), audit=audit)
    else:
        kit = await create_toolkit(tools=[gated_wait, gated_block], audit=audit)
    try:
        yield kit
    finally:
        await kit.close()


async def stop_within(handle: Any) -> float:
    began = time.monotonic()
    await asyncio.wait_for(handle.stop(), 20)
    return time.monotonic() - began


async def check_nothing_left(before: Snapshot, kind: str, pid: int, tmp_path: Path) -> None:
    fds, tasks = await before.left()
    if kind == "blocking":  # its thread still holds its socket to the gate (a test's only)
        fds = {fd for fd in fds if "socket" not in fd}
    assert fds == set() and tasks == set(), (fds, tasks)
    if kind in ("shell", "node"):
        assert gone(pid), f"the tool's process {pid} outlived the server"
    assert audit_rows(tmp_path / "audit.db") == [(NAMES[kind], "cancelled")]


@pytest.fixture
def gate_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    def set_port(port: int) -> None:
        monkeypatch.setenv("GATE_PORT", str(port))

    return set_port


@pytest.mark.parametrize("kind", KINDS)
async def test_serve_stop_mid_a2e_call(tmp_path: Path, kind: str, gate_env: Any) -> None:
    before = Snapshot()
    async with PidGate() as gate:
        gate_env(gate.port)
        async with served_kit(tmp_path, kind, gate.port) as kit:
            handle = await kit.serve("127.0.0.1:0")
            client = await connect_async(handle.url)
            try:
                call = asyncio.ensure_future(client.call_tool(*the_call(kind, gate.port)))
                pid = await gate.arrival(call)
                took = await stop_within(handle)
                result = await asyncio.wait_for(call, ANSWERED_WITHIN)
            finally:
                await client.close()
                await handle.stop()
    assert took < STOP_WITHIN and result.error_code == "cancelled", (took, result)
    await check_nothing_left(before, kind, pid, tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_serve_stop_mid_mcp_call(tmp_path: Path, kind: str, gate_env: Any) -> None:
    before = Snapshot()
    async with PidGate() as gate:
        gate_env(gate.port)
        async with served_kit(tmp_path, kind, gate.port) as kit:
            handle = await kit.serve("127.0.0.1:0", mcp=True)
            try:
                async with httpx.AsyncClient(base_url=handle.url, timeout=60) as http:
                    session = await open_2025_session(http)
                    call = mcp_call(kind, gate.port)
                    running = asyncio.ensure_future(http.post("/mcp", json=call, headers=session))
                    pid = await gate.arrival(running)
                    took = await stop_within(handle)
                    answer = await asyncio.wait_for(running, ANSWERED_WITHIN)
            finally:
                await handle.stop()
    assert took < STOP_WITHIN, took
    assert answer.status_code == 200, answer.text
    check_mcp_cancelled(answer.json())
    await check_nothing_left(before, kind, pid, tmp_path)


@pytest.mark.parametrize("method", A2A_METHODS)
@pytest.mark.parametrize("kind", KINDS)
async def test_serve_stop_mid_a2a_task(
    tmp_path: Path, kind: str, method: str, gate_env: Any
) -> None:
    before = Snapshot()
    with StubLLM(a2a_answer) as llm:
        async with PidGate() as gate:
            gate_env(gate.port)
            async with served_kit(tmp_path, kind, gate.port) as kit:
                model = create_client(llm.base_url, model="m")
                handle = await kit.serve("127.0.0.1:0", client=model, a2a="desk")
                try:
                    async with httpx.AsyncClient(base_url=handle.url, timeout=60) as http:
                        sent = a2a_send(kind, gate.port, method)
                        running = asyncio.ensure_future(a2a_exchange(http, sent))
                        pid = await gate.arrival(running)
                        took = await stop_within(handle)
                        state = await asyncio.wait_for(running, ANSWERED_WITHIN)
                finally:
                    await handle.stop()
                    await model.aclose()
    assert took < STOP_WITHIN and state in ENDED, (took, state)
    await check_nothing_left(before, kind, pid, tmp_path)
