"""A Tool is a ToolDefinition bound to the code that runs it.

Every source (Python functions, plugins, built-ins, MCP servers, A2A agents, ...) produces
``Tool`` objects; the call pipeline runs them all the same way. A tool's callable receives the
validated arguments and a ``ToolContext`` (events, state snapshot, deadline, cancellation) and
returns anything the pipeline can shape into a ``ToolResult``: a plain value, an ``Output`` (value
plus a state update), or a ``ToolResult`` of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from toolmesh.models import ToolDefinition, ToolEvent, check_event_data
from toolmesh.schema import Validator, is_lossless, parameters_to_schema, schema_to_parameters
from toolmesh.strictjson import mend_text

if TYPE_CHECKING:
    from toolmesh.capabilities import CapabilitySet

__all__ = ["MAX_EVENTS_BYTES", "Output", "Tool", "ToolContext", "ToolFunction", "run_blocking"]

JsonSchema = dict[str, Any]
ToolFunction = Callable[[dict[str, Any], "ToolContext"], Awaitable[Any]]
EventSink = Callable[[ToolEvent], None]

MAX_EVENTS_BYTES = 2 * 1024 * 1024
"""How much of a call's events its result keeps by default (``Limits.max_events_bytes``): their
data as JSON and their envelopes. One event's data larger than that is replaced by a note."""
_EVENT_ENVELOPE_BYTES = 200  # type, id, version, ts and seq, with the JSON around them


@dataclass(frozen=True, slots=True)
class Output:
    """A tool's return value with extras: a state update (RFC 6902 operations), metadata, or the
    exact text a model should see instead of the value's JSON."""

    value: Any = None
    state_update: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    text: str | None = None


