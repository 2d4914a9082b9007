"""ToolParameter lists <-> JSON Schema, and compiled argument validators.

The seed's ``ToolParameter`` says less than JSON Schema can (no ``anyOf``, no ``$ref``, no
numeric bounds). Conversion from parameters to a schema and back is lossless for what a schema
can carry (an array's ``items`` keeps no name or ``required`` of its own, and a nested
parameter is named by its key in ``properties``); from a schema to
parameters it keeps what the parameter model can say, and ``is_lossless`` tells whether anything
was dropped, so the exact schema can travel beside the parameters when it was.

Validators compile a schema once (fastjsonschema generates Python code for it) and are shared by
every tool whose schema is identical. Remote ``$ref`` targets are never fetched.

Schemas come from untrusted peers (MCP servers, OpenAPI documents), so no walker here recurses
without bound: a ``$ref`` cycle that never reaches a schema (``S = allOf[T]``, ``T = allOf[S]``)
and a schema or parameter nested too deeply to convert or compile are ``SchemaError``s, and a
value nested deeper than its check can follow is an ``ArgumentError``.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from toolmesh.errors import ArgumentError, SchemaError
from toolmesh.models import ToolParameter

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "Validator",
    "child_path",
    "compile_validator",
    "def_ref",
    "is_lossless",
    "parameter_to_schema",
    "parameters_to_schema",
    "pointer_step",
    "pointer_target",
    "ref_cycle",
    "schema_to_parameters",
    "validates_as_2020_12",
]

JsonSchema = dict[str, Any]

EMPTY_OBJECT_SCHEMA: JsonSchema = {"type": "object", "properties": {}}


# -- parameters -> schema ------------------------------------------------------------------------


# Parameters nested deeper than this are refused: converting them recurses a few frames per
# level, and schema_to_parameters never nests more than _MAX_DEPTH (32) levels itself.
_MAX_PARAMETER_DEPTH = 100


def parameters_to_schema(parameters: Sequence[ToolParameter]) -> JsonSchema:
    """The JSON Schema object whose properties are ``parameters``."""
    return _object_schema(parameters, depth=0)


def parameter_to_schema(parameter: ToolParameter) -> JsonSchema:
    """The JSON Schema of one parameter (its ``required`` flag belongs to the parent);
    ``SchemaError`` when it nests more than 100 levels deep."""
    return _parameter_schema(parameter, depth=0)


def _object_schema(parameters: Sequence[ToolParameter], *, depth: int) -> JsonSchema:
    schema: JsonSchema = {
        "type": "object",
        "properties": {p.name: _parameter_schema(p, depth=depth) for p in parameters},
    }
    required = [p.name for p in parameters if p.required]
    if required:
        schema["required"] = required
    return schema


def _parameter_schema(parameter: ToolParameter, *, depth: int) -> JsonSchema:
    if depth >= _MAX_PARAMETER_DEPTH:
        raise SchemaError(
            f"parameter {parameter.name!r} is nested more than {_MAX_PARAMETER_DEPTH} levels deep"
        )
    schema: JsonSchema = {"type": parameter.type}
    if parameter.description:
        schema["description"] = parameter.description
    if parameter.enum is not None:
        schema["enum"] = [_typed_enum_value(v, parameter.type) for v in parameter.enum]
    if parameter.properties is not None:
        nested = _object_schema(
            [p.model_copy(update={"name": key}) for key, p in parameter.properties.items()],
            depth=depth + 1,
        )
        schema["properties"] = nested["properties"]
        if "required" in nested:
            schema["required"] = nested["required"]
    if parameter.items is not None:
        schema["items"] = _parameter_schema(parameter.items, depth=depth + 1)
    return schema


def _typed_enum_value(value: str, type_name: str) -> Any:
    """Give a string enum value back its parameter's JSON type, when it reads back the same."""
    if type_name == "integer" or type_name == "number":
        for parse in (int, float):
            try:
                parsed = parse(value)
            except ValueError:
                continue
            if _enum_text(parsed) == value and parsed == parsed and abs(parsed) != float("inf"):
                return parsed  # NaN and Infinity are no JSON numbers: they stay text
    if type_name == "boolean" and value in ("true", "false"):
        return value == "true"
    return value


