"""JSON Schemas rewritten into the dialects model providers accept.

``openai_strict_schema`` gives OpenAI's strict mode (Structured Outputs) its subset: every object
closed (``additionalProperties: false``) with every property required, optional properties made
nullable instead, ``oneOf`` as ``anyOf``, ``$ref``s kept under the root's ``$defs`` (strict mode
follows them, recursion included) but never beside other keywords, and keywords it refuses
dropped (a default moves into the description).

``gemini_schema`` gives Gemini's OpenAPI-style ``Schema``: upper-case types, ``nullable``
instead of null types, string-only enums, no ``$ref``/``$defs`` (references are inlined, so a
recursive type is an error) and no ``additionalProperties``.

In both, a union whose siblings constrain it too (``{"type": "string", "anyOf": [{"format":
"date"}, ...]}``) has the siblings copied into each branch: a provider reads each branch alone.

``object_root`` gives the root every provider wants: one plain object, a union (or ``allOf``,
``$ref``) at the root merged into it.

All raise ``SchemaError`` naming the JSON path of the part they cannot express.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from toolmesh.errors import SchemaError
from toolmesh.schema import def_ref, pointer_step, pointer_target

__all__ = ["OPENAI_STRICT_LIMITS", "gemini_schema", "object_root", "openai_strict_schema"]

JsonSchema = dict[str, Any]

OPENAI_STRICT_LIMITS = {"depth": 10, "properties": 5000, "enum": 1000}
"""OpenAI's documented ceilings for one strict schema: nesting, properties in all, enum size."""

# Keywords strict mode accepts; anything else is dropped (the pipeline still validates it).
_OPENAI_KEYWORDS = frozenset(
    {
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
)
_OPENAI_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)

_GEMINI_TYPES = {
    "string": "STRING",
    "number": "NUMBER",
    "integer": "INTEGER",
    "boolean": "BOOLEAN",
    "array": "ARRAY",
    "object": "OBJECT",
    "null": "NULL",
}
_GEMINI_FORMATS = {
    "STRING": {"enum", "date-time"},
    "NUMBER": {"float", "double"},
    "INTEGER": {"int32", "int64"},
}
_GEMINI_COPIED = {
    "title": "title",
    "description": "description",
    "pattern": "pattern",
    "minimum": "minimum",
    "maximum": "maximum",
    "minItems": "min_items",
    "maxItems": "max_items",
    "minLength": "min_length",
    "maxLength": "max_length",
    "minProperties": "min_properties",
    "maxProperties": "max_properties",
}


