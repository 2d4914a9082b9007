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
    "sqlite_path",
]


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:///PATH`` URL names. SQLAlchemy's convention: what follows the third
    slash is the path, so sqlite:///audit.db is relative and sqlite:////var/lib/audit.db
    absolute."""
    return url.removeprefix("sqlite://").removeprefix("/")


def open_store(target: str | Path | Store | None) -> Store:
    """A store for ``target``: a Store, ``memory://``, ``sqlite:///PATH``, a plain file path, or
    ``postgresql://USER@HOST:PORT/DB`` (several hosts sharing one database; the ``postgres``
    extra). None gives a MemoryStore.
    """
    if target is None:
        return MemoryStore()
    if isinstance(target, Store):
        return target
    text = str(target)
    if text in ("memory", "memory://"):
        return MemoryStore()
    if text.startswith("sqlite://"):
        return SqliteStore(sqlite_path(text) or ":memory:")
    if text.startswith(("postgresql://", "postgres://")):
        return _postgres(text)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise ConfigError(
            f"unsupported store URL scheme {scheme!r} "
            "(use sqlite:///PATH, postgresql://... or memory://)"
        )
    return SqliteStore(text)


def _postgres(url: str) -> Store:
    try:
        from toolmesh.store.postgres import PostgresStore
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"a postgresql:// store needs {exc.name!r}: pip install 'toolmesh[postgres]'"
        ) from None
    return PostgresStore(url)
