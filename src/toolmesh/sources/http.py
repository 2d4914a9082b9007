"""Declarative HTTP tools: one request per call, described rather than coded.

An ``HttpEndpoint`` says how a call becomes a request: the method, a URL template whose
``{placeholders}`` are filled from the arguments (percent-encoded), query parameters and headers
that may use ``{argument}`` placeholders too, a JSON, form or raw body, a timeout, and whether the
result is the response's text, its JSON or its status code. Header values may hold ``${ENV}``
references: they are expanded at call time, and their values are never logged, shown in a result
or stored in a definition (so secrets stay in headers, never in URLs that clients log).

A template string that is exactly ``"{name}"`` takes the argument's value as it is (a list in the
query repeats the parameter, a number in a JSON body stays a number); an entry whose placeholder
names an argument the call left out is left out too. In a URL placeholder or a header a list is
its items joined by commas and an object its keys and values (``a,b``; ``k,v``), as RFC 6570 and
OpenAPI's ``simple`` style say; ``styles`` gives an argument OpenAPI's ``label``/``matrix`` style
or ``explode``. A header the source sets itself (a credential) is never replaced by one filled
from the arguments. Arguments that no template mentions go to
the query string (GET, DELETE, HEAD, OPTIONS) or to a JSON body (other methods).

A response outside 2xx is an error result with the status in ``metadata["status"]``; so are
timeouts and unreachable hosts (without a status).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from toolmesh import strictjson
from toolmesh.capabilities import check_tag, string_list
from toolmesh.errors import ConfigError, SchemaError
from toolmesh.models import ToolDefinition, ToolErrorCode, ToolResult
from toolmesh.schema import compile_validator
from toolmesh.sources.base import Source
from toolmesh.tools import Output, Tool, ToolContext

__all__ = ["HttpEndpoint", "HttpSource", "ParamStyle", "http_tool", "sources_from_manifest"]

JsonSchema = dict[str, Any]
BodyFormat = Literal["json", "form", "multipart", "raw"]
ResultFormat = Literal["auto", "text", "json", "status"]

# {argument}: any name without braces ("$top", an OData query's, too); ${VARIABLE} is the
# environment's
_PLACEHOLDER = re.compile(r"(?<!\$)\{([^{}]+)\}")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_TOKEN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|(?<!\$)\{([^{}]+)\}")
# what would end a header line or that HTTP refuses in a value (a tab is allowed)
_HEADER_BREAKING = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_QUERY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})
_EXCERPT = 500
MAX_BODY_BYTES = 16 * 1024 * 1024
"""The most of a response's body a tool reads (far above the host's output bound)."""


class _Missing(Exception):
    """A template names an argument the call did not give."""


@dataclass(frozen=True, slots=True)
class ParamStyle:
    """How a list or an object fills a URL placeholder or a header: OpenAPI's style (RFC 6570's
    expansions). ``simple``: ``a,b``, an object ``k,v`` (exploded ``k=v``); ``label``: ``.a,b``
    (exploded ``.a.b``); ``matrix``: ``;name=a,b`` (exploded ``;name=a;name=b``, an object
    ``;k=v``), ``name`` being the parameter's."""

    style: Literal["simple", "label", "matrix"] = "simple"
    explode: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if self.style not in ("simple", "label", "matrix"):
            raise ConfigError(f"style must be simple, label or matrix, not {self.style!r}")
        if self.style == "matrix" and not self.name:
            raise ConfigError("matrix style needs the parameter's name")


_SIMPLE = ParamStyle()


