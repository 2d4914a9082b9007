"""Tools from plain Python functions: ``@tool`` and ``tool(fn, name=..., description=...)``.

The input schema comes from the type hints: str, int, float, bool, None, Any, Optional and
unions, Literal and Enum (-> enum), list/set/tuple/dict of anything, TypedDict, dataclasses and
pydantic models (-> nested objects, through pydantic, once per type). A parameter with a default
is not required. Descriptions come from the docstring: its summary and body for the tool, its
Google, NumPy or Sphinx parameter sections for the parameters, ``Annotated[T, "text"]`` or
``Field(description=...)`` beside a hint or as the default (``= Field(default_factory=list)``
makes a fresh value per call). Partials and callable instances are read through the function
they call.

A parameter annotated ``ToolContext`` (or named ``ctx``) receives the call's context and is left
out of the schema. ``**kwargs`` takes the arguments beyond the named ones, each of the type it
is annotated with (the schema's ``additionalProperties``; unannotated or ``Any``: any value).
Async functions are awaited; plain functions run on a worker thread so they cannot block the
event loop. The items of a generator (drawn on a worker thread) or of an async generator become
a list. Return values become results: str as is, models and dicts as JSON data, ``Output`` and
``ToolResult`` passed through; an exception becomes an error result.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import typing_extensions
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from toolmesh.capabilities import check_tag, string_list
from toolmesh.errors import ArgumentError, ConfigError, SchemaError
from toolmesh.models import ToolDefinition, ToolParameter
from toolmesh.schema import child_path, def_ref, parameters_to_schema, schema_to_parameters
from toolmesh.sources.base import ToolSet
from toolmesh.tools import Tool, ToolContext, run_blocking

__all__ = ["FunctionTool", "function_schema", "tool"]

JsonSchema = dict[str, Any]
F = TypeVar("F", bound=Callable[..., Any])

_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_INT_KEY = "^-?[0-9]+$"  # the keys of a dict[int, ...], which JSON writes as text
_NONE_TYPES = (None, type(None))


class FunctionTool(Tool):
    """A Tool made from a Python function; calling it calls the function itself."""

    __slots__ = ("__wrapped__",)
    __wrapped__: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__wrapped__(*args, **kwargs)


@overload
def tool(fn: F, /) -> FunctionTool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    capabilities: Sequence[str] = (),
    tags: Sequence[str] = (),
    idempotent: bool = False,
    defer_loading: bool = False,
    requires_approval: bool = False,
    streaming: bool = True,
    version: str = "1.0.0",
    annotations: Mapping[str, Any] | None = None,
) -> Callable[[F], FunctionTool]: ...


@overload
def tool(
    fn: F,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    capabilities: Sequence[str] = (),
    tags: Sequence[str] = (),
    idempotent: bool = False,
    defer_loading: bool = False,
    requires_approval: bool = False,
    streaming: bool = True,
    version: str = "1.0.0",
    annotations: Mapping[str, Any] | None = None,
) -> FunctionTool: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    capabilities: Sequence[str] = (),
    tags: Sequence[str] = (),
    idempotent: bool = False,
    defer_loading: bool = False,
    requires_approval: bool = False,
    streaming: bool = True,
    version: str = "1.0.0",
    annotations: Mapping[str, Any] | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool of a function: ``@tool``, ``@tool(name=...)`` or ``tool(fn, ...)``."""
    caller = sys._getframe(1).f_locals  # for names only the caller knows, see _type_hints

    def build(function: Callable[..., Any]) -> FunctionTool:
        return _build(
            function,
            namespace=caller,
            name=name,
            description=description,
            capabilities=capabilities,
            tags=tags,
            idempotent=idempotent,
            defer_loading=defer_loading,
            requires_approval=requires_approval,
            streaming=streaming,
            version=version,
            annotations=annotations,
        )

    if fn is None:
        return build
    return build(fn)


