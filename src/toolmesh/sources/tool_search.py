"""Tools a model calls to find tools it was not shown: ``tool_search``, ``tool_search_regex``.

With many tools, most are deferred (``defer_loading``, or the toolkit's token budget): the model
sees only these two and the most important tools, and loads the rest on demand, the way
Anthropic's tool-search tools work, but with toolmesh's own ranking and for any provider.

* ``tool_search(query, limit)``: natural language, ranked by the toolkit's search (lexical or
  hybrid).
* ``tool_search_regex(pattern, limit)``: a Python regular expression (``re.search`` syntax,
  case insensitive, one second at most for the whole catalogue) over each tool's name,
  description and parameter names and descriptions.

Both return the matching definitions to load (name, description, JSON Schema of the arguments),
only of tools the calling session may call, and never themselves. The call's result also names
the tools in ``metadata["tool_references"]``, which an agent loop turns into the provider's own
shape (Anthropic ``tool_reference`` blocks: ``toolmesh.llm.deferred.anthropic_tool_references``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import regex

from toolmesh.models import ToolDefinition, ToolParameter
from toolmesh.sources.base import Source
from toolmesh.tools import Output, Tool, ToolContext

if TYPE_CHECKING:
    from toolmesh.toolkit import Toolkit

__all__ = ["SEARCH_TOOL_NAMES", "ToolSearchSource"]

SEARCH_TOOL_NAMES = ("tool_search", "tool_search_regex")
_SOURCE = "tool_search"  # the tools' ``source``: how a toolkit's search knows to leave them out
MAX_PATTERN = 200  # characters of a regex, as Anthropic's regex tool search allows
MAX_LIMIT = 20
REGEX_SECONDS = 1.0  # for the whole catalogue: a slower pattern is pathological (ReDoS)

_LIMIT = ToolParameter(
    name="limit",
    type="integer",
    description=f"How many tools to return at most (1 to {MAX_LIMIT}, default 5).",
)


class ToolSearchSource(Source):
    """The two tool-search tools over ``toolkit`` (added by ``Toolkit(tool_search=True)``)."""

    name = "tool_search"

    def __init__(self, toolkit: Toolkit, *, default_limit: int = 5) -> None:
        self.toolkit = toolkit
        self.default_limit = default_limit
        self._tools = [
            Tool(
                ToolDefinition(
                    name="tool_search",
                    description=(
                        "Find tools by describing the task in natural language. Returns the "
                        "definitions of the best matching tools, which you may call next."
                    ),
                    input_parameters=[
                        ToolParameter(
                            name="query",
                            type="string",
                            description="What you need a tool for, e.g. 'create a GitHub issue'.",
                            required=True,
                        ),
                        _LIMIT,
                    ],
                    tags=["tool-search"],
                    idempotent=True,
                    streaming=False,
                ),
                self._search,
                source=_SOURCE,
                input_schema=_schema("query", {"type": "string", "pattern": r"\S"}),  # not blank
            ),
            Tool(
                ToolDefinition(
                    name="tool_search_regex",
                    description=(
                        "Find tools with a Python regular expression (re.search, case "
                        "insensitive) matched against tool names, descriptions and parameter "
                        "names and descriptions, e.g. 'github.*issue' or '^slack_'. Returns the "
                        "definitions of the matching tools."
                    ),
                    input_parameters=[
                        ToolParameter(
                            name="pattern",
                            type="string",
                            description=f"The expression, {MAX_PATTERN} characters at most.",
                            required=True,
                        ),
                        _LIMIT,
                    ],
                    tags=["tool-search"],
                    idempotent=True,
                    streaming=False,
                ),
                self._search_regex,
                source=_SOURCE,
                input_schema=_schema(
                    "pattern", {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN}
                ),
            ),
        ]

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def _search(self, arguments: dict[str, Any], ctx: ToolContext) -> Output:
        query = str(arguments["query"]).strip()
        if not query:
            raise ValueError("query is empty: describe the task a tool should do")
        limit = self._limit(arguments)
        # The toolkit's search never finds the search tools themselves (Toolkit._searchable).
        found = self.toolkit.search(
            query, capabilities=ctx.capabilities, include_deferred=True, limit=limit
        )
        return self._result(found)

    async def _search_regex(self, arguments: dict[str, Any], ctx: ToolContext) -> Output:
        pattern = str(arguments["pattern"])
        if len(pattern) > MAX_PATTERN:
            raise ValueError(f"pattern is longer than {MAX_PATTERN} characters")
        try:
            compiled = regex.compile(pattern, regex.IGNORECASE)
        except regex.error as exc:
            raise ValueError(f"pattern is not a valid regular expression: {exc}") from None
        limit = self._limit(arguments)
        held = ctx.capabilities or self.toolkit.capabilities
        tools = [
            t for t in self.toolkit.tools if t.source != _SOURCE and held.allows(t.capabilities)
        ]
        # Off the event loop (and without the GIL while matching): a slow pattern takes up to
        # REGEX_SECONDS of its own call, not of every session on the host.
        matches = await asyncio.to_thread(_regex_matches, compiled, tools, limit)
        return self._result(matches)

    def _limit(self, arguments: dict[str, Any]) -> int:
        limit = arguments.get("limit", self.default_limit)
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)  # 2.0 passed the schema: JSON Schema counts it as an integer
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}")
        return limit

    def _result(self, tools: Iterable[Tool]) -> Output:
        definitions: list[dict[str, Any]] = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in tools
        ]
        names = [d["name"] for d in definitions]
        text = (
            "Tools found: " + ", ".join(names) + ". Their definitions follow; call them as needed."
            if names
            else "No tool matches; try other words."
        )
        return Output(
            value={"tools": definitions},
            metadata={"tool_references": names},
            text=text + ("\n" + _json(definitions) if definitions else ""),
        )


def _regex_matches(compiled: Any, tools: list[Tool], limit: int) -> list[Tool]:
    matches: list[Tool] = []
    deadline = time.monotonic() + REGEX_SECONDS
    for tool in tools:
        try:
            text = _searchable_text(tool.definition)
            left = max(deadline - time.monotonic(), 0.001)
            found = compiled.search(text, timeout=left, concurrent=True)
        except TimeoutError:
            raise ValueError(
                f"the pattern took longer than {REGEX_SECONDS:g}s; simplify it"
            ) from None
        if found:
            matches.append(tool)
            if len(matches) >= limit:
                break
    return matches


def _schema(name: str, text: dict[str, Any]) -> dict[str, Any]:
    """A search tool's input schema: its text argument and ``limit``, with their bounds (so a
    bad value is ``invalid_arguments``, which is not worth retrying)."""
    described = {
        "query": "What you need a tool for, e.g. 'create a GitHub issue'.",
        "pattern": f"The expression, {MAX_PATTERN} characters at most.",
    }
    return {
        "type": "object",
        "properties": {
            name: {**text, "description": described[name]},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "description": _LIMIT.description,
            },
        },
        "required": [name],
    }


def _searchable_text(definition: ToolDefinition) -> str:
    """Name, description, and the names and descriptions of the parameters, nested ones
    included (an object's properties, an array's element: not its name, always "items")."""
    parts = [definition.name, definition.description]
    stack = [(parameter, True) for parameter in definition.input_parameters]
    while stack:
        parameter, named = stack.pop()
        if named:
            parts.append(parameter.name)
        parts.append(parameter.description)
        if parameter.properties:
            stack.extend((nested, True) for nested in parameter.properties.values())
        if parameter.items is not None:
            stack.append((parameter.items, False))
    return "\n".join(parts)


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
