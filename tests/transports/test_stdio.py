"""NDJSON over stdio: framing, a tool that prints, end of input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import select
import shlex
import signal
import sqlite3
import subprocess
import sys
import tty
from pathlib import Path

import pytest

from tests.conftest import serve_stdio_command

NOISY = '''
from toolmesh import tool

@tool
def noisy(text: str) -> str:
    """Prints to stdout while it works."""
    print("debug output that must not reach the protocol stream")
    import subprocess, sys
    subprocess.run([sys.executable, "-c", "print('child output')"], check=True)
    return text

TOOLS = [noisy]
'''


async def test_printing_tools_cannot_corrupt_the_stream(tmp_path: Path) -> None:
    (tmp_path / "noisy_tools.py").write_text(NOISY)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolmesh",
        "serve",
        "--stdio",
        "--tools",
        "noisy_tools:TOOLS",
        "--audit",
        ":memory:",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stdin is not None and process.stdout is not None
    lines = [
        {"type": "handshake/req", "id": "h", "agent_caps": ["tools"]},
        {"type": "tool/call/req", "id": "c", "tool_name": "noisy", "arguments": {"text": "clean"}},
    ]
    process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    await process.stdin.drain()
    process.stdin.close()
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    messages = [json.loads(line) for line in stdout.splitlines()]
    assert [m["type"] for m in messages] == ["handshake/resp", "tool/call/resp"]
    assert messages[1]["data"]["data"] == "clean"
    assert b"debug output" in stderr and b"child output" in stderr
    assert process.returncode == 0


async def test_host_exits_when_input_ends(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        *serve_stdio_command(tmp_path / "a.db"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    process.stdin.close()
    assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_blank_lines_are_ignored_and_last_line_needs_no_newline(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        *serve_stdio_command(tmp_path / "a.db"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(b'\n\n{"type":"ping","id":"p"}'), 30)
    assert [json.loads(line)["req_id"] for line in stdout.splitlines()] == ["p"]


def test_input_and_output_may_be_regular_files(tmp_path: Path) -> None:
    """`toolmesh serve --stdio < requests.ndjson > answers.ndjson` works like a pipe."""
    requests = tmp_path / "requests.ndjson"
    answers = tmp_path / "answers.ndjson"
    requests.write_text(
        '{"type":"handshake/req","id":"h","agent_caps":["tools"]}\n'
        '{"type":"tool/call/req","id":"c","tool_name":"echo","arguments":{"text":"from a file"}}\n'
    )
    with requests.open("rb") as stdin, answers.open("wb") as stdout:
        done = subprocess.run(
            serve_stdio_command(tmp_path / "a.db"),
            stdin=stdin,
            stdout=stdout,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0
    messages = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [m["type"] for m in messages] == ["handshake/resp", "tool/call/resp"]
    assert messages[1]["data"]["data"] == "from a file"


def test_devices_as_stdin_and_stdout(tmp_path: Path) -> None:
    """/dev/null in and out (epoll refuses /dev/null; uvloop aborts on it): read on a thread."""
    with open(os.devnull, "rb") as nothing, open(os.devnull, "wb") as sink:
        done = subprocess.run(
            serve_stdio_command(tmp_path / "a.db"), stdin=nothing, stdout=sink, timeout=60
        )
    assert done.returncode == 0


def test_a_terminal_as_stdin_and_stdout(tmp_path: Path) -> None:
    """Typed at a terminal: the host answers on the terminal."""
    leader, follower = pty.openpty()
    tty.setraw(follower)  # no echo, no line editing: bytes as typed
    process = subprocess.Popen(
        serve_stdio_command(tmp_path / "a.db"), stdin=follower, stdout=follower
    )
    os.close(follower)
    try:
        os.write(leader, b'{"type":"ping","id":"p1"}\n')
        seen = b""
        while b"\n" not in seen:
            ready, _, _ = select.select([leader], [], [], 30)
            assert ready, "no answer on the terminal"
            seen += os.read(leader, 4096)
        assert json.loads(seen.split(b"\n")[0])["type"] == "pong"
    finally:
        process.terminate()
        process.wait(timeout=30)
        os.close(leader)


def test_a_peer_that_closes_stdout_ends_the_host_cleanly(tmp_path: Path) -> None:
    """Nobody reads the answers any more (even while stdin stays open, say held by a process
    the peer started): the host stops, without a traceback, and exits 0."""
    process = subprocess.Popen(
        serve_stdio_command(tmp_path / "a.db"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(b'{"type":"handshake/req","id":"h","agent_caps":["tools"]}\n')
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["type"] == "handshake/resp"
        process.stdout.close()
        call = b'{"type":"tool/call/req","id":"c","tool_name":"hold","arguments":{"seconds":60}}'
        with contextlib.suppress(BrokenPipeError):  # the host may have gone already
            process.stdin.write(call + b"\n")
            process.stdin.flush()
        assert process.wait(timeout=30) == 0
        assert process.stderr is not None and b"Traceback" not in process.stderr.read()
    finally:
        process.kill()
        process.wait()
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_one_socket_as_stdin_and_stdout(tmp_path: Path, loop: str) -> None:
    """As socat EXEC: or systemd socket activation start it: both ends are one socket."""
    import socket

    ours, theirs = socket.socketpair()
    env = {**os.environ, "TOOLMESH_LOOP": loop}
    process = subprocess.Popen(
        serve_stdio_command(tmp_path / "a.db"), stdin=theirs, stdout=theirs, env=env
    )
    theirs.close()
    try:
        ours.settimeout(30)
        ours.sendall(
            b'{"type":"handshake/req","id":"h","agent_caps":["tools"]}\n'
            b'{"type":"tool/call/req","id":"c","tool_name":"echo","arguments":{"text":"hi"}}\n'
        )
        answers = ours.makefile("rb")
        handshake = json.loads(answers.readline())  # it used to answer nothing
        assert handshake["type"] == "handshake/resp" and handshake["ok"] is True
        assert json.loads(answers.readline())["data"]["data"] == "hi"
        ours.shutdown(socket.SHUT_WR)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()
        ours.close()


async def test_closing_the_client_mid_call_stops_the_host_gracefully(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call outlives the client's wait for the host to exit: the host is asked to stop
    (SIGTERM), so the call is answered and audited as cancelled. A SIGKILL at once used to
    lose its audit entry (and the caller got only "exited with code -9")."""
    from toolmesh import connect_async
    from toolmesh.transports.stdio import StdioChannel

    monkeypatch.setattr(StdioChannel, "close_grace", 2.0, raising=False)  # SIGTERM after 2 s
    audit = tmp_path / "a.db"
    client = await connect_async(serve_stdio_command(audit))
    channel = client._channel
    assert isinstance(channel, StdioChannel)
    call = asyncio.ensure_future(client.call_tool("hold", {"seconds": 60}, timeout=60))
    await client.ping()  # answered after the call's line was read: the call is running
    await client.close()
    result = await asyncio.wait_for(call, 30)
    assert result.error_code == "cancelled"
    assert channel.transport is not None and channel.transport.get_returncode() == 0
    db = sqlite3.connect(audit)
    try:
        rows = db.execute("SELECT tool_name, error_code FROM audit").fetchall()
    finally:
        db.close()
    assert rows == [("hold", "cancelled")]