def _path_text(path: tuple[str | int, ...]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class _Refs:
    """Local ``$ref`` lookups in one root schema (``#``, ``#/$defs/X``, any JSON pointer)."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def target(self, ref: str, path: tuple[str | int, ...]) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise SchemaError(f"{_path_text(path)}: $ref {ref!r} is not local; it is not fetched")
        node = pointer_target(self.root, ref)
        if not isinstance(node, Mapping):
            raise SchemaError(f"{_path_text(path)}: $ref {ref!r} points nowhere")
        return node


# Keywords that describe a schema rather than constrain its values: a union's siblings among
# these stay beside it; the others are copied into its branches (``_distributed``).
_DESCRIPTIVE = frozenset(
    {
        "description",
        "title",
        "default",
        "examples",
        "discriminator",  # OpenAPI's hint for a union of objects, about the branches as they are
        "nullable",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "$schema",
        "$id",
        "$defs",
        "definitions",
    }
)


def _distributed(schema: JsonSchema, union: str) -> JsonSchema:
    """``schema``'s union (under the key ``union``) with the sibling keywords that constrain it
    copied into each branch. ``{"type": "object", "properties": ..., "oneOf": [{"required":
    ["id"]}, {"required": ["email"]}]}`` means each branch together with the siblings, but a
    provider reads each branch alone, and a branch of constraints only tells it nothing (OpenAI's
    strict mode refuses one without a type; Gemini saw ``{}``)."""
    siblings = {k: v for k, v in schema.items() if k not in _DESCRIPTIVE and k != union}
    if not siblings:
        return schema
    outer = {k: v for k, v in schema.items() if k in _DESCRIPTIVE}
    return {**outer, union: [_with_siblings(siblings, b) for b in schema[union]]}


# Keywords that constrain values of one type only: not copied into a branch of another type.
_TYPE_KEYWORDS = {
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
    },
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"},
    "string": {"minLength", "maxLength", "pattern"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}


def _applies(keyword: str, types: Any) -> bool:
    """Whether a sibling ``keyword`` constrains a branch declaring ``types`` (none: any)."""
    declared = [types] if isinstance(types, str) else types
    if not isinstance(declared, list):
        return True
    kinds = {"number" if t == "integer" else t for t in declared}
    owners = {kind for kind, words in _TYPE_KEYWORDS.items() if keyword in words}
    return not owners or bool(owners & kinds)


def _with_siblings(siblings: Mapping[str, Any], branch: Any) -> Any:
    if not isinstance(branch, Mapping) or branch.get("type") == "null":
        return branch  # the siblings constrain the other values; null stays null
    types = branch.get("type")
    siblings = {k: v for k, v in siblings.items() if _applies(k, types)}
    merged = {**siblings, **branch}
    own, shared = branch.get("properties"), siblings.get("properties")
    if isinstance(own, Mapping) and isinstance(shared, Mapping):
        merged["properties"] = {**shared, **own}
    needed = [*(siblings.get("required") or ()), *(branch.get("required") or ())]
    if needed:
        merged["required"] = list(dict.fromkeys(needed))
    return merged


def _with_default_in_description(schema: Mapping[str, Any]) -> JsonSchema:
    out = dict(schema)
    if "default" in out:
        default = out.pop("default")
        if default is not None:
            note = f"Default: {_json(default)}."
            text = str(out.get("description") or "").rstrip()
            out["description"] = f"{text} ({note})" if text else note
    return out


# -- OpenAI strict mode --------------------------------------------------------------------------


def openai_strict_schema(schema: Mapping[str, Any]) -> JsonSchema:
    """``schema`` in OpenAI strict mode's subset, or ``SchemaError`` naming what cannot be."""
    source = copy.deepcopy(dict(schema))
    defs: JsonSchema = {}
    for key in ("$defs", "definitions"):
        found = source.pop(key, None)
        if isinstance(found, Mapping):
            defs.update(found)
    refs = _Refs({**source, "$defs": defs, "definitions": defs})
    converter = _StrictConverter(refs)
    root = converter.node(source, (), depth=0)
    if root.get("type") != "object" or "anyOf" in root:
        raise SchemaError("$: the root of a strict schema must be an object")
    if converter.defs:
        root["$defs"] = converter.defs
    if converter.property_count > OPENAI_STRICT_LIMITS["properties"]:
        raise SchemaError(
            f"$: {converter.property_count} properties exceed strict mode's "
            f"{OPENAI_STRICT_LIMITS['properties']}"
        )
    return root


class _StrictConverter:
    def __init__(self, refs: _Refs) -> None:
        self.refs = refs
        self.defs: JsonSchema = {}
        self.property_count = 0
        self._inlining: list[str] = []

    def node(self, raw: Any, path: tuple[str | int, ...], *, depth: int) -> JsonSchema:
        if raw is True or (isinstance(raw, Mapping) and not _meaningful(raw)):
            raise SchemaError(f"{_path_text(path)}: a value of any type cannot be strict")
        if not isinstance(raw, Mapping):
            raise SchemaError(f"{_path_text(path)}: expected a schema, got {raw!r}")
        if depth > OPENAI_STRICT_LIMITS["depth"]:
            raise SchemaError(
                f"{_path_text(path)}: nested deeper than strict mode's "
                f"{OPENAI_STRICT_LIMITS['depth']} levels"
            )
        schema = _with_default_in_description(raw)
        if "$ref" in schema:
            return self._ref(schema, path, depth=depth)
        schema = self._merge_all_of(schema, path)
        if "oneOf" in schema:
            schema["anyOf"] = [*schema.pop("oneOf"), *schema.get("anyOf", [])]
        if isinstance(schema.get("anyOf"), list):
            schema = _distributed(schema, "anyOf")
        out: JsonSchema = {}
        for key, value in schema.items():
            if key not in _OPENAI_KEYWORDS or key in ("$defs", "additionalProperties"):
                continue
            if key == "format" and value not in _OPENAI_FORMATS:
                continue
            out[key] = value
        if "anyOf" in out:
            out["anyOf"] = _spliced(
                self.node(branch, (*path, "anyOf", i), depth=depth + 1)
                for i, branch in enumerate(out["anyOf"])
            )
        if "items" not in out and isinstance(schema.get("prefixItems"), list):
            out["items"] = _tuple_items(schema["prefixItems"])
        if "items" in out:
            out["items"] = self.node(out["items"], (*path, "items"), depth=depth + 1)
        elif _has_type(out, "array"):
            raise SchemaError(
                f"{_path_text(path)}: an array without an items schema cannot be strict"
            )
        if isinstance(out.get("enum"), list) and len(out["enum"]) > OPENAI_STRICT_LIMITS["enum"]:
            raise SchemaError(f"{_path_text(path)}: more than 1000 enum values")
        if _is_object(out, schema):
            self._object(out, schema, path, depth=depth)
        if "type" not in out and "anyOf" not in out:
            return _typed_values(out, path)
        return out

    def _ref(self, schema: JsonSchema, path: tuple[str | int, ...], *, depth: int) -> JsonSchema:
        ref = str(schema["$ref"])
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if not siblings or ref in self._inlining:
            # A bare reference stays one (recursion needs it); a recursive reference with
            # siblings loses them, since strict mode refuses both together.
            return {"$ref": self._keep_ref(ref, path)}
        target = self.refs.target(ref, path)
        self._inlining.append(ref)
        try:
            return self.node({**target, **siblings}, path, depth=depth)
        finally:
            self._inlining.pop()

    def _keep_ref(self, ref: str, path: tuple[str | int, ...]) -> str:
        if ref == "#":
            return ref
        name = _def_name(ref)
        if name is None:
            raise SchemaError(
                f"{_path_text(path)}: $ref {ref!r} must point into $defs for strict mode"
            )
        target = self.refs.target(ref, path)
        if name not in self.defs:
            self.defs[name] = {}  # placeholder: a recursive reference finds it taken
            self.defs[name] = self.node(target, ("$defs", name), depth=0)
        return def_ref(name)

    def _merge_all_of(self, schema: JsonSchema, path: tuple[str | int, ...]) -> JsonSchema:
        branches = schema.pop("allOf", None)
        if not isinstance(branches, list):
            return schema
        merged: JsonSchema = {}
        for i, branch in enumerate(branches):
            if not isinstance(branch, Mapping):
                raise SchemaError(f"{_path_text((*path, 'allOf', i))}: expected a schema")
            if "$ref" in branch:
                branch = {**self.refs.target(str(branch["$ref"]), path), **branch}
                branch.pop("$ref")
            for key, value in branch.items():
                if key == "properties":
                    merged.setdefault("properties", {}).update(value)
                elif key == "required":
                    merged["required"] = [*merged.get("required", []), *value]
                elif key in merged and merged[key] != value:
                    raise SchemaError(
                        f"{_path_text(path)}: allOf branches disagree on {key!r}; "
                        "strict mode has no allOf"
                    )
                else:
                    merged[key] = value
        return {**merged, **schema}

    def _object(
        self, out: JsonSchema, schema: Mapping[str, Any], path: tuple[str | int, ...], *, depth: int
    ) -> None:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        # Closing an object that says what its other keys hold (``**kwargs: str``, at the root
        # too) would take them away: strict mode has no open objects.
        if isinstance(extra, Mapping) or (not properties and extra is not False and path):
            raise SchemaError(  # (the root without properties: a tool without arguments)
                f"{_path_text(path)}: an object with free-form keys (a dict, **kwargs) cannot "
                "be strict"
            )
        required = set(schema.get("required") or ())
        converted: JsonSchema = {}
        for key, value in (properties or {}).items():
            self.property_count += 1
            child = self.node(value, (*path, "properties", key), depth=depth + 1)
            converted[key] = child if key in required else _nullable(child)
        out["type"] = "object"
        out["properties"] = converted
        out["required"] = list(converted)
        out["additionalProperties"] = False


_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: True is an int too
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (type(None), "null"),
)


