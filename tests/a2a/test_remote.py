"""Remote agents as tools, against real a2a-sdk 1.x peers (completed, failed, input-required,
auth-required, rejected, timeout -> CancelTask, a cancelled call -> CancelTask, streaming, v0.3)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import toolmesh.a2a as a2a_mod
from tests.a2a.conftest import PeerProcess
from toolmesh import (
    Session,
    ToolEvent,
    Toolkit,
    TransportError,
    agent,
    agent_tools,
    create_toolkit,
    tool,
)
from toolmesh.a2a import AgentSource, remote

pytestmark = [pytest.mark.network_server]

SCRIPT = "Scripted_Peer_script"


async def toolkit_for(peer: PeerProcess, **options: Any) -> Toolkit:
    options.setdefault("poll_every", 0.05)
    return await create_toolkit(agents=[agent(peer.card_url, **options)])


async def peer_tasks(peer: PeerProcess) -> list[dict[str, Any]]:
    request = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    async with httpx.AsyncClient() as http:
        answer = await http.post(peer.url, json=request, headers={"A2A-Version": "1.0"})
    return list(answer.json()["result"].get("tasks", []))


async def test_one_tool_per_skill(polled_peer: PeerProcess) -> None:
    tools = await agent_tools(agent(polled_peer.card_url))
    assert [t.name for t in tools] == [SCRIPT, "Scripted_Peer_echo_v2"]
    assert [t.description for t in tools] == ["Follows a script.", "Echoes."]
    assert all(t.source == "a2a" and t.input_schema["required"] == ["task"] for t in tools)


async def test_completed_task_gives_the_artifact_text(polled_peer: PeerProcess) -> None:
    async with await toolkit_for(polled_peer) as kit:
        result = await kit.execute(SCRIPT, {"task": "complete: the answer"})
    assert result.success and result.output == "the answer"
    meta = result.metadata
    assert set(meta) >= {"agent", "taskId", "state", "polls", "ms"}
    assert meta["agent"] == "Scripted Peer" and meta["state"] == "completed" and meta["taskId"]


@pytest.mark.parametrize(
    ("task", "code", "state", "said"),
    [
        ("fail: the disk is full", "tool_error", "failed", "the disk is full"),
        ("reject: not my job", "tool_error", "rejected", "not my job"),
        ("auth: sign in first", "auth_required", "auth-required", "sign in first"),
    ],
)
async def test_unsuccessful_states_are_error_results(
    polled_peer: PeerProcess, task: str, code: str, state: str, said: str
) -> None:
    async with await toolkit_for(polled_peer) as kit:
        result = await kit.execute(SCRIPT, {"task": task})
    assert result.is_error and result.error_code == code
    assert said in (result.error or "")
    assert result.metadata["state"] == state


async def test_input_required_ends_the_call_and_the_next_call_answers(
    polled_peer: PeerProcess,
) -> None:
    async with await toolkit_for(polled_peer, timeout=60) as kit:
        asked = await kit.execute(SCRIPT, {"task": "ask: which colour?"})
        assert asked.error_code == "input_required" and "which colour?" in (asked.error or "")
        answered = await kit.execute(SCRIPT, {"task": "blue"})
    assert answered.success and answered.output == "answered: blue"
    assert answered.metadata["taskId"] == asked.metadata["taskId"]


async def test_sessions_waiting_for_input_are_bounded(
    polled_peer: PeerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each session left waiting kept an entry for good: a session that never called again
    (a client gone after an input-required answer) grew the map without end."""
    monkeypatch.setattr(remote, "MAX_WAITING_SESSIONS", 2)
    sessions = [Session(agent_id=f"caller-{i}") for i in range(3)]
    async with await toolkit_for(polled_peer, timeout=60) as kit:
        for session in sessions:
            asked = await kit.execute(SCRIPT, {"task": "ask: which colour?"}, session=session)
            assert asked.error_code == "input_required"
        oldest = await kit.execute(SCRIPT, {"task": "complete: a new task"}, session=sessions[0])
        newest = await kit.execute(SCRIPT, {"task": "red"}, session=sessions[2])
    assert oldest.output == "a new task"  # its waiting task was let go: a fresh one answered
    assert newest.output == "answered: red"


