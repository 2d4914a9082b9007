"""Provider tool calls read back into toolkit calls: the round trip of ``toolmesh.llm.formats``.

``parse_tool_call`` takes one call in any provider's shape (a dict or the SDK's own object):

- OpenAI Chat Completions: ``{"id", "type": "function", "function": {"name", "arguments"}}``
- OpenAI Responses: ``{"type": "function_call", "call_id", "name", "arguments"}``
- Anthropic: ``{"type": "tool_use", "id", "name", "input"}``
- Gemini: a part ``{"function_call": {...}}`` (or ``functionCall``), or the call
  ``{"name", "args"}`` itself

and gives a ``ToolCall(name, arguments, id, provider)``. ``parse_tool_calls`` finds every call in
a whole response or message. Given the tools that were offered, the name is resolved to the
tool's own name, an unknown one is refused, and the nulls OpenAI's strict mode sends for omitted
optional arguments are dropped again where the tool's schema does not accept null.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from toolmesh import strictjson
from toolmesh.errors import SchemaError, ToolCallParseError
from toolmesh.llm.formats import sent_root
from toolmesh.llm.keys import ANTHROPIC_KEY, GEMINI_KEY, restore_keys
from toolmesh.models import ToolDefinition
from toolmesh.schema import parameters_to_schema, pointer_target
from toolmesh.tools import Tool

if TYPE_CHECKING:
    from toolmesh.toolkit import Toolkit

__all__ = ["Provider", "ToolCall", "parse_tool_call", "parse_tool_calls"]

Provider = Literal["openai-chat", "openai-responses", "anthropic", "gemini"]
_LEGAL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call a model asked for: run it with ``toolkit.execute(call.name, call.arguments)``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    provider: Provider = "openai-chat"


def parse_tool_call(
    call: Any, tools: Toolkit | Iterable[Tool | ToolDefinition] | None = None
) -> ToolCall:
    """One provider tool call as a ToolCall; ``ToolCallParseError`` says what is wrong."""
    data = _plain(call)
    if not isinstance(data, Mapping):
        raise ToolCallParseError(f"a tool call must be an object, not {type(call).__name__}")
    provider, name, raw_arguments, call_id = _read(data)
    if not isinstance(name, str) or not _LEGAL_NAME.fullmatch(name):
        raise ToolCallParseError(
            f"illegal tool name {name!r}: names are 1-64 characters of [A-Za-z0-9_-]"
        )
    arguments = _arguments(raw_arguments, name)
    if tools is not None:
        tool = _resolve(name, tools)
        name = tool.name
        arguments = _drop_added_nulls(arguments, _input_schema(tool), provider)
    return ToolCall(name=name, arguments=arguments, id=call_id, provider=provider)


def parse_tool_calls(
    message: Any, tools: Toolkit | Iterable[Tool | ToolDefinition] | None = None
) -> list[ToolCall]:
    """Every tool call in a provider response, message, content list or single call."""
    if tools is not None and not hasattr(tools, "names"):
        tools = list(tools)  # read more than once
    return [parse_tool_call(item, tools) for item in _calls_in(_plain(message))]


# -- reading shapes ------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """SDK objects (pydantic models) as plain data."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    return value


def _read(data: Mapping[str, Any]) -> tuple[Provider, Any, Any, str]:
    kind = data.get("type")
    function = data.get("function")
    if isinstance(function, Mapping):
        return "openai-chat", function.get("name"), function.get("arguments"), _id(data, "id")
    if kind == "function_call":
        return "openai-responses", data.get("name"), data.get("arguments"), _id(data, "call_id")
    if kind == "tool_use":
        return "anthropic", data.get("name"), data.get("input"), _id(data, "id")
    for key in ("function_call", "functionCall"):
        inner = data.get(key)
        if isinstance(inner, Mapping):
            return "gemini", inner.get("name"), inner.get("args"), _id(inner, "id")
    if "name" in data and "args" in data:
        return "gemini", data.get("name"), data.get("args"), _id(data, "id")
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise ToolCallParseError(f"not a tool call of OpenAI, Anthropic or Gemini (its keys: {keys})")


def _id(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def _arguments(raw: Any, name: str) -> dict[str, Any]:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}  # no arguments, however the model spelled that
    if isinstance(raw, str):
        try:
            raw = strictjson.loads(raw)
        except ValueError as exc:
            raise ToolCallParseError(f"arguments of {name!r} are not JSON: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ToolCallParseError(
            f"arguments of {name!r} must be a JSON object, not {type(raw).__name__}"
        )
    return dict(raw)


