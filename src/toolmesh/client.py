"""Clients for A2E hosts, and the seed's ToolAPI over them.

``connect(target)`` returns a blocking client (it runs its own event loop on a private thread);
``await connect_async(target)`` returns the async client. A target is a ``Host`` (in-process,
no serialization), a command list (the host runs as a child process over stdio) or an http(s)
URL. Both clients do the handshake before they return. ``ToolAPI(client)`` and
``AsyncToolAPI(client)`` then list and call tools exactly as seed 000 shows.

The client never runs more calls at once than the host's ``max_parallel`` allows: extra calls
wait their turn instead of being refused.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from pydantic import ValidationError

from toolmesh.errors import (
    ArgumentError,
    CallTimeout,
    ConfigError,
    HandshakeError,
    ProtocolError,
    TransportError,
)
from toolmesh.host import Connection, Host
from toolmesh.models import ToolDefinition, ToolEvent, ToolResult, local_id
from toolmesh.pipeline import ApprovalRequest, CallSpec
from toolmesh.protocol import (
    ApprovalResponse,
    CapabilityOverride,
    ErrorMessage,
    HandshakeRequest,
    HandshakeResponse,
    NegotiatedCapability,
    Ping,
    Pong,
    Shutdown,
    StateRequest,
    StateResponse,
    ToolCallRequest,
    ToolCallResponse,
    ToolListRequest,
    ToolListResponse,
)
from toolmesh.toolkit import Toolkit

__all__ = ["AsyncClient", "AsyncToolAPI", "Client", "ToolAPI", "connect", "connect_async"]

T = TypeVar("T")
EventCallback = Callable[[ToolEvent], None]
ApprovalHandler = Callable[[ToolEvent], "bool | Awaitable[bool]"]
"""Answers an approval request (the call's `approval` event): only True approves; False, any
other answer and an exception deny (the last two with the reason)."""
RESPONSE_GRACE_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 30.0
"""How long opening a channel and the handshake may take, together."""
logger = logging.getLogger("toolmesh.client")


class ApprovalAnswerError(TypeError):
    """An approval handler answered with something other than True or False."""


def _brief(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = object.__repr__(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _describe_exception(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Channel(Protocol):
    """How a client reaches a host: open (with callbacks for messages and closing), send, close."""

    async def open(
        self, on_message: Callable[[Any], None], on_close: Callable[[str], None]
    ) -> None: ...

    async def send(self, message: Any) -> None: ...

    async def close(self) -> None: ...


class AsyncClient:
    """One A2E session with a host. Use it through ``AsyncToolAPI``."""

    def __init__(
        self,
        channel: Channel | None = None,
        *,
        connection: Connection | None = None,
        agent_id: str = "",
        agent_caps: Sequence[str] = ("tools",),
        auth_token: str | None = None,
        capability_override: CapabilityOverride | Mapping[str, Any] | None = None,
        session_id: str = "",
        owned_host: Host | None = None,
        on_approval: ApprovalHandler | None = None,
    ) -> None:
        self._channel = channel
        self._connection = connection
        self._owned_host = owned_host
        self.agent_id = agent_id
        self.agent_caps = list(agent_caps)
        self._auth_token = auth_token or ""
        self._override = (
            CapabilityOverride.model_validate(capability_override)
            if isinstance(capability_override, Mapping)
            else capability_override
        )
        self._resume = session_id
        self.session_id = ""
        self.accepted_caps: list[NegotiatedCapability] = []
        self.max_parallel = 1
        self._tools_cache: list[ToolDefinition] | None = None
        self._cached_version: int | None = None  # in-process: the toolkit's, when cached
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._listeners: dict[str, EventCallback] = {}
        self._slots: _Slots | None = None
        # Calls given up here (cancelled, timed out) that the host still runs: each keeps its
        # slot until the host answers it, or the host would refuse the next call over
        # max_parallel (A2E has no message that cancels a call).
        self._given_up: dict[str, _Slots] = {}
        # The deadlines of the requests being sent: one the host does not take (an HTTP POST
        # it never answers) ends when the connection does, not at its deadline.
        self._sending: dict[str, asyncio.Timeout] = {}
        self._closed_reason = ""
        self.on_approval = on_approval
        self._answering: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> AsyncClient:
        """Open the channel and do the handshake, within ``CONNECT_TIMEOUT_SECONDS``; raise
        ``HandshakeError`` if refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT_SECONDS
        if self._channel is not None:
            await self._open_channel(self._channel, deadline)
        request = HandshakeRequest(
            agent_id=self.agent_id,
            agent_caps=self.agent_caps,
            auth_token=self._auth_token,
            capability_override=self._override,
            session_id=self._resume,
        )
        try:
            async with asyncio.timeout_at(deadline):
                response = await self.request(request)
        except TimeoutError:
            await self._drop_channel()  # no shutdown: a host that never answers would hold it
            await self.close()
            raise CallTimeout(
                f"no answer to the handshake within {CONNECT_TIMEOUT_SECONDS:g}s of connecting"
            ) from None
        except BaseException:
            await self.close()
            raise
        if not isinstance(response, HandshakeResponse) or not response.ok:
            await self.close()
            reason = response.reason if isinstance(response, HandshakeResponse) else str(response)
            raise HandshakeError(reason)
        self.session_id = response.session_id
        self.accepted_caps = response.accepted_caps
        self.max_parallel = max(1, response.max_parallel)
        self._slots = _Slots(self.max_parallel)
        if self._connection is not None:
            self._connection.approval_handler = self._decide_in_process
        return self

    async def _open_channel(self, channel: Channel, deadline: float) -> None:
        """Open ``channel`` by ``deadline``: a host that takes the connection but never
        answers would hold ``connect`` forever."""
        try:
            async with asyncio.timeout_at(deadline):
                await channel.open(self._on_message, self._on_close)
        except TimeoutError:
            await self._drop_channel()
            raise TransportError(
                f"the host did not answer within {CONNECT_TIMEOUT_SECONDS:g}s of connecting"
            ) from None

    async def _drop_channel(self) -> None:
        """Close the channel without a word to the host."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            # Calls given up here (a cancelled caller, Ctrl-C) have nobody to answer: the host
            # stops them now instead of draining them, which held this close up to 10 s.
            abandoned = bool(self._pending or self._given_up)
            shutdown = Shutdown(timeout=0) if abandoned else Shutdown()
            # Bounded: a host that stalls must not hold the close up past its own drain.
            with contextlib.suppress(ProtocolError, TimeoutError):
                async with asyncio.timeout(shutdown.timeout + RESPONSE_GRACE_SECONDS):
                    await channel.send(shutdown)
            await channel.close()
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.close()
        if self._owned_host is not None:
            host, self._owned_host = self._owned_host, None
            await host.close()
        self._on_close("client closed")

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- requests --------------------------------------------------------------------------------

    async def request(
        self,
        message: Any,
        *,
        on_event: EventCallback | None = None,
        timeout: float | None = None,
        slot: _Slots | None = None,
    ) -> Any:
        """Send a request and return its response; an ``error`` answer raises ``RemoteError``.

        ``slot``: the call's ``max_parallel`` slot, given back once the host has answered,
        which for a request given up here (cancelled, timed out) is when its answer comes."""
        if self._connection is not None:
            try:
                response = await self._connection.request(message, on_event)
            finally:
                if slot is not None:
                    slot.give_back()
        else:
            response = await self._round_trip(message, on_event, timeout, slot)
        if isinstance(response, ErrorMessage):
            raise response.to_exception()
        return response

    async def _round_trip(
        self,
        message: Any,
        on_event: EventCallback | None,
        timeout: float | None,
        slot: _Slots | None = None,
    ) -> Any:
        if self._channel is None or self._closed_reason:
            # A channel that reported its end (a stdio host gone, an HTTP stream that failed)
            # never answers: say so now rather than at the request's timeout.
            if slot is not None:
                slot.give_back()
            raise TransportError(f"not connected ({self._closed_reason or 'closed'})")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[message.id] = future
        if on_event is not None:
            self._listeners[message.id] = on_event
        late = False
        sent = False
        deadline = None if timeout is None else loop.time() + timeout
        try:
            try:
                # The send counts against the deadline too: a host that stalls taking the
                # request (an HTTP POST it never answers) must not hold the call past it.
                async with asyncio.timeout_at(deadline) as limit:
                    self._sending[message.id] = limit  # (the connection's end cuts it short)
                    try:
                        await self._channel.send(message)
                    finally:
                        del self._sending[message.id]
                    sent = True
                    return await future
            except TimeoutError:
                ended = future.exception() if future.done() and not future.cancelled() else None
                if ended is not None:
                    raise ended from None  # the connection ended while the request was sent
                late = True
                raise CallTimeout(f"no answer to {message.type} within {timeout:g}s") from None
        finally:
            self._pending.pop(message.id, None)
            self._listeners.pop(message.id, None)
            if slot is not None:
                # A caller giving up cancels the future while the host runs the call on: its
                # slot stays taken until the host answers it, or should have (past that the
                # host is late, and it is its own to refuse a call over max_parallel).
                answered = future.done() and not future.cancelled()
                if answered or late or not sent or deadline is None or self._channel is None:
                    slot.give_back()
                else:  # the host answers by the deadline, at the latest
                    self._given_up[message.id] = slot
                    release = functools.partial(self._host_done, message.id)
                    loop.call_at(deadline, release)

    def _host_done(self, req_id: str) -> None:
        """The host answered a call given up here (or should have by now): free its slot."""
        slot = self._given_up.pop(req_id, None)
        if slot is not None:
            slot.give_back()

    def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolEvent):
            listener = self._listeners.get(message.req_id)
            if listener is not None:
                try:
                    listener(message)
                except Exception:
                    # The caller's callback: its failure must not cost the transport its
                    # reader (the call's answer behind it, or the whole HTTP stream).
                    logger.exception("the on_event callback of call %s failed", message.req_id)
            if message.kind == "approval":
                task = asyncio.ensure_future(self._answer(message))
                self._answering.add(task)
                task.add_done_callback(self._answering.discard)
            return
        req_id = getattr(message, "req_id", "")
        future = self._pending.get(req_id)
        if future is not None and not future.done():
            future.set_result(message)
        elif self._given_up:
            self._host_done(req_id)

    async def _decide(self, event: ToolEvent) -> bool:
        """This client's approval handler's answer to an `approval` event: only ``True``
        approves, ``False`` denies; any other answer raises ``ApprovalAnswerError``, and so
        does whatever the handler (or its awaitable) raises."""
        handler = self.on_approval
        if handler is None:
            return False
        answer = handler(event)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, bool):
            raise ApprovalAnswerError(
                f"the approval handler answered {_brief(answer)}, not True or False"
            )
        return answer

    async def _decide_in_process(self, request: ApprovalRequest) -> bool:
        listener = self._listeners.get(request.req_id)
        if listener is not None:  # the call's first event, as a wire client gets it
            listener(request.event)
        if self.on_approval is None:
            raise ProtocolError("approval_unavailable", "this client has no approval handler")
        # The pipeline turns what this raises into a denial ("approval:failed").
        return await self._decide(request.event)

    async def _answer(self, event: ToolEvent) -> None:
        """Answer an `approval` event over the wire. A handler that raises (or answers with
        something other than True/False) denies at once, with the reason, instead of leaving
        the call to the host's approval timeout."""
        channel = self._channel
        if self.on_approval is None or channel is None:
            return  # unanswered: the host's approval timeout decides
        approval_id = str(event.data.get("approval_id", ""))
        reason = ""
        try:
            approved = await self._decide(event)
        except ApprovalAnswerError as exc:
            approved, reason = False, str(exc)
        except Exception as exc:
            approved = False
            reason = f"the approval handler raised {_describe_exception(exc)}"
        if reason:
            logger.warning("approval %s denied: %s", approval_id, reason)
        if self._channel is not channel:
            return  # closed while the handler ran
        try:
            await channel.send(
                ApprovalResponse(
                    req_id=approval_id, approved=approved, reason=reason, failed=bool(reason)
                )
            )
        except Exception as exc:  # a background task: never leave its exception unretrieved
            logger.debug("approval %s: answer not sent: %s", approval_id, exc)

    async def get_state(self) -> tuple[dict[str, Any], int]:
        """The session's state document and its version."""
        response = await self.request(StateRequest(), timeout=30.0)
        if not isinstance(response, StateResponse):
            raise ProtocolError("invalid_message", f"expected state/get/resp, got {response.type}")
        return response.state, response.state_version

    def _on_close(self, reason: str) -> None:
        self._closed_reason = reason
        given_up, self._given_up = self._given_up, {}
        for slots in given_up.values():
            slots.give_back()  # callers waiting for them learn the connection is gone
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(TransportError(f"connection to the host lost: {reason}"))
        for limit in list(self._sending.values()):  # their calls raise the error just set
            if not limit.expired():
                limit.reschedule(asyncio.get_running_loop().time())

    async def ping(self) -> float:
        """Round-trip time to the host in milliseconds."""
        started = time.perf_counter()
        response = await self.request(Ping(), timeout=10.0)
        if not isinstance(response, Pong):
            raise ProtocolError("invalid_message", f"expected pong, got {response.type}")
        return (time.perf_counter() - started) * 1000

    # -- tools -----------------------------------------------------------------------------------

    async def list_tools(
        self,
        query: str = "",
        include_deferred: bool = False,
        tags: Sequence[str] | None = None,
        kind: str = "",
    ) -> list[ToolDefinition]:
        _check_listing(query, include_deferred, tags, kind)
        cacheable = not query and not tags and not kind and not include_deferred
        if cacheable and self._tools_cache is not None:
            if self._connection is None or self._cached_version == self._toolkit_version():
                return list(self._tools_cache)  # a copy: the caller may change its list
            self._tools_cache = None  # in-process: the toolkit's tools changed since
        version = self._toolkit_version()
        response = await self.request(
            ToolListRequest(
                query=query,
                include_deferred=include_deferred,
                filter_tags=list(tags or ()),
                filter_kind=kind,
            ),
            timeout=60.0,
        )
        if not isinstance(response, ToolListResponse):
            raise ProtocolError("invalid_message", f"expected tool/list/resp, got {response.type}")
        if cacheable:
            self._tools_cache = response.tools
            self._cached_version = version
            return list(response.tools)
        return response.tools

    def invalidate_tools_cache(self) -> None:
        self._tools_cache = None

    def _toolkit_version(self) -> int | None:
        """In-process, the served toolkit's change count (a wire host has no message saying
        its tools changed; ``invalidate_tools_cache`` is for that)."""
        connection = self._connection
        return None if connection is None else connection.host.toolkit._version

    async def call_tool(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        streaming: bool = False,
        on_event: EventCallback | None = None,
        timeout: float = 30.0,
        correlation_id: str | None = None,
    ) -> ToolResult:
        """Call a tool; its failures come back as results. ``arguments`` None: none. A wrong
        parameter raises ``ConfigError`` naming it (``ArgumentError`` for the arguments)."""
        slots = self._slots
        if slots is None:
            raise TransportError("call start() (or use connect_async) before calling tools")
        values = _call_arguments(tool_name, arguments, streaming, on_event, timeout, correlation_id)
        connection = self._connection
        if connection is not None:
            spec = CallSpec(
                tool_name=tool_name,
                arguments=values,
                req_id=local_id(),
                correlation_id=correlation_id or "",
                streaming=streaming or on_event is not None,
                timeout=timeout,
            )
            if not slots.take():
                await slots.wait()
                if self._connection is not connection:  # closed while this call waited
                    slots.give_back()
                    raise TransportError(f"not connected ({self._closed_reason or 'closed'})")
            listener = None if on_event is None else _guarded(on_event)
            if listener is not None:  # for the call's approval event, as over the wire
                self._listeners[spec.req_id] = listener
            try:
                return await connection.call_direct(spec, listener)
            finally:
                slots.give_back()
                if listener is not None:
                    del self._listeners[spec.req_id]
        try:
            request = ToolCallRequest(
                session_id=self.session_id,
                tool_name=tool_name,
                arguments=values,
                correlation_id=correlation_id or "",
                streaming=streaming or on_event is not None,
                timeout=timeout,
            )
        except ValidationError as exc:  # the checks above leave the arguments' names only
            raise ArgumentError(f"the arguments cannot be sent: {_first_error(exc)}") from None
        if not slots.take():
            await slots.wait()
        response = await self.request(
            request, on_event=on_event, timeout=timeout + RESPONSE_GRACE_SECONDS, slot=slots
        )
        if not isinstance(response, ToolCallResponse):
            raise ProtocolError("invalid_message", f"expected tool/call/resp, got {response.type}")
        return response.data


_INFINITY = float("inf")


def _call_arguments(
    tool_name: object,
    arguments: object,
    streaming: object,
    on_event: object,
    timeout: object,
    correlation_id: object,
) -> dict[str, Any]:
    """A call's arguments as a dict of their own, once every parameter of the call is checked:
    a wrong one raises ``ConfigError`` naming it, not a TypeError from deep inside."""
    if (  # the usual call, at a fraction of the checks' cost (every call pays this)
        type(tool_name) is str
        and type(arguments) is dict
        and type(streaming) is bool
        and on_event is None
        and correlation_id is None
        and type(timeout) is float
        and 0 < timeout < _INFINITY
    ):
        return dict(arguments)
    if not isinstance(tool_name, str):
        raise ConfigError(
            f"must be a tool's name (a str), not {_brief(tool_name)}", location="tool_name"
        )
    # NaN too, and a bool (a number to Python): each side would read it its own way
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < _INFINITY
    ):
        raise ConfigError(
            f"must be a positive number of seconds, not {_brief(timeout)}", location="timeout"
        )
    if not isinstance(streaming, bool):
        raise ConfigError(f"must be True or False, not {_brief(streaming)}", location="streaming")
    if on_event is not None and not callable(on_event):
        raise ConfigError(
            f"must be a callable or None, not {_brief(on_event)}", location="on_event"
        )
    if correlation_id is not None and not isinstance(correlation_id, str):
        raise ConfigError(
            f"must be a str or None, not {_brief(correlation_id)}", location="correlation_id"
        )
    if arguments is None:
        return {}
    if not isinstance(arguments, Mapping):
        raise ArgumentError(
            f"the arguments must be a mapping of parameter names to values, not {_brief(arguments)}"
        )
    return dict(arguments)


