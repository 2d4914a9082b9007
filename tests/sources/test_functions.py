"""Tools from Python functions: schema inference, docstrings, context, sync/async, results."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Literal, NotRequired, Optional, Required, TypedDict

import pytest
from pydantic import BaseModel, Field, field_validator

from toolmesh import (
    ArgumentError,
    ConfigError,
    Output,
    ToolContext,
    ToolErrorCode,
    Toolkit,
    ToolResult,
    tool,
)
from toolmesh.sources.functions import function_schema


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    width: float
    label: str = "box"


class Address(BaseModel):
    street: str
    zip_code: Annotated[str, Field(description="Postal code")]


def _props(fn: Any) -> dict[str, Any]:
    return dict(function_schema(fn)["properties"])


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (list[str], {"type": "array", "items": {"type": "string"}}),
        (set[int], {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict, {"type": "object"}),
        (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045 - the spelling under test
        (int | None, {"type": ["integer", "null"]}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
        (Color, {"type": "string", "enum": ["red", "blue"]}),
        (Any, {}),
        (Annotated[str, "A note"], {"type": "string", "description": "A note"}),
    ],
)
def test_simple_hints(annotation: Any, expected: dict[str, Any]) -> None:
    def f(value):  # type: ignore[no-untyped-def]
        return value

    f.__annotations__ = {"value": annotation}
    assert _props(f)["value"] == expected


def test_structured_hints_become_nested_objects() -> None:
    def f(point: Point, box: Box, address: Address, boxes: list[Box]) -> None: ...

    schema = function_schema(f)
    props = schema["properties"]
    assert props["point"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    }
    assert props["box"]["properties"]["width"] == {"type": "number"}
    assert props["box"]["required"] == ["width"]
    assert props["address"]["properties"]["zip_code"]["description"] == "Postal code"
    assert props["boxes"]["items"]["properties"]["width"] == {"type": "number"}
    assert not any("title" in v for v in props.values())


class Person(BaseModel):
    home: Address
    work: Address | None = None


def test_nested_models_share_hoisted_defs() -> None:
    def f(person: Person) -> None: ...

    schema = function_schema(f)
    assert schema["properties"]["person"]["properties"]["home"] == {"$ref": "#/$defs/Address"}
    assert schema["$defs"]["Address"]["required"] == ["street", "zip_code"]


def test_constraints_from_field() -> None:
    def f(n: Annotated[int, Field(ge=1, le=9, description="Digit")]) -> None: ...

    assert _props(f)["n"] == {"type": "integer", "minimum": 1, "maximum": 9, "description": "Digit"}


def test_defaults_make_parameters_optional() -> None:
    def f(a: str, b: int = 3, c: Color = Color.RED, d: str | None = None) -> None: ...

    schema = function_schema(f)
    assert schema["required"] == ["a"]
    assert schema["properties"]["b"]["default"] == 3
    assert schema["properties"]["c"]["default"] == "red"
    assert schema["properties"]["d"]["default"] is None
    assert schema["additionalProperties"] is False


def test_kwargs_allow_extra_arguments() -> None:
    def f(a: str, **rest: Any) -> None: ...

    assert "additionalProperties" not in function_schema(f)


def test_varargs_are_refused() -> None:
    def f(*items: str) -> None: ...

    with pytest.raises(ConfigError, match=r"\*items"):
        tool(f)


GOOGLE = """Fetch the weather.

    Longer explanation of the tool.

    Args:
        city: The city name.
        days: How many days ahead.
    """
NUMPY = """Fetch the weather.

    Longer explanation of the tool.

    Parameters
    ----------
    city : str
        The city name.
    days : int
        How many days ahead.
    """
SPHINX = """Fetch the weather.

    Longer explanation of the tool.

    :param city: The city name.
    :param days: How many days ahead.
    """


@pytest.mark.parametrize("doc", [GOOGLE, NUMPY, SPHINX], ids=["google", "numpy", "sphinx"])
def test_docstring_styles(doc: str) -> None:
    def weather(city: str, days: int = 1) -> str:
        return city

    weather.__doc__ = doc
    made = tool(weather)
    assert made.description == "Fetch the weather.\n\nLonger explanation of the tool."
    props = made.input_schema["properties"]
    assert props["city"]["description"] == "The city name."
    assert props["days"]["description"] == "How many days ahead."


def test_name_and_description_overrides() -> None:
    made = tool(lambda x: x, name="identity", description="Returns x")
    assert (made.name, made.description) == ("identity", "Returns x")


def test_lambda_needs_a_name() -> None:
    with pytest.raises(ConfigError, match="name="):
        tool(lambda x: x)


def test_output_schema_from_return_annotation() -> None:
    @tool
    def where() -> Address:
        """Where."""
        return Address(street="Main", zip_code="1")

    assert where.output_schema is not None
    assert where.output_schema["properties"]["street"] == {"type": "string"}


def test_decorated_tool_is_still_callable() -> None:
    @tool
    def double(n: int) -> int:
        """Double."""
        return n * 2

    assert double(4) == 8


async def test_context_is_injected_and_hidden() -> None:
    seen: dict[str, Any] = {}

    @tool
    async def spy(ctx: ToolContext, word: str) -> str:
        """Spy."""
        seen["tool"] = ctx.tool_name
        seen["state"] = ctx.state
        seen["remaining"] = ctx.remaining
        ctx.status("working")
        return word

    @tool
    def named(ctx, word: str) -> str:  # type: ignore[no-untyped-def]
        """Context by name."""
        return f"{ctx.tool_name}:{word}"

    assert list(spy.input_schema["properties"]) == ["word"]
    assert list(named.input_schema["properties"]) == ["word"]
    kit = Toolkit(spy, named)
    result = await kit.execute("spy", {"word": "hi"})
    assert result.output == "hi" and [e.kind for e in result.events] == ["status"]
    assert seen["tool"] == "spy" and seen["state"] == {"context": {}}
    assert 0 < seen["remaining"] <= 30
    assert (await kit.execute("named", {"word": "x"})).output == "named:x"


async def test_return_values_are_mapped() -> None:
    @tool
    def as_text() -> str:
        """t"""
        return "plain"

    @tool
    def as_model() -> Address:
        """m"""
        return Address(street="Main", zip_code="1")

    @tool
    def as_dataclass() -> Box:
        """d"""
        return Box(width=2.0)

    @tool
    def as_output() -> Output:
        """o"""
        return Output({"n": 1}, text="one", metadata={"k": "v"})

    @tool
    def as_result() -> ToolResult:
        """r"""
        return ToolResult(
            success=False, tool_name="", error="nope", error_code="tool_error", duration_ms=0
        )

    kit = Toolkit(as_text, as_model, as_dataclass, as_output, as_result)
    assert (await kit.execute("as_text")).output == "plain"
    assert (await kit.execute("as_model")).data == {"street": "Main", "zip_code": "1"}
    assert (await kit.execute("as_dataclass")).data == {"width": 2.0, "label": "box"}
    output = await kit.execute("as_output")
    assert (output.data, output.output, output.metadata) == ({"n": 1}, "one", {"k": "v"})
    passed = await kit.execute("as_result")
    assert passed.error == "nope" and passed.tool_name == "as_result"


async def test_arguments_become_the_hinted_python_values() -> None:
    @tool
    def describe(color: Color, box: Box, address: Address, points: list[Point]) -> str:
        """Describe."""
        assert isinstance(color, Color) and isinstance(box, Box) and isinstance(address, Address)
        return f"{color.value} {box.width} {address.street} {points[0]['x']}"

    kit = Toolkit(describe)
    result = await kit.execute(
        "describe",
        {
            "color": "blue",
            "box": {"width": 1.5},
            "address": {"street": "Elm", "zip_code": "2"},
            "points": [{"x": 1, "y": 2}],
        },
    )
    assert result.output == "blue 1.5 Elm 1"


async def test_sync_and_async_functions_run_and_fail_alike() -> None:
    @tool
    def sync_fail() -> None:
        """s"""
        raise KeyError("missing")

    @tool
    async def async_fail() -> None:
        """a"""
        raise RuntimeError("broken")

    kit = Toolkit(sync_fail, async_fail)
    assert (await kit.execute("sync_fail")).error == "KeyError: 'missing'"
    failed = await kit.execute("async_fail")
    assert failed.error == "RuntimeError: broken" and failed.error_code == ToolErrorCode.TOOL_ERROR


def test_tool_options() -> None:
    @tool(
        name="deploy",
        capabilities=["ops::deploy"],
        tags=["ops"],
        idempotent=True,
        defer_loading=True,
    )
    def deploy_it(env: str) -> str:
        """Deploy."""
        return env

    d = deploy_it.definition
    assert (d.name, d.capabilities, d.tags, d.idempotent, d.defer_loading) == (
        "deploy",
        ["ops::deploy"],
        ["ops"],
        True,
        True,
    )
    with pytest.raises(ConfigError, match="capability"):
        tool(deploy_it.__wrapped__, capabilities=["bad tag"])


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_int_enum_defaults_are_json_values() -> None:
    def f(level: Level = Level.HIGH) -> None:
        """Set the level."""

    schema = function_schema(f)
    assert schema["properties"]["level"] == {"type": "integer", "enum": [1, 2], "default": 2}
    assert json.dumps(schema)  # JSON all the way down: providers receive it as it is


def test_one_line_and_sectioned_docstrings_agree_on_the_summary() -> None:
    def one(x: int) -> int:
        """Double a number: the fast path."""
        return 2 * x

    def sectioned(x: int) -> int:
        """Double a number: the fast path.

        Args:
            x: The number.
        """
        return 2 * x

    assert tool(one).description == "Double a number: the fast path."
    assert tool(sectioned).description == "Double a number: the fast path."
    assert tool(sectioned).input_schema["properties"]["x"]["description"] == "The number."


def test_tools_of_one_shape_share_parameters_but_not_names() -> None:
    def make(i: int) -> Any:
        def fn(text: str) -> str:
            return text

        fn.__name__ = f"tool_{i}"
        return tool(fn)

    first, second = make(1), make(2)
    assert first.definition.input_parameters == second.definition.input_parameters
    assert (first.name, second.name) == ("tool_1", "tool_2")
    assert first.input_schema == second.input_schema


class Tree(BaseModel):
    left: Optional[Tree] = None  # noqa: UP045 - the spelling QA found hanging
    right: Optional[Tree] = None  # noqa: UP045
    label: str = ""


class Node(BaseModel):
    name: str
    parent: Node | None = None
    kids: list[Node] = []


def _depth(tree: Tree | None) -> int:
    return 0 if tree is None else 1 + max(_depth(tree.left), _depth(tree.right))


async def test_models_referring_to_themselves_twice_make_tools() -> None:
    # Each used to expand its recursion to the depth limit: 2**32 steps, a hang in @tool.
    @tool
    def grow(tree: Tree) -> int:
        """Grow a tree."""
        return _depth(tree)

    @tool
    def family(node: Node) -> list[str]:
        """Walk a family."""
        return [node.name, *(kid.name for kid in node.kids)]

    [tree] = grow.definition.input_parameters
    assert tree.properties is not None and set(tree.properties) == {"left", "right", "label"}
    assert tree.properties["left"].type == "object"  # where the recursion is cut
    [node] = family.definition.input_parameters
    assert node.properties is not None and node.properties["kids"].type == "array"
    # The exact schema, recursion and all, is what calls are validated and exported with.
    assert grow.input_schema["properties"]["tree"] == {"$ref": "#/$defs/Tree"}
    assert grow.definition.input_schema == grow.input_schema

    kit = Toolkit(grow, family)
    three = {"left": {"right": {"label": "leaf"}}, "right": {}}
    assert (await kit.execute("grow", {"tree": three})).data == 3
    bad = await kit.execute("grow", {"tree": {"left": {"right": {"label": 5}}}})
    assert bad.error_code == ToolErrorCode.INVALID_ARGUMENTS  # validated all the way down
    assert bad.metadata["path"] == "$.tree.left.right.label"  # through each Optional[Tree]
    kin = {"name": "a", "parent": {"name": "p"}, "kids": [{"name": "b", "kids": [{"name": "c"}]}]}
    assert (await kit.execute("family", {"node": kin})).data == ["a", "b"]


async def test_omitted_positional_only_parameters_take_their_defaults() -> None:
    @tool
    def posonly(a: int = 1, b: int = 2, /, c: int = 3) -> str:
        """Positional-only parameters."""
        return f"a={a} b={b} c={c}"

    @tool
    def with_context(ctx: ToolContext, /, word: str = "hi") -> str:
        """The context may be positional-only too."""
        return f"{ctx.tool_name}:{word}"

    kit = Toolkit(posonly, with_context)
    assert (await kit.execute("posonly", {"b": 5})).data == "a=1 b=5 c=3"
    assert (await kit.execute("posonly", {"a": 4, "c": 6})).data == "a=4 b=2 c=6"
    assert (await kit.execute("posonly", {})).data == "a=1 b=2 c=3"
    assert (await kit.execute("with_context", {})).data == "with_context:hi"


class Partial(TypedDict):
    x: int
    y: NotRequired[str]
    note: NotRequired[Annotated[str, "A note"]]


class Sparse(TypedDict, total=False):
    x: Required[int]
    y: str


async def test_typed_dict_required_and_not_required_items() -> None:
    @tool
    def both(partial: Partial, sparse: Sparse) -> str:
        """TypedDicts with marked items."""
        return ",".join(sorted({**partial, **sparse}))

    props = both.input_schema["properties"]
    assert props["partial"] == {
        "type": "object",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "string"},
            "note": {"type": "string", "description": "A note"},
        },
        "required": ["x"],
    }
    assert props["sparse"]["required"] == ["x"]
    kit = Toolkit(both)
    assert (await kit.execute("both", {"partial": {"x": 1}, "sparse": {"x": 2}})).data == "x"
    missing = await kit.execute("both", {"partial": {"x": 1}, "sparse": {"y": "s"}})
    assert missing.error_code == ToolErrorCode.INVALID_ARGUMENTS


async def test_generator_items_become_a_list() -> None:
    closed: list[str] = []

    @tool
    def count(n: int) -> Iterator[int]:
        """Count."""
        yield from range(n)

    @tool
    async def acount(n: int) -> AsyncIterator[int]:
        """Count, asynchronously."""
        for i in range(n):
            yield i

    @tool
    async def abroken() -> AsyncIterator[int]:
        """Fail half way."""
        try:
            yield 1
            raise ValueError("half way")
        finally:
            closed.append("abroken")

    kit = Toolkit(count, acount, abroken)
    assert (await kit.execute("count", {"n": 3})).data == [0, 1, 2]
    assert (await kit.execute("acount", {"n": 3})).data == [0, 1, 2]
    failed = await kit.execute("abroken")
    assert failed.error == "ValueError: half way" and closed == ["abroken"]


def _repeat(times: int, text: str) -> str:
    """Repeat a text.

    Args:
        times: How often.
        text: What to repeat.
    """
    return text * times


class _Doubler:
    """Doubles numbers."""

    def __call__(self, x: int) -> int:
        """Double x.

        Args:
            x: The number.
        """
        return 2 * x


class _AsyncDoubler:
    async def __call__(self, x: int) -> int:
        return 2 * x


async def test_partials_and_callable_instances_make_tools() -> None:
    import functools

    twice = tool(functools.partial(_repeat, 2), name="twice")
    assert twice.input_schema["properties"] == {
        "text": {"type": "string", "description": "What to repeat."}
    }
    assert twice.description == "Repeat a text."  # not functools.partial's own docstring
    zs = tool(functools.partial(_repeat, text="z"), name="zs")
    assert zs.input_schema["required"] == ["times"]
    double = tool(_Doubler(), name="double")
    assert (double.description, double.input_schema["required"]) == ("Double x.", ["x"])
    kit = Toolkit(twice, zs, double, tool(_AsyncDoubler(), name="adouble"))
    assert (await kit.execute("twice", {"text": "ab"})).data == "abab"
    assert (await kit.execute("zs", {"times": 3})).data == "zzz"
    assert (await kit.execute("double", {"x": 4})).data == 8
    assert (await kit.execute("adouble", {"x": 5})).data == 10  # awaited, not a coroutine


async def test_a_field_as_the_default_gives_its_constraints_default_and_factory() -> None:
    def label(
        count: int = Field(default=3, ge=1, description="How many"),
        tags: list[str] = Field(default_factory=list),  # noqa: B008 - the spelling under test
    ) -> str:
        """Label."""
        tags.append("new")
        return f"{count}:{tags}"

    made = tool(label)
    assert made.input_schema["properties"]["count"] == {
        "default": 3,
        "description": "How many",
        "minimum": 1,
        "type": "integer",
    }
    assert "required" not in made.input_schema
    assert "default" not in made.input_schema["properties"]["tags"]
    kit = Toolkit(made)
    assert (await kit.execute("label", {})).data == "3:['new']"
    assert (await kit.execute("label", {})).data == "3:['new']"  # a fresh list per call
    refused = await kit.execute("label", {"count": 0})
    assert refused.metadata["path"] == "$.count"


def test_docstrings_opening_with_a_section_or_with_keyword_args() -> None:
    def sections_only(a: int) -> None:
        """
        Args:
            a: The a.
        """

    def keywords(*, a: int, b: int = 1) -> None:
        """Summary.

        Keyword Args:
            a: The a.
            b: The b.
        """

    made = tool(sections_only)
    assert made.description == "sections_only"
    assert made.input_schema["properties"]["a"]["description"] == "The a."
    made = tool(keywords)
    assert made.description == "Summary."
    props = made.input_schema["properties"]
    assert (props["a"]["description"], props["b"]["description"]) == ("The a.", "The b.")


async def test_string_annotations_may_name_classes_local_to_the_caller() -> None:
    """This module has ``from __future__ import annotations``: hints are strings, and a model
    defined in this function is in no module's namespace."""

    class Local(BaseModel):
        x: int

    @tool
    def take(item: Local) -> int:
        """Take."""
        return item.x

    assert take.input_schema["properties"]["item"]["required"] == ["x"]
    assert (await Toolkit(take).execute("take", {"item": {"x": 4}})).data == 4


