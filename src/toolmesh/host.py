"""The Host: a toolkit served to agents over A2E.

A transport opens a ``Connection`` per peer and feeds it messages; the connection answers through
the transport's ``deliver`` callback, which queues messages in order (so a call's events always
precede its response). The first message must be a handshake: it authenticates the agent,
negotiates the ``tools`` capability and fixes the session's capability tags. Every call then goes
through the pipeline; ``max_parallel`` calls may run at once per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from toolmesh.capabilities import CapabilityPolicy, CapabilitySet, session_capabilities
from toolmesh.eager import start_eagerly
from toolmesh.errors import CapabilityError, ConfigError, ProtocolError, StateError
from toolmesh.models import ToolErrorCode, ToolEvent, ToolResult, new_id, secret_id
from toolmesh.pipeline import (
    ApprovalFailed,
    ApprovalRequest,
    CallSpec,
    Limits,
    Pipeline,
    PolicyHook,
)
from toolmesh.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ApprovalResponse,
    ErrorCode,
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
    decode,
    request_id_of,
)
from toolmesh.session import Session
from toolmesh.state import StateManager
from toolmesh.store import Store, open_store
from toolmesh.store.base import SessionRecord
from toolmesh.toolkit import SourceLike, Toolkit

if TYPE_CHECKING:
    from toolmesh.agui import AguiStream

__all__ = ["Connection", "Host"]


def _spec(request: ToolCallRequest, *, streaming: bool) -> CallSpec:
    return CallSpec(
        tool_name=request.tool_name,
        arguments=request.arguments,
        req_id=request.id,
        correlation_id=request.correlation_id,
        streaming=request.streaming and streaming,
        timeout=request.timeout,
    )


logger = logging.getLogger("toolmesh.host")

Deliver = Callable[[Any], None]
SUPPORTED_A2E_CAPS = frozenset({"tools"})
_CLOSED_BEFORE_ANSWER = "the connection closed before the approval was answered"


def _check_count(setting: str, value: object) -> None:
    """A count setting must be an int of at least 1 ("3" or 2.5 would fail at the first call)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{setting} must be an integer, not {value!r}")
    if value < 1:
        raise ConfigError(f"{setting} must be at least 1, not {value!r}")


