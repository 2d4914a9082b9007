"""Tools placed on a Ray cluster: ``OnRay(source)`` or ``placement = "ray"`` in toolmesh.toml.

Only the execution moves. The host still resolves the tool, checks policy, validates the
arguments, applies the state update and writes the audit entry; the Ray task receives the
validated arguments and a context (ids, capabilities, the state snapshot, the time left) and
sends back events while it runs and then the result. It is a streaming-generator task: each
event is one item, the result the last, so a caller sees progress as it happens.

- The deadline is the pipeline's: when it passes (or the caller cancels) the task is cancelled
  with ``force=True``, which ends the worker process even in code that never yields.
- A worker (or node) that dies is a result, not an exception: ``tool_error`` with
  ``metadata["retryable"] = True``. Ray does not retry the task itself (``max_retries=0``): a
  tool with side effects must not run twice behind the caller's back.
- The tool's code is pickled once per tool into Ray's object store; its module must be
  importable on the workers (installed there, or shipped with ``runtime_env``).

Connecting: ``address`` (else ``RAY_ADDRESS``, else Ray's own discovery or a local instance);
Ray task options such as ``num_cpus``, ``num_gpus``, ``memory``, ``resources`` and
``runtime_env`` apply to every call of the wrapped source.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import queue
import re
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from toolmesh.capabilities import CapabilitySet
from toolmesh.errors import ConfigError
from toolmesh.models import ToolErrorCode, ToolEvent, ToolResult
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.sources.wrappers import WrapperSource
from toolmesh.tools import Tool, ToolContext, ToolFunction

__all__ = ["TASK_OPTIONS", "OnRay", "placed_on_ray"]

TASK_OPTIONS = frozenset({"num_cpus", "num_gpus", "memory", "resources", "runtime_env"})
"""The Ray task options a placement may set (manifest: ``ray = {num_cpus = 2}``)."""

_connect_lock = threading.Lock()
_users: set[int] = set()  # the OnRay sources connected through the Ray this process started
_started_here = False  # whether an OnRay started Ray (then the last one to close stops it)


class OnRay(WrapperSource):
    """Runs every tool of ``wrapped`` as a Ray task; everything else stays with the host."""

    def __init__(
        self,
        wrapped: Source,
        *,
        address: str | None = None,
        init_options: Mapping[str, Any] | None = None,
        **task_options: Any,
    ) -> None:
        unknown = set(task_options) - TASK_OPTIONS
        if unknown:
            raise ConfigError(
                f"unknown Ray option(s) {', '.join(sorted(unknown))}; "
                f"a placement takes address, {', '.join(sorted(TASK_OPTIONS))}"
            )
        self.address = address
        self.init_options = dict(init_options or {})
        self.task_options = {"num_cpus": 1, **task_options, "max_retries": 0}
        self._functions: dict[int, tuple[str, bytes]] = {}  # id(function) -> key, pickle
        self._remote: Any = None
        self._closes = 0  # how many times close() was called (see _connect)
        self._closed = False  # closed, and not opened again since
        super().__init__(wrapped)

    def map(self, tool: Tool) -> Tool:
        return Tool(
            tool.definition,
            _RayRunner(self, tool),
            source=tool.source,
            input_schema=tool.input_schema,
        )

    async def open(self) -> None:
        self._closed = False
        closes = self._closes  # before any await: a close from now on stops the connection
        await self.wrapped.open()
        try:
            await asyncio.to_thread(self._connect, closes)
            for tool in self.wrapped.tools():
                self.function_ref(tool)
        except Exception as exc:
            self.status = SourceStatus("failed", f"cannot place on Ray: {exc}")

    def _connect(self, closes: int | None = None) -> None:
        """Connect (starting a local Ray when none is running). ``closes`` is the count of
        closes the open began at: the thread may reach the lock after the source's close did
        (a cancelled open, another source connecting meanwhile), and that close found nothing
        to stop, so a source closed since connects nothing, and a Ray it started while the
        close came is stopped here at once (unless another source uses it)."""
        import ray

        global _started_here
        with _connect_lock:
            if closes is not None and closes != self._closes:
                return
            if not ray.is_initialized():
                options = {"log_to_driver": False, **self.init_options}
                ray.init(address=self.address or os.environ.get("RAY_ADDRESS"), **options)
                _started_here = True
            if closes is not None and closes != self._closes:
                if _started_here and not _users:
                    _started_here = False
                    ray.shutdown()
                return
            if _started_here:
                _users.add(id(self))
        self._remote = ray.remote(_run_on_worker).options(
            num_returns="streaming", **self.task_options
        )

    async def close(self) -> None:
        self._closed = True
        self._closes += 1  # before any await: an open still connecting sees it (_connect)
        await super().close()
        await asyncio.to_thread(self._disconnect)

    def _disconnect(self) -> None:
        """Stop the Ray this process started once no source uses it: a local cluster's
        processes (raylet, dashboard agent, ...) would otherwise outlive the host."""
        global _started_here
        with _connect_lock:
            if id(self) not in _users:
                return
            _users.discard(id(self))
            if _users or not _started_here:
                return
            _started_here = False
            import ray

            ray.shutdown()

    def function_ref(self, tool: Tool) -> tuple[str, bytes]:
        """The tool's code, pickled once, and the key workers cache it under."""
        function = _function_of(tool)
        found = self._functions.get(id(function))
        if found is None:
            import ray

            try:
                pickled = ray.cloudpickle.dumps(function)
            except Exception as exc:
                raise ConfigError(f"tool {tool.name!r} cannot be sent to Ray: {exc}") from exc
            key = hashlib.sha256(pickled).hexdigest()
            found = self._functions[id(function)] = (key, pickled)
        return found

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        if self._closed:  # connecting now would start a local Ray that no close will stop
            raise RuntimeError(f"{self.name}: the Ray placement is closed")
        if self._remote is None:
            await asyncio.to_thread(self._connect)
        import ray

        key, pickled = self.function_ref(tool)
        task = self._remote.remote(key, pickled, arguments, _context_of(ctx))
        try:
            async for item in task:
                kind, first, second = await item
                if kind == "event":
                    ctx.emit(first, second)
                elif kind == "result":
                    return first
                else:
                    raise _exception(first, second)
        except asyncio.CancelledError:
            ray.cancel(task, force=True)  # the deadline passed or the caller gave up
            raise
        except ray.exceptions.RayTaskError as exc:
            # Ray's own failure around the tool (its code, arguments or result would not
            # travel): the cause, not Ray's coloured multi-line traceback, for the model.
            raise RuntimeError(
                f"the Ray task of {tool.name!r} failed outside the tool's code (sending the "
                f"tool, its arguments or its result): {_cause(exc)}"
            ) from None
        except ray.exceptions.TaskCancelledError:
            return _failure(tool.name, ToolErrorCode.CANCELLED, "the Ray task was cancelled")
        except ray.exceptions.RayError as exc:
            return _lost(tool.name, exc)
        return _lost(tool.name, RuntimeError("the task ended without a result"))