# -- discriminated unions, $defs of one name, key types, ints, Literal members, defaults ---------


class Cat(BaseModel):
    kind: Literal["cat"]
    meows: int


class Dog(BaseModel):
    kind: Literal["dog"]
    barks: float


Pet = Annotated[Cat | Dog, Field(discriminator="kind")]


async def test_a_discriminated_union_keeps_its_discriminator_and_names_the_bad_tag() -> None:
    @tool
    def adopt(pet: Pet, more: list[Pet] | None = None) -> str:
        """Adopt a pet."""
        return type(pet).__name__ + "".join(type(p).__name__ for p in more or ())

    pet = adopt.input_schema["properties"]["pet"]
    assert pet["discriminator"] == {
        "propertyName": "kind",
        "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
    }
    assert pet["oneOf"] == [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]
    assert set(adopt.input_schema["$defs"]) == {"Cat", "Dog"}
    kit = Toolkit(adopt)
    good = await kit.execute(
        "adopt", {"pet": {"kind": "dog", "barks": 1}, "more": [{"kind": "cat", "meows": 2}]}
    )
    assert good.data == "DogCat"
    for arguments, path, says in [
        ({"pet": {"kind": "cow", "meows": 1}}, "$.pet.kind", "'cow' is not one of 'cat', 'dog'"),
        ({"pet": {"meows": 1}}, "$.pet.kind", "missing required property 'kind'"),
        ({"pet": {"kind": "dog", "meows": 1}}, "$.pet.barks", "missing required property"),
        (
            {"pet": {"kind": "cat", "meows": 1}, "more": [{"kind": "cat", "meows": "x"}]},
            "$.more[0].meows",
            "must be integer",
        ),
    ]:
        bad = await kit.execute("adopt", arguments)
        assert bad.error_code == ToolErrorCode.INVALID_ARGUMENTS, arguments
        assert bad.metadata["path"] == path and says in (bad.error or ""), bad.error


