"""The A2E tools data models of seed 000, exactly as the seed tabulates them.

Every model keeps the seed's field names, types and defaults. toolmesh's additions are marked
*extension* and are left out of the wire form while they hold their default, so a message built
from seed fields alone serializes to exactly the seed's wire examples.

``Envelope`` is the part every A2E message shares (``type``, ``id``, ``version``, ``ts``). It lives
here because ``ToolEvent`` is both a data model (collected in ``ToolResult.events``) and a message.
"""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate each
# field's annotation from its string, a quarter of creating a model class (3 ms of start-up).

import enum
import itertools
import json
import os
import random
import threading
import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

__all__ = [
    "A2E_VERSION",
    "EVENT_KINDS",
    "Envelope",
    "ToolDefinition",
    "ToolErrorCode",
    "ToolEvent",
    "ToolParameter",
    "ToolResult",
    "check_event_data",
    "derive_output",
    "new_id",
    "secret_id",
]

A2E_VERSION = "1.0"


_LOCAL_PREFIX = os.urandom(6).hex()
_local_counter = itertools.count(1)


def local_id() -> str:
    """A process-unique id for things that never cross the wire (in-process calls): a random
    prefix per process and a counter, cheaper than a UUID on the hot path."""
    return f"{_LOCAL_PREFIX}{next(_local_counter):08x}"


# Message ids must be unique, not secret: they come from a generator seeded by the OS (and
# seeded again in a forked child), which costs no system call per message as os.urandom does.
_message_ids = random.Random(os.urandom(32))  # noqa: S311 - uniqueness, not secrecy
os.register_at_fork(after_in_child=lambda: _message_ids.seed(os.urandom(32)))
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def new_id() -> str:
    """A fresh message id: a UUID4 as 32 hex digits, the A2E SDK's own form. Unique, not
    unguessable: ids that grant access (sessions, tasks) come from ``secret_id``."""
    return f"{(_message_ids.getrandbits(128) & _UUID4_CLEAR) | _UUID4_SET:032x}"


class _SecretBytes:
    """The OS's cryptographic random bytes, read 4 KiB at a time (one system call per 256 ids
    instead of one each); a forked child forgets what its parent read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer = b""
        self._at = 0

    def take(self, size: int) -> bytes:
        with self._lock:
            if self._at + size > len(self._buffer):
                self._buffer, self._at = os.urandom(4096), 0
            start = self._at
            self._at += size
            return self._buffer[start : self._at]

    def forget(self) -> None:
        self._buffer, self._at = b"", 0


_secret_bytes = _SecretBytes()
os.register_at_fork(after_in_child=_secret_bytes.forget)


def secret_id() -> str:
    """An id that grants access to what it names (a session, a task): a UUID4 from the OS's
    cryptographic random source, as 32 hex digits."""
    raw = bytearray(_secret_bytes.take(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


def _is_none(value: object) -> bool:
    return value is None


def _is_empty(value: object) -> bool:
    return not value


def _new_list() -> list[Any]:
    """A fresh ``[]``: the default factory of list fields. pydantic reads a factory's signature,
    and the builtin ``list``'s is parsed from its text form by the tokenizer, whose first use
    costs start-up a large regular expression (5-10 ms of ``toolmesh serve``'s cold start)."""
    return []


class ToolErrorCode(enum.StrEnum):
    """Machine-readable reasons a call did not succeed (``ToolResult.error_code``).

    The first three are seed 000's. The others are toolmesh extensions for outcomes the seed's
    security section asks to enforce (validation, deadline) and a caller's cancellation.
    """

    UNKNOWN_TOOL = "unknown_tool"
    TOOL_DENIED = "tool_denied"
    TOOL_ERROR = "tool_error"
    INVALID_ARGUMENTS = "invalid_arguments"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INVALID_STATE_UPDATE = "invalid_state_update"

    @property
    def retryable(self) -> bool:
        """Whether the same call may succeed if simply tried again."""
        return self in _RETRYABLE


_RETRYABLE = frozenset({ToolErrorCode.TOOL_ERROR, ToolErrorCode.TIMEOUT})


class ToolParameter(BaseModel):
    """One input or output parameter (seed 000), recursive through ``properties`` and ``items``.

    ``type`` is a JSON Schema type name: string, integer, number, boolean, object, array (or null).
    ``enum`` holds the allowed values as strings, as the seed types it; the JSON Schema view gives
    them back their parameter's type. ``items`` (extension) is the element of an ``array``.
    """

    model_config = ConfigDict(extra="ignore", defer_build=True)

    name: str
    type: str
    description: str
    required: bool = False
    enum: list[str] | None = Field(default=None, exclude_if=_is_none)
    properties: "dict[str, ToolParameter] | None" = Field(default=None, exclude_if=_is_none)
    items: "ToolParameter | None" = Field(default=None, exclude_if=_is_none)


class ToolDefinition(BaseModel):
    """The A2E manifest of one tool (seed 000).

    Extensions, sent only when set: ``capabilities`` (tags a caller must hold, seed 003),
    ``kind`` (python, javascript, bash, mcp, a2a, ...: what ``filter_kind`` matches),
    ``input_schema`` / ``output_schema`` (the exact JSON Schema, present only when the parameter
    lists cannot say all of it), ``annotations`` (behaviour hints such as MCP's readOnlyHint) and
    ``requires_approval``.
    """

    model_config = ConfigDict(extra="ignore", defer_build=True)

    name: str
    description: str
    input_parameters: list[ToolParameter] = Field(default_factory=_new_list)
    output_parameters: list[ToolParameter] = Field(default_factory=_new_list)
    streaming: bool = True
    idempotent: bool = False
    tags: list[str] = Field(default_factory=_new_list)
    version: str = "1.0.0"
    toolkit: str | None = None
    defer_loading: bool = Field(default=False, exclude_if=_is_empty)
    capabilities: list[str] = Field(default_factory=_new_list, exclude_if=_is_empty)
    kind: str | None = Field(default=None, exclude_if=_is_none)
    input_schema: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)
    output_schema: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)
    annotations: dict[str, Any] | None = Field(default=None, exclude_if=_is_none)
    requires_approval: bool = Field(default=False, exclude_if=_is_empty)


