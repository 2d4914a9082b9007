"""A2E over HTTP + Server-Sent Events: the binding of the A2E Python SDK, so its client works
unchanged.

    POST /session                          -> {"session_id": "..."}
    POST /send     (X-Session-Id, 1 msg)   -> {"ok": true}; answers arrive on the stream
    GET  /stream   (X-Session-Id)          -> SSE: "data: <message json>" + blank line, per message
    GET  /health                           -> {"status": "ok" | "degraded", ...}

Messages for a session wait in its queue until a stream attaches (the SDK opens its stream and
sends its handshake at the same time). With a shared store (PostgreSQL) several hosts serve the
same sessions: ``toolmesh.transports.cluster`` routes messages to the host holding the stream.
The server binds 127.0.0.1 unless told otherwise, refuses
to listen more widely without a bearer token, and rejects browser requests from foreign origins.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from toolmesh.capabilities import string_list
from toolmesh.errors import ConfigError, ProtocolError, TransportError, excerpt
from toolmesh.host import Connection, Host
from toolmesh.models import ToolEvent, secret_id
from toolmesh.protocol import ErrorCode, ErrorMessage, decode, encode, request_id_of
from toolmesh.transports.lean_http import LeanClient, LeanError, lean_suits
from toolmesh.transports.lines import HEAD_BYTES, Oversized
from toolmesh.transports.unreadable import unreadable_answer

__all__ = ["HotRoute", "HttpChannel", "HttpServer", "build_app", "check_bind", "serve_http"]

logger = logging.getLogger("toolmesh.http")

SESSION_HEADER = "X-Session-Id"
_END = b""  # queued to wake a stream so it ends (None in a queue asks for a keepalive)
IDLE_SESSION_SECONDS = 600.0
REAP_EVERY_SECONDS = 60.0  # how often idle sessions are looked for, while any exist
KEEPALIVE_SECONDS = 15.0
# Answers waiting for a stream; past it /send answers 429 and events that are only streamed
# (not approvals, which need an answer) are dropped: a call's result still carries its events.
MAX_UNSENT_BYTES = 16 * 1024 * 1024
SHOWN_ID_CHARS = 64  # of a session id echoed in an error (ours have 32)


class _Peer:
    """One HTTP session: its A2E connection and the queue its stream drains."""

    def __init__(self, host: Host, session_id: str) -> None:
        self.id = session_id
        self.queue = _StreamQueue()  # None: time for a keepalive
        self.connection: Connection = host.connect(
            self._deliver, transport="http", session_id=session_id
        )
        self.stream_owner: object | None = None
        self.last_seen = time.monotonic()
        self._dropping: set[str] = set()  # calls told their events are dropped, this backlog

    def _deliver(self, message: Any) -> None:
        # One comparison on the hot path: the backlog counts only when nobody reads it.
        if self.queue.unsent_bytes > MAX_UNSENT_BYTES:
            if _only_streamed(message):
                self._drop(message)
                return
        elif self._dropping:
            self._dropping.clear()  # the stream caught up: a new backlog gets a new note
        self.queue.put_nowait(encode(message))

    def _drop(self, event: ToolEvent) -> None:
        """Drop one event past the backlog limit; its call's first drop queues a note saying so
        (a log event, in the call's place in the stream) and is logged."""
        if event.req_id in self._dropping:
            return
        self._dropping.add(event.req_id)
        note = (
            f"more than {MAX_UNSENT_BYTES} bytes wait for GET /stream: this call's further "
            "events are dropped until the stream is read (its result still carries its events)"
        )
        logger.warning("session %s, call %s: %s", self.id, event.req_id, note)
        dropped = ToolEvent(
            kind="log",
            req_id=event.req_id,
            seq=event.seq,
            data={"level": "warning", "message": note},
        )
        self._queue_note(encode(dropped))

    def _queue_note(self, data: bytes) -> None:
        """Send a note of the host's own down the stream, after what waits for it."""
        self.queue.put_nowait(data)

    async def receive(self, body: bytes) -> None:
        """One message POSTed for this session."""
        await self.connection.receive_line(body)


class _Sessions:
    """HTTP sessions by id; idle ones without a stream are closed after a while.

    The hooks (``start``, ``adopt``, ``attached``, ``detached``) do nothing for one host; the
    cluster version shares sessions through the store."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.peers: dict[str, _Peer] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        """Called once the host is started."""

    async def create(self) -> _Peer:
        self._reap()
        peer = _Peer(self.host, secret_id())
        self.peers[peer.id] = peer
        return peer

    async def adopt(self, session_id: str) -> _Peer | None:
        """A session this host does not know yet (another host may have created it)."""
        return None

    def attached(self, peer: _Peer) -> None:
        """A stream now reads ``peer``'s queue."""

    def detached(self, peer: _Peer) -> None:
        """``peer``'s stream ended (messages may still be queued)."""

    async def backlog_refusal(self, peer: _Peer) -> Response | None:
        """The answer to a POST /send while too many bytes wait for ``peer``'s stream (asked
        only then; the cluster version first counts again what waits in the store)."""
        return _backlog_refusal(peer)

    def ended(self, peer: _Peer) -> None:
        """``peer``'s session was shut down by its client: forget it now (it can serve
        nothing more), not once it has been idle for IDLE_SESSION_SECONDS (a client that
        reconnects often would pile them up), and end its stream after what is queued."""
        if self.peers.get(peer.id) is peer:
            del self.peers[peer.id]
        peer.queue.put_nowait(_END)

    def _reap(self) -> None:
        """Look for idle sessions now and then, on a timer: a session a client abandoned is
        closed even when no new session is ever made (and a create never scans them all)."""
        if self._reaper is None:
            loop = asyncio.get_running_loop()
            self._reaper = loop.call_later(REAP_EVERY_SECONDS, self._reap_idle)

    def _reap_idle(self) -> None:
        self._reaper = None
        now = time.monotonic()
        for peer in list(self.peers.values()):
            if peer.stream_owner is None and now - peer.last_seen > IDLE_SESSION_SECONDS:
                self.peers.pop(peer.id, None)
                task = asyncio.ensure_future(peer.connection.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        if self.peers:
            self._reap()

    async def close(self) -> None:
        """End every session, then every stream cleanly (so clients see a complete response).
        The sessions end first: the answers of the calls their closing cancelled are queued
        ahead of the end of the stream, so a client still reading learns what became of each
        call instead of losing the stream with calls unanswered."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self.host._agui is not None:
            self.host._agui.close()  # AG-UI streams end too
        peers = list(self.peers.values())
        self.peers.clear()
        await asyncio.gather(*(peer.connection.close() for peer in peers))
        for peer in peers:
            peer.queue.put_nowait(_END)


def check_bind(bind: str, auth_token: str | None) -> tuple[str, int]:
    """Parse ``HOST:PORT``; refuse a non-loopback address without a bearer token."""
    host, sep, port_text = bind.rpartition(":")
    # isdigit() alone takes "²" and other non-ASCII digits int() refuses; five digits at most
    # keeps int() away from huge strings.
    if (
        not sep
        or not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5)
        or int(port_text) > 65535
    ):
        raise ConfigError(
            "--http wants HOST:PORT with a port from 0 to 65535 (for example 127.0.0.1:8765), "
            f"not {bind!r}"
        )
    host = host.strip("[]") or "127.0.0.1"
    if not _plausible_host(host):
        raise ConfigError(f"--http {bind!r}: {host!r} is not an IP address")
    if not _is_loopback(host) and not auth_token:
        raise ConfigError(
            f"refusing to listen on {host} without authentication: set an auth token "
            "(--auth-token or TOOLMESH_AUTH_TOKEN), or bind 127.0.0.1"
        )
    return host, int(port_text)


def _plausible_host(host: str) -> bool:
    """False for what can only be a mistyped IP address (``256.1.1.1``, ``::g``): the resolver
    would otherwise look it up as a host name (slowly, when there is no DNS)."""
    if ":" not in host and not re.fullmatch(r"[\d.]+", host):
        return True  # a host name
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(
    host: Host,
    *,
    auth_token: str | None = None,
    allowed_origins: Sequence[str] = (),
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The ASGI app serving ``host`` (plus ``extra_routes``, e.g. MCP or A2A, on the same port)."""
    sessions = _sessions_for(host)
    origins = set(string_list(allowed_origins, where="allowed_origins"))

    def refuse(request: Request) -> Response | None:
        return refuse_unwelcome(request.headers, origins, auth_token)

    async def peer_of(headers: Headers) -> _Peer | Response:
        session_id = headers.get(SESSION_HEADER)
        if not session_id:
            return JSONResponse({"error": f"missing {SESSION_HEADER} header"}, status_code=400)
        peer = sessions.peers.get(session_id) or await sessions.adopt(session_id)
        if peer is None:
            shown = _shortened(session_id)
            return JSONResponse(
                {"error": f"unknown session {shown!r}; POST /session first"},
                status_code=404,
            )
        peer.last_seen = time.monotonic()
        return peer

    async def create_session(request: Request) -> Response:
        refused = refuse(request)
        if refused is not None:
            return refused
        await host.start()
        peer = await sessions.create()
        return JSONResponse({"session_id": peer.id})

    async def send(scope: Scope, receive: Receive, reply: Send) -> None:
        """POST /send as plain ASGI: every call passes here (``_A2EApp`` skips the router)."""
        headers = Headers(scope=scope)
        answer = refuse_unwelcome(headers, origins, auth_token) or await peer_of(headers)
        if not isinstance(answer, Response) and answer.queue.unsent_bytes > MAX_UNSENT_BYTES:
            answer = await sessions.backlog_refusal(answer) or answer
        if isinstance(answer, Response):
            await answer(scope, receive, reply)
            return
        try:
            body = await _bounded_body(receive, host.max_message_bytes)
        except ClientDisconnect:
            return  # the client gave up mid-body: nothing to handle, nobody to answer
        if isinstance(body, Oversized):
            answer._deliver(
                ErrorMessage(
                    req_id=request_id_of(body.head, partial=True),  # its call fails at once
                    code=ErrorCode.MESSAGE_TOO_LARGE,
                    message=f"message exceeds the limit of {host.max_message_bytes} bytes",
                    detail={"limit": host.max_message_bytes},
                )
            )
        else:
            await answer.receive(body)
            if answer.connection.closed:  # a shutdown message, drained
                sessions.ended(answer)
        await reply({"type": "http.response.start", "status": 200, "headers": _OK_HEADERS})
        await reply({"type": "http.response.body", "body": _OK})

    async def stream(request: Request) -> Response:
        refused = refuse(request)
        if refused is not None:
            return refused
        peer = await peer_of(request.headers)
        if isinstance(peer, Response):
            return peer
        owner = object()
        peer.stream_owner = owner  # a new stream takes over from an older one
        sessions.attached(peer)
        return StreamingResponse(
            _sse(peer, owner, request, sessions),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def agui(request: Request) -> Response:
        refused = refuse(request)
        if refused is not None:
            return refused
        session_id = request.path_params["session_id"]
        if session_id not in host.sessions:
            return JSONResponse({"error": f"no live session {session_id!r}"}, status_code=404)

        async def frames() -> AsyncIterator[bytes]:
            async for event in host.agui.events(session_id):
                yield b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"

        return StreamingResponse(
            frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def health(request: Request) -> Response:
        report = host.health()
        return JSONResponse({"status": report["status"]}, status_code=200)

    routes: list[BaseRoute] = [
        Route("/session", create_session, methods=["POST"]),
        HotRoute("/send", _Asgi(send), methods=["POST"]),
        Route("/stream", stream, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/agui/{session_id}", agui, methods=["GET"]),
        *extra_routes,
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await host.start()
        await sessions.start()
        try:
            yield
        finally:
            await sessions.close()

    app = _A2EApp(routes=routes, lifespan=lifespan)
    app.state.sessions = sessions
    return app


class HotRoute(Route):
    """A route with a fixed path whose endpoint is answered before Starlette's router and
    middleware (about a tenth of a request's server time): for the endpoints every call passes
    (A2E's POST /send, the A2A JSON-RPC endpoint). Mounted under a prefix it routes as usual."""


class StoppingRoute(Route):
    """A route whose endpoint has work to end when the server stops (``on_stop``, awaited
    before the server waits for open requests): the MCP endpoint's sessions, whose running
    calls are then answered, not cut off by the server's shutdown timeout."""

    def __init__(
        self, path: str, endpoint: Any, *, on_stop: Callable[[], Awaitable[None]], **options: Any
    ) -> None:
        super().__init__(path, endpoint, **options)
        self.on_stop = on_stop


class _A2EApp(Starlette):
    """Starlette that answers its ``HotRoute``s first."""

    def __init__(self, *, routes: Sequence[BaseRoute], **options: Any) -> None:
        super().__init__(routes=routes, **options)
        self._hot: dict[tuple[str, str], ASGIApp] = {
            (method, route.path): route.app
            for route in routes
            if isinstance(route, HotRoute)
            for method in route.methods or ()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hot = self._hot.get((scope["method"], scope["path"]))
            if hot is not None:
                await hot(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class _Asgi:
    """Marks a plain ASGI function as such for a Route (which would wrap a function as a
    request handler)."""

    __slots__ = ("_app",)

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def _shortened(session_id: str) -> str:
    """A session id as an error shows it: a huge header is not echoed whole."""
    if len(session_id) <= SHOWN_ID_CHARS:
        return session_id
    return f"{session_id[:SHOWN_ID_CHARS]}... ({len(session_id)} characters)"


def _only_streamed(message: Any) -> bool:
    """An event the client only watches: an approval request waits for an answer."""
    return isinstance(message, ToolEvent) and message.kind != "approval"


def _backlog_refusal(peer: _Peer) -> Response | None:
    """429 while too many answers wait for the session's stream (a client that never opens
    or never reads it): the queue would otherwise grow without bound."""
    waiting = peer.queue.unsent_bytes
    if waiting <= MAX_UNSENT_BYTES:
        return None
    return JSONResponse(
        {
            "error": f"{waiting} bytes of answers wait for GET /stream (limit "
            f"{MAX_UNSENT_BYTES}); read the stream, then send again"
        },
        status_code=429,
        headers={"Retry-After": "1"},
    )


_OK = b'{"ok":true}'
_OK_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"11")]


async def _bounded_body(receive: Receive, limit: int) -> bytes | Oversized:
    """A request's body, or ``Oversized`` (its start) when it is larger than ``limit`` (read
    no further)."""
    chunks = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunks += message.get("body", b"")
        if len(chunks) > limit:
            return Oversized(len(chunks), bytes(chunks[:HEAD_BYTES]))
        if not message.get("more_body", False):
            return bytes(chunks)


def _sessions_for(host: Host) -> _Sessions:
    if not host.store.shared:
        return _Sessions(host)
    from toolmesh.transports.cluster import ClusterSessions

    return ClusterSessions(host)


async def _sse(
    peer: _Peer, owner: object, request: Request, sessions: _Sessions
) -> AsyncIterator[bytes]:
    queue = peer.queue
    # None joins the queue every KEEPALIVE_SECONDS, for a keepalive: waiting for a message then
    # needs no timer of its own (asyncio.wait_for would cost a task and a timer per message).
    ticker = _Keepalive(queue)
    try:
        while peer.stream_owner is owner:
            data = await queue.get()
            if data is None:
                if await request.is_disconnected():
                    break
                yield b": keepalive\n\n"
                continue
            if not data:  # _END: the server is stopping
                break
            if peer.stream_owner is not owner:
                queue.put_back(data)  # first in line for the stream that took over
                break
            yield b"data: " + data.rstrip(b"\n") + b"\n\n"
    finally:  # also when the client went away and the response was cancelled
        ticker.cancel()
        if peer.stream_owner is owner:
            peer.stream_owner = None
            peer.last_seen = time.monotonic()
            sessions.detached(peer)


class _StreamQueue(asyncio.Queue[bytes | None]):
    """A session's outgoing messages; one taken by a stream that lost the session to a newer
    one goes back to the front, so the new stream sends everything in order."""

    def _init(self, maxsize: int) -> None:
        self._queue: collections.deque[bytes | None] = collections.deque()
        self._to_front = False
        self.unsent_bytes = 0  # of the messages waiting (what bounds a session's backlog)

    def _put(self, item: bytes | None) -> None:
        self.unsent_bytes += len(item or b"")
        if self._to_front:
            self._queue.appendleft(item)
        else:
            self._queue.append(item)

    def _get(self) -> bytes | None:
        item = self._queue.popleft()
        self.unsent_bytes -= len(item or b"")
        return item

    def put_back(self, item: bytes | None) -> None:
        self._to_front = True
        try:
            self.put_nowait(item)
        finally:
            self._to_front = False


class _Keepalive:
    """Puts None (time for a keepalive) into a stream's queue every KEEPALIVE_SECONDS."""

    def __init__(self, queue: asyncio.Queue[bytes | None]) -> None:
        self._queue = queue
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(KEEPALIVE_SECONDS, self._tick)

    def _tick(self) -> None:
        self._queue.put_nowait(None)
        self._handle = self._loop.call_later(KEEPALIVE_SECONDS, self._tick)

    def cancel(self) -> None:
        self._handle.cancel()


def refuse_unwelcome(
    headers: Headers, allowed_origins: Collection[str], auth_token: str | None
) -> Response | None:
    """The answer to a request from a foreign browser origin (403) or without the bearer token
    the server was given (401); None when the request may proceed. Every HTTP surface (A2E, MCP,
    A2A) checks its requests with this one function."""
    origin = headers.get("origin")
    if origin and origin not in allowed_origins and not _is_local_origin(origin):
        return JSONResponse({"error": f"origin {origin!r} is not allowed"}, status_code=403)
    if auth_token is not None:
        scheme, _, given = headers.get("authorization", "").strip().partition(" ")
        # The scheme's case does not matter (RFC 9110 11.1); the token's does.
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), auth_token.encode()
        ):
            return JSONResponse(
                {"error": "missing or wrong bearer token"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
    return None


def _is_local_origin(origin: str) -> bool:
    try:
        hostname = urlsplit(origin).hostname or ""
    except ValueError:
        return False
    return _is_loopback(hostname)


class HttpServer:
    """uvicorn running ``build_app(host)``; ``url`` is known once ``start`` returns."""

    def __init__(
        self,
        host: Host,
        bind: str = "127.0.0.1:0",
        *,
        auth_token: str | None = None,
        allowed_origins: Sequence[str] = (),
        extra_routes: Sequence[BaseRoute] = (),
    ) -> None:
        import uvicorn

        self.bind_host, self._port = check_bind(bind, auth_token)
        self._host = host
        app = build_app(
            host,
            auth_token=auth_token,
            allowed_origins=allowed_origins,
            extra_routes=extra_routes,
        )
        self._sessions: _Sessions = app.state.sessions
        self._on_stop = [r.on_stop for r in extra_routes if isinstance(r, StoppingRoute)]
        config = uvicorn.Config(
            app,
            host=self.bind_host,
            port=self._port,
            log_level="warning",
            access_log=False,
            # Nothing here reads the client's address, so X-Forwarded-* needs no processing.
            proxy_headers=False,
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> str:
        """Start the host, listen, and return the URL. A store that cannot open raises its
        ConfigError here (as over stdio) and a port that cannot be listened on a ConfigError
        saying why, rather than uvicorn logging it and raising SystemExit."""
        await self._host.start()  # before uvicorn: its lifespan hook would swallow the error
        sockets = await _listen(self.bind_host, self._port, self._server.config.backlog)
        self._task = asyncio.ensure_future(self._serve(sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup error
                raise TransportError("the HTTP server stopped during startup")
            await asyncio.sleep(0.005)
        listening = [s for server in self._server.servers for s in server.sockets]
        address = listening[0].getsockname()
        shown = f"[{address[0]}]" if ":" in address[0] else address[0]
        self.url = f"http://{shown}:{address[1]}"
        return self.url

    async def _serve(self, sockets: list[socket.socket]) -> None:
        try:
            await self._server.serve(sockets=sockets)
        except SystemExit:  # uvicorn's report of a failed startup (it logged the cause)
            raise TransportError("the HTTP server failed to start") from None
        finally:
            if not self._server.started:  # else uvicorn's shutdown closed them
                for sock in sockets:
                    sock.close()

    async def stop(self) -> None:
        if self._task is None:
            return
        await asyncio.gather(self._sessions.close(), *(stop() for stop in self._on_stop))
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def wait(self) -> None:
        """Until the server stops. Cancelling the wait does not cancel uvicorn (stop() ends it
        gracefully: lifespan shutdown, streams closed)."""
        if self._task is not None:
            await asyncio.shield(self._task)


async def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (as asyncio's create_server
    makes them), for uvicorn to serve on: bound here, a failure is one clear ConfigError."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sockets: list[socket.socket] = []
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _name, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)  # here, not in uvicorn: a taken port fails at bind or here
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot listen on {where}: {reason[:1].lower()}{reason[1:]}") from None
    if not sockets:
        raise ConfigError(f"cannot listen on {where}: it resolves to no address")
    return sockets


async def serve_http(
    host: Host,
    bind: str = "127.0.0.1:8765",
    *,
    auth_token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> None:
    """Serve until cancelled; ``on_ready(url)`` is called once the port is listening."""
    server = HttpServer(host, bind, auth_token=auth_token, extra_routes=extra_routes)
    url = await server.start()
    if on_ready is not None:
        on_ready(url)
    try:
        await server.wait()
    finally:
        await server.stop()


class HttpChannel:
    """The client side: POST /session, read GET /stream, POST each message to /send.

    Plain ``http://`` hosts are spoken to with the lean HTTP/1.1 client (a call costs a
    fraction of what httpx takes); ``https://``, credentials in the URL and proxied hosts
    go through httpx."""

    def __init__(
        self,
        url: str,
        *,
        auth_token: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base = url.rstrip("/")
        self.headers = dict(headers or {})
        if auth_token:
            self.headers.setdefault("Authorization", f"Bearer {auth_token}")
        self.timeout = timeout
        self.session_id = ""
        self._session: dict[str, str] = {}  # the session header, once there is a session
        self._httpx: Any = None
        self._lean: dict[str, LeanClient | None] = {}  # by base URL; None: httpx's
        self._reader: asyncio.Task[None] | None = None

    async def open(
        self, on_message: Callable[[Any], None], on_close: Callable[[str], None]
    ) -> None:
        try:
            status, text = await self._post(f"{self.base}/session", b"")
        except TransportError as exc:
            await self.close()
            raise TransportError(f"cannot reach {self.base}: {exc.message}") from exc
        if status != 200:
            await self.close()
            raise TransportError(f"{self.base}/session answered {status}: {excerpt(text)}")
        self.session_id = _session_of(text)
        if not self.session_id:
            await self.close()
            raise TransportError(
                f"{self.base}/session did not answer with a session id: {excerpt(text)}"
            )
        self._session = {SESSION_HEADER: self.session_id}
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read(on_message, on_close, opened))
        try:  # the stream is read without a timeout (it idles): its answer has one
            await asyncio.wait_for(opened, self.timeout)
        except TimeoutError:
            await self.close()
            raise TransportError(
                f"cannot reach {self.base}: GET /stream did not answer within {self.timeout:g}s"
            ) from None

    async def _read(
        self,
        on_message: Callable[[Any], None],
        on_close: Callable[[str], None],
        opened: asyncio.Future[None],
    ) -> None:
        reason = "the stream ended"
        try:
            async with self._stream(f"{self.base}/stream") as (status, lines):
                if status != 200:
                    raise TransportError(f"GET /stream answered {status}")
                opened.set_result(None)
                data: list[str] = []
                async for line in lines:
                    if line.startswith("data:"):
                        data.append(line[5:].lstrip(" "))
                    elif not line and data:
                        _dispatch("\n".join(data), on_message)
                        data = []
        except asyncio.CancelledError:
            reason = "closed"
            raise
        except Exception as exc:
            reason = f"stream failed: {exc}"
            if not opened.done():
                opened.set_exception(TransportError(reason))
        finally:
            if not opened.done():
                opened.set_exception(TransportError(reason))
            on_close(reason)

    async def send(self, message: Any) -> None:
        try:
            status, text = await self._post(f"{self.base}/send", encode(message))
        except TransportError as exc:
            raise TransportError(f"POST /send failed: {exc.message}") from exc
        if status != 200:
            raise TransportError(f"POST /send answered {status}: {excerpt(text)}")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        for lean in self._lean.values():
            if lean is not None:
                await lean.aclose()
        self._lean.clear()
        if self._httpx is not None:
            await self._httpx.aclose()
            self._httpx = None

    # -- the two HTTP clients --------------------------------------------------------------------

    def _lean_for(self, url: str) -> LeanClient | None:
        base = url.rsplit("/", 1)[0]
        if base not in self._lean:
            self._lean[base] = (
                LeanClient(
                    base, self.headers, connect_timeout=self.timeout, read_timeout=self.timeout
                )
                if lean_suits(base)
                else None
            )
        return self._lean[base]

    def _httpx_client(self) -> Any:
        import httpx

        if self._httpx is None:
            try:
                self._httpx = httpx.AsyncClient(headers=self.headers, timeout=self.timeout)
            except httpx.InvalidURL as exc:  # httpx cannot read NO_PROXY=[::1], say
                raise TransportError(f"the proxy settings cannot be used: {exc}") from exc
        return self._httpx

    async def _post(self, url: str, body: bytes) -> tuple[int, str]:
        """POST ``body`` (a JSON message, or nothing); the answer's status and text."""
        lean = self._lean_for(url)
        if lean is not None:
            try:
                async with await lean.request("POST", url, body, headers=self._session) as answer:
                    return answer.status_code, (await answer.aread()).decode("utf-8", "replace")
            except LeanError as exc:
                raise TransportError(str(exc)) from exc
        import httpx

        headers = {**self._session, "Content-Type": "application/json"}
        try:
            response = await self._httpx_client().post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(str(exc) or type(exc).__name__) from exc
        return response.status_code, response.text

    @contextlib.asynccontextmanager
    async def _stream(self, url: str) -> AsyncIterator[tuple[int, AsyncIterator[str]]]:
        """GET an event stream: its status and its lines, read as they come."""
        lean = self._lean_for(url)
        if lean is not None:
            headers = {**self._session, "Accept": "text/event-stream"}
            async with await lean.request("GET", url, headers=headers, read_timeout=None) as r:
                yield r.status_code, r.aiter_lines()
            return
        import httpx

        idles = httpx.Timeout(self.timeout, read=None)  # the stream idles between messages
        streaming = self._httpx_client().stream("GET", url, headers=self._session, timeout=idles)
        async with streaming as response:
            yield response.status_code, response.aiter_lines()


def _session_of(text: str) -> str:
    try:
        answer = json.loads(text)
    except ValueError:
        return ""
    session = answer.get("session_id") if isinstance(answer, dict) else None
    return session if isinstance(session, str) else ""


def _dispatch(text: str, on_message: Callable[[Any], None]) -> None:
    try:
        message = decode(text)
    except ProtocolError as exc:
        logger.warning("ignored an undecodable message from the host: %s", json.dumps(text[:200]))
        message = unreadable_answer(text, exc)  # its request fails now, not at its timeout
        if message is None:
            return
    on_message(message)