def _enum_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return repr(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (RecursionError, ValueError, TypeError) as exc:  # a schema given as Python objects
        # no repr of the value in the message: that recurses as deep as it is nested
        raise SchemaError(f"an enum value cannot be used: {_json_fault(exc)}") from None


def _json_fault(exc: Exception) -> str:
    """Why ``json.dumps`` refused a value, in words."""
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if isinstance(exc, ValueError):
        return "it contains itself"  # json's "Circular reference detected"
    return f"it is not JSON ({exc})"


# -- schema -> parameters ------------------------------------------------------------------------


def schema_to_parameters(schema: Mapping[str, Any]) -> list[ToolParameter]:
    """The parameters of an object schema (``$ref``s to its own ``$defs`` resolved)."""
    walk = _Walk(_Resolver(schema))
    root = walk.resolver.resolve(schema)
    properties = root.get("properties") or {}
    required = set(root.get("required") or ())
    return [
        _to_parameter(name, prop, name in required, walk, frozenset(), depth=0)
        for name, prop in properties.items()
    ]


_MAX_DEPTH = 32  # deep schemas stop nesting here; the exact schema still travels beside
# Parameters built inside $ref expansions, per schema. Cycles are cut on their own, but shared
# $defs can still fan out (a def used twice, whose defs are used twice, ...: 2**depth copies);
# past this budget $refs are not expanded any more, so conversion stays roughly linear.
_MAX_EXPANDED = 10_000


class _Walk:
    """The state of one ``schema_to_parameters`` call."""

    __slots__ = ("budget", "resolver")

    def __init__(self, resolver: _Resolver) -> None:
        self.resolver = resolver
        self.budget = _MAX_EXPANDED


def _to_parameter(
    name: str,
    raw: Any,
    required: bool,
    walk: _Walk,
    expanding: frozenset[str],
    *,
    depth: int,
) -> ToolParameter:
    """``expanding`` holds the ``$ref``s being expanded above this point. Meeting one of them
    again is a cycle: the parameter is then left unnested (an object without properties, say),
    as at the depth limit, instead of expanding the recursion down to that limit."""
    followed: set[str] = set()
    resolver = walk.resolver
    schema = resolver.resolve(raw, followed) if isinstance(raw, Mapping) else {}
    schema = _collapse(schema, resolver, followed)
    if expanding:
        walk.budget -= 1
    nest = depth < _MAX_DEPTH
    if followed:
        nest = nest and walk.budget > 0 and followed.isdisjoint(expanding)
        expanding = expanding | followed
    type_name = _type_of(schema)
    enum = schema.get("enum")
    if enum is None and "const" in schema:
        enum = [schema["const"]]
    properties: dict[str, ToolParameter] | None = None
    items: ToolParameter | None = None
    if nest:
        if "properties" in schema:
            nested_required = set(schema.get("required") or ())
            properties = {
                key: _to_parameter(
                    key, value, key in nested_required, walk, expanding, depth=depth + 1
                )
                for key, value in schema["properties"].items()
            }
        if isinstance(schema.get("items"), Mapping):
            items = _to_parameter("items", schema["items"], False, walk, expanding, depth=depth + 1)
    return ToolParameter(
        name=name,
        type=type_name,
        description=str(schema.get("description") or ""),
        required=required,
        enum=[_enum_text(v) for v in enum] if isinstance(enum, list) else None,
        properties=properties,
        items=items,
    )


_MAX_CHAIN = 256  # unions inside unions ({"allOf": [{"allOf": [...]}]}) deeper: a SchemaError


def _collapse(
    schema: Mapping[str, Any], resolver: _Resolver, followed: set[str]
) -> Mapping[str, Any]:
    """Reduce ``Optional[X]`` style unions and single-branch ``allOf`` to the branch itself,
    unions inside unions too. Iterative, so a long chain cannot exhaust the stack; a branch met
    again is a loop that never reaches a schema (``S = allOf[T]``, ``T = allOf[S]``)."""
    if "anyOf" not in schema and "oneOf" not in schema and "allOf" not in schema:
        return schema  # the common case, kept cheap: registration walks every parameter
    outer: list[dict[str, Any]] = []  # the keywords beside each union, outermost first
    taken: set[int] = set()  # the branches followed, by identity (they are the schema's own)
    while (step := _chosen_branch(schema, resolver)) is not None:
        branch, resolved, refs, beside = step
        if id(branch) in taken:
            ref = branch.get("$ref")
            raise SchemaError(_cycle_message(ref if isinstance(ref, str) else None))
        if len(outer) >= _MAX_CHAIN:
            raise SchemaError(f"unions (anyOf/oneOf/allOf) nest more than {_MAX_CHAIN} deep")
        taken.add(id(branch))
        followed |= refs
        outer.append(beside)
        schema = resolved
    for beside in reversed(outer):  # the outer union's own keywords win, as written
        schema = {**schema, **beside}
    return schema


def _chosen_branch(
    schema: Mapping[str, Any], resolver: _Resolver
) -> tuple[Mapping[str, Any], Mapping[str, Any], set[str], dict[str, Any]] | None:
    """The branch that stands for ``schema``'s union (the first one not null, or an allOf's
    only one), resolved, with the refs followed and the keywords beside the union; or None."""
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                if not isinstance(branch, Mapping):
                    continue
                refs: set[str] = set()  # only the chosen branch's refs count
                resolved = resolver.resolve(branch, refs)
                if resolved.get("type") != "null":
                    return branch, resolved, refs, {k: v for k, v in schema.items() if k != key}
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        refs = set()
        resolved = resolver.resolve(all_of[0], refs)
        return all_of[0], resolved, refs, {k: v for k, v in schema.items() if k != "allOf"}
    return None


def _cycle_message(ref: str | None) -> str:
    where = f"$ref {ref!r} leads back to itself" if ref else "a union contains itself"
    return (
        f"{where} through allOf/anyOf/oneOf/not/if alone: a cycle that never reaches a schema "
        "(a recursive type needs properties or items between its references)"
    )


def _type_of(schema: Mapping[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        concrete = [t for t in declared if t != "null"]
        declared = concrete[0] if concrete else "null"
    if isinstance(declared, str):
        return declared
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "string"
    return "string"


def pointer_target(root: Any, ref: str) -> Any:
    """What the local ``$ref`` ``ref`` (``#``, ``#/$defs/X``, any JSON pointer) points to in
    ``root``, or None. Each step is unescaped as RFC 6901 says: percent-escapes (a URI fragment)
    first, then ``~1`` to ``/`` and ``~0`` to ``~``."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None  # another document, or a plain-name anchor
    node: Any = root
    for part in ref[2:].split("/"):
        key = pointer_step(part)
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def pointer_step(part: str) -> str:
    """One step of a JSON pointer in a URI fragment, unescaped (RFC 6901)."""
    if "%" in part:
        part = unquote(part)
    return part.replace("~1", "/").replace("~0", "~")


# Keywords whose subschemas apply to the value itself, not to a part of it: a $ref reached again
# through these alone is a cycle a validator follows forever (the value never gets smaller).
_IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else"})
_IN_PLACE_MAPS = frozenset({"dependentSchemas", "dependencies"})
# ... and those that apply to a part of it: an item, a property, a key
_TO_PARTS = frozenset(
    {
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "additionalProperties",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_TO_PARTS_MAPS = frozenset({"properties", "patternProperties"})
SUBSCHEMA_KEYWORDS = _IN_PLACE | _TO_PARTS
"""Keywords whose value is a schema or a list of schemas."""
SUBSCHEMA_MAP_KEYWORDS = _IN_PLACE_MAPS | _TO_PARTS_MAPS | {"$defs", "definitions"}
"""Keywords whose value is an object of schemas (``dependencies`` may hold lists of names)."""


def ref_cycle(schema: Mapping[str, Any]) -> str | None:
    """The first local ``$ref`` reachable in ``schema`` that leads back to itself through
    ``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not`` or ``if``/``then``/``else`` alone
    (``S = allOf[T]``, ``T = allOf[S]``): a validator follows it forever, whatever the value.
    None when there is none; a recursive type, which descends into a property or an item between
    its references, is fine."""
    in_place: dict[str, list[str]] = {}  # each reachable ref: the refs its target applies in place
    pending = _refs_in(schema, in_place_only=False)
    while pending:
        ref = pending.pop()
        if ref in in_place:
            continue
        target = pointer_target(schema, ref) if ref.startswith("#") else None
        if not isinstance(target, Mapping):
            in_place[ref] = []  # remote, an anchor or nowhere: the compiler judges it
            continue
        in_place[ref] = _refs_in(target, in_place_only=True)
        pending += _refs_in(target, in_place_only=False)
    return _first_cycle(in_place)


def _refs_in(schema: Mapping[str, Any], *, in_place_only: bool) -> list[str]:
    """The ``$ref``s of ``schema`` and of its subschemas (those applying in place only, if
    asked), definitions left out: they count where they are referred to. Iterative."""
    refs: list[str] = []
    stack = [schema]
    visited: set[int] = set()  # a schema built in Python may contain itself
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            refs.append(ref)
        for key, value in node.items():
            if key in _IN_PLACE_MAPS or (not in_place_only and key in _TO_PARTS_MAPS):
                children = list(value.values()) if isinstance(value, Mapping) else []
            elif key in _IN_PLACE or (not in_place_only and key in _TO_PARTS):
                children = value if isinstance(value, list) else [value]
            else:
                continue
            stack += [child for child in children if isinstance(child, Mapping)]
    return refs


def _first_cycle(graph: Mapping[str, Sequence[str]]) -> str | None:
    """A node of ``graph`` on a cycle, found by an iterative depth-first search; or None."""
    done: set[str] = set()
    for start in graph:
        if start in done:
            continue
        path = [(start, iter(graph[start]))]
        on_path = {start}
        while path:
            node, successors = path[-1]
            following = next(successors, None)
            if following is None:
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif following in on_path:
                return following
            elif following not in done and following in graph:
                path.append((following, iter(graph[following])))
                on_path.add(following)
    return None


def def_ref(name: str) -> str:
    """The ``$ref`` of ``$defs[name]``, the name escaped as a JSON pointer step."""
    return "#/$defs/" + name.replace("~", "~0").replace("/", "~1")


class _Resolver:
    """Follows local ``$ref``s (``#/$defs/X``, ``#/definitions/X``) of one root schema."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root

    def resolve(
        self, schema: Mapping[str, Any], followed: set[str] | None = None
    ) -> Mapping[str, Any]:
        """``schema`` with its ``$ref`` chain followed; the refs go into ``followed``."""
        seen: set[str] = set()
        while isinstance(ref := schema.get("$ref"), str):
            if not ref.startswith("#/"):
                return {k: v for k, v in schema.items() if k != "$ref"}
            if ref in seen:
                raise SchemaError(
                    f"$ref {ref!r} refers to itself (a cycle of references that never "
                    "reaches a schema)"
                )
            seen.add(ref)
            if followed is not None:
                followed.add(ref)
            target = pointer_target(self._root, ref)
            if not isinstance(target, Mapping):
                raise SchemaError(f"$ref {ref!r} does not point into the schema")
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **siblings}
        return schema


def is_lossless(
    schema: Mapping[str, Any], parameters: Sequence[ToolParameter] | None = None
) -> bool:
    """True when the parameter list (``parameters``, if already converted) says everything
    ``schema`` says."""
    try:
        converted = schema_to_parameters(schema) if parameters is None else parameters
        return parameters_to_schema(converted) == schema
    except SchemaError:
        return False


# -- validators ----------------------------------------------------------------------------------


def _refuse_remote_ref(uri: str) -> Any:
    raise SchemaError(f"remote $ref {uri!r} is not fetched; inline it or use $defs")


class _NoRemoteRefs(dict[str, Callable[[str], Any]]):
    """fastjsonschema's handlers by URI scheme: every scheme is "handled" by refusing it. With a
    plain dict, a scheme missing from it (``file``, ``ftp``, ``data``) was opened with urllib,
    and a local file's content became part of the schema (and of its errors)."""

    def __contains__(self, scheme: object) -> bool:
        return True

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse_remote_ref

    def get(self, scheme: str, default: Any = None) -> Callable[[str], Any]:
        return _refuse_remote_ref


_NO_REMOTE_REFS = _NoRemoteRefs()

_cache: dict[str, Callable[[Any], Any]] = {}
_cache_lock = threading.Lock()
_CACHE_LIMIT = 4096


def _compiled(schema: Mapping[str, Any], formats: bool = True) -> Callable[[Any], Any]:
    try:
        text = json.dumps(schema, sort_keys=True, default=str)
    except (RecursionError, ValueError, TypeError) as exc:
        raise SchemaError(f"cannot compile schema: {_json_fault(exc)}") from None
    key = text if formats else "~" + text
    fn = _cache.get(key)
    if fn is not None:
        return fn
    cycle = ref_cycle(schema)
    if cycle is not None:  # fastjsonschema compiles it, then recurses without end on each call
        raise SchemaError(f"cannot compile schema: {_cycle_message(cycle)}")
    import fastjsonschema  # on first compile: importing it costs 15 ms at startup

    try:
        fn = fastjsonschema.compile(
            # a deep copy: fastjsonschema rewrites each $ref in place against the $id above it
            copy.deepcopy(dict(schema)),
            handlers=_NO_REMOTE_REFS,
            use_default=False,
            use_formats=formats,
        )
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise SchemaError(f"cannot compile schema: {exc}") from exc
    except (RecursionError, SyntaxError, MemoryError):
        # The generated code nests as deep as the schema: Python's stack or its parser (100
        # levels of indentation, 20 nested blocks; a parser stack overflow is a MemoryError)
        # gives out from a few dozen levels on.
        raise SchemaError("cannot compile schema: it is nested too deeply") from None
    with _cache_lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.pop(next(iter(_cache)))
        _cache[key] = fn
    return fn


class Validator:
    """Checks arguments against one JSON Schema; compiled on first use, then cached.
    ``formats=False``: ``format`` is an annotation only, as JSON Schema 2020-12 has it by
    default (and MCP clients check results)."""

    __slots__ = ("_fn", "formats", "schema")

    def __init__(self, schema: Mapping[str, Any], *, formats: bool = True) -> None:
        self.schema = schema
        self.formats = formats
        self._fn: Callable[[Any], Any] | None = None

    def __call__(self, arguments: Any) -> None:
        """Raise ``ArgumentError`` naming the bad field's path when ``arguments`` do not fit
        (``SchemaError`` when the schema cannot be compiled)."""
        fn = self._fn
        if fn is None:
            fn = self._fn = _compiled(self.schema, self.formats)
        try:
            fn(arguments)
        except RecursionError:  # a recursive schema is checked a call deeper per level
            raise ArgumentError("the value is nested too deeply to check", path="$") from None
        except Exception as exc:
            if type(exc).__name__ != "JsonSchemaValueException":
                raise
            raise _explained(exc, arguments, self.schema) from None


# Keywords a draft-07 validator (fastjsonschema's newest) reads differently from a 2020-12 one,
# or not at all: where a schema uses one, only a 2020-12 validator judges it right.
_NEWER_OR_CHANGED = frozenset(
    {
        "prefixItems",
        "unevaluatedProperties",
        "unevaluatedItems",
        "dependentRequired",
        "dependentSchemas",
        "minContains",
        "maxContains",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
        "additionalItems",  # applied by draft-07, ignored by 2020-12
        "dependencies",  # likewise
        # annotations in 2020-12; fastjsonschema's draft-07 asserts them (decoding in place)
        "contentEncoding",
        "contentMediaType",
    }
)
# Keywords both drafts read alike but the two validators compute otherwise: fastjsonschema divides
# for multipleOf (in floats, or Decimals of the float's repr), jsonschema takes an exact remainder
# or a float quotient, so 0.3 (of 0.1), 1e308 (of 3 or 0.5) and 5e-324 (of 2**70) differ.
_COMPUTED_OTHERWISE = frozenset({"multipleOf"})
_NOT_ALIKE = _NEWER_OR_CHANGED | _COMPUTED_OTHERWISE
# What may stand beside a $ref and mean the same to both: annotations, and the definitions the
# ref points into (a pydantic model that refers to itself puts its $ref beside its $defs)
_BESIDE_REF = frozenset(
    {"$ref", "description", "title", "default", "examples", "$comment", "$defs", "definitions"}
)
# The metaschemas jsonschema's validator_for knows, each as it is looked up (an empty fragment
# dropped); any other $schema gets its newest draft, where fastjsonschema goes by a substring
# ("draft-04" anywhere: draft-04 rules).
_KNOWN_DRAFTS = frozenset(
    uri + end
    for uri in (
        "http://json-schema.org/draft-04/schema",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    )
    for end in ("", "#")
)


def validates_as_2020_12(schema: Any) -> bool:
    """Whether our (draft-07) validator applies ``schema`` as a JSON Schema 2020-12 validator
    would: ``False`` when the schema uses a keyword the two read differently (``prefixItems``,
    ``items`` as a list, ``$ref`` beside other assertions, ...) or names a draft neither knows.
    Errs on the side of ``False``: a property that happens to be called ``prefixItems`` counts
    too."""
    if isinstance(schema, dict):
        declared = schema.get("$schema")
        if declared is not None and not (isinstance(declared, str) and declared in _KNOWN_DRAFTS):
            return False
        return _reads_alike(schema, 0)
    return isinstance(schema, bool)


def _reads_alike(value: Any, depth: int) -> bool:
    if depth > 64:
        return False
    if isinstance(value, dict):
        keys = value.keys()
        if not _NOT_ALIKE.isdisjoint(keys) or isinstance(value.get("items"), list):
            return False
        if "$ref" in value and not _BESIDE_REF.issuperset(keys):
            return False  # draft-07 ignores what stands beside a $ref; 2020-12 applies it
        if isinstance(value.get("id"), str) and "$id" not in value:
            return False  # fastjsonschema takes draft-04's id for $id (a base for $refs below)
        pattern = value.get("pattern")
        if isinstance(pattern, str) and any(
            c == "$" and (i == 0 or pattern[i - 1] != "\\") for i, c in enumerate(pattern)
        ):
            # fastjsonschema turns each $ no backslash precedes into \Z (the very end);
            # jsonschema's re.search keeps Python's $ (also before a final newline)
            return False
        return all(_reads_alike(item, depth + 1) for item in value.values())
    if isinstance(value, list):
        return all(_reads_alike(item, depth + 1) for item in value)
    return True


def compile_validator(schema: Mapping[str, Any]) -> Validator:
    """A validator for ``schema``, compiled now so schema errors surface at once."""
    validator = Validator(schema)
    validator._fn = _compiled(schema)
    return validator


def _explained(exc: Any, arguments: Any, root: Mapping[str, Any]) -> ArgumentError:
    """``_argument_error``, or fastjsonschema's own words where explaining runs out of stack
    (it follows the bad value down, as deep as that is nested)."""
    try:
        return _argument_error(exc, arguments, root)
    except RecursionError:
        name = exc.name or "data"
        path = "$" + name[len("data") :] if name.startswith("data") else f"$.{name}"
        return ArgumentError(exc.message.removeprefix(name).strip(), path=path)


def _argument_error(exc: Any, arguments: Any, root: Mapping[str, Any]) -> ArgumentError:
    name = exc.name or "data"
    path = _path_of(name, arguments)
    value = exc.value
    definition = exc.definition if isinstance(exc.definition, Mapping) else {}
    if exc.rule in ("oneOf", "anyOf") and isinstance(value, Mapping):
        tagged = _discriminated_error(definition, value, path, root)
        if tagged is not None:
            return tagged
    if exc.rule in ("oneOf", "anyOf") and value is not None:
        # Optional[X]: a value that is not null is wrong the way it is wrong for X.
        branches = definition.get(exc.rule)
        concrete = [
            b for b in branches or () if not (isinstance(b, Mapping) and b.get("type") == "null")
        ]
        if isinstance(branches, list) and len(concrete) == 1 and isinstance(concrete[0], Mapping):
            inner = _refusal(concrete[0], value, root, path)
            if isinstance(inner, ArgumentError):
                return inner
    if exc.rule == "propertyNames" and isinstance(value, Mapping):
        names = definition.get("propertyNames")
        if isinstance(names, Mapping):
            for key in value:
                reason = _refusal(names, key, root)
                if reason is not None:
                    return ArgumentError(f"key {key!r} is not allowed: {reason}", path=path)
    if exc.rule == "required" and isinstance(value, Mapping):
        missing = [k for k in definition.get("required", ()) if k not in value]
        if missing:
            return ArgumentError(
                f"missing required property {missing[0]!r}", path=child_path(path, missing[0])
            )
    if exc.rule == "additionalProperties" and isinstance(value, Mapping):
        known = set(definition.get("properties") or ())
        extra = [k for k in value if k not in known]
        if extra:
            expected = ", ".join(sorted(known)) or "none"
            return ArgumentError(
                f"unexpected property {extra[0]!r} (expected: {expected})",
                path=child_path(path, extra[0]),
            )
    message = exc.message
    if message.startswith(name):
        message = message[len(name) :].strip()
    return ArgumentError(message, path=path)


def _discriminated_error(
    definition: Mapping[str, Any], value: Mapping[str, Any], path: str, root: Mapping[str, Any]
) -> ArgumentError | None:
    """The error of a value that fits no branch of a union tagged by a ``discriminator``
    (pydantic's ``Field(discriminator=...)``): the tag missing or unknown, or what is wrong
    in the branch the tag chooses, at its own path."""
    discriminator = definition.get("discriminator")
    if not isinstance(discriminator, Mapping):
        return None
    tag = discriminator.get("propertyName")
    branches = definition.get("oneOf") or definition.get("anyOf")
    if not isinstance(tag, str) or not isinstance(branches, list):
        return None
    chosen: dict[Any, Mapping[str, Any]] = {}
    for branch in branches:
        if not isinstance(branch, Mapping):
            continue  # a boolean schema tags nothing
        target = pointer_target(root, branch["$ref"]) if "$ref" in branch else branch
        prop = (
            (target or {}).get("properties", {}).get(tag) if isinstance(target, Mapping) else None
        )
        if isinstance(prop, Mapping):
            for known in [prop["const"]] if "const" in prop else prop.get("enum") or ():
                chosen.setdefault(_enum_text(known), branch)
    expected = ", ".join(repr(k) for k in chosen) or "none"
    if tag not in value:
        return ArgumentError(
            f"missing required property {tag!r} (one of {expected})", path=child_path(path, tag)
        )
    branch = chosen.get(_enum_text(value[tag]))
    if branch is None:
        return ArgumentError(f"{value[tag]!r} is not one of {expected}", path=child_path(path, tag))
    reason = _refusal(branch, value, root, path)
    return reason if isinstance(reason, ArgumentError) else None


def _refusal(
    schema: Mapping[str, Any], value: Any, root: Mapping[str, Any], path: str | None = None
) -> Any:
    """Why ``value`` does not fit ``schema`` (a part of ``root``, its ``$ref``s into root's
    definitions): None when it fits; an ArgumentError placed under ``path`` when one is given,
    else the reason's text."""
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
    try:
        _compiled({**defs, "allOf": [dict(schema)]})(value)
    except SchemaError:
        return None
    except Exception as exc:
        if type(exc).__name__ != "JsonSchemaValueException":
            raise
        inner = _argument_error(exc, value, root)
        if path is None:
            return inner.reason
        return ArgumentError(inner.reason, path=path + inner.path[1:])
    return None


def _path_of(name: str, arguments: Any) -> str:
    """The JSON path of the value fastjsonschema calls ``name``: ``data`` and its steps
    (``.key``, ``[0]``) joined unescaped, so ``data.a.b`` may be key ``"a.b"``. The steps are
    read off the arguments themselves, each key written as ``_child`` writes it."""
    steps = _steps(name[len("data") :], arguments) if name.startswith("data") else None
    if steps is None:
        return "$" + name[len("data") :] if name.startswith("data") else f"$.{name}"
    path = "$"
    for step in steps:
        path = child_path(path, step)
    return path


def _steps(rest: str, value: Any) -> list[str | int] | None:
    """The keys and indexes leading into ``value`` that spell ``rest``, or None."""
    if not rest:
        return []
    if isinstance(value, list) and rest.startswith("["):
        index, close, after = rest[1:].partition("]")
        if close and index.isdigit() and int(index) < len(value):
            found = _steps(after, value[int(index)])
            return None if found is None else [int(index), *found]
        return None
    if isinstance(value, Mapping) and rest.startswith("."):
        for key in sorted(value, key=lambda k: -len(str(k))):  # longest first: "a.b" over "a"
            if isinstance(key, str) and rest.startswith(key, 1):
                found = _steps(rest[1 + len(key) :], value[key])
                if found is not None:
                    return [key, *found]
    return None


def child_path(path: str, key: Any) -> str:
    """The JSON path of ``key`` (an object key or an array index) below ``path``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    if text.isidentifier():
        return f"{path}.{text}"
    return f"{path}[{json.dumps(text)}]"
