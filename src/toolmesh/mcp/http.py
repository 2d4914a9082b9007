"""A toolkit served over MCP's streamable HTTP at ``/mcp``, beside A2E on the same server.

``mcp_routes(host)`` returns the Starlette routes; mount them with
``HttpServer(host, bind, extra_routes=mcp_routes(host))`` (what ``toolmesh serve --http ...
--mcp`` does) or in any Starlette app. Both protocol eras are answered on the one path:

- 2026-07-28 (``MCP-Protocol-Version: 2026-07-28``): each POST is one self-contained request;
  no session. Closing the response stream cancels the call.
- 2025 revisions: ``initialize`` opens a session (``Mcp-Session-Id``); later POSTs name it;
  ``GET`` opens a stream for ``notifications/tools/list_changed``; ``DELETE`` ends the session;
  ``notifications/cancelled`` (or a closed stream) cancels a call.

A request is answered with JSON unless it emits notifications (progress, a listen stream)
before it ends: then the answer becomes a server-sent event stream carrying them, then the
response. Browser requests from foreign origins are refused (403) and, when a token is set,
every request needs ``Authorization: Bearer <token>`` (401).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from toolmesh import strictjson
from toolmesh.capabilities import string_list
from toolmesh.host import Host
from toolmesh.mcp.server import (
    HANDSHAKE_VERSIONS,
    INVALID_REQUEST,
    MODERN_VERSIONS,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
    MCPPeer,
    MCPService,
    _error,
    _notification,
)
from toolmesh.models import secret_id
from toolmesh.transports.http import StoppingRoute, refuse_unwelcome

__all__ = ["MCPHttpEndpoint", "mcp_routes"]

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
KEEPALIVE_SECONDS = 15.0
IDLE_SESSION_SECONDS = 600.0
REAP_EVERY_SECONDS = 60.0  # how often idle sessions are looked for, while any exist
# Messages one event stream holds for a client that reads slowly (or not at all); past it,
# progress notifications are coalesced (docs/mcp.md)
MAX_QUEUED_MESSAGES = 64
_PROGRESS = _notification("notifications/progress", None)[:-1]  # how each one begins

# HTTP status of a 2026-07-28 JSON-RPC error, as the SDK maps them.
_MODERN_STATUS = {-32700: 400, -32600: 400, -32602: 400, -32020: 400, -32021: 400, -32022: 400}
_MODERN_STATUS[-32601] = 404
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


def mcp_routes(
    host: Host,
    *,
    path: str = "/mcp",
    auth_token: str | None = None,
    allowed_origins: Sequence[str] = (),
    instructions: str | None = None,
) -> list[BaseRoute]:
    """The routes serving ``host`` over MCP at ``path`` (for ``extra_routes`` of the A2E server,
    or any Starlette app). ``auth_token`` should match the server's own token."""
    endpoint = MCPHttpEndpoint(
        host, auth_token=auth_token, allowed_origins=allowed_origins, instructions=instructions
    )
    return endpoint.routes(path)


