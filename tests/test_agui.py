"""AG-UI: a session's calls as AG-UI events, in an order the AG-UI client's verifier accepts,
valid for the spec's types, with every change of the state."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from ag_ui.core import Event
from pydantic import TypeAdapter

from tests.conftest import demo_host
from toolmesh import connect_async
from toolmesh.transports.http import HttpServer

EVENT: TypeAdapter[Any] = TypeAdapter(Event)


# A run of one call that changed the state, as every subscriber that saw it start is shown it
ONE_CALL_CHANGING_STATE = [
    "RUN_STARTED",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "STATE_DELTA",
    "RUN_FINISHED",
]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def collect(stream: Any, until: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async for event in stream:
        out.append(event)
        if len(out) == until:
            break
    return out


async def opened(stream: Any) -> dict[str, Any]:
    """Subscribe while no run is open: the subscriber's own run holding the state's snapshot
    (returned)."""
    opening = await asyncio.wait_for(collect(stream, 3), 10)
    assert kinds(opening) == ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_FINISHED"]
    assert opening[0]["runId"] == opening[2]["runId"]
    return opening[1]


def verify(events: list[dict[str, Any]]) -> None:
    """The run rules of the AG-UI client's verifier (ag-ui-protocol/ag-ui, sdks/typescript/
    packages/client/src/verify/verify.ts), for the events this stream sends."""
    started = finished = errored = False
    calls: set[str] = set()
    for i, event in enumerate(events):
        kind, where = event["type"], f"event {i} {event['type']}"
        assert not errored, f"{where}: nothing may follow RUN_ERROR"
        assert not finished or kind in ("RUN_STARTED", "RUN_ERROR"), f"{where}: run finished"
        if i == 0:
            assert kind in ("RUN_STARTED", "RUN_ERROR"), f"{where}: first must be RUN_STARTED"
        elif kind == "RUN_STARTED":
            assert not started or finished, f"{where}: a run is still active"
        if kind == "RUN_STARTED":
            started, finished, calls = True, False, set()
        elif kind == "TOOL_CALL_START":
            assert event["toolCallId"] not in calls, f"{where}: tool call already in progress"
            calls.add(event["toolCallId"])
        elif kind in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert event["toolCallId"] in calls, f"{where}: no such tool call in progress"
            if kind == "TOOL_CALL_END":
                calls.discard(event["toolCallId"])
        elif kind == "RUN_FINISHED":
            assert not calls, f"{where}: tool calls still active"
            finished = True
        elif kind == "RUN_ERROR":
            errored = True


def rebuilt(events: list[dict[str, Any]], document: Any = None) -> Any:
    """The state a front end holds after ``events``: each snapshot, each delta applied."""
    import jsonpatch

    for event in events:
        if event["type"] == "STATE_SNAPSHOT":
            document = event["snapshot"]
        elif event["type"] == "STATE_DELTA":
            document = jsonpatch.apply_patch(document, event["delta"])
    return document


async def test_call_order_and_types(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    client = await connect_async(host)
    stream = host.agui.events(client.session_id)
    first = await opened(stream)
    assert first["snapshot"] == {"context": {}}
    reading = asyncio.ensure_future(collect(stream, 9))
    await asyncio.sleep(0)
    await client.call_tool("remember", {"key": "a", "value": "b"})
    await client.call_tool("boom", {})
    events = await asyncio.wait_for(reading, 10)
    events += await collect(stream, 5)
    assert kinds(events) == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "ACTIVITY_SNAPSHOT",
        "TOOL_CALL_RESULT",
        "STATE_DELTA",
        "RUN_FINISHED",
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "RUN_FINISHED",  # a failed call ends its run as any other (a RUN_ERROR ends the stream)
    ]
    verify(events)
    for event in [first, *events]:
        EVENT.validate_python(event)
    call_id = events[1]["toolCallId"]
    assert events[0]["runId"] == call_id and events[0]["threadId"] == client.session_id
    assert json.loads(events[2]["delta"]) == {"key": "a", "value": "b"}
    assert events[4]["content"] == {"last": "a"} and events[4]["activityType"] == "memory"
    assert events[5]["content"] == "remembered a"
    assert events[5]["metadata"]["success"] is True
    assert events[6]["delta"] == [{"op": "add", "path": "/context/a", "value": "b"}]
    failed = events[-2]["metadata"]
    assert failed["success"] is False and failed["errorCode"] == "tool_error" and failed["error"]
    assert events[-1]["result"]["success"] is False
    await stream.aclose()
    assert host.pipeline.observers == []  # unsubscribed: calls cost nothing again
    await client.close()
    await host.close()


async def test_sse_endpoint(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    client = await connect_async(url)
    async with httpx.AsyncClient(timeout=30) as http:
        missing = await http.get(f"{url}/agui/nope")
        assert missing.status_code == 404
        async with http.stream("GET", f"{url}/agui/{client.session_id}") as response:
            lines = response.aiter_lines()
            opening = []
            async for line in lines:
                if line.startswith("data: "):
                    opening.append(json.loads(line[6:]))
                    if opening[-1]["type"] == "RUN_FINISHED":
                        break
            assert kinds(opening) == ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_FINISHED"]
            await client.call_tool("echo", {"text": "hi"})
            seen = []
            async for line in lines:
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["type"] == "RUN_FINISHED":
                        break
            assert kinds(seen)[0] == "RUN_STARTED" and kinds(seen)[-2] == "TOOL_CALL_RESULT"
            verify([*opening, *seen])
    await client.close()
    await server.stop()
    await host.close()


async def test_a_subscriber_that_fell_behind_still_sees_its_stream_end(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import toolmesh.agui as agui

    monkeypatch.setattr(agui, "_QUEUE_LIMIT", 4)  # a small backlog fills with one call
    host = demo_host(tmp_path / "a.db")
    client = await connect_async(host)
    stream = host.agui.events(client.session_id)
    await opened(stream)  # subscribed; reads no more
    await client.call_tool("remember", {"key": "a", "value": "b"})  # more events than fit
    host.agui.close()
    rest = [event async for event in stream]  # ends (it used to wait forever)
    assert len(rest) <= 4
    await client.close()
    await host.close()


async def test_a_stream_ends_when_its_session_closes(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    leaving, staying = await connect_async(host), await connect_async(host)
    ended = host.agui.events(leaving.session_id)
    watched = host.agui.events(staying.session_id)
    await opened(ended)
    await opened(watched)
    await leaving.close()
    assert [event async for event in ended] == []  # ends (it used to wait forever)
    await staying.call_tool("remember", {"key": "a", "value": "b"})
    assert (await asyncio.wait_for(anext(watched), 10))["type"] == "RUN_STARTED"
    await staying.close()
    assert [event["type"] async for event in watched][-1] == "RUN_FINISHED"
    await host.close()


async def test_two_sessions_calling_with_the_same_call_id_see_only_their_own_run() -> None:
    """A call's id is its client's choice: two wire clients may both send "1" at once. The
    activity and state delta of one used to be mixed into the other's stream (one session saw
    the other's state, the other saw a delta without a snapshot and lost its STATE_DELTA)."""
    from toolmesh import Toolkit, tool
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session
    from toolmesh.store import MemoryStore
    from toolmesh.tools import Output, ToolContext

    both_saved = asyncio.Event()

    class TwoStepStore(MemoryStore):  # as a networked store may: a call's audit waits a while
        saved = 0

        async def save_state(
            self, session_id: str, document: Any, *, expected_version: int
        ) -> bool:
            self.saved += 1
            if self.saved == 2:
                both_saved.set()
            return await super().save_state(session_id, document, expected_version=expected_version)

        async def append_audit(self, entry: Any, *, durable: bool = True) -> None:
            await both_saved.wait()  # both calls' state is changed before either call ends
            await super().append_audit(entry, durable=durable)

    release = asyncio.Event()

    @tool
    async def work(secret: str, ctx: ToolContext) -> Output:
        """Work on a secret."""
        ctx.activity("progress", [{"op": "add", "path": "/secret", "value": secret}])
        await release.wait()
        return Output("done", state_update=[{"op": "add", "path": "/context/s", "value": secret}])

    toolkit = Toolkit(work, store=TwoStepStore())
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    sessions = {"alice": Session(agent_id="alice"), "bob": Session(agent_id="bob")}
    streams = {who: agui.events(session.id) for who, session in sessions.items()}
    for stream in streams.values():
        await opened(stream)
    calls: list[asyncio.Future[Any]] = []
    try:
        for who, session in sessions.items():
            spec = CallSpec("work", {"secret": f"{who}-pw"}, req_id="1")
            calls.append(asyncio.ensure_future(toolkit.pipeline.call(session, spec)))
            events = await asyncio.wait_for(collect(streams[who], 5), 10)
            assert events[-1]["type"] == "ACTIVITY_SNAPSHOT", who
            assert events[-1]["content"] == {"secret": f"{who}-pw"}
        release.set()
        for call in calls:
            assert (await asyncio.wait_for(call, 10)).success
        for who, stream in streams.items():
            rest = await asyncio.wait_for(collect(stream, 3), 10)
            assert kinds(rest) == ["TOOL_CALL_RESULT", "STATE_DELTA", "RUN_FINISHED"], who
            assert rest[1]["delta"] == [{"op": "add", "path": "/context/s", "value": f"{who}-pw"}]
    finally:  # a failing assertion must not leave the calls waiting for ever
        release.set()
        both_saved.set()
        await asyncio.gather(*calls, return_exceptions=True)
        for stream in streams.values():
            await stream.aclose()
    assert agui._runs == {}


