"""Provider tool formats, validated against each provider SDK's own request types.

OpenAI: ``ChatCompletionFunctionToolParam`` / Responses ``FunctionToolParam`` and, for strict
schemas, the rules of strict mode plus the SDK's own strict-schema pass (which must find nothing
left to change). Anthropic: ``ToolParam`` and its typed ``InputSchema``. Gemini: google-genai's
``types.Tool`` (pydantic, extra keys forbidden) and no ``$ref``/``defs``/``additional_properties``.
"""

from __future__ import annotations

from typing import Any

import fastjsonschema
import pytest
from anthropic.types import ToolParam
from anthropic.types.tool_param import InputSchemaTyped
from google.genai import types as genai
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam

from tests.llm.catalogue import CATALOGUE, FREE_FORM, RECURSIVE, add, count_nodes, metadata
from tests.llm.checks import (
    assert_gemini_typed,
    assert_object_root,
    assert_openai_strict,
    check_typed_dict,
    walk_keys,
)
from toolmesh import SchemaError, ToolDefinition, Toolkit, tool
from toolmesh.llm import (
    gemini_schema,
    openai_strict_schema,
    parse_tool_call,
    to_anthropic,
    to_gemini,
    to_openai,
)
from toolmesh.llm.keys import ANTHROPIC_KEY, GEMINI_KEY

NAMES = [t.name for t in CATALOGUE]


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
        assert_object_root(function["parameters"])
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


def test_strict_an_optional_enum_of_several_types_gains_null_too() -> None:
    mixed = {"type": ["integer", "string"], "enum": [1, "a"]}
    schema = openai_strict_schema({"type": "object", "properties": {"pick": mixed}})
    assert schema["properties"]["pick"] == {
        "type": ["integer", "string", "null"],
        "enum": [1, "a", None],
    }


@pytest.mark.parametrize(
    ("given", "made"),
    [
        ({"type": ["string", "null"], "enum": ["a", "b"]}, ["a", "b", None]),  # type said null
        ({"type": "string", "enum": ["a", None]}, ["a", None]),  # enum said null: kept once
    ],
)
def test_strict_an_optional_enum_gains_null_once(given: dict[str, Any], made: list[Any]) -> None:
    schema = openai_strict_schema({"type": "object", "properties": {"pick": given}})
    assert schema["properties"]["pick"]["enum"] == made
    assert schema["properties"]["pick"]["type"].count("null") == 1


