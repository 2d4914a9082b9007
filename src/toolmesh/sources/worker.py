"""Tools served by a child process that speaks a small JSON protocol (javascript, pyprocess).

One JSON object per line. The worker writes on its stdout; whatever the tool code itself prints
goes to stderr (the runners see to that), which toolmesh keeps (bounded) to explain failures::

    worker -> host  {"type": "ready", "tools": [{"name", "description", "parameters"}]}
                    {"type": "fatal", "message"}                        (loading failed)
    host -> worker  {"type": "call", "id", "tool", "args", "state"}
    worker -> host  {"type": "event", "id", "kind", "data"}            (activity, progress, ...)
                    {"type": "result", "id", "output", "state_update"}
                    {"type": "error", "id", "message"}

The tool contract (seed 003) is the same in every language: ``execute(input)`` receives
``{args, state}`` (plus ``emit(kind, data)`` and ``activity(type, patch)``) and returns
``{output, state_update?}``. A call that runs past its deadline cannot be interrupted inside the
worker, so it is abandoned (whatever it still sends is ignored) and the worker is killed as soon
as no other call runs on it (it may be stuck); the next call starts a fresh one. Calls running
beside the abandoned one go on undisturbed. A message over ``LINE_LIMIT`` is skipped, and the
call it answers fails (all pending calls, when it cannot be told which one); so does a message
that cannot be decoded (nested too deeply, say), or it is skipped when it names no call. Should
reading the messages ever fail otherwise, every pending call fails at once and the worker is
killed (the next call starts a fresh one). Of stderr, the last ``STDERR_LINES`` lines are kept,
each cut to ``STDERR_LINE_CHARS`` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import locale
import logging
import os
import re
import signal
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from toolmesh.errors import ArgumentError, ConfigError, ToolmeshError
from toolmesh.models import ToolDefinition, ToolErrorCode, ToolResult
from toolmesh.schema import child_path, compile_validator
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.sources.builtins.sandbox import SandboxUnavailable
from toolmesh.sources.process_tree import MARK, kill_session, new_token
from toolmesh.tools import Output, Tool, ToolContext

__all__ = ["Isolation", "Worker", "WorkerError", "WorkerSource", "cache_root"]

logger = logging.getLogger("toolmesh.worker")

LINE_LIMIT = 32 * 1024 * 1024
STDERR_LINES = 40
STDERR_LINE_CHARS = 2000  # kept of each stderr line: the tail explains failures, it is no log
_STDERR_CHUNK = 64 * 1024  # stderr is read in chunks, never a whole (maybe endless) line
_HEAD = 256  # bytes kept from the start of an oversize message, to tell whose it is
_TYPE_RE = re.compile(rb'"type"\s*:\s*"(\w+)"')
_ID_RE = re.compile(rb'"id"\s*:\s*"?([^",}\s]+)')

Isolation = Literal["none", "bubblewrap"]
"""Where a package's worker runs, as the built-ins' ``isolation`` says: on the host, or in a
bubblewrap sandbox."""


class WorkerError(ToolmeshError):
    """The worker process failed to start, crashed, or broke the protocol."""


class Worker:
    """One running worker process and the calls in flight on it."""

    def __init__(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], label: str):
        self.argv = list(argv)
        self.cwd = cwd
        self.token = new_token()  # marks its processes, also those that leave its session
        self.env = {**env, MARK: self.token}
        self.label = label
        self.process: asyncio.subprocess.Process | None = None
        self.specs: list[dict[str, Any]] = []
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._calls: dict[str, tuple[asyncio.Future[dict[str, Any]], ToolContext]] = {}
        self._abandoned: set[str] = set()  # cancelled calls the worker has not answered yet
        self._ready: asyncio.Future[list[dict[str, Any]]] | None = None
        self._spawning: asyncio.Event | None = None  # set once the process exists (or failed)
        self._tasks: list[asyncio.Task[None]] = []
        self._next = 0
        self._closing = False
        self._broken = False  # reading its messages failed: it is being killed

    async def start(self, timeout: float) -> list[dict[str, Any]]:
        """Start the process and wait for its list of tools."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        spawned = self._spawning = asyncio.Event()
        try:
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=self.cwd,
                    env=self.env,
                    start_new_session=True,
                    limit=LINE_LIMIT,
                )
            finally:
                spawned.set()
            self._tasks = [
                asyncio.ensure_future(self._read_messages()),
                asyncio.ensure_future(self._read_stderr()),
            ]
            async with asyncio.timeout(timeout):
                self.specs = await self._ready
        except TimeoutError:
            await self.close()
            raise WorkerError(
                f"{self.label}: no tool list after {timeout:g}s{self._tail()}"
            ) from None
        except BaseException:  # a broken start, or a cancelled one: no process left running
            self._ready.cancel()  # nobody waits for it any more
            await self.close()
            raise
        return self.specs

    @property
    def alive(self) -> bool:
        return (
            not self._closing
            and not self._broken
            and self.process is not None
            and self.process.returncode is None
        )

    @property
    def busy(self) -> bool:
        """Some call is waiting for the worker's answer."""
        return bool(self._calls)

    @property
    def stale(self) -> bool:
        """A cancelled call has not been answered: the worker may be stuck in it."""
        return bool(self._abandoned)

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run one call; the worker's answer (result or error message)."""
        process = self.process
        if process is None or process.stdin is None or not self.alive:
            raise WorkerError(f"{self.label}: the worker is not running{self._tail()}")
        self._next += 1
        call_id = str(self._next)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = (future, ctx)
        message = {"type": "call", "id": call_id, "tool": tool, "args": args, "state": ctx.state}
        try:
            process.stdin.write(json.dumps(message, default=str).encode() + b"\n")
            await process.stdin.drain()
            return await future
        except (BrokenPipeError, ConnectionResetError):
            raise WorkerError(f"{self.label}: the worker went away{self._tail()}") from None
        except asyncio.CancelledError:
            # Cancelling the task cancelled the future too; an answer would have set it.
            answered = future.done() and not future.cancelled()
            if not answered and self.alive:
                self._abandoned.add(call_id)
            raise
        finally:
            self._calls.pop(call_id, None)

    async def close(self) -> None:
        """Kill the worker (and anything it started) and reap it."""
        self._closing = True
        if self._spawning is not None and not self._spawning.is_set():
            await self._spawning.wait()  # closed while the process is being made: kill it too
        process = self.process
        if process is not None:
            await _kill_tree(process, self.token)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)
            # A process the tool started and detached may still hold the pipes open: without
            # this the transport is closed by the garbage collector, after the loop has ended,
            # and asyncio prints a traceback ("Event loop is closed") at exit.
            transport = getattr(process, "_transport", None)
            if transport is not None:
                transport.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_all(WorkerError(f"{self.label}: the worker was stopped"))

    # -- reading ---------------------------------------------------------------------------------

    async def _read_messages(self) -> None:
        try:
            await self._read_protocol()
        except Exception as exc:  # a bug here must not leave every call waiting for its deadline
            logger.exception("%s: reading the worker's messages failed", self.label)
            await self._give_up(
                WorkerError(
                    f"{self.label}: toolmesh failed reading the worker's messages "
                    f"({type(exc).__name__}: {exc}); the worker was stopped, and the next call "
                    "starts a fresh one"
                )
            )

    async def _read_protocol(self) -> None:
        stream = self.process.stdout if self.process is not None else None
        if stream is None:
            return
        async for line, oversize in _lines(stream):
            if oversize:
                self._oversize(line)
            else:
                self._dispatch(line)
        status = ""
        if self.process is not None:
            status = _exit_status(await self.process.wait())
        self._fail_all(WorkerError(f"{self.label}: the worker exited{status}{self._tail()}"))

    async def _give_up(self, error: WorkerError) -> None:
        """Its messages can no longer be read: fail every pending call now, and kill it."""
        self._broken = True
        self._fail_all(error)
        if self.process is not None:
            await _kill_tree(self.process, self.token)

    async def _read_stderr(self) -> None:
        stream = self.process.stderr if self.process is not None else None
        if stream is None:
            return
        # Read on past an overlong line: a worker whose stderr is not read blocks writing it.
        try:
            async for text in _capped_lines(stream, STDERR_LINE_CHARS):
                self.stderr.append(text)
        except Exception:
            logger.exception("%s: reading the worker's stderr failed", self.label)
            while await stream.read(_STDERR_CHUNK):  # still drained: or the worker blocks
                pass

    def _oversize(self, head: bytes) -> None:
        """A message over LINE_LIMIT was skipped: fail the call it answered (or dropped an
        event of), or every pending call when it does not say whose it is."""
        kind, call_id = _whose(head)
        limit = f"{LINE_LIMIT // (1024 * 1024)} MiB"
        logger.warning(
            "%s: skipped a %r message over %s (call %s)", self.label, kind, limit, call_id
        )
        error = WorkerError(
            f"{self.label}: the tool's output is too large: the worker's message was longer "
            f"than the {limit} limit"
        )
        if call_id is None:  # whose is it? fail whatever waits rather than let it hang
            if kind != "event":
                self._fail_all(error)
            return
        self._lost(kind, call_id, error, f"dropped an event from the tool larger than {limit}")

    def _undecodable(self, line: bytes, why: str) -> None:
        """A message that is no JSON Python can read: fail the call it answered (or tell it of
        the event it lost), or the start it was the tool list of; skipped when it names none."""
        kind, call_id = _whose(line[:_HEAD])
        logger.warning("%s: skipped a %r message (call %s): %s", self.label, kind, call_id, why)
        if kind in ("ready", "fatal") and self._ready is not None and not self._ready.done():
            self._ready.set_exception(
                WorkerError(f"{self.label}: its list of tools could not be read: {why}")
            )
        elif call_id is not None:
            error = WorkerError(f"{self.label}: the tool's output could not be read: {why}")
            self._lost(kind, call_id, error, f"dropped an event from the tool: {why}")
        else:
            self._note_stray(line)

    def _lost(self, kind: str, call_id: str, error: WorkerError, dropped: str) -> None:
        """A message of call ``call_id`` was skipped: fail the call, unless it was an event
        (the call is told, and goes on)."""
        if kind in ("result", "error"):
            self._abandoned.discard(call_id)
        waiting = self._calls.get(call_id)
        if waiting is None:
            return
        if kind == "event":
            waiting[1].log(dropped, level="warning")
        elif not waiting[0].done():
            waiting[0].set_exception(error)

    def _note_stray(self, line: bytes) -> None:
        self.stderr.append("[not a protocol message] " + line.decode("utf-8", "replace")[:200])

    def _dispatch(self, line: bytes) -> None:
        if not line.strip():  # the runners start each message on a fresh line
            return
        try:
            message = json.loads(line)
        except RecursionError:  # valid JSON, nested deeper than the decoder's recursion limit
            limit = sys.getrecursionlimit()
            self._undecodable(line, f"it is nested too deeply (about {limit} levels or more)")
            return
        except ValueError as exc:
            self._undecodable(line, f"it is not valid JSON ({exc})"[:300])
            return
        try:
            kind = message["type"]
        except (KeyError, TypeError):  # JSON, but no protocol message
            self._note_stray(line)
            return
        if kind == "ready" and self._ready is not None and not self._ready.done():
            tools = message.get("tools")
            if isinstance(tools, list):
                self._ready.set_result(tools)
            else:
                self._ready.set_exception(WorkerError(f"{self.label}: 'ready' without tools"))
        elif kind == "fatal" and self._ready is not None and not self._ready.done():
            self._ready.set_exception(WorkerError(f"{self.label}: {message.get('message')}"))
        elif kind in ("result", "error"):
            self._abandoned.discard(str(message.get("id")))
            waiting = self._calls.get(str(message.get("id")))
            if waiting is not None and not waiting[0].done():
                waiting[0].set_result(message)
        elif kind == "event":
            waiting = self._calls.get(str(message.get("id")))
            if waiting is not None:
                _emit(waiting[1], message)

    def _fail_all(self, error: Exception) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
        for future, _ctx in list(self._calls.values()):
            if not future.done():
                future.set_exception(error)

    def _tail(self) -> str:
        lines = [line for line in self.stderr if line.strip()]
        return ("; its last output:\n" + "\n".join(lines[-10:])) if lines else ""