async def test_a_cancelled_call_ends_its_run() -> None:
    """A call cut off by its caller's cancellation ends its AG-UI run, its result saying it was
    cancelled (it used to stop after the activity, the run never ended, and its activity stayed
    in memory; then it ended with a RUN_ERROR, after which an AG-UI client accepts nothing)."""
    from toolmesh import Toolkit, tool
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session
    from toolmesh.tools import ToolContext

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Waits until cancelled."""
        ctx.activity("progress", [{"op": "add", "path": "/p", "value": 1}])
        await asyncio.Event().wait()
        return "never"

    toolkit = Toolkit(slow)
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    await opened(stream)
    call = asyncio.ensure_future(toolkit.pipeline.call(session, CallSpec("slow", {}, req_id="r")))
    try:
        started = await asyncio.wait_for(collect(stream, 5), 10)
        assert started[-1]["type"] == "ACTIVITY_SNAPSHOT"
        call.cancel()
        rest = await asyncio.wait_for(collect(stream, 2), 10)
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await stream.aclose()
    assert kinds(rest) == ["TOOL_CALL_RESULT", "RUN_FINISHED"]
    assert rest[0]["metadata"]["errorCode"] == "cancelled"
    assert agui._runs == {}


def _searching_toolkit(step: asyncio.Event, started: asyncio.Event | None = None) -> Any:
    """A tool reporting its activity in two steps, the second once ``step`` is set (it sets
    ``started`` once running)."""
    from toolmesh import Toolkit, tool
    from toolmesh.tools import ToolContext

    @tool
    async def searching(ctx: ToolContext, q: str = "") -> str:
        """Searches in two steps."""
        if started is not None:
            started.set()
        ctx.activity("search", [{"op": "add", "path": "/hits", "value": []}])
        await step.wait()
        ctx.activity("search", [{"op": "add", "path": "/hits/-", "value": "a"}])
        ctx.activity("search", [{"op": "add", "path": "/status", "value": "done"}])
        return "found a"

    return Toolkit(searching)


async def test_a_subscriber_joining_mid_run_is_shown_its_start_and_its_activity() -> None:
    """It used to get the run's result without its start, and lose the activity updates sent
    after it joined (patched onto nothing, they failed)."""
    import jsonpatch

    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    step = asyncio.Event()
    toolkit = _searching_toolkit(step)
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    early = agui.events(session.id)
    await opened(early)
    spec = CallSpec("searching", {"q": "x"}, req_id="r")
    call = asyncio.ensure_future(toolkit.pipeline.call(session, spec))
    late = agui.events(session.id)
    try:
        seen_early = await asyncio.wait_for(collect(early, 5), 10)  # up to the first activity
        seen_late = [await anext(late)]  # subscribed
        step.set()
        assert (await asyncio.wait_for(call, 10)).success
        seen_late += await asyncio.wait_for(collect(late, 9), 10)
    finally:
        step.set()
        await asyncio.gather(call, return_exceptions=True)
        await early.aclose()
        await late.aclose()
    then = ["ACTIVITY_DELTA", "ACTIVITY_DELTA", "TOOL_CALL_RESULT", "RUN_FINISHED"]
    # The run it joined holds its snapshot of the state, right after the run's start
    assert kinds(seen_late) == ["RUN_STARTED", "STATE_SNAPSHOT", *kinds(seen_early)[1:], *then]
    verify(seen_late)
    for event in seen_late:
        EVENT.validate_python(event)
    assert seen_late[0]["runId"] == "r" and seen_late[2]["toolCallName"] == "searching"
    assert json.loads(seen_late[3]["delta"]) == {"q": "x"}
    content = seen_late[5]["content"]
    for delta in seen_late[6:8]:
        content = jsonpatch.apply_patch(content, delta["patch"])
    assert content == {"hits": ["a"], "status": "done"}
    assert agui._runs == {}


async def test_a_run_that_started_unwatched_is_not_shown() -> None:
    """A subscriber joining while a call runs that nobody watched start sees nothing of it (its
    result or end alone would break AG-UI's order: a run's events follow its RUN_STARTED); the
    next call is shown whole."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    step, started = asyncio.Event(), asyncio.Event()
    toolkit = _searching_toolkit(step, started)
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    unwatched = asyncio.ensure_future(
        toolkit.pipeline.call(session, CallSpec("searching", {}, req_id="unseen"))
    )
    stream = agui.events(session.id)
    try:
        await asyncio.wait_for(started.wait(), 10)
        await opened(stream)
        step.set()
        assert (await asyncio.wait_for(unwatched, 10)).success
        spec = CallSpec("searching", {}, req_id="seen")
        assert (await asyncio.wait_for(toolkit.pipeline.call(session, spec), 10)).success
        events = await asyncio.wait_for(collect(stream, 9), 10)
    finally:
        step.set()
        await asyncio.gather(unwatched, return_exceptions=True)
        await stream.aclose()
    assert kinds(events)[0] == "RUN_STARTED" and kinds(events)[-1] == "RUN_FINISHED"
    assert {e.get("runId", e.get("toolCallId", "seen")) for e in events} == {"seen"}
    assert {e["messageId"] for e in events if "messageId" in e} == {
        "seen:search",
        "seen:result",
    }