def _item_a() -> type[BaseModel]:
    class Item(BaseModel):
        a: int

    class WrapA(BaseModel):
        item: Item

    return WrapA


def _item_b() -> type[BaseModel]:
    class Item(BaseModel):
        b: str

    class WrapB(BaseModel):
        item: Item

    return WrapB


WrapA, WrapB = _item_a(), _item_b()


async def test_two_types_of_one_name_get_a_defs_entry_each() -> None:
    @tool
    def both(x: WrapA, y: WrapB) -> str:  # type: ignore[valid-type]
        """Two nested models, both named Item."""
        return f"{x.item.a} {y.item.b}"  # type: ignore[attr-defined]

    schema = both.input_schema
    assert schema["properties"]["x"]["properties"]["item"] == {"$ref": "#/$defs/Item"}
    assert schema["properties"]["y"]["properties"]["item"] == {"$ref": "#/$defs/Item_2"}
    assert schema["$defs"]["Item"]["required"] == ["a"]
    assert schema["$defs"]["Item_2"]["required"] == ["b"]
    kit = Toolkit(both)
    ok = await kit.execute("both", {"x": {"item": {"a": 1}}, "y": {"item": {"b": "s"}}})
    assert ok.data == "1 s"
    bad = await kit.execute("both", {"x": {"item": {"b": "s"}}, "y": {"item": {"b": "s"}}})
    assert bad.error_code == ToolErrorCode.INVALID_ARGUMENTS
    assert bad.metadata["path"] == "$.x.item.a"


