"""A session's tool activity as an AG-UI event stream, so AG-UI front ends can show it live.

The stream is a sequence of runs, as the AG-UI client's verifier requires (the first event is
a RUN_STARTED, a run ends before the next starts, nothing follows a RUN_ERROR, so one is sent
only as a stream's last event, when its subscriber fell too far behind):

    RUN_STARTED, STATE_SNAPSHOT, RUN_FINISHED           (a subscriber's own first run)

    RUN_STARTED                                         (a call starts while no run is open)
    TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END      (each call, as it was asked for)
    ACTIVITY_SNAPSHOT / ACTIVITY_DELTA, CUSTOM          (while it runs: activity; progress, ...)
    TOOL_CALL_RESULT                                    (what the model sees; its metadata
                                                         says whether it succeeded, and why not)
    STATE_DELTA                                         (when the call changed the state)
    RUN_FINISHED                                        (once no call of the run is running;
                                                         its result sums the run's calls up)

One run lasts as long as calls a subscriber saw start are running: calls that overlap share it,
each its own TOOL_CALL_START .. TOOL_CALL_RESULT. A subscriber joining while a run is open gets
its RUN_STARTED, a STATE_SNAPSHOT and the start of each call still running (and a snapshot of
its activity) instead of a run of its own. Calls that started while nobody subscribed are not
shown, but every change of the state after a subscriber's snapshot is: as a STATE_DELTA in the
open run or in a run of its own, or as a fresh STATE_SNAPSHOT when the subscriber missed a
change (states are versioned, so each one applies to the document it was made against). A
change is taken from the call's result, where the pipeline put its state event: a tool cannot
emit one (``ToolContext.emit`` refuses the kind), and no "state" event streamed is trusted.

A subscriber's backlog is bounded (``_QUEUE_LIMIT`` items). Past half of it, progress and status
events (each one superseded by the next) are dropped for it; one that falls behind by the whole
limit is cut off: its unread backlog is dropped and its stream ends with a RUN_ERROR (code
``toolmesh.backlog_full``) saying so. Dropping any other event would leave a run unfinished, an
activity or a delta applied to the wrong document; what it did read is a valid stream, and
subscribing again starts afresh from a snapshot. Events are JSON objects with the spec's
camelCase field names. The stream costs nothing until someone subscribes.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from toolmesh.models import ToolEvent, ToolResult
from toolmesh.pipeline import CallObserver, CallSpec

if TYPE_CHECKING:
    from toolmesh.pipeline import Pipeline
    from toolmesh.session import Session
    from toolmesh.state import StateManager
    from toolmesh.tools import Tool

__all__ = ["AguiStream"]

logger = logging.getLogger("toolmesh.agui")

Event = dict[str, Any]
_QUEUE_LIMIT = 10_000  # unread items a subscriber may have before it is cut off
_SUPERSEDED = frozenset({"toolmesh.progress", "toolmesh.status"})  # dropped past half of it
_SUMMARY_CALLS = 100  # call summaries a RUN_FINISHED lists: the run's last ones


class _Snapshot:
    """In a subscriber's queue: its STATE_SNAPSHOT goes here (read when the reader gets here)."""


class _StateChange:
    """In a subscriber's queue: one change of the state, shown unless the subscriber's copy
    already holds it; ``run_id`` names the run of its own it needs when no run is open."""

    __slots__ = ("delta", "run_id", "version")

    def __init__(self, delta: list[Any], version: int, run_id: str | None) -> None:
        self.delta = delta
        self.version = version
        self.run_id = run_id


_Item = Event | _Snapshot | _StateChange | None  # None: the stream ends
_SNAPSHOT = _Snapshot()


class _Call:
    """A running call the subscribers saw start: what a later subscriber is shown of it."""

    __slots__ = ("activities", "req_id", "started")

    def __init__(self, req_id: str, started: list[Event]) -> None:
        self.req_id = req_id
        self.started = started  # TOOL_CALL_START .. TOOL_CALL_END, as first sent
        self.activities: dict[str, Any] = {}  # each activity's content, by activity type