def _check_listing(query: object, include_deferred: object, tags: object, kind: object) -> None:
    """``ConfigError`` naming the first parameter of a listing that is wrong."""
    for name, value in (("query", query), ("kind", kind)):
        if not isinstance(value, str):
            raise ConfigError(f"must be a str, not {_brief(value)}", location=name)
    if not isinstance(include_deferred, bool):
        raise ConfigError(
            f"must be True or False, not {_brief(include_deferred)}", location="include_deferred"
        )
    if tags is not None and (  # a str is a sequence too: "fs" would be the tags "f" and "s"
        isinstance(tags, str)
        or not isinstance(tags, Sequence)
        or not all(isinstance(tag, str) for tag in tags)
    ):
        raise ConfigError(
            f"must be a list of tag names or None, not {_brief(tags)}", location="tags"
        )


def _first_error(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}"


def _guarded(on_event: EventCallback) -> EventCallback:
    """An in-process call's ``on_event``, whose failure is logged: it is the caller's, and
    must not fail the tool it would otherwise be raised into (as over the wire)."""

    def deliver(event: ToolEvent) -> None:
        try:
            on_event(event)
        except Exception:
            logger.exception("the on_event callback of call %s failed", event.req_id)

    return deliver


class _Slots:
    """The host's ``max_parallel`` on the client side: a call takes a free slot at once, or
    waits for one in arrival order (a semaphore whose uncontended path costs no coroutine)."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self) -> bool:
        """Take a slot if one is free and nobody is waiting for one."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def wait(self) -> None:
        """Wait until a slot is handed over (``give_back`` hands them on in order)."""
        if self.take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # handed a slot just as the caller gave up: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def give_back(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class Client:
    """A blocking client: the async client running on its own event-loop thread."""

    def __init__(self, factory: Callable[[], Coroutine[Any, Any, AsyncClient]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="toolmesh-client", daemon=True
        )
        self._thread.start()
        try:
            self.async_client = self.run(factory())
        except BaseException:
            self._stop()
            raise

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the client's loop and wait for it."""
        if threading.get_ident() == self._thread.ident:
            coroutine.close()
            raise RuntimeError(
                "a blocking client was used from its own event-loop thread (an on_event or "
                "on_approval callback, say), where it would wait for itself forever; use "
                "AsyncToolAPI there, or call from another thread"
            )
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop is closed: the client was closed
            coroutine.close()
            raise TransportError("not connected (client closed)") from None
        try:
            return future.result()
        except concurrent.futures.CancelledError as exc:
            raise TransportError("the client's request was cancelled") from exc

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop is closed: the client was closed
            coroutine.close()
            raise TransportError("not connected (client closed)") from None

    @property
    def session_id(self) -> str:
        return self.async_client.session_id

    @property
    def accepted_caps(self) -> list[NegotiatedCapability]:
        return self.async_client.accepted_caps

    @property
    def max_parallel(self) -> int:
        return self.async_client.max_parallel

    @property
    def _tools_cache(self) -> list[ToolDefinition] | None:
        return self.async_client._tools_cache

    def ping(self) -> float:
        return self.run(self.async_client.ping())

    def get_state(self) -> tuple[dict[str, Any], int]:
        """The session's state document and its version."""
        return self.run(self.async_client.get_state())

    def close(self) -> None:
        if self._loop.is_running():
            try:
                self.run(self.async_client.close())
            finally:
                self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ToolAPI:
    """Seed 000's client API: ``list`` and ``call`` on a connected (blocking) client."""

    def __init__(self, client: Client | AsyncClient) -> None:
        if isinstance(client, AsyncClient):
            raise TypeError("ToolAPI needs a blocking client (connect); use AsyncToolAPI instead")
        self._c = client

    def list(
        self,
        query: str = "",
        include_deferred: bool = False,
        tags: list[str] | None = None,
        kind: str = "",
    ) -> list[ToolDefinition]:
        """Active tools (cached on the client), or a search including deferred ones."""
        return self._c.run(self._c.async_client.list_tools(query, include_deferred, tags, kind))

    def call(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        streaming: bool = False,
        on_event: EventCallback | None = None,
        timeout: float = 30.0,
        correlation_id: str | None = None,
    ) -> ToolResult:
        return self._c.run(
            self._c.async_client.call_tool(
                tool_name,
                arguments,
                streaming=streaming,
                on_event=on_event,
                timeout=timeout,
                correlation_id=correlation_id,
            )
        )


class AsyncToolAPI:
    """The async twin of ``ToolAPI``, same methods and arguments."""

    def __init__(self, client: AsyncClient | Client) -> None:
        self._c = client
        self._async = client if isinstance(client, AsyncClient) else client.async_client

    async def list(
        self,
        query: str = "",
        include_deferred: bool = False,
        tags: list[str] | None = None,
        kind: str = "",
    ) -> list[ToolDefinition]:
        return await self._on_loop(self._async.list_tools(query, include_deferred, tags, kind))

    async def call(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        streaming: bool = False,
        on_event: EventCallback | None = None,
        timeout: float = 30.0,
        correlation_id: str | None = None,
    ) -> ToolResult:
        return await self._on_loop(
            self._async.call_tool(
                tool_name,
                arguments,
                streaming=streaming,
                on_event=on_event,
                timeout=timeout,
                correlation_id=correlation_id,
            )
        )

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``work`` to await here: as it is for an async client; a blocking client's runs on its
        own loop and is awaited through a future."""
        client = self._c
        if isinstance(client, AsyncClient):
            return work
        return asyncio.wrap_future(client.submit(work))


Target = Host | Toolkit | Sequence[str] | str


async def connect_async(
    target: Target,
    *,
    agent_id: str = "",
    agent_caps: Sequence[str] = ("tools",),
    auth_token: str | None = None,
    capability_override: CapabilityOverride | Mapping[str, Any] | None = None,
    session_id: str = "",
    headers: dict[str, str] | None = None,
    on_approval: ApprovalHandler | None = None,
) -> AsyncClient:
    """Connect to a Host, a stdio command or an http(s) URL and do the handshake.

    ``on_approval`` answers calls that need approval (it gets the call's `approval` event)."""
    options: dict[str, Any] = {
        "agent_id": agent_id,
        "agent_caps": agent_caps,
        "auth_token": auth_token,
        "capability_override": capability_override,
        "session_id": session_id,
        "on_approval": on_approval,
    }
    if isinstance(target, Toolkit):
        host = Host(target)
        await host.start()
        client = AsyncClient(connection=host.connect(_drop), owned_host=host, **options)
    elif isinstance(target, Host):
        await target.start()
        client = AsyncClient(connection=target.connect(_drop), **options)
    elif isinstance(target, str) and web_url(target) is not None:
        from toolmesh.transports.http import HttpChannel

        target = web_url(target) or target
        check_url(target)
        channel = HttpChannel(target, auth_token=auth_token, headers=headers)
        client = AsyncClient(channel, **options)
    elif isinstance(target, list | tuple) and target and all(isinstance(x, str) for x in target):
        from toolmesh.transports.stdio import StdioChannel

        client = AsyncClient(StdioChannel(list(target)), **options)
    else:
        raise TransportError(
            f"cannot connect to {target!r}: give a Host, a command list or an http(s) URL"
        )
    return await client.start()


def connect(
    target: Target,
    *,
    agent_id: str = "",
    agent_caps: Sequence[str] = ("tools",),
    auth_token: str | None = None,
    capability_override: CapabilityOverride | Mapping[str, Any] | None = None,
    session_id: str = "",
    headers: dict[str, str] | None = None,
    on_approval: ApprovalHandler | None = None,
) -> Client:
    """The blocking form of ``connect_async``: returns a client for ``ToolAPI(client)``."""
    return Client(
        lambda: connect_async(
            target,
            agent_id=agent_id,
            agent_caps=agent_caps,
            auth_token=auth_token,
            capability_override=capability_override,
            session_id=session_id,
            headers=headers,
            on_approval=on_approval,
        )
    )


def web_url(target: str) -> str | None:
    """``target`` as an http(s) URL with its scheme in lower case (``HTTP://h`` is ``http://h``:
    schemes are case-insensitive, RFC 3986), or None when it is no http(s) URL."""
    scheme, sep, rest = target.partition("://")
    if sep and scheme.lower() in ("http", "https"):
        return f"{scheme.lower()}://{rest}"
    return None


def check_url(url: str) -> None:
    """Refuse a URL neither HTTP client can use, naming it: urlsplit raises a bare ValueError
    for a bad port (``:99999``, ``:abc``) only when the port is first read, deep in a client."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - read for its ValueError
    except ValueError as exc:
        reason = str(exc)
        raise ConfigError(f"cannot connect to {url!r}: {reason[:1].lower()}{reason[1:]}") from None
    if not parts.hostname:
        raise ConfigError(f"cannot connect to {url!r}: the URL names no host")


def _drop(_message: Any) -> None:
    """In-process connections answer directly; nothing arrives unasked."""