def test_strict_fixed_length_tuples_become_arrays_of_any_position() -> None:
    (entry,) = to_openai([t for t in CATALOGUE if t.name == "move"], strict=True)
    to = entry["function"]["parameters"]["properties"]["to"]
    assert to == {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer"}}
    with pytest.raises(SchemaError, match=r"\$\.properties\.a: an array without an items schema"):
        openai_strict_schema({"type": "object", "properties": {"a": {"type": "array"}}})


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
        assert_object_root(entry["input_schema"])
    assert to_anthropic([add]) == [
        {"name": "add", "description": "Add two integers.", "input_schema": add.input_schema}
    ]


# -- Gemini --------------------------------------------------------------------------------------


def test_gemini_every_expressible_tool_validates_against_genai_types() -> None:
    expressible = [t for t in CATALOGUE if t.name not in RECURSIVE]
    (entry,) = to_gemini(expressible)  # type: ignore[arg-type]
    parsed = genai.Tool.model_validate(entry)
    for declaration in entry["function_declarations"]:
        if "parameters" in declaration:
            assert_gemini_typed(declaration["parameters"])
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
    (entry,) = to_gemini([t for t in CATALOGUE if t.name not in RECURSIVE])  # type: ignore[arg-type]
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
    position = by_name["move"]["parameters"]["properties"]["to"]
    assert position == {
        "type": "ARRAY",
        "min_items": 2,
        "max_items": 2,
        "items": {"type": "INTEGER"},
    }
    label = by_name["move"]["parameters"]["properties"]["label"]
    assert label["nullable"] is True
    assert label["items"] == {"any_of": [{"type": "STRING"}, {"type": "INTEGER"}]}
    labels = by_name["plot"]["parameters"]["properties"]["labels"]
    assert labels == {"type": "OBJECT", "nullable": True, "description": "Default: null."} or (
        labels["type"] == "OBJECT" and labels["nullable"] is True
    )


def test_gemini_arrays_always_have_typed_items() -> None:
    untyped = {"type": "array"}
    schema = gemini_schema(
        {
            "type": "object",
            "properties": {"bare": untyped, "anything": {**untyped, "items": {}}},
        }
    )
    for name in ("bare", "anything"):  # Gemini refuses ARRAY without items.type
        assert schema["properties"][name] == {"type": "ARRAY", "items": {"type": "STRING"}}
    genai.Schema.model_validate(schema)


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
    (gemini,) = to_gemini([add.replace(name="1password"), add.replace(name="-x")])
    names = [d["name"] for d in gemini["function_declarations"]]
    assert names == ["_1password", "_-x"]  # Gemini: a letter or "_" first
    for name in names:
        genai.FunctionDeclaration(name=name)


def test_toolkit_methods_match_the_functions() -> None:
    from toolmesh import tool

    @tool(defer_loading=True)
    def rarely_used(x: int) -> int:
        """Found by search only."""
        return x

    kit = Toolkit(*CATALOGUE, rarely_used)
    assert "rarely_used" not in {t["name"] for t in to_anthropic(kit)}  # left to search
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


def test_a_tools_provider_form_is_made_once_and_its_failure_each_time() -> None:
    """An agent loop sends the same tools with every model request: the strict form is kept."""
    first, again = to_openai(CATALOGUE), to_openai(CATALOGUE)
    assert first == again
    assert all(
        a["function"]["parameters"] is b["function"]["parameters"]
        for a, b in zip(first, again, strict=True)
        if a["function"]["strict"]
    )
    for _ in range(2):  # a remembered failure is raised again, naming the tool each time
        with pytest.raises(SchemaError, match="cannot be strict"):
            to_openai([metadata], strict=True)


ODD_KEYS = ToolDefinition(
    name="list_items",
    description="An OpenAPI operation's parameters.",
    input_schema={
        "type": "object",
        "properties": {
            "filter[name]": {"type": "string"},
            "$top": {"type": "integer"},
            "X-Request-ID": {"type": "string"},
            "page": {
                "type": "object",
                "properties": {"@odata.next": {"type": "string"}, "size": {"type": "integer"}},
                "required": ["@odata.next"],
            },
        },
        "required": ["$top"],
    },
)


def test_property_keys_a_provider_refuses_are_renamed_and_mapped_back() -> None:
    (anthropic,) = to_anthropic([ODD_KEYS])
    schema = anthropic["input_schema"]
    assert list(schema["properties"]) == ["filter_name_", "_top", "X-Request-ID", "page"]
    assert schema["required"] == ["_top"]
    assert list(schema["properties"]["page"]["properties"]) == ["_odata.next", "size"]
    assert all(ANTHROPIC_KEY.fullmatch(k) for k in walk_property_keys(schema))
    (gemini,) = to_gemini([ODD_KEYS])
    parameters = gemini["function_declarations"][0]["parameters"]
    assert list(parameters["properties"]) == ["filter_name_", "_top", "X_Request_ID", "page"]
    assert all(GEMINI_KEY.fullmatch(k) for k in walk_property_keys(parameters))
    genai.Schema.model_validate(parameters)

    sent = {"filter_name_": "a", "_top": 5, "X_Request_ID": "r1", "page": {"_odata.next": "n"}}
    call = parse_tool_call(
        {"type": "tool_use", "id": "t", "name": "list_items", "input": sent}, [ODD_KEYS]
    )
    assert call.arguments == {
        "filter[name]": "a",
        "$top": 5,
        "X-Request-ID": "r1",
        "page": {"@odata.next": "n"},
    }


def test_keys_that_are_legal_already_leave_the_schema_as_it_is() -> None:
    tool = add.replace(name="plain")
    (entry,) = to_anthropic([tool])
    assert entry["input_schema"] is to_anthropic([tool])[0]["input_schema"]  # made once
    assert list(entry["input_schema"]["properties"]) == list(tool.input_schema["properties"])


def walk_property_keys(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                found += list(value)
                for child in value.values():
                    found += walk_property_keys(child)
            else:
                found += walk_property_keys(value)
    elif isinstance(node, list):
        for item in node:
            found += walk_property_keys(item)
    return found


# -- a discriminated union -----------------------------------------------------------------------


def _adopt_tool() -> Any:
    from typing import Annotated, Literal

    from pydantic import BaseModel, Field

    from toolmesh import tool

    class Cat(BaseModel):
        kind: Literal["cat"]
        name: str | None = None

    class Dog(BaseModel):
        kind: Literal["dog"]
        barks: float

    @tool
    def adopt(pet: Annotated[Cat | Dog, Field(discriminator="kind")]) -> str:
        """Adopt a pet."""
        return type(pet).__name__

    return adopt


def test_a_discriminated_union_travels_to_every_provider() -> None:
    adopt = _adopt_tool()
    tagged = {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}
    (loose,) = to_openai([adopt], strict=False)
    check_typed_dict(ChatCompletionFunctionToolParam, loose)
    assert loose["function"]["parameters"]["properties"]["pet"]["discriminator"] == tagged
    (strict,) = to_openai([adopt], strict=True, api="responses")
    check_typed_dict(FunctionToolParam, strict)
    assert_openai_strict(strict["parameters"])  # strict mode has anyOf, no discriminator
    assert strict["parameters"]["properties"]["pet"] == {
        "anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]
    }
    (anthropic,) = to_anthropic([adopt])
    check_typed_dict(ToolParam, anthropic)
    assert anthropic["input_schema"]["properties"]["pet"]["discriminator"] == tagged
    (gemini,) = to_gemini([adopt])
    genai.Tool.model_validate(gemini)
    pet = gemini["function_declarations"][0]["parameters"]["properties"]["pet"]
    assert [b["properties"]["kind"]["enum"] for b in pet["any_of"]] == [["cat"], ["dog"]]
    # What strict mode makes a model send (a null for the omitted name) reads back valid.
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "adopt", "arguments": '{"pet": {"kind": "cat", "name": null}}'},
    }
    parsed = parse_tool_call(call, [adopt])
    assert parsed.arguments == {"pet": {"kind": "cat", "name": None}}
    adopt.validate(parsed.arguments)