async def test_timeout_cancels_the_remote_task(polled_peer: PeerProcess) -> None:
    async with await toolkit_for(polled_peer, timeout=0.5) as kit:
        result = await kit.execute(SCRIPT, {"task": "hang"})
    # answered at the timeout; CancelTask went out in the background, which the close waits for
    assert result.error_code == "timeout" and "its task is being cancelled" in (result.error or "")
    states = {t["id"]: t["status"]["state"] for t in await peer_tasks(polled_peer)}
    assert states[result.metadata["taskId"]] == "TASK_STATE_CANCELED"


async def test_cancelling_the_call_cancels_the_remote_task(streaming_peer: PeerProcess) -> None:
    working = asyncio.Event()

    def seen(event: ToolEvent) -> None:
        if event.kind == "status" and event.data["message"].startswith("working"):
            working.set()

    async with await toolkit_for(streaming_peer) as kit:
        call = asyncio.ensure_future(kit.execute(SCRIPT, {"task": "hang"}, on_event=seen))
        await working.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    states = [t["status"]["state"] for t in await peer_tasks(streaming_peer)]
    assert "TASK_STATE_CANCELED" in states and "TASK_STATE_WORKING" not in states


async def test_a_task_canceled_by_someone_else_ends_the_call(polled_peer: PeerProcess) -> None:
    polling = asyncio.Event()
    async with await toolkit_for(polled_peer) as kit:
        call = asyncio.ensure_future(
            kit.execute(SCRIPT, {"task": "hang"}, on_event=lambda e: polling.set())
        )
        await polling.wait()
        live = ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
        [running] = [t for t in await peer_tasks(polled_peer) if t["status"]["state"] in live]
        request = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "CancelTask",
            "params": {"id": running["id"]},
        }
        async with httpx.AsyncClient() as http:
            await http.post(polled_peer.url, json=request, headers={"A2A-Version": "1.0"})
        result = await call
    assert result.error_code == "cancelled" and result.metadata["state"] == "canceled"
    assert result.metadata["taskId"] == running["id"] and result.metadata["polls"] >= 1


async def test_streaming_turns_updates_into_events(streaming_peer: PeerProcess) -> None:
    events: list[ToolEvent] = []
    async with await toolkit_for(streaming_peer) as kit:
        result = await kit.execute(SCRIPT, {"task": "stream: a b c"}, on_event=events.append)
    assert result.success and result.output == "abc!"
    assert result.metadata["polls"] == 0 and result.metadata["state"] == "completed"
    chunks = [e.data["chunk"] for e in events if e.kind == "artifact"]
    assert chunks == ["a", "b", "c", "!"]
    # the a2a-sdk leaves a false lastChunk out (proto3 JSON): only the last chunk is final
    assert [e.data["final"] for e in events if e.kind == "artifact"] == [False, False, False, True]
    statuses = [e.data["message"] for e in events if e.kind == "status"]
    assert statuses[0] == "working: starting" and statuses[-1] == "completed"
    assert [e.seq for e in events] == list(range(len(events)))


async def test_v03_only_peer(v03_peer: PeerProcess) -> None:
    async with await toolkit_for(v03_peer) as kit:
        done = await kit.execute(SCRIPT, {"task": "complete: from the past"})
        failed = await kit.execute(SCRIPT, {"task": "fail: old news"})
    assert done.success and done.output == "from the past"
    assert failed.metadata["state"] == "failed" and "old news" in (failed.error or "")