@pytest.mark.timeout(30)  # the guard: the call used to wait for the helper (60 s)
async def test_a_host_killed_mid_call_fails_the_call_while_its_helper_holds_stdout(
    tmp_path: Path,
) -> None:
    """The host runs through a wrapper whose background helper inherits its stdout: when the
    host dies no end of file comes (the helper still holds the pipe), yet its pending call
    fails once it exited, not once the helper does."""
    from toolmesh import TransportError, connect_async

    helper = tmp_path / "helper.pid"
    host = shlex.join(serve_stdio_command(tmp_path / "a.db"))
    wrapper = f"sleep 60 & echo $! > {shlex.quote(str(helper))}; exec {host}"
    client = await connect_async(["sh", "-c", wrapper])
    try:
        pid = client._channel.pid  # type: ignore[union-attr]
        assert pid is not None
        call = asyncio.ensure_future(client.call_tool("hold", {"seconds": 60}, timeout=60))
        await client.ping()  # answered after the call's line was read: the call is running
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TransportError, match="exited with code -9"):
            await call
    finally:
        await client.close()
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(int(helper.read_text()), signal.SIGKILL)


LAST_WORDS = """
import sys

from toolmesh.models import ToolResult
from toolmesh.protocol import HandshakeResponse, ToolCallResponse, decode, encode

for line in sys.stdin.buffer:
    message = decode(line)
    if message.type == "handshake/req":
        sys.stdout.buffer.write(encode(HandshakeResponse(req_id=message.id, session_id="s1")))
    elif message.type == "tool/call/req":
        result = ToolResult(
            success=True, tool_name=message.tool_name, data="last words", duration_ms=1
        )
        sys.stdout.buffer.write(encode(ToolCallResponse(req_id=message.id, data=result)))
        sys.stdout.flush()
        break  # exits at once: its answer is still on its way through the pipe
    sys.stdout.flush()
"""


@pytest.mark.timeout(30)
async def test_what_a_host_wrote_before_it_exited_still_arrives_while_its_helper_holds_stdout(
    tmp_path: Path,
) -> None:
    from toolmesh import connect_async

    (tmp_path / "last_words.py").write_text(LAST_WORDS)
    helper = tmp_path / "helper.pid"
    host = shlex.join([sys.executable, str(tmp_path / "last_words.py")])
    wrapper = f"sleep 60 & echo $! > {shlex.quote(str(helper))}; exec {host}"
    client = await connect_async(["sh", "-c", wrapper])
    try:
        result = await client.call_tool("anything", {}, timeout=20)
        assert result.success and result.data == "last words"
    finally:
        await client.close()
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(int(helper.read_text()), signal.SIGKILL)