def test_strict_refuses_an_object_whose_other_keys_are_typed_even_at_the_root() -> None:
    """``**kwargs: str`` at the root: closing the object would take the extra arguments away,
    so the tool is sent non-strict (and ``strict=True`` names why it cannot be)."""

    @tool
    def kw(a: int, **kwargs: str) -> str:
        return a * "x"

    (entry,) = to_openai([kw])
    assert entry["function"]["strict"] is False
    assert entry["function"]["parameters"]["additionalProperties"] == {"type": "string"}
    with pytest.raises(SchemaError, match=r"'kw' cannot be strict: \$: an object with free-form"):
        to_openai([kw], strict=True)


# -- unions at the root, and unions that only add constraints ------------------------------------


async def _ok(arguments: dict[str, Any], ctx: object) -> str:
    return "ok"


def _tool_with(name: str, schema: dict[str, Any]) -> Any:
    from toolmesh import Tool

    return Tool(ToolDefinition(name=name, description="A tool."), _ok, input_schema=schema)  # type: ignore[arg-type]


ID_OR_EMAIL = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "email": {"type": "string"}},
    "oneOf": [{"required": ["id"]}, {"required": ["email"]}],
}
ID_OR_PATH = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"full_path": {"type": "string"}},
            "required": ["full_path"],
            "additionalProperties": False,
        },
    ]
}
PETS = {
    "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
    "$defs": {
        "Cat": {
            "title": "Cat",
            "type": "object",
            "properties": {
                "kind": {"const": "cat", "type": "string"},
                "lives": {"type": "integer"},
            },
            "required": ["kind"],
        },
        "Dog": {
            "title": "Dog",
            "type": "object",
            "properties": {"kind": {"const": "dog", "type": "string"}, "bark": {"type": "boolean"}},
            "required": ["kind", "bark"],
        },
    },
}
ROOT_UNIONS = {"find_user": ID_OR_EMAIL, "get_resource": ID_OR_PATH, "adopt_pet": PETS}


def _assert_every_provider_accepts(tool: Any) -> None:
    for strict in (None, False):
        (entry,) = to_openai([tool], strict=strict)
        check_typed_dict(ChatCompletionFunctionToolParam, entry)
        assert_object_root(entry["function"]["parameters"])
        if entry["function"]["strict"]:
            assert_openai_strict(entry["function"]["parameters"])
    (anthropic,) = to_anthropic([tool])
    check_typed_dict(ToolParam, anthropic)
    assert_object_root(anthropic["input_schema"])
    (gemini,) = to_gemini([tool])
    genai.Tool.model_validate(gemini)
    assert_gemini_typed(gemini["function_declarations"][0]["parameters"])


@pytest.mark.parametrize("name", list(ROOT_UNIONS))
def test_a_union_at_the_root_goes_as_one_object_every_provider_accepts(name: str) -> None:
    """Anthropic and OpenAI refuse oneOf/anyOf at the top level (and with it the whole request);
    Gemini got ``{"any_of": [{}, {}]}``; a root that was only ``anyOf`` was a SchemaError."""
    tool = _tool_with(name, ROOT_UNIONS[name])
    _assert_every_provider_accepts(tool)
    (entry,) = to_anthropic([tool])
    assert entry["description"].startswith("A tool.\n\nThe arguments must match")