class _RayRunner:
    """The executor of one tool placed on Ray (a small object, like the function runners)."""

    __slots__ = ("placement", "tool")

    def __init__(self, placement: OnRay, tool: Tool) -> None:
        self.placement = placement
        self.tool = tool

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        return await self.placement.call(self.tool, arguments, ctx)


def _function_of(tool: Tool) -> ToolFunction:
    function: ToolFunction = tool._fn
    return function


def _context_of(ctx: ToolContext) -> dict[str, Any]:
    return {
        "tool_name": ctx.tool_name,
        "req_id": ctx.req_id,
        "session_id": ctx.session_id,
        "agent_id": ctx.agent_id,
        "correlation_id": ctx.correlation_id,
        "remaining": ctx.remaining,
        "capabilities": sorted(ctx.capabilities.tags) if ctx.capabilities is not None else None,
        "state": ctx.state,
    }


def _failure(tool_name: str, code: ToolErrorCode, message: str, **metadata: Any) -> ToolResult:
    return ToolResult.failure(tool_name, code, message, {"placement": "ray", **metadata})


def _lost(tool_name: str, exc: BaseException) -> ToolResult:
    return _failure(
        tool_name,
        ToolErrorCode.TOOL_ERROR,
        f"the Ray worker running {tool_name!r} was lost ({type(exc).__name__}); "
        "the call did not finish and may be retried",
        retryable=True,
    )


