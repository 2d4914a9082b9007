"""The store interface: everything toolmesh keeps beyond one call.

Audit entries, sessions and their state documents, and the tasks of the A2A server, live behind
this one interface so the embedded default (SQLite, one file) and a shared server database are
interchangeable.

A store also carries signals between the hosts that share it (``publish``/``subscribe``): in
one process they are plain callbacks; PostgreSQL carries them to every host (LISTEN/NOTIFY).
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from toolmesh.audit import AuditEntry

__all__ = [
    "A2A_FINAL_STATES",
    "A2ATaskRecord",
    "SessionRecord",
    "StateRecord",
    "Store",
    "Subscriber",
]

logger = logging.getLogger("toolmesh.store")

Subscriber = Callable[[str], None]
"""Called with each payload published on a topic (on the event loop; must not block)."""

TOPIC = re.compile(r"^[a-z][a-z0-9_.]{0,40}$")
MAX_PAYLOAD_BYTES = 7900  # PostgreSQL's NOTIFY takes under 8000 bytes
A2A_FINAL_STATES = ("completed", "failed", "canceled", "rejected")
"""The ``state`` of a task that never changes again: A2A's terminal states, by the short names
the A2A server stores (``toolmesh.a2a.wire.TERMINAL``)."""


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
    shared: bool = False
    """True when other hosts write to the same store: nothing read may be cached across calls."""
    audit_rows_lost: int = 0
    """Audit rows of earlier calls a batched commit lost (each was logged in full instead)."""

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
    async def save_a2a_task(self, record: A2ATaskRecord) -> bool:
        """Create or replace a task (committed before returning); True when written. A stored
        task in a final state (``A2A_FINAL_STATES``) is kept as it is and False returned: the
        first end recorded is the task's, whichever host wrote it. Writing the stored document
        again counts as written (a retry after a lost reply finds its own write)."""

    @abstractmethod
    async def load_a2a_task(self, task_id: str) -> A2ATaskRecord | None:
        """A task, or None when the id is unknown."""

    @abstractmethod
    async def list_a2a_tasks(
        self,
        *,
        context_id: str = "",
        state: str = "",
        updated_after: float = 0.0,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[A2ATaskRecord], int]:
        """Tasks (of one context and/or in one state when given, updated after the epoch time
        ``updated_after`` when it is not 0), most recently updated first, and how many match in
        all."""

    async def save_a2a_task_on(self, record: A2ATaskRecord, host_id: str) -> bool:
        """``save_a2a_task``, written by the host ``host_id`` (the host running the task, while
        it goes on). A store shared by hosts records the host with the task, so the others can
        tell when it is gone (``orphaned_a2a_tasks``); a store of one host needs not."""
        return await self.save_a2a_task(record)

    async def replace_a2a_task_on(
        self, record: A2ATaskRecord, host_id: str, expected: A2ATaskRecord
    ) -> bool:
        """``save_a2a_task_on`` as a compare-and-set: ``record`` is written only while the
        stored task is still ``expected`` (its document unchanged since it was read), and
        True returned; False, nothing written, when another writer changed it first (or it is
        unknown, or ended: a final state is kept, as by ``save_a2a_task``). Writing
        ``record``'s document again counts as written (a retry after a lost reply finds its own
        write). How a reply resumes an interrupted task: of replies that come through hosts at
        once, one goes on.

        This default reads, then writes: enough for a store of one host, which the server
        does not write in between; a store shared by hosts makes it one atomic write."""
        stored = await self.load_a2a_task(record.task_id)
        if stored is None or stored.document not in (expected.document, record.document):
            return False
        return await self.save_a2a_task_on(record, host_id)

    async def orphaned_a2a_tasks(self, task_ids: Collection[str], host_id: str) -> set[str]:
        """Of ``task_ids``, the tasks whose host is gone as ``host_id`` can tell: last written
        (``save_a2a_task_on``) by another host, which stopped saying it is alive
        (``host_alive``). What such a task holds is all it will ever have, unless another host
        ends it. A store of one host has none: the tasks not running are the earlier server's."""
        return set()

    # -- hosts sharing the store ---------------------------------------------------------------

    async def host_alive(self, host_id: str) -> None:  # noqa: B027 - optional hook
        """Record that the host ``host_id`` is alive: its heartbeat, every few seconds while it
        serves (a store of one host keeps nothing)."""

    async def host_gone(self, host_id: str) -> None:  # noqa: B027 - optional hook
        """Forget the host ``host_id``: it stopped cleanly."""

    # -- signals between the hosts sharing the store -------------------------------------------

    def subscribe(
        self, topic: str, callback: Subscriber, *, resync: Callable[[], None] | None = None
    ) -> Callable[[], None]:
        """Call ``callback(payload)`` for every payload published on ``topic`` by any host
        (this one included); return the function that unsubscribes. ``resync`` is called when
        signals may have been missed (a shared store lost and regained its connection)."""
        _check_topic(topic)
        entry = (callback, resync)
        subscribers = self._subscribers()
        subscribers.setdefault(topic, []).append(entry)

        def unsubscribe() -> None:
            listeners = subscribers.get(topic, [])
            if entry in listeners:
                listeners.remove(entry)

        return unsubscribe

    async def publish(self, topic: str, payload: str) -> None:
        """Deliver ``payload`` (text, under 7900 bytes) to the subscribers of ``topic``."""
        _check_topic(topic)
        _check_payload(payload)
        self.dispatch(topic, payload)

    def dispatch(self, topic: str, payload: str) -> None:
        """Hand one arrived signal to this process's subscribers."""
        for callback, _resync in list(self._subscribers().get(topic, ())):
            try:
                callback(payload)
            except Exception:
                logger.exception("a subscriber of %r failed", topic)

    def resync(self) -> None:
        """Tell every subscriber that signals may have been missed."""
        for entries in list(self._subscribers().values()):
            for _callback, resync in list(entries):
                if resync is not None:
                    try:
                        resync()
                    except Exception:
                        logger.exception("a store resync callback failed")

    def topics(self) -> list[str]:
        return [topic for topic, entries in self._subscribers().items() if entries]

    def _subscribers(
        self,
    ) -> dict[str, list[tuple[Subscriber, Callable[[], None] | None]]]:
        found: dict[str, list[tuple[Subscriber, Callable[[], None] | None]]] = (
            self.__dict__.setdefault("_topic_subscribers", {})
        )
        return found


def _check_topic(topic: str) -> None:
    if not TOPIC.match(topic):
        raise ValueError(f"a topic is lowercase letters, digits, '_' and '.', not {topic!r}")


def _check_payload(payload: str) -> None:
    if len(payload.encode()) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"a published payload must be under {MAX_PAYLOAD_BYTES} bytes")