def _build(fn: Callable[..., Any], **options: Any) -> FunctionTool:
    if not callable(fn):
        raise ConfigError(f"tool() needs a function, got {type(fn).__name__}")
    if isinstance(fn, Tool):
        raise ConfigError(f"{fn.name!r} is already a tool")
    target = _unwrap(fn)
    plan = _plan(target, options["namespace"])
    doc = _docstring(target)
    tool_name = _given_text(options["name"], "name") or getattr(target, "__name__", None)
    if not tool_name or tool_name == "<lambda>":
        raise ConfigError("a lambda or unnamed callable needs tool(fn, name=...)")
    where = f"tool {tool_name!r}"
    tags = string_list(options["tags"], where=f"{where} tags")
    capabilities = string_list(options["capabilities"], where=f"{where} capabilities")
    raw_input, raw_output = _schemas(plan, doc)
    input_schema, input_parameters, input_lossless = _shape_of(raw_input)
    output_schema, output_parameters, output_lossless = _shape_of(raw_output)
    try:
        definition = ToolDefinition(
            name=tool_name,
            input_parameters=input_parameters,
            input_schema=None if input_lossless else input_schema,
            output_parameters=output_parameters,
            output_schema=None if output_lossless else output_schema,
            kind="python",
            description=_given_text(options["description"], "description", blank=True)
            or _description(doc)
            or tool_name,
            streaming=options["streaming"],
            idempotent=options["idempotent"],
            tags=tags,
            version=options["version"],
            defer_loading=options["defer_loading"],
            capabilities=[check_tag(c, where=f"{where} capability") for c in capabilities],
            annotations=dict(options["annotations"]) if options["annotations"] else None,
            requires_approval=options["requires_approval"],
        )
    except ValidationError as exc:  # a setting of the wrong type (version=1, streaming=None)
        raise _setting_refused(where, exc) from None
    made = FunctionTool(definition, _runner(fn, plan), source="python", input_schema=input_schema)
    made.__wrapped__ = fn
    return made