def _is_call(item: Any) -> bool:
    if not isinstance(item, Mapping):
        return False
    return (
        isinstance(item.get("function"), Mapping)
        or item.get("type") in ("function_call", "tool_use")
        or isinstance(item.get("function_call"), Mapping)
        or isinstance(item.get("functionCall"), Mapping)
    )


def _calls_in(data: Any) -> list[Any]:
    if isinstance(data, list | tuple):
        return [call for item in data for call in _calls_in(_plain(item))]
    if not isinstance(data, Mapping):
        raise ToolCallParseError(f"cannot find tool calls in a {type(data).__name__}")
    if _is_call(data):
        return [data]
    for key in ("choices", "candidates"):
        if isinstance(data.get(key), list):
            return _calls_in(data[key][:1])
    for key in ("message", "content"):
        if isinstance(data.get(key), Mapping):
            return _calls_in(data[key])
    for key in ("tool_calls", "output", "content", "parts"):
        if isinstance(data.get(key), list):
            return [c for c in data[key] if _is_call(_plain(c))]
    return []


# -- resolving against the offered tools ---------------------------------------------------------


def _resolve(name: str, tools: Toolkit | Iterable[Tool | ToolDefinition]) -> Tool | ToolDefinition:
    getter = getattr(tools, "get", None)
    if callable(getter) and hasattr(tools, "names"):
        found = getter(name)
        if isinstance(found, Tool):
            return found
        known: list[str] = list(tools.names())
    else:
        from toolmesh.toolkit import sanitize_name

        items = list(tools)  # type: ignore[arg-type]
        by_name = {sanitize_name(item.name): item for item in items}
        if name in by_name:
            return by_name[name]
        known = list(by_name)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ToolCallParseError(f"unknown tool {name!r}{hint}")


def _input_schema(tool: Tool | ToolDefinition) -> dict[str, Any]:
    if isinstance(tool, Tool):
        return tool.input_schema
    return tool.input_schema or parameters_to_schema(tool.input_parameters)


# The key rules to map a call's keys back by, the calling provider's own first: two rules may
# rename two keys alike ("a.b" and "a b" are both "a_b" somewhere). The others follow for calls
# made against another provider's form; OpenAI's forms keep every key.
_KEY_RULES: dict[Provider, tuple[re.Pattern[str], ...]] = {
    "openai-chat": (ANTHROPIC_KEY, GEMINI_KEY),
    "openai-responses": (ANTHROPIC_KEY, GEMINI_KEY),
    "anthropic": (ANTHROPIC_KEY, GEMINI_KEY),
    "gemini": (GEMINI_KEY, ANTHROPIC_KEY),
}


def _drop_added_nulls(
    arguments: dict[str, Any], schema: dict[str, Any], provider: Provider
) -> dict[str, Any]:
    # Walked beside the root as the provider saw it: a union at the root went as one object of
    # every branch's properties, and strict mode makes a model send null for each one it omits.
    try:
        sent = sent_root(schema)
    except SchemaError:
        sent = schema  # never sent as it is; what can be restored is restored
    return _Restore(schema, _KEY_RULES[provider]).object(arguments, sent)