@dataclass(frozen=True, slots=True)
class HttpEndpoint:
    """How one tool's arguments become one HTTP request."""

    name: str
    url: str
    method: str = "GET"
    description: str = ""
    query: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    body_format: BodyFormat | None = None
    content_type: str | None = None
    # multipart: the fields sent as files (named after the field), not as plain values
    file_fields: Sequence[str] = ()
    # query parameters whose list is one comma-joined value (OpenAPI's explode: false), not
    # the parameter repeated
    joined_query: Sequence[str] = ()
    # arguments filling a URL placeholder or a header in a style other than plain simple
    styles: Mapping[str, ParamStyle] = field(default_factory=dict)
    timeout: float = 30.0
    result: ResultFormat = "auto"
    input_schema: JsonSchema | None = None
    capabilities: Sequence[str] = ()
    tags: Sequence[str] = ()

    def __post_init__(self) -> None:
        for setting in ("file_fields", "joined_query", "capabilities", "tags"):
            given = string_list(getattr(self, setting), where=f"http tool {self.name!r} {setting}")
            object.__setattr__(self, setting, given)
        if not all(isinstance(style, ParamStyle) for style in self.styles.values()):
            raise ConfigError(f"http tool {self.name!r}: styles must map names to ParamStyles")
        method = self.method.upper()
        object.__setattr__(self, "method", method)
        if method not in _METHODS:
            raise ConfigError(f"http tool {self.name!r}: unknown method {self.method!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"http tool {self.name!r}: url must be http(s), not {self.url!r}")
        if self.body_format not in (None, "json", "form", "multipart", "raw"):
            raise ConfigError(
                f"http tool {self.name!r}: body_format must be json, form, multipart or raw, "
                f"not {self.body_format!r}"
            )
        if self.result not in ("auto", "text", "json", "status"):
            raise ConfigError(
                f"http tool {self.name!r}: result must be auto, text, json or status, "
                f"not {self.result!r}"
            )
        if not self.timeout > 0:
            raise ConfigError(f"http tool {self.name!r}: timeout must be positive")
        for where, value in (("url", self.url), ("query", self.query), ("body", self.body)):
            if _ENV.search(json.dumps(value, default=str)):
                raise ConfigError(
                    f"http tool {self.name!r}: ${{ENV}} is expanded in headers only; "
                    f"move the secret out of the {where}"
                )

    # -- the schema ------------------------------------------------------------------------------

    def placeholders(self) -> dict[str, str]:
        """Each argument a template mentions, and where (path, query, header or body)."""
        found: dict[str, str] = {}
        for name in _PLACEHOLDER.findall(self.url):
            found.setdefault(name, "path")
        for where, template in (
            ("query", self.query),
            ("header", self.headers),
            ("body", self.body),
        ):
            for name in _names_in(template):
                found.setdefault(name, where)
        return found

    def schema(self) -> JsonSchema:
        """The input schema: given, or one string per placeholder (path ones required)."""
        if self.input_schema is not None:
            return self.input_schema
        mentioned = self.placeholders()
        return {
            "type": "object",
            "properties": {name: {"type": "string"} for name in mentioned},
            "required": [n for n, where in mentioned.items() if where == "path"],
            "additionalProperties": False,
        }

    # -- the request -----------------------------------------------------------------------------

    def request(
        self, arguments: Mapping[str, Any], base_headers: Mapping[str, str]
    ) -> httpx.Request:
        """The request for ``arguments`` (raises KeyError naming a missing environment variable)."""
        used: set[str] = set()
        url = _fill_url(self.url, arguments, used, self.styles)
        params = _fill_entries(self.query, arguments, used)
        headers = self._headers(arguments, used, base_headers)
        try:
            body = _fill(self.body, arguments, used) if self.body is not None else None
        except _Missing:
            body = None  # the body is one placeholder the call left out: send none
        rest = {k: v for k, v in arguments.items() if k not in used}
        if rest:
            if self.body is None and self.method not in _QUERY_METHODS:
                body = rest
            else:
                params.extend(rest.items())
        content: Any = {}
        if body is not None:
            content = self._body(body, headers)
        target = httpx.URL(url)
        flat: list[tuple[str, str | int | float | bool | None]] = [
            (k, _text(v)) for k, v in _flatten(params, self.joined_query)
        ]
        if flat:  # merged: httpx's `params=` would replace a query the URL itself holds
            target = target.copy_merge_params(flat)
        request = httpx.Request(self.method, target, headers=headers, **content)
        # For the redirect hook and error messages: the headers this tool set (they go to its
        # own origin only) and the secrets expanded into them (never shown).
        request.extensions["toolmesh_origin"] = _origin(request.url)
        request.extensions["toolmesh_headers"] = tuple(headers)
        request.extensions["toolmesh_secrets"] = tuple(_secrets_in(base_headers, self.headers))
        return request

    def _headers(
        self, arguments: Mapping[str, Any], used: set[str], base_headers: Mapping[str, str]
    ) -> dict[str, str]:
        """The source's headers, then the tool's: a fixed one of the tool replaces the source's
        of that name (in any case); one filled from the arguments never does, so a model cannot
        replace a credential the source sets, nor is its argument sent anywhere else."""
        headers = {k: _expand_env(v, k) for k, v in base_headers.items()}
        configured = {k.lower() for k in base_headers}
        for key, template in self.headers.items():
            filled_by = _names_in(template)
            if filled_by and key.lower() in configured:
                used.update(filled_by)
                continue
            if key.lower() == "cookie":  # one cookie per argument: an absent one is left out
                parts = []
                for part in template.split("; "):
                    with contextlib.suppress(_Missing):
                        parts.append(_fill_header(part, arguments, used, key, self.styles))
                if parts:
                    _set_header(headers, key, "; ".join(parts))
                continue
            try:
                _set_header(headers, key, _fill_header(template, arguments, used, key, self.styles))
            except _Missing:
                continue
        return headers

    def _body(self, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        form = self.body_format or "json"
        if form == "form":
            if not isinstance(body, Mapping):
                raise ValueError("a form body must be an object")
            # Lists repeat their key (``tag=a&tag=b``), OpenAPI's default form style; nulls are
            # left out, as in the query.
            fields: dict[str, str | list[str]] = {}
            for key, value in body.items():
                if isinstance(value, list | tuple):
                    fields[key] = [_text(item) for item in value if item is not None]
                elif value is not None:
                    fields[key] = _text(value)
            return {"data": fields}
        if form == "multipart":
            if not isinstance(body, Mapping):
                raise ValueError("a multipart body must be an object")
            # One part per value (a list: one per item); a file field's part has a file name,
            # which is what makes a server read it as an uploaded file.
            parts: list[tuple[str, tuple[str | None, bytes, str]]] = []
            for key, value in body.items():
                for item in value if isinstance(value, list | tuple) else [value]:
                    if item is None:
                        continue
                    text = item if isinstance(item, str) else json.dumps(item)
                    if key in self.file_fields:
                        parts.append((key, (key, text.encode(), "application/octet-stream")))
                    else:
                        parts.append((key, (None, text.encode(), "text/plain")))
            return {"files": parts}
        if form == "raw":
            if self.content_type:
                headers.setdefault("Content-Type", self.content_type)
            raw = body if isinstance(body, str | bytes) else json.dumps(body)
            return {"content": raw}
        return {"json": body}


def _names_in(template: Any) -> list[str]:
    if isinstance(template, str):
        return list(_PLACEHOLDER.findall(template))
    if isinstance(template, Mapping):
        return [n for v in template.values() for n in _names_in(v)]
    if isinstance(template, list | tuple):
        return [n for v in template for n in _names_in(v)]
    return []


def _fill(template: Any, arguments: Mapping[str, Any], used: set[str]) -> Any:
    """``template`` with its placeholders filled; entries naming absent arguments dropped."""
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole:
            if whole.group(1) not in arguments:
                raise _Missing(whole.group(1))
            used.add(whole.group(1))
            return arguments[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: _text(_take(m.group(1), arguments, used)), template)
    if isinstance(template, Mapping):
        out = {}
        for key, value in template.items():
            try:
                out[key] = _fill(value, arguments, used)
            except _Missing:
                continue
        return out
    if isinstance(template, list | tuple):
        return [_fill(v, arguments, used) for v in template]
    return template


def _fill_entries(
    template: Mapping[str, Any], arguments: Mapping[str, Any], used: set[str]
) -> list[tuple[str, Any]]:
    out = []
    for key, value in template.items():
        try:
            out.append((key, _fill(value, arguments, used)))
        except _Missing:
            continue
    return out


def _set_header(headers: dict[str, str], key: str, value: str) -> None:
    """``headers[key] = value``, replacing the header of that name in any case (HTTP's names
    are case-insensitive: both would be sent)."""
    for present in [k for k in headers if k.lower() == key.lower()]:
        del headers[present]
    headers[key] = value


def _fill_url(
    template: str,
    arguments: Mapping[str, Any],
    used: set[str],
    styles: Mapping[str, ParamStyle],
) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        value = _styled(_take(name, arguments, used), styles.get(name, _SIMPLE), _url_part)
        # "." and ".." are path steps to the URL parser: as a value they are sent encoded
        return value.replace(".", "%2E") if value in (".", "..") else value

    try:
        return _PLACEHOLDER.sub(one, template)
    except _Missing as missing:
        raise ValueError(f"the URL needs the argument {missing.args[0]!r}") from None


def _take(name: str, arguments: Mapping[str, Any], used: set[str]) -> Any:
    if name not in arguments or arguments[name] is None:
        raise _Missing(name)
    used.add(name)
    return arguments[name]


def _url_part(text: str) -> str:
    return quote(text, safe="")


def _styled(value: Any, style: ParamStyle, encode: Callable[[str], str]) -> str:
    """``value`` in ``style``, each item, key and value encoded on its own: the separators
    between them stay literal, so a server can split them again."""
    if isinstance(value, Mapping):
        pairs = [(encode(_text(k)), encode(_text(v))) for k, v in value.items() if v is not None]
        if style.explode:
            items = [f"{k}={v}" for k, v in pairs]
        else:
            items = [part for pair in pairs for part in pair]
    elif isinstance(value, list | tuple):
        items = [encode(_text(item)) for item in value if item is not None]
    else:
        items = [encode(_text(value))]
    if style.style == "label":
        return "." + ("." if style.explode else ",").join(items)
    if style.style == "matrix":
        name = encode(style.name)
        if style.explode and isinstance(value, Mapping):
            return "".join(f";{item}" for item in items)
        if style.explode and isinstance(value, list | tuple):
            return "".join(f";{name}={item}" for item in items)
        joined = ",".join(items)
        return f";{name}={joined}" if joined else f";{name}"
    return ",".join(items)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _flatten(entries: list[tuple[str, Any]], joined: Sequence[str] = ()) -> list[tuple[str, Any]]:
    """Lists in the query repeat their parameter (``?tag=a&tag=b``), or are one value joined by
    commas for the parameters in ``joined`` (``?tag=a,b``); nulls are left out."""
    out: list[tuple[str, Any]] = []
    for key, value in entries:
        if value is None:
            continue
        if isinstance(value, list | tuple) and key in joined:
            out.append((key, ",".join(_text(v) for v in value if v is not None)))
        elif isinstance(value, list | tuple):
            out.extend((key, v) for v in value if v is not None)
        else:
            out.append((key, value))
    return out


def _env(name: str, header: str) -> str:
    found = os.environ.get(name)
    if found is None:
        raise KeyError(f"environment variable {name!r} (header {header!r}) is not set")
    return found


def _expand_env(value: str, header: str) -> str:
    return _ENV.sub(lambda match: _env(match.group(1), header), value)


def _fill_header(
    template: str,
    arguments: Mapping[str, Any],
    used: set[str],
    header: str,
    styles: Mapping[str, ParamStyle],
) -> str:
    """One pass over the template: ``${ENV}`` from the environment, ``{arg}`` from the call.
    Nothing substituted is scanned again, so an argument cannot pull in an environment
    variable."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return _env(match.group(1), header)
        name = match.group(2)
        text = _styled(_take(name, arguments, used), styles.get(name, _SIMPLE), str)
        if _HEADER_BREAKING.search(text):
            # refused here, before the value (and any secret beside it) reaches a message
            raise ValueError(
                f"argument {match.group(2)!r} holds a line break or a control character; it "
                f"cannot go into header {header!r}"
            )
        if ";" in text and header.lower() == "cookie":
            raise ValueError(
                f"argument {match.group(2)!r} holds a ';', which would start another cookie; it "
                "cannot go into header 'Cookie'"
            )
        return text

    return _HEADER_TOKEN.sub(one, template)


# -- running -------------------------------------------------------------------------------------


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port)


def _secrets_in(*templates: Mapping[str, str]) -> list[str]:
    """The values of the ``${ENV}`` variables the header templates name (set ones only)."""
    found = []
    for template in templates:
        for value in template.values():
            for name in _ENV.findall(value) if isinstance(value, str) else ():
                secret = os.environ.get(name)
                if secret and len(secret) >= 4:
                    found.append(secret)
    return found


def _scrubbed(text: str, request: httpx.Request) -> str:
    for secret in request.extensions.get("toolmesh_secrets", ()):
        text = text.replace(secret, "***")
    return text


async def _keep_headers_home(request: httpx.Request) -> None:
    """A redirect to another origin carries none of the tool's own headers (API keys, say):
    httpx drops only Authorization."""
    home = request.extensions.get("toolmesh_origin")
    if home is not None and _origin(request.url) != home:
        for name in request.extensions.get("toolmesh_headers", ()):
            if name.lower() not in ("accept", "content-type", "user-agent"):
                request.headers.pop(name, None)


class _Client:
    """One httpx client per event loop, made on first use and closed with its source."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(
                follow_redirects=True,
                event_hooks={"request": [_keep_headers_home]},
                # the pool is shared by every call (of every session): a cookie one answer set
                # would go with the redirects of later calls, so none is kept
                cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
            )
            self._loop = loop
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()


async def call_endpoint(
    endpoint: HttpEndpoint,
    client: httpx.AsyncClient,
    arguments: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> ToolResult | Output:
    """Send the request for ``arguments`` and shape the answer into a result."""
    name = endpoint.name
    try:
        request = endpoint.request(arguments, headers or {})
    except KeyError as exc:
        return _error(name, str(exc.args[0]))
    except ValueError as exc:
        return _error(name, f"cannot build the request: {exc}")
    limit = min(endpoint.timeout, timeout) if timeout else endpoint.timeout
    request.extensions["timeout"] = httpx.Timeout(limit).as_dict()
    try:
        # httpx's timeout bounds each read; a server trickling its answer a byte a second
        # would pass every one of them, so the whole exchange is bounded too
        async with asyncio.timeout(limit):
            response = await client.send(request, stream=True)
            try:
                body, cut = await _read_bounded(response)
            finally:
                await response.aclose()
    except (httpx.TimeoutException, TimeoutError):
        return _error(name, f"{request.method} {_safe_url(request)} timed out after {limit:g}s")
    except httpx.HTTPError as exc:
        where = f"{request.method} {_safe_url(request)}"
        return _error(name, _scrubbed(f"{where} failed: {type(exc).__name__}: {exc}", request))
    return _answer(endpoint, response, body, cut)


async def _read_bounded(response: httpx.Response) -> tuple[bytes, bool]:
    """The response's body, read up to ``MAX_BODY_BYTES`` (and whether it was cut there): an
    endless or huge answer would otherwise be held whole in memory, then cut by the output
    bound anyway."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return b"".join(chunks)[:MAX_BODY_BYTES], True
    return b"".join(chunks), False


def _answer(
    endpoint: HttpEndpoint, response: httpx.Response, body: bytes, cut: bool
) -> ToolResult | Output:
    status = response.status_code
    metadata: dict[str, Any] = {"status": status}
    content_type = response.headers.get("content-type", "")
    if content_type:
        metadata["content_type"] = content_type
    if cut:
        metadata["cut_at_bytes"] = MAX_BODY_BYTES
    encoding = _encoding(response)
    if not 200 <= status < 300:
        excerpt = body[: _EXCERPT * 4].decode(encoding, "replace")[:_EXCERPT]
        reason = response.reason_phrase or "error"
        message = f"HTTP {status} {reason}" + (f": {excerpt}" if excerpt else "")
        # a server may quote the request's headers back (`invalid key sk-...`)
        return _error(endpoint.name, _scrubbed(message, response.request), metadata)
    if endpoint.result == "status":
        return Output(status, metadata=metadata)
    wants_json = endpoint.result == "json" or (endpoint.result == "auto" and "json" in content_type)
    if wants_json and not cut:
        try:
            return Output(
                strictjson.loads(body.decode(encoding)) if body else None, metadata=metadata
            )
        except ValueError:  # not JSON (NaN included), or not text
            if endpoint.result == "json":
                return _error(endpoint.name, "the response is not JSON", metadata)
    elif wants_json and endpoint.result == "json":
        return _error(
            endpoint.name,
            f"the response is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB; it cannot be "
            "read as JSON",
            metadata,
        )
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError:  # an image, an archive: as the pipeline gives bytes, base64
        if not cut:
            metadata["encoding"] = "base64"
            return Output(base64.b64encode(body).decode(), metadata=metadata)
        text = body.decode(encoding, "replace")  # cut inside a character, perhaps
    return Output(text, metadata=metadata)


def _encoding(response: httpx.Response) -> str:
    """The charset the response declares (one Python knows), else UTF-8."""
    declared = response.charset_encoding
    if declared:
        try:
            codecs.lookup(declared)
        except LookupError:
            return "utf-8"
        return declared
    return "utf-8"


def _error(name: str, message: str, metadata: dict[str, Any] | None = None) -> ToolResult:
    return ToolResult.failure(name, ToolErrorCode.TOOL_ERROR, message, metadata)


def _safe_url(request: httpx.Request) -> str:
    """The URL without its query string (arguments may be private)."""
    return str(request.url.copy_with(query=None))


def _tool(endpoint: HttpEndpoint, client: _Client, headers: Mapping[str, str], kind: str) -> Tool:
    definition = ToolDefinition(
        name=endpoint.name,
        description=endpoint.description or f"{endpoint.method} {endpoint.url}",
        idempotent=endpoint.method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE"),
        streaming=False,
        tags=list(endpoint.tags),
        capabilities=[
            check_tag(c, where=f"tool {endpoint.name!r} capability") for c in endpoint.capabilities
        ],
    )

    async def run(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult | Output:
        return await call_endpoint(
            endpoint, client.get(), arguments, headers=headers, timeout=ctx.remaining
        )

    return Tool(definition, run, source=kind, input_schema=endpoint.schema())


class HttpSource(Source):
    """Tools of HTTP endpoints sharing one connection pool and default headers (which may hold
    ``${ENV}`` references, expanded at call time)."""

    def __init__(
        self,
        endpoints: Sequence[HttpEndpoint],
        *,
        name: str = "http",
        headers: Mapping[str, str] | None = None,
        kind: str = "http",
    ) -> None:
        self.name = name
        self.endpoints = list(endpoints)
        self.headers = dict(headers or {})
        self._client = _Client()
        self._tools = [_tool(e, self._client, self.headers, kind) for e in self.endpoints]

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def close(self) -> None:
        await self._client.close()


def http_tool(
    name: str,
    url: str,
    *,
    method: str = "GET",
    description: str = "",
    parameters: Mapping[str, Any] | None = None,
    required: Sequence[str] = (),
    query: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    body_format: BodyFormat | None = None,
    content_type: str | None = None,
    timeout: float = 30.0,
    result: ResultFormat = "auto",
    capabilities: Sequence[str] = (),
    tags: Sequence[str] = (),
    joined_query: Sequence[str] = (),
    file_fields: Sequence[str] = (),
    input_schema: Mapping[str, Any] | None = None,
) -> Tool:
    """One HTTP tool (a source of its own; add several at once with ``HttpSource``).

    ``parameters`` maps argument names to JSON Schemas (``required = true`` inside one, or the
    ``required`` list, makes it required; URL placeholders always are); ``input_schema`` gives
    the whole object schema instead. ``joined_query``: query parameters whose list is sent as
    one comma-joined value; ``file_fields``: the fields a ``multipart`` body sends as files.
    """
    lists = {
        key: string_list(value, where=f"http tool {name!r} {key}")
        for key, value in (
            ("required", required),
            ("capabilities", capabilities),
            ("tags", tags),
            ("joined_query", joined_query),
            ("file_fields", file_fields),
        )
    }
    endpoint = endpoint_of(
        {
            "name": name,
            "url": url,
            "method": method,
            "description": description,
            "parameters": parameters,
            "query": query,
            "headers": headers,
            "body": body,
            "body_format": body_format,
            "content_type": content_type,
            "timeout": timeout,
            "result": result,
            "input_schema": input_schema,
            **lists,
        }
    )
    return HttpSource([endpoint], name=f"http:{name}").tools()[0]


# -- declarations (Python keywords and the manifest alike) ---------------------------------------

_ENDPOINT_KEYS = frozenset(
    {
        "name",
        "url",
        "method",
        "description",
        "parameters",
        "required",
        "input_schema",
        "query",
        "headers",
        "body",
        "body_format",
        "content_type",
        "file_fields",
        "joined_query",
        "timeout",
        "result",
        "capabilities",
        "tags",
    }
)


def endpoint_of(spec: Mapping[str, Any], *, base_url: str = "") -> HttpEndpoint:
    """An endpoint from a declaration; unknown keys and wrong types are ConfigErrors."""
    spec = {k: v for k, v in spec.items() if v is not None}
    unknown = set(spec) - _ENDPOINT_KEYS
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(sorted(unknown))}; an http tool takes "
            + ", ".join(sorted(_ENDPOINT_KEYS))
        )
    for key in ("name", "url"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise ConfigError(f"an http tool needs {key!r} (a string)")
    name = spec["name"]
    url = spec["url"]
    if base_url and not url.startswith(("http://", "https://")):
        url = base_url.rstrip("/") + "/" + url.lstrip("/")
    endpoint = HttpEndpoint(
        name=name,
        url=url,
        method=str(spec.get("method", "GET")),
        description=str(spec.get("description", "")),
        query=_mapping(spec, "query", name),
        headers={k: str(v) for k, v in _mapping(spec, "headers", name).items()},
        body=spec.get("body"),
        body_format=spec.get("body_format"),
        content_type=spec.get("content_type"),
        file_fields=_strings(spec, "file_fields", name),
        joined_query=_strings(spec, "joined_query", name),
        timeout=_number(spec.get("timeout", 30.0), name),
        result=spec.get("result", "auto"),
        capabilities=_strings(spec, "capabilities", name),
        tags=_strings(spec, "tags", name),
    )
    schema = spec.get("input_schema")
    if schema is None:
        schema = _schema_of(endpoint, _mapping(spec, "parameters", name), spec.get("required", []))
    elif not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ConfigError(f"http tool {name!r}: input_schema must be an object schema")
    try:
        compile_validator(schema)  # a schema that cannot check arguments fails here, not per call
    except SchemaError as exc:
        raise ConfigError(f"http tool {name!r}: its parameters' schema is broken: {exc}") from None
    return _with_schema(endpoint, dict(schema))


def _with_schema(endpoint: HttpEndpoint, schema: JsonSchema) -> HttpEndpoint:
    return dataclasses.replace(endpoint, input_schema=schema)


def _schema_of(endpoint: HttpEndpoint, parameters: Mapping[str, Any], required: Any) -> JsonSchema:
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ConfigError(f"http tool {endpoint.name!r}: required must be a list of names")
    mentioned = endpoint.placeholders()
    properties: JsonSchema = {}
    needed = [n for n, where in mentioned.items() if where == "path"]
    for key, value in parameters.items():
        if not isinstance(value, Mapping):
            raise ConfigError(f"http tool {endpoint.name!r}: parameter {key!r} must be a table")
        prop = dict(value)
        if prop.pop("required", False) is True:
            needed.append(key)
        properties[key] = prop
    for key in mentioned:
        properties.setdefault(key, {"type": "string"})
    for key in required:
        if key not in properties:
            raise ConfigError(f"http tool {endpoint.name!r}: required {key!r} is no parameter")
    needed = list(dict.fromkeys([*needed, *required]))
    schema: JsonSchema = {"type": "object", "properties": properties}
    if needed:
        schema["required"] = needed
    schema["additionalProperties"] = False
    return schema


def _mapping(spec: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"http tool {name!r}: {key} must be a table of names to values")
    return dict(value)


def _strings(spec: Mapping[str, Any], key: str, name: str) -> list[str]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"http tool {name!r}: {key} must be a list of strings")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"http tool {name!r}: timeout must be a number of seconds")
    return float(value)


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """A manifest entry of kind ``http``: one tool, or ``endpoints = [...]`` sharing
    ``base_url``, ``headers`` and ``timeout``."""
    spec = {k: v for k, v in entry.items() if k != "kind"}
    endpoints = spec.pop("endpoints", None)
    if endpoints is None:
        endpoint = endpoint_of(spec)
        return [HttpSource([endpoint], name=f"http:{endpoint.name}")]
    if not isinstance(endpoints, list) or not endpoints:
        raise ConfigError("endpoints must be a list of tables, one per tool")
    shared = {k: spec.pop(k) for k in ("headers", "timeout") if k in spec}
    base_url = spec.pop("base_url", "")
    source_name = spec.pop("name", "http")
    if spec:
        raise ConfigError(
            f"unknown key(s) {', '.join(sorted(spec))} beside endpoints; "
            "shared keys are base_url, headers, timeout, name"
        )
    made = []
    for index, item in enumerate(endpoints):
        if not isinstance(item, Mapping):
            raise ConfigError(f"endpoints[{index}] must be a table")
        try:
            made.append(
                endpoint_of({"timeout": shared.get("timeout"), **item}, base_url=str(base_url))
            )
        except ConfigError as exc:
            raise ConfigError(f"endpoints[{index}]: {exc}") from None
    headers = shared.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise ConfigError("headers must be a table of names to values")
    return [
        HttpSource(made, name=str(source_name), headers={k: str(v) for k, v in headers.items()})
    ]