class _Run:
    """A session's open run: open while a call its subscribers saw start is running."""

    __slots__ = ("calls", "ended", "ended_count", "failed_count", "started")

    def __init__(self, started: Event) -> None:
        self.started = started  # its RUN_STARTED, for subscribers joining while it is open
        self.calls: dict[int, _Call] = {}  # by CallSpec: a client may reuse a call's id at once
        # Its calls that ended: counted, and the last ones' summaries (one long call holds a
        # run open while any number of others come and go).
        self.ended: deque[dict[str, Any]] = deque(maxlen=_SUMMARY_CALLS)
        self.ended_count = self.failed_count = 0

    def call_ended(self, summary: dict[str, Any]) -> None:
        self.ended.append(summary)
        self.ended_count += 1
        self.failed_count += not summary["success"]

    def summary(self) -> dict[str, Any]:
        """Its RUN_FINISHED's result: did all its calls succeed, how many ended (and failed),
        and the summaries of the last of them (``callsOmitted``: how many earlier ones not)."""
        return {
            "success": self.failed_count == 0,
            "callCount": self.ended_count,
            "failedCount": self.failed_count,
            "calls": list(self.ended),
            "callsOmitted": self.ended_count - len(self.ended),
        }


class AguiStream(CallObserver):
    """Fans a pipeline's calls out to AG-UI subscribers, per session.

    Only calls that started while their session had a subscriber are shown, inside the
    session's open run; one who joins mid-run is first shown that run's start, the state, and
    the start of each call still running and a snapshot of its activity. Every change of the
    state reaches every subscriber, whichever call made it."""

    def __init__(self, pipeline: Pipeline, state: StateManager) -> None:
        self._pipeline = pipeline
        self._state = state
        self._subscribers: dict[str, set[asyncio.Queue[_Item]]] = {}
        self._runs: dict[str, _Run] = {}  # by session: the run its subscribers are shown

    async def events(self, session_id: str) -> AsyncIterator[Event]:
        """AG-UI events of one session from now on, starting with a run holding a snapshot of
        its state."""
        queue: asyncio.Queue[_Item] = asyncio.Queue()  # bounded by _offer, the end always fits
        self._subscribe(session_id, queue)
        view = _View(self._state, session_id)
        try:
            while (item := await queue.get()) is not None:
                for event in await view.shown(item):
                    yield event
        finally:
            self._unsubscribe(session_id, queue)

    def close(self) -> None:
        """End every subscriber's stream (a stalled one too: the end fits past its backlog)."""
        for session_id in list(self._subscribers):
            self.end(session_id)

    def end(self, session_id: str) -> None:
        """End the streams of one session (it closed): its subscribers see the end after what
        they have not read yet."""
        for queue in list(self._subscribers.get(session_id, ())):
            self._drop_queue(session_id, queue)  # nothing more is queued for it
            queue.put_nowait(None)

    def _subscribe(self, session_id: str, queue: asyncio.Queue[_Item]) -> None:
        if not self._subscribers and self not in self._pipeline.observers:
            self._pipeline.observers.append(self)
        self._subscribers.setdefault(session_id, set()).add(queue)
        for item in self._opening(session_id):
            if not self._offer(session_id, queue, item):
                break

    def _opening(self, session_id: str) -> list[_Item]:
        """What a new subscriber is shown first: a run of its own holding the state, or, while
        the session has a run open, that run as a subscriber from its start sees it now (the
        transient events aside), so it then follows it as the others do."""
        run = self._runs.get(session_id)
        if run is None:
            run_id = uuid.uuid4().hex
            return [_run_started(session_id, run_id), _SNAPSHOT, _run_finished(session_id, run_id)]
        items: list[_Item] = [run.started, _SNAPSHOT]
        for call in run.calls.values():
            items += call.started
            for activity_type, content in call.activities.items():
                items.append(_activity_snapshot(call.req_id, activity_type, content))
        return items

    def _unsubscribe(self, session_id: str, queue: asyncio.Queue[_Item]) -> None:
        self._drop_queue(session_id, queue)
        if not self._subscribers and self in self._pipeline.observers:
            self._pipeline.observers.remove(self)

    def _drop_queue(self, session_id: str, queue: asyncio.Queue[_Item]) -> None:
        queues = self._subscribers.get(session_id)
        if queues is None or queue not in queues:
            return  # cut off already
        queues.discard(queue)
        if not queues:
            del self._subscribers[session_id]
            self._runs.pop(session_id, None)  # nobody is left to show its runs to

    def _send(self, session_id: str, item: _Item) -> None:
        for queue in list(self._subscribers.get(session_id, ())):  # one may be cut off
            self._offer(session_id, queue, item)

    def _offer(self, session_id: str, queue: asyncio.Queue[_Item], item: _Item) -> bool:
        """Queue ``item`` for one subscriber; False when it was cut off, its backlog full."""
        backlog = queue.qsize()
        if backlog >= _QUEUE_LIMIT // 2 and _superseded(item):
            return True  # dropped: the next progress or status event supersedes it
        if backlog < _QUEUE_LIMIT:
            queue.put_nowait(item)
            return True
        self._cut_off(session_id, queue)
        return False

    def _cut_off(self, session_id: str, queue: asyncio.Queue[_Item]) -> None:
        """End a stalled subscriber's stream: it costs no more memory, and what it read stays a
        stream the verifier accepts (losing just the events that do not fit would not)."""
        # Its observer stays until its reader leaves: the pipeline may be iterating over them.
        self._drop_queue(session_id, queue)
        logger.warning(
            "AG-UI: a subscriber of session %s fell %d events behind; its stream ends",
            session_id,
            _QUEUE_LIMIT,
        )
        while not queue.empty():
            queue.get_nowait()  # unread: the subscriber starts afresh from a snapshot anyway
        queue.put_nowait(_backlog_full())
        queue.put_nowait(None)

    def _call(self, session_id: str, spec: CallSpec) -> _Call | None:
        run = self._runs.get(session_id)
        return None if run is None else run.calls.get(id(spec))

    # -- the pipeline's side -------------------------------------------------------------------

    def call_started(self, session: Session, spec: CallSpec, tool: Tool | None) -> None:
        if session.id not in self._subscribers:
            return
        run = self._runs.get(session.id)
        if run is None:  # the first call of a run (a call overlapping it joins it instead)
            run = self._runs[session.id] = _Run(_run_started(session.id, spec.req_id))
            self._send(session.id, run.started)
        call = spec.req_id
        delta = json.dumps(spec.arguments, ensure_ascii=False, default=str)
        started = [
            _event("TOOL_CALL_START", toolCallId=call, toolCallName=spec.tool_name),
            _event("TOOL_CALL_ARGS", toolCallId=call, delta=delta),
            _event("TOOL_CALL_END", toolCallId=call),
        ]
        run.calls[id(spec)] = _Call(call, started)
        for event in started:
            self._send(session.id, event)

    def call_event(self, session: Session, spec: CallSpec, event: ToolEvent) -> None:
        if event.kind == "state":  # shown from the result, which the pipeline gives it
            return
        call = self._call(session.id, spec)
        if call is None:  # it started unseen: nobody saw its TOOL_CALL_START
            return
        if event.kind == "activity":
            self._activity(session.id, spec.req_id, call, event.data)
        else:
            value = {"toolCallId": spec.req_id, "seq": event.seq, **event.data}
            self._send(session.id, _event("CUSTOM", name=f"toolmesh.{event.kind}", value=value))

    def call_ended(self, session: Session, spec: CallSpec, result: ToolResult) -> None:
        change = _change_of(result)  # a change made but not on the result: the next resyncs
        run = self._runs.get(session.id)
        if run is None or run.calls.pop(id(spec), None) is None:  # started unseen
            if change is not None and session.id in self._subscribers:
                # Not its run (nobody saw it start): the open one, or a run of its own
                own_run = None if run is not None else uuid.uuid4().hex
                self._send(session.id, _StateChange(change["delta"], change["version"], own_run))
            return
        run.call_ended({"toolCallId": spec.req_id, **_summary(result)})
        self._send(session.id, _tool_call_result(spec.req_id, result))
        if change is not None:
            self._send(session.id, _StateChange(change["delta"], change["version"], None))
        if not run.calls and self._runs.get(session.id) is run:  # its last call ended (and
            del self._runs[session.id]  # its subscribers were not all cut off meanwhile)
            self._send(session.id, _run_finished(session.id, run.started["runId"], run.summary()))

    def _activity(self, session_id: str, req_id: str, call: _Call, data: dict[str, Any]) -> None:
        import jsonpatch

        activity_type = str(data.get("activity_type", "activity"))
        patch = list(data.get("patch") or [])
        first = activity_type not in call.activities
        try:
            content = jsonpatch.apply_patch(
                call.activities.get(activity_type, {}), patch, in_place=False
            )
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
            return  # a malformed activity patch is dropped: activity is best-effort UI state
        call.activities[activity_type] = content
        if first:
            self._send(session_id, _activity_snapshot(req_id, activity_type, content))
        else:
            self._send(
                session_id,
                _event(
                    "ACTIVITY_DELTA",
                    messageId=f"{req_id}:{activity_type}",
                    activityType=activity_type,
                    patch=patch,
                ),
            )


