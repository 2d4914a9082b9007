"""Tools in the shapes model providers accept in their requests.

``to_openai`` gives Chat Completions function tools (or Responses API tools with
``api="responses"``), ``to_anthropic`` the Messages API's tools, ``to_gemini`` a Gemini ``tools``
entry with function declarations. Each takes a Toolkit, Tools or ToolDefinitions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from toolmesh.models import ToolDefinition
from toolmesh.schema import parameters_to_schema
from toolmesh.tools import Tool

if TYPE_CHECKING:
    from toolmesh.toolkit import Toolkit

__all__ = ["to_anthropic", "to_gemini", "to_openai"]

JsonSchema = dict[str, Any]
ToolsLike = "Toolkit | Iterable[Tool | ToolDefinition]"


def _entries(tools: Toolkit | Iterable[Tool | ToolDefinition]) -> list[tuple[str, str, JsonSchema]]:
    items = tools.tools if hasattr(tools, "tools") else tools
    out: list[tuple[str, str, JsonSchema]] = []
    for item in items:
        if isinstance(item, Tool):
            out.append((item.name, item.description, item.input_schema))
        else:
            schema = item.input_schema or parameters_to_schema(item.input_parameters)
            out.append((item.name, item.description, schema))
    return out


def to_openai(
    tools: Toolkit | Iterable[Tool | ToolDefinition],
    *,
    api: Literal["chat", "responses"] = "chat",
) -> list[dict[str, Any]]:
    """OpenAI function tools (Chat Completions by default, or the Responses API)."""
    if api == "responses":
        return [
            {"type": "function", "name": name, "description": text, "parameters": schema}
            for name, text, schema in _entries(tools)
        ]
    return [
        {"type": "function", "function": {"name": name, "description": text, "parameters": schema}}
        for name, text, schema in _entries(tools)
    ]


def to_anthropic(tools: Toolkit | Iterable[Tool | ToolDefinition]) -> list[dict[str, Any]]:
    """Anthropic Messages API tools."""
    return [
        {"name": name, "description": text, "input_schema": schema}
        for name, text, schema in _entries(tools)
    ]


def to_gemini(tools: Toolkit | Iterable[Tool | ToolDefinition]) -> list[dict[str, Any]]:
    """A Gemini ``tools`` list with one entry of function declarations."""
    declarations = [
        {"name": name, "description": text, "parameters": schema}
        for name, text, schema in _entries(tools)
    ]
    return [{"function_declarations": declarations}]
