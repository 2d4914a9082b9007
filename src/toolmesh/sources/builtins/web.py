"""The http_request tool (capability net::http), on httpx.

What a model may reach is checked where the connection is made, not only on the URL it gave:
every connection (the first and each redirect's) resolves the host name, refuses it when any of
its addresses is loopback, private, link-local, or otherwise not globally routable (IPv4 inside
IPv6 included: mapped, NAT64, 6to4, Teredo), and then connects to the very address it checked,
so a second DNS answer cannot swap in another one. Proxies from the environment are ignored
(they would connect on the model's behalf). Redirects are followed by hand, each one checked
against the URL prefixes and methods again, at most ``max_redirects`` of them; credentials are
not carried to another origin. The body is read up to ``max_bytes`` (after decompression, which
is done here, bounded at every layer: httpx inflates each chunk whole, and a few hundred bytes of
gzip inside gzip grow to hundreds of megabytes).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import certifi
import httpcore
import httpx

from toolmesh.models import ToolErrorCode, ToolResult
from toolmesh.sources.builtins.base import Refused, make_tool, schema
from toolmesh.sources.builtins.htmltext import html_to_text
from toolmesh.tools import Tool, ToolContext, run_blocking

__all__ = ["AddressRefused", "HttpSettings", "http_request_tool"]

NET = "net::http"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Never global, though older Pythons' tables (3.11 before 3.11.10, 3.12 before 3.12.4) say so:
# IPv4-compatible (::a.b.c.d, deprecated), IPv4-translated (::ffff:0:a.b.c.d, SIIT), the
# local-use NAT64 prefix (RFC 8215; where its IPv4 part sits depends on the local prefix length,
# so the whole range is refused) and site-local (deprecated).
_NEVER_GLOBAL = tuple(
    ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "fec0::/10")
)
_FORBIDDEN_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}
_CREDENTIALS = {"authorization", "cookie", "proxy-authorization"}
_INFLATED = ("gzip", "x-gzip", "deflate")  # content codings decoded here; others come back raw
DECODE_STEP = 64 * 1024  # bytes handed from one decoding layer to the next at a time
# Bytes the inner decoding layers may produce before the event loop gets a turn: a layer can
# yield nothing from gigabytes of input (empty deflate blocks), so output alone bounds no work.
DECODE_WORK = 4 * 1024 * 1024


class AddressRefused(Refused):
    """A host that resolves to an address the settings do not allow."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where http_request may go and how much it may bring back."""

    allow: tuple[str, ...] = ()  # URL prefixes; empty: any http(s) URL
    methods: tuple[str, ...] = ("GET", "HEAD")
    allow_private: bool | tuple[str, ...] = False  # True, or networks such as "10.0.0.0/8"
    max_redirects: int = 5
    max_bytes: int = 1024 * 1024
    timeout: float = 30.0
    html: Literal["raw", "text", "markdown"] = "raw"  # how HTML bodies come back
    headers: dict[str, str] | None = None  # sent with every request (a User-Agent, ...)
    capabilities: tuple[str, ...] | None = None  # None: net::http

    def __post_init__(self) -> None:
        for prefix in self.allow:
            _parse_prefix(prefix)
        if isinstance(self.allow_private, tuple):
            for network in self.allow_private:
                ipaddress.ip_network(network, strict=False)


# -- addresses -----------------------------------------------------------------------------------


def _embedded(address: IPAddress) -> list[IPAddress]:
    """The address and any IPv4 address carried inside it."""
    found: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            found.append(address.sixtofour)
        if address.teredo is not None:
            found.extend(address.teredo)
        if address in _NAT64:
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


class AddressPolicy:
    def __init__(self, allow_private: bool | tuple[str, ...]) -> None:
        self.everything = allow_private is True
        networks = allow_private if isinstance(allow_private, tuple) else ()
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def check(self, host: str, address: IPAddress) -> None:
        if self.everything:
            return
        for inner in _embedded(address):
            if any(inner in network for network in self.networks):
                continue
            if (
                not inner.is_global
                or inner.is_multicast
                or any(inner in network for network in _NEVER_GLOBAL)
            ):
                raise AddressRefused(
                    f"{host!r} resolves to {inner}, a loopback, private, link-local or reserved "
                    "address; requests there are not allowed"
                )


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks, and connects to the checked address."""

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = await self._resolve(host, port)
        return await self.inner.connect_tcp(
            str(address), port, timeout, local_address, socket_options
        )

    async def _resolve(self, host: str, port: int) -> IPAddress:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from None
        addresses: list[IPAddress] = []
        for info in infos:
            text = str(info[4][0]).split("%", 1)[0]
            addresses.append(ipaddress.ip_address(text))
        if not addresses:
            raise httpcore.ConnectError(f"{host!r} has no address")
        for address in addresses:  # every answer must pass, not just the first
            self.policy.check(host, address)
        return addresses[0]

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying TLS context for every client (loading the CA file takes ~100 ms)."""
    return ssl.create_default_context(cafile=certifi.where())


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, policy: AddressPolicy) -> None:
        # httpx's own __init__ would build a pool (and a TLS context) only to be replaced.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=_ssl_context(), network_backend=_GuardedBackend(policy), retries=0
        )


