"""ToolParameter lists <-> JSON Schema, and argument validation with JSON paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolmesh import (
    ArgumentError,
    SchemaError,
    ToolParameter,
    parameters_to_schema,
    schema_to_parameters,
)
from toolmesh.schema import (
    Validator,
    compile_validator,
    is_lossless,
    ref_cycle,
    validates_as_2020_12,
)

P = ToolParameter

PARAMETERS = [
    P(name="path", type="string", description="File path", required=True),
    P(name="count", type="integer", description="How many", enum=["1", "2", "3"]),
    P(name="ratio", type="number", description="", enum=["0.5", "1"]),
    P(name="force", type="boolean", description="Overwrite"),
    P(
        name="owner",
        type="object",
        description="Who",
        required=True,
        properties={
            "name": P(name="name", type="string", description="Full name", required=True),
            "roles": P(
                name="roles",
                type="array",
                description="Roles held",
                items=P(name="items", type="string", description="", enum=["admin", "user"]),
            ),
        },
    ),
    P(
        name="matrix",
        type="array",
        description="",
        items=P(
            name="items",
            type="array",
            description="",
            items=P(name="items", type="integer", description=""),
        ),
    ),
]

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "File path"},
        "count": {"type": "integer", "description": "How many", "enum": [1, 2, 3]},
        "ratio": {"type": "number", "enum": [0.5, 1]},
        "force": {"type": "boolean", "description": "Overwrite"},
        "owner": {
            "type": "object",
            "description": "Who",
            "properties": {
                "name": {"type": "string", "description": "Full name"},
                "roles": {
                    "type": "array",
                    "description": "Roles held",
                    "items": {"type": "string", "enum": ["admin", "user"]},
                },
            },
            "required": ["name"],
        },
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    },
    "required": ["path", "owner"],
}


def test_parameters_to_schema() -> None:
    assert parameters_to_schema(PARAMETERS) == SCHEMA


def test_schema_to_parameters() -> None:
    assert schema_to_parameters(SCHEMA) == PARAMETERS


def test_round_trip_is_lossless_both_ways() -> None:
    assert schema_to_parameters(parameters_to_schema(PARAMETERS)) == PARAMETERS
    assert parameters_to_schema(schema_to_parameters(SCHEMA)) == SCHEMA
    assert is_lossless(SCHEMA)


def test_empty_parameter_list() -> None:
    assert parameters_to_schema([]) == {"type": "object", "properties": {}}
    assert schema_to_parameters({"type": "object"}) == []


def test_richer_schemas_convert_as_far_as_parameters_can_say() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "Pet": {
                "type": "object",
                "properties": {"kind": {"enum": ["cat", "dog"]}},
                "required": ["kind"],
            }
        },
        "properties": {
            "pet": {"$ref": "#/$defs/Pet"},
            "nickname": {
                "anyOf": [{"type": "string", "description": "Short name"}, {"type": "null"}]
            },
            "age": {"type": ["integer", "null"], "minimum": 0},
        },
        "required": ["pet"],
    }
    params = schema_to_parameters(schema)
    assert [p.name for p in params] == ["pet", "nickname", "age"]
    assert params[0].type == "object" and params[0].required
    assert params[0].properties is not None and params[0].properties["kind"].enum == ["cat", "dog"]
    assert params[1].type == "string" and params[1].description == "Short name"
    assert params[2].type == "integer" and not params[2].required
    assert not is_lossless(schema)


def test_recursive_schema_does_not_loop() -> None:
    schema = {
        "type": "object",
        "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
        "properties": {"root": {"$ref": "#/$defs/Node"}},
    }
    params = schema_to_parameters(schema)
    assert params[0].name == "root" and params[0].type == "object"


def _count(parameters: Any) -> int:
    return sum(
        1 + _count((p.properties or {}).values()) + _count([p.items] if p.items else [])
        for p in parameters
    )


def test_schema_referring_to_itself_twice_expands_each_ref_once_per_path() -> None:
    # Expanding the recursion down to the depth limit took 2**32 steps (Optional["Tree"] twice).
    tree = {"anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "null"}]}
    schema = {
        "type": "object",
        "$defs": {
            "Tree": {
                "type": "object",
                "description": "A tree",
                "properties": {"left": tree, "right": tree, "label": {"type": "string"}},
            }
        },
        "properties": {"root": {"$ref": "#/$defs/Tree"}},
    }
    [root] = schema_to_parameters(schema)
    assert root.properties is not None and list(root.properties) == ["left", "right", "label"]
    left = root.properties["left"]
    # The recursive point: an object, described, but not nested again.
    assert (left.type, left.description, left.properties) == ("object", "A tree", None)
    assert not is_lossless(schema)


def test_shared_refs_that_fan_out_stay_bounded() -> None:
    # Twelve definitions, each referring to all of them: every simple path is a distinct
    # expansion (12! of them) unless conversion stops expanding refs after a budget.
    names = [f"D{i}" for i in range(12)]
    schema = {
        "type": "object",
        "$defs": {
            n: {"type": "object", "properties": {m: {"$ref": f"#/$defs/{m}"} for m in names}}
            for n in names
        },
        "properties": {"root": {"$ref": "#/$defs/D0"}},
    }
    [root] = schema_to_parameters(schema)
    assert root.properties is not None and len(root.properties) == 12
    assert _count([root]) < 20_000


def test_bad_ref_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="does not point"):
        schema_to_parameters({"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}})


@pytest.mark.parametrize(
    ("arguments", "path", "message"),
    [
        ({}, "$.path", "missing required property 'path'"),
        ({"path": 3, "owner": {"name": "a"}}, "$.path", "must be string"),
        ({"path": "p", "owner": {}}, "$.owner.name", "missing required property 'name'"),
        (
            {"path": "p", "owner": {"name": "a", "roles": ["root"]}},
            "$.owner.roles[0]",
            "must be one of",
        ),
        ({"path": "p", "owner": {"name": "a"}, "count": 7}, "$.count", "must be one of"),
        (
            {"path": "p", "owner": {"name": "a"}, "matrix": [[1], [2, "x"]]},
            "$.matrix[1][1]",
            "must be integer",
        ),
        ({"path": "p", "owner": "me"}, "$.owner", "must be object"),
    ],
)
def test_validation_errors_name_the_path(
    arguments: dict[str, Any], path: str, message: str
) -> None:
    validator = Validator(SCHEMA)
    with pytest.raises(ArgumentError) as caught:
        validator(arguments)
    assert caught.value.path == path
    assert message in caught.value.reason


def test_valid_arguments_pass() -> None:
    Validator(SCHEMA)(
        {"path": "p", "owner": {"name": "a", "roles": ["admin"]}, "count": 2, "matrix": [[1]]}
    )


def test_unexpected_property_is_named() -> None:
    validator = Validator(
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    )
    with pytest.raises(ArgumentError, match="unexpected property 'b'") as caught:
        validator({"a": "x", "b": 1})
    assert caught.value.path == "$.b"


def test_remote_refs_are_never_fetched() -> None:
    with pytest.raises(SchemaError, match="remote \\$ref"):
        compile_validator(
            {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/schema.json"}}}
        )({"x": 1})


@pytest.mark.parametrize("scheme", ["file", "ftp", "data", "jar"])
def test_refs_of_any_scheme_are_never_opened(tmp_path: Path, scheme: str) -> None:
    """Only http, https and relative refs were refused: fastjsonschema opened the others with
    urllib, and a local file's content showed up in validation errors."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"enum": ["TOP-SECRET"]}')
    ref = secret.as_uri() if scheme == "file" else f"{scheme}:{secret}"
    schemas = [
        {"type": "object", "properties": {"a": {"$ref": ref}}},
        {"type": "object", "propertyNames": {"$ref": ref}},
    ]
    if scheme == "file":  # a relative ref against a file: base
        schemas.append(
            {"$id": tmp_path.as_uri() + "/", "properties": {"a": {"$ref": "secret.json"}}}
        )
    for schema in schemas:
        with pytest.raises(SchemaError, match="remote \\$ref") as caught:
            compile_validator(schema)({"a": "x", "guess": 1})
        assert "TOP-SECRET" not in str(caught.value)


