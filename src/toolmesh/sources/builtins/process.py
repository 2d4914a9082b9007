"""Running a child process within limits: deadline, output size, environment, resources.

Shared by the shell and python tools. The child starts in a session (and process group) of its
own. When it ends, or its deadline passes, or the call is cancelled, the whole group is killed
(SIGKILL), so background jobs it started do not outlive the call; at a deadline the processes
of its session that left the group are found through /proc and killed too. The child itself is
always waited for: no zombie is left.

Output is read as it comes and kept within ``max_output`` bytes per stream: the first half and
the last half, with the number of bytes cut in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolmesh.sources.builtins import cgroups
from toolmesh.sources.process_tree import MARK, kill_group, kill_session, new_token

__all__ = ["Completed", "ProcessSettings", "build_env", "kill_session", "run_process"]

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
READ_CHUNK = 64 * 1024
DRAIN_GRACE = 0.5  # seconds to wait for pipes still held open after the group was killed


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """Limits of a child process (the shell and python tools share them)."""

    timeout: float = 30.0  # seconds, when the call gives none
    max_timeout: float = 600.0  # the most a call may ask for
    max_output: int = 64 * 1024  # bytes kept per stream (stdout, stderr)
    env: Literal["empty", "inherit"] | tuple[str, ...] = ("LANG", "LC_ALL", "TZ", "TERM")
    set_env: dict[str, str] = field(default_factory=dict)  # fixed variables added on top
    path: str = DEFAULT_PATH  # PATH unless env = "inherit"
    cwd: str = "."  # working folder, relative to the workspace (must stay inside it)
    memory_mb: int | None = None  # RLIMIT_AS
    cpu_seconds: int | None = None  # RLIMIT_CPU
    max_processes: int | None = None  # a pids cgroup per call (and RLIMIT_NPROC, per user)
    max_file_mb: int | None = None  # RLIMIT_FSIZE
    # isolation with bubblewrap (sandbox.py)
    isolation: Literal["none", "bubblewrap"] = "none"
    view: Literal["read-only", "overlay", "read-write"] = "overlay"
    network: bool = False
    read_only_paths: tuple[str, ...] = ()  # more host paths visible (read-only) in the sandbox

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.max_timeout <= 0:
            raise ValueError("timeout and max_timeout must be positive")
        if self.max_output < 256:
            raise ValueError("max_output must be at least 256 bytes")

    def call_timeout(self, asked: float | None) -> float:
        """The timeout of one call: what it asked for, within ``max_timeout``."""
        wanted = asked if asked is not None and asked > 0 else self.timeout
        return min(wanted, self.max_timeout)


@dataclass(slots=True)
class Completed:
    """How a child process ended and what it printed (bounded)."""

    exit_code: int | None  # None when killed at the deadline; negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    stdout_cut: int = 0  # bytes not kept
    stderr_cut: int = 0
    duration: float = 0.0

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_cut or self.stderr_cut)


def build_env(settings: ProcessSettings, home: str) -> dict[str, str]:
    """The child's environment: empty, an allow-list of the host's variables, or inherited."""
    if settings.env == "inherit":
        env = dict(os.environ)
    else:
        names = () if settings.env == "empty" else settings.env
        env = {name: os.environ[name] for name in names if name in os.environ}
        env["PATH"] = settings.path
        env.setdefault("HOME", home)
        env.setdefault("LANG", "C.UTF-8")
    env.update(settings.set_env)
    return env


class _Bounded:
    """Keeps the first and last ``limit / 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_size += len(chunk)
            while self.tail_size - len(self.tail[0]) >= self.tail_limit:
                self.tail_size -= len(self.tail.popleft())

    def text(self) -> tuple[str, int]:
        tail = b"".join(self.tail)[-self.tail_limit :] if self.tail else b""
        cut = self.total - len(self.head) - len(tail)
        if cut <= 0:
            return (bytes(self.head) + tail).decode("utf-8", "replace"), 0
        head = bytes(self.head).decode("utf-8", "replace")
        note = f"\n[... {cut} bytes cut ...]\n"
        return head + note + tail.decode("utf-8", "replace"), cut


async def run_process(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    settings: ProcessSettings,
    stdin: bytes | None = None,
    pass_fds: Sequence[int] = (),
    sweep: bool = False,
    helpers: int = 0,
) -> Completed:
    """Run ``argv`` to its end or its deadline; see the module docstring. ``sweep``: after a
    clean exit too, kill what it left running anywhere (a daemon that left the session and
    closed its pipes: only a scan of all processes, about a millisecond, finds it).
    ``helpers``: processes of a wrapper (a sandbox) not counted against ``max_processes``.

    The end of the process is watched through a pidfd, not through its pipes (asyncio's own
    ``Process.wait`` also waits for the pipes, which a stray grandchild may hold open)."""
    token = new_token()
    group = _pids_cgroup(settings, token, helpers)
    try:
        return await _run(argv, cwd, env, timeout, settings, stdin, pass_fds, sweep, token, group)
    finally:
        if group is not None:
            await group.remove()


def _pids_cgroup(settings: ProcessSettings, token: str, helpers: int) -> cgroups.PidsCgroup | None:
    """The call's own pids cgroup when ``max_processes`` asks for one and one can be made."""
    if settings.max_processes is None:
        return None
    return cgroups.PidsCgroup.create(settings.max_processes + helpers, token)