class Tool:
    """A definition bound to its executor.

    ``input_schema`` is the exact JSON Schema the arguments are validated against; when a source
    gives only parameters it is derived from them, and when a source gives only a schema the
    parameters are derived from it (the schema travels on the definition if they lose anything).

    ``cancels_promptly`` is a source's promise that the tool's coroutine ends soon after it is
    cancelled: it never swallows the cancellation nor waits on a peer to let go. The pipeline
    then runs it in the caller's own task, saving the task and the wake-up that let a call end
    at its deadline even when its tool ignores cancellation. Functions of unknown code never
    make this promise.
    """

    __slots__ = ("_fn", "_input_schema", "_validator", "cancels_promptly", "definition", "source")

    def __init__(
        self,
        definition: ToolDefinition,
        fn: ToolFunction,
        *,
        source: str = "python",
        input_schema: JsonSchema | None = None,
        output_schema: JsonSchema | None = None,
        cancels_promptly: bool = False,
    ) -> None:
        updates: dict[str, Any] = {}
        if input_schema is not None and not definition.input_parameters:
            updates["input_parameters"] = schema_to_parameters(input_schema)
            if not is_lossless(input_schema, updates["input_parameters"]):
                updates["input_schema"] = input_schema
        if output_schema is not None and definition.output_schema is None:
            if not definition.output_parameters:
                updates["output_parameters"] = schema_to_parameters(output_schema)
            if not is_lossless(output_schema):
                updates["output_schema"] = output_schema
        if definition.kind is None:
            updates["kind"] = source
        self.definition = definition.model_copy(update=updates) if updates else definition
        self.source = source
        self.cancels_promptly = cancels_promptly
        self._fn = fn
        self._input_schema = input_schema or self.definition.input_schema
        self._validator: Validator | None = None

    # -- identity --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def description(self) -> str:
        return self.definition.description

    @property
    def capabilities(self) -> list[str]:
        return self.definition.capabilities

    @property
    def input_schema(self) -> JsonSchema:
        """The JSON Schema of the arguments (exact when the source gave one)."""
        if self._input_schema is None:
            self._input_schema = parameters_to_schema(self.definition.input_parameters)
        return self._input_schema

    @property
    def output_schema(self) -> JsonSchema | None:
        if self.definition.output_schema is not None:
            return self.definition.output_schema
        if self.definition.output_parameters:
            return parameters_to_schema(self.definition.output_parameters)
        return None

    # -- running ---------------------------------------------------------------------------------

    def validate(self, arguments: Mapping[str, Any]) -> None:
        """Raise ``ArgumentError`` (with the bad field's path) when arguments do not fit."""
        validator = self._validator
        if validator is None:
            validator = self._validator = Validator(self.input_schema)
        validator(arguments)

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Run the tool without the pipeline (no policy, validation, deadline or audit)."""
        return await self._fn(arguments, ctx)

    def replace(self, **changes: Any) -> Tool:
        """The same executor under a changed definition (renamed, prefixed, re-tagged, ...)."""
        clone = Tool.__new__(Tool)
        clone.definition = self.definition.model_copy(update=changes)
        clone.source = self.source
        clone.cancels_promptly = self.cancels_promptly
        clone._fn = self._fn
        clone._input_schema = self._input_schema
        clone._validator = self._validator
        return clone

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, source={self.source!r})"


class ToolContext:
    """What a running tool may know and do beyond its arguments.

    Events are numbered 0, 1, 2, ... per call and may be emitted from any thread; every one is
    streamed, and ``events`` keeps those the result will hold (within its events' budget).
    ``state`` is a snapshot of the session's state document, copied on first read.
    """

    __slots__ = (
        "_cancel",
        "_closed",
        "_deadline_cap",
        "_emitted",
        "_end",
        "_event_budget",
        "_events_cut",
        "_events_fit",
        "_events_left",
        "_last_event",
        "_loop",
        "_outcome",
        "_reschedule",
        "_sink",
        "_state",
        "_state_source",
        "agent_id",
        "capabilities",
        "correlation_id",
        "deadline",
        "events",
        "req_id",
        "session_id",
        "tool_name",
    )

    def __init__(
        self,
        *,
        tool_name: str,
        req_id: str = "",
        session_id: str = "",
        agent_id: str = "",
        correlation_id: str = "",
        deadline: float | None = None,
        capabilities: CapabilitySet | None = None,
        state: Callable[[], Mapping[str, Any]] | None = None,
        sink: EventSink | None = None,
        events: list[ToolEvent] | None = None,
        event_budget: int = MAX_EVENTS_BYTES,
    ) -> None:
        self.tool_name = tool_name
        self.req_id = req_id
        self.session_id = session_id
        self.agent_id = agent_id
        self.correlation_id = correlation_id
        self.deadline = deadline
        self.capabilities = capabilities
        self.events: list[ToolEvent] = events if events is not None else []
        self._state_source = state
        self._state: dict[str, Any] | None = None
        self._sink = sink
        self._cancel: threading.Event | None = None
        self._closed = False
        self._deadline_cap: float | None = None  # the host's longest call, set by the pipeline
        self._reschedule: Callable[[float], None] | None = None
        self._outcome: asyncio.Future[Any] | None = None  # the pipeline waits on it (suspended)
        self._end: Callable[[str], None] | None = None  # ends a call run in the caller's task
        # What the result may keep of the events (``MAX_EVENTS_BYTES``): ``_events_fit`` is
        # how many of the first events fit, once one does not; ``_events_cut`` that one event's
        # data was replaced by a note.
        self._event_budget = self._events_left = event_budget
        self._events_fit: int | None = None
        self._events_cut = False
        # Events past the budget are streamed but not kept: a long call's events would
        # otherwise pile up in memory only to be cut from its result.
        self._emitted = len(self.events)
        self._last_event: ToolEvent | None = None
        if self.events:  # from before the tool ran: its approval
            for index, given in enumerate(self.events):
                self._spend(index, given, event_data_size(given.data))
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # -- reading ---------------------------------------------------------------------------------

    @property
    def state(self) -> dict[str, Any]:
        """A private copy of the session's state document (``{"context": {}}`` at first)."""
        if self._state is None:
            source = self._state_source() if self._state_source else {"context": {}}
            self._state = copy.deepcopy(dict(source))
        return self._state

    @property
    def remaining(self) -> float | None:
        """Seconds left before the call's deadline, or None when it has none."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    @property
    def cancelled(self) -> bool:
        """True once the call was cancelled or ran out of time; long loops should check it."""
        return self._cancel is not None and self._cancel.is_set()

    def extend_deadline(self, deadline: float, *, limit: float | None = None) -> None:
        """Move the deadline later, to ``deadline`` (a ``time.monotonic()`` value), never past
        ``limit`` nor the host's longest allowed call. For a tool whose progress shows it is still
        working; call it from the event loop's thread."""
        if self.deadline is None or self._closed:
            return
        for cap in (limit, self._deadline_cap):
            if cap is not None:
                deadline = min(deadline, cap)
        if deadline <= self.deadline:
            return
        self.deadline = deadline
        if self._reschedule is not None:
            self._reschedule(deadline)

    def cancel_event(self) -> threading.Event:
        """A threading.Event set when the call ends early, for blocking code to wait on."""
        if self._cancel is None:
            self._cancel = threading.Event()
        return self._cancel

    # -- emitting --------------------------------------------------------------------------------

    def emit(self, kind: str, data: dict[str, Any] | None = None) -> None:
        """Stream an event to the caller. Safe from any thread; dropped once the call is over.

        ``data`` must have a JSON form (``ValueError`` otherwise): the event holds that form, as
        every transport delivers it. Data larger than the events' budget is replaced by a note.
        The kinds the host makes itself (``state``, ``approval``) are refused (``ValueError``)."""
        check_tool_event_kind(kind)
        prepared = self._prepare(kind, data)
        loop = self._loop
        if loop is not None and not _on_loop_thread(loop):
            loop.call_soon_threadsafe(self._append, kind, *prepared)
        else:
            self._append(kind, *prepared)

    def _prepare(self, kind: str, data: dict[str, Any] | None) -> tuple[dict[str, Any], int, bool]:
        """An event's data checked and encoded on the emitter's own thread, where a
        ``ValueError`` reaches the tool: what ``_append`` takes after ``kind``."""
        payload = dict(data or {})
        check_event_data(kind, payload)
        encoded = _event_json(kind, payload)
        cut = len(encoded) > self._event_budget
        if cut:
            encoded = _omitted_note(len(encoded), self._event_budget)
        return from_json(encoded), len(encoded), cut  # a copy of its own, as a peer reads it

    def progress(self, pct: int | float, message: str = "") -> None:
        self.emit("progress", {"pct": max(0, min(100, round(pct))), "message": message})

    def status(self, message: str) -> None:
        self.emit("status", {"message": message})

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", {"level": level, "message": message})

    def artifact(
        self, name: str, chunk: str, *, mime: str = "text/plain", final: bool = True
    ) -> None:
        self.emit("artifact", {"name": name, "mime": mime, "chunk": chunk, "final": final})

    def activity(self, activity_type: str, patch: list[dict[str, Any]]) -> None:
        """A stateless UI update (seed 003): a JSON Patch against this activity's content.
        Streamed to the caller, never persisted."""
        self.emit("activity", {"activity_type": activity_type, "patch": patch})

    def _append(self, kind: str, data: dict[str, Any], size: int, cut: bool) -> None:
        """Record an event (on the loop's thread): ``size`` of its data as JSON; ``cut``: that
        data is a note standing for data too large."""
        if self._closed:
            return
        seq = self._emitted
        self._emitted = seq + 1
        event = ToolEvent(kind=kind, req_id=self.req_id, data=data, seq=seq)
        self._last_event = event
        if self._events_fit is None:
            self._spend(seq, event, size)
            if self._events_fit is None:
                self.events.append(event)
                self._events_cut = self._events_cut or cut
        if self._sink is not None:
            self._sink(event)

    def _spend(self, index: int, event: ToolEvent, data_size: int) -> None:
        """Count ``events[index]`` against what the result may keep of them."""
        self._events_left -= event_cost(event, data_size)
        if self._events_left < 0 and self._events_fit is None:
            self._events_fit = index

    def _close(self, *, cancelled: bool = False) -> None:
        """End the call: later events are dropped; blocking code sees ``cancelled``."""
        self._closed = True
        if cancelled:
            self.cancel_event().set()


def event_cost(event: ToolEvent, data_size: int) -> int:
    """About what ``event`` takes on the wire, given the size of its data as JSON."""
    return data_size + len(event.kind) + len(event.req_id) + _EVENT_ENVELOPE_BYTES


def event_data_size(data: dict[str, Any]) -> int:
    """The size of an event's data as JSON (for events not made by ``emit``, which knows it)."""
    try:
        return len(to_json(data, fallback=str))
    except PydanticSerializationError:  # a lone surrogate, which the wire form mends
        return len(to_json(mend_text(data), fallback=str))


# The events the host makes itself, and what a tool does instead. Clients act on them (an AG-UI
# front end applies a "state" event's delta, a client's approval handler answers an "approval"),
# so a tool emitting one would plant a state change or an approval request nobody made.
_HOST_EVENT_KINDS = {
    "state": "return Output(state_update=...)",
    "approval": "declare the tool with requires_approval=True (or a policy rule) to be approved",
}


def check_tool_event_kind(kind: str) -> None:
    """Raise ValueError when ``kind`` is one the host makes itself, not a tool."""
    instead = _HOST_EVENT_KINDS.get(kind)
    if instead is not None:
        raise ValueError(f"the {kind!r} event is the host's own: {instead}")


def _event_json(kind: str, data: dict[str, Any]) -> bytes:
    """``data`` as JSON, NaN and infinity written as null (JSON has neither); ``ValueError``
    naming the event's kind when it has no JSON form. A lone surrogate becomes U+FFFD."""
    try:
        return to_json(data, inf_nan_mode="null")
    except PydanticSerializationError:
        pass
    try:
        return to_json(mend_text(data), inf_nan_mode="null")
    except PydanticSerializationError as exc:
        raise ValueError(f"the data of a {kind!r} event must be JSON: {exc}") from None


def _omitted_note(size: int, budget: int) -> bytes:
    return to_json(
        {"data_omitted": f"{size} bytes of JSON, more than the {budget} a call's events may hold"}
    )


# Blocking tools get their own pool: a tool that ignores its deadline keeps its thread busy
# until it returns, and it must not starve the event loop's default executor.
_BLOCKING_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="toolmesh-tool")


_busy_threads = 0


async def run_blocking(fn: Callable[..., Any], /, *args: Any) -> Any:
    """Run blocking ``fn(*args)`` on a worker thread, context variables included."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(_BLOCKING_POOL, _counted, context.run, fn, *args)


def _counted(run: Callable[..., Any], *args: Any) -> Any:
    global _busy_threads
    _busy_threads += 1
    try:
        return run(*args)
    finally:
        _busy_threads -= 1


def busy_threads() -> int:
    """How many blocking tools are running now (including ones past their deadline)."""
    return _busy_threads


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
