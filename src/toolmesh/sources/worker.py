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
worker, so the worker is killed and starts again on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolmesh.errors import ConfigError, ToolmeshError
from toolmesh.models import ToolDefinition
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.tools import Output, Tool, ToolContext

__all__ = ["Worker", "WorkerError", "WorkerSource", "cache_root"]

logger = logging.getLogger("toolmesh.worker")

LINE_LIMIT = 32 * 1024 * 1024
STDERR_LINES = 40


class WorkerError(ToolmeshError):
    """The worker process failed to start, crashed, or broke the protocol."""


class Worker:
    """One running worker process and the calls in flight on it."""

    def __init__(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], label: str):
        self.argv = list(argv)
        self.cwd = cwd
        self.env = dict(env)
        self.label = label
        self.process: asyncio.subprocess.Process | None = None
        self.specs: list[dict[str, Any]] = []
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._calls: dict[str, tuple[asyncio.Future[dict[str, Any]], ToolContext]] = {}
        self._ready: asyncio.Future[list[dict[str, Any]]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._next = 0
        self._closing = False

    async def start(self, timeout: float) -> list[dict[str, Any]]:
        """Start the process and wait for its list of tools."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
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
        self._tasks = [
            asyncio.ensure_future(self._read_messages()),
            asyncio.ensure_future(self._read_stderr()),
        ]
        try:
            async with asyncio.timeout(timeout):
                self.specs = await self._ready
        except TimeoutError:
            await self.close()
            raise WorkerError(
                f"{self.label}: no tool list after {timeout:g}s{self._tail()}"
            ) from None
        except WorkerError:
            await self.close()
            raise
        return self.specs

    @property
    def alive(self) -> bool:
        return not self._closing and self.process is not None and self.process.returncode is None

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
        finally:
            self._calls.pop(call_id, None)

    async def close(self) -> None:
        """Kill the worker (and anything it started) and reap it."""
        self._closing = True
        process = self.process
        if process is not None:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_all(WorkerError(f"{self.label}: the worker was stopped"))

    # -- reading ---------------------------------------------------------------------------------

    async def _read_messages(self) -> None:
        stream = self.process.stdout if self.process is not None else None
        if stream is None:
            return
        try:
            while line := await stream.readline():
                self._dispatch(line)
        except (ValueError, asyncio.LimitOverrunError):
            logger.warning("%s: a message longer than %d bytes; stopping", self.label, LINE_LIMIT)
        if self.process is not None:
            await self.process.wait()
        self._fail_all(WorkerError(f"{self.label}: the worker exited{self._tail()}"))

    async def _read_stderr(self) -> None:
        stream = self.process.stderr if self.process is not None else None
        if stream is None:
            return
        with contextlib.suppress(ValueError, asyncio.LimitOverrunError):
            while line := await stream.readline():
                self.stderr.append(line.decode("utf-8", "replace").rstrip())

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
            kind = message["type"]
        except (ValueError, KeyError, TypeError):
            self.stderr.append("[not a protocol message] " + line.decode("utf-8", "replace")[:200])
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


def cache_root() -> Path:
    """Where toolmesh keeps what it builds (virtual environments, bundles): $TOOLMESH_CACHE, or
    toolmesh/ under the user's cache folder."""
    configured = os.environ.get("TOOLMESH_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolmesh"


def _emit(ctx: ToolContext, message: Mapping[str, Any]) -> None:
    kind = str(message.get("kind") or "")
    data = message.get("data")
    try:
        ctx.emit(kind, data if isinstance(data, dict) else {})
    except (ValueError, TypeError) as exc:
        ctx.log(f"dropped an invalid {kind!r} event from the tool: {exc}", level="warning")


class WorkerSource(Source):
    """A source whose tools live in a worker process, started by ``open()``."""

    kind = "worker"
    start_timeout = 60.0

    def __init__(self, name: str) -> None:
        self.name = name
        self._tools: list[Tool] = []
        self._worker: Worker | None = None
        self._lock: asyncio.Lock | None = None
        self.status = SourceStatus("pending", "not started yet")

    # Subclasses: prepare (install, bundle) and say how to start the worker.
    async def prepare(self) -> None:
        """Make the worker startable (install dependencies, bundle sources)."""

    def command(self) -> tuple[list[str], str, dict[str, str]]:  # pragma: no cover - interface
        """argv, working folder and environment of the worker."""
        raise NotImplementedError

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def open(self) -> None:
        try:
            await self.prepare()
            worker = await self._start()
        except (WorkerError, OSError, ValueError) as exc:
            self.status = SourceStatus("failed", str(exc))
            logger.warning("source %s failed: %s", self.name, exc)
            return
        self._tools = [self._tool(spec) for spec in worker.specs]
        self.status = SourceStatus("connected")
        self.changed()

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.close()
            self._worker = None

    async def _start(self) -> Worker:
        argv, cwd, env = self.command()
        worker = Worker(argv, cwd=cwd, env=env, label=self.name)
        specs = await worker.start(self.start_timeout)
        for spec in specs:
            _check_spec(spec, self.name)
        self._worker = worker
        return worker

    async def _running(self) -> Worker:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._worker is None or not self._worker.alive:
                if self._worker is not None:
                    await self._worker.close()
                await self._start()
            if self._worker is None:  # pragma: no cover - _start sets it
                raise WorkerError(f"{self.name}: the worker did not start")
            return self._worker

    def _tool(self, spec: Mapping[str, Any]) -> Tool:
        name = str(spec["name"])

        async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
            worker = await self._running()
            try:
                answer = await worker.call(name, args, ctx)
            except asyncio.CancelledError:
                # It may be stuck in the call. Forget it now, before closing it, so the next
                # call starts a fresh worker instead of catching this one as it dies.
                if self._worker is worker:
                    self._worker = None
                await worker.close()
                raise
            if answer.get("type") == "error":
                raise WorkerError(str(answer.get("message") or "the tool failed"))
            output = answer.get("output")
            update = answer.get("state_update")
            return Output(
                output,
                state_update=update if isinstance(update, list) and update else None,
                text=output if isinstance(output, str) else None,
            )

        definition = ToolDefinition(
            name=name,
            description=str(spec.get("description") or ""),
            capabilities=[str(c) for c in spec.get("capabilities") or []],
        )
        return Tool(definition, run, source=self.kind, input_schema=dict(spec["parameters"]))


def _check_spec(spec: Any, label: str) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise WorkerError(f"{label}: a tool without a name: {spec!r}"[:300])
    if not isinstance(spec.get("parameters"), dict):
        raise WorkerError(f"{label}: tool {spec['name']!r} has no JSON Schema 'parameters' object")


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
