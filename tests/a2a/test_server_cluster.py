"""Served agents on hosts sharing one PostgreSQL store: a task created on one host is visible
and cancellable on another, and a conversation (its history, its tools' state) goes on on any."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

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
    _conversation_model,
    answer_of,
    job_of,
    note,
    notes,
    rpc,
    say,
    serve,
    user_message,
)
from tests.fixtures.llm_stub import Answer, StubLLM, openai_text
from toolmesh import Output, create_client, create_toolkit, tool

pytestmark = [pytest.mark.network_server]


async def test_a_task_is_seen_and_cancelled_through_another_host(postgres_url: str) -> None:
    release = threading.Event()

    def slow(body: dict[str, Any], index: int) -> Answer:
        release.wait(30)
        return openai_text("too late")

    with StubLLM(slow) as stub:
        hosts = [await serve(stub, audit=postgres_url), await serve(stub, audit=postgres_url)]
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
            release.set()
            for client in clients:
                await client.close()
            for host in hosts:
                await host.handle.stop()
                await host.kit.close()


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
        kits = [
            await create_toolkit(tools=[slow_note, note, notes], audit=postgres_url)
            for _ in range(2)
        ]
        handles = [
            await k.serve(client=create_client(stub.base_url, model="m"), a2a="keeper")
            for k in kits
        ]
        urls = [h.url + "/a2a" for h in handles]
        boards = [h.a2a.board for h in handles]  # type: ignore[union-attr]
        try:
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
            assert [k.state.cached(s) for k in kits for s in ("a2a:ctx-x", "a2a:ctx-y")] == [
                None
            ] * 4
            rows = await kits[1].store.recent_audit(100)
        finally:
            gate.set()
            for handle in handles:
                await handle.stop()
            for kit in kits:
                await kit.close()
    calls = sorted((e.session_id, e.tool_name, e.error_code or "") for e in rows)
    assert calls == [
        ("a2a:ctx-x", "note", ""),
        ("a2a:ctx-x", "notes", ""),
        ("a2a:ctx-x", "notes", ""),
        ("a2a:ctx-x", "slow_note", ""),
        ("a2a:ctx-y", "notes", ""),
        ("a2a:ctx-y", "slow_note", "cancelled"),
    ]