def test_enum_text_that_would_be_nan_or_infinity_stays_text() -> None:
    import json

    numbers = ToolParameter(
        name="x", type="number", description="d", enum=["nan", "inf", "-inf", "1.5"]
    )
    schema = parameters_to_schema([numbers])
    json.dumps(schema, allow_nan=False)  # valid JSON
    assert schema["properties"]["x"]["enum"] == ["nan", "inf", "-inf", 1.5]


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({"x-y": {"a b": "s"}}, '$["x-y"]["a b"]'),
        ({"x-y": {"k.z": "s"}}, '$["x-y"]["k.z"]'),  # one key with a dot, not two keys
        ({"x-y": {"[0]": "s"}}, '$["x-y"]["[0]"]'),
        ({"free": {"k.1": "s"}}, '$.free["k.1"]'),
        ({"free": {"ok": "s"}}, "$.free.ok"),
        ({"rows": [{"c d": 1}, {"c d": "s"}]}, '$.rows[1]["c d"]'),
    ],
)
def test_error_paths_quote_keys_that_are_no_identifiers(
    arguments: dict[str, Any], path: str
) -> None:
    """fastjsonschema joins keys unescaped (``data.x-y.k.z``); the path is read off the value."""
    integer = {"type": "integer"}
    validator = Validator(
        {
            "type": "object",
            "properties": {
                "x-y": {
                    "type": "object",
                    "properties": {"a b": integer, "k.z": integer, "[0]": integer},
                },
                "free": {"type": "object", "additionalProperties": integer},
                "rows": {"type": "array", "items": {"properties": {"c d": integer}}},
            },
        }
    )
    with pytest.raises(ArgumentError, match="must be integer") as caught:
        validator(arguments)
    assert caught.value.path == path


