"""The HTTP client of an MCP source over streamable HTTP (imported with the SDK).

Its read timeout is None: the GET stream, and the event stream of a long call, may stay quiet
for as long as the server likes. But the SDK's transport writes the client's messages one at a
time, and waits for the status of each POST that carries no request (a notification, or the
answer to a server's request) before it writes the next one; a server that never answers such a
POST would hold up every later message of the connection, a DELETE never answered the close.
Those exchanges are owed a status alone (202 Accepted for a POST), so their reads are bounded;
past the bound the wait is given up, logged, and the SDK is handed a 504, which it ignores for a
message that expects no answer (an exception would end its writer, and the connection). A
request's POST is left unbounded: its answer may come, as JSON, only when its tool is done.

But a request's POST ends with its request. On a 2025-era connection the SDK cancels a request
by POSTing ``notifications/cancelled``, and goes on reading the request's own response: one a
server that honours the cancellation may never end (the spec has it not answer a cancelled
request, and the TypeScript SDK's server does not), and one whose tool ignores it ends only when
the tool does; an open connection and an SDK task per cancelled call, for the life of the
session. So once the notice is delivered (or given up on), the request's exchange is ended the
way the SDK's own server ends it: with a "Request cancelled" error for the request, which the
SDK, no longer waiting for it, drops. A bare end of the stream would not do: the SDK resumes a
stream that carried an event id. On a 2026-07-28 connection no notice is POSTed: the SDK aborts
the request's POST itself.

A client subclass rather than a transport of its own: a client given a transport no longer
takes its proxies from the environment.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx2
from mcp.shared.dispatcher import as_request_id
from mcp_types import RequestId

__all__ = ["AckBoundClient"]

logger = logging.getLogger("toolmesh.mcp")

_T = TypeVar("_T")

# What the SDK's own server answers a cancelled request with on a 2025-era connection (LSP's
# RequestCancelled)
_REQUEST_CANCELLED = -32800


class AckBoundClient(httpx2.AsyncClient):
    """An ``httpx2.AsyncClient`` that waits at most ``ack_timeout`` seconds for the answer to an
    exchange owed only a status, and ends a request's exchange once the request is cancelled;
    every other exchange is left as configured."""

    def __init__(self, server: str, ack_timeout: float, **settings: Any) -> None:
        super().__init__(**settings)
        self._server = server
        self._ack_timeout = ack_timeout
        self._exchanges: dict[RequestId, _Exchange] = {}  # each request's POST, until closed
        # the last refusal the server answered (the SDK's error names no status: a 401 from a
        # wrong token read "Server returned an error response")
        self.last_refusal = ""

    async def send(self, request: httpx2.Request, **options: Any) -> httpx2.Response:
        response = await self._send(request, **options)
        if response.status_code >= 400:
            self.last_refusal = f"HTTP {response.status_code} {response.reason_phrase}".strip()
        return response

    async def _send(self, request: httpx2.Request, **options: Any) -> httpx2.Response:
        message = _message(request)
        what = _status_only(request, message)
        if what is not None:
            try:
                return await self._send_bounded(request, what, options)
            finally:  # the notice is delivered, or given up on
                self._end(_cancelled_request(message))
        request_id = as_request_id(message.get("id")) if message is not None else None
        if request_id is None:
            return await super().send(request, **options)
        return await self._send_request(request, request_id, options)

    async def _send_bounded(
        self, request: httpx2.Request, what: str, options: dict[str, Any]
    ) -> httpx2.Response:
        timeouts = request.extensions.get("timeout", self.timeout.as_dict())
        request.extensions = {
            **request.extensions,
            "timeout": {**timeouts, "read": self._ack_timeout},
        }
        try:
            return await super().send(request, **options)
        except httpx2.ReadTimeout:
            logger.warning(
                "MCP server %r did not answer %s within %gs; stopped waiting for it",
                self._server,
                what,
                self._ack_timeout,
            )
            return httpx2.Response(504, request=request)

    async def _send_request(
        self, request: httpx2.Request, request_id: RequestId, options: dict[str, Any]
    ) -> httpx2.Response:
        exchange = _Exchange(request_id)
        self._exchanges[request_id] = exchange
        forget = functools.partial(self._forget, request_id, exchange)
        try:
            response = await exchange.unless_ended(
                functools.partial(super().send, request, **options)
            )
        except BaseException:
            forget()
            raise
        if response is None:  # ended before the server answered
            forget()
            return httpx2.Response(200, json=exchange.answer, request=request)
        if response.is_closed:  # read in full already
            forget()
        else:
            response.stream = _ExchangeStream(response, exchange, forget)
        return response

    def _forget(self, request_id: RequestId, exchange: _Exchange) -> None:
        if self._exchanges.get(request_id) is exchange:  # a reused id may have a successor
            del self._exchanges[request_id]

    def _end(self, request_id: RequestId | None) -> None:
        exchange = self._exchanges.pop(request_id, None) if request_id is not None else None
        if exchange is not None:
            exchange.end()


class _Exchange:
    """The POST of one request, which ``end`` cuts short."""

    def __init__(self, request_id: RequestId) -> None:
        self.answer = {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": _REQUEST_CANCELLED, "message": "Request cancelled"},
        }
        self.ended = False
        self._step: anyio.CancelScope | None = None

    def end(self) -> None:
        self.ended = True
        if self._step is not None:
            self._step.cancel()

    async def unless_ended(self, step: Callable[[], Awaitable[_T]]) -> _T | None:
        """What ``step`` returns; None once the exchange is ended (``step`` cut short then, or
        never started). Run in the task that reads the exchange, as the SDK's scopes are."""
        if self.ended:
            return None
        result: _T | None = None
        self._step = scope = anyio.CancelScope()
        try:
            with scope:
                result = await step()
        finally:
            self._step = None
        return result


