"""Tools from an OpenAPI 3.x document: one tool per operation.

The document may be JSON or YAML, a local file, a URL or an already-parsed mapping. Each
operation becomes an HTTP tool (``toolmesh.sources.http``) named by its ``operationId`` (or by
method and path), described by its summary and description, and taking its path, query, header
and cookie parameters as arguments, plus ``body`` for a request body (``request_body`` if a
parameter already holds that name). Parameters of one name in two places get the place as a
suffix (``id_query``), and a number after that when another argument has that name too
(``id_query_2``, ``request_body_2``): no argument ever replaces another.

``$ref``s to the document's own parts are resolved, under every keyword that holds a schema:
``#/components/schemas/X`` becomes ``#/$defs/X`` inside each tool's schema (so recursive types
keep working; each component is converted once and shared by the tools that reach it), other
references are inlined. A reference to another document is a ``ConfigError``: nothing is fetched
beyond the document itself; so is a cycle of references that never reaches a schema
(``S = allOf[T]``, ``T = allOf[S]``). OpenAPI 3.0's ``nullable``, boolean
``exclusiveMinimum``/``exclusiveMaximum`` and its annotation-only keywords (``example``, ``xml``,
``discriminator``, ...) are rewritten to plain JSON Schema.

YAML is read as YAML 1.2 reads it (as OpenAPI asks): only ``true`` and ``false`` are booleans,
``on``, ``no`` and ``NO`` are text. Path parameters honour their ``style`` (``simple``, ``label``,
``matrix``) and ``explode``, header parameters ``explode``. A header the source sets itself
(``headers=``, a credential) is no argument: a parameter of that name is not offered.

The base URL comes from ``servers[0]`` (its variables take their defaults); a relative server
URL is resolved against the document's URL, or needs ``base_url``. A document given by URL is
fetched when the source opens (``toolkit.start()``); if that fails the source reports
``status`` failed with the reason and serves no tools.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import yaml

from toolmesh.errors import ConfigError, SchemaError
from toolmesh.schema import (
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_MAP_KEYWORDS,
    def_ref,
    pointer_step,
    pointer_target,
    ref_cycle,
)
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.sources.http import HttpEndpoint, HttpSource, ParamStyle
from toolmesh.tools import Tool

__all__ = ["OpenAPISource", "load_document", "openapi_endpoints", "sources_from_manifest"]

JsonSchema = dict[str, Any]

_METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
_ANNOTATIONS_ONLY = frozenset({"example", "xml", "discriminator", "externalDocs", "x-examples"})
# left out too: every reference is resolved here, and an $id would make the validator read the
# rewritten ones (#/$defs/X) against another document
_DROPPED = _ANNOTATIONS_ONLY | {"nullable", "$id"}
_SCHEMA_PREFIX = "#/components/schemas/"
_DEFS_PREFIX = "#/$defs/"  # where component schemas land in a tool's schema
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")  # {name} in a path template
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_PLACES = frozenset({"path", "query", "header", "cookie"})
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # the largest public API descriptions are tens of MB
# header parameters the specification says to ignore: a model could otherwise replace the
# source's own credentials or the body's media type
_IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
_PATH_STYLES = ("simple", "label", "matrix")


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans and numbers (its core schema), as OpenAPI
    asks. YAML 1.1's ``on``/``off``/``yes``/``no`` (and so ``NO``, Norway's code) are text in
    YAML 1.2; read as booleans, ``enum: [on, off]`` admitted no string at all. So are ``10:30``
    (base 60 in 1.1) and ``1_000``; ``0755`` is 755, not octal, and ``1e6`` a number (PyYAML's
    1.1 float wants a dot, so ``maximum: 1e6`` was the text "1e6" and broke the tool)."""


_YAML12_TAGS = {f"tag:yaml.org,2002:{name}" for name in ("bool", "int", "float")}
_YAML12_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_YAML12_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML12_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# (ints first: every int also matches the float pattern)
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", _YAML12_INT, list("-+0123456789"))
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+.0123456789"))


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _yaml12_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    return float("nan") if text == ".nan" else float(text)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _yaml12_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _yaml12_float)