async def until_finished(stream: Any, run_id: str) -> list[dict[str, Any]]:
    """The events of ``stream`` up to the RUN_FINISHED of run ``run_id``."""
    out: list[dict[str, Any]] = []
    async for event in stream:
        out.append(event)
        if event["type"] == "RUN_FINISHED" and event["runId"] == run_id:
            break
    return out


async def snapshot_of(stream: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events up to the subscriber's STATE_SNAPSHOT (subscribing), and that snapshot."""
    seen: list[dict[str, Any]] = []
    async for event in stream:
        seen.append(event)
        if event["type"] == "STATE_SNAPSHOT":
            return seen, event["snapshot"]
    raise AssertionError("the stream ended without a STATE_SNAPSHOT")


def _state_toolkit(store: Any = None) -> Any:
    """``put`` sets /context/KEY; ``slow_put`` too once its ``gate`` is set (it sets its
    ``running`` when it runs)."""
    from toolmesh import Toolkit, tool
    from toolmesh.tools import Output

    gates: dict[str, asyncio.Event] = {}
    running: dict[str, asyncio.Event] = {}

    def update(key: str, value: str) -> list[dict[str, Any]]:
        return [{"op": "add", "path": f"/context/{key}", "value": value}]

    @tool
    def put(key: str, value: str) -> Output:
        """Set /context/KEY."""
        return Output("set", state_update=update(key, value))

    @tool
    async def slow_put(key: str, value: str) -> Output:
        """Set /context/KEY once let through."""
        running.setdefault(key, asyncio.Event()).set()
        await gates.setdefault(key, asyncio.Event()).wait()
        return Output("set", state_update=update(key, value))

    toolkit = Toolkit(put, slow_put, store=store)
    toolkit.gates, toolkit.running = gates, running  # type: ignore[attr-defined]
    return toolkit


async def test_a_state_change_by_a_call_that_started_unwatched_reaches_the_subscriber() -> None:
    """A subscriber joining while an unwatched call ran got a snapshot from before that call's
    change, then never the change: its copy of the state stayed wrong, and every later delta
    applied to a stale document. The change now comes in a run of its own."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    toolkit = _state_toolkit()
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    spec = CallSpec("slow_put", {"key": "v", "value": "new"}, req_id="unseen")
    unwatched = asyncio.ensure_future(toolkit.pipeline.call(session, spec))  # nobody watches
    stream = agui.events(session.id)
    try:
        await asyncio.wait_for(toolkit.running.setdefault("v", asyncio.Event()).wait(), 10)
        opening, document = await asyncio.wait_for(snapshot_of(stream), 10)
        assert document == {"context": {}}
        toolkit.gates.setdefault("v", asyncio.Event()).set()
        assert (await asyncio.wait_for(unwatched, 10)).success
        watched = CallSpec("put", {"key": "w", "value": "x"}, req_id="seen")
        assert (await toolkit.pipeline.call(session, watched)).success
        events = await asyncio.wait_for(until_finished(stream, "seen"), 10)
    finally:
        toolkit.gates.setdefault("v", asyncio.Event()).set()
        await asyncio.gather(unwatched, return_exceptions=True)
        await stream.aclose()
    assert rebuilt(events, document) == await toolkit.state.snapshot(session.id)
    assert rebuilt(events, document) == {"context": {"v": "new", "w": "x"}}
    verify([*opening, *events])
    for event in events:
        EVENT.validate_python(event)
    assert {e.get("toolCallId") for e in events} == {None, "seen"}  # the call itself is not shown
    assert kinds(events)[:4] == ["RUN_FINISHED", "RUN_STARTED", "STATE_DELTA", "RUN_FINISHED"]


async def test_a_state_change_by_an_unseen_call_comes_in_the_open_run() -> None:
    """While a watched call's run is open, a change of the state by a call nobody saw start is
    shown inside that run (a run of its own would start while one is active)."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    toolkit = _state_toolkit()
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session, other = Session(), Session()
    elsewhere = agui.events(other.id)  # the pipeline is watched: the unseen call's events show
    stream = agui.events(session.id)
    calls: list[asyncio.Future[Any]] = []
    try:
        await opened(elsewhere)
        unseen = CallSpec("slow_put", {"key": "v", "value": "new"}, req_id="unseen")
        calls.append(asyncio.ensure_future(toolkit.pipeline.call(session, unseen)))
        await asyncio.wait_for(toolkit.running.setdefault("v", asyncio.Event()).wait(), 10)
        document = (await opened(stream))["snapshot"]
        seen = CallSpec("slow_put", {"key": "w", "value": "x"}, req_id="seen")
        calls.append(asyncio.ensure_future(toolkit.pipeline.call(session, seen)))
        await asyncio.wait_for(toolkit.running.setdefault("w", asyncio.Event()).wait(), 10)
        toolkit.gates.setdefault("v", asyncio.Event()).set()
        assert (await asyncio.wait_for(calls[0], 10)).success
        toolkit.gates.setdefault("w", asyncio.Event()).set()
        assert (await asyncio.wait_for(calls[1], 10)).success
        events = await asyncio.wait_for(until_finished(stream, "seen"), 10)
    finally:
        for gate in ("v", "w"):
            toolkit.gates.setdefault(gate, asyncio.Event()).set()
        await asyncio.gather(*calls, return_exceptions=True)
        await stream.aclose()
        await elsewhere.aclose()
    assert kinds(events) == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "STATE_DELTA",  # the unseen call's
        "TOOL_CALL_RESULT",
        "STATE_DELTA",
        "RUN_FINISHED",
    ]
    verify(events)
    assert rebuilt(events, document) == {"context": {"v": "new", "w": "x"}}


