"""Every exception toolmesh raises, in one tree.

A tool that fails is not an exception: it is a ``ToolResult`` with ``success=False`` and an
``error_code``. Exceptions are for the caller's own mistakes and for protocol failures::

    ToolmeshError
    ├── ConfigError            a bad setting, manifest entry or source definition (with location)
    │   └── NameConflictError  two tools want one name and the toolkit was told to refuse that
    ├── SchemaError            a schema toolmesh cannot convert or compile
    ├── ArgumentError          arguments that do not match a tool's schema (with the JSON path)
    ├── CapabilityError        a session asked for capabilities its host's policy does not allow
    ├── StateError             a state update that cannot be applied (bad path, failed test)
    ├── AuditError             the audit sink could not record an entry
    ├── ToolCallFailed         raised by ``ToolResult.raise_for_error()``
    ├── ToolCallParseError     a model's tool call that cannot be read back (bad name, not JSON)
    └── ProtocolError          a malformed, unexpected or refused A2E message (has a ``code``)
        ├── TransportError     the peer cannot be reached or went away
        ├── HandshakeError     the host refused the handshake (``reason``)
        ├── RemoteError        the host answered with an ``error`` message
        ├── CallTimeout        no answer arrived within the call's deadline plus grace
        └── ProviderError      a model provider (LLM API) refused or failed a request
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolmesh.models import ToolResult

__all__ = [
    "ArgumentError",
    "AuditError",
    "CallTimeout",
    "CapabilityError",
    "ConfigError",
    "HandshakeError",
    "NameConflictError",
    "ProtocolError",
    "ProviderError",
    "RemoteError",
    "SchemaError",
    "StateError",
    "ToolCallFailed",
    "ToolCallParseError",
    "ToolNameConflict",
    "ToolmeshError",
    "TransportError",
    "excerpt",
]

EXCERPT_CHARS = 200


class ToolmeshError(Exception):
    """The root of every exception toolmesh raises."""


class ConfigError(ToolmeshError):
    """A setting, manifest entry or source definition is wrong; ``location`` says where."""

    def __init__(self, message: str, *, location: str | None = None) -> None:
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)


class NameConflictError(ConfigError):
    """Two tools claim the same name and the toolkit was created with ``on_conflict="error"``."""


class SchemaError(ToolmeshError):
    """A JSON Schema or parameter list that toolmesh cannot convert or compile."""


class ArgumentError(ToolmeshError):
    """Arguments that do not match the tool's input schema.

    ``path`` locates the bad value in JSON-path form (``$.user.age``).
    """

    def __init__(self, message: str, *, path: str = "$") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"invalid argument at {path}: {message}")


class CapabilityError(ToolmeshError):
    """A session asked to change its capabilities and its host's policy does not allow it."""


class StateError(ToolmeshError):
    """A state update (RFC 6902 JSON Patch) could not be applied; the state is unchanged."""


class AuditError(ToolmeshError):
    """The audit sink could not record an entry."""


class ToolCallFailed(ToolmeshError):
    """Raised by ``ToolResult.raise_for_error()`` for an unsuccessful result."""

    def __init__(self, result: ToolResult) -> None:
        self.result = result
        super().__init__(f"{result.tool_name} failed [{result.error_code}]: {result.error}")


class ToolCallParseError(ToolmeshError):
    """A model's tool call (OpenAI, Anthropic, Gemini shape) that cannot become a toolkit call:
    an illegal or unknown tool name, arguments that are not a JSON object, an unknown shape."""


class ProtocolError(ToolmeshError):
    """A message that is malformed, unexpected or refused; ``code`` is the A2E error code."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        detail: dict[str, Any] | None = None,
        retryable: bool = False,
        capability_name: str = "",
    ) -> None:
        self.code = code
        self.message = message
        self.detail = detail or {}
        self.retryable = retryable
        self.capability_name = capability_name
        super().__init__(f"[{code}] {message}")


class TransportError(ProtocolError):
    """The peer cannot be reached, or the connection to it broke."""

    def __init__(self, message: str) -> None:
        super().__init__("transport_error", message, retryable=True)


class HandshakeError(ProtocolError):
    """The host refused the handshake; ``reason`` is its explanation."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__("handshake_refused", reason)


class RemoteError(ProtocolError):
    """The host answered a request with an A2E ``error`` message."""


class CallTimeout(ProtocolError):
    """No response arrived within the call's deadline plus the client's grace period."""

    def __init__(self, message: str) -> None:
        super().__init__("timeout", message, retryable=True)


class ProviderError(ProtocolError):
    """A model provider's API refused or failed a request, after any retries; ``status`` is the
    HTTP status (0 when no answer arrived) and ``body`` the start of its answer."""

    def __init__(self, message: str, *, status: int = 0, body: str = "") -> None:
        self.status = status
        self.body = body
        super().__init__(
            "provider_error", message, retryable=status == 0 or status == 429 or status >= 500
        )


class ToolNameConflict(UserWarning):
    """Two tools wanted one name; the first kept it (a warning: see ``NameConflictError`` for
    the refusal ``on_conflict="error"`` makes of it)."""


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The start of a peer's answer for an error message: one line (an HTML error page would
    otherwise fill the terminal), whitespace runs squashed, at most ``limit`` characters."""
    squashed = " ".join(text[: limit * 8].split())  # only the start: a body may be megabytes
    return squashed if len(squashed) <= limit else squashed[: limit - 3] + "..."