class _ExchangeStream(httpx2.AsyncByteStream):
    """A request's response body, closed with the request's answer once the exchange is ended."""

    def __init__(
        self, response: httpx2.Response, exchange: _Exchange, on_close: Callable[[], None]
    ) -> None:
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        self._inner = response.stream
        self._headers = response.headers
        self._exchange = exchange
        self._on_close = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)
        received = False
        try:
            while True:
                try:
                    chunk = await self._exchange.unless_ended(functools.partial(anext, chunks))
                except StopAsyncIteration:
                    return
                if chunk is None:
                    break
                received = True
                yield chunk
        finally:
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()
        ending = self._ending(received)
        if ending:
            yield ending

    def _ending(self, received: bool) -> bytes:
        """The bytes that close the body of an ended exchange with the request's answer."""
        if self._headers.get("content-encoding", "identity").lower() != "identity":
            return b""  # nothing added would decode: the SDK sees the stream end
        answer = json.dumps(self._exchange.answer).encode()
        content_type = self._headers.get("content-type", "").lower()
        if content_type.startswith("text/event-stream"):
            # The blank line first ends an event cut short, which the SDK then reads (or not).
            return b"\n\nevent: message\ndata: " + answer + b"\n\n"
        return b"" if received else answer  # JSON: whole, or else (the SDK's parse error) cut

    async def aclose(self) -> None:
        self._on_close()
        await self._inner.aclose()


def _message(request: httpx2.Request) -> dict[str, Any] | None:
    """The JSON-RPC message a POST carries; None for anything else."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except ValueError:  # not a JSON-RPC message (the SDK's are JSON): not this client's business
        return None
    return message if isinstance(message, dict) else None


def _status_only(request: httpx2.Request, message: dict[str, Any] | None) -> str | None:
    """What ``request`` (a POST carrying ``message``) carries when it is owed only a status,
    for the warning; None when it is owed an answer (a request's, which may stream for as long
    as its tool runs), or is none of the SDK's messages."""
    if request.method == "DELETE":
        return "the DELETE that ends the session"
    if message is None or ("id" in message and "method" in message):
        return None
    if "method" in message:
        return f"the POST of notification {message['method']}"
    return f"the POST of the answer to its request {message.get('id')!r}"


def _cancelled_request(message: dict[str, Any] | None) -> RequestId | None:
    """The request a ``notifications/cancelled`` names; None for any other message."""
    if message is None or message.get("method") != "notifications/cancelled":
        return None
    params = message.get("params")
    return as_request_id(params.get("requestId")) if isinstance(params, dict) else None