async def test_a_change_the_snapshot_holds_is_not_sent_again() -> None:
    """A call that changed the state before a subscriber's snapshot and ends after it: the
    change is in the snapshot, so neither a delta (applied twice) nor an empty run follows."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session
    from toolmesh.store import MemoryStore

    saved, audited = asyncio.Event(), asyncio.Event()

    class SlowAuditStore(MemoryStore):  # a call's audit waits until let through
        async def save_state(
            self, session_id: str, document: Any, *, expected_version: int
        ) -> bool:
            saved.set()
            return await super().save_state(session_id, document, expected_version=expected_version)

        async def append_audit(self, entry: Any, *, durable: bool = True) -> None:
            await audited.wait()
            await super().append_audit(entry, durable=durable)

    toolkit = _state_toolkit(SlowAuditStore())
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    spec = CallSpec("put", {"key": "v", "value": "new"}, req_id="unseen")
    unwatched = asyncio.ensure_future(toolkit.pipeline.call(session, spec))
    stream = agui.events(session.id)
    try:
        await asyncio.wait_for(saved.wait(), 10)  # changed, not ended
        assert (await opened(stream))["snapshot"] == {"context": {"v": "new"}}
        audited.set()
        assert (await asyncio.wait_for(unwatched, 10)).success
        watched = CallSpec("put", {"key": "w", "value": "x"}, req_id="seen")
        assert (await toolkit.pipeline.call(session, watched)).success
        events = await asyncio.wait_for(until_finished(stream, "seen"), 10)
    finally:
        audited.set()
        await asyncio.gather(unwatched, return_exceptions=True)
        await stream.aclose()
    assert kinds(events) == ONE_CALL_CHANGING_STATE
    assert events[5]["delta"] == [{"op": "add", "path": "/context/w", "value": "x"}]


async def test_overlapping_calls_share_one_run_and_changes_apply_in_order() -> None:
    """Two calls of one session at once used to start two runs at once, which the AG-UI
    client refuses; they now share one. The second changed the state after the first but
    ended before it: its delta would apply to a document without the first change, so the
    subscriber gets a fresh snapshot instead, and the first change is not applied twice."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session
    from toolmesh.store import MemoryStore

    first_saved, first_audited = asyncio.Event(), asyncio.Event()

    class FirstAuditWaits(MemoryStore):  # the first call's audit waits until let through
        async def save_state(
            self, session_id: str, document: Any, *, expected_version: int
        ) -> bool:
            first_saved.set()
            return await super().save_state(session_id, document, expected_version=expected_version)

        async def append_audit(self, entry: Any, *, durable: bool = True) -> None:
            if entry.req_id == "a":
                await first_audited.wait()
            await super().append_audit(entry, durable=durable)

    toolkit = _state_toolkit(FirstAuditWaits())
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    opening = await asyncio.wait_for(collect(stream, 3), 10)
    a = CallSpec("put", {"key": "list", "value": "a"}, req_id="a")
    first = asyncio.ensure_future(toolkit.pipeline.call(session, a))
    try:
        await asyncio.wait_for(first_saved.wait(), 10)  # changed the state, not ended
        b = CallSpec("put", {"key": "list", "value": "b"}, req_id="b")
        assert (await toolkit.pipeline.call(session, b)).success
        first_audited.set()
        assert (await asyncio.wait_for(first, 10)).success
        events = await asyncio.wait_for(until_finished(stream, "a"), 10)
    finally:
        first_audited.set()
        await asyncio.gather(first, return_exceptions=True)
        await stream.aclose()
    verify([*opening, *events])
    for event in events:
        EVENT.validate_python(event)
    assert kinds(events).count("RUN_STARTED") == 1
    assert [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"] == ["b", "a"]
    assert "STATE_SNAPSHOT" in kinds(events)
    assert rebuilt(events, opening[1]["snapshot"]) == {"context": {"list": "b"}}
    assert [c["toolCallId"] for c in events[-1]["result"]["calls"]] == ["b", "a"]
    assert agui._runs == {}


async def test_a_stream_of_overlapping_and_failing_calls_is_one_the_agui_client_accepts() -> None:
    """Its snapshot used to come before any run, two calls at once started two runs at once,
    and a failed call's RUN_ERROR was followed by more events: the AG-UI client's verifier
    stopped the stream at each. A subscriber joining mid-run is accepted too."""
    from toolmesh import Toolkit, tool
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    gate = asyncio.Event()

    @tool
    async def wait_a_bit(n: int) -> str:
        """Waits until let through."""
        await gate.wait()
        return f"done {n}"

    @tool
    def fail() -> str:
        """Fails."""
        raise RuntimeError("boom")

    toolkit = Toolkit(wait_a_bit, fail)
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()

    def call(name: str, req_id: str, **arguments: Any) -> asyncio.Future[Any]:
        spec = CallSpec(name, arguments, req_id=req_id)
        return asyncio.ensure_future(toolkit.pipeline.call(session, spec))

    early, late = agui.events(session.id), agui.events(session.id)
    seen = await asyncio.wait_for(collect(early, 3), 10)  # its opening: subscribed
    calls = [call("wait_a_bit", "a", n=1), call("wait_a_bit", "b", n=2)]
    try:
        seen += await asyncio.wait_for(collect(early, 7), 10)  # both calls started
        late_seen = await asyncio.wait_for(collect(late, 8), 10)  # joins the open run
        gate.set()
        for done in asyncio.as_completed(calls):
            assert (await asyncio.wait_for(done, 10)).success
        failed = await asyncio.wait_for(call("fail", "f"), 10)
        assert not failed.success
        assert (await asyncio.wait_for(call("wait_a_bit", "c", n=3), 10)).success
        seen += await asyncio.wait_for(until_finished(early, "c"), 10)
        late_seen += await asyncio.wait_for(until_finished(late, "c"), 10)
    finally:
        gate.set()
        await asyncio.gather(*calls, return_exceptions=True)
        await early.aclose()
        await late.aclose()
    verify(seen)
    verify(late_seen)
    for event in [*seen, *late_seen]:
        EVENT.validate_python(event)
    one_run = ["RUN_STARTED", *["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"] * 2]
    assert kinds(seen)[3:10] == one_run
    assert kinds(late_seen)[:8] == [one_run[0], "STATE_SNAPSHOT", *one_run[1:]]
    assert seen[3:10] == [late_seen[0], *late_seen[2:8]]  # it follows the run the others see
    assert "RUN_ERROR" not in kinds(seen)
    result = next(e for e in seen if e["type"] == "TOOL_CALL_RESULT" and e["toolCallId"] == "f")
    assert result["metadata"]["success"] is False
    assert result["metadata"]["errorCode"] == failed.error_code
    assert result["content"] == failed.output


def _forging_toolkit() -> Any:
    """``forward`` emits a "state" event (as a proxy of another host might) and says whether it
    was refused; ``forge`` emits one, letting the refusal fail it; ``hold`` waits for its
    ``gate`` (set ``running`` once it runs); ``remember`` changes the state."""
    from toolmesh import Toolkit, tool
    from toolmesh.tools import Output, ToolContext

    forged = {"delta": [{"op": "add", "path": "/context/fake", "value": "forged"}], "version": 1}
    gate, running = asyncio.Event(), asyncio.Event()

    @tool
    async def forward(ctx: ToolContext) -> str:
        """Forwards a 'state' event."""
        try:
            ctx.emit("state", forged)
        except ValueError as exc:
            return f"refused: {exc}"
        return "forwarded"

    @tool
    async def forge(ctx: ToolContext) -> str:
        """Emits a 'state' event of its own."""
        ctx.emit("state", forged)
        return "emitted"

    @tool
    async def hold() -> str:
        """Waits until let through."""
        running.set()
        await gate.wait()
        return "held"

    @tool
    async def remember(key: str, value: str) -> Output:
        """Set /context/KEY."""
        return Output(
            "saved", state_update=[{"op": "add", "path": f"/context/{key}", "value": value}]
        )

    toolkit = Toolkit(forward, forge, hold, remember)
    toolkit.forged, toolkit.gate, toolkit.running = forged, gate, running  # type: ignore[attr-defined]
    return toolkit


async def test_a_tools_own_state_event_is_refused_and_the_front_end_keeps_the_true_state() -> None:
    """A tool's ``ctx.emit("state", ...)`` was shown as a change of the state: its forged delta
    reached every front end, whose next real change (of the same version) was then dropped as
    held already, its copy of the state wrong for good. The kind is the host's own: emitting it
    fails in the tool, and only the changes the pipeline made are shown."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    toolkit = _forging_toolkit()
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    try:
        opening = await asyncio.wait_for(collect(stream, 3), 10)
        forwarded = await toolkit.pipeline.call(session, CallSpec("forward", {}, req_id="a"))
        forged = await toolkit.pipeline.call(session, CallSpec("forge", {}, req_id="b"))
        real = CallSpec("remember", {"key": "real", "value": "yes"}, req_id="c")
        assert (await toolkit.pipeline.call(session, real)).success
        events = await asyncio.wait_for(until_finished(stream, "c"), 10)
    finally:
        await stream.aclose()
    refusal = "the 'state' event is the host's own: return Output(state_update=...)"
    assert forwarded.output == f"refused: {refusal}"
    assert not forged.success and forged.error_code == "tool_error"
    assert refusal in (forged.error or "")
    assert [e.kind for r in (forwarded, forged) for e in r.events] == []
    verify([*opening, *events])
    assert rebuilt([*opening, *events]) == await toolkit.state.snapshot(session.id)
    assert rebuilt([*opening, *events]) == {"context": {"real": "yes"}}
    deltas = [e["delta"] for e in events if e["type"] == "STATE_DELTA"]
    assert deltas == [[{"op": "add", "path": "/context/real", "value": "yes"}]]


async def test_a_state_event_the_result_does_not_carry_is_not_shown() -> None:
    """Only the state event the pipeline put on a call's result is shown: one that reached the
    stream otherwise (a source handing an event past ``ctx.emit``) used to be shown as a change,
    and the real change after it was dropped."""
    from toolmesh.agui import AguiStream
    from toolmesh.models import ToolEvent
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    toolkit = _forging_toolkit()
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    held = CallSpec("hold", {}, req_id="a")
    call = asyncio.ensure_future(toolkit.pipeline.call(session, held))
    try:
        opening = await asyncio.wait_for(collect(stream, 3), 10)
        await asyncio.wait_for(toolkit.running.wait(), 10)
        event = ToolEvent(kind="state", req_id="a", data=toolkit.forged, seq=0)
        agui.call_event(session, held, event)  # as the pipeline hands events on
        toolkit.gate.set()
        assert (await asyncio.wait_for(call, 10)).success
        real = CallSpec("remember", {"key": "real", "value": "yes"}, req_id="c")
        assert (await toolkit.pipeline.call(session, real)).success
        events = await asyncio.wait_for(until_finished(stream, "c"), 10)
    finally:
        toolkit.gate.set()
        await asyncio.gather(call, return_exceptions=True)
        await stream.aclose()
    verify([*opening, *events])
    assert rebuilt([*opening, *events]) == {"context": {"real": "yes"}}


async def test_a_call_cancelled_while_audited_ends_its_run_with_its_change() -> None:
    """A caller cancelled while its call's audit entry was written (a slow store) left the
    call's run open for good, its change of the state never shown."""
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session
    from toolmesh.store import MemoryStore

    auditing = asyncio.Event()

    class StuckAudit(MemoryStore):  # an audit that waits until cancelled
        async def append_audit(self, entry: Any, *, durable: bool = True) -> None:
            auditing.set()
            await asyncio.Event().wait()

    toolkit = _state_toolkit(StuckAudit())
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    opening = await asyncio.wait_for(collect(stream, 3), 10)
    spec = CallSpec("put", {"key": "k", "value": "v"}, req_id="a")
    call = asyncio.ensure_future(toolkit.pipeline.call(session, spec))
    await asyncio.wait_for(auditing.wait(), 10)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    assert call.cancelled()  # the caller's cancellation goes on, once the call is audited
    agui.end(session.id)  # what it holds, then the end
    events = [event async for event in stream]
    assert kinds(events) == ONE_CALL_CHANGING_STATE
    verify([*opening, *events])
    assert rebuilt([*opening, *events]) == {"context": {"k": "v"}}
    assert agui._runs == {}


def _chatty_toolkit() -> Any:
    """``chatty`` logs ``n`` lines and ``busy`` reports progress ``n`` times, neither letting
    a reader in meanwhile; ``put`` sets /context/KEY."""
    from toolmesh import Toolkit, tool
    from toolmesh.tools import Output, ToolContext

    @tool
    async def chatty(n: int, ctx: ToolContext) -> str:
        """Logs n lines."""
        for i in range(n):
            ctx.log(f"line {i}")
        return "said"

    @tool
    async def busy(n: int, ctx: ToolContext) -> str:
        """Reports progress n times."""
        for i in range(n):
            ctx.progress(i * 100 // n, "working")
        return "done"

    @tool
    async def put(key: str, value: str) -> Output:
        """Set /context/KEY."""
        return Output(
            "set", state_update=[{"op": "add", "path": f"/context/{key}", "value": value}]
        )

    return Toolkit(chatty, busy, put)


async def test_a_subscriber_a_whole_backlog_behind_is_cut_off_with_a_run_error(
    monkeypatch: Any,
) -> None:
    """A subscriber whose backlog was full silently lost what came next, its run's results and
    end included, then read the next run's RUN_STARTED while its run was open (the AG-UI
    client's verifier stops there), or waited for that run's end for ever. It is cut off
    instead: what it did not read is dropped and its stream ends with a RUN_ERROR saying why,
    and subscribing again starts afresh."""
    import toolmesh.agui as agui_module
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    monkeypatch.setattr(agui_module, "_QUEUE_LIMIT", 8)
    toolkit = _chatty_toolkit()
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stalled = agui.events(session.id)
    opening = await asyncio.wait_for(collect(stalled, 3), 10)  # subscribed; reads no more
    said = await toolkit.pipeline.call(session, CallSpec("chatty", {"n": 20}, req_id="a"))
    assert said.success
    put = CallSpec("put", {"key": "k", "value": "v"}, req_id="b")
    assert (await toolkit.pipeline.call(session, put)).success
    agui.end(session.id)  # what its streams hold, then the end
    rest = [event async for event in stalled]
    assert kinds(rest) == ["RUN_ERROR"]
    assert rest[0]["code"] == "toolmesh.backlog_full" and "8 events behind" in rest[0]["message"]
    verify([*opening, *rest])
    EVENT.validate_python(rest[0])
    assert toolkit.pipeline.observers == [] and agui._runs == {}  # its reader left
    again = agui.events(session.id)
    assert (await opened(again))["snapshot"] == {"context": {"k": "v"}}
    await again.aclose()


async def test_progress_past_half_a_backlog_is_dropped_and_the_runs_still_end(
    monkeypatch: Any,
) -> None:
    """A call reporting progress faster than a subscriber read filled its backlog, and the
    results and ends of the runs after it were lost. Progress (each report superseded by the
    next) is what gives way, past half the backlog: every run still ends."""
    import toolmesh.agui as agui_module
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    monkeypatch.setattr(agui_module, "_QUEUE_LIMIT", 20)
    toolkit = _chatty_toolkit()
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    opening = await asyncio.wait_for(collect(stream, 3), 10)
    for req_id, n in (("a", 40), ("b", 1)):
        assert (
            await toolkit.pipeline.call(session, CallSpec("busy", {"n": n}, req_id=req_id))
        ).success
    agui.end(session.id)
    events = [event async for event in stream]
    verify([*opening, *events])
    assert "RUN_ERROR" not in kinds(events)
    results = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    finished = [e["runId"] for e in events if e["type"] == "RUN_FINISHED"]
    assert results == finished == ["a", "b"]
    assert 0 < kinds(events).count("CUSTOM") < 41


async def test_a_run_held_open_lists_only_its_last_calls(monkeypatch: Any) -> None:
    """One long call held its run open while any number of others came and went; the run kept
    every one's summary and listed them all in its RUN_FINISHED (3,002 calls, 282 kB). It counts
    them and lists the last ones."""
    import toolmesh.agui as agui_module
    from toolmesh import Toolkit, tool
    from toolmesh.agui import AguiStream
    from toolmesh.pipeline import CallSpec
    from toolmesh.session import Session

    monkeypatch.setattr(agui_module, "_SUMMARY_CALLS", 3)
    gate, running = asyncio.Event(), asyncio.Event()

    @tool
    async def watch() -> str:
        """Waits until let through."""
        running.set()
        await gate.wait()
        return "stopped"

    @tool
    def ping() -> str:
        """Answers at once."""
        return "pong"

    @tool
    def fail() -> str:
        """Fails."""
        raise RuntimeError("boom")

    toolkit = Toolkit(watch, ping, fail)
    agui = AguiStream(toolkit.pipeline, toolkit.state)
    session = Session()
    stream = agui.events(session.id)
    opening = await asyncio.wait_for(collect(stream, 3), 10)
    long = asyncio.ensure_future(toolkit.pipeline.call(session, CallSpec("watch", {}, req_id="w")))
    try:
        await asyncio.wait_for(running.wait(), 10)
        for i in range(4):
            await toolkit.pipeline.call(session, CallSpec("ping", {}, req_id=f"p{i}"))
        await toolkit.pipeline.call(session, CallSpec("fail", {}, req_id="f"))
        assert len(agui._runs[session.id].ended) == 3  # what the open run keeps
        gate.set()
        assert (await asyncio.wait_for(long, 10)).success
        events = await asyncio.wait_for(until_finished(stream, "w"), 10)
    finally:
        gate.set()
        await asyncio.gather(long, return_exceptions=True)
        await stream.aclose()
    verify([*opening, *events])
    EVENT.validate_python(events[-1])
    result = events[-1]["result"]
    assert [c["toolCallId"] for c in result.pop("calls")] == ["p3", "f", "w"]
    assert result == {"success": False, "callCount": 6, "failedCount": 1, "callsOmitted": 3}
