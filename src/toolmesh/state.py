"""Session state documents and the RFC 6902 JSON Patch updates tools return (seed 003).

Each session has one JSON document, ``{"context": {}}`` at first. A tool reads a snapshot and may
return a patch. A patch is checked (every path must lie under an allowed prefix, ``/context/`` by
default; every value must be JSON that every store and every peer can hold: no NaN, sets, keys
that are not text, lone surrogates or NUL, nesting at most ``MAX_DEPTH`` deep), applied to a copy
(all operations or none: a failing ``test`` leaves the document as it was; one patch adds at most
``MAX_UPDATE_SIZE``), then stored by compare-and-set so two writers can never overwrite each
other's update. A store that fails raises its own error, and the document is unchanged.

Documents are cached per host; with a store other hosts write too (``store.shared``) every read
goes to the store, so no host hands a tool a document another host has since changed.
"""

from __future__ import annotations

import asyncio
import copy
import math
import sys
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from toolmesh.errors import StateError, ToolmeshError
from toolmesh.store.base import StateRecord, Store

__all__ = [
    "INITIAL_STATE",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_INT_DIGITS",
    "MAX_PATCH_BYTES",
    "MAX_UPDATE_SIZE",
    "StateContendedError",
    "StateManager",
]

INITIAL_STATE: dict[str, Any] = {"context": {}}

MAX_DEPTH = 100
"""How deep a document may nest (objects and arrays, the document itself counted). pydantic-core,
which reads every A2E message, stops at 200 levels, and a message wraps the document in a few
more: a deeper document would be stored and then unreadable by every client."""

MAX_UPDATE_SIZE = 16 * 1024 * 1024
"""The most one patch may add to a document, in characters of text plus one per value: what one
A2E message can carry. The pointers count too (an ``add`` or ``move`` to a new member adds its
name). It also bounds ``copy``, which doubles what it copies at each repeat."""

MAX_PATCH_BYTES = 4 * 1024 * 1024
"""The most one patch may be as JSON (UTF-8 bytes): the call's answer carries it twice (the
result's ``state_update`` and its ``state`` event), and with the rest of the result must fit in
one A2E message (16 MiB by default). A larger update would be stored and then never reach the
caller, whose retry would apply it again."""

MAX_DOCUMENT_BYTES = 8 * 1024 * 1024
"""The most a session's state document may grow to as JSON: it travels whole in a
``state/get/resp`` (and to every worker tool a call runs), within one message. An update that
would make it larger is refused, unless it makes it no larger than it was."""

MAX_INT_DIGITS = 4300
"""The most digits an integer in a document may have: Python refuses to read or write longer
ones as text (``sys.int_info.default_max_str_digits``), so a store could not save it, nor a
Python client read it."""
_INT_LIMIT = 10**MAX_INT_DIGITS  # the smallest integer with one digit too many
_SHORT_INT_BITS = int(MAX_INT_DIGITS / math.log10(2))  # an integer this long has few enough

_OPS = {"add", "remove", "replace", "move", "copy", "test"}
_CAS_ATTEMPTS = 50
_DETAIL_CHARS = 300  # of a refusal's reason as the JSON Patch library words it