class _Budget:
    """How many values a document may expand to. Without YAML aliases every value takes at
    least a character of the text; aliases of aliases (``&a [*b, *b, ...]``) make a few hundred
    bytes expand to billions of values, which copying them would take minutes and gigabytes."""

    def __init__(self, text: str) -> None:
        self.left = 10 * len(text) + 100_000

    def spend(self, where: str) -> None:
        self.left -= 1
        if self.left < 0:
            raise ConfigError(
                f"{where}: the document expands to far more values than its text holds "
                "(YAML aliases of aliases?); refused"
            )


def _plain_json(value: Any, budget: _Budget, where: str) -> Any:
    """``value`` with the dates and times YAML reads from unquoted text as ISO strings."""
    budget.spend(where)
    if isinstance(value, dict):
        return {key: _plain_json(item, budget, where) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_json(item, budget, where) for item in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return value


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader, its booleans 1.2's


def load_document(text: str | bytes, *, where: str) -> dict[str, Any]:
    """Parse an OpenAPI 3.x document (JSON or YAML) and check that it is one."""
    try:
        raw = text.decode() if isinstance(text, bytes) else text
        document = json.loads(raw) if raw.lstrip().startswith("{") else _yaml(raw)
        if not isinstance(document, dict):
            raise ConfigError(f"{where}: an OpenAPI document must be an object")
        # YAML's unquoted dates are text in JSON Schema; aliases become copies, within a budget
        document = dict(_plain_json(document, _Budget(raw), where))
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{where}: not JSON or YAML: {exc}") from None
    except RecursionError:  # both parsers, and the walk above, go one call deeper per level
        raise ConfigError(f"{where}: the document is nested too deeply") from None
    version = str(document.get("openapi", ""))
    if not version.startswith("3."):
        found = f"swagger {document['swagger']}" if "swagger" in document else repr(version)
        raise ConfigError(f"{where}: OpenAPI 3.x expected, found {found}")
    if not isinstance(document.get("paths", {}), Mapping):
        raise ConfigError(f"{where}: paths must be an object")
    return document


class _Document:
    """Reference lookups in one document, with the path of what is being read for errors, and
    its component schemas, each converted once for every tool that reaches it."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        # the references being inlined now (not component schemas, which become $defs): one
        # met again inside itself is a cycle that inlining would follow forever
        self._inlining: list[str] = []
        # converted component schemas by name, and the components each refers to directly:
        # shared by the tools (converting them per tool cost operations x components)
        self.components: dict[str, JsonSchema] = {}
        self._refers_to: dict[str, dict[str, None]] = {}
        # met, not yet converted (name, $ref, where met): converted by a loop, not inside the
        # schema that met them, so a long chain of components takes no deeper recursion
        self._pending: list[tuple[str, str, str]] = []
        self._cycle_checked: set[str] = set()

    def resolve(self, node: Any, where: str) -> Any:
        """``node`` with its own ``$ref`` (if any) followed, repeatedly."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in seen:
                raise ConfigError(
                    f"{where}: $ref {ref!r} refers to itself (a cycle of references that never "
                    "reaches a schema)"
                )
            seen.add(ref)
            node = self.target(ref, where)
        return node

    def target(self, ref: str, where: str) -> Any:
        if not ref.startswith("#/"):
            raise ConfigError(
                f"{where}: $ref {ref!r} points to another document; only references inside "
                "the document are followed (nothing else is fetched)"
            )
        node = pointer_target(self.document, ref)
        if node is None:
            raise ConfigError(f"{where}: $ref {ref!r} points nowhere")
        return node

    # -- schemas ---------------------------------------------------------------------------------

    def schema(self, node: Any, where: str, refs: dict[str, None]) -> Any:
        """JSON Schema of an OpenAPI schema; the component schemas it refers to directly are
        added to ``refs`` (``defs_for`` gives all it reaches)."""
        if isinstance(node, list):
            return [self.schema(item, where, refs) for item in node]
        if not isinstance(node, Mapping):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self._reference(node, ref, where, refs)
        out: JsonSchema = {}
        for key, value in node.items():
            if key in _DROPPED:
                continue
            if key in SUBSCHEMA_MAP_KEYWORDS:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{where}: {key} must be an object of schemas")
                out[key] = {k: self.schema(v, f"{where}.{key}.{k}", refs) for k, v in value.items()}
            elif key in SUBSCHEMA_KEYWORDS:
                out[key] = self.schema(value, f"{where}.{key}", refs)
            else:
                out[key] = value
        _exclusive_bounds(out)
        if node.get("nullable") is True:
            _allow_null(out)
        return out

    def _reference(
        self, node: Mapping[str, Any], ref: str, where: str, refs: dict[str, None]
    ) -> JsonSchema:
        if ref.startswith(_SCHEMA_PREFIX) and "/" not in ref[len(_SCHEMA_PREFIX) :]:
            name = pointer_step(ref[len(_SCHEMA_PREFIX) :])  # `a~1b` names `a/b`
            if name not in self._refers_to:  # taken first: a recursive reference finds it
                self._refers_to[name] = {}
                self._pending.append((name, ref, where))
            refs[name] = None
            return {"$ref": def_ref(name)}
        if ref in self._inlining:
            raise ConfigError(
                f"{where}: $ref {ref!r} is inside itself; only component schemas "
                f"({_SCHEMA_PREFIX}...) may be recursive"
            )
        self._inlining.append(ref)
        try:
            converted: JsonSchema = self.schema(
                self.resolve(node, where), f"{where} -> {ref}", refs
            )
            return converted
        finally:
            self._inlining.pop()

    def _convert_pending(self) -> None:
        """Convert the component schemas met and not converted yet. Each is converted on its
        own, with no inlining around it (it becomes a $def): the same whichever tool met it."""
        while self._pending:
            name, ref, where = self._pending.pop()
            target = self.target(ref, where)
            # only references, round in a circle (A -> B -> A): refused here, as no validator
            # can check a value against it
            self.resolve(target, f"{where} -> {ref}")
            self.components[name] = self.schema(target, f"{where} -> {ref}", self._refers_to[name])

    def defs_for(self, refs: Iterable[str]) -> dict[str, JsonSchema]:
        """The component schemas ``refs`` reach, directly or through one another: a tool's
        ``$defs`` (the converted schemas themselves, shared with the other tools)."""
        self._convert_pending()
        defs: dict[str, JsonSchema] = {}
        pending = list(refs)[::-1]
        while pending:
            name = pending.pop()
            if name not in defs:
                defs[name] = self.components[name]
                pending += list(self._refers_to[name])[::-1]
        return defs

    def check_no_cycle(self, defs: Mapping[str, JsonSchema], where: str) -> None:
        """Refuse schemas whose references go round without reaching a schema (``S = allOf[T]``,
        ``T = allOf[S]``): no validator ever finishes checking a value against them. Each
        component is checked once: whatever a checked one reaches was checked with it, so a
        cycle through the new ones is among the new ones alone."""
        new = {name: schema for name, schema in defs.items() if name not in self._cycle_checked}
        if not new:
            return
        self._cycle_checked.update(new)
        cycle = ref_cycle({"$defs": new, "allOf": [{"$ref": def_ref(name)} for name in new]})
        if cycle is None:
            return
        if cycle.startswith(_DEFS_PREFIX):  # named as the document names it
            cycle = _SCHEMA_PREFIX + cycle[len(_DEFS_PREFIX) :]
        raise ConfigError(
            f"{where}: schema {cycle!r} leads back to itself through allOf/anyOf/oneOf/not "
            "alone (a cycle of references that never reaches a schema)"
        )


def _exclusive_bounds(schema: JsonSchema) -> None:
    """OpenAPI 3.0's boolean ``exclusiveMinimum`` as the JSON Schema number form."""
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(schema.get(flag), bool) and schema.pop(flag) and bound in schema:
            schema[flag] = schema.pop(bound)


def _allow_null(schema: JsonSchema) -> None:
    declared = schema.get("type")
    if isinstance(declared, str):
        schema["type"] = [declared, "null"]
        if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
    elif isinstance(declared, list) and "null" not in declared:
        schema["type"] = [*declared, "null"]
    elif declared is None:
        inner = dict(schema)
        schema.clear()
        schema["anyOf"] = [inner, {"type": "null"}]


# -- operations ----------------------------------------------------------------------------------


def openapi_endpoints(
    document: Mapping[str, Any],
    *,
    base_url: str | None = None,
    document_url: str | None = None,
    timeout: float = 30.0,
    where: str = "openapi",
    headers: Iterable[str] = (),
) -> list[HttpEndpoint]:
    """One HTTP endpoint per operation of ``document``. ``headers``: the names of the headers
    the source sets itself (credentials): parameters of those names are not arguments."""
    configured = frozenset(name.lower() for name in headers)
    try:
        return _endpoints(document, base_url, document_url, timeout, where, configured)
    except RecursionError:  # schemas are rewritten one call deeper per level they nest
        raise ConfigError(f"{where}: the document's schemas are nested too deeply") from None


def _endpoints(
    document: Mapping[str, Any],
    base_url: str | None,
    document_url: str | None,
    timeout: float,
    where: str,
    configured: Collection[str],
) -> list[HttpEndpoint]:
    doc = _Document(document)
    root = _base_url(document, base_url, document_url, where)
    taken: set[str] = set()
    endpoints = []
    for path, item in (document.get("paths") or {}).items():
        item_where = f"{where}: paths.{path}"
        item = doc.resolve(item, item_where)
        if not isinstance(item, Mapping):
            raise ConfigError(f"{item_where}: a path item must be an object")
        shared = item.get("parameters") or []
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            op_where = f"{item_where}.{method}"
            if not isinstance(operation, Mapping):
                raise ConfigError(f"{op_where}: an operation must be an object")
            name = _unique(_operation_name(operation, method, path), taken)
            endpoint = _endpoint(
                doc, name, method, path, operation, shared, root, timeout, configured, op_where
            )
            endpoints.append(endpoint)
    return endpoints


def _base_url(
    document: Mapping[str, Any], base_url: str | None, document_url: str | None, where: str
) -> str:
    if base_url:
        return base_url.rstrip("/")
    servers = document.get("servers") or [{"url": "/"}]
    if not isinstance(servers, list) or not isinstance(servers[0], Mapping):
        raise ConfigError(f"{where}: servers must be a list of objects (each with a url)")
    server = servers[0]
    url = str(server.get("url", "/"))
    variables = server.get("variables")
    if not isinstance(variables or {}, Mapping):
        raise ConfigError(f"{where}: servers[0].variables must be an object")
    for key, variable in (variables or {}).items():
        if not isinstance(variable, Mapping) or "default" not in variable:
            raise ConfigError(f"{where}: servers[0].variables.{key} needs a default")
        url = url.replace("{" + key + "}", str(variable["default"]))
    left = re.findall(r"\{([^{}]*)\}", url)
    if left:
        raise ConfigError(
            f"{where}: the server URL {url!r} has variable {left[0]!r}, which servers[0] does "
            "not declare"
        )
    if url.startswith(("http://", "https://")):
        return url.rstrip("/")
    if document_url:
        return urljoin(document_url, url).rstrip("/")
    raise ConfigError(
        f"{where}: the server URL {url!r} is relative; give base_url (the API's address)"
    )


def _operation_name(operation: Mapping[str, Any], method: str, path: str) -> str:
    given = operation.get("operationId")
    raw = str(given) if given else f"{method}_{path}"
    return re.sub("_{2,}", "_", _NAME_CHARS.sub("_", raw)).strip("_") or method


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def _argument_name(name: str, fallback: str, arguments: Mapping[str, Any]) -> str:
    """``name``, or when an argument has it, ``fallback`` (``id_query``), ``fallback_2``, ...:
    the first no argument has, so a renamed argument never replaces another."""
    if name not in arguments:
        return name
    candidate, n = fallback, 2
    while candidate in arguments:
        candidate, n = f"{fallback}_{n}", n + 1
    return candidate


def _endpoint(
    doc: _Document,
    name: str,
    method: str,
    path: str,
    operation: Mapping[str, Any],
    shared: Sequence[Any],
    root: str,
    timeout: float,
    configured: Collection[str],
    where: str,
) -> HttpEndpoint:
    parameters: dict[tuple[str, str], Mapping[str, Any]] = {}
    for i, raw in enumerate([*shared, *(operation.get("parameters") or [])]):
        param = doc.resolve(raw, f"{where}.parameters[{i}]")
        if not isinstance(param, Mapping) or "name" not in param or "in" not in param:
            raise ConfigError(f"{where}.parameters[{i}]: a parameter needs name and in")
        parameters[(str(param["name"]), str(param["in"]))] = param  # the operation's wins
    refs: dict[str, None] = {}  # the component schemas the tool's schema refers to
    properties: JsonSchema = {}
    required: list[str] = []
    query, headers, cookies = {}, {}, []
    path_arguments: dict[str, str] = {}  # each path placeholder's argument
    joined: list[str] = []
    styles: dict[str, ParamStyle] = {}
    for (pname, place), param in parameters.items():
        if place not in _PLACES:
            raise ConfigError(
                f"{where}: parameter {pname!r} is in {place!r}; in must be path, query, header "
                "or cookie (a body is requestBody)"
            )
        if place == "header" and pname.lower() in _IGNORED_HEADERS:
            continue  # described by the media types and security schemes instead (the spec)
        if _set_by_source(pname, place, configured):
            continue  # the source's own (a credential): the model must not replace it
        arg = _argument_name(pname, f"{pname}_{place}", properties)
        style = _style(param, pname, place, f"{where}.parameters.{pname}")
        if style is not None:
            styles[arg] = style
        schema = doc.schema(param.get("schema") or {"type": "string"}, f"{where}.{pname}", refs)
        if param.get("description") and "description" not in schema:
            schema = {**schema, "description": param["description"]}
        properties[arg] = schema
        if param.get("required") or place == "path":
            required.append(arg)
        if place == "path":
            path_arguments[pname] = arg
        elif place == "query":
            query[pname] = "{" + arg + "}"
            # style form (the query's default) explodes lists unless explode is false
            if param.get("explode") is False and param.get("style", "form") == "form":
                joined.append(pname)
        elif place == "header":
            headers[pname] = "{" + arg + "}"
        elif place == "cookie":
            cookies.append(f"{pname}={{{arg}}}")
    if cookies:
        headers["Cookie"] = "; ".join(cookies)
    for placeholder in _PLACEHOLDER.findall(path):
        if placeholder not in path_arguments:  # in the path, not in parameters
            arg = _argument_name(placeholder, f"{placeholder}_path", properties)
            properties[arg] = {"type": "string"}
            required.append(arg)
            path_arguments[placeholder] = arg
    # in one pass: renaming placeholder by placeholder could rename one renamed before
    url = root + _PLACEHOLDER.sub(lambda m: "{" + path_arguments[m[1]] + "}", path)
    body, body_format, content_type, file_fields = _request_body(
        doc, operation, properties, required, refs, where
    )
    defs = doc.defs_for(refs)
    doc.check_no_cycle(defs, where)
    input_schema: JsonSchema = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        input_schema["required"] = required
    if defs:
        input_schema["$defs"] = defs
    texts = [operation.get("summary"), operation.get("description")]
    description = "\n\n".join(str(t).strip() for t in texts if t) or f"{method.upper()} {path}"
    tags = operation.get("tags") or []
    return HttpEndpoint(
        name=name,
        url=url,
        method=method.upper(),
        description=description,
        query=query,
        headers=headers,
        body=body,
        body_format=body_format,
        content_type=content_type,
        file_fields=file_fields,
        joined_query=joined,
        styles=styles,
        timeout=timeout,
        input_schema=input_schema,
        tags=[str(t) for t in tags] if isinstance(tags, list) else [],
    )


def _set_by_source(name: str, place: str, configured: Collection[str]) -> bool:
    """Whether the source sets the header this parameter would fill (a cookie fills Cookie)."""
    header = "cookie" if place == "cookie" else name.lower() if place == "header" else None
    return header is not None and header in configured


def _style(param: Mapping[str, Any], name: str, place: str, where: str) -> ParamStyle | None:
    """How a path or header parameter's list or object is sent (None: plain simple, or a
    query or cookie parameter, whose styles are read elsewhere)."""
    if place not in ("path", "header"):
        return None
    style = param.get("style", "simple")
    allowed = _PATH_STYLES if place == "path" else ("simple",)
    if style not in allowed:
        raise ConfigError(
            f"{where}: style {style!r} is not supported for a {place} parameter (the style "
            f"must be {' or '.join(allowed)})"
        )
    explode = param.get("explode", False)
    if not isinstance(explode, bool):
        raise ConfigError(f"{where}: explode must be true or false, not {explode!r}")
    if style == "simple" and not explode:
        return None
    return ParamStyle(style, explode, name)


def _request_body(
    doc: _Document,
    operation: Mapping[str, Any],
    properties: JsonSchema,
    required: list[str],
    refs: dict[str, None],
    where: str,
) -> tuple[str | None, Any, str | None, tuple[str, ...]]:
    if "requestBody" not in operation:
        return None, None, None, ()
    body = doc.resolve(operation["requestBody"], f"{where}.requestBody")
    content = body.get("content") if isinstance(body, Mapping) else None
    if not isinstance(content, Mapping) or not content:
        raise ConfigError(f"{where}.requestBody: content must name at least one media type")
    media_type, form = _pick_media_type(list(content))
    media = content[media_type] if isinstance(content[media_type], Mapping) else {}
    schema = doc.schema(media.get("schema") or {}, f"{where}.requestBody", refs)
    if form == "raw" and not schema:
        schema = {"type": "string"}
    elif form == "raw" and schema.get("format") == "binary":
        schema = {"type": "string", "description": "the content, as text"}
    files: tuple[str, ...] = ()
    if form == "multipart":
        schema, files = _multipart_schema(_component_of(schema, doc.defs_for(refs)))
    if body.get("description") and "description" not in schema:
        schema = {**schema, "description": body["description"]}
    arg = _argument_name("body", "request_body", properties)
    properties[arg] = schema
    if body.get("required"):
        required.append(arg)
    return "{" + arg + "}", form, media_type if form == "raw" else None, files


def _component_of(schema: JsonSchema, defs: Mapping[str, Any]) -> JsonSchema:
    """``schema`` itself, or the component schema it is only a reference to (a multipart body's
    file fields are read from its properties)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and len(schema) == 1:
        for name, target in defs.items():
            if def_ref(name) == ref and isinstance(target, Mapping):
                return dict(target)
    return schema


def _multipart_schema(schema: JsonSchema) -> tuple[JsonSchema, tuple[str, ...]]:
    """A multipart body's schema, its files (``format: binary``) as text a model can give, and
    the names of those file fields."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return schema, ()
    files: list[str] = []
    shown: dict[str, Any] = {}
    for key, prop in properties.items():
        item = prop.get("items") if isinstance(prop, Mapping) else None
        if isinstance(prop, Mapping) and prop.get("format") == "binary":
            files.append(str(key))
            shown[key] = {"type": "string", "description": "the file's content, as text"}
        elif isinstance(item, Mapping) and item.get("format") == "binary":  # several files
            files.append(str(key))
            shown[key] = {"type": "array", "items": {"type": "string"}}
        else:
            shown[key] = prop
    return {**schema, "properties": shown}, tuple(files)


def _pick_media_type(types: list[str]) -> tuple[str, Any]:
    for media_type in types:
        if media_type == "application/json" or media_type.endswith("+json"):
            return media_type, "json"
    for media_type in types:
        if media_type == "application/x-www-form-urlencoded":
            return media_type, "form"
    for media_type in types:
        if media_type == "multipart/form-data":
            return media_type, "multipart"
    return types[0], "raw"


# -- the source ----------------------------------------------------------------------------------


class OpenAPISource(Source):
    """Tools of every operation of an OpenAPI 3.x document (file, URL or mapping)."""

    def __init__(
        self,
        document: str | Path | Mapping[str, Any],
        *,
        base_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        name: str | None = None,
    ) -> None:
        self.base_url = base_url
        self.headers = dict(headers or {})
        self.timeout = timeout
        self._inner: HttpSource | None = None
        self.url: str | None = None
        if isinstance(document, str) and document.startswith(("http://", "https://")):
            self.url = document
            self.name = name or f"openapi:{document}"
            self.status = SourceStatus("pending", "the document is fetched when the source opens")
            return
        if isinstance(document, Mapping):
            where, loaded = "openapi", load_document(_json_text(document), where="openapi")
        else:
            path = Path(document)
            where = str(path)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{where}: cannot read the document: {exc.strerror}") from None
            loaded = load_document(text, where=where)
        info = loaded.get("info")
        title = info.get("title") if isinstance(info, Mapping) else None
        self.name = name or f"openapi:{title or where}"
        self._build(loaded, where=where)

    def _build(self, document: Mapping[str, Any], *, where: str) -> None:
        endpoints = openapi_endpoints(
            document,
            base_url=self.base_url,
            document_url=self.url,
            timeout=self.timeout,
            where=where,
            headers=self.headers,
        )
        try:
            inner = HttpSource(endpoints, name=self.name, headers=self.headers, kind="openapi")
        except SchemaError as exc:  # parameters cannot be derived from a schema
            raise ConfigError(f"{where}: {exc}") from None
        self._inner = inner
        self.status = SourceStatus("connected")

    def tools(self) -> Sequence[Tool]:
        return self._inner.tools() if self._inner is not None else ()

    async def open(self) -> None:
        if self.url is None or self._inner is not None:
            return
        try:
            text = await self._fetch(self.url)
            self._build(load_document(text, where=self.url), where=self.url)
        except TimeoutError:
            self.status = SourceStatus(
                "failed", f"cannot load {self.url}: no whole answer within {self.timeout:g}s"
            )
            return
        except (httpx.HTTPError, ConfigError) as exc:
            self.status = SourceStatus("failed", f"cannot load {self.url}: {exc}")
            return
        except Exception as exc:  # a document of a shape the builder did not expect
            self.status = SourceStatus(
                "failed", f"cannot use {self.url}: {type(exc).__name__}: {exc}"
            )
            return
        self.changed()

    async def _fetch(self, url: str) -> bytes:
        """The document at ``url``: the whole exchange within the timeout (httpx's bounds each
        read only, which a trickling server passes forever) and at most ``MAX_DOCUMENT_BYTES``."""
        async with (
            asyncio.timeout(self.timeout),
            httpx.AsyncClient(follow_redirects=True, timeout=self.timeout) as client,
            client.stream("GET", url) as response,
        ):
            response.raise_for_status()
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_DOCUMENT_BYTES:
                    raise ConfigError(
                        f"{url}: the document is larger than {MAX_DOCUMENT_BYTES} bytes; refused"
                    )
                chunks.append(chunk)
            return b"".join(chunks)

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


def _json_text(document: Mapping[str, Any]) -> str:
    """A document given as a mapping, as JSON text (it is read as a file's would be)."""
    try:
        return json.dumps(document)
    except RecursionError:
        raise ConfigError("openapi: the document is nested too deeply") from None
    except (TypeError, ValueError) as exc:  # not JSON values, or one containing itself
        raise ConfigError(f"openapi: the document is not JSON: {exc}") from None


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """A manifest entry of kind ``openapi``: ``spec`` (a file, relative to the manifest, or a
    URL) and optionally ``base_url``, ``headers``, ``timeout``, ``name``."""
    known = {"kind", "spec", "base_url", "headers", "timeout", "name"}
    unknown = set(entry) - known
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(sorted(unknown))}; openapi takes "
            + ", ".join(sorted(known - {"kind"}))
        )
    spec = entry.get("spec")
    if not isinstance(spec, str) or not spec:
        raise ConfigError("openapi needs spec = a file path or an http(s) URL")
    document: str | Path = spec
    if not spec.startswith(("http://", "https://")):
        document = (base_dir / spec).resolve()
    headers = entry.get("headers") or {}
    timeout = entry.get("timeout", 30.0)
    if not isinstance(headers, Mapping):
        raise ConfigError("headers must be a table of names to values")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError("timeout must be a positive number of seconds")
    base_url = entry.get("base_url")
    if base_url is not None and not isinstance(base_url, str):
        raise ConfigError("base_url must be a string")
    name = entry.get("name")
    return [
        OpenAPISource(
            document,
            base_url=base_url,
            headers={k: str(v) for k, v in headers.items()},
            timeout=float(timeout),
            name=str(name) if name else None,
        )
    ]
