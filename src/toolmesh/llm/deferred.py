"""Deferred loading in the providers' own shapes, built on ``toolmesh.llm.formats``.

A toolkit with deferred tools (``defer_loading``, or over its ``defer_above`` token budget)
sends a model its active tools in full and the deferred ones marked so the provider keeps them
out of the context until a tool search loads them:

* Anthropic Messages API: deferred tools carry ``"defer_loading": true`` and a server tool-search
  tool goes along (``variant="bm25"`` or ``"regex"``: ``tool_search_tool_bm25_20251119`` /
  ``tool_search_tool_regex_20251119``; send the beta header ``ANTHROPIC_BETA``). With
  ``variant="toolmesh"`` toolmesh's own ``tool_search`` tools are sent instead and their results
  become ``tool_reference`` blocks (``anthropic_tool_references``).
* OpenAI Responses API: a hosted ``{"type": "tool_search"}`` tool and deferred functions with
  ``"defer_loading": true``, optionally grouped into one namespace per source. Chat Completions
  has no tool search: ``api="chat"`` sends the active tools, toolmesh's ``tool_search`` among
  them when the toolkit has it.

``estimate_tokens`` is the estimate the toolkit's token budget uses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from toolmesh.llm.formats import to_anthropic, to_openai
from toolmesh.models import ToolDefinition, ToolResult
from toolmesh.schema import parameters_to_schema
from toolmesh.tools import Tool

if TYPE_CHECKING:
    from toolmesh.toolkit import Toolkit

__all__ = [
    "ANTHROPIC_BETA",
    "CHARS_PER_TOKEN",
    "anthropic_tool_references",
    "estimate_tokens",
    "to_anthropic_deferred",
    "to_openai_deferred",
]

ANTHROPIC_BETA = "advanced-tool-use-2025-11-20"
ANTHROPIC_SEARCH_TOOLS = {
    "bm25": {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
    "regex": {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
}
CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and JSON with a BPE tokenizer
PER_TOOL_TOKENS = 8  # the provider's framing of each tool (separators, field names)

AnthropicVariant = Literal["bm25", "regex", "toolmesh"]


def estimate_tokens(tool: Tool | ToolDefinition) -> int:
    """Tokens a tool's definition costs a model: the compact JSON of its name, description and
    argument schema, one token per ``CHARS_PER_TOKEN`` characters, plus ``PER_TOOL_TOKENS``."""
    if isinstance(tool, Tool):
        name, description, schema = tool.name, tool.description, tool.input_schema
    else:
        name, description = tool.name, tool.description
        schema = tool.input_schema or parameters_to_schema(tool.input_parameters)
    text = json.dumps(
        {"name": name, "description": description, "input_schema": schema},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return math.ceil(len(text) / CHARS_PER_TOKEN) + PER_TOOL_TOKENS


def _split(toolkit: Toolkit, *, drop_search_tools: bool) -> tuple[list[Tool], list[Tool]]:
    """The toolkit's tools as (active, deferred), in assembly order."""
    from toolmesh.sources.tool_search import SEARCH_TOOL_NAMES

    deferred_names = toolkit.deferred_names()
    active: list[Tool] = []
    deferred: list[Tool] = []
    for definition in toolkit.definitions(include_deferred=True):
        if drop_search_tools and definition.name in SEARCH_TOOL_NAMES:
            continue
        tool = toolkit[definition.name]
        (deferred if definition.name in deferred_names else active).append(tool)
    return active, deferred


def to_anthropic_deferred(
    toolkit: Toolkit, *, variant: AnthropicVariant = "bm25"
) -> list[dict[str, Any]]:
    """Anthropic tools: active ones in full, deferred ones with ``defer_loading``, plus the
    tool-search tool of ``variant`` (send the ``anthropic-beta: ANTHROPIC_BETA`` header)."""
    if variant not in ("bm25", "regex", "toolmesh"):
        raise ValueError(f"variant must be 'bm25', 'regex' or 'toolmesh', not {variant!r}")
    active, deferred = _split(toolkit, drop_search_tools=variant != "toolmesh")
    if variant == "toolmesh" and not any(t.name == "tool_search" for t in active):
        raise ValueError(
            "variant='toolmesh' needs the toolkit's tool_search tools (tool_search=True)"
        )
    tools = to_anthropic(active)
    tools += [{**entry, "defer_loading": True} for entry in to_anthropic(deferred)]
    if variant != "toolmesh" and deferred:
        tools.insert(0, dict(ANTHROPIC_SEARCH_TOOLS[variant]))
    return tools


def anthropic_tool_references(result: ToolResult) -> list[dict[str, Any]]:
    """The content of a ``tool_result`` block answering a toolmesh ``tool_search`` call: one
    ``tool_reference`` per tool found, which Anthropic expands into the deferred definitions."""
    names: Iterable[str] = result.metadata.get("tool_references", ())
    return [{"type": "tool_reference", "tool_name": name} for name in names]


def to_openai_deferred(
    toolkit: Toolkit,
    *,
    api: Literal["responses", "chat"] = "responses",
    namespaces: bool = False,
) -> list[dict[str, Any]]:
    """OpenAI tools with deferral: for the Responses API, a hosted ``tool_search`` tool and the
    deferred functions with ``defer_loading`` (grouped into one namespace per source with
    ``namespaces=True``); for Chat Completions, which has no tool search, the active tools."""
    if api == "chat":
        active, _ = _split(toolkit, drop_search_tools=False)
        return to_openai(active, api="chat")
    if api != "responses":
        raise ValueError(f"api must be 'responses' or 'chat', not {api!r}")
    active, deferred = _split(toolkit, drop_search_tools=True)
    tools = to_openai(active, api="responses")
    if not deferred:
        return tools
    tools.insert(0, {"type": "tool_search"})
    if not namespaces:
        tools += [{**f, "defer_loading": True} for f in to_openai(deferred, api="responses")]
        return tools
    groups: dict[str, list[Tool]] = {}
    for tool in deferred:
        source = toolkit.source_of(tool.name)
        groups.setdefault(source.name if source is not None else "tools", []).append(tool)
    for name, members in groups.items():
        tools.append(
            {
                "type": "namespace",
                "name": _namespace_name(name),
                "description": _namespace_description(name, members),
                "tools": [
                    {**f, "defer_loading": True} for f in to_openai(members, api="responses")
                ],
            }
        )
    return tools


def _namespace_name(source: str) -> str:
    from toolmesh.toolkit import sanitize_name

    return sanitize_name(source)


def _namespace_description(source: str, members: Sequence[Tool]) -> str:
    names = ", ".join(t.name for t in members[:12])
    more = f" and {len(members) - 12} more" if len(members) > 12 else ""
    return f"Tools of {source}: {names}{more}."