class StateContendedError(ToolmeshError):
    """Other writers kept updating the session's state first: the update was fine but is not
    applied (the call fails retryably, as when the store fails, not as an invalid update)."""


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
        when it is malformed, touches a forbidden path, holds a value that is not JSON or fails.
        An error of the store itself propagates as it is, and ``StateContendedError`` when other
        writers got there first at every attempt (the document is unchanged either way)."""
        budget = _Budget()
        operations = self._check(patch, budget)
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            for attempt in range(_CAS_ATTEMPTS):
                # The first try may start from the document this call's tool was given (read
                # moments ago): compare-and-set catches it if another host wrote since.
                cached = self._cache.get(session_id) if attempt == 0 else None
                record = cached or await self._load(session_id)
                try:
                    document = _patched(record.document, operations, budget.copy())
                except StateError:
                    if cached is not None:
                        # Judge it against the stored document, not a copy: another process
                        # on the same file may have changed it since (a failing `test`).
                        self._cache.pop(session_id, None)
                        continue
                    raise
                _check_document_size(document, record.document)
                if await self.store.save_state(
                    session_id, document, expected_version=record.version
                ):
                    stored = StateRecord(document, record.version + 1)
                    self._cache[session_id] = stored
                    return stored
                self._cache.pop(session_id, None)  # another host wrote first: reload and retry
        raise StateContendedError(f"state of session {session_id} is contended; update not applied")

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)
        self._locks.pop(session_id, None)

    async def _load(self, session_id: str) -> StateRecord:
        record = None if self.read_through else self._cache.get(session_id)
        if record is None:
            try:
                stored = await self.store.load_state(session_id)
            except ValueError as exc:  # the store holds text that is not JSON (damaged)
                raise StateError(
                    f"the stored state of session {session_id} cannot be read: {exc}"
                ) from exc
            if stored is not None and not isinstance(stored.document, dict):
                raise StateError(
                    f"the stored state of session {session_id} is not a JSON object "
                    f"but {type(stored.document).__name__}"
                )
            record = stored or StateRecord(copy.deepcopy(INITIAL_STATE), 0)
            self._cache[session_id] = record
        return record

    def _check(self, patch: Sequence[dict[str, Any]], budget: _Budget) -> list[dict[str, Any]]:
        """The operations of ``patch``, their values as plain JSON (tuples become lists), or
        ``StateError`` naming the first operation that is wrong and what is wrong with it."""
        if not isinstance(patch, list | tuple):
            raise StateError("a state update must be a list of RFC 6902 operations")
        operations: list[dict[str, Any]] = []
        for index, op in enumerate(patch):
            where = f"state_update[{index}]"
            # str first: an unhashable 'op' (a list) would make the set lookup raise.
            if (
                not isinstance(op, dict)
                or not isinstance(kind := op.get("op"), str)
                or kind not in _OPS
            ):
                raise StateError(f"{where}: 'op' must be one of {', '.join(sorted(_OPS))}")
            for key in ("path", "from") if kind in ("move", "copy") else ("path",):
                self._check_pointer(op.get(key), key, where)
                budget.spend(len(op[key]), where)  # a new member's name is added text too
            if kind in ("add", "replace", "test") and "value" not in op:
                raise StateError(f"{where}: {kind!r} needs a 'value'")
            operations.append(_with_plain_value(op, where, budget))
        size = len(to_json(operations))
        if size > MAX_PATCH_BYTES:
            raise StateError(
                f"the update is {size} bytes as JSON, more than the {MAX_PATCH_BYTES} one "
                "answer can carry back"
            )
        return operations

    def _check_pointer(self, pointer: Any, key: str, where: str) -> None:
        if not isinstance(pointer, str):
            raise StateError(f"{where}: {key!r} must be a JSON Pointer string")
        _check_text(pointer, f"{where}: {key} {pointer!r}")
        if not self._allowed(pointer):
            allowed = ", ".join(self.allowed_prefixes)
            if any(pointer == p.rstrip("/") for p in self.allowed_prefixes):
                raise StateError(
                    f"{where}: {key} {pointer!r} is the container itself; an update "
                    f"may change only what is under it ({allowed})"
                )
            raise StateError(f"{where}: {key} {pointer!r} is outside {allowed}")

    def _allowed(self, pointer: str) -> bool:
        """Whether ``pointer`` lies strictly under an allowed prefix. A prefix names a
        container, with or without its trailing slash (``/context/`` and ``/context`` mean the
        same): its members may change, the container itself may not be replaced or removed,
        and ``/contextual`` is not under ``/context``."""
        return any(pointer.startswith(prefix.rstrip("/") + "/") for prefix in self.allowed_prefixes)


class _Budget:
    """What one patch may still add to the document (``MAX_UPDATE_SIZE``)."""

    __slots__ = ("left",)

    def __init__(self, left: int = MAX_UPDATE_SIZE) -> None:
        self.left = left

    def copy(self) -> _Budget:
        return _Budget(self.left)  # each compare-and-set attempt starts from what is left

    def spend(self, amount: int, where: str) -> None:
        self.left -= amount
        if self.left < 0:
            raise StateError(
                f"{where}: the update adds more than {MAX_UPDATE_SIZE} characters and values "
                "to the state document"
            )


def _with_plain_value(op: dict[str, Any], where: str, budget: _Budget) -> dict[str, Any]:
    """``op`` with its value checked and copied as plain JSON (when it has one)."""
    if "value" not in op:
        return op
    return {**op, "value": _PlainValue(where, op["path"], budget).of(op["value"])}


class _PlainValue:
    """Copies one operation's value as plain JSON, or raises ``StateError`` naming where in the
    document it is not. Subclasses (an IntEnum, a str enum) become their base type and tuples
    lists, so the document cached is the document every store writes and reads back."""

    def __init__(self, where: str, path: str, budget: _Budget) -> None:
        self.where = where
        self.path = path
        self.budget = budget

    def of(self, value: Any) -> Any:
        levels = MAX_DEPTH - self.path.count("/")  # each token of the path is one level already
        return self._plain(value, self.path, levels)

    def _plain(self, value: Any, at: str, levels: int) -> Any:
        self.budget.spend(1, self.where)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if value.bit_length() > _SHORT_INT_BITS and abs(value) >= _INT_LIMIT:
                raise self._error(
                    at,
                    f"is an integer of about {int(value.bit_length() * math.log10(2)) + 1} "
                    f"digits; Python's JSON, which the stores and Python clients read with, "
                    f"takes at most {MAX_INT_DIGITS}",
                )
            return int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self._error(at, f"is {value!r}, which JSON cannot hold")
            return float(value)
        if isinstance(value, str):
            return self._text(value, at)
        if not isinstance(value, dict | list | tuple):
            raise self._error(at, f"is a Python {type(value).__name__}, which is not JSON")
        if levels <= 0:  # a structure that contains itself ends here too
            raise self._error(
                self.path,
                f"nests deeper than {MAX_DEPTH} levels in the document (or contains itself)",
            )
        if isinstance(value, dict):
            return self._object(value, at, levels)
        return [self._plain(item, f"{at}/{i}", levels - 1) for i, item in enumerate(value)]

    def _object(self, value: dict[Any, Any], at: str, levels: int) -> dict[str, Any]:
        plain: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise self._error(
                    at, f"has the key {key!r} ({type(key).__name__}); JSON keys are text"
                )
            name = self._text(key, at)
            token = name.replace("~", "~0").replace("/", "~1")
            plain[name] = self._plain(item, f"{at}/{token}", levels - 1)
        return plain

    def _text(self, text: str, at: str) -> str:
        self.budget.spend(len(text), self.where)
        _check_text(text, f"{self.where}: the value at {at!r}")
        return text if type(text) is str else str.__str__(text)

    def _error(self, at: str, reason: str) -> StateError:
        return StateError(f"{self.where}: the value at {at!r} {reason}")


def _check_text(text: str, where: str) -> None:
    """Refuse text some store cannot hold: a lone surrogate has no UTF-8 form (SQLite and the
    wire refuse it), and PostgreSQL's jsonb refuses NUL."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise StateError(
                f"{where} holds a lone surrogate ({text[exc.start]!r}), which is not valid Unicode"
            ) from None
    if "\x00" in text:
        raise StateError(f"{where} holds NUL (\\u0000), which not every store can keep")


