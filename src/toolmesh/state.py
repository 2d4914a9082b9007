"""Session state documents and the RFC 6902 JSON Patch updates tools return (seed 003).

Each session has one JSON document, ``{"context": {}}`` at first. A tool reads a snapshot and may
return a patch. A patch is checked (every path must lie under an allowed prefix, ``/context/`` by
default), applied to a copy (all operations or none: a failing ``test`` leaves the document as it
was), then stored by compare-and-set so two writers can never overwrite each other's update.

Documents are cached per host; with a store other hosts write too (``store.shared``) every read
goes to the store, so no host hands a tool a document another host has since changed.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

from toolmesh.errors import StateError
from toolmesh.store.base import StateRecord, Store

__all__ = ["INITIAL_STATE", "StateManager"]

INITIAL_STATE: dict[str, Any] = {"context": {}}

_OPS = {"add", "remove", "replace", "move", "copy", "test"}
_CAS_ATTEMPTS = 50


class StateManager:
    """Reads, patches and persists the state documents of one store's sessions."""

    def __init__(self, store: Store, *, allowed_prefixes: Sequence[str] = ("/context/",)) -> None:
        self.store = store
        self.read_through = store.shared
        self.allowed_prefixes = tuple(allowed_prefixes)
        self._cache: dict[str, StateRecord] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def cached(self, session_id: str) -> dict[str, Any] | None:
        """The last document seen for a session, without touching the store."""
        record = self._cache.get(session_id)
        return None if record is None else record.document

    async def current(self, session_id: str) -> StateRecord:
        """The session's document (a private copy) and its version."""
        record = await self._load(session_id)
        return StateRecord(copy.deepcopy(record.document), record.version)

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        """The session's document (a private copy)."""
        record = await self._load(session_id)
        return copy.deepcopy(record.document)

    async def ensure_loaded(self, session_id: str) -> dict[str, Any]:
        """The session's document as cached for snapshots (loaded once per session)."""
        record = self._cache.get(session_id)
        if record is None or self.read_through:
            record = await self._load(session_id)
        return record.document

    async def apply(self, session_id: str, patch: Sequence[dict[str, Any]]) -> StateRecord:
        """Apply ``patch`` atomically and persist it; raise ``StateError`` and change nothing
        when it is malformed, touches a forbidden path or fails."""
        import jsonpatch  # on first update: most sessions never need it

        operations = self._check(patch)
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            for attempt in range(_CAS_ATTEMPTS):
                # The first try may start from the document this call's tool was given (read
                # moments ago): compare-and-set catches it if another host wrote since.
                cached = self._cache.get(session_id) if attempt == 0 else None
                record = cached or await self._load(session_id)
                try:
                    document = jsonpatch.apply_patch(record.document, operations, in_place=False)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    if cached is not None and self.read_through:
                        continue  # judge the patch against the stored document, not a copy
                    raise StateError(f"state update not applied: {exc}") from exc
                if await self.store.save_state(
                    session_id, document, expected_version=record.version
                ):
                    stored = StateRecord(document, record.version + 1)
                    self._cache[session_id] = stored
                    return stored
                self._cache.pop(session_id, None)  # another host wrote first: reload and retry
        raise StateError(f"state of session {session_id} is contended; update not applied")

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)
        self._locks.pop(session_id, None)

    async def _load(self, session_id: str) -> StateRecord:
        record = None if self.read_through else self._cache.get(session_id)
        if record is None:
            stored = await self.store.load_state(session_id)
            record = stored or StateRecord(copy.deepcopy(INITIAL_STATE), 0)
            self._cache[session_id] = record
        return record

    def _check(self, patch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if not isinstance(patch, list | tuple):
            raise StateError("a state update must be a list of RFC 6902 operations")
        operations: list[dict[str, Any]] = []
        for index, op in enumerate(patch):
            where = f"state_update[{index}]"
            if not isinstance(op, dict) or op.get("op") not in _OPS:
                raise StateError(f"{where}: 'op' must be one of {', '.join(sorted(_OPS))}")
            for key in ("path", "from") if op["op"] in ("move", "copy") else ("path",):
                pointer = op.get(key)
                if not isinstance(pointer, str):
                    raise StateError(f"{where}: {key!r} must be a JSON Pointer string")
                if not self._allowed(pointer):
                    allowed = ", ".join(self.allowed_prefixes)
                    if any(pointer == p.rstrip("/") for p in self.allowed_prefixes):
                        raise StateError(
                            f"{where}: {key} {pointer!r} is the container itself; an update "
                            f"may change only what is under it ({allowed})"
                        )
                    raise StateError(f"{where}: {key} {pointer!r} is outside {allowed}")
            if op["op"] in ("add", "replace", "test") and "value" not in op:
                raise StateError(f"{where}: {op['op']!r} needs a 'value'")
            operations.append(op)
        return operations

    def _allowed(self, pointer: str) -> bool:
        """Whether ``pointer`` lies strictly under an allowed prefix. A prefix names a
        container, with or without its trailing slash (``/context/`` and ``/context`` mean the
        same): its members may change, the container itself may not be replaced or removed,
        and ``/contextual`` is not under ``/context``."""
        return any(pointer.startswith(prefix.rstrip("/") + "/") for prefix in self.allowed_prefixes)
