"""Served agents on hosts sharing one PostgreSQL store: a task created on one host is visible
and cancellable on another, and a conversation (its history, its tools' state) goes on on any;
a task whose host died is failed through the next host that reads it.

Time, where it matters (a host's heartbeats aging), is the stores' ``clock``: moved, not waited
for. A host "dies" by no longer beating (its heartbeat task is cancelled, without its clean
close): its process goes on, as a host cut off would."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig
from a2a.client import create_client as a2a_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)

from tests.a2a.test_server import (
    Served,
    _conversation_model,
    _wire_message,
    answer_of,
    deploy,
    job_of,
    note,
    notes,
    rpc,
    say,
    serve,
    user_message,
)
from tests.fixtures.llm_stub import Answer, StubLLM, openai_calls, openai_text
from tests.fixtures.postgres import PostgresCluster
from tests.store.test_postgres_mailbox import START, Clock
from toolmesh import ConfigError, Limits, Output, create_client, create_toolkit, tool
from toolmesh.a2a import server as a2a_server
from toolmesh.a2a import tasks as a2a_tasks
from toolmesh.a2a import wire
from toolmesh.a2a.server import CANCEL_TOPIC, A2AServer
from toolmesh.a2a.tasks import TaskBoard
from toolmesh.store import A2ATaskRecord, postgres
from toolmesh.store.postgres import PostgresStore

pytestmark = [pytest.mark.network_server]

_Held = threading.Event | asyncio.Event  # what a job waits on, set before its host stops


@contextlib.asynccontextmanager
async def _stopping(hosts: list[Served], release: _Held | None) -> AsyncIterator[None]:
    """Stop ``hosts`` (and close their toolkits) after the block, ``release`` set first."""
    try:
        yield
    finally:
        if release is not None:
            release.set()  # before the stops: a stop waits for a job held
        for host in hosts:
            await host.handle.stop()
            await host.kit.close()


@contextlib.asynccontextmanager
async def _serving(
    stub: StubLLM, postgres_url: str, *stores: PostgresStore | None, release: _Held | None = None
) -> AsyncIterator[list[Served]]:
    """A host (``serve``'s) for each of ``stores`` (None: its own), stopped after."""
    hosts = [await serve(stub, audit=postgres_url, store=store) for store in stores]
    async with _stopping(hosts, release):
        yield hosts


@contextlib.asynccontextmanager
async def _serving_tools(
    stub: StubLLM,
    postgres_url: str,
    tools: list[Any],
    *a2a: Any,
    release: _Held | None = None,
    **kit_options: Any,
) -> AsyncIterator[list[Served]]:
    """A host of its own toolkit of ``tools`` for each option of ``a2a``, stopped after."""
    kits = [await create_toolkit(tools=tools, audit=postgres_url, **kit_options) for _ in a2a]
    handles = [
        await kit.serve(client=create_client(stub.base_url, model="m"), a2a=options)
        for kit, options in zip(kits, a2a, strict=True)
    ]
    hosts = [Served(kit, handle, stub) for kit, handle in zip(kits, handles, strict=True)]
    async with _stopping(hosts, release):
        yield hosts


def _a2a(host: Any) -> A2AServer:
    """The A2A server of a served host (``serve``'s, or a ServeHandle)."""
    server = getattr(host, "handle", host).a2a
    assert isinstance(server, A2AServer)
    return server


async def _started(host: Served) -> tuple[str, asyncio.Future[None]]:
    """Send ``host`` a message answered as its task starts: the task's id, and its job."""
    params = {"message": _wire_message("hi"), "configuration": {"returnImmediately": True}}
    task_id = (await rpc(host.rpc, "SendMessage", params))["result"]["task"]["id"]
    return task_id, job_of(_a2a(host).board, task_id)


async def _sent_held(
    host: Served, asked: threading.Event, text: str = "hi"
) -> tuple[asyncio.Future[dict[str, Any]], str]:
    """Send ``host`` a message its creator waits on, until the model is asked: (wait, task id)."""
    waiting = asyncio.ensure_future(rpc(host.rpc, "SendMessage", {"message": _wire_message(text)}))
    assert await asyncio.to_thread(asked.wait, 30)
    [task_id] = _a2a(host).board.running
    return waiting, task_id


@contextlib.asynccontextmanager
async def _subscribed(
    url: str, task_id: str, timeout: float
) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
    """The events of a SubscribeToTask stream of ``task_id`` through ``url``, open in the block."""
    subscribe = {"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask"}
    subscribe["params"] = {"id": task_id}
    async with (
        httpx.AsyncClient(timeout=timeout) as http,
        http.stream("POST", url, json=subscribe) as stream,
    ):
        yield _events(stream.aiter_lines())


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data:"):
            yield json.loads(line[5:])["result"]


def _said(update: dict[str, Any]) -> str:
    """What a status update's message says."""
    message = update["statusUpdate"]["status"].get("message") or {}
    return "".join(part.get("text", "") for part in message.get("parts", []))


async def test_a_task_is_seen_and_cancelled_through_another_host(postgres_url: str) -> None:
    release = threading.Event()

    def slow(body: dict[str, Any], index: int) -> Answer:
        release.wait(30)
        return openai_text("too late")

    with StubLLM(slow) as stub:
        async with _serving(stub, postgres_url, None, None, release=release) as hosts:
            clients = [await a2a_client(h.handle.url, ClientConfig(streaming=False)) for h in hosts]
            try:
                request = SendMessageRequest(
                    message=user_message("take your time"),
                    configuration=SendMessageConfiguration(return_immediately=True),
                )
                [event] = [e async for e in clients[0].send_message(request)]
                task_id = event.task.id
                job = hosts[0].handle.a2a.board.running[task_id].job  # type: ignore[union-attr]
                seen = await clients[1].get_task(GetTaskRequest(id=task_id))
                assert seen.status.state in (
                    TaskState.TASK_STATE_SUBMITTED,
                    TaskState.TASK_STATE_WORKING,
                )
                cancelled = await clients[1].cancel_task(CancelTaskRequest(id=task_id))
                assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
                await asyncio.wait_for(asyncio.gather(job, return_exceptions=True), 10)
                assert job is not None and job.done()  # the host running it stopped it
                for client in clients:
                    fetched = await client.get_task(GetTaskRequest(id=task_id))
                    assert fetched.status.state == TaskState.TASK_STATE_CANCELED
            finally:
                for client in clients:
                    await client.close()


async def test_another_host_goes_on_with_a_conversation_and_its_state(postgres_url: str) -> None:
    """One conversation on two hosts: a task on each updates its state at once (both updates
    kept), either host's next task sees them and the exchanges before, and a task cancelled
    through the other host while its tool runs has its call audited as cancelled there."""
    gate, entered, stopped = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @tool
    async def slow_note(word: str) -> Output:
        """Note a word once the test lets it."""
        entered.set()
        try:
            await gate.wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Output("noted", state_update=[{"op": "add", "path": f"/context/{word}", "value": 1}])

    with StubLLM(_conversation_model) as stub:
        tools = [slow_note, note, notes]
        serving = _serving_tools(stub, postgres_url, tools, "keeper", "keeper", release=gate)
        async with serving as hosts:
            urls = [h.rpc for h in hosts]
            boards = [_a2a(h).board for h in hosts]
            slow = await say(urls[0], "slow first", "ctx-x", returnImmediately=True)
            await entered.wait()
            assert answer_of(await say(urls[1], "note second", "ctx-x")) == "tool said noted"
            job = job_of(boards[0], slow["id"])
            gate.set()
            await asyncio.wait_for(asyncio.gather(job), 10)
            for url in urls:
                assert answer_of(await say(url, "notes", "ctx-x")) == "tool said first,second"
            asked = stub.requests[-2].body["messages"]  # the last task's: its history first
            assert [m["content"] for m in asked if m["role"] == "user"] == [
                "note second",  # the exchanges of the conversation, in the order they ended
                "slow first",
                "notes",
                "notes",
            ]

            gate.clear()
            entered.clear()
            doomed = await say(urls[0], "slow lost", "ctx-y", returnImmediately=True)
            await entered.wait()
            job = job_of(boards[0], doomed["id"])
            cancelled = await rpc(urls[1], "CancelTask", {"id": doomed["id"]})
            assert cancelled["result"]["status"]["state"] == "TASK_STATE_CANCELED"
            await asyncio.wait_for(asyncio.gather(job, return_exceptions=True), 10)
            await asyncio.wait_for(stopped.wait(), 10)
            assert answer_of(await say(urls[1], "notes", "ctx-y")) == "tool said none"
            assert [h.kit.state.cached(s) for h in hosts for s in ("a2a:ctx-x", "a2a:ctx-y")] == [
                None
            ] * 4
            rows = await hosts[1].kit.store.recent_audit(100)
    calls = sorted((e.session_id, e.tool_name, e.error_code or "") for e in rows)
    assert calls == [
        ("a2a:ctx-x", "note", ""),
        ("a2a:ctx-x", "notes", ""),
        ("a2a:ctx-x", "notes", ""),
        ("a2a:ctx-x", "slow_note", ""),
        ("a2a:ctx-y", "notes", ""),
        ("a2a:ctx-y", "slow_note", "cancelled"),
    ]


class _Interposed(PostgresStore):
    """A host's task store that awaits ``before_end(record)`` (once) before it writes a task's
    end, and ``before_write(record)`` (once) before it writes a task that goes on (a reply's
    resumption of a task too, a compare-and-set): what another host does there happens between
    this host's decision and its write. With ``deaf`` set, the
    signals on ``CANCEL_TOPIC`` that reach this host are lost (its LISTEN connection was down
    as they came), and ``lost`` is set by each. ``end_written`` is set once a task's end is."""

    before_end: Callable[[A2ATaskRecord], Awaitable[None]] | None = None
    before_write: Callable[[A2ATaskRecord], Awaitable[None]] | None = None
    deaf = False

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.lost = asyncio.Event()
        self.end_written = asyncio.Event()

    async def save_a2a_task_on(self, record: A2ATaskRecord, host_id: str) -> bool:
        await self._interpose(record)
        written = await super().save_a2a_task_on(record, host_id)
        if record.state in wire.TERMINAL:
            self.end_written.set()
        return written

    async def replace_a2a_task_on(
        self, record: A2ATaskRecord, host_id: str, expected: A2ATaskRecord
    ) -> bool:
        await self._interpose(record)
        return await super().replace_a2a_task_on(record, host_id, expected)

    async def _interpose(self, record: A2ATaskRecord) -> None:
        if record.state in wire.TERMINAL and self.before_end is not None:
            before_end, self.before_end = self.before_end, None
            await before_end(record)
        elif record.state not in wire.TERMINAL and self.before_write is not None:
            before_write, self.before_write = self.before_write, None
            await before_write(record)

    def dispatch(self, topic: str, payload: str) -> None:
        if self.deaf and topic == CANCEL_TOPIC:
            self.lost.set()
            return
        super().dispatch(topic, payload)


async def _away(record: A2ATaskRecord) -> None:
    raise ConnectionError("the store is away (beyond its reconnect_timeout)")


@contextlib.asynccontextmanager
async def _ended_unrecorded(
    postgres_url: str, hosts: int = 1
) -> AsyncIterator[tuple[list[Served], _Interposed, dict[str, Any]]]:
    """``hosts`` hosts, the first of which completed a task whose end its store did not take
    (away): (the hosts, its store, the task as the first answered it)."""
    with StubLLM(lambda body, i: openai_text("done")) as stub:
        runner = _Interposed(postgres_url)
        runner.before_end = _away
        stores = [runner, *[None] * (hosts - 1)]
        async with _serving(stub, postgres_url, *stores) as served:
            sent = await rpc(served[0].rpc, "SendMessage", {"message": _wire_message("hi")})
            assert runner.before_end is None  # its first write failed
            yield served, runner, sent["result"]["task"]


async def test_an_end_the_store_could_not_take_is_recorded_once_it_can(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host 1 completes a task while its store is away: it answers with the end, and records
    it once the store is back. Before, the store held the task as working for ever, and host 2,
    seeing host 1 beat, reported it so."""
    monkeypatch.setattr(a2a_server, "END_RETRY_INTERVAL", 0.01)
    async with _ended_unrecorded(postgres_url, hosts=2) as (hosts, runner, task):
        assert answer_of(task) == "done"
        await asyncio.wait_for(runner.end_written.wait(), 10)
        assert _a2a(hosts[0]).board.unwritten == {}
        for host in hosts:
            fetched = (await rpc(host.rpc, "GetTask", {"id": task["id"]}))["result"]
            assert answer_of(fetched) == "done"


async def test_an_end_not_recorded_yet_is_before_a_listing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An end host 1 could not record is recorded before host 1 lists tasks from the store:
    the listing has it, as GetTask through host 1 does, not the task as working."""
    monkeypatch.setattr(a2a_server, "END_RETRY_INTERVAL", 3600.0)  # only the listing writes
    async with _ended_unrecorded(postgres_url) as (hosts, runner, task):
        stored = await runner.load_a2a_task(task["id"])
        assert stored is not None and stored.state not in wire.TERMINAL
        listed = (await rpc(hosts[0].rpc, "ListTasks", {}))["result"]["tasks"]
        assert [t["status"]["state"] for t in listed] == ["TASK_STATE_COMPLETED"]
        stored = await runner.load_a2a_task(task["id"])
        assert stored is not None and stored.state == "completed"


async def test_an_end_not_recorded_yet_is_as_the_server_stops(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopping makes one last attempt at the ends it could not record."""
    monkeypatch.setattr(a2a_server, "END_RETRY_INTERVAL", 3600.0)  # only the stop writes
    async with _ended_unrecorded(postgres_url) as (_hosts, runner, task):
        assert not runner.end_written.is_set()
    reader = PostgresStore(postgres_url)
    await reader.open()
    stored = await reader.load_a2a_task(task["id"])
    await reader.close()
    assert stored is not None and stored.state == "completed"


def _deaf(postgres_url: str) -> _Interposed:
    """A host's store whose cancel notices are lost."""
    store = _Interposed(postgres_url)
    store.deaf = True
    return store


def _serving_ops(
    stub: StubLLM, postgres_url: str, store: _Interposed, release: _Held | None = None
) -> contextlib.AbstractAsyncContextManager[list[Served]]:
    """Two hosts of the `deploy` tool (which asks for approval) as the agent "ops", the first
    on ``store``. The approval timeout only bounds a failure: nothing here waits for it."""
    a2a: list[Any] = [{"name": "ops", "store": store}, "ops"]
    limits = Limits(approval_timeout=20.0)
    return _serving_tools(stub, postgres_url, [deploy], *a2a, release=release, limits=limits)


def _held_model() -> tuple[threading.Event, threading.Event, Callable[[Any, int], Answer]]:
    """A model that answers "done" once released, and says when it was asked."""
    asked, release = threading.Event(), threading.Event()

    def answer(body: Any, index: int) -> Answer:
        asked.set()
        release.wait(30)
        return openai_text("done")

    return asked, release, answer


async def test_a_cancel_written_after_the_task_completed_is_refused(postgres_url: str) -> None:
    """Host 2 loads a task to cancel it as host 1 completes it, and host 1's end is written
    first: the cancel answers -32002 (as for any finished task) and the task stays completed,
    through either host. The cancel was written last, and won."""
    _asked, release, answer = _held_model()
    with StubLLM(answer) as stub:
        canceler = _Interposed(postgres_url)
        async with _serving(stub, postgres_url, None, canceler, release=release) as hosts:
            task_id, job = await _started(hosts[0])

            async def complete_first(record: A2ATaskRecord) -> None:
                assert record.state == "canceled"  # host 2 found the task running
                release.set()
                await asyncio.wait_for(asyncio.gather(job), 10)  # its end is stored

            canceler.before_end = complete_first
            refused = await rpc(hosts[1].rpc, "CancelTask", {"id": task_id})
            assert refused.get("error", {}).get("code") == -32002, refused
            assert canceler.before_end is None  # the race was run as arranged
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": task_id}))["result"]
                assert fetched["status"]["state"] == "TASK_STATE_COMPLETED"
                assert fetched["artifacts"][0]["parts"] == [{"text": "done"}]
            stored = await canceler.load_a2a_task(task_id)
            assert stored is not None and stored.state == "completed"


async def test_an_answer_written_after_the_task_was_canceled_gives_way(postgres_url: str) -> None:
    """Host 1's task has its answer and host 2 cancels it before host 1 writes the end: the
    task stays canceled, and everyone is told so, without the answer: the cancel's client, the
    creator waiting on host 1, a subscriber there, and GetTask through either host. The answer
    was written last, and won."""
    asked, release, answer = _held_model()
    with StubLLM(answer) as stub:
        runner = _Interposed(postgres_url)
        async with _serving(stub, postgres_url, runner, None, release=release) as hosts:
            told_to_stop = asyncio.Event()
            # called after host 1's own subscriber, which stops the task
            runner.subscribe(CANCEL_TOPIC, lambda _task_id: told_to_stop.set())
            cancels: list[dict[str, Any]] = []

            async def cancel_first(record: A2ATaskRecord) -> None:
                assert record.state == "completed"  # host 1 has the answer
                cancels.append(await rpc(hosts[1].rpc, "CancelTask", {"id": record.task_id}))
                await asyncio.wait_for(told_to_stop.wait(), 10)  # host 1 has stopped the task too

            waiting, task_id = await _sent_held(hosts[0], asked)
            async with _subscribed(hosts[0].rpc, task_id, 10) as events:
                first = await anext(events)  # the task as it stands: the subscriber listens
                assert first["task"]["status"]["state"] == "TASK_STATE_WORKING"
                runner.before_end = cancel_first
                release.set()
                streamed = [event async for event in events]
            created = (await waiting)["result"]["task"]
            [cancel] = cancels
            canceled = cancel["result"]
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            assert created["status"] == canceled["status"] and "artifacts" not in created
            told = {"taskId": task_id, "contextId": canceled["contextId"]}
            assert streamed == [{"statusUpdate": {**told, "status": canceled["status"]}}]
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": task_id}))["result"]
                assert fetched["status"] == canceled["status"] and "artifacts" not in fetched
            stored = await runner.load_a2a_task(task_id)
            assert stored is not None and stored.state == "canceled"


async def test_a_task_canceled_elsewhere_stops_at_its_next_write_if_the_notice_is_lost(
    postgres_url: str,
) -> None:
    """Host 2 cancels host 1's task and the notice to host 1 is lost. Host 1's next write, the
    approval its tool call asks for, is refused (the store keeps the cancel): host 1 takes that
    as the notice, and stops the task. It asked for the approval all the same (told to the
    creator, who was answered input-required, and to a subscriber, whose stream ended there),
    and waited for an answer nobody could give, until the approval timeout (300 s), then asked
    the model again."""
    asked, release = threading.Event(), threading.Event()

    def model(body: dict[str, Any], index: int) -> Answer:
        if index == 0:
            asked.set()
            release.wait(30)
            return openai_calls(("c1", "deploy", {"target": "prod"}))
        return openai_text("deployed")

    with StubLLM(model) as stub:
        runner = _deaf(postgres_url)
        async with _serving_ops(stub, postgres_url, runner, release=release) as hosts:
            urls = [h.rpc for h in hosts]
            board = _a2a(hosts[0]).board
            waiting, task_id = await _sent_held(hosts[0], asked, "deploy prod")
            running = board.running[task_id]
            job = job_of(board, task_id)
            async with _subscribed(urls[0], task_id, 30) as events:
                first = await anext(events)  # the subscriber listens
                assert first["task"]["status"]["state"] == "TASK_STATE_WORKING"
                canceled = (await rpc(urls[1], "CancelTask", {"id": task_id}))["result"]
                assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
                await asyncio.wait_for(runner.lost.wait(), 10)  # host 1 was not told
                assert not job.done()
                release.set()  # the model asks for the call, which needs approval
                streamed = [event async for event in events]
            created = (await asyncio.wait_for(waiting, 30))["result"]["task"]
            assert created["status"] == canceled["status"], created["status"]
            told = {"taskId": task_id, "contextId": canceled["contextId"]}
            # the subscriber heard the call asked for (as a streaming creator does), then the end
            *progress, end = streamed
            assert [_said(update) for update in progress] == ["calling deploy"]
            assert end == {"statusUpdate": {**told, "status": canceled["status"]}}
            await asyncio.wait_for(asyncio.gather(job, return_exceptions=True), 10)
            assert job.cancelled()  # stopped, as the notice would have stopped it
            assert task_id not in board.running and running.approval is None
            for url in urls:
                fetched = (await rpc(url, "GetTask", {"id": task_id}))["result"]
                assert fetched["status"] == canceled["status"]
            stored = await runner.load_a2a_task(task_id)
            assert stored is not None and stored.document["status"] == canceled["status"]
            reply = _wire_message("approve", taskId=task_id, contextId=canceled["contextId"])
            refused = await rpc(urls[0], "SendMessage", {"message": reply})  # nothing waits
            assert "is canceled" in refused.get("error", {}).get("message", ""), refused
            assert len(stub.requests) == 1  # the model was not asked again
            rows = await hosts[0].kit.store.recent_audit(10)
    assert [(e.tool_name, e.decision, e.error_code) for e in rows] == [
        ("deploy", "approval:cancelled", "cancelled")  # never asked, nor run
    ]


async def test_an_approval_answered_after_the_task_was_canceled_elsewhere_is_refused(
    postgres_url: str,
) -> None:
    """Host 1's task waits for an approval; host 2 cancels it and the notice to host 1 is
    lost. An "approve" through host 1 then finds the cancel in the store: it is refused, host 1
    stops the task, and the call is never run. Before, host 1 took the answer: the approved
    call ran (a deploy to prod) for a task that was canceled, and the reply was answered as if
    the task went on."""

    def model(body: dict[str, Any], index: int) -> Answer:
        if index == 0:
            return openai_calls(("c1", "deploy", {"target": "prod"}))
        return openai_text("deployed")

    with StubLLM(model) as stub:
        runner = _deaf(postgres_url)
        async with _serving_ops(stub, postgres_url, runner) as hosts:
            urls = [h.rpc for h in hosts]
            board = _a2a(hosts[0]).board
            sent = await rpc(urls[0], "SendMessage", {"message": _wire_message("deploy prod")})
            task = sent["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            job = job_of(board, task["id"])
            canceled = (await rpc(urls[1], "CancelTask", {"id": task["id"]}))["result"]
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            await asyncio.wait_for(runner.lost.wait(), 10)  # host 1 was not told
            reply = _wire_message("approve", taskId=task["id"], contextId=task["contextId"])
            refused = await rpc(urls[0], "SendMessage", {"message": reply})
            assert "is canceled" in refused.get("error", {}).get("message", ""), refused
            await asyncio.wait_for(asyncio.gather(job, return_exceptions=True), 10)
            assert job.cancelled() and task["id"] not in board.running
            assert len(stub.requests) == 1  # the model was not asked again
            for url in urls:
                fetched = (await rpc(url, "GetTask", {"id": task["id"]}))["result"]
                assert fetched["status"] == canceled["status"]
            rows = await hosts[0].kit.store.recent_audit(10)
    assert [(e.tool_name, e.success) for e in rows] == [("deploy", False)]  # never run


@dataclasses.dataclass
class _Unheard:
    """What ``_canceled_unheard`` arranged: host 1's task, canceled through host 2 unheard."""

    hosts: list[Served]
    runner: _Interposed  # host 1's store, deaf to the cancel's notice
    task_id: str
    job: asyncio.Future[None]
    waiting: asyncio.Future[dict[str, Any]]  # the creator's SendMessage through host 1
    canceled: dict[str, Any]  # the task, as the cancel through host 2 answered it

    @property
    def board(self) -> TaskBoard:
        """Host 1's tasks."""
        return _a2a(self.hosts[0]).board

    async def check_stopped(self) -> None:
        """Check that host 1 stopped the task, and answered its creator with the cancel."""
        await asyncio.wait_for(asyncio.gather(self.job, return_exceptions=True), 10)
        assert self.job.cancelled() and self.task_id not in self.board.running
        created = (await asyncio.wait_for(self.waiting, 30))["result"]["task"]
        assert created["status"] == self.canceled["status"], created["status"]


@contextlib.asynccontextmanager
async def _canceled_unheard(postgres_url: str) -> AsyncIterator[_Unheard]:
    """Host 1 runs a held task its creator waits on; host 2 cancels it; host 1 is not told."""
    asked, release, answer = _held_model()
    with StubLLM(answer) as stub:
        runner = _deaf(postgres_url)
        async with _serving(stub, postgres_url, runner, None, release=release) as hosts:
            waiting, task_id = await _sent_held(hosts[0], asked)
            job = job_of(_a2a(hosts[0]).board, task_id)
            canceled = (await rpc(hosts[1].rpc, "CancelTask", {"id": task_id}))["result"]
            await asyncio.wait_for(runner.lost.wait(), 10)  # host 1 was not told
            yield _Unheard(hosts, runner, task_id, job, waiting, canceled)


async def test_a_listing_stops_a_task_canceled_elsewhere_if_the_notice_is_lost(
    postgres_url: str,
) -> None:
    """Host 2 cancels host 1's task and the notice to host 1 is lost. A listing through host 1
    reads the cancel in the store: the task is listed canceled, and host 1 stops it as the
    notice would have. The listing showed the task working (host 1 wrote it again first, a
    write refused unseen) and the task ran on, until its answer gave way to the cancel."""
    async with _canceled_unheard(postgres_url) as unheard:
        canceled, host = unheard.canceled, unheard.hosts[0]
        assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
        listed = (await rpc(host.rpc, "ListTasks", {}))["result"]
        assert [t["status"] for t in listed["tasks"]] == [canceled["status"]]
        await unheard.check_stopped()
        fetched = (await rpc(host.rpc, "GetTask", {"id": unheard.task_id}))["result"]
        assert fetched["status"] == canceled["status"]


async def test_get_task_stops_a_task_canceled_elsewhere_if_the_notice_is_lost(
    postgres_url: str,
) -> None:
    """Host 2 cancels host 1's task and the notice to host 1 is lost: GetTask through host 1
    showed the task working (its own copy) while the store said canceled."""
    async with _canceled_unheard(postgres_url) as unheard:
        host = unheard.hosts[0]
        fetched = (await rpc(host.rpc, "GetTask", {"id": unheard.task_id}))["result"]
        assert fetched["status"] == unheard.canceled["status"]
        await unheard.check_stopped()


async def test_a_resync_stops_a_task_canceled_elsewhere_if_the_notice_is_lost(
    postgres_url: str,
) -> None:
    """Host 2 cancels host 1's task while host 1's listener is away (the notice is lost), and
    host 1's task writes nothing more. When the listener is back the store asks for a resync:
    host 1 looks its running tasks up and stops the one that ended. It ran on to its answer."""
    async with _canceled_unheard(postgres_url) as unheard:
        assert not unheard.job.done()
        unheard.runner.resync()  # as the store does once its listener has reconnected
        await unheard.check_stopped()


async def test_a_resync_asked_while_one_runs_looks_again(postgres_url: str) -> None:
    """Host 1's listener reconnects and its resync reads its running task, still going on;
    then the listener drops and reconnects again, and host 2's cancel of the task is lost in
    between. The second resync, asked while the first still ran, looks again and stops the
    task. Before, it was dropped (one resync at a time): the task ran on to its answer."""
    asked, release, answer = _held_model()
    with StubLLM(answer) as stub:
        runner = _deaf(postgres_url)
        async with _serving(stub, postgres_url, runner, None, release=release) as hosts:
            waiting, task_id = await _sent_held(hosts[0], asked)
            job = job_of(_a2a(hosts[0]).board, task_id)
            load = runner.load_a2a_task
            cancels: list[dict[str, Any]] = []

            async def cancel_after_read(read_id: str) -> A2ATaskRecord | None:
                record = await load(read_id)  # the first resync reads the task as it runs
                runner.load_a2a_task = load  # type: ignore[method-assign]
                assert record is not None and record.state not in wire.TERMINAL
                cancels.append(await rpc(hosts[1].rpc, "CancelTask", {"id": task_id}))
                await asyncio.wait_for(runner.lost.wait(), 10)  # host 1 was not told
                runner.resync()  # the listener was lost and is back again
                return record

            runner.load_a2a_task = cancel_after_read  # type: ignore[method-assign]
            runner.resync()
            await asyncio.wait_for(asyncio.gather(job, return_exceptions=True), 10)
            assert job.cancelled()
            [cancel] = cancels
            created = (await asyncio.wait_for(waiting, 30))["result"]["task"]
            assert created["status"] == cancel["result"]["status"]


async def test_a_reply_to_a_task_canceled_as_it_resumes_is_refused(postgres_url: str) -> None:
    """A reply through host 1 resumes a task waiting for input, and host 2 cancels the task
    between host 1's reading it and its writing it: the cancel stands, and the reply is
    refused as it would have been had it come after the cancel. Host 1 ran the task anyway,
    asking the model, and answered the reply with the task canceled."""
    _asked, release, answer = _held_model()
    release.set()
    with StubLLM(answer) as stub:
        runner = _Interposed(postgres_url)
        async with _serving(stub, postgres_url, runner, None) as hosts:
            status = {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": wire.timestamp()}
            doc = {"id": "t-waits", "contextId": "ctx-w", "status": status, "history": []}
            record = A2ATaskRecord("t-waits", "ctx-w", "input-required", 1.0, doc)
            assert await runner.save_a2a_task(record)
            cancels: list[dict[str, Any]] = []

            async def cancel_first(record: A2ATaskRecord) -> None:
                assert record.state == "input-required"  # host 1 goes on with the task
                cancels.append(await rpc(hosts[1].rpc, "CancelTask", {"id": record.task_id}))

            runner.before_write = cancel_first
            reply = _wire_message("here you are", taskId="t-waits", contextId="ctx-w")
            refused = await rpc(hosts[0].rpc, "SendMessage", {"message": reply})
            [cancel] = cancels
            canceled = cancel["result"]
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            assert refused.get("error", {}).get("code") == -32600, refused
            assert "is canceled" in refused["error"]["message"]
            assert stub.requests == []  # nothing was run for it
            assert hosts[0].handle.a2a.board.running == {}  # type: ignore[union-attr]
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": "t-waits"}))["result"]
                assert fetched["status"] == canceled["status"]


async def test_two_replies_resuming_a_task_through_two_hosts_run_it_once(
    postgres_url: str,
) -> None:
    """Two replies to a task waiting for its caller's input come through host 1 and host 2 at
    once (a client retrying through a load balancer), host 2's written between host 1's reading
    the task and its writing it: host 2 resumes the task, and host 1's resumption (a
    compare-and-set against the task as it read it) is refused with -32600, having run nothing.
    The model is asked once, with host 2's reply, and the task ends once, with its answer.
    Before, both wrote the task as going on and both ran it."""
    asked, release, answer = _held_model()
    with StubLLM(answer) as stub:
        runner = _Interposed(postgres_url)
        async with _serving(stub, postgres_url, runner, None, release=release) as hosts:
            status = {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": wire.timestamp()}
            doc = {"id": "t-asks", "contextId": "ctx-r", "status": status, "history": []}
            record = A2ATaskRecord("t-asks", "ctx-r", "input-required", 1.0, doc)
            assert await runner.save_a2a_task(record)
            later: list[dict[str, Any]] = []

            def sent(text: str) -> dict[str, Any]:
                reply = _wire_message(text, taskId="t-asks", contextId="ctx-r")
                return {"message": reply, "configuration": {"returnImmediately": True}}

            async def resumed_elsewhere_first(record: A2ATaskRecord) -> None:
                assert record.state == "input-required"  # host 1 read the task waiting
                later.append(await rpc(hosts[1].rpc, "SendMessage", sent("second try")))

            runner.before_write = resumed_elsewhere_first
            refused = await rpc(hosts[0].rpc, "SendMessage", sent("first try"))
            assert runner.before_write is None  # the race was run as arranged
            [going] = later
            assert going["result"]["task"]["id"] == "t-asks", going
            assert refused.get("error", {}).get("code") == -32600, refused
            assert "is being resumed through another request" in refused["error"]["message"]
            assert _a2a(hosts[0]).board.running == {}  # nothing runs for it on host 1
            assert await asyncio.to_thread(asked.wait, 30)  # host 2's run asks the model
            release.set()
            await asyncio.wait_for(asyncio.gather(job_of(_a2a(hosts[1]).board, "t-asks")), 10)
            [request] = stub.requests  # asked once
            prompts = [m["content"] for m in request.body["messages"] if m["role"] == "user"]
            assert prompts[-1:] == ["second try"]
            stored = await runner.load_a2a_task("t-asks")
            assert stored is not None and stored.state == "completed"
            told = [
                wire.text_of(m["parts"]) for m in stored.document["history"] if not wire.is_agent(m)
            ]
            assert told == ["second try"]  # host 1's reply is not the task's
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": "t-asks"}))["result"]
                assert fetched["status"] == stored.document["status"]
                assert [a["parts"] for a in fetched["artifacts"]] == [[{"text": "done"}]]


# -- hosts that die ----------------------------------------------------------------------------


async def _die(host: Any) -> None:
    """``host`` stops beating, as a killed host would; nothing of its clean close runs (its
    jobs go on in this process, unseen by the others: a host cut off)."""
    heartbeat = _a2a(host)._heartbeat
    assert heartbeat is not None, "a host sharing its store beats"
    heartbeat.cancel()
    await asyncio.gather(heartbeat, return_exceptions=True)


async def _steady(clock: Clock, *alive: Any) -> None:
    """Move the clock past the host timeout in heartbeat steps, each host of ``alive`` beating
    at every step (as its heartbeat would): those have beaten steadily for the whole timeout,
    and any other host's last beat is older than it."""
    interval, timeout = a2a_server.HEARTBEAT_INTERVAL, postgres.HOST_TIMEOUT
    for _ in range(int(timeout // interval) + 1):
        clock.now += interval
        for host in alive:
            server = _a2a(host)
            await server.board.store.host_alive(server.host_id)


def _clocked(url: str, clock: Clock, store: type[PostgresStore] = PostgresStore) -> Any:
    made = store(url)
    made.clock = clock
    return made


def _stopped_text(status: dict[str, Any]) -> str:
    assert status["state"] == "TASK_STATE_FAILED", status
    return str(status["message"]["parts"][0]["text"])


async def test_a_task_whose_host_died_is_failed_through_another_host(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """Host 1 runs three tasks and dies. Through host 2, GetTask, SubscribeToTask and ListTasks
    each find one of them working on a host that is gone, and record it failed (saying so):
    before, each stayed working for ever. Host 1, still running them unseen, finds those ends
    when it has its answers, and takes them. Hosts that stop cleanly leave no row behind."""
    asked, release, answer = _held_model()
    clock = Clock(START)
    with StubLLM(answer) as stub:
        stores = [_clocked(postgres_url, clock), _clocked(postgres_url, clock)]
        async with _serving(stub, postgres_url, *stores, release=release) as hosts:
            runner = _a2a(hosts[0])
            # named after the id its calls audit, and new at every start
            assert runner.host_id.startswith(hosts[0].handle.host.host_id + ".")
            started = [await _started(hosts[0]) for _ in range(3)]
            ids = [task_id for task_id, _job in started]
            jobs = [job for _task_id, job in started]
            assert await asyncio.to_thread(asked.wait, 30)
            await _die(hosts[0])
            await _steady(clock, hosts[1])

            got = (await rpc(hosts[1].rpc, "GetTask", {"id": ids[0]}))["result"]
            assert _stopped_text(got["status"]) == a2a_tasks.HOST_STOPPED
            subscribe = await rpc(hosts[1].rpc, "SubscribeToTask", {"id": ids[1]})
            assert subscribe.get("error", {}).get("code") == -32004, subscribe  # not running
            listed = (await rpc(hosts[1].rpc, "ListTasks", {}))["result"]["tasks"]
            assert {t["id"]: _stopped_text(t["status"]) for t in listed} == dict.fromkeys(
                ids, a2a_tasks.HOST_STOPPED
            )
            ends = {}
            for task_id in ids:
                stored = await stores[1].load_a2a_task(task_id)
                assert stored is not None and stored.state == "failed"
                ends[task_id] = stored.document["status"]
            assert ends[ids[0]] == got["status"]

            release.set()  # host 1 has its answers; the ends stored stand
            await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 10)
            for task_id in ids:
                for host in hosts:
                    fetched = (await rpc(host.rpc, "GetTask", {"id": task_id}))["result"]
                    assert fetched["status"] == ends[task_id] and "artifacts" not in fetched
    database = postgres_url.rsplit("/", 1)[1]
    assert postgres_cluster.sql("SELECT count(*) FROM hosts", database) == "0"


async def test_a_task_whose_host_lives_is_reported_as_stored(postgres_url: str) -> None:
    """Host 1 runs a task and beats; host 2 has beaten long enough to judge, and reports the
    task as stored (host 1 may be busy with it for a long time), through GetTask and
    ListTasks. Host 1 ends it, and both report that end."""
    asked, release, answer = _held_model()
    clock = Clock(START)
    with StubLLM(answer) as stub:
        stores = [_clocked(postgres_url, clock), _clocked(postgres_url, clock)]
        async with _serving(stub, postgres_url, *stores, release=release) as hosts:
            task_id, job = await _started(hosts[0])
            assert await asyncio.to_thread(asked.wait, 30)
            await _steady(clock, *hosts)
            stored = await stores[1].load_a2a_task(task_id)
            assert stored is not None and stored.state == "submitted"
            got = (await rpc(hosts[1].rpc, "GetTask", {"id": task_id}))["result"]
            assert got["status"] == stored.document["status"]
            listed = (await rpc(hosts[1].rpc, "ListTasks", {}))["result"]["tasks"]
            assert [t["status"] for t in listed] == [stored.document["status"]]
            again = await stores[1].load_a2a_task(task_id)
            assert again is not None and again.document == stored.document
            release.set()
            await asyncio.wait_for(asyncio.gather(job), 10)
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": task_id}))["result"]
                assert fetched["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_dead_hosts_task_completed_as_another_host_fails_it_stays_completed(
    postgres_url: str,
) -> None:
    """Host 2 finds host 1's task orphaned (host 1 stopped beating) and, before its write of
    the failure, host 1 writes the task's answer: host 2's write is refused, and the answer
    stands for both hosts. Before, host 2 had no end to write, and reported it working."""
    _asked, release, answer = _held_model()
    clock = Clock(START)
    with StubLLM(answer) as stub:
        settler = _clocked(postgres_url, clock, _Interposed)
        stores = [_clocked(postgres_url, clock), settler]
        async with _serving(stub, postgres_url, *stores, release=release) as hosts:
            task_id, job = await _started(hosts[0])
            await _die(hosts[0])
            await _steady(clock, hosts[1])

            async def complete_first(record: A2ATaskRecord) -> None:
                assert record.state == "failed"  # host 2 settles the task
                release.set()
                await asyncio.wait_for(asyncio.gather(job), 10)  # host 1's answer is stored

            settler.before_end = complete_first
            got = (await rpc(hosts[1].rpc, "GetTask", {"id": task_id}))["result"]
            assert settler.before_end is None  # the race was run as arranged
            assert got["status"]["state"] == "TASK_STATE_COMPLETED"
            assert got["artifacts"][0]["parts"] == [{"text": "done"}]
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": task_id}))["result"]
                assert fetched["status"] == got["status"] and fetched["artifacts"]
            stored = await settler.load_a2a_task(task_id)
            assert stored is not None and stored.state == "completed"


async def test_a_dead_hosts_answer_written_after_another_host_failed_it_gives_way(
    postgres_url: str,
) -> None:
    """Host 1 stopped beating but runs on, unseen; it has its answer, and before it writes it
    host 2 reads the task and records it failed. Host 1's write is refused: its waiting
    creator and both hosts get the failure, not the answer. The first end recorded stands."""
    asked, release, answer = _held_model()
    clock = Clock(START)
    with StubLLM(answer) as stub:
        runner = _clocked(postgres_url, clock, _Interposed)
        stores = [runner, _clocked(postgres_url, clock)]
        async with _serving(stub, postgres_url, *stores, release=release) as hosts:
            settled: list[dict[str, Any]] = []

            async def fail_first(record: A2ATaskRecord) -> None:
                assert record.state == "completed"  # host 1 has the answer
                got = await rpc(hosts[1].rpc, "GetTask", {"id": record.task_id})
                settled.append(got["result"])

            waiting, task_id = await _sent_held(hosts[0], asked)
            await _die(hosts[0])
            await _steady(clock, hosts[1])
            runner.before_end = fail_first
            release.set()
            created = (await asyncio.wait_for(waiting, 30))["result"]["task"]
            [failed] = settled
            assert _stopped_text(failed["status"]) == a2a_tasks.HOST_STOPPED
            assert created["status"] == failed["status"] and "artifacts" not in created
            for host in hosts:
                fetched = (await rpc(host.rpc, "GetTask", {"id": task_id}))["result"]
                assert fetched["status"] == failed["status"] and "artifacts" not in fetched
            stored = await runner.load_a2a_task(task_id)
            assert stored is not None and stored.document["status"] == failed["status"]


async def test_an_approval_held_by_a_dead_host_fails_and_a_question_waits(
    postgres_url: str,
) -> None:
    """Host 1 dies with a task waiting for an approval (its answer could only reach host 1's
    job) and another waiting for its caller's reply. Through host 2 the first is failed, naming
    the call, and a reply to it refused; the second stays as it is, and a reply through host 2
    goes on with it."""

    def model(body: dict[str, Any], index: int) -> Answer:
        last = body["messages"][-1]
        if last.get("role") == "user" and "deploy" in str(last.get("content")):
            return openai_calls(("c1", "deploy", {"target": "prod"}))
        return openai_text("answered")

    clock = Clock(START)
    with StubLLM(model) as stub:
        stores = [_clocked(postgres_url, clock), _clocked(postgres_url, clock)]
        a2a = [{"name": "ops", "store": s} for s in stores]
        limits = Limits(approval_timeout=20.0)
        async with _serving_tools(stub, postgres_url, [deploy], *a2a, limits=limits) as hosts:
            urls = [h.rpc for h in hosts]
            sent = await rpc(urls[0], "SendMessage", {"message": _wire_message("deploy prod")})
            approving = sent["result"]["task"]
            assert approving["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            status = {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": wire.timestamp()}
            status["message"] = wire.message("agent", "which target?", context_id="ctx-q")
            question = {"id": "t-asks", "contextId": "ctx-q", "status": status, "history": []}
            record = A2ATaskRecord("t-asks", "ctx-q", "input-required", 1.0, question)
            assert await stores[0].save_a2a_task_on(record, _a2a(hosts[0]).host_id)
            await _die(hosts[0])
            await _steady(clock, hosts[1])

            got = (await rpc(urls[1], "GetTask", {"id": approving["id"]}))["result"]
            assert _stopped_text(got["status"]) == (
                f"{a2a_tasks.HOST_STOPPED} (the call of 'deploy' was waiting for approval)"
            )
            reply = _wire_message("approve", taskId=approving["id"], contextId=got["contextId"])
            refused = await rpc(urls[1], "SendMessage", {"message": reply})
            assert "is failed" in refused.get("error", {}).get("message", ""), refused

            waits = (await rpc(urls[1], "GetTask", {"id": "t-asks"}))["result"]
            assert waits["status"] == status
            reply = _wire_message("prod, please", taskId="t-asks", contextId="ctx-q")
            resumed = (await rpc(urls[1], "SendMessage", {"message": reply}))["result"]["task"]
            assert answer_of(resumed) == "answered"


async def test_a_serve_that_cannot_listen_leaves_no_heartbeat_behind(postgres_url: str) -> None:
    """The A2A server starts (its heartbeat, its cancel subscription) before the port is bound:
    a port already taken failed the serve and left both running for the life of the process."""
    store = PostgresStore(postgres_url)
    kit = await create_toolkit(tools=[note])
    try:
        with StubLLM(lambda body, index: openai_text("hi")) as stub, socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            client = create_client(stub.base_url, model="m")
            with pytest.raises(ConfigError, match="cannot listen"):
                await kit.serve(
                    f"127.0.0.1:{port}", client=client, a2a={"name": "desk", "store": store}
                )
        beating = [t for t in asyncio.all_tasks() if "_keep_alive" in repr(t.get_coro())]
        assert beating == []
        assert store._subscribers().get(CANCEL_TOPIC, []) == []
    finally:
        await kit.close()
        await store.close()
