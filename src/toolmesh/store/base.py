"""The store interface: everything toolmesh keeps beyond one call.

Audit entries, sessions and their state documents, and the tasks of the A2A server, live behind
this one interface so the embedded default (SQLite, one file) and a shared server database are
interchangeable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from toolmesh.audit import AuditEntry

__all__ = ["A2ATaskRecord", "SessionRecord", "StateRecord", "Store"]


@dataclass(slots=True)
class SessionRecord:
    """What outlives a session's connection: who it is and what it holds."""

    session_id: str
    agent_id: str = ""
    capabilities: list[str] = field(default_factory=list)
    created_at: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StateRecord:
    """A session's state document and its version (bumped by every applied update)."""

    document: dict[str, Any]
    version: int


@dataclass(slots=True)
class A2ATaskRecord:
    """An A2A task served by this host: its A2A 1.0 JSON document and the keys it is found by."""

    task_id: str
    context_id: str
    state: str
    updated_at: float
    document: dict[str, Any]


class Store(ABC):
    """Durable records. Implementations must be safe to call from one event loop."""

    url: str = ""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect and apply schema migrations."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the store may be opened again."""

    # -- audit ---------------------------------------------------------------------------------

    @abstractmethod
    async def append_audit(self, entry: AuditEntry, *, durable: bool = True) -> None:
        """Record one call. ``durable``: committed before returning. Otherwise the store may
        commit it with others a moment later (used for in-process calls, whose caller shares
        the host's fate)."""

    @abstractmethod
    async def recent_audit(self, limit: int = 20) -> list[AuditEntry]:
        """The newest entries, newest first."""

    # -- sessions and state --------------------------------------------------------------------

    @abstractmethod
    async def save_session(self, record: SessionRecord) -> None:
        """Create or update a session record."""

    @abstractmethod
    async def load_session(self, session_id: str) -> SessionRecord | None:
        """A session record, or None when the id is unknown."""

    @abstractmethod
    async def load_state(self, session_id: str) -> StateRecord | None:
        """A session's state document, or None before its first update."""

    @abstractmethod
    async def save_state(
        self, session_id: str, document: dict[str, Any], *, expected_version: int
    ) -> bool:
        """Store ``document`` as version ``expected_version + 1`` if the stored version is still
        ``expected_version`` (compare-and-set); False when another writer got there first."""

    # -- A2A tasks -----------------------------------------------------------------------------

    @abstractmethod
    async def save_a2a_task(self, record: A2ATaskRecord) -> None:
        """Create or replace a task (committed before returning)."""

    @abstractmethod
    async def load_a2a_task(self, task_id: str) -> A2ATaskRecord | None:
        """A task, or None when the id is unknown."""

    @abstractmethod
    async def list_a2a_tasks(
        self, *, context_id: str = "", state: str = "", limit: int = 50, offset: int = 0
    ) -> tuple[list[A2ATaskRecord], int]:
        """Tasks (of one context and/or in one state when given), most recently updated first,
        and how many match in all."""