class Host:
    """Serves sources (plugins, toolkits, @tool functions) to agents over any transport."""

    def __init__(
        self,
        *sources: SourceLike | Sequence[SourceLike],
        audit: Store | str | Path | None = None,
        store: Store | str | Path | None = None,
        capabilities: Sequence[str] | None = None,
        capability_policy: CapabilityPolicy | None = None,
        max_parallel: int = 8,
        auth_token: str | None = None,
        limits: Limits | None = None,
        hooks: Sequence[PolicyHook] = (),
        host_id: str = "",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        owns_toolkit: bool | None = None,
    ) -> None:
        if audit is not None and store is not None:
            raise ConfigError("give either audit= (a SQLite path) or store=, not both")
        _check_count("max_parallel", max_parallel)
        _check_count("max_message_bytes", max_message_bytes)
        if len(sources) == 1 and isinstance(sources[0], Toolkit):
            self.toolkit = sources[0]
            self._owns_toolkit = bool(owns_toolkit)
        else:
            self.toolkit = Toolkit(*sources)
            self._owns_toolkit = owns_toolkit is not False
        chosen = audit if audit is not None else store
        self.store = open_store(chosen) if chosen is not None else self.toolkit.store
        self.capabilities = (
            CapabilitySet(capabilities) if capabilities is not None else self.toolkit.capabilities
        )
        self.capability_policy: CapabilityPolicy = (
            capability_policy or self.toolkit.capability_policy
        )
        if self.capability_policy not in ("locked", "extensible"):
            raise ConfigError("capability_policy must be 'locked' or 'extensible'")
        self.max_parallel = max_parallel
        self.auth_token = auth_token or None
        self.host_id = host_id or new_id()[:12]
        self.max_message_bytes = max_message_bytes
        base = self.toolkit.pipeline
        self.state = (
            StateManager(self.store, allowed_prefixes=self.toolkit.state.allowed_prefixes)
            if self.store is not self.toolkit.store
            else self.toolkit.state
        )
        self.pipeline = Pipeline(
            self.toolkit,
            store=self.store,
            state=self.state,
            limits=limits or base.limits,
            hooks=[*base.hooks, *hooks],
            host_id=self.host_id,
        )
        self.sessions: dict[str, Session] = {}
        self.started_at = time.monotonic()
        self._agui: AguiStream | None = None
        self._connections: set[Connection] = set()
        self._started = False
        self._start_lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> Host:
        if self._started:
            return self
        async with self._start_lock:  # callers at once (a server's lifespan and its owner)
            if not self._started:
                # marked started only once it is: a store that cannot open raises, and a later
                # start tries again
                await self.store.open()
                if self._owns_toolkit:
                    await self.toolkit.start()
                elif self.store is not self.toolkit.store:
                    await self.toolkit.store.open()
                self._started = True
        return self

    async def close(self) -> None:
        if self._agui is not None:
            self._agui.close()
        for connection in list(self._connections):
            await connection.close()
        await self.pipeline.drain()
        if self._owns_toolkit:
            await self.toolkit.close()
        if self.store is not self.toolkit.store or not self._owns_toolkit:
            await self.store.close()
        self._started = False

    async def __aenter__(self) -> Host:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def agui(self) -> AguiStream:
        """The AG-UI view of this host's sessions (``agui.events(session_id)``)."""
        if self._agui is None:
            from toolmesh.agui import AguiStream

            self._agui = AguiStream(self.pipeline, self.state)
        return self._agui

    @property
    def healthy(self) -> bool:
        """False once an audit entry could not be stored (it was logged instead)."""
        return self.pipeline.audit_failures == 0 and self.store.audit_rows_lost == 0

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.healthy else "degraded",
            "tools": len(self.toolkit),
            "sessions": len(self.sessions),
            "audit_failures": self.pipeline.audit_failures + self.store.audit_rows_lost,
            "uptime_seconds": round(time.monotonic() - self.started_at, 3),
        }

    # -- connections -----------------------------------------------------------------------------

    def connect(
        self, deliver: Deliver, *, transport: str = "inprocess", session_id: str = ""
    ) -> Connection:
        """A connection for one peer; ``deliver`` gets every outgoing message, in order.

        ``session_id`` is the id the session takes at handshake (the HTTP binding's own id);
        a fresh one is made when it is empty.
        """
        connection = Connection(self, deliver, transport=transport, session_id=session_id)
        self._connections.add(connection)
        return connection

    def _forget(self, connection: Connection) -> None:
        self._connections.discard(connection)
        session = connection.session
        if session is not None:
            if self.sessions.get(session.id) is session:
                del self.sessions[session.id]
            if not any(
                other.session is not None and other.session.id == session.id
                for other in self._connections
            ):  # nobody serves it any more: its cached state would stay for the host's life
                self.state.forget(session.id)
            if self._agui is not None:
                self._agui.end(session.id)

    async def _open_session(self, request: HandshakeRequest, connection: Connection) -> Session:
        """A new (or resumed) session for a handshake, or CapabilityError/ProtocolError."""
        for field in ("agent_id", "session_id", "auth_token"):
            value = getattr(request, field)
            try:  # the wire's parser refuses these; an in-process caller can pass them
                value.encode()
            except UnicodeEncodeError:
                raise ProtocolError(
                    ErrorCode.INVALID_MESSAGE,
                    f"{field} holds a lone surrogate, which is not Unicode text",
                ) from None
            if "\x00" in value:  # JSON allows it; PostgreSQL refuses it in text
                raise ProtocolError(
                    ErrorCode.INVALID_MESSAGE, f"{field} must not hold NUL (\\u0000)"
                )
        if self.auth_token is not None and not hmac.compare_digest(
            request.auth_token.encode(), self.auth_token.encode()
        ):
            raise ProtocolError(ErrorCode.UNAUTHORIZED, "auth_token is missing or wrong")
        override = request.capability_override
        held = session_capabilities(
            self.capabilities,
            self.capability_policy,
            override.strategy if override else "inherit",
            override.capabilities if override else (),
        )
        session_id = connection.preferred_id or secret_id()
        if request.session_id:
            record = await self.store.load_session(request.session_id)
            if record is None:
                raise ProtocolError(
                    ErrorCode.SESSION_MISMATCH, f"unknown session {request.session_id!r}"
                )
            if record.agent_id and record.agent_id != request.agent_id:
                raise ProtocolError(
                    ErrorCode.SESSION_MISMATCH,
                    f"session {request.session_id!r} belongs to another agent",
                )
            session_id = request.session_id
        session = Session(
            capabilities=held,
            agent_id=request.agent_id,
            id=session_id,
            max_parallel=self.max_parallel,
            transport=connection.transport,
            a2e_caps=frozenset(request.agent_caps) & SUPPORTED_A2E_CAPS,
        )
        await self.store.save_session(
            SessionRecord(
                session_id=session.id,
                agent_id=session.agent_id,
                capabilities=sorted(held.tags),
                created_at=session.created_at,
                metadata={
                    "transport": connection.transport,
                    "host_id": self.host_id,
                    "a2e_caps": sorted(session.a2e_caps),  # another host may serve it later
                },
            )
        )
        self.sessions[session.id] = session
        return session


