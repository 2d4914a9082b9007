"""The A2E wire protocol: messages, their envelope and NDJSON framing.

Every message carries the envelope ``type``, ``id`` (auto UUID), ``version`` ("1.0") and ``ts``
(auto); responses echo the request's id as ``req_id``. One message is one JSON object on one
line. ``decode`` turns a line into a typed message or raises ``ProtocolError`` with a precise
code from ``ErrorCode``; the connection that read the line answers with an ``error`` message and
keeps serving.
"""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate each
# field's annotation from its string, a quarter of creating a model class (3 ms of start-up).

import enum
import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer
from pydantic_core import from_json

from toolmesh import strictjson
from toolmesh.errors import ProtocolError
from toolmesh.models import (
    A2E_VERSION,
    Envelope,
    ToolDefinition,
    ToolEvent,
    ToolResult,
    _is_empty,
    _is_none,
    _new_list,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MESSAGE_TYPES",
    "ApprovalResponse",
    "CapabilityOverride",
    "ErrorCode",
    "ErrorMessage",
    "HandshakeRequest",
    "HandshakeResponse",
    "Message",
    "NegotiatedCapability",
    "Ping",
    "Pong",
    "Shutdown",
    "StateRequest",
    "StateResponse",
    "ToolCallRequest",
    "ToolCallResponse",
    "ToolEvent",
    "ToolListRequest",
    "ToolListResponse",
    "decode",
    "encode",
    "request_id_of",
]

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class ErrorCode(enum.StrEnum):
    """Codes of A2E ``error`` messages: protocol failures, never tool failures."""

    PARSE_ERROR = "parse_error"  # not JSON
    INVALID_MESSAGE = "invalid_message"  # JSON, but a field is missing or of the wrong type
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type"
    MESSAGE_TOO_LARGE = "message_too_large"
    VERSION_MISMATCH = "version_mismatch"
    HANDSHAKE_REQUIRED = "handshake_required"
    SESSION_MISMATCH = "session_mismatch"
    CAPABILITY_NOT_NEGOTIATED = "capability_not_negotiated"
    MAX_PARALLEL_EXCEEDED = "max_parallel_exceeded"
    DUPLICATE_REQUEST = "duplicate_request"
    UNAUTHORIZED = "unauthorized"
    SHUTTING_DOWN = "shutting_down"
    RUNTIME_ERROR = "runtime_error"


# -- handshake and lifecycle ----------------------------------------------------------------------


class CapabilityOverride(BaseModel):
    """How a session asks to adjust the host's capability tags (seed 003's per-session policy)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    strategy: Literal["inherit", "extend", "replace"] = "inherit"
    capabilities: list[str] = Field(default_factory=_new_list)


class HandshakeRequest(Envelope):
    """Agent -> host, once per session before any other message.

    ``session_id`` (extension) resumes an earlier session and its state document.
    """

    type: Literal["handshake/req"] = "handshake/req"
    agent_id: str = ""
    agent_caps: list[str] = Field(default_factory=_new_list)
    auth_token: str = ""
    capability_override: CapabilityOverride | None = Field(default=None, exclude_if=_is_none)
    session_id: str = Field(default="", exclude_if=_is_empty)


class NegotiatedCapability(BaseModel):
    """One A2E capability the host accepted for the session (``tools`` here)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    capability: str
    enabled: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)


class HandshakeResponse(Envelope):
    """Host -> agent: the session id, what was negotiated, and the session's limits."""

    type: Literal["handshake/resp"] = "handshake/resp"
    req_id: str = ""
    session_id: str = ""
    accepted_caps: list[NegotiatedCapability] = Field(default_factory=_new_list)
    max_parallel: int = 4
    ok: bool = True
    reason: str = ""


class Ping(Envelope):
    type: Literal["ping"] = "ping"


class Pong(Envelope):
    type: Literal["pong"] = "pong"
    req_id: str = ""
    uptime_seconds: float = 0.0


class Shutdown(Envelope):
    """Agent -> host: end the session after draining in-flight calls (up to ``timeout`` s)."""

    type: Literal["shutdown"] = "shutdown"
    timeout: int = 10


