"""http_request against real servers on loopback: private addresses refused, limits kept."""

from __future__ import annotations

import functools
import gzip
import socket
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.sources.builtins.conftest import Make
from toolmesh import ToolErrorCode
from toolmesh.sources.builtins.htmltext import html_to_text


@functools.cache
def gzip_bomb() -> bytes:
    """256 MiB of zeros as gzip inside gzip: under 1 KiB on the wire."""
    inner = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    layer = b"".join(inner.compress(zeros) for _ in range(256)) + inner.flush()
    return gzip.compress(layer, 9)


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODED = {  # path: (content-encoding, body), all but the bomb saying "hello"
    "/bomb": ("gzip, gzip", gzip_bomb),
    "/gzip": ("gzip", lambda: gzip.compress(b"hello")),
    "/deflate": ("deflate", lambda: zlib.compress(b"hello")),
    "/raw-deflate": ("deflate", lambda: raw_deflate(b"hello")),
    "/br": ("br", lambda: b"\x0b\x02\x80hello\x03"),
}

PAGE = b"<html><head><title>T</title></head><body><h1>Hello</h1><p>A <a href='/x'>link</a></p></body></html>"
# a run of spaces the old converter's whitespace cleanup took quadratic time over, on the loop
SPACES_PAGE = b"<html><body><pre>" + b" " * 200_000 + b"x</pre></body></html>"


class Server:
    """A real HTTP server on a loopback address; counts the requests it got."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        self.redirect_to = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, body))
                if self.path == "/redirect":
                    self._send(302, b"", location=outer.redirect_to)
                elif self.path == "/loop":
                    self._send(302, b"", location="/loop")
                elif self.path == "/big":
                    self._send(200, b"x" * 10_000)
                elif self.path == "/page":
                    self._send(200, PAGE, kind="text/html; charset=utf-8")
                elif self.path == "/spaces":
                    self._send(200, SPACES_PAGE, kind="text/html")
                elif self.path.startswith("/charset/"):
                    charset = self.path.removeprefix("/charset/")
                    self._send(200, b"hello", kind=f"text/plain; charset={charset}")
                elif self.path in ENCODED:
                    coding, make = ENCODED[self.path]
                    self._send(200, make(), **{"content-encoding": coding})
                elif self.path == "/missing":
                    self._send(404, b"no such thing")
                else:
                    self._send(200, b"echo:" + self.command.encode() + b":" + body)

            def _send(
                self, status: int, body: bytes, *, kind: str = "text/plain", **headers: str
            ) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_HEAD = _answer  # noqa: N815 - http.server's names

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


@pytest.fixture
def second() -> Iterator[Server]:
    running = Server("127.0.0.2")
    yield running
    running.close()


LOOPBACK = {"http_request": {"allow_private": ["127.0.0.0/8"], "methods": ["GET", "POST"]}}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "0.0.0.0"])
async def test_private_addresses_are_refused(make_kit: Make, server: Server, host: str) -> None:
    kit = await make_kit()
    port = server.url.rsplit(":", 1)[1]
    result = await kit.execute("http_request", {"url": f"http://{host}:{port}/"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert "private" in result.error
    assert server.requests == []  # nothing reached the server


async def test_allowed_private_networks_are_reached(make_kit: Make, server: Server) -> None:
    kit = await make_kit(LOOPBACK)
    result = await kit.execute("http_request", {"url": server.url + "/hello"})
    assert result.success and result.data["status"] == 200 and result.data["body"] == "echo:GET:"
    assert result.output.startswith("HTTP 200 OK\n")
    posted = await kit.execute(
        "http_request", {"url": server.url + "/p", "method": "post", "body": "data"}
    )
    assert posted.data["body"] == "echo:POST:data"


async def test_a_redirect_to_a_private_address_is_refused(
    make_kit: Make, server: Server, second: Server
) -> None:
    second.redirect_to = server.url + "/secret"  # 127.0.0.2 is allowed, 127.0.0.1 is not
    kit = await make_kit({"http_request": {"allow_private": ["127.0.0.2/32"]}})
    result = await kit.execute("http_request", {"url": second.url + "/redirect"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "127.0.0.1" in result.error
    assert [r[1] for r in second.requests] == ["/redirect"] and server.requests == []


async def test_redirects_are_followed_and_bounded(make_kit: Make, server: Server) -> None:
    server.redirect_to = "/final"
    kit = await make_kit({"http_request": {"allow_private": True, "max_redirects": 3}})
    followed = await kit.execute("http_request", {"url": server.url + "/redirect"})
    assert followed.success and followed.data["redirects"] == [server.url + "/final"]
    looping = await kit.execute("http_request", {"url": server.url + "/loop"})
    assert (
        looping.error_code == ToolErrorCode.TOOL_DENIED and "more than 3 redirects" in looping.error
    )
    assert len(server.requests) == 2 + 4


async def test_url_prefixes_and_methods(make_kit: Make, server: Server) -> None:
    settings = {"allow_private": True, "allow": [server.url + "/api"]}
    kit = await make_kit({"http_request": settings})
    assert (await kit.execute("http_request", {"url": server.url + "/api/items"})).success
    assert (await kit.execute("http_request", {"url": server.url + "/api"})).success
    for url in (server.url + "/apix", server.url + "/other", "file:///etc/passwd"):
        result = await kit.execute("http_request", {"url": url})
        assert result.error_code == ToolErrorCode.TOOL_DENIED, url
    server.redirect_to = server.url + "/other"
    redirected = await kit.execute("http_request", {"url": server.url + "/api/../redirect"})
    assert redirected.error_code == ToolErrorCode.TOOL_DENIED
    post = await kit.execute("http_request", {"url": server.url + "/api", "method": "POST"})
    assert "method POST is not allowed" in post.error
    host = await kit.execute("http_request", {"url": server.url + "/api", "headers": {"Host": "x"}})
    assert "cannot be set" in host.error


async def test_size_limit_html_and_errors(make_kit: Make, server: Server) -> None:
    settings = {"allow_private": True, "max_bytes": 1000, "html": "markdown"}
    kit = await make_kit({"http_request": settings})
    big = await kit.execute("http_request", {"url": server.url + "/big"})
    assert big.success and big.truncated and len(big.data["body"]) == 1000
    assert "[body truncated at 1000 bytes]" in big.output
    page = await kit.execute("http_request", {"url": server.url + "/page"})
    assert page.data["body"] == "# Hello\n\nA [link](/x)"
    missing = await kit.execute("http_request", {"url": server.url + "/missing"})
    assert (
        not missing.success and missing.data["status"] == 404 and "no such thing" in missing.output
    )
    nowhere = await kit.execute("http_request", {"url": "http://127.0.0.1:1/"})
    assert nowhere.error_code == ToolErrorCode.TOOL_ERROR and "failed" in nowhere.error


@pytest.fixture
def silent() -> Iterator[str]:
    """The URL of a server that takes the connection and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))  # never accepts: the kernel's backlog does
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hang"
    listener.close()


