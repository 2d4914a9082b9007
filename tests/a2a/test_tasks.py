"""The served agent's task board: a task left running by an earlier server is failed."""

from __future__ import annotations

from pathlib import Path

from toolmesh.a2a import wire
from toolmesh.a2a.tasks import RESTARTED, TaskBoard
from toolmesh.store import A2ATaskRecord, SqliteStore
from toolmesh.store.base import A2A_FINAL_STATES


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