class ErrorMessage(Envelope):
    """Either side -> the other: a protocol failure, echoing the offending message's id."""

    type: Literal["error"] = "error"
    req_id: str = ""
    code: str
    message: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)
    retryable: bool = False
    capability_name: str = ""

    @classmethod
    def from_exception(cls, exc: ProtocolError, req_id: str = "") -> "ErrorMessage":
        return cls(
            req_id=req_id,
            code=exc.code,
            message=exc.message,
            detail=exc.detail,
            retryable=exc.retryable,
            capability_name=exc.capability_name,
        )

    def to_exception(self) -> ProtocolError:
        from toolmesh.errors import RemoteError

        return RemoteError(
            self.code,
            self.message,
            detail=self.detail,
            retryable=self.retryable,
            capability_name=self.capability_name,
        )


# -- tool/* (seed 000) ----------------------------------------------------------------------------


class ToolListRequest(Envelope):
    """Agent -> host: list the active tools (empty ``query``) or search them all."""

    type: Literal["tool/list/req"] = "tool/list/req"
    filter_kind: str = ""
    filter_tags: list[str] = Field(default_factory=_new_list)
    query: str = Field(default="", exclude_if=_is_empty)
    include_deferred: bool = Field(default=False, exclude_if=_is_empty)


class ToolListResponse(Envelope):
    type: Literal["tool/list/resp"] = "tool/list/resp"
    req_id: str = ""
    tools: list[ToolDefinition] = Field(default_factory=_new_list)


class ToolCallRequest(Envelope):
    """Agent -> host: run one tool. ``timeout`` is the call's wall-clock limit in seconds."""

    type: Literal["tool/call/req"] = "tool/call/req"
    session_id: str = ""
    tool_name: str
    arguments: dict[str, Any]
    correlation_id: str = ""
    streaming: bool = False
    timeout: float = 30.0

    @field_serializer("timeout")
    def _whole_seconds_as_int(self, value: float) -> float | int:
        # The seed types timeout as int; keep whole seconds looking like one on the wire.
        return int(value) if float(value).is_integer() else value


class ToolCallResponse(Envelope):
    type: Literal["tool/call/resp"] = "tool/call/resp"
    req_id: str = ""
    data: ToolResult
    created_at: float = Field(default_factory=time.time)


class ApprovalResponse(Envelope):
    """Agent -> host: the answer to an ``approval`` event (``req_id`` is its ``approval_id``)."""

    type: Literal["tool/approval/resp"] = "tool/approval/resp"
    req_id: str
    approved: bool
    reason: str = ""
    failed: bool = False
    """The agent could not decide (its handler raised, say): a denial audited as
    ``approval:failed``, with ``reason`` saying why, rather than someone's "no"."""


class StateRequest(Envelope):
    """Agent -> host: send the session's state document."""

    type: Literal["state/get/req"] = "state/get/req"


class StateResponse(Envelope):
    type: Literal["state/get/resp"] = "state/get/resp"
    req_id: str = ""
    state: dict[str, Any] = Field(default_factory=dict)
    state_version: int = 0  # bumped by every applied update (`version` is the protocol's)


Message = Annotated[
    HandshakeRequest
    | HandshakeResponse
    | Ping
    | Pong
    | Shutdown
    | ErrorMessage
    | ToolListRequest
    | ToolListResponse
    | ToolCallRequest
    | ToolCallResponse
    | ToolEvent
    | ApprovalResponse
    | StateRequest
    | StateResponse,
    Field(discriminator="type"),
]
"""Any A2E message toolmesh speaks."""

MESSAGE_TYPES: dict[str, type[Envelope]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        HandshakeRequest,
        HandshakeResponse,
        Ping,
        Pong,
        Shutdown,
        ErrorMessage,
        ToolListRequest,
        ToolListResponse,
        ToolCallRequest,
        ToolCallResponse,
        ToolEvent,
        ApprovalResponse,
        StateRequest,
        StateResponse,
    )
}
"""Message classes by their ``type``. Each builds its validator on first use, so a host starting
up pays only for the messages it meets."""