def _given_text(value: Any, option: str, *, blank: bool = False) -> str | None:
    """A text setting of ``tool()`` (None: not given). Anything but text is refused, and so is
    blank text unless ``blank`` (then it is not given): ``name=""`` would otherwise quietly name
    the tool after the function, where ``description=""`` means "the docstring's"."""
    if value is None or (blank and isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not value.strip():
        kind = "a string" if blank else "a non-empty string"
        raise ConfigError(f"tool() {option} must be {kind}, not {value!r}")
    return value


def _setting_refused(where: str, exc: ValidationError) -> ConfigError:
    """A ConfigError naming the setting (and the value) the tool's definition refused."""
    first = exc.errors(include_url=False)[0]
    setting = ".".join(str(step) for step in first["loc"])
    return ConfigError(f"{where}: {setting}={first['input']!r} is refused: {first['msg']}")


_SHAPES: dict[str, tuple[JsonSchema, list[ToolParameter], bool]] = {}
_SHAPES_LIMIT = 4096


def _shape_of(schema: JsonSchema | None) -> tuple[JsonSchema | None, list[ToolParameter], bool]:
    """``schema`` (an equal one seen before, if any), its parameter list, and whether that list
    says everything the schema does.

    Tools often share a schema shape; converting each shape once (rather than per tool, in
    ``Tool``) and sharing the results makes registering thousands of tools fast and small.
    Schemas and parameters of tools are read-only, so sharing them is safe.
    """
    if schema is None:
        return None, [], True
    key = repr(schema)  # cheap; a schema written in another key order is merely another entry
    shape = _SHAPES.get(key)
    if shape is None:
        parameters = schema_to_parameters(schema)
        shape = (schema, parameters, parameters_to_schema(parameters) == schema)
        if len(_SHAPES) >= _SHAPES_LIMIT:
            _SHAPES.pop(next(iter(_SHAPES)))
        _SHAPES[key] = shape
    return shape


def function_schema(fn: Callable[..., Any]) -> JsonSchema:
    """The input JSON Schema ``@tool`` would give ``fn``."""
    target = _unwrap(fn)
    return _schemas(_plan(target, sys._getframe(1).f_locals), _docstring(target))[0]


# -- reading the function ------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Param:
    name: str
    annotation: Any
    default: Any
    kind: inspect._ParameterKind
    description: str = ""
    coerce: Callable[[Any], Any] | None = None
    make: Callable[[], Any] | None = None  # makes the default when the call leaves it out


@dataclasses.dataclass(slots=True)
class _Plan:
    params: list[_Param]
    context_param: str | None
    extra_kwargs: bool
    extra_type: Any  # the **kwargs annotation: the type of each argument beyond the named ones
    returns: Any
    kind: Literal["sync", "async", "generator", "async_generator"]
    positional: list[tuple[str, Any]]  # the positional-only parameters, context too, and defaults
    extra_coerce: Callable[[Any], Any] | None = None  # for each argument **kwargs takes


def _unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    if isinstance(fn, functools.partial):
        return fn
    unwrapped: Callable[..., Any] = inspect.unwrap(fn)
    return unwrapped


def _annotated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations (and docstring, and sync or async kind) describe ``fn``:
    a partial's function, a callable instance's ``__call__``; ``fn`` itself otherwise."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn) or inspect.isclass(fn) or not callable(fn):
        return fn
    call: Callable[..., Any] = type(fn).__call__
    return call


def _type_hints(fn: Callable[..., Any], namespace: Mapping[str, Any]) -> dict[str, Any]:
    """``fn``'s resolved hints. A string annotation (``from __future__ import annotations``)
    naming a class defined inside the function that made the tool resolves nowhere but in that
    function's locals, ``namespace``: it fills the names ``fn``'s own module does not have."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except NameError:
        if not namespace:
            raise
    fallback = {**namespace, **getattr(fn, "__globals__", {})}
    return typing.get_type_hints(fn, localns=fallback, include_extras=True)


def _plan(fn: Callable[..., Any], namespace: Mapping[str, Any]) -> _Plan:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cannot read the signature of {fn!r}: {exc}") from exc
    try:
        hints = _type_hints(_annotated(fn), namespace)
    except Exception as exc:  # unresolved forward references, mostly
        raise ConfigError(f"cannot resolve the type hints of {_qualname(fn)}: {exc}") from exc
    params: list[_Param] = []
    context_param = None
    extra_kwargs = False
    extra_type: Any = Any
    positional: list[tuple[str, Any]] = []
    for param in signature.parameters.values():
        annotation, default, make = _field_default(hints.get(param.name, Any), param.default)
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append((param.name, default))
        if _is_context(param.name, annotation):
            context_param = param.name
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            raise ConfigError(f"{_qualname(fn)}: *{param.name} cannot be a tool parameter")
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra_kwargs, extra_type = True, annotation
            continue
        params.append(_Param(param.name, annotation, default, param.kind, make=make))
    return _Plan(
        params=params,
        context_param=context_param,
        extra_kwargs=extra_kwargs,
        extra_type=extra_type,
        returns=hints.get("return", inspect.Signature.empty),
        kind=_kind(_annotated(fn)),
        positional=positional,
    )


_FRESH = object()  # the default of a Field(default_factory=...): a new value per call


def _field_default(annotation: Any, default: Any) -> tuple[Any, Any, Callable[[], Any] | None]:
    """A pydantic ``Field(...)`` given as a parameter's default: its constraints and description
    join the hint, its default (``_FRESH`` for a factory) becomes the parameter's, and the
    function that makes it is returned, since the function's own default is the Field object
    itself. Any other default: as given, nothing to make."""
    if not isinstance(default, FieldInfo):
        return annotation, default, None
    hint = typing.Annotated[annotation, default]
    factory = default.default_factory
    if factory is not None:
        return hint, _FRESH, factory  # type: ignore[return-value]
    if default.is_required():
        return hint, inspect.Parameter.empty, None
    value = default.default
    return hint, value, lambda: copy.deepcopy(value)


def _kind(fn: Callable[..., Any]) -> Literal["sync", "async", "generator", "async_generator"]:
    if inspect.iscoroutinefunction(fn):
        return "async"
    if inspect.isasyncgenfunction(fn):
        return "async_generator"
    if inspect.isgeneratorfunction(fn):
        return "generator"
    return "sync"


def _is_context(name: str, annotation: Any) -> bool:
    base = _strip_annotated(annotation)[0]
    if base is ToolContext:
        return True
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        return any(arg is ToolContext for arg in typing.get_args(base))
    return name == "ctx" and base is Any


def _qualname(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


@dataclasses.dataclass(slots=True)
class _Doc:
    summary: str
    params: dict[str, str]
    returns: str = ""


def _docstring(fn: Callable[..., Any]) -> _Doc | None:
    text = inspect.getdoc(_annotated(fn))
    if not text and not isinstance(fn, functools.partial):  # a partial's own is functools' text
        text = inspect.getdoc(fn)  # a callable instance's class docstring
    if not text:
        return None
    if "\n" not in text.strip():
        return _Doc(text.strip(), {})  # one line: no sections to parse
    parsed = _parse_docstring(text)
    if parsed is None:
        return _Doc(text.strip(), {})
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    return _Doc(
        "\n\n".join(parts).strip(),
        {p.arg_name: p.description or "" for p in parsed.params},
        (parsed.returns.description or "") if parsed.returns else "",
    )


def _parse_docstring(text: str) -> Any:
    """``text`` parsed in the style that finds the most in it (as docstring_parser's own auto
    style does), or None when no style can read it."""
    import docstring_parser  # only for docstrings with more than a summary line
    from docstring_parser import epydoc, numpydoc, rest

    parsed = []
    for parse in (rest.parse, _parse_google, numpydoc.parse, epydoc.parse):
        with contextlib.suppress(docstring_parser.ParseError):
            parsed.append(parse(text))
    return max(parsed, key=lambda d: len(d.meta)) if parsed else None  # ties: the first


@functools.cache
def _google_parser() -> Any:
    from docstring_parser import google

    # Google's style guide names these sections too; docstring_parser knows only Args & co.
    extra = ("Keyword Args", "Keyword Arguments", "Other Parameters")
    multiple = google.SectionType.MULTIPLE
    return google.GoogleParser(
        [*google.DEFAULT_SECTIONS, *(google.Section(t, "param", multiple) for t in extra)]
    )


def _parse_google(text: str) -> Any:
    parser = _google_parser()
    if parser.titles_re.match(text):
        # No summary, the docstring opens with its Args: section; the parser wants a line
        # before the first section.
        text = "\n" + text
    return parser.parse(text)


def _description(doc: _Doc | None) -> str:
    return doc.summary if doc is not None else ""


# -- schemas -------------------------------------------------------------------------------------


def _schemas(plan: _Plan, doc: _Doc | None) -> tuple[JsonSchema, JsonSchema | None]:
    described = doc.params if doc else {}
    builder = _SchemaBuilder()
    properties: JsonSchema = {}
    required: list[str] = []
    for param in plan.params:
        schema = builder.schema(param.annotation)
        note = described.get(param.name)
        if note and "description" not in schema:
            schema = {**schema, "description": note}
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        elif param.default is not _FRESH:  # a factory's value is new each call: none to state
            default = _json_default(param.default)
            if default is not _UNSET:
                schema = {**schema, "default": default}
        param.coerce = builder.coercer(param.annotation)
        properties[param.name] = schema
    input_schema: JsonSchema = {"type": "object", "properties": properties}
    if required:
        input_schema["required"] = required
    if not plan.extra_kwargs:
        input_schema["additionalProperties"] = False
    else:
        extra = builder.schema(plan.extra_type)
        if extra:  # (an unannotated or Any **kwargs: {}, any value, as leaving it out says)
            input_schema["additionalProperties"] = extra
        plan.extra_coerce = builder.coercer(plan.extra_type)
    if builder.defs:
        input_schema["$defs"] = builder.defs
    return input_schema, _output_schema(plan.returns, doc)


def _output_schema(returns: Any, doc: _Doc | None) -> JsonSchema | None:
    if returns is inspect.Signature.empty or returns in _NONE_TYPES or returns is Any:
        return None
    builder = _SchemaBuilder()
    try:
        schema = builder.schema(returns)
    except SchemaError:
        return None
    if builder.defs:
        schema = {**schema, "$defs": builder.defs}
    if doc is not None and doc.returns:
        schema.setdefault("description", doc.returns)
    return schema


_UNSET = object()


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # before the primitives: an IntEnum member is an int too
        return _json_default(value.value)
    if value is None or isinstance(value, str | int | float | bool):
        return value if _finite(value) else _UNSET  # NaN and Infinity are no JSON values
    if isinstance(value, list | tuple) and all(
        v is None or (isinstance(v, str | int | float | bool) and _finite(v)) for v in value
    ):
        return list(value)
    return _UNSET


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        return base, extras
    return annotation, []


class _SchemaBuilder:
    """JSON Schema for type hints: simple types by hand (fast), structured types by pydantic."""

    def __init__(self) -> None:
        self.defs: JsonSchema = {}
        # The TypedDicts being walked, with their $defs name once one refers to itself.
        self._building: dict[Any, str | None] = {}

    def _def_name(self, name: str) -> str:
        """``name``, or ``name_2``, ``name_3``... when $defs holds another schema by it."""
        unique, n = name, 2
        while unique in self.defs:
            unique, n = f"{name}_{n}", n + 1
        return unique

    def schema(self, annotation: Any) -> JsonSchema:
        base, extras = _strip_annotated(annotation)
        schema = self._plain(base) if not _needs_pydantic(base, extras) else None
        if schema is None:
            schema = self._pydantic(annotation)
        else:
            for extra in extras:
                if isinstance(extra, str):
                    schema = {**schema, "description": extra}
                elif isinstance(extra, FieldInfo) and extra.description:
                    schema = {**schema, "description": extra.description}
        return schema

    def _plain(self, tp: Any) -> JsonSchema | None:
        if tp in _PRIMITIVES:
            return {"type": _PRIMITIVES[tp]}
        if tp is Any or tp is object or tp is inspect.Parameter.empty:
            return {}
        if tp in _NONE_TYPES:
            return {"type": "null"}
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is Literal:  # an Enum member stands for its value, as pydantic has it
            return _enum_schema([a.value if isinstance(a, enum.Enum) else a for a in args])
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return _enum_schema([member.value for member in tp])
        if origin in (typing.Union, types.UnionType):
            return self._union(args)
        if tp in (list, set, frozenset, tuple) or origin in (list, set, frozenset, Sequence):
            return self._array(tp, origin, args)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.schema(args[0])}
            return None  # fixed-length tuples: pydantic's prefixItems
        if typing.is_typeddict(tp):
            return self._typed_dict(tp)
        if tp is dict or origin in (dict, Mapping):
            schema: JsonSchema = {"type": "object"}
            if len(args) == 2 and args[0] not in (str, Any):
                names = self._key_schema(args[0])
                if names is None:
                    return None  # keys pydantic knows better (dates, UUIDs, ...)
                schema["propertyNames"] = names
            if len(args) == 2 and args[1] is not Any:
                schema["additionalProperties"] = self.schema(args[1])
            return schema
        return None

    def _key_schema(self, key: Any) -> JsonSchema | None:
        """What the keys of a ``dict[key, ...]`` must look like as JSON object keys (text),
        or None when that is not a plain string schema."""
        base = _strip_annotated(key)[0]
        if base is int:
            return {"pattern": _INT_KEY}  # "1", "-2": the function gets ints, see coercer
        schema = self.schema(key)
        if "$ref" in schema:
            schema = self.defs.get(schema["$ref"].removeprefix("#/$defs/"), schema)
        enum_values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if isinstance(enum_values, list):
            if all(isinstance(v, str) for v in enum_values):
                return {"enum": enum_values}
            if all(isinstance(v, int) and not isinstance(v, bool) for v in enum_values):
                return {"enum": [str(v) for v in enum_values]}  # an IntEnum's "1", "2"
            return None
        if schema.get("type") == "string" and "format" not in schema and "$ref" not in schema:
            return {k: v for k, v in schema.items() if k != "type"}  # constrained str
        return None

    def _typed_dict(self, tp: Any) -> JsonSchema:
        # By hand: pydantic accepts only typing_extensions.TypedDict before Python 3.12. A
        # TypedDict met again inside itself becomes a reference to its $defs entry.
        if tp in self._building:
            name = self._building[tp]
            if name is None:
                name = self._building[tp] = self._def_name(tp.__name__)
                self.defs[name] = {}  # taken now; filled when the outer walk ends
            return {"$ref": def_ref(name)}
        self._building[tp] = None
        try:
            schema = self._typed_dict_schema(tp)
        finally:
            name = self._building.pop(tp)
        if name is None:
            return schema
        self.defs[name] = schema
        return {"$ref": def_ref(name)}

    def _typed_dict_schema(self, tp: Any) -> JsonSchema:
        hints = typing.get_type_hints(tp, include_extras=True)
        totals = getattr(tp, "__required_keys__", hints)
        properties: JsonSchema = {}
        required: list[str] = []
        for key, hint in hints.items():
            hint, marked = _typed_dict_item(hint)
            # An explicit Required/NotRequired wins: under string annotations (PEP 563) Python
            # 3.11 cannot see it and counts the key by the class's totality alone.
            if marked if marked is not None else key in totals:
                required.append(key)
            properties[key] = self.schema(hint)
        schema: JsonSchema = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        return schema

    def _array(self, tp: Any, origin: Any, args: tuple[Any, ...]) -> JsonSchema:
        schema: JsonSchema = {"type": "array"}
        if args and args[0] is not Any:
            schema["items"] = self.schema(args[0])
        if tp in (set, frozenset) or origin in (set, frozenset):
            schema["uniqueItems"] = True
        return schema

    def _union(self, args: tuple[Any, ...]) -> JsonSchema:
        branches = [self.schema(arg) for arg in args]
        simple = [b.get("type") for b in branches]
        if all(isinstance(t, str) for t in simple) and all(len(b) == 1 for b in branches):
            return {"type": list(dict.fromkeys(simple))} if len(simple) > 1 else branches[0]
        return {"anyOf": branches}

    def _pydantic(self, annotation: Any) -> JsonSchema:
        try:
            adapter = _adapter(annotation)
            schema = adapter.json_schema(ref_template="#/$defs/{model}")
        except Exception as exc:
            raise SchemaError(f"cannot make a JSON Schema of {annotation!r}: {exc}") from exc
        clean: JsonSchema = _strip_titles(schema)
        found = clean.pop("$defs", {})
        # Two types of one name (Item of one module and of another, each nested in the model of
        # a parameter): pydantic names each Item in its own schema; here they share one $defs.
        renamed: dict[str, str] = {}
        for name, definition in found.items():
            if name in self.defs and self.defs[name] != definition:
                renamed[def_ref(name)] = def_ref(self._def_name(name))
                self.defs[renamed[def_ref(name)].removeprefix("#/$defs/")] = {}  # taken
        if renamed:
            clean = _renamed_refs(clean, renamed)
            found = {
                renamed.get(def_ref(name), def_ref(name)).removeprefix("#/$defs/"): (
                    _renamed_refs(definition, renamed)
                )
                for name, definition in found.items()
            }
        self.defs.update(found)
        return clean

    def coercer(self, annotation: Any) -> Callable[[Any], Any] | None:
        """A function turning JSON arguments into the hinted Python value, or None if the JSON
        value is already right (plain types)."""
        base, _extras = _strip_annotated(annotation)
        if typing.get_origin(base) is Literal and any(
            isinstance(a, enum.Enum) for a in typing.get_args(base)
        ):
            members = {a.value: a for a in typing.get_args(base) if isinstance(a, enum.Enum)}
            return lambda value: members.get(value, value)  # pydantic refuses "red" for it
        if _needs_instances(base):
            return _adapter(annotation).validate_python
        if not _needs_instances(base, ints=True):
            return None
        # Only ints to make (JSON Schema counts 2.0 as an integer, a dict[int, ...] has text
        # keys): worth pydantic where it can, and left alone where it cannot (a typing.TypedDict
        # inside, before Python 3.12).
        try:
            return _adapter(annotation).validate_python
        except Exception:
            return None


_ITEM_QUALIFIERS: dict[Any, bool | None] = {
    typing.Required: True,
    typing.NotRequired: False,
    typing_extensions.ReadOnly: None,  # says nothing about presence
}


def _typed_dict_item(hint: Any) -> tuple[Any, bool | None]:
    """A TypedDict item's type without its ``Required``/``NotRequired``/``ReadOnly`` wrappers
    (also inside ``Annotated``), and whether it was marked required (None: not marked)."""
    base, extras = _strip_annotated(hint)
    marked: bool | None = None
    while (origin := typing.get_origin(base)) in _ITEM_QUALIFIERS:
        marked = _ITEM_QUALIFIERS[origin] if marked is None else marked
        base, more = _strip_annotated(typing.get_args(base)[0])
        extras += more
    return (typing.Annotated[base, *extras] if extras else base), marked


def _needs_pydantic(tp: Any, extras: list[Any]) -> bool:
    if any(not isinstance(e, str | FieldInfo) for e in extras):
        return True  # annotated_types constraints and friends
    return any(
        isinstance(e, FieldInfo)
        and bool(e.metadata or e.discriminator is not None or e.examples or e.json_schema_extra)
        for e in extras
    )


def _renamed_refs(schema: Any, renamed: Mapping[str, str]) -> Any:
    """``schema`` with the ``$ref``s (and discriminator mappings) in ``renamed`` renamed."""
    if isinstance(schema, list):
        return [_renamed_refs(item, renamed) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: JsonSchema = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = renamed.get(value, value)
        elif key == "mapping" and isinstance(value, dict):  # of a discriminator
            out[key] = {
                k: renamed.get(v, v) if isinstance(v, str) else _renamed_refs(v, renamed)
                for k, v in value.items()
            }
        else:
            out[key] = _renamed_refs(value, renamed)
    return out


def _needs_instances(tp: Any, *, ints: bool = False) -> bool:
    """Whether a JSON value must be converted to match the hint (models, enums, ...); with
    ``ints``, also whether it may hold an int as JSON gives it otherwise (2.0, or a key "2")."""
    if tp is int:
        return ints
    if tp in _PRIMITIVES or tp is Any or tp in _NONE_TYPES or tp in (list, dict, object):
        return False
    origin = typing.get_origin(tp)
    if origin is Literal or typing.is_typeddict(tp):
        return False  # a TypedDict is a dict already
    if origin in (typing.Union, types.UnionType, list, dict, Mapping, Sequence, typing.Annotated):
        return any(
            _needs_instances(arg, ints=ints) for arg in typing.get_args(tp) if arg is not Ellipsis
        )
    return True  # enums, models, dataclasses, TypedDicts, sets, tuples, dates, ...


def _refused(name: str, exc: ValidationError) -> ArgumentError:
    """The arguments' error for a value the schema let through and its type refused (a
    pydantic validator of the model, say): the first fault, at its path."""
    errors = exc.errors(include_url=False)
    if not errors:
        return ArgumentError(str(exc), path=child_path("$", name))
    first = errors[0]
    path = child_path("$", name)
    for step in first["loc"]:
        path = child_path(path, step)
    message = str(first["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):  # pydantic's, for ValueError/assert
        message = message.removeprefix(prefix)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return ArgumentError(message, path=path)


@functools.lru_cache(maxsize=1024)
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


def _enum_schema(values: list[Any]) -> JsonSchema:
    schema: JsonSchema = {"enum": values}
    kinds = {_PRIMITIVES.get(type(v)) for v in values}
    if len(kinds) == 1 and None not in kinds:
        schema = {"type": kinds.pop(), "enum": values}
    return schema


def _strip_titles(schema: Any, *, in_properties: bool = False) -> Any:
    """pydantic titles every schema; to a model they are noise. Property names stay."""
    if isinstance(schema, dict):
        return {
            key: _strip_titles(value, in_properties=key in ("properties", "$defs"))
            for key, value in schema.items()
            if in_properties or key != "title"
        }
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


# -- running -------------------------------------------------------------------------------------


def _runner(fn: Callable[..., Any], plan: _Plan) -> Callable[[dict[str, Any], ToolContext], Any]:
    coercers = {p.name: p.coerce for p in plan.params if p.coerce is not None}
    factories = {p.name: p.make for p in plan.params if p.make is not None}
    extras = None
    if plan.extra_coerce is not None:
        extras = (frozenset(p.name for p in plan.params), plan.extra_coerce)
    runner = _RUNNERS[plan.kind]
    return runner(
        fn, tuple(plan.positional), coercers or None, plan.context_param, factories or None, extras
    )


class _Runner:
    """Calls the function with JSON arguments bound to its parameters. One small object per
    tool rather than closures: registering thousands of tools allocates (and GC-scans) less."""

    __slots__ = ("coercers", "context_param", "extras", "factories", "fn", "positional")

    def __init__(
        self,
        fn: Callable[..., Any],
        positional: tuple[tuple[str, Any], ...],
        coercers: dict[str, Callable[[Any], Any]] | None,
        context_param: str | None,
        factories: dict[str, Callable[[], Any]] | None = None,
        extras: tuple[frozenset[str], Callable[[Any], Any]] | None = None,
    ) -> None:
        self.fn = fn
        self.positional = positional
        self.coercers = coercers
        self.context_param = context_param
        self.factories = factories
        self.extras = extras  # the named parameters, and the coercer of the others (**kwargs)

    def bind(self, arguments: dict[str, Any], ctx: ToolContext) -> tuple[list[Any], dict[str, Any]]:
        kwargs = dict(arguments)
        if self.coercers:
            for key, coerce in self.coercers.items():
                if key in kwargs:
                    kwargs[key] = _coerced(key, kwargs[key], coerce)
        if self.extras is not None:
            named, coerce = self.extras
            for key in [k for k in kwargs if k not in named]:  # in order: the first fault is told
                kwargs[key] = _coerced(key, kwargs[key], coerce)
        if self.factories:  # the function's own default would be the Field(...) object itself
            for key, make in self.factories.items():
                if key not in kwargs:
                    kwargs[key] = make()
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        args: list[Any] = []
        for name, default in self.positional:
            if name in kwargs:
                args.append(kwargs.pop(name))
            elif default is not inspect.Parameter.empty:
                args.append(default)  # keeps the later ones in their places
            else:
                break  # a required one missing: validation has refused the call already
        return args, kwargs

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        raise NotImplementedError  # one subclass per kind of function, see _RUNNERS


def _coerced(key: str, value: Any, coerce: Callable[[Any], Any]) -> Any:
    try:
        return coerce(value)
    except ValidationError as exc:  # a model's own validator said no
        raise _refused(key, exc) from None


class _AsyncRunner(_Runner):
    __slots__ = ()

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        args, kwargs = self.bind(arguments, ctx)
        return await self.fn(*args, **kwargs)


class _ThreadRunner(_Runner):
    __slots__ = ()

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        args, kwargs = self.bind(arguments, ctx)
        return await run_blocking(functools.partial(self.fn, *args, **kwargs))


class _GeneratorRunner(_Runner):
    """A generator's items become a list, drawn on the worker thread like a plain call."""

    __slots__ = ()

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        args, kwargs = self.bind(arguments, ctx)
        return await run_blocking(functools.partial(_drain, self.fn, *args, **kwargs))


class _AsyncGeneratorRunner(_Runner):
    """An async generator's items become a list, as a generator's do."""

    __slots__ = ()

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        args, kwargs = self.bind(arguments, ctx)
        items = self.fn(*args, **kwargs)
        if not inspect.isasyncgen(items):  # a decorator around it returned something else
            return await items if inspect.isawaitable(items) else items
        # aclosing: a cancelled or failed call runs the generator's cleanup now, not at GC.
        async with contextlib.aclosing(items):
            return [item async for item in items]


def _drain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    items = fn(*args, **kwargs)
    if not inspect.isgenerator(items):  # a decorator around it returned something else
        return items
    with contextlib.closing(items):
        return list(items)


_RUNNERS: dict[str, type[_Runner]] = {
    "sync": _ThreadRunner,
    "async": _AsyncRunner,
    "generator": _GeneratorRunner,
    "async_generator": _AsyncGeneratorRunner,
}


def tools_of(items: Sequence[Any], *, name: str = "functions") -> ToolSet:
    """A ToolSet of tools and functions (functions are wrapped with ``tool``)."""
    made = [item if isinstance(item, Tool) else tool(item) for item in items]
    return ToolSet(made, name=name)