class _View:
    """One subscriber's side: which version of the state its copy is at, so each change is
    shown once, and only on top of the document it was made against."""

    def __init__(self, state: StateManager, session_id: str) -> None:
        self._state = state
        self._session_id = session_id
        self._version = -1  # none before its snapshot

    async def shown(self, item: Event | _Snapshot | _StateChange) -> list[Event]:
        if isinstance(item, _Snapshot):
            return [await self._snapshot()]
        if isinstance(item, _StateChange):
            return await self._change(item)
        return [item]

    async def _change(self, change: _StateChange) -> list[Event]:
        if change.version <= self._version:
            return []  # its snapshot holds it already (read after the change was made)
        if change.version == self._version + 1:
            self._version = change.version
            shown = _event("STATE_DELTA", delta=change.delta)
        else:  # it missed a change (made elsewhere, or ending later): resynchronise
            shown = await self._snapshot()
        if change.run_id is None:
            return [shown]
        return [
            _run_started(self._session_id, change.run_id),
            shown,
            _run_finished(self._session_id, change.run_id),
        ]

    async def _snapshot(self) -> Event:
        record = await self._state.current(self._session_id)
        self._version = record.version
        return _event("STATE_SNAPSHOT", snapshot=record.document)


def _is_change(data: dict[str, Any]) -> bool:
    """A state event as the pipeline sends it once it applied a patch."""
    version = data.get("version")
    return isinstance(data.get("delta"), list) and isinstance(version, int)


