"""JSON Schemas rewritten into the dialects model providers accept.

``openai_strict_schema`` gives OpenAI's strict mode (Structured Outputs) its subset: every object
closed (``additionalProperties: false``) with every property required, optional properties made
nullable instead, ``oneOf`` as ``anyOf``, ``$ref``s kept under the root's ``$defs`` (strict mode
follows them, recursion included) but never beside other keywords, and keywords it refuses
dropped (a default moves into the description).

``gemini_schema`` gives Gemini's OpenAPI-style ``Schema``: upper-case types, ``nullable``
instead of null types, string-only enums, no ``$ref``/``$defs`` (references are inlined, so a
recursive type is an error) and no ``additionalProperties``.

Both raise ``SchemaError`` naming the JSON path of the part they cannot express.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from toolmesh.errors import SchemaError
from toolmesh.schema import def_ref, pointer_step, pointer_target

__all__ = ["OPENAI_STRICT_LIMITS", "gemini_schema", "openai_strict_schema"]

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
        out: JsonSchema = {}
        for key, value in schema.items():
            if key not in _OPENAI_KEYWORDS or key in ("$defs", "additionalProperties"):
                continue
            if key == "format" and value not in _OPENAI_FORMATS:
                continue
            out[key] = value
        if "anyOf" in out:
            out["anyOf"] = [
                self.node(branch, (*path, "anyOf", i), depth=depth + 1)
                for i, branch in enumerate(out["anyOf"])
            ]
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
        rest = {k: v for k, v in schema.items() if k not in ("type", "nullable")}
        if len(concrete) == 1:
            out = self.node({**concrete[0], **rest}, path)
        else:
            out = {"any_of": [self.node(b, (*path, "anyOf", i)) for i, b in enumerate(concrete)]}
            for key in ("description", "title"):
                if key in rest:
                    out[key] = rest[key]
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