@pytest.mark.parametrize(
    ("settings_timeout", "call_timeout", "which"),
    [
        (0.5, None, "the timeout setting"),
        (30, 1.0, "what was left of the call's deadline"),
    ],
)
async def test_a_server_that_never_answers_times_out(
    make_kit: Make, silent: str, settings_timeout: float, call_timeout: float | None, which: str
) -> None:
    # it answered tool_error "TimeoutError", naming neither the URL nor the limit
    settings = {"allow_private": ["127.0.0.1/32"], "timeout": settings_timeout}
    kit = await make_kit({"http_request": settings})
    result = await kit.execute("http_request", {"url": silent}, timeout=call_timeout)
    assert result.error_code == ToolErrorCode.TIMEOUT, result
    assert result.error.startswith(f"GET {silent} got no complete answer within ")
    assert f"({which})" in result.error


@pytest.mark.parametrize(
    "path",
    [
        "/api/%2e%2e/secret.txt",
        "/api/.%2E/secret.txt",
        "/api%2f..%2fsecret.txt",
        "/api/%2E%2E%2Fsecret.txt",
        "/api/..%5csecret.txt",
        "/api/x\\..\\..\\secret.txt",
    ],
)
async def test_encoded_separators_cannot_leave_a_path_prefix(
    make_kit: Make, server: Server, path: str
) -> None:
    # httpx checks the decoded path but sends the raw one, which a server may decode to "/.."
    kit = await make_kit({"http_request": {"allow_private": True, "allow": [server.url + "/api"]}})
    result = await kit.execute("http_request", {"url": server.url + path})
    assert result.error_code == ToolErrorCode.TOOL_DENIED, result
    assert "percent-encoded" in result.error
    assert server.requests == []