def _whose(head: bytes) -> tuple[str, str | None]:
    """The type (``"?"`` when not found) and call id (None) a message's first bytes name:
    the runners write both first."""
    kind = _TYPE_RE.search(head)
    call = _ID_RE.search(head)
    kind_name = kind.group(1).decode() if kind else "?"
    return kind_name, call.group(1).decode("utf-8", "replace") if call else None


def _exit_status(returncode: int) -> str:
    """How a worker ended, for its error: the code it gave, or the signal that stopped it."""
    if returncode < 0:
        try:
            return f" (killed by {signal.Signals(-returncode).name})"
        except ValueError:
            return f" (killed by signal {-returncode})"
    return f" with code {returncode}"


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bool]]:
    """The stream's lines as ``(line, False)``; a line over the stream's limit is read past
    and given as ``(its first bytes, True)``; the last line may lack its newline."""
    while True:
        try:
            line = await stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                yield exc.partial, False
            return
        except asyncio.LimitOverrunError as exc:
            head = await stream.read(max(exc.consumed, 1))
            while True:  # drop the rest of the line, at most a limit's worth at a time
                try:
                    await stream.readuntil(b"\n")
                    break
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError as more:
                    await stream.read(max(more.consumed, 1))
            yield head[:_HEAD], True
            continue
        yield line, False


