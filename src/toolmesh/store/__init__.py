"""Where toolmesh keeps audit entries, sessions and state: ``open_store`` picks by URL."""

from __future__ import annotations

from pathlib import Path

from toolmesh.errors import ConfigError
from toolmesh.store.base import A2ATaskRecord, SessionRecord, StateRecord, Store
from toolmesh.store.memory import MemoryStore
from toolmesh.store.sqlite import SqliteStore

__all__ = [
    "A2ATaskRecord",
    "MemoryStore",
    "SessionRecord",
    "SqliteStore",
    "StateRecord",
    "Store",
    "open_store",
]


def open_store(target: str | Path | Store | None) -> Store:
    """A store for ``target``: a Store, ``memory://``, ``sqlite:///PATH`` or a plain file path.

    None gives a MemoryStore.
    """
    if target is None:
        return MemoryStore()
    if isinstance(target, Store):
        return target
    text = str(target)
    if text in ("memory", "memory://"):
        return MemoryStore()
    if text.startswith("sqlite://"):
        # SQLAlchemy's convention: what follows the third slash is the path, so
        # sqlite:///audit.db is relative and sqlite:////var/lib/audit.db absolute.
        path = text.removeprefix("sqlite://").removeprefix("/")
        return SqliteStore(path or ":memory:")
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise ConfigError(f"unsupported store URL scheme {scheme!r} (use sqlite:/// or memory://)")
    return SqliteStore(text)