class Connection:
    """One peer's conversation with the host: handshake first, then tool/* messages."""

    def __init__(self, host: Host, deliver: Deliver, *, transport: str, session_id: str) -> None:
        self.host = host
        self.transport = transport
        self.preferred_id = session_id
        self.session: Session | None = None
        self._deliver = deliver
        self._calls: dict[str, asyncio.Future[None]] = {}
        self._direct: dict[int, CallSpec] = {}  # in-process calls running, by id()
        self._direct_done: asyncio.Event | None = None  # set when the last of them ends
        self._approvals: dict[str, asyncio.Future[bool]] = {}
        self._deciding: set[asyncio.Future[Any]] = set()  # in-process handlers' answers
        self._closed = False
        self.approval_handler: Callable[[ApprovalRequest], Any] | None = None
        """In-process clients answer approvals directly; wire peers get an `approval` event."""

    def resume(self, session: Session) -> None:
        """Serve ``session``, whose handshake another host answered (it shares our store)."""
        self.session = session
        session.approver = self._ask_approval
        self.host.sessions[session.id] = session

    # -- wire entry points -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection is shutting down (or shut)."""
        return self._closed

    async def receive_line(self, line: bytes | str) -> None:
        """Handle one raw NDJSON line; malformed input is answered with an ``error`` message."""
        pending = self.take_line(line)
        if pending is not None:
            await pending

    def take_line(self, line: bytes | str) -> Awaitable[None] | None:
        """``receive_line`` for transports that read lines on a callback: a call starts at once
        (None is returned); any other message returns what to await before the next line."""
        try:
            message = decode(line, max_bytes=self.host.max_message_bytes)
        except ProtocolError as exc:
            self._deliver(ErrorMessage.from_exception(exc, request_id_of(line)))
            return None
        if self._took(message):
            return None
        return self._respond(message)

    async def receive(self, message: Any) -> None:
        """Handle one decoded message; answers go out through ``deliver``."""
        if not self._took(message):
            await self._respond(message)

    def _took(self, message: Any) -> bool:
        """Handle the messages that need no waiting; False for the others."""
        if isinstance(message, ToolCallRequest):
            self._start_call(message)
        elif isinstance(message, ErrorMessage):
            logger.warning("peer reported an error: [%s] %s", message.code, message.message)
        elif isinstance(message, ApprovalResponse):
            self._answer_approval(message)
        else:
            return False
        return True

    async def _respond(self, message: Any) -> None:
        if isinstance(message, Shutdown):
            await self.drain(message.timeout)
            return
        try:
            response = await self._answer(message)
        except ProtocolError as exc:
            response = ErrorMessage.from_exception(exc, message.id)
        self._deliver(response)

    async def request(
        self, message: Any, on_event: Callable[[ToolEvent], None] | None = None
    ) -> Any:
        """The in-process path: handle a request and return its response directly."""
        try:
            if isinstance(message, ToolCallRequest):
                return await self._call(message, on_event)
            return await self._answer(message)
        except ProtocolError as exc:
            return ErrorMessage.from_exception(exc, message.id)

    # -- handlers --------------------------------------------------------------------------------

    async def _answer(self, message: Any) -> Any:
        if isinstance(message, HandshakeRequest):
            return await self._handshake(message)
        if isinstance(message, Ping):
            uptime = time.monotonic() - self.host.started_at
            return Pong(req_id=message.id, uptime_seconds=round(uptime, 3))
        if isinstance(message, ToolListRequest):
            return self._list(message)
        if isinstance(message, StateRequest):
            session = self._tools_session()
            try:
                record = await self.host.state.current(session.id)
            except StateError as exc:  # a damaged record in the store
                raise ProtocolError(ErrorCode.RUNTIME_ERROR, str(exc)) from exc
            return StateResponse(
                req_id=message.id, state=record.document, state_version=record.version
            )
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, f"a host does not accept {message.type!r} messages"
        )

    async def _handshake(self, request: HandshakeRequest) -> HandshakeResponse:
        if self.session is not None:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, "the handshake was already completed")
        try:
            session = await self.host._open_session(request, self)
        except (CapabilityError, ProtocolError) as exc:
            reason = exc.message if isinstance(exc, ProtocolError) else str(exc)
            return HandshakeResponse(
                req_id=request.id, ok=False, reason=reason, max_parallel=self.host.max_parallel
            )
        self.session = session
        session.approver = self._ask_approval
        accepted = (
            [
                NegotiatedCapability(
                    capability="tools",
                    metadata={
                        "capabilities": sorted(session.capabilities.tags),
                        "capability_policy": self.host.capability_policy,
                        # the tools this session may call (deferred ones too: search finds
                        # them), not every tool the host has
                        "tools": len(
                            self.host.toolkit.definitions(
                                capabilities=session.capabilities, include_deferred=True
                            )
                        ),
                    },
                )
            ]
            if "tools" in session.a2e_caps
            else []
        )
        return HandshakeResponse(
            req_id=request.id,
            session_id=session.id,
            accepted_caps=accepted,
            max_parallel=session.max_parallel,
        )

    def _tools_session(self) -> Session:
        session = self.session
        if session is None:
            raise ProtocolError(
                ErrorCode.HANDSHAKE_REQUIRED, "send handshake/req before any tool/* message"
            )
        if "tools" not in session.a2e_caps:
            raise ProtocolError(
                ErrorCode.CAPABILITY_NOT_NEGOTIATED,
                "this session did not negotiate the 'tools' capability at handshake",
                capability_name="tools",
            )
        return session

    def _list(self, request: ToolListRequest) -> ToolListResponse:
        session = self._tools_session()
        toolkit = self.host.toolkit
        if request.query.strip():  # "   " is no search: the default listing
            found = toolkit.search(
                request.query,
                capabilities=session.capabilities,
                kind=request.filter_kind,
                tags=request.filter_tags,
                include_deferred=request.include_deferred,
            )
            definitions = [t.definition for t in found]
        else:
            definitions = toolkit.definitions(
                capabilities=session.capabilities,
                kind=request.filter_kind,
                tags=request.filter_tags,
            )
        return ToolListResponse(req_id=request.id, tools=definitions)

    def _start_call(self, request: ToolCallRequest) -> None:
        try:
            session = self._admit(request)
        except ProtocolError as exc:
            self._deliver(ErrorMessage.from_exception(exc, request.id))
            return
        task = start_eagerly(self._run_call(session, request))
        if task.done():
            return  # answered already
        self._calls[request.id] = task

        def finished(_task: asyncio.Future[None], key: str = request.id) -> None:
            self._calls.pop(key, None)

        task.add_done_callback(finished)

    async def _run_call(self, session: Session, request: ToolCallRequest) -> None:
        try:
            result = await self._run(session, _spec(request, streaming=True), self._deliver)
        except asyncio.CancelledError:
            # Only closing the connection cancels a call: say so to a peer still listening
            # (a shutdown's timeout cut it off), as the audit does.
            result = _cancelled_by_closing(request.tool_name)
            with contextlib.suppress(Exception):  # the transport may be gone already
                self._deliver(ToolCallResponse(req_id=request.id, data=result))
            return
        try:
            self._deliver(ToolCallResponse(req_id=request.id, data=result))
        except ValueError as exc:  # pydantic's: a value in it that JSON cannot carry
            # The peer still gets an answer, not a wait until its timeout.
            unsent = ToolResult(
                success=False,
                tool_name=request.tool_name,
                error=f"the tool's result could not be sent: {exc}",
                error_code=ToolErrorCode.TOOL_ERROR,
                duration_ms=result.duration_ms,
            )
            self._deliver(ToolCallResponse(req_id=request.id, data=unsent))

    def _admit(self, request: ToolCallRequest | None = None) -> Session:
        """Check a call may start and count it as running (``_run`` counts it out)."""
        session = self._tools_session()
        if request is not None:
            if request.session_id and request.session_id != session.id:
                raise ProtocolError(
                    ErrorCode.SESSION_MISMATCH,
                    f"session_id {request.session_id!r} is not this connection's session",
                )
            if request.id in self._calls:
                raise ProtocolError(
                    ErrorCode.DUPLICATE_REQUEST,
                    f"a call with id {request.id!r} is already running",
                )
        if self._closed:
            raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the session is shutting down")
        if session.active_calls >= session.max_parallel:
            raise ProtocolError(
                ErrorCode.MAX_PARALLEL_EXCEEDED,
                f"this session may run {session.max_parallel} calls at once; wait for one to end",
                retryable=True,
            )
        session.active_calls += 1
        return session

    async def _call(
        self, request: ToolCallRequest, on_event: Callable[[Any], None] | None
    ) -> ToolCallResponse:
        session = self._admit(request)
        spec = _spec(request, streaming=on_event is not None)
        result = await self._run_here(session, spec, on_event)
        return ToolCallResponse(req_id=request.id, data=result)

    async def call_direct(
        self, spec: CallSpec, on_event: Callable[[ToolEvent], None] | None = None
    ) -> ToolResult:
        """The in-process path for a call: the same checks and pipeline, no message objects.

        Protocol refusals (no handshake, max_parallel exceeded, ...) raise ``ProtocolError``."""
        return await self._run_here(self._admit(), spec, on_event)

    async def _run_here(
        self, session: Session, spec: CallSpec, on_event: Callable[[Any], None] | None
    ) -> ToolResult:
        """An in-process call, in the caller's task. Closing the connection aborts it (it then
        answers as cancelled, and is audited so), as it cancels wire calls, and waits for it:
        else it would run on past the host's close, and audit into a store closed already."""
        key = id(spec)
        self._direct[key] = spec
        try:
            return await self._run(session, spec, on_event)
        finally:
            del self._direct[key]
            if self._direct_done is not None and not self._direct:
                self._direct_done.set()

    async def _run(
        self, session: Session, spec: CallSpec, on_event: Callable[[Any], None] | None
    ) -> ToolResult:
        try:
            return await self.host.pipeline.call(session, spec, on_event)
        finally:
            session.active_calls -= 1

    # -- approvals -------------------------------------------------------------------------------

    async def _ask_approval(self, request: ApprovalRequest) -> Any:
        if self._closed:  # nobody is left to answer
            raise ApprovalFailed(_CLOSED_BEFORE_ANSWER)
        handler = self.approval_handler
        if handler is not None:  # the pipeline judges the answer: only True approves
            answer = handler(request)
            return await self._handler_answer(answer) if inspect.isawaitable(answer) else answer
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._approvals[request.id] = future
        self._deliver(request.event)  # even for a non-streaming call: it needs an answer
        try:
            return await future
        finally:
            self._approvals.pop(request.id, None)

    async def _handler_answer(self, answer: Awaitable[Any]) -> Any:
        """Await an in-process handler's answer, which closing the connection ends: the call
        is denied then, not left waiting for the approval timeout."""
        deciding = asyncio.ensure_future(answer)
        self._deciding.add(deciding)
        try:
            return await deciding
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._closed and current is not None and not current.cancelling():
                raise ApprovalFailed(_CLOSED_BEFORE_ANSWER) from None
            raise
        finally:
            self._deciding.discard(deciding)

    def _end_approvals(self) -> None:
        """Closing: every approval still waiting ends as failed (audited so), at once."""
        for future in list(self._approvals.values()):
            if not future.done():
                future.set_exception(ApprovalFailed(_CLOSED_BEFORE_ANSWER))
        for deciding in list(self._deciding):
            deciding.cancel()

    def _answer_approval(self, response: ApprovalResponse) -> None:
        future = self._approvals.get(response.req_id)
        if future is None or future.done():
            self._deliver(
                ErrorMessage(
                    req_id=response.id,
                    code=ErrorCode.INVALID_MESSAGE,
                    message=f"no approval {response.req_id!r} is waiting for an answer",
                )
            )
            return
        if response.failed and not response.approved:  # not someone's "no": a failure
            future.set_exception(ApprovalFailed(response.reason or "the agent could not decide"))
            return
        future.set_result(response.approved)

    # -- ending ----------------------------------------------------------------------------------

    async def drain(self, timeout: float | None = 10.0) -> None:
        """Stop taking calls, let running ones finish (up to ``timeout`` s), then close."""
        self._closed = True
        await self._wait_for_calls(timeout)
        await self.close()

    async def close(self) -> None:
        """Cancel running calls (each is audited as cancelled) and forget the session."""
        self._closed = True
        self._end_approvals()
        for task in self._calls.values():
            task.cancel()
        for spec in list(self._direct.values()):  # in the callers' tasks, not to be cancelled
            self.host.pipeline.abort(spec, _SHUTTING_DOWN)
        await self._wait_for_calls(5.0)
        self.host._forget(self)

    async def _wait_for_calls(self, timeout: float | None) -> None:
        """Wait (up to ``timeout`` s) until no call of this connection runs."""
        running: list[asyncio.Future[Any]] = list(self._calls.values())
        direct = None
        if self._direct:
            if self._direct_done is None or self._direct_done.is_set():
                self._direct_done = asyncio.Event()  # one for every waiter (close after drain)
            direct = asyncio.ensure_future(self._direct_done.wait())
            running.append(direct)
        if running:
            await asyncio.wait(running, timeout=timeout)
        if direct is not None:
            direct.cancel()


_SHUTTING_DOWN = "the call was cancelled: the session is shutting down"


def _cancelled_by_closing(tool_name: str) -> ToolResult:
    """The answer of a call that closing its connection cancelled."""
    return ToolResult.failure(tool_name, ToolErrorCode.CANCELLED, _SHUTTING_DOWN)