async def test_a_redirect_with_encoded_separators_is_refused(
    make_kit: Make, server: Server
) -> None:
    server.redirect_to = server.url + "/api/%2e%2e/secret.txt"
    allow = [server.url + "/api", server.url + "/redirect"]
    kit = await make_kit({"http_request": {"allow_private": True, "allow": allow}})
    result = await kit.execute("http_request", {"url": server.url + "/redirect"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "percent-encoded" in result.error
    assert [r[1] for r in server.requests] == ["/redirect"]


async def test_other_encodings_and_queries_under_a_prefix_still_work(
    make_kit: Make, server: Server
) -> None:
    kit = await make_kit({"http_request": {"allow_private": True, "allow": [server.url + "/api"]}})
    result = await kit.execute("http_request", {"url": server.url + "/api/a%20b?next=%2e%2e%2f"})
    assert result.success, result
    assert [r[1] for r in server.requests] == ["/api/a%20b?next=%2e%2e%2f"]
    anywhere = await make_kit({"http_request": {"allow_private": True}})
    assert (await anywhere.execute("http_request", {"url": server.url + "/a%2fb"})).success


async def test_a_compression_bomb_is_inflated_only_up_to_the_limit(
    make_kit: Make, server: Server
) -> None:
    gzip_bomb()  # built before measuring
    kit = await make_kit({"http_request": {"allow_private": True, "max_bytes": 1000}})
    tracemalloc.start()
    try:
        result = await kit.execute("http_request", {"url": server.url + "/bomb"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.success and result.truncated, result
    assert result.data["body"] == "\0" * 1000
    assert peak < 32 * 1024 * 1024  # httpx alone holds the 256 MiB at once


async def test_content_codings_are_decoded_or_described(make_kit: Make, server: Server) -> None:
    kit = await make_kit({"http_request": {"allow_private": True}})
    for path in ("/gzip", "/deflate", "/raw-deflate"):
        result = await kit.execute("http_request", {"url": server.url + path})
        assert result.success and result.data["body"] == "hello", (path, result)
    brotli = await kit.execute("http_request", {"url": server.url + "/br"})
    assert brotli.data["body"] == "[9 bytes in content coding 'br', not decoded]"


def empty_block_bomb(megabytes: int) -> bytes:
    """gzip inside gzip inside gzip whose innermost layer is empty deflate blocks: it decodes
    to nothing, so no output limit bounds the work of inflating the layers around it."""
    header = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF])
    blocks = b"\x00\x00\x00\xff\xff" * (1 << 18)  # 1.25 MiB of empty stored blocks
    middle = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    outer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [outer.compress(middle.compress(header))]
    for _ in range((megabytes << 20) // len(blocks)):
        parts.append(outer.compress(middle.compress(blocks)))
    parts += [outer.compress(middle.flush()), outer.flush()]
    return b"".join(parts)


def test_decoding_hands_the_event_loop_back_between_bounded_steps() -> None:
    # 8 KiB on the wire took ~1.3 s per GiB of inner layers in one synchronous call, on the
    # event loop: neither the tool's timeout nor any other session ran meanwhile
    from toolmesh.sources.builtins.web import DECODE_WORK, _Decoder

    body = empty_block_bomb(64)
    decoder = _Decoder(["gzip", "gzip", "gzip"])
    assert decoder.feed(body, 1000) == b""
    steps = 1
    while decoder.busy:
        assert decoder.feed(b"", 1000) == b""
        steps += 1
    assert steps >= (64 << 20) // DECODE_WORK  # the work came in bounded steps
    layered = _Decoder(["gzip", "gzip"])  # plain data still decodes whole, in one step
    assert layered.feed(gzip.compress(gzip.compress(b"hello" * 1000)), 10_000) == b"hello" * 1000
    assert not layered.busy


@pytest.mark.parametrize(
    "address",
    ["::7f00:1", "::a9fe:a9fe", "::ffff:0:7f00:1", "64:ff9b:1::a00:1", "fec0::1"],
)
def test_ipv4_compatible_translated_and_local_nat64_addresses_are_refused(address: str) -> None:
    # Python 3.11 before 3.11.10 calls these global, and their IPv4 part went unchecked
    import ipaddress

    from toolmesh.sources.builtins.web import AddressPolicy, AddressRefused

    with pytest.raises(AddressRefused):
        AddressPolicy(False).check("h", ipaddress.ip_address(address))
    AddressPolicy(True).check("h", ipaddress.ip_address(address))
    AddressPolicy(False).check("h", ipaddress.ip_address("2606:4700::1111"))  # global stays fine


async def test_html_is_converted_off_the_event_loop(
    make_kit: Make, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the conversion ran synchronously on the loop: a page took 22 s, past every timeout, and
    # every other call on the loop stood still meanwhile
    from toolmesh.sources.builtins import web

    threads: list[threading.Thread] = []

    def recording(*args: Any, **kwargs: Any) -> str:
        threads.append(threading.current_thread())
        return html_to_text(*args, **kwargs)

    monkeypatch.setattr(web, "html_to_text", recording)
    kit = await make_kit({"http_request": {"allow_private": True, "html": "text", "timeout": 20}})
    result = await kit.execute("http_request", {"url": server.url + "/spaces"})
    assert result.success and result.data["body"] == "x", result
    assert threads and threads[0] is not threading.current_thread()


async def test_a_conversion_past_the_deadline_answers_timeout(
    make_kit: Make, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolmesh.sources.builtins import web

    release = threading.Event()

    def stuck(html: str, mode: str, *, deadline: float | None = None) -> str:
        release.wait(10)  # a conversion that takes longer than the call may
        return html

    monkeypatch.setattr(web, "html_to_text", stuck)
    kit = await make_kit({"http_request": {"allow_private": True, "html": "text", "timeout": 0.5}})
    try:
        result = await kit.execute("http_request", {"url": server.url + "/page"})
    finally:
        release.set()
    assert result.error_code == ToolErrorCode.TIMEOUT, result
    assert "(the timeout setting)" in result.error


@pytest.mark.parametrize(
    "charset", ["rot13", "base64", "hex", "zlib_codec", "idna", "undefined", "no-such-charset"]
)
async def test_a_charset_that_is_no_text_encoding_falls_back_to_utf8(
    make_kit: Make, server: Server, charset: str
) -> None:
    # it failed the 200 response: "LookupError: 'rot13' is not a text encoding"
    kit = await make_kit({"http_request": {"allow_private": True}})
    result = await kit.execute("http_request", {"url": f"{server.url}/charset/{charset}"})
    assert result.success and result.data["body"] == "hello", result