async def test_dict_keys_are_checked_and_made_the_hinted_type() -> None:
    @tool
    def keyed(
        ints: dict[int, str],
        picks: dict[Literal["x", "y"], int] | None = None,
        colors: dict[Color, int] | None = None,
    ) -> str:
        """Dicts with typed keys."""
        return repr((ints, picks, colors))

    props = keyed.input_schema["properties"]
    assert props["ints"]["propertyNames"] == {"pattern": "^-?[0-9]+$"}
    assert props["picks"]["anyOf"][0]["propertyNames"] == {"enum": ["x", "y"]}
    kit = Toolkit(keyed)
    ok = await kit.execute("keyed", {"ints": {"1": "a", "-2": "b"}, "colors": {"red": 1}})
    assert ok.data == repr(({1: "a", -2: "b"}, None, {Color.RED: 1}))
    for arguments, path in [
        ({"ints": {"one": "a"}}, "$.ints"),
        ({"ints": {}, "picks": {"z": 1}}, "$.picks"),
        ({"ints": {}, "colors": {"green": 1}}, "$.colors"),  # was a pydantic crash in the tool
    ]:
        bad = await kit.execute("keyed", arguments)
        assert bad.error_code == ToolErrorCode.INVALID_ARGUMENTS, (arguments, bad.error)
        assert bad.metadata["path"] == path and "is not allowed" in (bad.error or "")


