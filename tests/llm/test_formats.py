"""Provider tool formats, validated against each provider SDK's own request types.

OpenAI: ``ChatCompletionFunctionToolParam`` / Responses ``FunctionToolParam`` and, for strict
schemas, the rules of strict mode plus the SDK's own strict-schema pass (which must find nothing
left to change). Anthropic: ``ToolParam`` and its typed ``InputSchema``. Gemini: google-genai's
``types.Tool`` (pydantic, extra keys forbidden) and no ``$ref``/``defs``/``additional_properties``.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from typing import Any

import fastjsonschema
import pytest
from anthropic.types import ToolParam
from anthropic.types.tool_param import InputSchemaTyped
from google.genai import types as genai
from openai.lib._pydantic import _ensure_strict_json_schema
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter

from tests.llm.catalogue import CATALOGUE, FREE_FORM, RECURSIVE, add, count_nodes, metadata
from toolmesh import SchemaError, Toolkit
from toolmesh.llm import gemini_schema, openai_strict_schema, to_anthropic, to_gemini, to_openai

NAMES = [t.name for t in CATALOGUE]


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


def assert_openai_strict(schema: Mapping[str, Any]) -> None:
    """OpenAI's strict-mode rules, then the SDK's own strict pass as a fixed point."""
    assert schema["type"] == "object" and "anyOf" not in schema
    defs = schema.get("$defs", {})

    def walk(node: Any, path: str) -> None:
        assert isinstance(node, dict), path
        assert set(node) <= STRICT_KEYWORDS, f"{path}: {set(node) - STRICT_KEYWORDS}"
        if "$ref" in node:
            assert set(node) == {"$ref"}, f"{path}: $ref with siblings"
            ref = node["$ref"]
            assert ref == "#" or ref.removeprefix("#/$defs/") in defs, f"{path}: {ref}"
            return
        assert {"type", "anyOf", "enum", "const"} & set(node), f"{path}: untyped"
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


# -- OpenAI --------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_every_tool_validates_and_strict_where_possible(api: str) -> None:
    entries = to_openai(CATALOGUE, api=api)  # type: ignore[arg-type]
    assert len(entries) == len(CATALOGUE)
    for entry in entries:
        if api == "chat":
            check_typed_dict(ChatCompletionFunctionToolParam, entry)
            function = entry["function"]
        else:
            check_typed_dict(FunctionToolParam, entry)
            function = entry
        fastjsonschema.compile(function["parameters"])  # a JSON Schema at all
        if function["name"] in FREE_FORM:
            assert function["strict"] is False
        else:
            assert function["strict"] is True, function["name"]
            assert_openai_strict(function["parameters"])
    assert {e["name"] for e in to_openai(CATALOGUE, api="responses")} >= {"fs_read"}


def test_openai_strict_true_names_the_tool_and_the_path_it_cannot_express() -> None:
    with pytest.raises(SchemaError, match=r"'metadata' cannot be strict: \$\.properties\.values"):
        to_openai([metadata], strict=True)


def test_openai_strict_false_sends_schemas_as_they_are() -> None:
    (entry,) = to_openai([count_nodes], strict=False)
    assert entry["function"]["strict"] is False
    assert entry["function"]["parameters"] == count_nodes.input_schema


def test_strict_optional_fields_become_required_and_nullable() -> None:
    schema = openai_strict_schema(
        {
            "type": "object",
            "properties": {
                "q": {"type": "string"},
                "limit": {"type": "integer", "default": 10},
                "mode": {"type": "string", "enum": ["a", "b"]},
            },
            "required": ["q"],
        }
    )
    assert schema["required"] == ["q", "limit", "mode"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["limit"] == {
        "type": ["integer", "null"],
        "description": "Default: 10.",
    }
    assert schema["properties"]["mode"]["enum"] == ["a", "b", None]


def test_strict_keeps_recursion_as_refs_into_defs() -> None:
    schema = openai_strict_schema(count_nodes.input_schema)
    assert schema["properties"]["tree"] == {"$ref": "#/$defs/TreeNode"}
    children = schema["$defs"]["TreeNode"]["properties"]["children"]
    assert children["type"] == ["array", "null"]
    assert children["items"] == {"$ref": "#/$defs/TreeNode"}


def test_strict_inlines_a_ref_with_siblings_and_turns_one_of_into_any_of() -> None:
    schema = openai_strict_schema(
        {
            "type": "object",
            "properties": {
                "p": {"$ref": "#/definitions/P", "description": "the p"},
                "u": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            },
            "required": ["p", "u"],
            "definitions": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        }
    )
    assert schema["properties"]["p"]["description"] == "the p"
    assert schema["properties"]["p"]["required"] == ["x"]
    assert "$defs" not in schema
    assert schema["properties"]["u"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert_openai_strict(schema)


def test_strict_refuses_untyped_values_and_deep_nesting() -> None:
    with pytest.raises(SchemaError, match=r"\$\.properties\.x: an object with free-form keys"):
        openai_strict_schema({"type": "object", "properties": {"x": {"type": "object"}}})
    assert openai_strict_schema({"type": "object"})["additionalProperties"] is False
    with pytest.raises(SchemaError, match=r"\$\.properties\.x: a value of any type"):
        openai_strict_schema({"type": "object", "properties": {"x": {}}, "required": ["x"]})
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(12):
        deep = {"type": "object", "properties": {"n": deep}, "required": ["n"]}
    with pytest.raises(SchemaError, match="deeper than"):
        openai_strict_schema(deep)


# -- Anthropic -----------------------------------------------------------------------------------


def test_anthropic_every_tool_validates() -> None:
    for entry in to_anthropic(CATALOGUE):  # type: ignore[arg-type]
        check_typed_dict(ToolParam, entry)
        check_typed_dict(
            InputSchemaTyped, {k: entry["input_schema"][k] for k in ("type", "properties")}
        )
        fastjsonschema.compile(entry["input_schema"])
    assert to_anthropic([add]) == [
        {"name": "add", "description": "Add two integers.", "input_schema": add.input_schema}
    ]


# -- Gemini --------------------------------------------------------------------------------------


def test_gemini_every_expressible_tool_validates_against_genai_types() -> None:
    expressible = [t for t in CATALOGUE if t.name not in RECURSIVE]
    (entry,) = to_gemini(expressible)  # type: ignore[arg-type]
    parsed = genai.Tool.model_validate(entry)
    assert [d.name for d in parsed.function_declarations or []] == [
        "fs_read" if t.name == "fs.read" else t.name for t in expressible
    ]
    keys = walk_keys(entry)
    assert not keys & {
        "$ref",
        "$defs",
        "defs",
        "ref",
        "additionalProperties",
        "additional_properties",
    }
    assert not keys & {"anyOf", "oneOf", "allOf", "default"}


def test_gemini_subset_details() -> None:
    (entry,) = to_gemini(CATALOGUE[:5])  # type: ignore[arg-type]
    by_name = {d["name"]: d for d in entry["function_declarations"]}
    assert "parameters" not in by_name["ping"]
    person = by_name["register_person"]["parameters"]["properties"]["person"]
    assert person["type"] == "OBJECT"
    assert person["properties"]["address"]["properties"]["city"]["description"] == "City name"
    assert person["properties"]["favourite"] == {
        "type": "STRING",
        "enum": ["red", "green"],
        "format": "enum",
        "nullable": True,
    }
    priority = by_name["paint"]["parameters"]["properties"]["priority"]
    assert priority["type"] == "INTEGER" and "Allowed values: 1, 2." in priority["description"]
    labels = by_name["plot"]["parameters"]["properties"]["labels"]
    assert labels == {"type": "OBJECT", "nullable": True, "description": "Default: null."} or (
        labels["type"] == "OBJECT" and labels["nullable"] is True
    )


def test_gemini_recursive_type_is_a_clear_error() -> None:
    with pytest.raises(SchemaError, match=r"'count_nodes'.*recursive type 'TreeNode'.*Gemini"):
        to_gemini([count_nodes])
    with pytest.raises(SchemaError, match="recursive"):
        gemini_schema({"type": "object", "properties": {"self": {"$ref": "#"}}})


# -- names and the toolkit -----------------------------------------------------------------------


def test_names_are_made_legal_and_collisions_refused() -> None:
    (entry,) = to_anthropic([t for t in CATALOGUE if t.name == "fs.read"])  # type: ignore[arg-type]
    assert entry["name"] == "fs_read"
    twin = add.replace(name="fs_read")
    with pytest.raises(SchemaError, match="both become 'fs_read'"):
        to_anthropic([*CATALOGUE, twin])  # type: ignore[list-item]


def test_toolkit_methods_match_the_functions() -> None:
    kit = Toolkit(*CATALOGUE)
    assert kit.to_anthropic() == to_anthropic(kit)
    assert kit.to_openai(api="responses") == to_openai(kit, api="responses")
    assert kit.to_openai(strict=False) == to_openai(kit, strict=False)
    with pytest.raises(SchemaError, match="count_nodes"):
        kit.to_gemini()


def test_a_root_that_is_not_an_object_names_the_tool() -> None:
    from toolmesh import Tool, ToolDefinition

    async def run(arguments: dict[str, object], ctx: object) -> None:
        return None

    odd = Tool(
        ToolDefinition(name="odd", description="d"),
        run,  # type: ignore[arg-type]
        input_schema={"anyOf": [{"type": "object"}, {"type": "string"}]},
    )
    with pytest.raises(SchemaError, match="tool 'odd': an input schema must be an object"):
        to_anthropic([odd])
