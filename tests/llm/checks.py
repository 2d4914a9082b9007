"""Checks of provider tool formats against each provider SDK's own request types and rules."""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from typing import Any

from openai.lib._pydantic import _ensure_strict_json_schema
from pydantic import TypeAdapter

from toolmesh.schema import pointer_step


def check_typed_dict(td: Any, value: Any, where: str = "$") -> None:
    """Validate ``value`` against an SDK TypedDict, refusing keys the TypedDict does not have."""
    TypeAdapter(td).validate_python(value)
    hints = typing.get_type_hints(td)
    unknown = set(value) - set(hints)
    assert not unknown, f"{where}: keys {unknown} are not in {td.__name__}"
    for key, hint in hints.items():
        if typing.is_typeddict(hint) and key in value:
            check_typed_dict(hint, value[key], f"{where}.{key}")


STRICT_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "anyOf",
    "enum",
    "const",
    "$ref",
    "$defs",
    "description",
    "title",
    "pattern",
    "format",
    "multipleOf",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
}


# What OpenAI ("must have type 'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at
# the top level") and Anthropic ("input_schema does not support oneOf, allOf, or anyOf at the top
# level") refuse at the root of a tool's schema.
ROOT_REFUSED = {"oneOf", "anyOf", "allOf", "enum", "not"}


def assert_object_root(schema: Mapping[str, Any]) -> None:
    """The root every provider accepts: an object, no combinator or enum beside it."""
    assert schema.get("type") == "object", f"$: type {schema.get('type')!r}, not 'object'"
    assert isinstance(schema.get("properties"), dict), "$: no properties"
    refused = ROOT_REFUSED & set(schema)
    assert not refused, f"$: {sorted(refused)} at the top level"


def assert_openai_strict(schema: Mapping[str, Any]) -> None:
    """OpenAI's strict-mode rules, then the SDK's own strict pass as a fixed point."""
    assert_object_root(schema)
    defs = schema.get("$defs", {})

    def walk(node: Any, path: str) -> None:
        assert isinstance(node, dict), path
        assert set(node) <= STRICT_KEYWORDS, f"{path}: {set(node) - STRICT_KEYWORDS}"
        if "$ref" in node:
            assert set(node) == {"$ref"}, f"{path}: $ref with siblings"
            ref = node["$ref"]
            assert ref == "#" or pointer_step(ref.removeprefix("#/$defs/")) in defs, (
                f"{path}: {ref}"
            )
            return
        # Strict mode refuses a node without a type: "schema must have a 'type' key" (an enum
        # or const alone too; a union's branches that only add constraints to it, as well).
        assert {"type", "anyOf"} & set(node), f"{path}: no type"
        types = node.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            assert node["additionalProperties"] is False, path
            assert node["required"] == list(node["properties"]), path
        if types == "array" or (isinstance(types, list) and "array" in types):
            assert "items" in node, path
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]")
        for i, branch in enumerate(node.get("anyOf", [])):
            walk(branch, f"{path}|{i}")

    walk({k: v for k, v in schema.items() if k != "$defs"}, "$")
    for name, value in defs.items():
        walk(value, f"$defs.{name}")
    assert _ensure_strict_json_schema(copy.deepcopy(dict(schema)), path=(), root={}) == schema


def walk_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in walk_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in walk_keys(v)}
    return set()


def assert_gemini_typed(schema: Mapping[str, Any], path: str = "$") -> None:
    """Every node of a Gemini Schema says what it is (a ``type`` or an ``any_of``): a union of
    branches that say nothing (``{"any_of": [{}, {}]}``) tells the model nothing."""
    assert {"type", "any_of"} & set(schema), f"{path}: neither type nor any_of: {schema}"
    for key, child in (schema.get("properties") or {}).items():
        assert_gemini_typed(child, f"{path}.{key}")
    if "items" in schema:
        assert_gemini_typed(schema["items"], f"{path}[]")
    for i, branch in enumerate(schema.get("any_of") or []):
        assert_gemini_typed(branch, f"{path}|{i}")