async def test_an_int_parameter_gets_an_int_for_a_whole_float() -> None:
    @tool
    def count(n: int, ns: list[int], maybe: int | None = None) -> str:
        """Count."""
        return repr((n, ns, maybe))

    result = await Toolkit(count).execute("count", {"n": 2.0, "ns": [1.0, 2], "maybe": 3.0})
    assert result.data == "(2, [1, 2], 3)"


async def test_a_literal_of_enum_members_states_their_values_and_gives_members() -> None:
    @tool
    def paint(color: Literal[Color.RED] = Color.RED) -> str:
        """Paint red."""
        return repr(color)

    assert paint.input_schema["properties"]["color"] == {
        "type": "string",
        "enum": ["red"],
        "default": "red",
    }
    json.dumps(paint.input_schema)  # JSON at all (it held the member itself)
    kit = Toolkit(paint)
    assert (await kit.execute("paint", {"color": "red"})).data == repr(Color.RED)
    refused = await kit.execute("paint", {"color": "blue"})
    assert refused.error_code == ToolErrorCode.INVALID_ARGUMENTS


def test_non_finite_defaults_are_not_stated() -> None:
    @tool
    def scale(
        x: float = float("inf"), y: float = float("nan"), zs: tuple[float, ...] = (1.0,)
    ) -> float:
        """Scale."""
        return x

    props = scale.input_schema["properties"]
    assert "default" not in props["x"] and "default" not in props["y"]
    assert props["zs"]["default"] == [1.0]
    json.dumps(scale.input_schema, allow_nan=False)