async def test_a_peer_speaking_the_other_dialect_is_switched_to(
    v03_peer: PeerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def claims_1_0(card_url: str, headers: dict[str, str], timeout_s: float) -> Any:
        interface = {"url": v03_peer.url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        return {"name": "Liar", "supportedInterfaces": [interface], "skills": [{"id": "x"}]}

    monkeypatch.setattr(a2a_mod, "_fetch_card", claims_1_0)
    tools = await agent_tools(agent(v03_peer.card_url, poll_every=0.05))
    async with Toolkit(tools) as kit:
        result = await kit.execute("Liar_x", {"task": "complete: switched"})
    assert result.output == "switched"


async def test_a_failing_agent_never_breaks_the_toolkit() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    kit = await create_toolkit(tools=[ping], agents=["http://127.0.0.1:9/.well-known/x.json"])
    async with kit:
        assert (await kit.execute("ping")).output == "pong"
        failed = [s for s in kit.sources if isinstance(s, AgentSource)]
        assert failed[0].status.state == "failed" and "127.0.0.1:9" in failed[0].status.reason


async def test_add_agent_registers_after_existing_tools(polled_peer: PeerProcess) -> None:
    async with Toolkit() as kit:
        source = await kit.add_agent(polled_peer.url)  # a bare origin finds the well-known card
        assert source.status.state == "connected"
        assert SCRIPT in kit.names()


def _misbehaving_agents() -> Any:
    """Agents that answer wrongly, one per path: /MODE/.well-known/agent-card.json, /MODE/rpc."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    release = asyncio.Event()
    seen: list[tuple[str, str]] = []  # (mode, method) of every request

    async def card(request: Request) -> Response:
        mode = request.path_params["mode"]
        if mode == "slowcard":
            await release.wait()
        rpc = str(request.url).replace("/.well-known/agent-card.json", "/rpc")
        interface = {"url": rpc, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        return JSONResponse(
            {
                "name": mode,
                "description": "misbehaves",
                "version": "1",
                "supportedInterfaces": [interface],
                "capabilities": {"streaming": False},
                "skills": [{"id": "go", "name": "go", "description": "go", "tags": []}],
            }
        )

    async def rpc(request: Request) -> Response:
        mode = request.path_params["mode"]
        body = await request.json()
        seen.append((mode, body["method"]))
        if mode == "refuses":
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        working = {"id": "t1", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
        if mode == "nocancel":
            return _without_cancel(body, working)
        if mode in ODD_ANSWERS:
            return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": ODD_ANSWERS[mode]})
        if body["method"] == "SendMessage":
            return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"task": working}})
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {}})  # not a task

    routes = [
        Route("/{mode}/.well-known/agent-card.json", card),
        Route("/{mode}/rpc", rpc, methods=["POST"]),
    ]
    return Starlette(routes=routes), release, seen


def _without_cancel(body: dict[str, Any], working: dict[str, Any]) -> Any:
    """A 1.0 agent that offers no CancelTask: its tasks work until "finish" is asked."""
    from starlette.responses import JSONResponse

    if body["method"] == "SendMessage":
        asked = body["params"]["message"]["parts"][0]["text"]
        state = "TASK_STATE_COMPLETED" if asked == "finish" else "TASK_STATE_WORKING"
        task = {**working, "status": {"state": state}}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"task": task}})
    if body["method"] == "GetTask":
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": working})
    error = {"code": -32601, "message": "Method not found"}
    return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "error": error})


ODD_ANSWERS: dict[str, Any] = {  # mode -> the SendMessage result it answers with
    "messagetext": {"message": "hello"},
    "statustext": {"task": {"id": "t", "status": {"state": "completed", "message": "done!"}}},
    "artifacttext": {"task": {"id": "t", "status": {"state": "completed"}, "artifacts": ["x"]}},
}


async def test_an_agent_that_answers_wrongly_is_a_clear_error_at_once() -> None:
    from tests.fixtures.web import serve_app

    app, release, _seen = _misbehaving_agents()
    async with serve_app(app) as base:
        kit = await create_toolkit(
            agents=[
                agent(f"{base}/notatask/.well-known/agent-card.json", timeout=30, poll_every=0.01),
                agent(f"{base}/refuses/.well-known/agent-card.json", timeout=30),
            ]
        )
        async with kit:
            polled = await kit.execute("notatask_go", {"task": "x"})
            assert polled.error_code == "tool_error", polled  # not a 30 s wait for a timeout
            assert "not a task" in (polled.error or "")
            refused = await kit.execute("refuses_go", {"task": "x"})
            assert refused.error is not None
            assert "answered 401: missing or wrong bearer token" in refused.error
        slow = await create_toolkit(
            agents=[agent(f"{base}/slowcard/.well-known/agent-card.json", timeout=0.2)]
        )
        async with slow:
            (source,) = [s for s in slow.sources if isinstance(s, AgentSource)]
            assert source.status.state == "failed"
            assert source.status.reason.rstrip().endswith("ReadTimeout")  # not an empty reason
        release.set()


async def test_an_agent_without_cancel_task_keeps_its_dialect() -> None:
    """CancelTask refused in both dialects must not leave the peer switched to v0.3: the agent's
    next call still goes out as SendMessage."""
    from tests.fixtures.web import serve_app

    app, _release, seen = _misbehaving_agents()
    async with serve_app(app) as base:
        card = f"{base}/nocancel/.well-known/agent-card.json"
        async with await create_toolkit(agents=[agent(card, timeout=1.0, poll_every=0.05)]) as kit:
            first = await kit.execute("nocancel_go", {"task": "hang"})
            assert first.error_code == "timeout", first
            second = await kit.execute("nocancel_go", {"task": "finish"})
    assert second.success, second
    sent = [method for mode, method in seen if method != "GetTask"]
    # the timeout's CancelTask goes in the background, next to the second call: trying v0.3
    # there must not send that call to v0.3 (message/send) meanwhile
    assert sorted(sent) == sorted(["SendMessage", "CancelTask", "tasks/cancel", "SendMessage"])
    assert [m for m in sent if "ancel" in m] == ["CancelTask", "tasks/cancel"]


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("messagetext", "a message that is not an object: 'hello'"),
        ("statustext", "the task's status message that is not an object: 'done!'"),
        ("artifacttext", "the task's artifacts that is not a list of objects"),
    ],
)
async def test_odd_shapes_of_an_answer_say_what_is_wrong(mode: str, says: str) -> None:
    from tests.fixtures.web import serve_app

    app, _release, _seen = _misbehaving_agents()
    async with serve_app(app) as base:
        card = f"{base}/{mode}/.well-known/agent-card.json"
        async with await create_toolkit(agents=[agent(card, timeout=30)]) as kit:
            result = await kit.execute(f"{mode}_go", {"task": "x"})
    assert result.error_code == "tool_error", result
    assert says in (result.error or "") and "AttributeError" not in (result.error or "")
    assert result.metadata["agent"] == mode  # a result of the agent's call, with its metadata


async def test_a_card_url_with_a_query_but_no_path(polled_peer: PeerProcess) -> None:
    """The well-known path goes in the path, the query stays the query (the query swallowed
    the path: ``http://h?x=1/.well-known/agent-card.json``, a GET of / that answers 404)."""
    origin = f"http://127.0.0.1:{polled_peer.port}"
    described = agent(f"{origin}?tenant=1")
    assert described.card_url == f"{origin}/.well-known/agent-card.json?tenant=1"
    assert agent(f"{origin}/#top").card_url == f"{origin}/.well-known/agent-card.json#top"
    tools = await agent_tools(described)
    assert tools, "the card was fetched from the well-known path"


# -- nothing is left behind: closing while a card is fetched or a call runs ---------------------


@pytest.mark.parametrize("flavour", ["polled", "streaming"])
async def test_closing_during_a_call_cancels_the_remote_task(
    flavour: str, polled_peer: PeerProcess, streaming_peer: PeerProcess
) -> None:
    # Closing the source closed the shared client under the call: the call failed (polled:
    # with "RuntimeError: Cannot send a request, as the client has been closed") and the
    # agent's task went on working for nobody.
    peer = polled_peer if flavour == "polled" else streaming_peer
    known = {t["id"] for t in await peer_tasks(peer)}
    started = asyncio.Event()

    def seen(event: ToolEvent) -> None:
        if event.kind == "status":
            started.set()

    source = AgentSource(agent(peer.card_url, poll_every=0.05))
    kit = await create_toolkit(tools=[source])
    call = asyncio.ensure_future(kit.execute(SCRIPT, {"task": "hang"}, on_event=seen))
    await started.wait()
    [running] = [t for t in await peer_tasks(peer) if t["id"] not in known]
    await source.close()  # the source itself (a toolkit's close ends its calls first)
    result = await call
    await kit.close()
    assert result.error_code == "tool_error", result
    assert "was closed during the call; its task was cancelled" in (result.error or ""), result
    states = {t["id"]: t["status"]["state"] for t in await peer_tasks(peer)}
    assert states[running["id"]] == "TASK_STATE_CANCELED"


async def test_closing_while_the_card_is_fetched_opens_no_client() -> None:
    # The open went on after close(): it installed a peer with an open HTTP client, and said
    # "connected", with nothing left to close either.
    asked, release = asyncio.Event(), asyncio.Event()
    card = {
        "name": "late",
        "description": "answers its card late",
        "version": "1",
        "supportedInterfaces": [
            {
                "url": "http://127.0.0.1:9/rpc",
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0",
            }
        ],
        "capabilities": {"streaming": False},
        "skills": [{"id": "go", "name": "go", "description": "go", "tags": []}],
    }

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        asked.set()
        await release.wait()
        body = json.dumps(card).encode()
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        source = AgentSource(agent(f"http://127.0.0.1:{port}/.well-known/agent-card.json"))
        kit = Toolkit(source)
        starting = asyncio.ensure_future(kit.start())
        await asyncio.wait(
            {asyncio.ensure_future(asked.wait()), starting}, return_when=asyncio.FIRST_COMPLETED
        )
        assert asked.is_set(), starting
        await kit.close()
        release.set()
        await starting
    finally:
        release.set()
        server.close()
        await server.wait_closed()
    assert source.status.state == "failed" and "closed" in source.status.reason, source.status
    assert source.tools() == [] and source._peer is None


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html", "<html>\n  <body>\n    <h1>Bad Gateway</h1>\n" + "<p>x</p>\n" * 100),
        ("application/json", json.dumps({"error": "upstream\nis down\n" + "x" * 300})),
    ],
)
def test_an_http_refusal_is_quoted_in_one_short_line(content_type: str, body: str) -> None:
    """A proxy's HTML error page (or a JSON error of many lines) was quoted with its breaks."""
    response = httpx.Response(502, text=body, headers={"content-type": content_type})
    with pytest.raises(TransportError) as refused:
        remote._answer(response, response.content, "http://127.0.0.1:9/a2a")
    said = refused.value.message
    assert said.startswith("http://127.0.0.1:9/a2a answered 502: ") and "\n" not in said
    assert len(said) <= len("http://127.0.0.1:9/a2a answered 502: ") + 200


# -- answers held back: a first request in flight, a slow CancelTask, answers without end --------


@dataclass
class Gate:
    """What a gated agent (``gated_agent``) was asked, and the events that hold its answers."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a held request came in
    release: asyncio.Event = field(default_factory=asyncio.Event)  # held answers go out now
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the test is over
    seen: list[tuple[str, str]] = field(default_factory=list)  # (method, task id asked about)


STREAMING_MODES = ("streamedsend", "hugeevent")
HUGE = 256 * 1024  # what a huge answer sends before it stalls: past the limit the tests set


@contextlib.asynccontextmanager
async def gated_agent() -> AsyncIterator[tuple[str, Gate]]:
    """An agent per mode at ``BASE/MODE/.well-known/agent-card.json`` (skill ``go``), its tasks
    all ``t1``; it holds some answers until ``gate.release``:

    - send, streamedsend: the SendMessage (SendStreamingMessage: its first event, the task);
    - slowcancel: the CancelTask; v03cancel: CancelTask is unknown, tasks/cancel is held;
    - hugeanswer, hugeevent: answer HUGE bytes of one answer (of one event) and then stall.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from tests.fixtures.web import serve_app

    gate = Gate()

    async def card(request: Request) -> Response:
        mode = request.path_params["mode"]
        rpc = str(request.url).replace("/.well-known/agent-card.json", "/rpc")
        interface = {"url": rpc, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        return JSONResponse(
            {
                "name": mode,
                "supportedInterfaces": [interface],
                "capabilities": {"streaming": mode in STREAMING_MODES},
                "skills": [{"id": "go", "name": "go"}],
            }
        )

    def task(state: str = "WORKING") -> dict[str, Any]:
        return {"id": "t1", "contextId": "c1", "status": {"state": f"TASK_STATE_{state}"}}

    async def held() -> None:
        gate.arrived.set()
        await gate.release.wait()

    async def stalled(first: bytes) -> AsyncIterator[bytes]:
        yield first
        await gate.ended.wait()

    async def rpc(request: Request) -> Response:
        mode, body = request.path_params["mode"], await request.json()
        method, params = body["method"], body["params"]
        gate.seen.append((method, str(params.get("id", ""))))

        def answer(result: Any) -> Response:
            return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": result})

        if method == "SendStreamingMessage":
            if mode == "hugeevent":
                huge = b"data: " + b"x" * HUGE
                return StreamingResponse(stalled(huge), media_type="text/event-stream")
            await held()
            first = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": {"task": task()}})
            event = f"data: {first}\n\n".encode()
            return StreamingResponse(stalled(event), media_type="text/event-stream")
        if method == "SendMessage":
            if mode == "hugeanswer":
                huge = b'{"jsonrpc": "2.0", "id": 1, "result": {"task": {"id": "' + b"x" * HUGE
                return StreamingResponse(stalled(huge), media_type="application/json")
            if mode == "send":
                await held()
            asked = params["message"]["parts"][0]["text"]
            return answer({"task": task("COMPLETED" if asked == "finish" else "WORKING")})
        if method == "GetTask":
            return answer(task())
        if (method, mode) in (("CancelTask", "slowcancel"), ("tasks/cancel", "v03cancel")):
            await held()
        if method == "CancelTask" and mode != "v03cancel":
            return answer(task("CANCELED"))
        error = {"code": -32601, "message": "Method not found"}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "error": error})

    routes = [
        Route("/{mode}/.well-known/agent-card.json", card),
        Route("/{mode}/rpc", rpc, methods=["POST"]),
    ]
    async with serve_app(Starlette(routes=routes)) as base:
        try:
            yield base, gate
        finally:  # nothing held is left for the server's shutdown to wait on
            gate.release.set()
            gate.ended.set()