async def _capped_lines(stream: asyncio.StreamReader, limit: int) -> AsyncIterator[str]:
    """The stream's lines, decoded, each cut to ``limit`` characters (saying so). Read in
    chunks: of a line, no more than ``limit`` characters' worth is ever held."""
    keep = 4 * limit  # bytes: ``limit`` characters of any UTF-8
    line = bytearray()
    length = 0  # of the line so far, in bytes, also those not kept
    while chunk := await stream.read(_STDERR_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            line += chunk[start : start + max(0, min(end - start, keep - len(line)))]
            yield _cut(bytes(line), length + end - start, limit)
            line.clear()
            length = 0
            start = end + 1
        line += chunk[start : start + max(0, keep - len(line))]
        length += len(chunk) - start
    if length:
        yield _cut(bytes(line), length, limit)


def _cut(kept: bytes, length: int, limit: int) -> str:
    """A stderr line of ``length`` bytes, of which ``kept`` were kept, as text of at most
    ``limit`` characters and a note of the cut."""
    # 4 bytes are kept for each character shown: a character split by the cut lies past them.
    text = kept.decode("utf-8", "replace").rstrip()
    if length > len(kept) or len(text) > limit:
        return f"{text[:limit]} [... cut: the line was {length} bytes long]"
    return text


def cache_root() -> Path:
    """Where toolmesh keeps what it builds (virtual environments, bundles): $TOOLMESH_CACHE, or
    toolmesh/ under the user's cache folder."""
    configured = os.environ.get("TOOLMESH_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolmesh"


async def _kill_tree(process: asyncio.subprocess.Process, token: str) -> None:
    """Kill ``process`` and whatever it started: its group, its session, and what left them
    (marked with ``token``), also after it ended itself (a daemon it left behind)."""
    # The /proc walk and the wait for the killed to end block: off the event loop.
    sid = process.pid if process.returncode is None else None  # reaped: its pid may be reused
    # The leader last: the Python worker's init (and bwrap) reaps the worker and what it left
    await asyncio.to_thread(kill_session, sid, token, leader_last=True)


async def _end_setup(process: asyncio.subprocess.Process, token: str) -> None:
    """Kill a setup step and whatever it started, and reap it."""
    await _kill_tree(process, token)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), 5)
    transport = getattr(process, "_transport", None)  # pipes a process that left still holds
    if transport is not None:
        transport.close()