# -- URLs ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Prefix:
    scheme: str
    host: str
    port: int | None
    path: str


def _parse_prefix(prefix: str) -> _Prefix:
    url = httpx.URL(prefix)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"URL prefix {prefix!r} must be an http(s) URL with a host")
    return _Prefix(url.scheme, url.host.lower(), url.port, url.path or "/")


# In the raw path (what goes on the wire) these can climb out of a path prefix at the server
# ("/api/%2e%2e/x", "/api%2f..%2fx", "/api/..\\x") although httpx, which collapses only literal
# dot segments, shows them inside it.
_HIDDEN_SEPARATORS = re.compile(rb"%2[ef]|%5c|\\", re.IGNORECASE)


def _hides_separators(url: httpx.URL) -> bool:
    return _HIDDEN_SEPARATORS.search(url.raw_path.partition(b"?")[0]) is not None


def _same_origin(url: httpx.URL, prefix: _Prefix) -> bool:
    return (url.scheme, url.host.lower(), url.port) == (prefix.scheme, prefix.host, prefix.port)


def _matches(url: httpx.URL, prefix: _Prefix) -> bool:
    if not _same_origin(url, prefix):
        return False
    if prefix.path in ("", "/"):
        return True
    if _hides_separators(url):
        return False
    path = url.path or "/"
    if prefix.path.endswith("/"):
        return path.startswith(prefix.path)
    return path == prefix.path or path.startswith(prefix.path + "/")


def _check_url(url: httpx.URL, prefixes: list[_Prefix], shown: str) -> None:
    if url.scheme not in ("http", "https"):
        raise Refused(f"{shown!r}: only http and https URLs are allowed")
    if not url.host:
        raise Refused(f"{shown!r} has no host")
    if prefixes and not any(_matches(url, p) for p in prefixes):
        if _hides_separators(url) and any(_same_origin(url, p) for p in prefixes):
            raise Refused(
                f"{shown!r}: a percent-encoded '.', '/' or '\\' (%2e, %2f, %5c) or a '\\' in "
                "the path is refused under a URL path prefix (it could lead out of the prefix)"
            )
        raise Refused(f"{shown!r} is not under an allowed URL prefix")


# -- the tool ------------------------------------------------------------------------------------


class HttpClients:
    """One pooled client per event loop, closed with the source."""

    def __init__(self, policy: AddressPolicy, timeout: float) -> None:
        self.policy = policy
        self.timeout = timeout
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = self._clients[loop] = httpx.AsyncClient(
                transport=_GuardedTransport(self.policy),
                trust_env=False,
                follow_redirects=False,
                timeout=httpx.Timeout(self.timeout),
            )
        return client

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        clients, self._clients = self._clients, {}
        for owner, client in clients.items():
            if owner is loop:
                await client.aclose()