def _change_of(result: ToolResult) -> dict[str, Any] | None:
    """The state change a call made, as its result carries it: the pipeline's state event is
    its last event once its update is applied (a tool's own events hold none: see the module's
    docstring)."""
    if not (result.success and result.state_update and result.events):
        return None
    last = result.events[-1]
    return last.data if last.kind == "state" and _is_change(last.data) else None


def _run_started(session_id: str, run_id: str) -> Event:
    return _event("RUN_STARTED", threadId=session_id, runId=run_id)


def _run_finished(session_id: str, run_id: str, result: dict[str, Any] | None = None) -> Event:
    if result is None:
        return _event("RUN_FINISHED", threadId=session_id, runId=run_id)
    return _event("RUN_FINISHED", threadId=session_id, runId=run_id, result=result)


def _tool_call_result(req_id: str, result: ToolResult) -> Event:
    """A call's result; a failure too (a RUN_ERROR would end the whole stream for an AG-UI
    client), its metadata saying it failed and why."""
    metadata = _summary(result)
    if not result.success:
        metadata |= {"errorCode": result.error_code or "", "error": result.error or ""}
    return _event(
        "TOOL_CALL_RESULT",
        messageId=f"{req_id}:result",
        toolCallId=req_id,
        content=result.output,
        role="tool",
        metadata=metadata,
    )


def _activity_snapshot(req_id: str, activity_type: str, content: Any) -> Event:
    return _event(
        "ACTIVITY_SNAPSHOT",
        messageId=f"{req_id}:{activity_type}",
        activityType=activity_type,
        content=copy.deepcopy(content),  # its own: later patches change the kept content
    )


def _event(kind: str, **fields: Any) -> Event:
    return {"type": kind, "timestamp": int(time.time() * 1000), **fields}


def _summary(result: ToolResult) -> dict[str, Any]:
    return {
        "success": result.success,
        "toolName": result.tool_name,
        "durationMs": result.duration_ms,
    }


def _superseded(item: _Item) -> bool:
    """A CUSTOM event whose news the next one of its kind supersedes (progress, status)."""
    return isinstance(item, dict) and item["type"] == "CUSTOM" and item["name"] in _SUPERSEDED


def _backlog_full() -> Event:
    """The last event of a subscriber cut off: an AG-UI client accepts nothing after it."""
    return _event(
        "RUN_ERROR",
        message=f"this stream fell more than {_QUEUE_LIMIT} events behind and ends: "
        "subscribe again for the current state",
        code="toolmesh.backlog_full",
    )