def test_a_root_union_merges_the_branches_and_names_them_in_the_description() -> None:
    (found,) = to_anthropic([_tool_with("find_user", ID_OR_EMAIL)])
    assert found["input_schema"] == {
        "type": "object",
        "properties": {"id": {"type": "string"}, "email": {"type": "string"}},
    }
    assert found["description"].endswith("exactly one of: (1) requires id; (2) requires email.")
    (got,) = to_openai([_tool_with("get_resource", ID_OR_PATH)])
    parameters = got["function"]["parameters"]
    assert got["function"]["strict"] is True
    assert parameters["properties"] == {
        "id": {"type": ["string", "null"]},
        "full_path": {"type": ["string", "null"]},
    }
    assert (
        "at least one of: (1) requires id; (2) requires full_path."
        in got["function"]["description"]
    )
    (pets,) = to_gemini([_tool_with("adopt_pet", PETS)])
    declaration = pets["function_declarations"][0]
    kind = declaration["parameters"]["properties"]["kind"]
    assert kind == {"type": "STRING", "enum": ["cat", "dog"], "format": "enum"}
    assert declaration["parameters"]["required"] == ["kind"]
    assert (
        '(1) Cat: kind="cat"; (2) Dog: kind="dog", requires bark.' in (declaration["description"])
    )


SIBLING_UNIONS = {
    "type": "object",
    "properties": {
        "when": {
            "type": "string",
            "description": "A date or a date-time.",
            "anyOf": [{"format": "date"}, {"format": "date-time"}],
        },
        "target": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "email": {"type": "string"}},
            "oneOf": [{"required": ["id"]}, {"required": ["email"]}],
        },
    },
    "required": ["when", "target"],
}


def test_union_branches_that_only_add_constraints_carry_their_siblings() -> None:
    """Strict mode refuses branches without a type ("schema must have a 'type' key"), and
    Gemini got ``{"any_of": [{}, {}]}``: the siblings (type, properties) were not in them."""
    tool = _tool_with("schedule", SIBLING_UNIONS)
    _assert_every_provider_accepts(tool)
    (strict,) = to_openai([tool])
    assert strict["function"]["strict"] is True
    when = strict["function"]["parameters"]["properties"]["when"]
    assert when == {
        "description": "A date or a date-time.",
        "anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}],
    }
    (gemini,) = to_gemini([tool])
    properties = gemini["function_declarations"][0]["parameters"]["properties"]
    target = properties["target"]["any_of"]
    assert [branch["required"] for branch in target] == [["id"], ["email"]]
    assert all(list(branch["properties"]) == ["id", "email"] for branch in target)
    assert {b["type"] for b in properties["when"]["any_of"]} == {"STRING"}


def test_strict_gives_an_enum_the_type_of_its_values() -> None:
    """``Literal[1, "x"]`` and an Enum of int and str values went out strict as a bare enum."""
    import enum
    from typing import Literal

    class Mode(enum.Enum):
        ONE = 1
        B = "b"

    @tool
    def pick(a: Literal[1, "x"], mode: Mode, flag: Literal["on"] | None = None) -> str:
        """Pick."""
        return "ok"

    (entry,) = to_openai([pick])
    assert entry["function"]["strict"] is True
    parameters = entry["function"]["parameters"]
    assert_openai_strict(parameters)
    assert parameters["properties"]["a"] == {
        "anyOf": [{"type": "integer", "enum": [1]}, {"type": "string", "enum": ["x"]}]
    }
    # An enum of objects has no type to give: the tool is sent non-strict.
    odd = _tool_with(
        "odd", {"type": "object", "properties": {"v": {"enum": [{"a": 1}]}}, "required": ["v"]}
    )
    assert to_openai([odd])[0]["function"]["strict"] is False
    with pytest.raises(SchemaError, match=r"\$\.properties\.v: an enum of dict values"):
        openai_strict_schema(odd.input_schema)
    with pytest.raises(SchemaError, match="without a type cannot be strict"):
        openai_strict_schema({"type": "object", "properties": {"v": {"minimum": 1}}})


def test_the_checks_refuse_what_the_providers_refuse() -> None:
    """The provider-acceptance checks catch the shapes the providers answer 400 to."""
    closed = {"additionalProperties": False}
    typeless_branches = {
        "type": "object",
        "properties": {"w": {"anyOf": [{"format": "date"}, {"format": "date-time"}]}},
        "required": ["w"],
        **closed,
    }
    bare_enum = {
        "type": "object",
        "properties": {"a": {"enum": [1, "x"]}},
        "required": ["a"],
        **closed,
    }
    for bad in (typeless_branches, bare_enum):
        with pytest.raises(AssertionError, match="no type"):
            assert_openai_strict(bad)
    with pytest.raises(AssertionError, match="top level"):
        assert_object_root(ID_OR_EMAIL)
    with pytest.raises(AssertionError, match="not 'object'"):
        assert_object_root(ID_OR_PATH)
    with pytest.raises(AssertionError, match="neither type nor any_of"):
        assert_gemini_typed({"type": "OBJECT", "properties": {"t": {"any_of": [{}, {}]}}})