def _json_type(value: Any) -> str | None:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), None)


def _typed_values(out: JsonSchema, path: tuple[str | int, ...]) -> JsonSchema:
    """A strict node without a type: strict mode refuses it ("schema must have a 'type' key").
    An enum or const gets the type of its values (values of several types: one branch each, as
    ``Literal[1, "x"]`` gives); anything else cannot be strict."""
    values = [out["const"]] if "const" in out else out.get("enum")
    if not isinstance(values, list) or not values:
        raise SchemaError(f"{_path_text(path)}: a schema without a type cannot be strict")
    by_type: dict[str, list[Any]] = {}
    for value in values:
        name = _json_type(value)
        if name is None:
            raise SchemaError(
                f"{_path_text(path)}: an enum of {type(value).__name__} values cannot be strict"
            )
        by_type.setdefault(name, []).append(value)
    if len(by_type) == 1:
        return {**out, "type": next(iter(by_type))}
    outer: JsonSchema = {k: out[k] for k in ("description", "title") if k in out}
    branches = [
        {"type": name} if name == "null" else {"type": name, "enum": group}
        for name, group in by_type.items()
    ]
    return {**outer, "anyOf": branches}


def _spliced(branches: Iterable[JsonSchema]) -> list[JsonSchema]:
    """Branches of a union, the branches of a branch that is only a union put in its place."""
    out: list[JsonSchema] = []
    for branch in branches:
        inner = branch.get("anyOf")
        if isinstance(inner, list) and set(branch) <= {"anyOf", "description", "title"}:
            out.extend(inner)
        else:
            out.append(branch)
    return out