class _Restore:
    """A call's arguments made the tool's own again, walking them beside the tool's schema:
    keys the provider's form renamed get their names back (by that provider's rule first),
    and ``null`` is left out for optional properties whose schema does not accept it (OpenAI's
    strict mode sends those for omitted arguments)."""

    def __init__(self, root: Mapping[str, Any], rules: tuple[re.Pattern[str], ...]) -> None:
        self.root = root
        self.rules = rules

    def object(self, arguments: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
        root = self.root
        schema = _resolved(schema, root)
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if not isinstance(properties, Mapping):
            properties = {}
            if not isinstance(extra, Mapping):
                return arguments
        required = set(schema.get("required") or ())

        def handle(value: Any, prop: Any) -> Any:
            if prop is None and isinstance(extra, Mapping):
                prop = extra  # a free key (dict[str, Model]): its value's keys were renamed too
            return self.value(value, prop) if isinstance(prop, Mapping) else value

        restored = restore_keys(arguments, properties, handle, self.rules)
        out: dict[str, Any] = {}
        for key, value in restored.items():
            prop = properties.get(key)
            if (
                value is None
                and key not in required
                and isinstance(prop, Mapping)
                and not _allows_null(_deref(prop, root), root)
            ):
                continue
            out[key] = value
        return out

    def value(self, value: Any, schema: Mapping[str, Any]) -> Any:
        schema = self.branch_for(value, _resolved(schema, self.root))
        if isinstance(value, dict):
            return self.object(value, schema)
        if isinstance(value, list):
            items = _item_schemas(schema, len(value))
            return [self.value(v, item) for v, item in zip(value, items, strict=True)]
        return value

    def branch_for(self, value: Any, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """The branch of a union (``anyOf``/``oneOf``) that ``value`` is an instance of, or
        ``schema`` itself when it is no union or no branch fits."""
        branches = [
            _resolved(b, self.root)
            for b in schema.get("anyOf") or schema.get("oneOf") or ()
            if isinstance(b, Mapping) and b.get("type") != "null"
        ]
        if len(branches) == 1:
            return branches[0]
        if isinstance(value, dict):
            # A union of objects (Email | Sms): the nulls to drop are those of the branch the
            # value is an instance of.
            return next((b for b in branches if self.fits(value, b)), schema)
        if isinstance(value, list):
            return next((b for b in branches if _is_array(b)), schema)
        return schema

    def fits(self, value: dict[str, Any], branch: Mapping[str, Any]) -> bool:
        """Whether ``value`` (nulls aside) can be an instance of the object schema ``branch``:
        its keys are the branch's (once given back their own names), its required keys are
        there, its constants (a discriminator) match."""
        properties = branch.get("properties")
        if not isinstance(properties, Mapping):
            return False
        value = restore_keys(value, properties, lambda item, _prop: item, self.rules)
        given = {key for key, item in value.items() if item is not None}
        if not given <= set(properties) or not set(branch.get("required") or ()) <= given:
            return False
        for key in given:
            prop = properties[key]
            if isinstance(prop, Mapping):
                fixed = prop["const"] if "const" in prop else prop.get("enum", [value[key]])
                if value[key] != fixed and not (isinstance(fixed, list) and value[key] in fixed):
                    return False
        return True


def _item_schemas(schema: Mapping[str, Any], count: int) -> list[Mapping[str, Any]]:
    """The schema of each of ``count`` items: a tuple's by position (``prefixItems``), then
    ``items``; an empty schema where there is none."""
    prefix = schema.get("prefixItems")
    positions = [p for p in prefix if isinstance(p, Mapping)] if isinstance(prefix, list) else []
    rest = schema.get("items")
    tail = rest if isinstance(rest, Mapping) else {}
    return [positions[i] if i < len(positions) else tail for i in range(count)]


def _is_array(schema: Mapping[str, Any]) -> bool:
    declared = schema.get("type")
    if declared == "array" or (isinstance(declared, list) and "array" in declared):
        return True
    return "items" in schema or "prefixItems" in schema


def _resolved(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with its ``$ref``s followed and its ``allOf`` merged into one object schema,
    as Gemini's form merges it (so the keys renamed inside are found)."""
    schema = _deref(schema, root)
    branches = schema.get("allOf")
    if not isinstance(branches, list):
        return schema
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties: dict[str, Any] = dict(merged.get("properties") or {})
    required: list[Any] = list(merged.get("required") or ())
    for branch in branches:
        if isinstance(branch, Mapping):
            part = _resolved(branch, root)
            properties.update(part.get("properties") or {})
            required += part.get("required") or ()
            merged = {**part, **merged}
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _deref(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    seen: set[str] = set()
    while isinstance(ref := schema.get("$ref"), str) and ref.startswith("#") and ref not in seen:
        seen.add(ref)
        node = pointer_target(root, ref)
        if not isinstance(node, Mapping):
            break
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _allows_null(schema: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    declared = schema.get("type")
    if declared is None and not any(k in schema for k in ("anyOf", "oneOf", "enum", "const")):
        return True  # untyped: anything goes
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    if isinstance(schema.get("enum"), list) and None in schema["enum"]:
        return True
    branches = schema.get("anyOf") or schema.get("oneOf") or ()
    return any(isinstance(b, Mapping) and _allows_null(_deref(b, root), root) for b in branches)
