"""Approvals over MCP: a call that needs approval asks the client through elicitation.

- 2025 revisions: the server sends ``elicitation/create`` (a one-field form, ``approve``) on the
  call's own channel and waits for the client's answer. A client that did not declare the
  ``elicitation`` capability cannot approve anything, and such calls are denied at once.
- 2026-07-28 (stateless): ``tools/call`` answers ``input_required`` with the same elicitation as
  an input request and a sealed ``requestState``; the client retries the call with its answer.
  The state is bound to the tool and its arguments and signed with the host's key, so it cannot
  be reused for another call or forged, and it expires with the approval timeout. It carries
  the approval's id, which the host spends on first use: one approval runs one call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from toolmesh.audit import digest_arguments
from toolmesh.pipeline import ApprovalPending, ApprovalRequest

__all__ = [
    "APPROVAL_INPUT",
    "ElicitationNeeded",
    "SpentApprovals",
    "answer_of",
    "elicitation",
    "seal",
    "unseal",
]

APPROVAL_INPUT = "toolmesh_approval"
"""The key of the approval among a 2026-07-28 call's input requests and responses."""


class ElicitationNeeded(ApprovalPending):
    """A 2026-07-28 call must come back with the client's answer: ``result`` is the
    ``input_required`` result to send."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("the client must answer an elicitation first")
        self.result = result


def elicitation(request: ApprovalRequest) -> dict[str, Any]:
    """The ``elicitation/create`` params asking to approve ``request``."""
    arguments = json.dumps(dict(request.arguments), ensure_ascii=False, default=str)
    return {
        "mode": "form",
        "message": (
            f"Approve this call? {request.reason}. Tool {request.tool_name!r} with arguments "
            f"{arguments}."
        ),
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Approve",
                    "description": f"Run {request.tool_name} with these arguments",
                }
            },
            "required": ["approve"],
        },
    }


def answer_of(result: Any) -> bool:
    """An elicitation result approves only when accepted with ``approve: true``."""
    if not isinstance(result, Mapping) or result.get("action") != "accept":
        return False
    content = result.get("content")
    return isinstance(content, Mapping) and content.get("approve") is True


def seal(key: bytes, request: ApprovalRequest, ttl: float) -> str:
    """An opaque ``requestState`` for ``request``, valid for ``ttl`` seconds."""
    body = json.dumps(
        {
            "id": request.id,
            "tool": request.tool_name,
            "args": digest_arguments(dict(request.arguments))[1],
            "exp": time.time() + ttl,
        },
        separators=(",", ":"),
    ).encode()
    mac = hmac.new(key, body, hashlib.sha256).digest()
    return _b64(body) + "." + _b64(mac)


def unseal(
    key: bytes, state: Any, tool_name: str, arguments: Mapping[str, Any]
) -> tuple[str, float] | None:
    """The approval id and expiry of ``state`` when this host sealed it for exactly this call
    and it is still valid, else None."""
    if not isinstance(state, str) or state.count(".") != 1:
        return None
    body_text, mac_text = state.split(".")
    try:
        body, mac = _unb64(body_text), _unb64(mac_text)
    except (ValueError, TypeError):
        return None
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()):
        return None  # checked first: only what this host sealed is ever parsed
    try:
        sealed = json.loads(body)
    except ValueError:
        return None
    valid = (
        isinstance(sealed, dict)
        and isinstance(sealed.get("id"), str)
        and sealed.get("tool") == tool_name
        and sealed.get("args") == digest_arguments(dict(arguments))[1]
        and isinstance(sealed.get("exp"), int | float)
        and sealed["exp"] > time.time()
    )
    return (sealed["id"], float(sealed["exp"])) if valid else None


class SpentApprovals:
    """The sealed approvals a host has used, until they expire: a ``requestState`` sent back
    twice would otherwise run its approved call twice (a deploy, say)."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}

    def spend(self, approval_id: str, expires: float) -> bool:
        """False when ``approval_id`` was spent already; else it is spent now."""
        now = time.time()
        if len(self._spent) > 1024:  # forget the expired ones now and then
            self._spent = {key: exp for key, exp in self._spent.items() if exp > now}
        if approval_id in self._spent:
            return False
        self._spent[approval_id] = expires
        return True


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
