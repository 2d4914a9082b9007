"""Audit entries: one durable record per call, whatever its outcome.

The pipeline writes the entry to the store before the response leaves. When the store fails,
the entry is logged in full at ERROR level on the ``toolmesh.audit`` logger (so it is never
silently lost), the failure is counted, and the host reports itself degraded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AuditEntry", "digest_arguments"]

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


def digest_arguments(arguments: Any) -> tuple[int, str]:
    """The size in bytes of the arguments' canonical JSON and its SHA-256 (hex)."""
    canonical = json.dumps(
        arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()
    return len(canonical), hashlib.sha256(canonical).hexdigest()


def log_lost_entry(entry: AuditEntry, exc: BaseException) -> None:
    """Last resort for an entry the store refused: the full record, loudly, on the log."""
    logger.error(
        "audit store failed (%s: %s); entry follows so it is not lost: %s",
        type(exc).__name__,
        exc,
        json.dumps(entry.to_dict(), default=str),
    )