def _meaningful(schema: Mapping[str, Any]) -> bool:
    return any(k not in ("description", "title", "default", "examples") for k in schema)


def _has_type(schema: Mapping[str, Any], name: str) -> bool:
    declared = schema.get("type")
    return declared == name or (isinstance(declared, list) and name in declared)


def _is_object(out: Mapping[str, Any], schema: Mapping[str, Any]) -> bool:
    if _has_type(out, "object"):
        return True
    return out.get("type") is None and "properties" in schema


def _def_name(ref: str) -> str | None:
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix) and "/" not in ref[len(prefix) :]:
            return pointer_step(ref[len(prefix) :])
    return None


def _nullable(schema: JsonSchema) -> JsonSchema:
    """``schema`` that also accepts null: the way strict mode marks a property optional."""
    declared = schema.get("type")
    if _accepts_null(schema):
        return schema
    if isinstance(declared, str) and "anyOf" not in schema and "$ref" not in schema:
        out = {**schema, "type": [declared, "null"]}
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        if "const" in out:
            out["enum"] = [out.pop("const"), None]
        return out
    if isinstance(declared, list):
        out = {**schema, "type": declared if "null" in declared else [*declared, "null"]}
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]  # or null stays refused: the field is not optional
        return out
    if "anyOf" in schema and set(schema) <= {"anyOf", "description", "title"}:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    outer: JsonSchema = {k: schema[k] for k in ("description", "title") if k in schema}
    inner = {k: v for k, v in schema.items() if k not in outer}
    return {**outer, "anyOf": [inner, {"type": "null"}]}


def _accepts_null(schema: Mapping[str, Any]) -> bool:
    declared = schema.get("type")
    enum = schema.get("enum")
    if isinstance(enum, list) and None not in enum:
        return False  # whatever the type says, the enum refuses null
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    branches = schema.get("anyOf")
    return isinstance(branches, list) and any(
        isinstance(b, Mapping) and b.get("type") == "null" for b in branches
    )


# -- Gemini --------------------------------------------------------------------------------------


def gemini_schema(schema: Mapping[str, Any]) -> JsonSchema:
    """``schema`` as a Gemini ``Schema`` (snake_case keys, as the google-genai SDK takes them)."""
    defs: JsonSchema = {}
    for key in ("$defs", "definitions"):
        found = schema.get(key)
        if isinstance(found, Mapping):
            defs.update(found)
    refs = _Refs({**schema, "$defs": defs, "definitions": defs})
    return _GeminiConverter(refs).node(schema, ())