def http_request_tool(settings: HttpSettings) -> tuple[Tool, HttpClients]:
    """The tool, and its clients (close them with the source)."""
    prefixes = [_parse_prefix(p) for p in settings.allow]
    methods = {m.upper() for m in settings.methods}
    clients = HttpClients(AddressPolicy(settings.allow_private), settings.timeout)
    base_headers = {
        "user-agent": "toolmesh-http-request/0.1",
        "accept-encoding": "gzip, deflate",  # what _Decoder undoes
        **(settings.headers or {}),
    }

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        method = str(args.get("method") or "GET").upper()
        if method not in methods:
            raise Refused(f"method {method} is not allowed (allowed: {', '.join(sorted(methods))})")
        headers = {**base_headers}
        for key, value in (args.get("headers") or {}).items():
            if key.lower() in _FORBIDDEN_HEADERS:
                raise Refused(f"header {key!r} cannot be set")
            headers[key] = str(value)
        body = args.get("body")
        limit = settings.timeout
        if ctx.remaining is not None:
            limit = max(0.01, min(limit, ctx.remaining - 0.1))
        deadline = time.monotonic() + limit  # the HTML conversion's, on its thread
        try:
            async with asyncio.timeout(limit):
                return await _fetch(
                    clients.get(),
                    args["url"],
                    method,
                    headers,
                    body,
                    prefixes,
                    methods,
                    settings,
                    deadline,
                )
        except (TimeoutError, httpx.TimeoutException):  # ours, or httpx's per-step timeout
            return _timed_out(method, args["url"], limit, limit < settings.timeout)

    tool = make_tool(
        "http_request",
        "Make an HTTP request and get the status, headers and body. Methods: "
        + ", ".join(sorted(methods))
        + (f". Allowed URL prefixes: {', '.join(settings.allow)}" if settings.allow else "")
        + ". Private and loopback addresses are not reachable"
        + ("" if settings.allow_private is False else " except those allowed")
        + ".",
        schema(
            ["url"],
            url={"type": "string", "minLength": 1, "description": "http(s) URL."},
            method={"type": "string", "description": "HTTP method (default GET)."},
            headers={
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Request headers.",
            },
            body={"type": "string", "description": "Request body."},
        ),
        run,
        capabilities=settings.capabilities if settings.capabilities is not None else (NET,),
    )
    return tool, clients


async def _fetch(
    client: httpx.AsyncClient,
    raw_url: str,
    method: str,
    headers: dict[str, str],
    body: str | None,
    prefixes: list[_Prefix],
    methods: set[str],
    settings: HttpSettings,
    deadline: float,
) -> ToolResult:
    try:
        url = httpx.URL(raw_url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ValueError(f"invalid URL {raw_url!r}: {exc}") from None
    hops: list[str] = []
    while True:
        _check_url(url, prefixes, str(url))
        request = client.build_request(
            method, url, headers=headers, content=body.encode() if body is not None else None
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.TimeoutException:
            raise  # answered as a timeout, like a deadline
        except httpx.HTTPError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, Refused):
                raise cause from None
            raise ConnectionError(f"{method} {url} failed: {exc}") from None
        try:
            location = response.headers.get("location")
            if response.is_redirect and location:
                if len(hops) >= settings.max_redirects:
                    raise Refused(f"more than {settings.max_redirects} redirects; stopped at {url}")
                target = url.join(location)
                hops.append(str(target))
                method, body = _redirected_method(response.status_code, method, body)
                if method not in methods:
                    raise Refused(f"the redirect to {target} needs method {method}, not allowed")
                if (target.scheme, target.host, target.port) != (url.scheme, url.host, url.port):
                    headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIALS}
                url = target
                continue
            read = await _read_bounded(response, settings.max_bytes)
        finally:
            await response.aclose()
        return await _shape(response, read, hops, settings, deadline)


def _timed_out(method: str, url: str, limit: float, by_call: bool) -> ToolResult:
    """A request past its time answers ``timeout``, as a command past its deadline does."""
    which = "what was left of the call's deadline" if by_call else "the timeout setting"
    return ToolResult.failure(
        "http_request",
        ToolErrorCode.TIMEOUT,
        f"{method} {url} got no complete answer within {limit:.3g}s ({which}); stopped",
        {"url": url, "timeout": limit},
    )


def _redirected_method(status: int, method: str, body: str | None) -> tuple[str, str | None]:
    if status == 303 and method != "HEAD":
        return "GET", None
    if status in (301, 302) and method == "POST":
        return "GET", None
    return method, body


@dataclass(frozen=True, slots=True)
class _Body:
    content: bytes
    truncated: bool
    undecoded: str = ""  # a content coding not undone here ("br"): content is still encoded


async def _read_bounded(response: httpx.Response, limit: int) -> _Body:
    codings = _content_codings(response)
    unknown = ", ".join(c for c in codings if c not in _INFLATED)
    decoder = None if unknown else _Decoder(codings)
    content = bytearray()
    async for chunk in response.aiter_raw():
        room = limit + 1 - len(content)  # one byte more than the limit tells it was reached
        if decoder is None:
            content += chunk[:room]
        else:
            content += decoder.feed(chunk, room)
            while decoder.busy and len(content) <= limit:
                await asyncio.sleep(0)  # a turn for the deadline and the other calls
                content += decoder.feed(b"", limit + 1 - len(content))
        if len(content) > limit:
            return _Body(bytes(content[:limit]), True, unknown)
    return _Body(bytes(content), False, unknown)


def _content_codings(response: httpx.Response) -> list[str]:
    header = response.headers.get("content-encoding", "")
    codings = (c.strip().lower() for c in header.split(","))
    return [c for c in codings if c and c != "identity"]


