"""Audit entries: one durable record per call, whatever its outcome.

The pipeline writes the entry to the store before the response leaves. When the store fails,
the entry is logged in full at ERROR level on the ``toolmesh.audit`` logger (so it is never
silently lost), the failure is counted, and the host reports itself degraded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from toolmesh import strictjson

__all__ = ["AuditEntry", "digest_arguments", "storable"]

logger = logging.getLogger("toolmesh.audit")


@dataclass(slots=True)
class AuditEntry:
    """Who called what, with which arguments (as a digest), how it ended and what it cost."""

    tool_name: str
    success: bool
    error_code: str | None = None
    duration_ms: int = 0
    session_id: str = ""
    agent_id: str = ""
    req_id: str = ""
    correlation_id: str = ""
    source: str = ""
    transport: str = ""
    input_bytes: int = 0
    output_bytes: int = 0
    args_digest: str = ""
    decision: str = ""
    host_id: str = ""
    ts: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _not_json(value: Any) -> Any:
    """A value of no JSON type (a set, bytes, any object an in-process caller passed) is refused,
    as NaN is: no other transport could have carried it."""
    raise TypeError(f"a Python {type(value).__name__} is not JSON")


# Canonical JSON (sorted keys, no spaces, UTF-8 as is). No NaN or infinity: JSON has neither
# (1e999 is read as infinity), so such arguments are unfit.
_canonical = strictjson.encoder(sort_keys=True, compact=True, default=_not_json)


class NotJSON(ValueError):
    """Arguments that cannot be written as JSON; ``path`` locates the culprit when known."""

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(message)
        self.path = path


def digest_arguments(arguments: Any) -> tuple[int, str]:
    """The size in bytes of the arguments' canonical JSON and its SHA-256 (hex); ``ValueError``
    when they cannot be written as JSON (a structure that contains itself, keys that cannot be
    sorted together)."""
    try:
        canonical = _canonical(arguments).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        where = _unfit_at(arguments, "$")
        if where is not None:
            raise NotJSON(f"the arguments are not JSON: {where[1]}", path=where[0]) from None
        raise NotJSON(f"the arguments are not JSON: {exc}") from None
    return len(canonical), hashlib.sha256(canonical).hexdigest()


def _unfit_at(value: Any, path: str, depth: int = 0) -> tuple[str, str] | None:
    """The JSON path of the first value in ``value`` that cannot be written as JSON, and why:
    NaN or infinity, an integer too long to write out, a value of no JSON type."""
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return path, (
            f"the number at {path} is {value!r}, which JSON cannot carry (a number as large as "
            "1e999 is read as infinity)"
        )
    if isinstance(value, int):
        if _writable(value):
            return None
        limit = sys.get_int_max_str_digits()
        return path, f"the integer at {path} is too long: it has more than {limit:,} digits"
    if isinstance(value, str) or value is None:
        return None
    if depth > 100:  # what holds itself, or nests deeper than any JSON may
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return path, f"the value at {path} is a Python {type(value).__name__}, which is not JSON"
    for key, item in items:
        if isinstance(key, int):
            step = f"{path}[{key}]"
        else:  # as toolmesh.schema.child_path writes it
            text = str(key)
            step = f"{path}.{text}" if text.isidentifier() else f"{path}[{json.dumps(text)}]"
        found = _unfit_at(item, step, depth + 1)
        if found is not None:
            return found
    return None


def _writable(number: int) -> bool:
    """Whether Python writes ``number`` out in digits (``sys.set_int_max_str_digits``)."""
    try:
        int.__repr__(number)
    except ValueError:
        return False
    return True


def storable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row`` with text every store can write: a lone surrogate (no UTF-8 codec writes one; an
    in-process caller can pass it) becomes its escape, ``\\udc80``, and NUL (which PostgreSQL
    refuses, and JSON allows) becomes ``\\x00``. The entry is kept, its oddity visible."""
    return tuple(_storable_text(value) if isinstance(value, str) else value for value in row)


def _storable_text(text: str) -> str:
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def log_lost_entry(entry: AuditEntry, exc: BaseException) -> None:
    """Last resort for an entry the store refused: the full record, loudly, on the log."""
    logger.error(
        "audit store failed (%s: %s); entry follows so it is not lost: %s",
        type(exc).__name__,
        exc,
        json.dumps(entry.to_dict(), default=str),
    )