class _GeminiConverter:
    def __init__(self, refs: _Refs) -> None:
        self.refs = refs
        self._stack: list[str] = []

    def node(self, raw: Any, path: tuple[str | int, ...]) -> JsonSchema:
        if raw is True:
            return {}
        if not isinstance(raw, Mapping):
            raise SchemaError(f"{_path_text(path)}: expected a schema, got {raw!r}")
        schema = _with_default_in_description(raw)
        if "$ref" in schema:
            return self._ref(schema, path)
        if isinstance(schema.get("allOf"), list):
            schema = self._merge_all_of(schema, path)
        branches = [*schema.pop("anyOf", []), *schema.pop("oneOf", [])]
        if branches:
            return self._union(schema, branches, path)
        out: JsonSchema = {}
        declared = schema.get("type")
        nullable = False
        if isinstance(declared, list):
            concrete = [t for t in declared if t != "null"]
            nullable = len(concrete) < len(declared)
            if len(concrete) > 1:
                alternatives = [{**schema, "type": t} for t in concrete]
                return self._union({"nullable": True} if nullable else {}, alternatives, path)
            declared = concrete[0] if concrete else "null"
        if declared is None:
            declared = _implied_type(schema)
        if declared is not None:
            if declared not in _GEMINI_TYPES:
                raise SchemaError(f"{_path_text(path)}: unknown type {declared!r}")
            out["type"] = _GEMINI_TYPES[declared]
        for key, target in _GEMINI_COPIED.items():
            if key in schema:
                out[target] = schema[key]
        self._enum(out, schema)
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _GEMINI_FORMATS.get(out.get("type", ""), ()):
            out["format"] = fmt
        if nullable or schema.get("nullable") is True:
            out["nullable"] = True
        items = schema.get("items")
        if items is None and isinstance(schema.get("prefixItems"), list):
            items = _tuple_items(schema["prefixItems"])
        if isinstance(items, Mapping | bool):
            out["items"] = self.node(items, (*path, "items"))
        typed = out.get("items", {})
        if out.get("type") == "ARRAY" and not (typed.get("type") or typed.get("any_of")):
            # Gemini refuses an array without a typed item ("items: missing field"), and has no
            # "any": text is what a model can always give
            out["items"] = {**out.get("items", {}), "type": "STRING"}
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties:
            out["properties"] = {
                key: self.node(value, (*path, "properties", key))
                for key, value in properties.items()
            }
            out["property_ordering"] = list(properties)
            required = [k for k in schema.get("required") or () if k in properties]
            if required:
                out["required"] = required
        return out

    def _ref(self, schema: JsonSchema, path: tuple[str | int, ...]) -> JsonSchema:
        ref = str(schema.pop("$ref"))
        if ref in self._stack:
            name = _def_name(ref) or ref
            raise SchemaError(
                f"{_path_text(path)}: the recursive type {name!r} cannot be expressed for "
                "Gemini, whose function declarations have no $ref"
            )
        self._stack.append(ref)
        try:
            return self.node({**self.refs.target(ref, path), **schema}, path)
        finally:
            self._stack.pop()

    def _merge_all_of(self, schema: JsonSchema, path: tuple[str | int, ...]) -> JsonSchema:
        merged: JsonSchema = {}
        for i, branch in enumerate(schema.pop("allOf")):
            if not isinstance(branch, Mapping):
                raise SchemaError(f"{_path_text((*path, 'allOf', i))}: expected a schema")
            if "$ref" in branch:
                ref = str(branch["$ref"])
                if ref in self._stack:
                    raise SchemaError(
                        f"{_path_text(path)}: the recursive type {_def_name(ref) or ref!r} "
                        "cannot be expressed for Gemini"
                    )
                branch = {**self.refs.target(ref, path), **branch}
                branch.pop("$ref")
            for key, value in branch.items():
                if key == "properties":
                    merged.setdefault("properties", {}).update(value)
                elif key == "required":
                    merged["required"] = [*merged.get("required", []), *value]
                else:
                    merged.setdefault(key, value)
        return {**merged, **schema}

    def _union(
        self, schema: JsonSchema, branches: list[Any], path: tuple[str | int, ...]
    ) -> JsonSchema:
        concrete = [b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")]
        nullable = len(concrete) < len(branches) or schema.get("nullable") is True
        concrete = _distributed({**schema, "anyOf": concrete}, "anyOf")["anyOf"]
        described: JsonSchema = {k: schema[k] for k in ("description", "title") if k in schema}
        if len(concrete) <= 1:
            only = concrete[0] if concrete else {"type": "null"}
            out = self.node({**only, **described}, path)
        else:
            converted = [self.node(b, (*path, "anyOf", i)) for i, b in enumerate(concrete)]
            # Branches that differed only in what Gemini cannot say (two string formats) are one.
            distinct = [c for i, c in enumerate(converted) if c not in converted[:i]]
            out = distinct[0] if len(distinct) == 1 else {"any_of": distinct}
            out = {**out, **described}
        if nullable:
            out["nullable"] = True
        return out

    @staticmethod
    def _enum(out: JsonSchema, schema: Mapping[str, Any]) -> None:
        values = schema.get("enum")
        if "const" in schema:
            values = [schema["const"]]
        if not isinstance(values, list):
            return
        concrete = [v for v in values if v is not None]
        if None in values:
            out["nullable"] = True
        if concrete and all(isinstance(v, str) for v in concrete):
            out["enum"] = concrete
            out.setdefault("type", "STRING")
            if out["type"] == "STRING":
                out["format"] = "enum"
            return
        # Gemini enums hold strings only: other values are stated in the description.
        note = "Allowed values: " + ", ".join(_json(v) for v in concrete) + "."
        text = str(out.get("description") or "").rstrip()
        out["description"] = f"{text} {note}" if text else note


def _tuple_items(prefix: list[Any]) -> Any:
    """One items schema for a fixed-length tuple (``prefixItems``), which neither provider
    takes: any of its positions' schemas (the pipeline still checks each position)."""
    distinct = [s for i, s in enumerate(prefix) if s not in prefix[:i]]
    return distinct[0] if len(distinct) == 1 else {"anyOf": distinct}


def _implied_type(schema: Mapping[str, Any]) -> str | None:
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


# -- the root: one object ------------------------------------------------------------------------

# What providers refuse at the root of a tool's input schema (Anthropic: "input_schema does not
# support oneOf, allOf, or anyOf at the top level"; OpenAI: "must have type 'object' and not have
# 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level"), and ``$ref``, followed here.
_ROOT_REFUSED = ("anyOf", "oneOf", "allOf", "not", "enum", "$ref")
_NOT_OBJECT = "an input schema must be an object at its root"


def object_root(schema: JsonSchema) -> tuple[JsonSchema, str]:
    """``schema`` as one plain object at its root, and a note for the tool's description ("" if
    none). A union at the root (``anyOf``/``oneOf``, as ``z.union`` or "give id or email" make
    it) becomes one object with every branch's properties, requiring what every branch requires,
    and the note names the alternatives; ``allOf`` and ``$ref`` are merged in; ``not`` and
    ``enum`` are dropped. The merged form accepts every call the schema does (and some more: the
    pipeline still validates against the schema itself). ``SchemaError`` when the root, or a
    branch of its union, is not an object."""
    if not any(key in schema for key in _ROOT_REFUSED):
        if schema.get("type") == "object" and "properties" in schema:
            return schema, ""  # nearly every tool: as it is
        if schema.get("type") in (None, "object"):
            return {**schema, "type": "object", "properties": schema.get("properties", {})}, ""
        raise SchemaError(_NOT_OBJECT)
    merger = _RootMerger(schema)
    merged = merger.object(schema, (), frozenset())
    for key in ("$defs", "definitions"):
        if key in schema:
            merged[key] = schema[key]  # what the properties still refer to
    return merged, " ".join(merger.notes)


class _RootMerger:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.refs = _Refs(root)
        self.notes: list[str] = []

    def object(self, node: Any, path: tuple[str | int, ...], seen: frozenset[str]) -> JsonSchema:
        """``node`` as one object schema: its own keywords and all its parts merged."""
        if node is True:
            return {"type": "object", "properties": {}}
        if not isinstance(node, Mapping):
            raise SchemaError(f"{_NOT_OBJECT} ({_path_text(path)} is {node!r})")
        declared = node.get("type")
        if declared not in (None, "object") and not (
            isinstance(declared, list) and "object" in declared
        ):
            raise SchemaError(f"{_NOT_OBJECT} ({_path_text(path)} is of type {declared!r})")
        parts = [
            {
                **{k: v for k, v in node.items() if k not in _ROOT_REFUSED and k not in _DEFS},
                "type": "object",
            }
        ]
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in seen:
                raise SchemaError(f"{_path_text(path)}: the root refers to itself ({ref!r})")
            target = self.refs.target(ref, path)
            parts.append(self.object(target, (*path, "$ref"), seen | {ref}))
        for i, branch in enumerate(_listed(node.get("allOf"))):
            parts.append(self.object(branch, (*path, "allOf", i), seen))
        for union in ("anyOf", "oneOf"):
            branches = _listed(node.get(union))
            if branches:
                parts.append(self._union(union, branches, path, seen))
        return _conjunction(parts)

    def _union(
        self, union: str, branches: list[Any], path: tuple[str | int, ...], seen: frozenset[str]
    ) -> JsonSchema:
        objects = [
            self.object(branch, (*path, union, i), seen)
            for i, branch in enumerate(branches)
            if not (isinstance(branch, Mapping) and branch.get("type") == "null")  # never null
        ]
        if not any(step in ("anyOf", "oneOf") for step in path):  # the alternatives of the tool
            self.notes.append(_alternatives_note(union, objects))
        return _disjunction(objects)


_DEFS = ("$defs", "definitions")


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _distinct(schemas: list[Any]) -> list[Any]:
    return [s for i, s in enumerate(schemas) if s not in schemas[:i]]


def _conjunction(parts: list[JsonSchema]) -> JsonSchema:
    """One object meaning all of ``parts``: their properties (a property two parts describe
    differently, as the ``allOf`` of both) and all their required keys."""
    out: JsonSchema = {}
    properties: dict[str, list[Any]] = {}
    required: list[Any] = []
    closed = False
    for part in parts:
        for key, value in part.items():
            if key == "properties" and isinstance(value, Mapping):
                for name, prop in value.items():
                    properties.setdefault(name, []).append(prop)
            elif key == "required" and isinstance(value, list):
                required.extend(value)
            elif key == "additionalProperties" and value is False:
                closed = True  # the keys of a value are within that part's, so within these
            else:
                out.setdefault(key, value)  # the root's own first (its description)
    if closed:
        out["additionalProperties"] = False
    out["properties"] = {
        name: found[0] if len(found) == 1 else {"allOf": found}
        for name, found in ((name, _distinct(props)) for name, props in properties.items())
    }
    if required:
        out["required"] = list(dict.fromkeys(required))
    return out


def _disjunction(objects: list[JsonSchema]) -> JsonSchema:
    """One object accepting what any of ``objects`` does: every property (a property the
    branches describe differently, as the ``anyOf`` of them), required only where every branch
    requires it, closed only when every branch is."""
    properties: dict[str, list[Any]] = {}
    for obj in objects:
        for name, prop in (obj.get("properties") or {}).items():
            properties.setdefault(name, []).append(prop)
    out: JsonSchema = {
        "type": "object",
        "properties": {name: _either(props) for name, props in properties.items()},
    }
    if objects:
        first = objects[0].get("required") or []
        required = [k for k in first if all(k in (o.get("required") or ()) for o in objects)]
        if required:
            out["required"] = required
        if all(o.get("additionalProperties") is False for o in objects):
            out["additionalProperties"] = False
    return out


def _either(schemas: list[Any]) -> Any:
    """One schema for a property the branches of a union describe, each in its own way: the
    constants of a discriminator (``kind: "cat"`` | ``kind: "dog"``) as one enum."""
    distinct = _distinct(schemas)
    if len(distinct) == 1:
        return distinct[0]
    values = [_constants(s) for s in distinct]
    types = _distinct([s.get("type") for s in distinct if isinstance(s, Mapping)])
    if all(v is not None for v in values) and len(types) == 1:
        enum = _distinct([v for group in values if group is not None for v in group])
        return {"type": types[0], "enum": enum} if types[0] is not None else {"enum": enum}
    return {"anyOf": distinct}


def _constants(schema: Any) -> list[Any] | None:
    """The values a schema of constants allows (``const`` or ``enum``), None for another schema."""
    if not isinstance(schema, Mapping) or not set(schema) <= {
        "const",
        "enum",
        "type",
        "title",
        "description",
    }:
        return None
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _alternatives_note(union: str, objects: list[JsonSchema]) -> str:
    """What tells a model the alternatives of a union merged away, in the tool's description:
    ``The arguments must match exactly one of: (1) requires id; (2) requires email.``"""
    how = "exactly one" if union == "oneOf" else "at least one"
    forms = "; ".join(f"({i}) {_form(obj)}" for i, obj in enumerate(objects, 1))
    return f"The arguments must match {how} of: {forms}."


def _form(obj: JsonSchema) -> str:
    properties = obj.get("properties") or {}
    fixed = {
        name: values[0]
        for name, values in ((n, _constants(p)) for n, p in properties.items())
        if values is not None and len(values) == 1
    }
    needed = [k for k in obj.get("required") or () if k not in fixed]
    parts = [f"{name}={_json(value)}" for name, value in fixed.items()]
    if needed:
        parts.append("requires " + ", ".join(map(str, needed)))
    text = ", ".join(parts) or "no required arguments"
    label = obj.get("title") or obj.get("description")
    return f"{label}: {text}" if isinstance(label, str) and label else text