TAGGED = {
    "type": "object",
    "properties": {
        "pet": {
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
            "discriminator": {
                "propertyName": "kind",
                "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
            },
        },
        "maybe": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"type": "null"}]},
        "counts": {"type": "object", "propertyNames": {"enum": ["a", "b"]}},
    },
    "$defs": {
        "Cat": {
            "type": "object",
            "properties": {"kind": {"const": "cat"}, "meows": {"type": "integer"}},
            "required": ["kind", "meows"],
        },
        "Dog": {
            "type": "object",
            "properties": {"kind": {"const": "dog"}, "barks": {"type": "number"}},
            "required": ["kind", "barks"],
        },
    },
}


@pytest.mark.parametrize(
    ("arguments", "path", "reason"),
    [
        ({"pet": {"kind": "cow"}}, "$.pet.kind", "'cow' is not one of 'cat', 'dog'"),
        ({"pet": {"barks": 1}}, "$.pet.kind", "missing required property 'kind' (one of"),
        ({"pet": {"kind": "dog", "barks": "loud"}}, "$.pet.barks", "must be number"),
        ({"maybe": {"kind": "cat", "meows": 1.5}}, "$.maybe.meows", "must be integer"),
        ({"counts": {"a": 1, "c": 2}}, "$.counts", "key 'c' is not allowed: must be one of"),
    ],
)
def test_unions_and_key_rules_name_what_is_wrong_inside(
    arguments: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(ArgumentError) as caught:
        Validator(TAGGED)(arguments)
    assert caught.value.path == path
    assert caught.value.reason.startswith(reason), caught.value.reason
    Validator(TAGGED)({"pet": {"kind": "cat", "meows": 1}, "maybe": None, "counts": {"b": 1}})


# -- output checks: format as an annotation, and which schemas read alike in both drafts --------


def test_a_validator_without_formats_takes_format_as_an_annotation() -> None:
    schema = {"type": "object", "properties": {"mail": {"type": "string", "format": "email"}}}
    Validator(schema, formats=False)({"mail": "not an address"})
    with pytest.raises(ArgumentError, match="email"):
        Validator(schema)({"mail": "not an address"})


@pytest.mark.parametrize(
    ("schema", "alike"),
    [
        ({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, True),
        ({"$defs": {"X": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/X"}}}, True),
        ({"properties": {"x": {"$ref": "#/$defs/X", "description": "an x"}}}, True),
        ({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object"}}}, True),
        ({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}, True),
        ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}, True),
        (True, True),
        ({"properties": {"p": {"type": "array", "prefixItems": [{"type": "integer"}]}}}, False),
        ({"properties": {"p": {"type": "array", "items": [{"type": "integer"}]}}}, False),
        ({"properties": {"x": {"$ref": "#/$defs/X", "minLength": 2}}}, False),
        ({"type": "object", "unevaluatedProperties": False}, False),
        ({"dependentRequired": {"a": ["b"]}}, False),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, False),
        ({"$schema": 7}, False),
        ({"$schema": "http://json-schema.org/draft-07/schema", "type": "object"}, True),
        # a $schema jsonschema does not know gets 2020-12 there, draft-04 here ("draft-04" in it)
        ({"$schema": "http://json-schema.org/draft-04/hyper-schema#", "type": "integer"}, False),
        ({"type": "string", "pattern": "^[a-z]+$"}, False),  # $: \\Z here, Python's $ there
        ({"propertyNames": {"pattern": "^a$"}}, False),
        ({"type": "string", "pattern": "^[a-z]+\\Z"}, True),
        ({"type": "string", "pattern": "^costs \\$"}, True),  # an escaped $ is read alike
        ({"properties": {"pattern": {"type": "string"}}}, True),
        ({"type": "integer", "multipleOf": 3}, False),
        ({"type": "number", "multipleOf": 0.1}, False),
        ({"type": "string", "contentEncoding": "base64"}, False),
        ({"type": "string", "contentMediaType": "application/json"}, False),
        ({"items": {"id": "sub", "$defs": {}, "items": {"$ref": "#/$defs/y"}}}, False),
        ({"properties": {"id": {"type": "string"}}, "required": ["id"]}, True),
    ],
)
def test_which_schemas_our_validator_reads_as_2020_12_does(schema: Any, alike: bool) -> None:
    assert validates_as_2020_12(schema) is alike


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ({"type": "string", "pattern": "^a$"}, "a\n"),
        ({"propertyNames": {"pattern": "^a$"}}, {"a\n": 1}),
        ({"multipleOf": 0.1}, 0.3),
        ({"multipleOf": 0.5}, 1e308),
        ({"type": "integer", "multipleOf": 3}, 1e308),
        ({"multipleOf": 2**70}, 5e-324),
        ({"$schema": "http://json-schema.org/draft-04/hyper-schema#", "type": "integer"}, 1.0),
        ({"type": "string", "contentEncoding": "base64"}, "not base64!"),
        ({"type": "string", "contentMediaType": "application/json"}, "{"),
        (
            {
                "$defs": {"y": {"type": "integer"}},
                "items": {
                    "id": "sub",
                    "$defs": {"y": {"type": "string"}},
                    "items": {"$ref": "#/$defs/y"},
                },
            },
            [[1]],
        ),
    ],
)
@pytest.mark.filterwarnings("ignore:The metaschema specified by \\$schema was not found")
def test_where_our_validator_and_the_sdks_disagree_the_sdk_decides(
    schema: dict[str, Any], instance: Any
) -> None:
    """The MCP SDK checks structured content with jsonschema (2020-12 unless $schema says
    otherwise, format an annotation); each pair here is judged otherwise by our validator."""
    validators = pytest.importorskip("jsonschema.validators")
    theirs = validators.validator_for(schema)(schema).is_valid(instance)
    try:
        Validator(schema, formats=False)(instance)
        ours = True
    except ArgumentError:
        ours = False
    assert ours is not theirs
    assert validates_as_2020_12(schema) is False


def test_compiling_leaves_the_schema_as_it_was() -> None:
    schema = {
        "$id": "https://example.com/order.json",
        "$defs": {"qty": {"type": "integer"}},
        "type": "object",
        "properties": {"qty": {"$ref": "#/$defs/qty"}},
    }
    Validator(schema)({"qty": 1})
    with pytest.raises(ArgumentError, match="integer"):
        Validator(schema, formats=False)({"qty": "one"})
    assert schema["properties"] == {"qty": {"$ref": "#/$defs/qty"}}


# -- cycles and depth: SchemaError (or ArgumentError), never RecursionError ---------------------


def _with_q(q: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"q": q}, "$defs": defs}


REF_CYCLES = [
    # S = allOf[T], T = allOf[S]: an MCP server's tool with it crashed the toolkit's start
    _with_q(
        {"$ref": "#/$defs/S"},
        {"S": {"allOf": [{"$ref": "#/$defs/T"}]}, "T": {"allOf": [{"$ref": "#/$defs/S"}]}},
    ),
    _with_q(
        {"anyOf": [{"$ref": "#/$defs/U"}, {"type": "null"}]},
        {"U": {"oneOf": [{"$ref": "#/$defs/V"}]}, "V": {"anyOf": [{"$ref": "#/$defs/U"}]}},
    ),
    _with_q({"$ref": "#/$defs/A"}, {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}),
    _with_q({"$ref": "#/$defs/A"}, {"A": {"description": "a", "$ref": "#/$defs/A"}}),
]


@pytest.mark.parametrize("schema", REF_CYCLES)
def test_a_ref_cycle_that_never_reaches_a_schema_is_a_schema_error(schema: Any) -> None:
    with pytest.raises(SchemaError, match=r"\$ref '#/\$defs/[A-Z]' (leads back|refers) to itself"):
        schema_to_parameters(schema)
    assert not is_lossless(schema)
    with pytest.raises(SchemaError, match=r"\$ref '#/\$defs/[A-Z]' leads back to itself"):
        compile_validator(schema)  # fastjsonschema took it, then recursed on every call
    assert ref_cycle(schema) is not None


def test_a_cycle_off_the_parameters_path_fails_when_the_schema_is_compiled() -> None:
    # Two allOf branches: not collapsed into a parameter, so only the validator meets the cycle.
    schema = _with_q(
        {"allOf": [{"$ref": "#/$defs/S"}, {"minLength": 1}]},
        {"S": {"not": {"allOf": [{"$ref": "#/$defs/S"}, {}]}}},
    )
    assert [p.name for p in schema_to_parameters(schema)] == ["q"]
    assert ref_cycle(schema) == "#/$defs/S"
    with pytest.raises(SchemaError, match=r"\$ref '#/\$defs/S' leads back to itself"):
        Validator(schema)({"q": "x"})  # the pipeline: a tool_error, "tool schema is broken"


def test_recursive_types_are_no_cycle() -> None:
    # A property or an item between the references: each step checks a smaller value.
    tree = _with_q(
        {"$ref": "#/$defs/T"},
        {
            "T": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]},
            "N": {"type": "object", "properties": {"kids": {"items": {"$ref": "#/$defs/T"}}}},
        },
    )
    assert ref_cycle(tree) is None
    compile_validator(tree)({"q": {"kids": [None, {"kids": []}]}})
    assert ref_cycle({"$ref": "https://127.0.0.1:9/x.json"}) is None


