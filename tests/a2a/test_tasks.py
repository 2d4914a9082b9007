"""The served agent's task board: a task left running by an earlier server is failed."""

from __future__ import annotations

from pathlib import Path

from toolmesh.a2a.tasks import RESTARTED, TaskBoard
from toolmesh.store import A2ATaskRecord, SqliteStore


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
