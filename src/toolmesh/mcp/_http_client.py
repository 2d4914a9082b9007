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

A client subclass rather than a transport of its own: a client given a transport no longer
takes its proxies from the environment.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2

__all__ = ["AckBoundClient"]

logger = logging.getLogger("toolmesh.mcp")


class AckBoundClient(httpx2.AsyncClient):
    """An ``httpx2.AsyncClient`` that waits at most ``ack_timeout`` seconds for the answer to an
    exchange owed only a status; every other exchange is left as configured."""

    def __init__(self, server: str, ack_timeout: float, **settings: Any) -> None:
        super().__init__(**settings)
        self._server = server
        self._ack_timeout = ack_timeout

    async def send(self, request: httpx2.Request, **options: Any) -> httpx2.Response:
        what = _status_only(request)
        if what is None:
            return await super().send(request, **options)
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


def _status_only(request: httpx2.Request) -> str | None:
    """What ``request`` carries when it is owed only a status, for the warning; None when it
    is owed an answer (a request's, which may stream for as long as its tool runs)."""
    if request.method == "DELETE":
        return "the DELETE that ends the session"
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except ValueError:  # not a JSON-RPC message (the SDK's are JSON): not this bound's business
        return None
    if not isinstance(message, dict) or ("id" in message and "method" in message):
        return None
    if "method" in message:
        return f"the POST of notification {message['method']}"
    return f"the POST of the answer to its request {message.get('id')!r}"