async def _run(
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    settings: ProcessSettings,
    stdin: bytes | None,
    pass_fds: Sequence[int],
    sweep: bool,
    token: str,
    group: cgroups.PidsCgroup | None,
) -> Completed:
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    env = {**env, MARK: token}
    process = subprocess.Popen(  # noqa: ASYNC220 - fork/exec only; the waiting is async
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
        preexec_fn=_pre_exec(settings, group),
        pass_fds=tuple(pass_fds),
    )
    out, err = _Bounded(settings.max_output), _Bounded(settings.max_output)
    pipes = _Pipes(loop, process, {process.stdout: out, process.stderr: err}, stdin)
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout):
                await _exited(loop, process)
        except TimeoutError:
            timed_out = True
    finally:
        if not _has_exited(process.pid):  # the deadline passed, or the call was cancelled
            kill_session(process.pid, token)  # not reaped yet: its pid cannot have been reused
            process.wait()
        else:
            process.wait()
            # Background jobs it left behind keep its process group alive; an empty group
            # answers ESRCH at once, which keeps this path cheap.
            if kill_group(process.pid) or sweep:
                kill_session(process.pid, token)
        if not await pipes.drain(DRAIN_GRACE):  # something that escaped holds the pipes
            kill_session(process.pid, token)
    stdout, stdout_cut = out.text()
    stderr, stderr_cut = err.text()
    return Completed(
        exit_code=None if timed_out else process.returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        stdout_cut=stdout_cut,
        stderr_cut=stderr_cut,
        duration=time.monotonic() - started,
    )


async def _exited(loop: asyncio.AbstractEventLoop, process: subprocess.Popen[bytes]) -> None:
    """Wait until ``process`` has exited (without reaping it)."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd here: a thread waits instead
        await asyncio.shield(loop.run_in_executor(None, _wait_quietly, process))
        return
    done = loop.create_future()
    loop.add_reader(pidfd, _settle, done)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _has_exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, leaving it unreaped."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _wait_quietly(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)


class _Pipes:
    """Non-blocking reads of the child's output pipes (and the write of its stdin) on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        process: subprocess.Popen[bytes],
        sinks: Mapping[Any, _Bounded],
        stdin: bytes | None,
    ) -> None:
        self.loop = loop
        self.open: dict[int, tuple[Any, _Bounded]] = {}
        self.closed = loop.create_future()
        for stream, sink in sinks.items():
            fd = stream.fileno()
            os.set_blocking(fd, False)
            self.open[fd] = (stream, sink)
            loop.add_reader(fd, self._readable, fd)
        self.stdin = process.stdin
        self.pending = memoryview(stdin or b"")
        if self.stdin is not None:
            os.set_blocking(self.stdin.fileno(), False)
            self._writable()

    def _readable(self, fd: int) -> None:
        _stream, sink = self.open[fd]
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            sink.add(chunk)
            return
        self._close(fd)

    def _close(self, fd: int) -> None:
        stream, _ = self.open.pop(fd)
        self.loop.remove_reader(fd)
        stream.close()
        if not self.open and not self.closed.done():
            self.closed.set_result(None)

    def _writable(self) -> None:
        stream = self.stdin
        if stream is None:
            return
        fd = stream.fileno()
        try:
            while self.pending:
                written = os.write(fd, self.pending[:READ_CHUNK])
                self.pending = self.pending[written:]
        except BlockingIOError:
            self.loop.add_writer(fd, self._more)
            return
        except OSError:  # the child stopped reading (exited, or closed stdin)
            pass
        self._end_stdin()

    def _more(self) -> None:
        if self.stdin is not None:
            self.loop.remove_writer(self.stdin.fileno())
        self._writable()

    def _end_stdin(self) -> None:
        if self.stdin is not None:
            with contextlib.suppress(OSError):
                self.loop.remove_writer(self.stdin.fileno())
                self.stdin.close()
            self.stdin = None

    async def drain(self, grace: float) -> bool:
        """Read to the end of the pipes; a pipe still held open by a process that escaped
        the kill is abandoned after ``grace`` seconds (answers False then)."""
        self._end_stdin()
        if self.open:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.closed), grace)
        ended = not self.open
        for fd in list(self.open):
            self._close(fd)
        return ended


def _pre_exec(
    settings: ProcessSettings, group: cgroups.PidsCgroup | None
) -> Callable[[], None] | None:
    """A hook run in the child before exec: join the pids cgroup (before the child can fork),
    set the resource limits. None when there is nothing to do (None keeps the fast spawn
    path)."""
    limits = _rlimits(settings)
    if not limits and group is None:
        return None
    procs = group.procs if group is not None else None

    def apply() -> None:
        if procs is not None:
            cgroups.join(procs)
        for kind, value in limits:
            resource.setrlimit(kind, (value, value))

    return apply


def _rlimits(settings: ProcessSettings) -> list[tuple[int, int]]:
    """The resource limits the settings ask for. RLIMIT_NPROC counts the user's processes,
    and not at all for root: the pids cgroup is what caps one call."""
    limits: list[tuple[int, int]] = []
    if settings.memory_mb is not None:
        limits.append((resource.RLIMIT_AS, settings.memory_mb * 1024 * 1024))
    if settings.cpu_seconds is not None:
        limits.append((resource.RLIMIT_CPU, settings.cpu_seconds))
    if settings.max_processes is not None:
        limits.append((resource.RLIMIT_NPROC, settings.max_processes))
    if settings.max_file_mb is not None:
        limits.append((resource.RLIMIT_FSIZE, settings.max_file_mb * 1024 * 1024))
    return limits