class MCPHttpEndpoint:
    """The ASGI endpoint: its service, its 2025-era sessions."""

    def __init__(
        self,
        host: Host,
        *,
        auth_token: str | None = None,
        allowed_origins: Sequence[str] = (),
        instructions: str | None = None,
    ) -> None:
        self.service = MCPService(host, instructions=instructions)
        self.auth_token = auth_token or None
        self.allowed_origins = set(string_list(allowed_origins, where="allowed_origins"))
        self.sessions: dict[str, _HttpSession] = {}
        self._answering: set[MCPPeer] = set()  # 2026-07-28 requests being answered
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.TimerHandle | None = None
        self._started = False

    def routes(self, path: str = "/mcp") -> list[BaseRoute]:
        # Served by HttpServer, the sessions end (their calls answered) as the server stops.
        return [StoppingRoute(path, self, methods=["GET", "POST", "DELETE"], on_stop=self.close)]

    async def close(self) -> None:
        """End every session (running calls are cancelled and audited as such)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        closing = [session.close() for session in self.sessions.values()]
        closing += [peer.close() for peer in self._answering]  # each one request's own
        self.sessions.clear()
        await asyncio.gather(*closing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        refused = self._refuse(headers)
        if refused is not None:
            await refused(scope, receive, send)
            return
        if not self._started:
            self._started = True
            await self.service.start()
        method = scope["method"]
        if method == "POST":
            await self._post(scope, receive, send, headers)
        elif method == "GET":
            await self._stream(scope, receive, send, headers)
        else:
            await self._delete(scope, receive, send, headers)

    # -- checks ------------------------------------------------------------------------------------

    def _refuse(self, headers: Headers) -> Response | None:
        return refuse_unwelcome(headers, self.allowed_origins, self.auth_token)

    def _session(self, headers: Headers) -> _HttpSession | Response:
        session_id = headers.get(SESSION_HEADER)
        if not session_id:
            return _json_error(400, INVALID_REQUEST, f"missing {SESSION_HEADER} header")
        session = self.sessions.get(session_id)
        if session is None:
            return _json_error(404, INVALID_REQUEST, f"unknown session {session_id!r}")
        session.last_seen = time.monotonic()
        return session

    # -- POST: one message -------------------------------------------------------------------------

    async def _post(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        accept = headers.get("accept", "*/*")
        sse_ok = "text/event-stream" in accept or "*/*" in accept
        if not sse_ok and "application/json" not in accept:
            await Response(status_code=406)(scope, receive, send)
            return
        body = await _body(receive, self.service.host.max_message_bytes)
        if body is None:
            await _json_error(413, INVALID_REQUEST, "message too large")(scope, receive, send)
            return
        try:
            message = strictjson.loads(body)
        except ValueError as exc:
            await _json_error(400, PARSE_ERROR, f"not valid JSON: {exc}")(scope, receive, send)
            return
        version = headers.get(VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_VERSIONS:
            if version not in MODERN_VERSIONS:
                await _unsupported_version(version)(scope, receive, send)
                return
            peer = self.service.peer(stateful=False)
            peer.era = "modern"  # the header says so: a request without the envelope is refused
            extra: list[tuple[bytes, bytes]] = []
            lowered = {k.lower(): v for k, v in headers.items()}
            self._answering.add(peer)  # for close(): its call answered as the server stops
            try:
                await _exchange(peer, message, lowered, scope, receive, send, sse_ok, extra, True)
            finally:
                self._answering.discard(peer)
            return
        if isinstance(message, dict) and message.get("method") == "initialize":
            session = self._open_session()
        else:
            found = self._session(headers)
            if isinstance(found, Response):
                await found(scope, receive, send)
                return
            session = found
        extra = [(SESSION_HEADER.encode(), session.id.encode())]
        try:
            await _exchange(session.peer, message, None, scope, receive, send, sse_ok, extra, False)
        finally:
            session.last_seen = time.monotonic()  # idle from the end of a long call, not its start

    def _open_session(self) -> _HttpSession:
        self._reap()
        session = _HttpSession(self.service)
        self.sessions[session.id] = session
        return session

    def _reap(self) -> None:
        """Look for idle sessions on a timer: one a client abandoned is closed even when no
        new session is ever opened (and opening one never scans them all)."""
        if self._reaper is None:
            loop = asyncio.get_running_loop()
            self._reaper = loop.call_later(REAP_EVERY_SECONDS, self._reap_idle)

    def _reap_idle(self) -> None:
        self._reaper = None
        now = time.monotonic()
        for session in list(self.sessions.values()):
            idle = not session.streams and not session.peer.busy  # a running call is not idle
            if idle and now - session.last_seen > IDLE_SESSION_SECONDS:
                self.sessions.pop(session.id, None)
                task = asyncio.ensure_future(session.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        if self.sessions:
            self._reap()

    # -- GET: the session's notification stream ----------------------------------------------------

    async def _stream(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        version = headers.get(VERSION_HEADER)
        if version is not None and version not in (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS):
            await _unsupported_version(version)(scope, receive, send)
            return
        if headers.get(VERSION_HEADER) in (None, *HANDSHAKE_VERSIONS) and SESSION_HEADER in headers:
            found = self._session(headers)
            if isinstance(found, Response):
                await found(scope, receive, send)
                return
            outbox = _Outbox()
            found.streams.append(outbox)
            try:
                extra = [(SESSION_HEADER.encode(), found.id.encode())]
                await _sse(outbox, None, scope, receive, send, extra)
            finally:
                found.streams.remove(outbox)
            return
        await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)

    async def _delete(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        version = headers.get(VERSION_HEADER)
        if version is not None and version not in (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS):
            await _unsupported_version(version)(scope, receive, send)
            return
        found = self._session(headers)
        if isinstance(found, Response):
            await found(scope, receive, send)
            return
        self.sessions.pop(found.id, None)
        await found.close()
        await Response(status_code=200)(scope, receive, send)


class _HttpSession:
    """A 2025-era MCP session: its peer, and the GET streams that carry its notifications."""

    def __init__(self, service: MCPService) -> None:
        self.id = secret_id()
        self.streams: list[_Outbox] = []
        self.last_seen = time.monotonic()
        self.peer: MCPPeer = service.peer(
            self._notify, http_session=self.id, reachable=lambda: bool(self.streams)
        )

    def _notify(self, data: bytes) -> None:
        # On one stream only, the newest ("MUST NOT broadcast the same message across
        # multiple streams"): a client could otherwise answer an approval's request twice.
        if self.streams:
            self.streams[-1].put(data)

    async def close(self) -> None:
        for outbox in self.streams:
            outbox.close()
        await self.peer.close()


class _Outbox:
    """The messages waiting to go out on one event stream, bounded: a client that reads slowly,
    or never, must not grow the server's memory. Past ``MAX_QUEUED_MESSAGES`` a progress
    notification replaces the newest one waiting (each says how far the call is, the newest
    all of it) and a repeat of a message still waiting is dropped; requests (an approval's)
    are always kept, and a call's answer never waits here."""

    def __init__(self) -> None:
        self._messages: deque[bytes] = deque()
        self._ready = asyncio.Event()
        self.closed = False  # the session ended: the stream ends once what waits is sent

    def __len__(self) -> int:
        return len(self._messages)

    def put(self, data: bytes) -> None:
        if self.closed:
            return
        messages = self._messages
        if len(messages) >= MAX_QUEUED_MESSAGES:
            if data.startswith(_PROGRESS) and messages[-1].startswith(_PROGRESS):
                messages[-1] = data
                return
            if data in messages:  # a notification said already (a request has its own id)
                return
        messages.append(data)
        self._ready.set()

    def pop(self) -> bytes | None:
        if not self._messages:
            self._ready.clear()
            return None
        return self._messages.popleft()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def wait(self) -> None:
        await self._ready.wait()


async def _exchange(
    peer: MCPPeer,
    message: Any,
    headers: dict[str, str] | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    sse_ok: bool,
    extra: list[tuple[bytes, bytes]],
    modern: bool,
) -> None:
    """Answer one POSTed message: 202 for a notification, JSON or an event stream otherwise."""
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        reply = await peer.handle(message, headers=headers)
        if reply is None:
            await Response(status_code=202, headers=dict(_text(extra)))(scope, receive, send)
        else:  # a batch's answers (2025-03-26), else a refusal
            status = 200 if isinstance(message, list) and reply.startswith(b"[") else 400
            await _json(reply, status, extra)(scope, receive, send)
        return
    outbox = _Outbox()
    notify = outbox.put if sse_ok else None
    handler = asyncio.ensure_future(peer.handle(message, notify=notify, headers=headers))
    watcher = asyncio.ensure_future(_disconnected(receive))
    first = asyncio.ensure_future(outbox.wait())
    try:
        await asyncio.wait({handler, watcher, first}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            handler.cancel()  # the client closed the stream: cancel the call
            return
        if handler.done() and not outbox:
            reply = handler.result()
            if reply is None:  # cancelled by the client: no answer is owed, end the stream
                await _empty_stream(sse_ok, extra, scope, receive, send)
                return
            status = _status(reply) if modern else 200
            await _json(reply, status, extra)(scope, receive, send)
            return
        await _sse(outbox, handler, scope, receive, send, extra, watcher=watcher)
    finally:
        for task in (first, watcher):
            task.cancel()
        if not handler.done():
            handler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await handler


async def _sse(
    outbox: _Outbox,
    handler: asyncio.Future[bytes | None] | None,
    scope: Scope,
    receive: Receive,
    send: Send,
    extra: list[tuple[bytes, bytes]],
    *,
    watcher: asyncio.Future[None] | None = None,
) -> None:
    """Stream ``outbox`` as server-sent events until ``handler`` answers (or, with no handler,
    until the client leaves or the session ends)."""
    await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *extra]})
    if watcher is None:
        watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        if await _pump(outbox, handler, watcher, send):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif handler is not None:
            handler.cancel()  # the client closed the stream: cancel the call
    finally:
        watcher.cancel()