class _Decoder:
    """Undoes gzip and deflate codings, any number of layers deep, producing no more than it is
    asked for: each layer inflates at most what the next one (or the caller) wants. One call
    does at most ``DECODE_WORK`` bytes of inner-layer work; ``busy`` then says that more is
    left to do without more input (call ``feed(b"", room)`` again after a turn of the loop)."""

    def __init__(self, codings: list[str]) -> None:
        self.layers = [_Inflater(c) for c in reversed(codings)]  # the last applied comes first
        self.pending = [b""] * len(self.layers)  # input each layer has not consumed yet
        self.budget = DECODE_WORK
        self.busy = False  # the last feed stopped at its work budget, not for want of input

    def feed(self, raw: bytes, room: int) -> bytes:
        """The decoded bytes ``raw`` adds, at most ``room`` of them."""
        if not self.layers:
            return raw[:room]
        self.pending[0] += raw
        self.budget = DECODE_WORK
        out = self._pull(len(self.layers) - 1, room)
        self.busy = self.budget <= 0
        return out

    def _pull(self, index: int, want: int) -> bytes:
        layer = self.layers[index]
        out = bytearray()
        while len(out) < want and not layer.eof:
            if not self.pending[index] and index > 0:
                if self.budget <= 0:
                    break  # enough work for one turn of the event loop
                self.pending[index] = self._pull(index - 1, DECODE_STEP)
                self.budget -= len(self.pending[index])
            if not self.pending[index]:
                break  # the layer below needs more of the body
            out += layer.decompress(self.pending[index], want - len(out))
            self.pending[index] = layer.unconsumed_tail
        return bytes(out)


class _Inflater:
    """One gzip or deflate layer; deflate may come zlib-wrapped or raw, as servers send both."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        gzip = coding in ("gzip", "x-gzip")
        self.inner = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None

    @property
    def eof(self) -> bool:
        return self.inner is not None and self.inner.eof

    @property
    def unconsumed_tail(self) -> bytes:
        return self.inner.unconsumed_tail if self.inner is not None else b""

    def decompress(self, data: bytes, limit: int) -> bytes:
        if self.inner is None:
            wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and int.from_bytes(data[:2]) % 31 == 0
            self.inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        try:
            return self.inner.decompress(data, limit)
        except zlib.error as exc:
            raise ConnectionError(
                f"the response's {self.coding} coding is damaged: {exc}"
            ) from None


def _text_of(content: bytes, charset: str | None) -> str:
    """The body as text, in its charset, or as UTF-8 when that is no text encoding: httpx
    accepts any name ``codecs`` knows, and rot13, base64, zlib_codec or idna decode no bytes
    to text (U+FFFD stands for what does not decode)."""
    try:
        return content.decode(charset or "utf-8", "replace")
    except (LookupError, ValueError):  # ValueError: UnicodeError from idna or "undefined"
        return content.decode("utf-8", "replace")


async def _shape(
    response: httpx.Response,
    read: _Body,
    hops: list[str],
    settings: HttpSettings,
    deadline: float,
) -> ToolResult:
    content, truncated = read.content, read.truncated
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    textual = kind.startswith("text/") or kind.endswith(("json", "xml", "javascript")) or not kind
    if read.undecoded:
        body = f"[{len(content)} bytes in content coding {read.undecoded!r}, not decoded]"
    elif textual:
        body = _text_of(content, response.encoding)
        if kind in ("text/html", "application/xhtml+xml") and settings.html != "raw":
            # on a thread: a page of a megabyte takes a good part of a second to convert, and it
            # stops at the deadline (TimeoutError) when no one waits for it any more
            body = await run_blocking(
                functools.partial(html_to_text, body, settings.html, deadline=deadline)
            )
    else:
        body = f"[{len(content)} bytes of {kind} not shown]"
    status_line = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    header_lines = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    text = f"{status_line}\n{header_lines}\n\n{body}"
    if truncated:
        text += f"\n[body truncated at {settings.max_bytes} bytes]"
    failed = response.status_code >= 400
    return ToolResult(
        success=not failed,
        tool_name="http_request",
        data={
            "status": response.status_code,
            "url": str(response.url),
            "headers": dict(response.headers),
            "body": body,
            "redirects": hops,
            "truncated": truncated,
        },
        output=text,
        truncated=truncated,
        error=f"{status_line} from {response.url}" if failed else None,
        error_code="tool_error" if failed else None,
        duration_ms=0,
        metadata={"status": response.status_code},
    )