def _text(data: bytes) -> str:
    """Output as ``subprocess.run(text=True)`` decodes it (undecodable bytes replaced)."""
    text = data.decode(locale.getpreferredencoding(False), "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _emit(ctx: ToolContext, message: Mapping[str, Any]) -> None:
    kind = str(message.get("kind") or "")
    data = message.get("data")
    try:
        ctx.emit(kind, data if isinstance(data, dict) else {})
    except (ValueError, TypeError) as exc:
        ctx.log(f"dropped an invalid {kind!r} event from the tool: {exc}", level="warning")


# What fails a source's open, rather than the toolkit's start: the package, the worker or a
# setup step failed (a command that exits non-zero or runs out of time raises subprocess's
# own errors), or its sandbox cannot be had here.
_LOAD_FAILURES = (
    WorkerError,
    OSError,
    ValueError,
    TypeError,
    subprocess.SubprocessError,
    SandboxUnavailable,
)


def _failure(name: str, exc: BaseException) -> str:
    """Why a source failed, for its status: subprocess's errors say neither whose command it
    was nor what the command printed."""
    if not isinstance(exc, subprocess.SubprocessError):
        return str(exc)
    said = ""
    if isinstance(exc, subprocess.CalledProcessError):
        said = str(exc.stderr or exc.output or "").strip()[-800:]
    return f"{name}: {exc}" + (f": {said}" if said else "")


class WorkerSource(Source):
    """A source whose tools live in a worker process, started by ``open()``."""

    kind = "worker"
    start_timeout = 60.0
    # The largest integer an argument may hold, when the worker's language reads JSON numbers
    # as doubles (JavaScript: 2**53); None when it keeps every integer exact.
    exact_integers_up_to: int | None = None

    def __init__(self, name: str) -> None:
        self.name = name
        self._tools: list[Tool] = []
        self._worker: Worker | None = None
        self._lock: asyncio.Lock | None = None
        # Workers still starting (not yet ready): close() stops them too, and a start begun
        # before a close (whose epoch it bumps) keeps no worker it finishes starting.
        self._starting: set[Worker] = set()
        self._epoch = 0
        # The setup steps of prepare() running now (npm, esbuild, pip), and those being
        # spawned: close() kills them. _preparing: the epoch of the open that prepares.
        self._setups: dict[asyncio.subprocess.Process, str] = {}  # each with its token
        self._setups_spawning: set[asyncio.Event] = set()
        self._preparing: int | None = None
        self._closed = False
        self.status = SourceStatus("pending", "not started yet")

    # Subclasses: prepare (install, bundle) and say how to start the worker.
    async def prepare(self) -> None:
        """Make the worker startable (install dependencies, bundle sources); commands it runs
        go through ``run_setup``, so that a close or a cancelled open ends them."""

    async def run_setup(
        self,
        argv: Sequence[str],
        what: str,
        *,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one step of ``prepare()`` (npm install, esbuild, a virtual environment's
        build) to its end and answer as ``subprocess.run(argv, capture_output=True,
        text=True, timeout=timeout)`` does: after ``timeout`` seconds it is killed and
        ``subprocess.TimeoutExpired`` is raised. It runs in a process group of its own, and a
        ``close()`` of the source or a cancellation of the open kills the group and reaps it
        at once, instead of leaving it to run to its end (minutes, for an install); a step
        the close ended (or that a close came before) raises ``WorkerError``."""
        epoch = self._epoch if self._preparing is None else self._preparing
        closed = f"{self.name}: the source was closed while {what}"
        if epoch != self._epoch:
            raise WorkerError(closed)
        spawned = asyncio.Event()
        token = new_token()
        self._setups_spawning.add(spawned)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env={**os.environ, MARK: token},
                start_new_session=True,
            )
        finally:
            self._setups_spawning.discard(spawned)
            spawned.set()
        self._setups[process] = token  # (before any await: a close waiting for the spawn sees it)
        try:
            if epoch != self._epoch:
                raise WorkerError(closed)
            try:
                async with asyncio.timeout(timeout):
                    out, err = await process.communicate()
            except TimeoutError:
                raise subprocess.TimeoutExpired(list(argv), timeout or 0) from None
        except BaseException:  # the timeout, a close, or the open was cancelled
            await _end_setup(process, token)
            raise
        finally:
            self._setups.pop(process, None)
        returncode = process.returncode if process.returncode is not None else -1
        if returncode != 0 and epoch != self._epoch:  # killed by the close
            raise WorkerError(closed)
        return subprocess.CompletedProcess(list(argv), returncode, _text(out), _text(err))

    def command(self) -> tuple[list[str], str, dict[str, str]]:  # pragma: no cover - interface
        """argv, working folder and environment of the worker."""
        raise NotImplementedError

    async def before_start(self) -> None:
        """Checks made before each start of the worker, the first and every restart (what
        they look at may have changed since); a ``WorkerError`` stops the start."""

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def open(self) -> None:
        """Start the worker; opening an open source starts no second one."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # beside a call restarting the worker, or another open
            if self._worker is not None and self._worker.alive:
                return
            self._closed = False
            epoch = self._epoch
            try:
                await self._stop()  # a worker that died: reaped, not just forgotten
                self._preparing = epoch  # what prepare() runs is ended by a close from now
                try:
                    await self.prepare()
                finally:
                    self._preparing = None
                worker = await self._start(epoch)
                tools = [self._described(spec) for spec in worker.specs]
            except _LOAD_FAILURES as exc:
                closed = epoch != self._epoch
                await self._stop()
                self.status = SourceStatus("failed", _failure(self.name, exc))
                if not closed:
                    logger.warning("source %s failed: %s", self.name, exc)
                return
            self._tools = tools
            self.status = SourceStatus("connected")
        self.changed()

    async def close(self) -> None:
        """Stop the worker, and one still starting (an open or a call's restart): whatever
        was started before the close is gone when it returns."""
        self._epoch += 1
        self._closed = True
        await self._stop_setups()
        await self._stop()

    async def _stop_setups(self) -> None:
        """Kill and reap the setup steps running now (and those being spawned)."""
        for spawning in list(self._setups_spawning):
            await spawning.wait()
        for process, token in list(self._setups.items()):
            await _end_setup(process, token)

    async def _stop(self) -> None:
        workers = list(self._starting)
        if self._worker is not None:
            workers.append(self._worker)
            self._worker = None
        for worker in workers:
            await worker.close()

    async def _start(self, epoch: int) -> Worker:
        """A started worker, made the source's own unless the source was closed (``epoch``
        is the one the start was asked in)."""
        if epoch != self._epoch:
            raise WorkerError(f"{self.name}: the source was closed")
        await self.before_start()
        if epoch != self._epoch:
            raise WorkerError(f"{self.name}: the source was closed")
        argv, cwd, env = self.command()
        worker = Worker(argv, cwd=cwd, env=env, label=self.name)
        self._starting.add(worker)
        try:
            specs = await worker.start(self.start_timeout)
            for spec in specs:
                _check_spec(spec, self.name)
            _check_unique(specs, self.name)
            if epoch != self._epoch:
                raise WorkerError(f"{self.name}: the source was closed while its worker started")
        except BaseException as exc:
            # A rejected tool list, a close or a cancellation: no process is left running.
            await worker.close()
            if isinstance(exc, WorkerError) and epoch != self._epoch:
                raise WorkerError(
                    f"{self.name}: the source was closed while its worker started"
                ) from None
            raise
        finally:
            self._starting.discard(worker)
        self._worker = worker
        return worker

    async def _retire(self, worker: Worker) -> None:
        """Kill ``worker``; the next call starts a fresh one."""
        if self._worker is worker:
            self._worker = None
        await worker.close()

    async def _running(self) -> Worker:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._worker is None or not self._worker.alive:
                if self._closed:  # a call after close() starts no worker nobody would stop
                    raise WorkerError(f"{self.name}: the source is closed")
                epoch = self._epoch  # before any await: a close meanwhile must be seen
                if self._worker is not None:
                    await self._worker.close()
                await self._start(epoch)
            if self._worker is None:  # pragma: no cover - _start sets it
                raise WorkerError(f"{self.name}: the worker did not start")
            return self._worker

    def _described(self, spec: Mapping[str, Any]) -> Tool:
        """The tool of ``spec``, its schema compiled now: a ``parameters`` that is no usable
        JSON Schema (``properties: 3``, an unknown ``type``) fails the source, naming the tool,
        instead of raising out of ``create_toolkit`` or failing each call."""
        try:
            tool = self._tool(spec)
            tool._validator = compile_validator(tool.input_schema)
        except Exception as exc:
            raise WorkerError(
                f"{self.name}: tool {spec.get('name')!r}: its parameters are not a usable "
                f"JSON Schema: {exc}"
            ) from None
        return tool

    def _tool(self, spec: Mapping[str, Any]) -> Tool:
        name = str(spec["name"])

        async def run(args: dict[str, Any], ctx: ToolContext) -> Output | ToolResult:
            if self.exact_integers_up_to is not None:
                _check_exact_integers(args, self.exact_integers_up_to)
            worker = await self._running()
            try:
                answer = await worker.call(name, args, ctx)
            finally:
                # A cancelled call is abandoned, not killed: other calls on the worker go on.
                # Once none is left, a worker still owing an abandoned call may be stuck in it,
                # so it goes (forgotten first, so no new call catches it as it dies).
                if worker.stale and not worker.busy:
                    await self._retire(worker)
            if answer.get("type") == "error":
                raise WorkerError(str(answer.get("message") or "the tool failed"))
            output = answer.get("output")
            update = answer.get("state_update")
            if update is not None and not _is_patch(update):
                # Dropped without a word, the tool would believe its state was kept.
                refused = ToolResult.failure(
                    name,
                    ToolErrorCode.INVALID_STATE_UPDATE,
                    "state_update must be a list of JSON Patch operations (objects), not "
                    + _shape_of(update),
                )
                refused.data = output  # as the pipeline keeps it for an update it refuses
                return refused
            return Output(
                output,
                state_update=update or None,
                text=output if isinstance(output, str) else None,
            )

        definition = ToolDefinition(
            name=name,
            description=str(spec.get("description") or ""),
            capabilities=[str(c) for c in spec.get("capabilities") or []],
        )
        return Tool(definition, run, source=self.kind, input_schema=dict(spec["parameters"]))


def _check_exact_integers(value: Any, bound: int, path: str = "$") -> None:
    """``ArgumentError`` at the first integer beyond ``bound``: the worker would read a nearby
    double instead (2**70 as 1180591620717411303424.0, -2**63 as ...776000), without a word."""
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > bound:
            raise ArgumentError(
                f"{value} is beyond what the tool's language keeps exact (+-{bound}); pass it "
                "as a string",
                path=path,
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_exact_integers(item, bound, child_path(path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_exact_integers(item, bound, f"{path}[{index}]")


def _is_patch(update: Any) -> bool:
    return isinstance(update, list) and all(isinstance(op, dict) for op in update)


def _shape_of(value: Any) -> str:
    if isinstance(value, list):
        odd = next(item for item in value if not isinstance(item, dict))
        return f"a list holding {_JSON_TYPES.get(type(odd), type(odd).__name__)}"
    return _JSON_TYPES.get(type(value), type(value).__name__)


_JSON_TYPES: dict[type, str] = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def _check_spec(spec: Any, label: str) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise WorkerError(f"{label}: a tool without a name: {spec!r}"[:300])
    if not isinstance(spec.get("parameters"), dict):
        raise WorkerError(f"{label}: tool {spec['name']!r} has no JSON Schema 'parameters' object")
    capabilities = spec.get("capabilities")
    if capabilities is not None and not (
        isinstance(capabilities, list) and all(isinstance(c, str) for c in capabilities)
    ):
        raise WorkerError(f"{label}: tool {spec['name']!r}: 'capabilities' must be a list of names")


def _check_unique(specs: Sequence[dict[str, Any]], label: str) -> None:
    """Two tools of one name: the runner would run one under the other's definition."""
    seen: set[str] = set()
    for spec in specs:
        if spec["name"] in seen:
            raise WorkerError(
                f"{label}: two tools are named {spec['name']!r}; names must be unique"
            )
        seen.add(spec["name"])


_LOADER_KEYS = frozenset({"kind", "enabled", "capabilities", "prefix", "allow", "deny", "config"})


def package_entry(
    entry: Mapping[str, Any], *, base_dir: Path, kind: str, options: frozenset[str]
) -> tuple[Path, dict[str, Any]]:
    """A manifest entry of a package kind: the package's folder (``path``, relative to the
    manifest) and its settings (at the top level or in ``config``), each one known."""
    settings = dict(entry.get("config") or {})
    for key, value in entry.items():
        if key not in _LOADER_KEYS:
            settings.setdefault(key, value)
    path = settings.pop("path", None)
    if not isinstance(path, str) or not path:
        raise ConfigError(f"kind {kind!r} needs `path`, the folder of the package")
    unknown = set(settings) - options
    if unknown:
        raise ConfigError(f"kind {kind!r}: unknown setting {sorted(unknown)[0]!r}")
    return (Path(path) if Path(path).is_absolute() else base_dir / path), settings