async def _pump(
    outbox: _Outbox,
    handler: asyncio.Future[bytes | None] | None,
    watcher: asyncio.Future[None],
    send: Send,
) -> bool:
    """Send what ``outbox`` holds, then ``handler``'s answer; False when the client left first.
    The client leaving is looked for before each message, however many wait."""
    while not watcher.done():
        data = outbox.pop()
        if data is not None:
            await send({"type": "http.response.body", "body": _event(data), "more_body": True})
            await asyncio.sleep(0)  # a send need not yield: let a lost connection be seen
        elif handler is not None and handler.done():
            reply = handler.result()
            if reply is not None:
                await send({"type": "http.response.body", "body": _event(reply), "more_body": True})
            return True
        elif outbox.closed:
            return True  # the session ended
        elif not await _woken(outbox, handler, watcher):
            await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
    return False


async def _woken(
    outbox: _Outbox, handler: asyncio.Future[bytes | None] | None, watcher: asyncio.Future[None]
) -> bool:
    """Wait for a message, the answer or the client leaving; False after a keep-alive's time
    of none."""
    ready = asyncio.ensure_future(outbox.wait())
    waiting: set[asyncio.Future[Any]] = {ready, watcher}
    if handler is not None:
        waiting.add(handler)
    try:
        done, _ = await asyncio.wait(
            waiting, timeout=KEEPALIVE_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        ready.cancel()
    return bool(done)


async def _empty_stream(
    sse_ok: bool, extra: list[tuple[bytes, bytes]], scope: Scope, receive: Receive, send: Send
) -> None:
    if not sse_ok:
        await Response(status_code=204, headers=dict(_text(extra)))(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *extra]})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _body(receive: Receive, limit: int) -> bytes | None:
    chunks = bytearray()
    more = True
    while more:
        message = await receive()
        chunks += message.get("body", b"")
        more = message.get("more_body", False)
        if len(chunks) > limit:
            return None
    return bytes(chunks)


def _event(data: bytes) -> bytes:
    return b"event: message\ndata: " + data + b"\n\n"


def _status(reply: bytes) -> int:
    if b',"error":{"code":' not in reply[:200]:
        return 200
    try:
        code = json.loads(reply)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return 200
    return _MODERN_STATUS.get(code, 200)


def _json(reply: bytes, status: int, extra: list[tuple[bytes, bytes]]) -> Response:
    return Response(
        reply, status_code=status, media_type="application/json", headers=dict(_text(extra))
    )


def _unsupported_version(version: str) -> Response:
    """The 400 the spec asks for a request whose ``MCP-Protocol-Version`` is not served."""
    supported = ", ".join((*HANDSHAKE_VERSIONS, *MODERN_VERSIONS))
    refusal = f"MCP-Protocol-Version {version!r} is not served; these are: {supported}"
    return _json_error(400, UNSUPPORTED_PROTOCOL_VERSION, refusal)


def _json_error(status: int, code: int, message: str) -> Response:
    return Response(_error(None, code, message), status_code=status, media_type="application/json")


def _text(pairs: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode(), v.decode()) for k, v in pairs]
