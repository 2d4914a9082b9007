"""AG-UI: a session's calls as AG-UI events, in the spec's order, valid for the spec's types."""

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


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def collect(stream: Any, until: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async for event in stream:
        out.append(event)
        if len(out) == until:
            break
    return out


async def test_call_order_and_types(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    client = await connect_async(host)
    stream = host.agui.events(client.session_id)
    first = await anext(stream)
    assert first["type"] == "STATE_SNAPSHOT" and first["snapshot"] == {"context": {}}
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
        "RUN_ERROR",
    ]
    for event in [first, *events]:
        EVENT.validate_python(event)
    call_id = events[1]["toolCallId"]
    assert events[0]["runId"] == call_id and events[0]["threadId"] == client.session_id
    assert json.loads(events[2]["delta"]) == {"key": "a", "value": "b"}
    assert events[4]["content"] == {"last": "a"} and events[4]["activityType"] == "memory"
    assert events[5]["content"] == "remembered a"
    assert events[6]["delta"] == [{"op": "add", "path": "/context/a", "value": "b"}]
    assert events[-1]["code"] == "tool_error"
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
            snapshot = await anext(line async for line in lines if line.startswith("data: "))
            assert json.loads(snapshot[6:])["type"] == "STATE_SNAPSHOT"
            await client.call_tool("echo", {"text": "hi"})
            seen = []
            async for line in lines:
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["type"] == "RUN_FINISHED":
                        break
            assert kinds(seen)[0] == "RUN_STARTED" and kinds(seen)[-2] == "TOOL_CALL_RESULT"
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
    assert (await anext(stream))["type"] == "STATE_SNAPSHOT"  # subscribed; reads no more
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
    assert (await anext(ended))["type"] == "STATE_SNAPSHOT"
    assert (await anext(watched))["type"] == "STATE_SNAPSHOT"
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
        assert (await anext(stream))["type"] == "STATE_SNAPSHOT"
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
    assert agui._runs == {} and agui._deltas == {}


async def test_a_cancelled_call_ends_its_run() -> None:
    """A call cut off by its caller's cancellation ends its AG-UI run with RUN_ERROR (it used to
    stop after the activity, the run never ended, and its activity stayed in memory)."""
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
    assert (await anext(stream))["type"] == "STATE_SNAPSHOT"
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
    assert kinds(rest) == ["TOOL_CALL_RESULT", "RUN_ERROR"]
    assert rest[1]["code"] == "cancelled"
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
    assert (await anext(early))["type"] == "STATE_SNAPSHOT"
    spec = CallSpec("searching", {"q": "x"}, req_id="r")
    call = asyncio.ensure_future(toolkit.pipeline.call(session, spec))
    late = agui.events(session.id)
    try:
        seen_early = await asyncio.wait_for(collect(early, 5), 10)  # up to the first activity
        assert (await anext(late))["type"] == "STATE_SNAPSHOT"
        step.set()
        assert (await asyncio.wait_for(call, 10)).success
        seen_late = await asyncio.wait_for(collect(late, 9), 10)
    finally:
        step.set()
        await asyncio.gather(call, return_exceptions=True)
        await early.aclose()
        await late.aclose()
    then = ["ACTIVITY_DELTA", "ACTIVITY_DELTA", "TOOL_CALL_RESULT", "RUN_FINISHED"]
    assert kinds(seen_late) == [*kinds(seen_early), *then]
    for event in seen_late:
        EVENT.validate_python(event)
    assert seen_late[0]["runId"] == "r" and seen_late[1]["toolCallName"] == "searching"
    assert json.loads(seen_late[2]["delta"]) == {"q": "x"}
    content = seen_late[4]["content"]
    for delta in seen_late[5:7]:
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
        assert (await anext(stream))["type"] == "STATE_SNAPSHOT"
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