def encode(message: BaseModel) -> bytes:
    """One message as one NDJSON line (newline included)."""
    if isinstance(message, ToolListResponse) and message.tools:
        return _encode_listing(message)
    return message.__pydantic_serializer__.to_json(message) + b"\n"


# Each definition's JSON, kept while the definition object lives in a listing: a large catalogue
# is listed again and again, and the toolkit never changes a definition in place (it replaces it).
_DEFINITION_JSON: dict[int, tuple[ToolDefinition, bytes]] = {}
_DEFINITION_JSON_LIMIT = 50_000


def _encode_listing(message: ToolListResponse) -> bytes:
    empty = message.model_copy(update={"tools": []})
    head = empty.__pydantic_serializer__.to_json(empty)
    cut = head.rindex(b'"tools":[]') + len(b'"tools":[')
    parts = []
    for definition in message.tools:
        cached = _DEFINITION_JSON.get(id(definition))
        if cached is None or cached[0] is not definition:
            if len(_DEFINITION_JSON) >= _DEFINITION_JSON_LIMIT:
                _DEFINITION_JSON.clear()
            cached = (definition, definition.__pydantic_serializer__.to_json(definition))
            _DEFINITION_JSON[id(definition)] = cached
        parts.append(cached[1])
    return head[:cut] + b",".join(parts) + head[cut:] + b"\n"


_MAJOR = A2E_VERSION.partition(".")[0]  # 1.x messages are read; other majors refused


def decode(line: bytes | str, *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """Parse one line into a typed message; raise ``ProtocolError`` saying exactly what is wrong."""
    if len(line) > max_bytes:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {len(line)} bytes exceeds the limit of {max_bytes} bytes",
            detail={"size": len(line), "limit": max_bytes},
        )
    try:
        # pydantic-core's parser (Rust): several times json.loads's speed; NaN and Infinity,
        # which are not JSON, are refused. (A number too large for a float, 1e999, is read as
        # infinity: what matters is the arguments, which the pipeline refuses as unfit then.
        # strictjson's check for it would cost every message a scan.)
        raw = from_json(line, allow_inf_nan=False)
    except ValueError as exc:
        reason = str(exc)
        if "surrogate" in reason or "end of hex escape" in reason:  # the parser's words for it
            reason += " (a \\u escape of half a surrogate pair, which is not valid Unicode)"
        raise ProtocolError(ErrorCode.PARSE_ERROR, f"not valid JSON: {reason}") from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "a message must be a JSON object")
    kind = raw.get("type")
    if kind is None:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "message has no 'type' field")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"unknown message type {kind!r}",
            detail={"type": str(kind)},
        )
    version = raw.get("version")
    if isinstance(version, str) and version.partition(".")[0] != _MAJOR:
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH,
            f"message version {version!r} is not spoken here; this host speaks A2E {A2E_VERSION}",
            detail={"version": version, "supported": A2E_VERSION},
        )
    try:
        return cls.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise _invalid(exc, str(kind)) from None


def request_id_of(line: bytes | str, *, partial: bool = False) -> str:
    """The ``id`` of a message that failed to decode, when it can still be read; ``partial``:
    ``line`` is only the start of a message (one too large to read whole)."""
    try:
        raw = strictjson.loads(line) if not partial else from_json(line, allow_partial=True)
    except ValueError:
        if partial:
            return ""
        # Python's own reader takes what the strict one refuses but a sender may still write
        # (json.dumps gives a lone surrogate as "\ud800", NaN as NaN): the error then reaches the
        # request waiting for it, instead of none.
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError):
            return ""
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        return str(raw["id"])  # a cut-off id is left out by the partial parse, never guessed
    return ""


def _invalid(exc: ValidationError, kind: str) -> ProtocolError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = ".".join(str(part) for part in first["loc"]) or "message"
    reason = "is required" if first["type"] == "missing" else first["msg"].lower()
    return ProtocolError(
        ErrorCode.INVALID_MESSAGE,
        f"field {field!r} {reason}",
        detail={
            "type": kind,
            "errors": [
                {"field": ".".join(str(p) for p in e["loc"]), "error": e["msg"]} for e in errors
            ],
        },
    )