def gated_card(base: str, mode: str) -> str:
    return f"{base}/{mode}/.well-known/agent-card.json"


@pytest.mark.parametrize("mode", ["send", "streamedsend"])
async def test_a_call_cancelled_before_its_task_is_named_still_cancels_it(mode: str) -> None:
    """Cancelled while its SendMessage (streaming: before the stream's first event) was in
    flight, the call dropped the request, never learnt the task's id and left the task working
    for nobody. The request is let finish, and the task its answer names is cancelled."""
    async with gated_agent() as (base, gate):
        async with await create_toolkit(agents=[agent(gated_card(base, mode))]) as kit:
            call = asyncio.ensure_future(kit.execute(f"{mode}_go", {"task": "x"}))
            await gate.arrived.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            gate.release.set()  # the answer naming t1 goes out only now
        # the toolkit's close waited for the cleanup
        assert ("CancelTask", "t1") in gate.seen


async def test_a_call_timing_out_before_its_task_is_named_still_cancels_it() -> None:
    async with gated_agent() as (base, gate):
        async with await create_toolkit(
            agents=[agent(gated_card(base, "send"), timeout=0.2)]
        ) as kit:
            result = await kit.execute("send_go", {"task": "x"})
            assert result.error_code == "timeout", result
            assert "had not answered the first request" in (result.error or "")
            gate.release.set()
        assert ("CancelTask", "t1") in gate.seen