class TreeDict(TypedDict):
    label: str
    children: list[TreeDict]


async def test_a_recursive_typed_dict_refers_to_its_defs_entry() -> None:
    @tool
    def size(tree: TreeDict) -> int:
        """Count nodes."""
        return 1 + sum(size.__wrapped__(child) for child in tree["children"])

    schema = size.input_schema
    assert schema["properties"]["tree"] == {"$ref": "#/$defs/TreeDict"}
    assert schema["$defs"]["TreeDict"]["properties"]["children"] == {
        "type": "array",
        "items": {"$ref": "#/$defs/TreeDict"},
    }
    kit = Toolkit(size)
    tree = {"label": "a", "children": [{"label": "b", "children": []}]}
    assert (await kit.execute("size", {"tree": tree})).data == 2
    bad = await kit.execute(
        "size", {"tree": {"label": "a", "children": [{"label": 1, "children": []}]}}
    )
    assert bad.metadata["path"] == "$.tree.children[0].label"


class EvenOrder(BaseModel):
    qty: int

    @field_validator("qty")
    @classmethod
    def even(cls, value: int) -> int:
        if value % 2:
            raise ValueError("qty must be even")
        return value


async def test_a_models_own_validator_refusing_is_invalid_arguments_at_its_path() -> None:
    @tool
    async def place(order: EvenOrder) -> int:
        """Place an order."""
        return order.qty

    @tool
    def place_all(orders: list[EvenOrder]) -> int:
        """Place orders (on a worker thread)."""
        return len(orders)

    toolkit = Toolkit(place, place_all)
    refused = await toolkit.execute("place", {"order": {"qty": 3}})
    assert refused.error_code == ToolErrorCode.INVALID_ARGUMENTS
    assert refused.error == "invalid argument at $.order.qty: qty must be even"
    assert refused.metadata == {"path": "$.order.qty"}
    listed = await toolkit.execute("place_all", {"orders": [{"qty": 2}, {"qty": 5}]})
    assert listed.error_code == ToolErrorCode.INVALID_ARGUMENTS
    assert listed.metadata == {"path": "$.orders[1].qty"}
    assert (await toolkit.execute("place", {"order": {"qty": 4}})).data == 4


