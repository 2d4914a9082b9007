"""A client's answer to a message from its host that it cannot read (too large, not JSON, not
a valid message): when the start of it shows which request it answers, that request fails at
once with the reason, rather than waiting for its timeout."""

from __future__ import annotations

from pydantic_core import from_json

from toolmesh.errors import ProtocolError
from toolmesh.protocol import ErrorMessage
from toolmesh.transports.lines import HEAD_BYTES

__all__ = ["unreadable_answer"]


def unreadable_answer(start: bytes | str, problem: ProtocolError) -> ErrorMessage | None:
    """An ``error`` message standing in for the unreadable answer whose first bytes are
    ``start``, for the client to fail its request with; None when those bytes name no request,
    or belong to an event (its call's answer may still come, and be read)."""
    try:
        head = from_json(start[:HEAD_BYTES], allow_partial=True)  # a cut-off value is left out
    except ValueError:
        return None
    if not isinstance(head, dict) or head.get("type") == "tool/event":
        return None
    req_id = head.get("req_id")
    if not isinstance(req_id, str) or not req_id:
        return None
    kind = head.get("type")
    return ErrorMessage(
        req_id=req_id,
        code=problem.code,
        message=f"the host's answer ({kind}) could not be read: {problem.message}",
        detail=problem.detail,
    )