async def test_a_timeout_is_answered_at_the_deadline_though_cancel_task_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The result waited for CancelTask's answer (up to CANCEL_TIMEOUT, 5 s) after the agent's
    timeout: it is answered at the timeout, CancelTask going on in the background until the
    toolkit closes."""
    monkeypatch.setattr(remote, "CANCEL_TIMEOUT", 60.0)
    async with gated_agent() as (base, gate):
        card = gated_card(base, "slowcancel")
        kit = await create_toolkit(agents=[agent(card, timeout=0.3, poll_every=0.05)])
        async with kit:
            (source,) = [s for s in kit.sources if isinstance(s, AgentSource)]
            peer = source._peer
            async with asyncio.timeout(10):  # the old call waited CANCEL_TIMEOUT for it
                result = await kit.execute("slowcancel_go", {"task": "x"})
            assert result.error_code == "timeout", result
            assert "did not finish within 0.3s" in (result.error or "")
            assert not gate.release.is_set()  # answered while CancelTask is held, or not sent
            gate.release.set()
        assert ("CancelTask", "t1") in gate.seen
        assert peer is not None and not peer._settling  # the close waited for it


async def test_a_cancel_trying_the_other_dialect_leaves_the_other_calls_in_theirs() -> None:
    """A peer without CancelTask is tried in v0.3 (tasks/cancel) in the background: a call
    made meanwhile still goes out as SendMessage (the peer was switched to v0.3 while the
    retry was in flight, and left there when it timed out)."""
    async with gated_agent() as (base, gate):
        card = gated_card(base, "v03cancel")
        async with await create_toolkit(agents=[agent(card, timeout=0.3, poll_every=0.05)]) as kit:
            first = await kit.execute("v03cancel_go", {"task": "x"})
            assert first.error_code == "timeout", first
            await gate.arrived.wait()  # tasks/cancel is held
            second = await kit.execute("v03cancel_go", {"task": "finish"})
            gate.release.set()
    assert second.success, second
    sent = [method for method, _id in gate.seen if method != "GetTask"]
    assert sent == ["SendMessage", "CancelTask", "tasks/cancel", "SendMessage"]


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("hugeanswer", "answered with more than 65536 bytes (the limit of an agent's answer)"),
        ("hugeevent", "an event of the stream is larger than 65536 bytes; not read on"),
    ],
    ids=["answer", "event"],
)
async def test_an_answer_past_the_limit_fails_the_call_without_reading_on(
    mode: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer (or one event of a stream) was read whole whatever its size: a peer sending
    300 MB took 1.8 GB of the caller's memory. Past MAX_ANSWER_BYTES the call fails at once,
    naming the limit (the agent here stalls after its first bytes: reading on would wait)."""
    monkeypatch.setattr(remote, "MAX_ANSWER_BYTES", 64 * 1024, raising=False)
    async with (
        gated_agent() as (base, _gate),
        await create_toolkit(agents=[agent(gated_card(base, mode))]) as kit,
        asyncio.timeout(10),
    ):
        result = await kit.execute(f"{mode}_go", {"task": "x"})
    assert result.error_code == "tool_error", result
    assert says in (result.error or ""), result