def test_a_schema_that_contains_itself_as_python_objects_is_a_schema_error() -> None:
    looped: dict[str, Any] = {}
    looped["allOf"] = [looped]
    schema = {"type": "object", "properties": {"q": looped}}
    with pytest.raises(SchemaError, match="a union contains itself"):
        schema_to_parameters(schema)
    with pytest.raises(SchemaError, match="cannot compile schema: it contains itself"):
        compile_validator(schema)
    assert ref_cycle(schema) is None  # no $ref in it; and the walk ends


def _nested(levels: int, wrap: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = wrap(schema)
    return {"type": "object", "properties": {"q": schema}}


def _all_of(inner: Any) -> dict[str, Any]:
    return {"allOf": [inner]}


def _properties(inner: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": inner}}


def _items(inner: Any) -> dict[str, Any]:
    return {"type": "array", "items": inner}


@pytest.mark.parametrize("levels", [120, 200, 5000])
@pytest.mark.parametrize("wrap", [_all_of, _properties, _items])
def test_deep_schemas_are_schema_errors_not_recursion(levels: int, wrap: Any) -> None:
    schema = _nested(levels, wrap)
    if wrap is _all_of and levels > 256:
        with pytest.raises(SchemaError, match="nest more than 256 deep"):
            schema_to_parameters(schema)
    else:  # nesting stops at 32 levels: the exact schema travels beside the parameters
        assert [p.name for p in schema_to_parameters(schema)] == ["q"]
    with pytest.raises(SchemaError, match="cannot compile schema: it is nested too deeply"):
        compile_validator(schema)


def test_a_deep_enum_value_is_a_schema_error() -> None:
    value: Any = "x"
    for _ in range(5000):
        value = [value]
    with pytest.raises(SchemaError, match="an enum value cannot be used: it is nested too deeply"):
        schema_to_parameters({"type": "object", "properties": {"q": {"enum": [value]}}})


def test_deep_parameters_are_schema_errors_not_recursion() -> None:
    parameter = P(name="q", type="string", description="")
    for _ in range(5000):
        parameter = P(name="q", type="array", description="", items=parameter)
    with pytest.raises(SchemaError, match="parameter 'q' is nested more than 100 levels deep"):
        parameters_to_schema([parameter])


def test_values_nested_deeper_than_the_stack_are_argument_errors() -> None:
    # A recursive schema is checked a call deeper per level of the value, and explaining a
    # refusal follows the bad value down too.
    chain = _with_q(
        {"$ref": "#/$defs/T"},
        {
            "T": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]},
            "N": {"type": "object", "properties": {"c": {"$ref": "#/$defs/T"}}},
        },
    )
    validator = Validator(chain)
    for levels, path in ((100, "$.q" + ".c" * 100), (600, "$"), (5000, "$")):
        value: Any = 5
        for _ in range(levels):
            value = {"c": value}
        with pytest.raises(ArgumentError) as caught:
            validator({"q": value})
        assert caught.value.path == path
