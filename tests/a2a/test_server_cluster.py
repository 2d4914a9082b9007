"""Served agents on hosts sharing one PostgreSQL store: a task created on one host is visible
and cancellable on another."""

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

from tests.a2a.test_server import serve, user_message
from tests.fixtures.llm_stub import Answer, StubLLM, openai_text

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
