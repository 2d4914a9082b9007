"""Tools in the shapes model providers accept in their requests.

``to_openai`` gives Chat Completions function tools (or Responses API tools with
``api="responses"``), ``to_anthropic`` the Messages API's tools, ``to_gemini`` a Gemini ``tools``
entry with function declarations. Each takes a Toolkit, Tools or ToolDefinitions; names are made
legal (``[A-Za-z0-9_-]{1,64}``) and two tools that end up with one name are an error.

OpenAI's ``strict``: ``True`` makes every schema strict (``SchemaError`` for one that cannot be,
such as a free-form dict), ``False`` sends schemas as they are, and ``None`` (the default) makes
each tool strict when its schema allows and sends the others with ``strict: false``.
``parse_tool_call`` (toolmesh.llm.calls) reads the calls back, undoing what strict mode changed.
A union at the root of a schema (which Anthropic and OpenAI refuse there) goes as one object with
the branches' properties, the alternatives named in the tool's description
(``toolmesh.llm.schemas.object_root``).
The schemas in what these return are shared with the tools (and between calls): copy one before
changing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from toolmesh.errors import SchemaError
from toolmesh.llm.keys import ANTHROPIC_KEY, GEMINI_KEY, legal_keys
from toolmesh.llm.schemas import gemini_schema, object_root, openai_strict_schema
from toolmesh.models import ToolDefinition
from toolmesh.schema import parameters_to_schema
from toolmesh.tools import Tool

if TYPE_CHECKING:
    from toolmesh.toolkit import Toolkit

__all__ = ["ToolsLike", "sent_root", "to_anthropic", "to_gemini", "to_openai", "tool_entries"]

JsonSchema = dict[str, Any]
ToolsLike = "Toolkit | Iterable[Tool | ToolDefinition]"


def tool_entries(
    tools: Toolkit | Iterable[Tool | ToolDefinition],
) -> list[tuple[str, str, JsonSchema]]:
    """(legal name, description, input schema) of each tool, in order; of a Toolkit, the tools
    its listing shows (deferred ones are found by search, not sent), as its methods give."""
    from toolmesh.toolkit import Toolkit, sanitize_name

    items = [tools[d.name] for d in tools.definitions()] if isinstance(tools, Toolkit) else tools
    out: list[tuple[str, str, JsonSchema]] = []
    taken: dict[str, str] = {}
    for item in items:
        if isinstance(item, Tool):
            name, text, schema = item.name, item.description, item.input_schema
        else:
            schema = item.input_schema or parameters_to_schema(item.input_parameters)
            name, text = item.name, item.description
        legal = sanitize_name(name)
        if legal in taken:
            raise SchemaError(
                f"tools {taken[legal]!r} and {name!r} both become {legal!r} for a provider; "
                "rename one (or assemble them in a Toolkit, which resolves it)"
            )
        taken[legal] = name
        try:
            rooted, note = _remembered(_ROOTED, schema, object_root)
        except SchemaError as exc:
            raise SchemaError(f"tool {name!r}: {exc}") from None
        out.append((legal, "\n\n".join(p for p in (text, note) if p), rooted))
    return out


def sent_root(schema: JsonSchema) -> JsonSchema:
    """The root of ``schema`` as the provider forms send it (a union at the root merged into
    one object): what a model's call is read back against. ``SchemaError`` as ``tool_entries``."""
    return _remembered(_ROOTED, schema, object_root)[0]


# The provider forms of a tool's schema, kept while the schema object lives: an agent loop sends
# the same tools with every model request, and a strict conversion copies the whole schema. A
# tool's schema is never changed in place (a changed tool gets a new one), so identity is a
# sound key; the schema itself is kept beside its form, so an id cannot be reused meanwhile.
Form = TypeVar("Form")
Memo = dict[int, tuple[JsonSchema, Any]]  # id(schema): (schema, its form or its SchemaError)
_ROOTED: Memo = {}  # (the object root, the note on a merged union for the description)
_STRICT: Memo = {}
_ANTHROPIC: Memo = {}
_REMEMBER_LIMIT = 50_000


def _remembered(memo: Memo, schema: JsonSchema, convert: Callable[[JsonSchema], Form]) -> Form:
    """``convert(schema)``, computed once per schema object (its SchemaError too)."""
    hit = memo.get(id(schema))
    if hit is None or hit[0] is not schema:
        try:
            form: Form | SchemaError = convert(schema)
        except SchemaError as exc:
            form = exc
        if len(memo) >= _REMEMBER_LIMIT:
            memo.clear()
        hit = memo[id(schema)] = (schema, form)
    if isinstance(hit[1], SchemaError):
        raise SchemaError(str(hit[1]))
    remembered: Form = hit[1]
    return remembered


def _openai_parameters(
    name: str, schema: JsonSchema, strict: bool | None
) -> tuple[JsonSchema, bool]:
    if strict is False:
        return schema, False
    try:
        return _remembered(_STRICT, schema, openai_strict_schema), True
    except SchemaError as exc:
        if strict:
            raise SchemaError(f"tool {name!r} cannot be strict: {exc}") from exc
        return schema, False


def to_openai(
    tools: Toolkit | Iterable[Tool | ToolDefinition],
    *,
    api: Literal["chat", "responses"] = "chat",
    strict: bool | None = None,
) -> list[dict[str, Any]]:
    """OpenAI function tools (Chat Completions by default, or the Responses API)."""
    if api not in ("chat", "responses"):
        raise ValueError(f"api must be 'chat' or 'responses', not {api!r}")
    out: list[dict[str, Any]] = []
    for name, text, schema in tool_entries(tools):
        parameters, is_strict = _openai_parameters(name, schema, strict)
        function = {
            "name": name,
            "description": text,
            "parameters": parameters,
            "strict": is_strict,
        }
        out.append(
            {"type": "function", **function}
            if api == "responses"
            else {"type": "function", "function": function}
        )
    return out


def to_anthropic(tools: Toolkit | Iterable[Tool | ToolDefinition]) -> list[dict[str, Any]]:
    """Anthropic Messages API tools (JSON Schema as it is: Anthropic follows ``$ref``s), with
    property keys Anthropic refuses renamed (``parse_tool_call`` maps them back)."""
    return [
        {
            "name": name,
            "description": text,
            "input_schema": _remembered(_ANTHROPIC, schema, _anthropic_keys),
        }
        for name, text, schema in tool_entries(tools)
    ]


def _anthropic_keys(schema: JsonSchema) -> JsonSchema:
    legal: JsonSchema = legal_keys(schema, ANTHROPIC_KEY)
    return legal


def to_gemini(tools: Toolkit | Iterable[Tool | ToolDefinition]) -> list[dict[str, Any]]:
    """A Gemini ``tools`` list with one entry of function declarations.

    Schemas are rewritten into Gemini's subset; a recursive type raises ``SchemaError`` naming
    the tool. A tool without parameters has no ``parameters`` (Gemini refuses an empty object).
    """
    declarations = []
    for name, text, schema in tool_entries(tools):
        declaration: dict[str, Any] = {"name": name, "description": text}
        if schema.get("properties"):
            try:
                declaration["parameters"] = gemini_schema(legal_keys(schema, GEMINI_KEY))
            except SchemaError as exc:
                raise SchemaError(f"tool {name!r}: {exc}") from exc
        declarations.append(declaration)
    return [{"function_declarations": declarations}]
