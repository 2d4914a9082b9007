"""The served agent's task board: a task left running by an earlier server is failed."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path

import pytest

from toolmesh.a2a import wire
from toolmesh.a2a.tasks import RESTARTED, RunningTask, TaskBoard
from toolmesh.store import A2ATaskRecord, SqliteStore
from toolmesh.store.base import A2A_FINAL_STATES
from toolmesh.store.postgres import PostgresStore


async def test_a_task_cut_short_by_a_restart_is_failed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    doc = {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
    await store.save_a2a_task(A2ATaskRecord("t", "c", "working", 1.0, doc))
    board = TaskBoard(store)
    found = await board.get("t")
    assert found is not None and found["status"]["state"] == "TASK_STATE_FAILED"
    assert found["status"]["message"]["parts"][0]["text"] == RESTARTED
    stored = await store.load_a2a_task("t")
    assert stored is not None and stored.state == "failed"
    assert await board.get("missing") is None
    await store.close()


def test_the_store_keeps_the_states_a2a_calls_terminal_final() -> None:
    """The store guards its ``state`` column, which holds the short names the board writes."""
    assert set(A2A_FINAL_STATES) == wire.TERMINAL
    doc = {"id": "t", "status": {"state": "TASK_STATE_COMPLETED"}}
    assert wire.task_state(doc) in A2A_FINAL_STATES


@pytest.mark.network_server
async def test_a_task_waiting_for_input_is_read_afresh_with_a_shared_store(
    postgres_url: str,
) -> None:
    # A host kept the input-required task it had written; when the reply went through another
    # host, which completed the task, the first one went on showing it waiting for input.
    stores = [PostgresStore(postgres_url), PostgresStore(postgres_url)]
    for store in stores:
        await store.open()
    first, second = (TaskBoard(store) for store in stores)
    waiting = {"id": "w", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED"}}
    await first.save(waiting)
    assert await second.get("w") == waiting
    await second.save({**waiting, "status": {"state": "TASK_STATE_COMPLETED"}})
    seen = await first.get("w")
    assert seen is not None and wire.task_state(seen) == "completed"
    for store in stores:
        await store.close()


async def test_a_running_task_whose_write_finds_an_end_is_stopped(tmp_path: Path) -> None:
    """A write for a task running here that the store refuses (it holds an end: another host
    ended the task, and its notice was lost) stops the task's job, as the notice would have. A
    job stopping itself from inside the save is cancelled at its next await, and its cleanup
    awaits unhindered. A job writing its own end is not stopped, nor one that is over."""
    store = SqliteStore(tmp_path / "t.db")
    board = TaskBoard(store)
    ended = {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_CANCELED"}}
    assert await board.save(ended) is ended
    working = {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
    running = board.running["t"] = RunningTask(working, "go")
    seen: list[object] = []

    async def job() -> None:
        seen.append(wire.task_state(await board.save(working)))
        seen.append("went on")  # to its next await
        try:
            await asyncio.Event().wait()  # nobody sets it
        except asyncio.CancelledError:
            seen.append("cancelled")
            await asyncio.sleep(0)  # (its end is written, say)
            seen.append("cleaned up")
            raise

    running.job = asyncio.ensure_future(job())
    await asyncio.wait_for(asyncio.gather(running.job, return_exceptions=True), 10)
    assert running.job.cancelled()
    assert seen == ["canceled", "went on", "cancelled", "cleaned up"]
    assert not running.stop()  # over

    ending = board.running["t"] = RunningTask(working, "go", ending="completed")
    completed = {**working, "status": {"state": "TASK_STATE_COMPLETED"}}

    told: list[str] = []

    async def end() -> None:
        told.append(wire.task_state(await board.save(completed)))
        await asyncio.sleep(0)

    ending.job = asyncio.ensure_future(end())
    await asyncio.wait_for(ending.job, 10)  # not cancelled: it would raise here
    assert told == ["canceled"]  # the end that stands, which it tells
    await store.close()


class _Away(PostgresStore):
    """A shared store whose task lookups and host judgements fail (the server unreachable
    beyond ``reconnect_timeout``) while ``away`` is set; listings still answer."""

    away = False

    async def load_a2a_task(self, task_id: str) -> A2ATaskRecord | None:
        if self.away:
            raise ConnectionRefusedError("the database is away")
        return await super().load_a2a_task(task_id)

    async def orphaned_a2a_tasks(self, task_ids: Collection[str], host_id: str) -> set[str]:
        if self.away:
            raise ConnectionRefusedError("the database is away")
        return await super().orphaned_a2a_tasks(task_ids, host_id)


@pytest.mark.network_server
async def test_a_lookup_the_store_fails_tells_the_task_as_known(postgres_url: str) -> None:
    """With a shared store, the checks a lookup adds (is a task running here ended elsewhere,
    is a stored task's host gone) fail with the store: the task is told as this host knows it
    (its running copy, or as stored), as before those checks. Before, GetTask of a task
    running here, and a listing, failed with an internal error."""
    store = _Away(postgres_url)
    await store.open()
    board = TaskBoard(store)
    board.host_id = "me"
    try:
        working = {"id": "r", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
        running = board.running["r"] = RunningTask(working, "go")
        running.job = asyncio.get_running_loop().create_future()
        elsewhere = {"id": "s", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
        record = A2ATaskRecord("s", "c", "working", 1.0, elsewhere)
        assert await store.save_a2a_task_on(record, "other")
        store.away = True
        assert await board.get("r") is working
        assert not running.job.done()
        docs, total = await board.page(
            context_id="c", state="", updated_after=0.0, limit=10, offset=0
        )
        assert total == 2 and sorted(d["id"] for d in docs) == ["r", "s"]
        assert [d for d in docs if d["id"] == "s"] == [elsewhere]
        running.job.cancel()
    finally:
        await store.close()
