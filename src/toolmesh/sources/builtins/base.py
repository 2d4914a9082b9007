"""What every built-in tool shares: how its definition is made, and how a refusal answers."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from toolmesh.models import ToolDefinition, ToolErrorCode, ToolResult
from toolmesh.tools import Tool, ToolContext, ToolFunction

__all__ = ["Refused", "denied", "make_tool", "schema"]


class Refused(ValueError):
    """A call the built-in's safety rules refuse (a path outside the workspace, a command the
    allow-list does not admit, a private address, ...). It answers ``tool_denied``."""


def denied(tool_name: str, reason: str) -> ToolResult:
    return ToolResult.failure(
        tool_name, ToolErrorCode.TOOL_DENIED, reason, {"rule": f"builtin:{tool_name}"}
    )


def schema(required: Sequence[str] = (), **properties: dict[str, Any]) -> dict[str, Any]:
    """A closed JSON Schema object with these properties."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def make_tool(
    name: str,
    description: str,
    input_schema: dict[str, Any],
    fn: ToolFunction,
    *,
    capabilities: Sequence[str],
    idempotent: bool = False,
) -> Tool:
    """A built-in tool; a ``Refused`` raised by ``fn`` becomes a ``tool_denied`` result."""

    @functools.wraps(fn)
    async def guarded(args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            return await fn(args, ctx)
        except Refused as exc:
            return denied(name, str(exc))

    definition = ToolDefinition(
        name=name,
        description=description,
        capabilities=list(capabilities),
        idempotent=idempotent,
        tags=["builtin"],
    )
    return Tool(definition, guarded, source="builtin", input_schema=input_schema)
