"""A session's tool activity as an AG-UI event stream, so AG-UI front ends can show it live.

Every call of the session becomes one run, in the order the AG-UI spec gives:

    RUN_STARTED
    TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END     (the call as it was asked for)
    ACTIVITY_SNAPSHOT / ACTIVITY_DELTA, CUSTOM         (while it runs: activity; progress, ...)
    TOOL_CALL_RESULT                                    (what the model sees)
    STATE_DELTA                                         (when the call changed the state)
    RUN_FINISHED, or RUN_ERROR when the call did not succeed

A subscriber first receives a STATE_SNAPSHOT of the session's state. Events are JSON objects
with the spec's camelCase field names. The stream costs nothing until someone subscribes.
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


class AguiStream(CallObserver):
    """Fans a pipeline's calls out to AG-UI subscribers, per session."""

    def __init__(self, pipeline: Pipeline, state: StateManager) -> None:
        self._pipeline = pipeline
        self._state = state
        self._subscribers: dict[str, set[asyncio.Queue[Event | None]]] = {}
        # By session and call: a call's id is its client's choice, and two sessions may both
        # call theirs "1" at once.
        self._activities: dict[tuple[str, str, str], dict[str, Any]] = {}
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

    def _unsubscribe(self, session_id: str, queue: asyncio.Queue[Event | None]) -> None:
        queues = self._subscribers.get(session_id, set())
        queues.discard(queue)
        if not queues:
            self._subscribers.pop(session_id, None)
        if not self._subscribers and self in self._pipeline.observers:
            self._pipeline.observers.remove(self)

    def _send(self, session_id: str, event: Event) -> None:
        for queue in self._subscribers.get(session_id, ()):
            _offer(queue, event)

    # -- the pipeline's side -------------------------------------------------------------------

    def call_started(self, session: Session, spec: CallSpec, tool: Tool | None) -> None:
        if session.id not in self._subscribers:
            return
        run = {"threadId": session.id, "runId": spec.req_id}
        self._send(session.id, _event("RUN_STARTED", **run))
        call = spec.req_id
        self._send(
            session.id, _event("TOOL_CALL_START", toolCallId=call, toolCallName=spec.tool_name)
        )
        delta = json.dumps(spec.arguments, ensure_ascii=False, default=str)
        self._send(session.id, _event("TOOL_CALL_ARGS", toolCallId=call, delta=delta))
        self._send(session.id, _event("TOOL_CALL_END", toolCallId=call))

    def call_event(self, session: Session, spec: CallSpec, event: ToolEvent) -> None:
        if session.id not in self._subscribers:
            return
        if event.kind == "activity":
            self._activity(session.id, spec.req_id, event.data)
        elif event.kind == "state":
            key = (session.id, spec.req_id)
            self._deltas.setdefault(key, []).extend(event.data.get("delta", []))
        else:
            value = {"toolCallId": spec.req_id, "seq": event.seq, **event.data}
            self._send(session.id, _event("CUSTOM", name=f"toolmesh.{event.kind}", value=value))

    def call_ended(self, session: Session, spec: CallSpec, result: ToolResult) -> None:
        call = (session.id, spec.req_id)
        for key in [k for k in self._activities if k[:2] == call]:
            del self._activities[key]
        delta = self._deltas.pop(call, None)
        if session.id not in self._subscribers:
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

    def _activity(self, session_id: str, req_id: str, data: dict[str, Any]) -> None:
        import jsonpatch

        activity_type = str(data.get("activity_type", "activity"))
        patch = list(data.get("patch") or [])
        key = (session_id, req_id, activity_type)
        message_id = f"{req_id}:{activity_type}"
        first = key not in self._activities
        try:
            content = jsonpatch.apply_patch(self._activities.get(key, {}), patch, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
            return  # a malformed activity patch is dropped: activity is best-effort UI state
        self._activities[key] = content
        if first:
            self._send(
                session_id,
                _event(
                    "ACTIVITY_SNAPSHOT",
                    messageId=message_id,
                    activityType=activity_type,
                    content=copy.deepcopy(content),
                ),
            )
        else:
            self._send(
                session_id,
                _event(
                    "ACTIVITY_DELTA", messageId=message_id, activityType=activity_type, patch=patch
                ),
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
