"""A store that keeps everything in memory: the default for an in-process toolkit.

The audit trail is a ring of the newest ``audit_limit`` entries so a long-running program does
not grow without bound; give the toolkit a SQLite path for a durable trail.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

from toolmesh.audit import AuditEntry
from toolmesh.store.base import (
    A2A_FINAL_STATES,
    A2ATaskRecord,
    SessionRecord,
    StateRecord,
    Store,
)

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    url = "memory://"

    def __init__(self, *, audit_limit: int = 10_000) -> None:
        self.audit: deque[AuditEntry] = deque(maxlen=audit_limit)
        self._sessions: dict[str, SessionRecord] = {}
        self._state: dict[str, StateRecord] = {}
        self._tasks: dict[str, A2ATaskRecord] = {}

    async def append_audit(self, entry: AuditEntry, *, durable: bool = True) -> None:
        self.audit.append(entry)

    async def recent_audit(self, limit: int = 20) -> list[AuditEntry]:
        return list(reversed(self.audit))[:limit]

    async def save_session(self, record: SessionRecord) -> None:
        self._sessions[record.session_id] = record

    async def load_session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    async def load_state(self, session_id: str) -> StateRecord | None:
        record = self._state.get(session_id)
        return (
            None if record is None else StateRecord(copy.deepcopy(record.document), record.version)
        )

    async def save_state(
        self, session_id: str, document: dict[str, Any], *, expected_version: int
    ) -> bool:
        current = self._state.get(session_id)
        if (current.version if current else 0) != expected_version:
            return False
        self._state[session_id] = StateRecord(copy.deepcopy(document), expected_version + 1)
        return True

    async def save_a2a_task(self, record: A2ATaskRecord) -> bool:
        stored = self._tasks.get(record.task_id)
        if (
            stored is not None
            and stored.state in A2A_FINAL_STATES
            and stored.document != record.document
        ):
            return False
        self._tasks[record.task_id] = _copy_task(record)
        return True

    async def replace_a2a_task_on(
        self, record: A2ATaskRecord, host_id: str, expected: A2ATaskRecord
    ) -> bool:
        # No await between the comparison and the write: atomic on the event loop
        stored = self._tasks.get(record.task_id)
        if stored is None or (
            stored.document != record.document
            and (stored.state in A2A_FINAL_STATES or stored.document != expected.document)
        ):
            return False
        self._tasks[record.task_id] = _copy_task(record)
        return True

    async def load_a2a_task(self, task_id: str) -> A2ATaskRecord | None:
        record = self._tasks.get(task_id)
        return None if record is None else _copy_task(record)

    async def list_a2a_tasks(
        self,
        *,
        context_id: str = "",
        state: str = "",
        updated_after: float = 0.0,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[A2ATaskRecord], int]:
        found = [
            r
            for r in self._tasks.values()
            if (not context_id or r.context_id == context_id)
            and (not state or r.state == state)
            and (not updated_after or r.updated_at > updated_after)
        ]
        found.sort(key=lambda r: r.updated_at, reverse=True)
        return [_copy_task(r) for r in found[offset : offset + limit]], len(found)


def _copy_task(record: A2ATaskRecord) -> A2ATaskRecord:
    return A2ATaskRecord(
        record.task_id,
        record.context_id,
        record.state,
        record.updated_at,
        copy.deepcopy(record.document),
    )