async def test_a_tool_raising_argument_error_is_invalid_arguments() -> None:
    @tool
    async def book(day: str) -> str:
        """Book a day."""
        await asyncio.sleep(0)  # after suspending, too: the deadline path
        raise ArgumentError("no bookings on Sundays", path="$.day")

    @tool
    def book_now(day: str) -> str:
        """Book a day at once."""
        raise ArgumentError("no bookings on Sundays", path="$.day")

    toolkit = Toolkit(book, book_now)
    for name in ("book", "book_now"):
        result = await toolkit.execute(name, {"day": "sunday"})
        assert result.error_code == ToolErrorCode.INVALID_ARGUMENTS, name
        assert result.error == "invalid argument at $.day: no bookings on Sundays"
        assert result.metadata == {"path": "$.day"}


async def test_kwargs_annotation_types_the_extra_arguments() -> None:
    """``**kwargs: str`` says what every argument beyond the named ones holds: the schema's
    ``additionalProperties``, checked (at the argument's path) before the function runs."""

    @tool
    def kw(a: int, **kwargs: str) -> str:
        return repr({k: type(v).__name__ for k, v in kwargs.items()})

    assert kw.input_schema["additionalProperties"] == {"type": "string"}
    assert kw.definition.input_schema == kw.input_schema  # travels beside the parameters
    kit = Toolkit(kw)
    wrong = await kit.execute("kw", {"a": 1, "z": 5})
    assert wrong.error_code == ToolErrorCode.INVALID_ARGUMENTS
    assert wrong.metadata["path"] == "$.z"
    assert (await kit.execute("kw", {"a": 1, "z": "5"})).data == "{'z': 'str'}"


async def test_kwargs_values_become_their_annotation() -> None:
    class Item(BaseModel):
        size: int

        @field_validator("size")
        @classmethod
        def positive(cls, value: int) -> int:
            if value < 0:
                raise ValueError("size must not be negative")
            return value

    @tool
    def counts(label: str = "", **counts: int) -> str:
        return repr(counts)

    @tool
    def items(**items: Item) -> str:
        return repr(items)

    kit = Toolkit(counts, items)
    assert (await kit.execute("counts", {"label": "x", "n": 2.0})).data == "{'n': 2}"
    assert (await kit.execute("items", {"a": {"size": 1}})).data == "{'a': Item(size=1)}"
    refused = await kit.execute("items", {"a": {"size": -1}})
    assert refused.error_code == ToolErrorCode.INVALID_ARGUMENTS
    assert refused.metadata["path"] == "$.a.size"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"name": 123}, "name must be a non-empty string, not 123"),
        ({"name": ""}, "name must be a non-empty string, not ''"),
        ({"name": "  "}, "name must be a non-empty string, not '  '"),
        ({"description": 5}, "description must be a string, not 5"),
        ({"version": 2}, "version=2 is refused"),
        ({"tags": 5}, "tags must be a string or a list of strings, not 5"),
        ({"capabilities": ["fs", 1]}, r"capabilities must be .*, not \['fs', 1\]"),
    ],
)
def test_tool_settings_of_the_wrong_kind_are_config_errors(
    options: dict[str, Any], named: str
) -> None:
    def f(a: int = 0) -> int:
        return a

    with pytest.raises(ConfigError, match=named):
        tool(f, **options)


def test_a_blank_description_means_the_docstrings() -> None:
    def f(a: int = 0) -> int:
        """Adds nothing."""
        return a

    assert tool(f, description="").definition.description == "Adds nothing."