class Envelope(BaseModel):
    """The fields every A2E message carries."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    type: str
    id: str = Field(default_factory=new_id)
    version: str = A2E_VERSION
    ts: float = Field(default_factory=time.time)


EVENT_KINDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "progress": {"pct": int, "message": str},
    "status": {"message": str},
    "artifact": {"name": str, "mime": str, "chunk": str, "final": bool},
    "log": {"level": str, "message": str},
}
"""The seed's event kinds and the fields (and types) of their ``data``. Other kinds (``state``,
``activity``, ``approval``) are toolmesh extensions with free-form data."""


class ToolEvent(Envelope):
    """A streaming event during one call (seed 000): ``seq`` counts 0, 1, 2, ... per call."""

    type: Literal["tool/event"] = "tool/event"
    kind: str
    req_id: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    seq: int = 0


class ToolResult(BaseModel):
    """The outcome of one call (seed 000), one type for every source and transport.

    Extensions: ``output`` is the text a model sees: the source's own text when it gave one
    (stored as ``output_text``, sent on the wire as ``output``), else derived from ``data`` or
    ``error`` when read. ``is_error`` mirrors ``success``, ``metadata`` carries source details
    (an A2A task id, HTTP status, ...) and ``state_update`` is an RFC 6902 patch for the
    session's state document (seed 003).
    """

    model_config = ConfigDict(
        extra="ignore",
        defer_build=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    success: bool
    tool_name: str
    data: Any = Field(default=None, exclude_if=_is_none)
    summary: Any = Field(default=None, exclude_if=_is_none)
    truncated: bool = Field(default=False, exclude_if=_is_empty)
    exit_code: int | None = Field(default=None, exclude_if=_is_none)
    error: str | None = Field(default=None, exclude_if=_is_none)
    error_code: str | None = Field(default=None, exclude_if=_is_none)
    duration_ms: int
    events: list[ToolEvent] = Field(default_factory=_new_list, exclude_if=_is_empty)
    output_text: str | None = Field(default=None, alias="output", exclude_if=_is_none)
    metadata: dict[str, Any] = Field(default_factory=dict, exclude_if=_is_empty)
    state_update: list[dict[str, Any]] | None = Field(default=None, exclude_if=_is_none)

    @property
    def output(self) -> str:
        """The text a model sees."""
        if self.output_text is not None:
            return self.output_text
        return derive_output(self.data, self.error)

    @output.setter
    def output(self, text: str) -> None:
        self.output_text = text

    @property
    def is_error(self) -> bool:
        return not self.success

    @classmethod
    def failure(
        cls, tool_name: str, code: str, message: str, metadata: dict[str, Any] | None = None
    ) -> "ToolResult":
        """The result of a call that failed with ``code`` (its ``duration_ms`` is the
        pipeline's to set)."""
        return cls(
            success=False,
            tool_name=tool_name,
            error=message,
            error_code=code,
            metadata=metadata or {},
            duration_ms=0,
        )

    def raise_for_error(self) -> "ToolResult":
        """Return self, or raise ``ToolCallFailed`` when the call did not succeed."""
        if not self.success:
            from toolmesh.errors import ToolCallFailed

            raise ToolCallFailed(self)
        return self


def check_event_data(kind: str, data: dict[str, Any]) -> None:
    """Raise ValueError when ``data`` does not have the seed's shape for ``kind``."""
    shape = EVENT_KINDS.get(kind)
    if shape is None:
        return
    for field, expected in shape.items():
        if field not in data:
            raise ValueError(f"{kind} event data needs {field!r}")
        value = data[field]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ValueError(f"{kind} event field {field!r} must be {_type_name(expected)}")


def _type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


def derive_output(data: Any, error: str | None) -> str:
    """The text a model sees for a result that did not give its own."""
    if error is not None:
        return error
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return json.dumps(data, ensure_ascii=False, default=str)
