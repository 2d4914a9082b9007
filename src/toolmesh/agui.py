"""A session's tool activity as an AG-UI event stream, so AG-UI front ends can show it live.

Every call of the session becomes one run, in the order the AG-UI spec gives:

    RUN_STARTED
    TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END     (the call as it was asked for)
    ACTIVITY_SNAPSHOT / ACTIVITY_DELTA, CUSTOM         (while it runs: activity; progress, ...)
    TOOL_CALL_RESULT                                    (what the model sees)
    STATE_DELTA                                         (when the call changed the state)
    RUN_FINISHED, or RUN_ERROR when the call did not succeed

A subscriber first receives a STATE_SNAPSHOT of the session's state, then the start of each
call still running that it missed (and a snapshot of its activity). Calls that started while
nobody subscribed are not shown at all. Events are JSON objects with the spec's camelCase field
names. The stream costs nothing until someone subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
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


class _Run:
    """A running call a subscriber saw start: what a later subscriber is shown of it."""

    __slots__ = ("activities", "started")

    def __init__(self, started: list[Event]) -> None:
        self.started = started  # RUN_STARTED .. TOOL_CALL_END, as first sent
        self.activities: dict[str, Any] = {}  # each activity's content, by activity type


class AguiStream(CallObserver):
    """Fans a pipeline's calls out to AG-UI subscribers, per session.

    Only calls that started while their session had a subscriber are shown (a run's events
    all follow its RUN_STARTED); one who joins mid-run is first shown the start of each such
    call still running and a snapshot of its activity."""

    def __init__(self, pipeline: Pipeline, state: StateManager) -> None:
        self._pipeline = pipeline
        self._state = state
        self._subscribers: dict[str, set[asyncio.Queue[Event | None]]] = {}
        # By session and call: a call's id is its client's choice, and two sessions may both
        # call theirs "1" at once.
        self._runs: dict[tuple[str, str], _Run] = {}
        self._deltas: dict[tuple[str, str], list[Any]] = {}  # state patches until the result

    async def events(self, session_id: str) -> AsyncIterator[Event]:
        """AG-UI events of one session from now on, after a snapshot of its state."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(_QUEUE_LIMIT)
        self._subscribe(session_id, queue)
        try:
            record = await self._state.current(session_id)
            yield _event("STATE_SNAPSHOT", snapshot=record.document)
            while (event := await queue.get()) is not None:
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

    def _subscribe(self, session_id: str, queue: asyncio.Queue[Event | None]) -> None:
        if not self._subscribers and self not in self._pipeline.observers:
            self._pipeline.observers.append(self)
        self._subscribers.setdefault(session_id, set()).add(queue)
        self._catch_up(session_id, queue)

    def _catch_up(self, session_id: str, queue: asyncio.Queue[Event | None]) -> None:
        """Show a new subscriber the session's running calls as a subscriber from their start
        sees them now (the transient events they sent aside): it then follows them as the
        others do."""
        for (session, req_id), run in self._runs.items():
            if session != session_id:
                continue
            for event in run.started:
                _offer(queue, event)
            for activity_type, content in run.activities.items():
                _offer(queue, _activity_snapshot(req_id, activity_type, content))

    def _unsubscribe(self, session_id: str, queue: asyncio.Queue[Event | None]) -> None:
        queues = self._subscribers.get(session_id, set())
        queues.discard(queue)
        if not queues:
            self._subscribers.pop(session_id, None)
            self._forget(session_id)  # nobody is left to show its runs to
        if not self._subscribers and self in self._pipeline.observers:
            self._pipeline.observers.remove(self)

    def _forget(self, session_id: str) -> None:
        for key in [k for k in self._runs if k[0] == session_id]:
            del self._runs[key]
            self._deltas.pop(key, None)

    def _send(self, session_id: str, event: Event) -> None:
        for queue in self._subscribers.get(session_id, ()):
            _offer(queue, event)

    # -- the pipeline's side -------------------------------------------------------------------

    def call_started(self, session: Session, spec: CallSpec, tool: Tool | None) -> None:
        if session.id not in self._subscribers:
            return
        call = spec.req_id
        delta = json.dumps(spec.arguments, ensure_ascii=False, default=str)
        started = [
            _event("RUN_STARTED", threadId=session.id, runId=call),
            _event("TOOL_CALL_START", toolCallId=call, toolCallName=spec.tool_name),
            _event("TOOL_CALL_ARGS", toolCallId=call, delta=delta),
            _event("TOOL_CALL_END", toolCallId=call),
        ]
        self._runs[(session.id, call)] = _Run(started)
        for event in started:
            self._send(session.id, event)

    def call_event(self, session: Session, spec: CallSpec, event: ToolEvent) -> None:
        key = (session.id, spec.req_id)
        run = self._runs.get(key)
        if run is None:  # it started unseen: nobody saw its RUN_STARTED
            return
        if event.kind == "activity":
            self._activity(session.id, spec.req_id, run, event.data)
        elif event.kind == "state":
            self._deltas.setdefault(key, []).extend(event.data.get("delta", []))
        else:
            value = {"toolCallId": spec.req_id, "seq": event.seq, **event.data}
            self._send(session.id, _event("CUSTOM", name=f"toolmesh.{event.kind}", value=value))

    def call_ended(self, session: Session, spec: CallSpec, result: ToolResult) -> None:
        call = (session.id, spec.req_id)
        delta = self._deltas.pop(call, None)
        if self._runs.pop(call, None) is None:  # started unseen (or nobody watches any more)
            return
        self._send(
            session.id,
            _event(
                "TOOL_CALL_RESULT",
                messageId=f"{spec.req_id}:result",
                toolCallId=spec.req_id,
                content=result.output,
                role="tool",
            ),
        )
        if delta:
            self._send(session.id, _event("STATE_DELTA", delta=delta))
        if result.success:
            self._send(
                session.id,
                _event(
                    "RUN_FINISHED", threadId=session.id, runId=spec.req_id, result=_summary(result)
                ),
            )
        else:
            self._send(
                session.id,
                _event("RUN_ERROR", message=result.error or "", code=result.error_code or ""),
            )

    def _activity(self, session_id: str, req_id: str, run: _Run, data: dict[str, Any]) -> None:
        import jsonpatch

        activity_type = str(data.get("activity_type", "activity"))
        patch = list(data.get("patch") or [])
        first = activity_type not in run.activities
        try:
            content = jsonpatch.apply_patch(
                run.activities.get(activity_type, {}), patch, in_place=False
            )
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
            return  # a malformed activity patch is dropped: activity is best-effort UI state
        run.activities[activity_type] = content
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


def _offer(queue: asyncio.Queue[Event | None], event: Event | None) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # a stalled subscriber loses events, not memory
        queue.put_nowait(event)