def _cause(exc: BaseException) -> str:
    """One line naming what went wrong inside a RayTaskError."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = str(exc)
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:500]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _exception(raised: Any, text: Any) -> BaseException:
    """The tool's exception as raised on the worker (or its name and text when it would not
    pickle). SystemExit and KeyboardInterrupt ended the tool on the worker: raised again here
    they would end the host, so they are the tool's error, as ``sys.exit()`` is in-process."""
    if isinstance(raised, Exception | asyncio.CancelledError):
        return raised
    if isinstance(raised, BaseException):
        return RuntimeError(f"{type(raised).__name__}: {raised}")
    return RuntimeError(f"{raised}: {text}" if text else str(raised))


# -- on the worker -------------------------------------------------------------------------------


_worker_functions: dict[str, ToolFunction] = {}
_worker_loop: asyncio.AbstractEventLoop | None = None
_worker_lock = threading.Lock()


def _run_on_worker(
    key: str, pickled: bytes, arguments: dict[str, Any], context: dict[str, Any]
) -> Iterator[tuple[str, Any, Any]]:
    """The Ray task: run the tool on the worker's event loop (a thread kept for every call) and
    yield its events as they come, then ``("result", value, None)`` or
    ``("raised", exception, text)``. The unpickled tool is kept per worker."""
    function = _worker_functions.get(key)
    if function is None:
        from ray import cloudpickle

        function = _worker_functions[key] = cloudpickle.loads(pickled)
    items: queue.SimpleQueue[ToolEvent | tuple[str, Any, Any]] = queue.SimpleQueue()
    asyncio.run_coroutine_threadsafe(_run_tool(function, arguments, context, items), _loop())
    while True:
        item = items.get()
        if isinstance(item, ToolEvent):
            yield ("event", item.kind, item.data)
            continue
        yield item
        return


def _loop() -> asyncio.AbstractEventLoop:
    global _worker_loop
    with _worker_lock:
        if _worker_loop is None:
            _worker_loop = asyncio.new_event_loop()
            threading.Thread(target=_worker_loop.run_forever, daemon=True).start()
        return _worker_loop


async def _run_tool(
    function: ToolFunction,
    arguments: dict[str, Any],
    context: dict[str, Any],
    items: queue.SimpleQueue[ToolEvent | tuple[str, Any, Any]],
) -> None:
    remaining = context["remaining"]
    capabilities = context["capabilities"]
    state = context["state"]
    ctx = ToolContext(
        tool_name=context["tool_name"],
        req_id=context["req_id"],
        session_id=context["session_id"],
        agent_id=context["agent_id"],
        correlation_id=context["correlation_id"],
        deadline=None if remaining is None else time.monotonic() + remaining,
        capabilities=None if capabilities is None else CapabilitySet(capabilities),
        state=None if state is None else (lambda: state),
        sink=items.put,
    )
    try:
        items.put(("result", await function(arguments, ctx), None))
    except BaseException as exc:
        items.put(("raised", *_portable(exc)))
    finally:
        ctx._close()


def _portable(exc: BaseException) -> tuple[Any, Any]:
    try:
        pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes, round-tripped here
    except Exception:
        return type(exc).__name__, str(exc)
    return exc, None


# -- toolmesh.toml -------------------------------------------------------------------------------


def placed_on_ray(source: Source, options: Mapping[str, Any], *, where: str = "") -> Source:
    """``placement = "ray"`` of a manifest entry, with its ``ray = {...}`` options."""
    settings = dict(options)
    address = settings.pop("address", None)
    if address is not None and not isinstance(address, str):
        raise ConfigError("ray.address must be a string", location=where)
    try:
        import ray  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError(
            "placement \"ray\" needs Ray: pip install 'toolmesh[ray]'", location=where
        ) from None
    try:
        return OnRay(source, address=address, **settings)
    except ConfigError as exc:
        raise ConfigError(str(exc), location=where) from None