def _patched(
    document: dict[str, Any], operations: list[dict[str, Any]], budget: _Budget
) -> dict[str, Any]:
    """``document`` with ``operations`` applied, as a new document (``document`` is left as it
    was); ``StateError`` naming the operation that could not be applied."""
    import jsonpatch  # on first update: most sessions never need it

    patched = copy.deepcopy(document)
    for index, op in enumerate(operations):
        source = f"{op['from']!r} -> " if op["op"] in ("copy", "move") else ""
        where = f"state_update[{index}] ({op['op']} {source}{op['path']!r})"
        try:
            if op["op"] in ("copy", "move"):
                _check_relocation(patched, op, where, budget)
            # One at a time, in place, on the private copy: a failure names its operation, and
            # the copy is dropped whole, so nothing of the patch is kept.
            patched = jsonpatch.apply_patch(patched, [op], in_place=True)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise StateError(f"{where} not applied: {_detail(exc)}") from exc
    return patched


def _check_document_size(document: dict[str, Any], before: dict[str, Any]) -> None:
    size = len(to_json(document))
    if size > MAX_DOCUMENT_BYTES and size > len(to_json(before)):
        raise StateError(
            f"the update would make the state {size} bytes as JSON, more than the "
            f"{MAX_DOCUMENT_BYTES} one message carries whole; the state is unchanged"
        )


def _detail(exc: Exception) -> str:
    """The library's reason, cut short: it may quote whole values of the document (``member
    'x' not found in {...}``, a failed ``test`` quotes both values), megabytes of text an error
    would carry to the peer, past what one message may hold."""
    text = str(exc)
    if len(text) <= _DETAIL_CHARS:
        return text
    return f"{text[:_DETAIL_CHARS]}... ({len(text)} characters, cut)"


def _check_relocation(
    document: dict[str, Any], op: dict[str, Any], where: str, budget: _Budget
) -> None:
    """Refuse a ``copy`` that adds more than the budget allows, or a ``copy``/``move`` that
    would nest the document deeper than ``MAX_DEPTH``."""
    import jsonpatch

    source = jsonpatch.JsonPointer(op["from"]).resolve(document, _MISSING)
    if source is _MISSING:
        raise StateError(f"{where} not applied: {op['from']!r} does not exist")
    limit = budget.left if op["op"] == "copy" else sys.maxsize
    levels, size = _extent(source, limit)
    if op["op"] == "copy":
        budget.spend(size, where)
    if op["path"].count("/") + levels > MAX_DEPTH:
        raise StateError(f"{where} would nest the document deeper than {MAX_DEPTH} levels")


_MISSING = object()


def _extent(value: Any, limit: int) -> tuple[int, int]:
    """How many containers deep ``value`` (plain JSON) nests, and its size as ``_Budget`` counts
    it; the walk stops once the size passes ``limit``."""
    levels, size = 0, 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending and size <= limit:
        item, level = pending.pop()
        size += 1
        if isinstance(item, dict):
            levels = max(levels, level)
            size += sum(map(len, item))
            pending.extend((member, level + 1) for member in item.values())
        elif isinstance(item, list):
            levels = max(levels, level)
            pending.extend((member, level + 1) for member in item)
        elif isinstance(item, str):
            size += len(item)
    return levels, size
