"""The HTTP+SSE binding: the A2E SDK's flow, session errors, auth, origin, binding."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import demo_host
from tests.fixtures.sites import static_site
from tests.fixtures.waiting import Waiting
from toolmesh import ConfigError, Host, ToolContext, TransportError, connect_async, tool
from toolmesh.transports.http import HttpServer, check_bind


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[str]:
    host = demo_host(tmp_path / "a.db")
    running = HttpServer(host, "127.0.0.1:0")
    yield await running.start()
    await running.stop()
    await host.close()


def _sse_messages(lines: Iterator[str]) -> Iterator[dict[str, object]]:
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []


async def test_the_a2e_sdk_http_flow_works_unchanged(server: str) -> None:
    """The SDK's HTTPTransport: blocking client, text/plain bodies, a stream opened on a thread
    while the handshake is already being sent (run on a thread; this loop serves)."""
    await asyncio.to_thread(_sdk_flow, server)


def _sdk_flow(server: str) -> None:
    incoming: queue.Queue[dict[str, object]] = queue.Queue()
    with httpx.Client(timeout=30) as http:
        session_id = http.post(f"{server}/session").json()["session_id"]
        headers = {
            "Content-Type": "text/plain",
            "Accept": "text/event-stream",
            "X-Session-Id": session_id,
        }

        def read_stream() -> None:
            with (
                httpx.Client(timeout=None) as streamer,
                streamer.stream("GET", f"{server}/stream", headers=headers) as response,
            ):
                for message in _sse_messages(response.iter_lines()):
                    incoming.put(message)

        threading.Thread(target=read_stream, daemon=True).start()
        handshake = {
            "type": "handshake/req",
            "id": "h1",
            "version": "1.0",
            "ts": 1.0,
            "agent_id": "sdk",
            "agent_caps": ["tools"],
            "auth_token": "",
        }
        assert http.post(
            f"{server}/send", content=json.dumps(handshake), headers=headers
        ).json() == {"ok": True}
        response = incoming.get(timeout=30)
        assert response["type"] == "handshake/resp" and response["ok"] is True
        call = {
            "type": "tool/call/req",
            "id": "c1",
            "version": "1.0",
            "ts": 1.0,
            "session_id": response["session_id"],
            "tool_name": "echo",
            "arguments": {"text": "sdk"},
            "correlation_id": "x",
            "streaming": True,
            "timeout": 60,
        }
        http.post(f"{server}/send", content=json.dumps(call), headers=headers)
        result = incoming.get(timeout=30)
        assert result["type"] == "tool/call/resp" and result["data"]["data"] == "sdk"  # type: ignore[index]
        shutdown = {"type": "shutdown", "id": "s1", "version": "1.0", "ts": 1.0, "timeout": 10}
        assert (
            http.post(f"{server}/send", content=json.dumps(shutdown), headers=headers).status_code
            == 200
        )
        assert http.get(f"{server}/health").json() == {"status": "ok"}


async def test_session_header_errors(server: str) -> None:
    async with httpx.AsyncClient() as http:
        missing = await http.post(f"{server}/send", content=b"{}")
        assert missing.status_code == 400 and "X-Session-Id" in missing.json()["error"]
        unknown = await http.post(f"{server}/send", content=b"{}", headers={"X-Session-Id": "nope"})
        assert unknown.status_code == 404 and "POST /session" in unknown.json()["error"]
        stream = await http.get(f"{server}/stream", headers={"X-Session-Id": "nope"})
        assert stream.status_code == 404


async def test_foreign_origin_is_refused(server: str) -> None:
    async with httpx.AsyncClient() as http:
        evil = await http.post(f"{server}/session", headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403
        local = await http.post(f"{server}/session", headers={"Origin": "http://localhost:3000"})
        assert local.status_code == 200


async def test_bearer_token(tmp_path: Path) -> None:
    host = demo_host(None)
    running = HttpServer(host, "127.0.0.1:0", auth_token="t0ken")
    url = await running.start()
    try:
        async with httpx.AsyncClient() as http:
            refused = await http.post(f"{url}/session")
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            for header in ("Bearer nope", "Basic t0ken", "t0ken", "Bearer T0KEN", "Bearer"):
                wrong = await http.post(f"{url}/session", headers={"Authorization": header})
                assert wrong.status_code == 401, header
            scheme_case = await http.post(
                f"{url}/session", headers={"Authorization": "bearer t0ken"}
            )
            assert scheme_case.status_code == 200  # the scheme is case-insensitive
        client = await connect_async(url, auth_token="t0ken")
        assert (await client.call_tool("echo", {"text": "in"})).output == "in"
        await client.close()
    finally:
        await running.stop()
        await host.close()


def test_binding_beyond_loopback_needs_a_token() -> None:
    assert check_bind("127.0.0.1:0", None) == ("127.0.0.1", 0)
    assert check_bind("localhost:80", None) == ("localhost", 80)
    assert check_bind("[::1]:8080", None) == ("::1", 8080)
    with pytest.raises(ConfigError, match="without authentication"):
        check_bind("0.0.0.0:8765", None)
    assert check_bind("0.0.0.0:8765", "tok") == ("0.0.0.0", 8765)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_bind("8765", None)


async def test_stream_reconnect_keeps_queued_messages(server: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        session_id = (await http.post(f"{server}/session")).json()["session_id"]
        headers = {"X-Session-Id": session_id}
        await http.post(f"{server}/send", content=b'{"type":"ping","id":"p1"}', headers=headers)
        async with http.stream("GET", f"{server}/stream", headers=headers) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["req_id"] == "p1"
                    break


async def test_an_idle_stream_sends_keepalives(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("toolmesh.transports.http.KEEPALIVE_SECONDS", 0.02)
    async with httpx.AsyncClient(timeout=30) as http:
        session_id = (await http.post(f"{server}/session")).json()["session_id"]
        headers = {"X-Session-Id": session_id}
        async with http.stream("GET", f"{server}/stream", headers=headers) as response:
            lines = response.aiter_lines()
            assert await asyncio.wait_for(anext(lines), 10) == ": keepalive"
            await http.post(f"{server}/send", content=b'{"type":"ping","id":"p"}', headers=headers)
            async for line in lines:
                if line.startswith("data: "):  # messages still flow between keepalives
                    assert json.loads(line[6:])["req_id"] == "p"
                    break


async def test_the_app_mounted_under_a_prefix_routes_as_usual(tmp_path: Path) -> None:
    """The hot routes skip the router only at their own path; under a prefix they still route."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from toolmesh.transports.http import build_app

    host = demo_host(tmp_path / "a.db")
    outer = Starlette(routes=[Mount("/a2e", build_app(host))])
    transport = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        session_id = (await http.post("/a2e/session")).json()["session_id"]
        sent = await http.post(
            "/a2e/send", content=b'{"type":"ping","id":"p"}', headers={"X-Session-Id": session_id}
        )
        assert sent.status_code == 200 and sent.json() == {"ok": True}
        assert (await http.get("/a2e/send")).status_code == 405
    await host.close()


_PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY")


async def test_the_client_speaks_plain_http_directly(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    client = await connect_async(server, agent_id="direct")
    try:
        result = await client.call_tool("echo", {"text": "hi"})
        assert result.success and result.data == "hi"
    finally:
        await client.close()


async def test_the_client_honours_proxy_settings(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # a proxy nobody answers at
    with pytest.raises(TransportError, match="cannot reach"):
        await connect_async(server, agent_id="proxied")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    client = await connect_async(server, agent_id="bypassed")
    try:
        assert (await client.call_tool("echo", {"text": "hi"})).success
    finally:
        await client.close()


async def test_a_stream_that_takes_over_sends_everything_in_order(server: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        session_id = (await http.post(f"{server}/session")).json()["session_id"]
        headers = {"X-Session-Id": session_id}

        async def send(message: str) -> None:
            assert (await http.post(f"{server}/send", content=message, headers=headers)).is_success

        async with http.stream("GET", f"{server}/stream", headers=headers) as first:
            await send('{"type": "handshake/req", "id": "hs", "agent_caps": ["tools"]}')
            first_lines = first.aiter_lines()
            async for line in first_lines:
                if line.startswith("data: "):
                    break  # the first stream is attached and waiting for more
            async with http.stream("GET", f"{server}/stream", headers=headers) as second:
                # The second stream owns the session now; the first still waits in the queue
                # and is the one woken by the next message.
                await send(
                    '{"type": "tool/call/req", "id": "c1", "tool_name": "count",'
                    ' "arguments": {"n": 4}, "streaming": true}'
                )
                seen: list[tuple[str, object]] = []
                async for message in _sse_messages_async(second.aiter_lines()):
                    seen.append((str(message["type"]), message.get("seq")))
                    if message["type"] == "tool/call/resp":
                        break
            rest = [line async for line in first_lines]  # the first stream ended, sending
            assert not any(rest)  # nothing after the handshake answer's blank line
    events = [("tool/event", seq) for seq in range(4)]
    assert seen == [*events, ("tool/call/resp", None)]


async def _sse_messages_async(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, object]]:
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            yield json.loads("\n".join(data))
            data = []


@pytest.mark.parametrize(
    "bind",
    ["127.0.0.1:65536", "127.0.0.1:99999", "127.0.0.1:²", "127.0.0.1:٣", "127.0.0.1:" + "9" * 5000],
)
def test_check_bind_wants_an_ascii_port_up_to_65535(bind: str) -> None:
    with pytest.raises(ConfigError, match="port from 0 to 65535") as refused:
        check_bind(bind, None)
    assert repr(bind)[:40] in str(refused.value)


def test_check_bind_refuses_what_can_only_be_a_mistyped_address() -> None:
    assert check_bind("127.0.0.1:65535", None) == ("127.0.0.1", 65535)
    for host in ("256.1.1.1", "1.2.3", "::g"):
        with pytest.raises(ConfigError, match=f"'{host}' is not an IP address"):
            check_bind(f"[{host}]:80", "tok")


async def test_start_on_a_taken_port_raises_one_clear_error(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        running = HttpServer(host, f"127.0.0.1:{port}")
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}: address "):
            await running.start()
    await running.stop()
    await host.close()


async def test_start_raises_the_store_error_before_listening(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("hi\n")
    for audit, message in [
        (tmp_path / "afile", "not a database"),
        (tmp_path / "nodir" / "a.db", "does not exist"),
    ]:
        host = demo_host(audit)
        with pytest.raises(ConfigError, match=message):
            await HttpServer(host, "127.0.0.1:0").start()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:99999", "port out of range"),
        ("http://127.0.0.1:abc", "could not be cast"),
        ("https://127.0.0.1:abc/", "could not be cast"),
        ("http://", "names no host"),
    ],
)
async def test_connect_names_an_unusable_url(url: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as refused:
        await connect_async(url)
    assert f"cannot connect to {url!r}" in str(refused.value)


async def test_a_client_gone_mid_body_is_no_error(tmp_path: Path) -> None:
    """The body stops with a disconnect: POST /send ends quietly (an exception out of the app
    is a traceback in uvicorn's log) and nothing reaches the session."""
    from toolmesh.transports.http import build_app

    host = demo_host(tmp_path / "a.db")
    app = build_app(host)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        session_id = (await http.post("/session")).json()["session_id"]
    arriving: list[dict[str, object]] = [
        {"type": "http.request", "body": b'{"type"', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return arriving.pop(0)

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/send",
        "headers": [(b"x-session-id", session_id.encode())],
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert sent == []
    assert app.state.sessions.peers[session_id].queue.empty()
    await host.close()


async def test_a_huge_unknown_session_id_is_not_echoed_whole(server: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        unknown = await http.post(
            f"{server}/send", content=b"{}", headers={"X-Session-Id": "a" * 50_000}
        )
    assert unknown.status_code == 404
    assert len(unknown.content) < 300 and "50000 characters" in unknown.json()["error"]


async def test_answers_nobody_streams_are_bounded(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that never opens (or reads) its stream: /send answers 429 once the answers
    waiting pass the limit, and takes messages again once the stream collected them."""
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", 1000)
    ping = b'{"type":"ping","id":"p"}'
    async with httpx.AsyncClient(timeout=30) as http:
        session_id = (await http.post(f"{server}/session")).json()["session_id"]
        headers = {"X-Session-Id": session_id}
        statuses = [
            (await http.post(f"{server}/send", content=ping, headers=headers)).status_code
            for _ in range(20)
        ]
        assert statuses[:7] == [200] * 7 and statuses[-1] == 429
        refused = await http.post(f"{server}/send", content=ping, headers=headers)
        assert "wait for GET /stream" in refused.json()["error"]
        async with http.stream("GET", f"{server}/stream", headers=headers) as stream:
            pongs = 0
            async for line in stream.aiter_lines():
                pongs += line.startswith("data: ")
                if pongs == statuses.count(200):
                    break
            sent = await http.post(f"{server}/send", content=ping, headers=headers)
            assert sent.status_code == 200


async def test_a_streaming_call_nobody_reads_stays_within_the_backlog_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One streaming call of a chatty tool, its stream not yet read: past the limit its events
    are dropped (with one note saying so), not queued; its result still arrives in full."""
    limit = 20_000
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", limit)
    emitted = asyncio.Event()

    @tool
    async def chatty(ctx: ToolContext) -> str:
        """Emits 200 events of 1 KB each."""
        for _ in range(200):
            ctx.emit("progress", {"pct": 1, "message": "z" * 1000})
        emitted.set()
        return "done"

    host = Host(chatty, audit=None)
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            session_id = (await http.post(f"{url}/session")).json()["session_id"]
            headers = {"X-Session-Id": session_id}
            hello = {"type": "handshake/req", "agent_id": "t", "agent_caps": ["tools"]}
            call = {
                "type": "tool/call/req",
                "id": "c1",
                "tool_name": "chatty",
                "arguments": {},
                "streaming": True,
            }
            for message in (hello, call):
                sent = await http.post(f"{url}/send", content=json.dumps(message), headers=headers)
                assert sent.status_code == 200
            await emitted.wait()  # every event was delivered while nobody read the stream
            streamed: list[dict[str, Any]] = []
            size = 0
            async with http.stream("GET", f"{url}/stream", headers=headers) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        size += len(line)
                        streamed.append(json.loads(line[6:]))
                        if streamed[-1]["type"] == "tool/call/resp":
                            break
    finally:
        await server.stop()
        await host.close()
    events = [m for m in streamed if m["type"] == "tool/event"]
    notes = [e for e in events if e["kind"] == "log"]
    assert len(notes) == 1 and "further events are dropped" in notes[0]["data"]["message"]
    progress = [e["seq"] for e in events if e["kind"] == "progress"]
    assert 10 < len(progress) < 30 and progress == list(range(len(progress)))
    answer = streamed[-1]["data"]
    assert answer["success"] and answer["data"] == "done"
    assert len(answer["events"]) > len(progress)  # the result kept what the stream dropped
    assert size - len(json.dumps(streamed[-1])) < limit + 3_000  # the events queued at most


async def test_idle_sessions_are_closed_without_a_new_one_being_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolmesh.transports.http as http_transport

    monkeypatch.setattr(http_transport, "IDLE_SESSION_SECONDS", -1.0)  # idle at once
    monkeypatch.setattr(http_transport, "REAP_EVERY_SECONDS", 0.0)
    host = demo_host(tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            session = (await http.post(f"{url}/session")).json()["session_id"]
            # The reaper ran on its timer, not on the next POST /session (there is none).
            sent = await http.post(f"{url}/send", content=b"{}", headers={"X-Session-Id": session})
            assert sent.status_code == 404
    finally:
        await server.stop()
        await host.close()


async def test_proxy_settings_httpx_cannot_read_are_a_transport_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # so the lean client steps aside
    monkeypatch.setenv("NO_PROXY", "[::1]")  # httpx raises InvalidURL on it
    with pytest.raises(TransportError, match="proxy settings"):
        await connect_async("http://127.0.0.1:9/")


async def test_stopping_answers_the_calls_it_cancels(tmp_path: Path) -> None:
    """The server stops with a call running: the call is cancelled and the client, still
    reading its stream, gets that answer before the stream ends (not "the stream ended")."""
    from toolmesh import Host

    waiting = Waiting()
    host = Host(waiting.tool, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    client = await connect_async(await server.start())
    try:
        call = asyncio.ensure_future(client.call_tool("wait_forever", {}, timeout=60))
        await waiting.until_started()
        await server.stop()
        result = await asyncio.wait_for(call, 30)
        assert result.error_code == "cancelled" and "shutting down" in (result.error or "")
    finally:
        await client.close()
        await server.stop()
        await host.close()


async def test_a_shut_down_session_is_forgotten_and_its_stream_ends(tmp_path: Path) -> None:
    """After a shutdown the session can serve nothing: it is forgotten at once (it used to
    stay until idle for IDLE_SESSION_SECONDS, so a client reconnecting often piled them up)
    and its stream ends once the answers queued before it are sent."""
    host = demo_host(tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            session_id = (await http.post(f"{url}/session")).json()["session_id"]
            headers = {"X-Session-Id": session_id}
            async with http.stream("GET", f"{url}/stream", headers=headers) as stream:
                for message in (
                    '{"type": "handshake/req", "id": "hs", "agent_caps": ["tools"]}',
                    '{"type": "tool/call/req", "id": "c1", "tool_name": "echo",'
                    ' "arguments": {"text": "hi"}}',
                    '{"type": "shutdown", "id": "s1"}',
                ):
                    sent = await http.post(f"{url}/send", content=message, headers=headers)
                    assert sent.status_code == 200

                async def read_to_the_end() -> list[str]:
                    return [str(m["type"]) async for m in _sse_messages_async(stream.aiter_lines())]

                seen = await asyncio.wait_for(read_to_the_end(), 10)
            assert seen == ["handshake/resp", "tool/call/resp"]
            assert session_id not in server._sessions.peers
            again = await http.post(f"{url}/send", content=b"{}", headers=headers)
            assert again.status_code == 404
        for _ in range(3):
            client = await connect_async(url)
            await client.close()
        assert server._sessions.peers == {}
    finally:
        await server.stop()
        await host.close()


async def test_a_peer_that_is_no_a2e_host_is_quoted_in_one_short_line(tmp_path: Path) -> None:
    """A web server answers POST /session with a whole HTML error page: the error quotes its
    start, on one line, as every error message should."""
    with static_site(tmp_path) as url, pytest.raises(TransportError) as refused:
        await connect_async(url)
    message = str(refused.value)
    assert f"{url}/session answered 501: " in message and "<html" in message.lower()
    assert "\n" not in message and len(message) < 400


class _StallingHost:
    """A raw loopback server speaking just enough A2E over HTTP, which takes the request
    ``stalls`` names ("POST /session", "GET /stream", or a message type POSTed to /send) and
    never answers it."""

    def __init__(self, stalls: str) -> None:
        self.stalls = stalls
        self._released = asyncio.Event()
        self._stream: asyncio.Queue[bytes] = asyncio.Queue()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info: object) -> None:
        self._released.set()
        self._stream.put_nowait(b"")
        assert self._server is not None
        self._server.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                start, *fields = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                length = sum(
                    int(f.split(":", 1)[1])
                    for f in fields
                    if f.lower().startswith("content-length")
                )
                body = await reader.readexactly(length)
                request = start.rsplit(" ", 1)[0]  # "POST /send"
                message = json.loads(body) if request == "POST /send" else {}
                if self.stalls in (request, message.get("type")):
                    await self._released.wait()
                    return
                if request == "GET /stream":
                    await self._send_stream(writer)
                    return
                if message.get("type") == "handshake/req":
                    from toolmesh.protocol import HandshakeResponse, encode

                    answer = HandshakeResponse(req_id=message["id"], session_id="s1")
                    self._stream.put_nowait(encode(answer).strip())
                reply = b'{"session_id": "s1"}' if request == "POST /session" else b'{"ok": true}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(reply), reply)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def _send_stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while data := await self._stream.get():
            chunk = b"data: " + data + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()


def _through(url: str, client: str) -> str:
    """``url`` as the HTTP client named takes it: credentials in the URL send it through httpx."""
    return url if client == "lean" else url.replace("http://", "http://user:pw@")


@pytest.mark.timeout(30)  # the guard: without a timeout of its own the client hung forever
@pytest.mark.parametrize("client", ["lean", "httpx"])
@pytest.mark.parametrize("stalls", ["POST /session", "GET /stream"])
async def test_connecting_to_a_host_that_never_answers_fails(stalls: str, client: str) -> None:
    from toolmesh import AsyncClient
    from toolmesh.transports.http import HttpChannel

    async with _StallingHost(stalls) as url:
        channel = HttpChannel(_through(url, client), timeout=0.5)
        with pytest.raises(TransportError, match="cannot reach"):
            await AsyncClient(channel).start()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("client", ["lean", "httpx"])
async def test_a_call_whose_post_is_never_answered_fails_at_the_read_timeout(
    client: str,
) -> None:
    from toolmesh import AsyncClient
    from toolmesh.transports.http import HttpChannel

    async with _StallingHost("tool/call/req") as url:
        connected = await AsyncClient(HttpChannel(_through(url, client), timeout=0.5)).start()
        try:
            with pytest.raises(TransportError, match="POST /send failed") as failed:
                await connected.call_tool("anything", {}, timeout=60.0)
            assert str(failed.value).count("[transport_error]") == 1
        finally:
            await connected.close()


@pytest.mark.timeout(30)
async def test_a_call_whose_post_is_never_answered_fails_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The channel's own read timeout is longer than the call's deadline: the deadline, which
    used to start only once the request was sent, ends the call."""
    from toolmesh import CallTimeout

    monkeypatch.setattr("toolmesh.client.RESPONSE_GRACE_SECONDS", 0.0)
    async with _StallingHost("tool/call/req") as url:
        connected = await connect_async(url)
        try:
            with pytest.raises(CallTimeout, match=r"no answer to tool/call/req within 0\.2s"):
                await connected.call_tool("anything", {}, timeout=0.2)
        finally:
            await connected.close()


@pytest.mark.parametrize("client", ["lean", "httpx"])
async def test_a_stream_idle_past_the_read_timeout_stays_open(server: str, client: str) -> None:
    """Only the POSTs have a read timeout: the event stream idles between messages."""
    from toolmesh import AsyncClient
    from toolmesh.transports.http import HttpChannel

    connected = await AsyncClient(HttpChannel(_through(server, client), timeout=0.2)).start()
    try:
        await asyncio.sleep(0.6)  # nothing arrives on the stream meanwhile (no keepalive yet)
        result = await connected.call_tool("echo", {"text": "still here"})
        assert result.success and result.data == "still here"
    finally:
        await connected.close()


@pytest.mark.timeout(30)  # the guard: the calls ended only at their deadline
@pytest.mark.parametrize("client", ["lean", "httpx"])
async def test_close_ends_calls_whose_post_the_host_never_answered(
    client: str, caplog: pytest.LogCaptureFixture
) -> None:
    """close() failed the calls' futures, which nobody awaited yet (their POSTs were still
    waiting): asyncio logged 'Future exception was never retrieved' and each call ended only
    at its deadline, as a timeout."""
    import gc
    import logging

    from toolmesh import AsyncClient
    from toolmesh.transports.http import HttpChannel

    posting = asyncio.Event()

    class Noting(HttpChannel):
        async def send(self, message: Any) -> None:
            if message.type == "tool/call/req":
                posting.set()
            await super().send(message)

    async with _StallingHost("tool/call/req") as url:
        connected = await AsyncClient(Noting(_through(url, client), timeout=600)).start()
        call = asyncio.ensure_future(connected.call_tool("anything", {}, timeout=600))
        await posting.wait()
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            async with asyncio.timeout(10):
                await connected.close()
                with pytest.raises(TransportError):  # (not CallTimeout, ten minutes on)
                    await call
            gc.collect()
    assert "never retrieved" not in caplog.text
