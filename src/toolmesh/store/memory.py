"""A store that keeps everything in memory: the default for an in-process toolkit.

The audit trail is a ring of the newest ``audit_limit`` entries so a long-running program does
not grow without bound; give the toolkit a SQLite path for a durable trail.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

from toolmesh.audit import AuditEntry
from toolmesh.store.base import SessionRecord, StateRecord, Store

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    url = "memory://"

    def __init__(self, *, audit_limit: int = 10_000) -> None:
        self.audit: deque[AuditEntry] = deque(maxlen=audit_limit)
        self._sessions: dict[str, SessionRecord] = {}
        self._state: dict[str, StateRecord] = {}

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
