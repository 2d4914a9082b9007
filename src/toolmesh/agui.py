"""A session's tool activity as an AG-UI event stream, so AG-UI front ends can show it live.

The stream is a sequence of runs, as the AG-UI client's verifier requires (the first event is
a RUN_STARTED, a run ends before the next starts, nothing follows a RUN_ERROR, so none is sent):

    RUN_STARTED, STATE_SNAPSHOT, RUN_FINISHED           (a subscriber's own first run)

    RUN_STARTED                                         (a call starts while no run is open)
    TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END      (each call, as it was asked for)
    ACTIVITY_SNAPSHOT / ACTIVITY_DELTA, CUSTOM          (while it runs: activity; progress, ...)
    TOOL_CALL_RESULT                                    (what the model sees; its metadata
                                                         says whether it succeeded, and why not)
    STATE_DELTA                                         (when the call changed the state)
    RUN_FINISHED                                        (once no call of the run is running)

One run lasts as long as calls a subscriber saw start are running: calls that overlap share it,
each its own TOOL_CALL_START .. TOOL_CALL_RESULT. A subscriber joining while a run is open gets
its RUN_STARTED, a STATE_SNAPSHOT and the start of each call still running (and a snapshot of
its activity) instead of a run of its own. Calls that started while nobody subscribed are not
shown, but every change of the state after a subscriber's snapshot is: as a STATE_DELTA in the
open run or in a run of its own, or as a fresh STATE_SNAPSHOT when the subscriber missed a
change (states are versioned, so each one applies to the document it was made against). Events
are JSON objects with the spec's camelCase field names. The stream costs nothing until someone
subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import uuid
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

Event = dict[str, Any]
_QUEUE_LIMIT = 10_000


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

    __slots__ = ("calls", "ended", "started")

    def __init__(self, started: Event) -> None:
        self.started = started  # its RUN_STARTED, for subscribers joining while it is open
        self.calls: dict[int, _Call] = {}  # by CallSpec: a client may reuse a call's id at once
        self.ended: list[dict[str, Any]] = []  # the summaries of its calls that ended

    def summary(self) -> dict[str, Any]:
        """Its RUN_FINISHED's result: did all its calls succeed, and each call's summary."""
        return {"success": all(call["success"] for call in self.ended), "calls": self.ended}


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
        # By session and call: the state change a call made, until its result is sent.
        self._deltas: dict[tuple[str, int], dict[str, Any]] = {}

    async def events(self, session_id: str) -> AsyncIterator[Event]:
        """AG-UI events of one session from now on, starting with a run holding a snapshot of
        its state."""
        queue: asyncio.Queue[_Item] = asyncio.Queue(_QUEUE_LIMIT)
        self._subscribe(session_id, queue)
        view = _View(self._state, session_id)
        try:
            while (item := await queue.get()) is not None:
                for event in await view.shown(item):
                    yield event
        finally:
            self._unsubscribe(session_id, queue)

    def close(self) -> None:
        """End every subscriber's stream (a stalled one too: its backlog makes room for the end)."""
        for session_id in list(self._subscribers):
            self.end(session_id)

    def end(self, session_id: str) -> None:
        """End the streams of one session (it closed): its subscribers see the end at once."""
        for queue in self._subscribers.get(session_id, ()):
            while queue.full():
                queue.get_nowait()  # events it would read after the session ended anyway
            _offer(queue, None)

    def _subscribe(self, session_id: str, queue: asyncio.Queue[_Item]) -> None:
        if not self._subscribers and self not in self._pipeline.observers:
            self._pipeline.observers.append(self)
        self._subscribers.setdefault(session_id, set()).add(queue)
        for item in self._opening(session_id):
            _offer(queue, item)

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
        queues = self._subscribers.get(session_id, set())
        queues.discard(queue)
        if not queues:
            self._subscribers.pop(session_id, None)
            self._forget(session_id)  # nobody is left to show its runs to
        if not self._subscribers and self in self._pipeline.observers:
            self._pipeline.observers.remove(self)

    def _forget(self, session_id: str) -> None:
        self._runs.pop(session_id, None)
        for key in [k for k in self._deltas if k[0] == session_id]:
            del self._deltas[key]

    def _send(self, session_id: str, item: _Item) -> None:
        for queue in self._subscribers.get(session_id, ()):
            _offer(queue, item)

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
        if event.kind == "state":  # a change of the state reaches everyone, seen call or not
            if session.id in self._subscribers and _is_change(event.data):
                self._deltas[(session.id, id(spec))] = event.data
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
        # The result's own state event first: it is the pipeline's (a tool may emit "state"
        # events too). The one seen streaming stands in when the result lost it (cancelled).
        seen_streaming = self._deltas.pop((session.id, id(spec)), None)
        change = _change_of(result) or seen_streaming
        run = self._runs.get(session.id)
        if run is None or run.calls.pop(id(spec), None) is None:  # started unseen
            if change is not None and session.id in self._subscribers:
                # Not its run (nobody saw it start): the open one, or a run of its own
                own_run = None if run is not None else uuid.uuid4().hex
                self._send(session.id, _StateChange(change["delta"], change["version"], own_run))
            return
        self._send(session.id, _tool_call_result(spec.req_id, result))
        if change is not None:
            self._send(session.id, _StateChange(change["delta"], change["version"], None))
        run.ended.append({"toolCallId": spec.req_id, **_summary(result)})
        if not run.calls:  # the last call of the run ended: so does the run
            del self._runs[session.id]
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
    its last event once its update is applied."""
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


def _offer(queue: asyncio.Queue[_Item], item: _Item) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # a stalled subscriber loses events, not memory
        queue.put_nowait(item)
