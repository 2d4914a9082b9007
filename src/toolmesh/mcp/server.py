"""Any toolkit served over MCP: the protocol core shared by the stdio and HTTP transports.

An ``MCPService`` serves one ``Host``. Transports hand each peer's decoded JSON-RPC messages to
its ``MCPPeer`` and write back the bytes it returns. Both protocol eras are answered, as the
official SDK answers them:

- 2025 revisions (2024-11-05 ... 2025-11-25): ``initialize`` / ``notifications/initialized``
  first; the connection keeps the negotiated version;
- 2026-07-28: no handshake; every request carries its own ``_meta`` envelope (checked with the
  SDK's own classifier), ``server/discover`` answers a probe, results carry ``resultType`` and
  tool-list changes travel on ``subscriptions/listen`` streams.

Every ``tools/call`` goes through the host's pipeline (capabilities, validation, deadline,
events, audit with transport "mcp") under a ``Session`` holding the host's capability set, or
the set a capability override asked for: at ``initialize`` for the whole connection (2025), in
one request's ``_meta`` for that request alone (2026-07-28).
Failures a model should read (denied, invalid arguments, timeouts, tool errors) are results
with ``isError``; an unknown tool is a JSON-RPC error (-32602), as the spec asks. Progress
events become ``notifications/progress`` when the request gave a ``progressToken``;
``notifications/cancelled`` (or a closed HTTP stream) cancels the running tool.

Listings are serialized once per toolkit version and capability set, so ``tools/list`` of a
large catalogue costs one string concatenation. When the toolkit holds deferred tools, a
``search_tools`` tool is listed too: it ranks every tool (deferred ones included) and adds the
ones it finds to this session's listing, announcing the change with ``list_changed``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from toolmesh.errors import ArgumentError, ConfigError, SchemaError
from toolmesh.mcp.approvals import (
    APPROVAL_INPUT,
    ElicitationNeeded,
    SpentApprovals,
    answer_of,
    elicitation,
    seal,
    unseal,
)
from toolmesh.mcp.definitions import listed_output_schema, mcp_tool_entry
from toolmesh.mcp.results import mcp_call_result
from toolmesh.models import ToolErrorCode, ToolEvent, ToolResult, secret_id
from toolmesh.pipeline import ApprovalRequest, CallSpec
from toolmesh.schema import Validator, ref_cycle, validates_as_2020_12
from toolmesh.session import Session
from toolmesh.store.base import SessionRecord

if TYPE_CHECKING:
    from toolmesh.capabilities import CapabilitySet
    from toolmesh.host import Host
    from toolmesh.models import ToolDefinition
    from toolmesh.tools import Tool

__all__ = ["MCPPeer", "MCPService", "Send"]

logger = logging.getLogger("toolmesh.mcp.server")

Send = Callable[[bytes], None]
"""Writes one serialized JSON-RPC message to the peer."""

MODERN_VERSIONS = ("2026-07-28",)
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
BATCH_VERSIONS = frozenset({"2025-03-26"})  # JSON-RPC batches: added then, removed in 2025-06-18
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022
TOO_MANY_CALLS = -32000  # the session's max_parallel calls are running (A2E: max_parallel_exceeded)

OVERRIDE_KEY = "toolmesh/capability_override"
"""Where a client asks to adjust its capability set: in ``initialize``'s
``capabilities.experimental`` (2025) or a request's ``_meta`` (2026-07-28)."""
_CALL: contextvars.ContextVar[tuple[Send | None, dict[str, Any]]] = contextvars.ContextVar(
    "toolmesh_mcp_call"
)

_CLOSED_DURING_CALL = "the call was cancelled: the session is shutting down"

SEARCH_TOOL = "search_tools"
_SEARCH_LIMIT = 10


class MCPService:
    """Serves a host's tools over MCP to any number of peers."""

    def __init__(
        self,
        host: Host,
        *,
        name: str | None = None,
        version: str | None = None,
        instructions: str | None = None,
    ) -> None:
        self.approval_key = os.urandom(32)  # seals 2026-07-28 approval states
        self.spent_approvals = SpentApprovals()  # each runs one call
        from toolmesh import __version__

        self.host = host
        self.server_info = {"name": name or host.toolkit.name, "version": version or __version__}
        self.instructions = instructions
        self.peers: set[MCPPeer] = set()
        # Tools that search_tools found for 2026-07-28 HTTP clients: their requests share no
        # session, so what one search loads is listed for all of them.
        self.shared_loaded: frozenset[str] = frozenset()
        self._listings: dict[tuple[Any, ...], tuple[list[ToolDefinition], str]] = {}
        self._watched: set[int] = set()
        # per tool: whether it is listed with an outputSchema, and that schema's check
        self._structured: dict[str, tuple[Tool, bool, Validator | None]] = {}
        self._search_name = SEARCH_TOOL
        self._info_json = json.dumps(self.server_info)

    async def start(self) -> None:
        """Start the host (sources connect) and watch its sources for tool-list changes."""
        await self.host.start()
        self._watch_sources()

    def peer(
        self,
        send: Send | None = None,
        *,
        http_session: str = "",
        stateful: bool = True,
        reachable: Callable[[], bool] | None = None,
    ) -> MCPPeer:
        """A new connection (stdio) or session (HTTP); ``send`` carries server notifications.

        ``reachable`` says whether ``send`` reaches the client at the moment (an HTTP session's
        only while a GET stream is open); without it, ``send`` always does. A stateless peer
        answers one 2026-07-28 HTTP request and is neither recorded in the store nor told
        about list changes."""
        peer = MCPPeer(self, send, http_session=http_session, stateful=stateful)
        if reachable is not None:
            peer.reachable = reachable
        if stateful:
            self.peers.add(peer)
        return peer

    # -- listing -----------------------------------------------------------------------------------

    def listing_json(self, held: CapabilitySet, loaded: frozenset[str] = frozenset()) -> str:
        """The ``tools`` array a session holding ``held`` sees, serialized (cached)."""
        toolkit = self.host.toolkit
        definitions = toolkit.definitions(capabilities=held)
        key = (held, loaded)
        cached = self._listings.get(key)
        if cached is not None and cached[0] is definitions:
            return cached[1]
        entries = [mcp_tool_entry(toolkit[d.name]) for d in definitions]
        listed = {d.name for d in definitions}
        for name in sorted(loaded - listed):
            tool = toolkit.get(name)
            if tool is not None and held.allows(tool.definition.capabilities):
                entries.append(mcp_tool_entry(tool))
        if self.has_deferred(held):
            self._search_name = (
                SEARCH_TOOL if SEARCH_TOOL not in toolkit else "toolmesh_search_tools"
            )
            entries.append(_search_entry(self._search_name))
        text = json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
        if len(self._listings) > 256:
            self._listings.clear()
        self._listings[key] = (definitions, text)
        return text

    def promises_structure(self, name: str) -> bool:
        """Whether the tool ``name`` is listed with an ``outputSchema`` (cached per tool)."""
        return self._output_contract(name)[1]

    def output_check(self, name: str) -> Validator | None:
        """The check of the tool ``name``'s structured result against its listed
        ``outputSchema``, compiled once per tool (None: no schema, or one our validator would
        not read as a client's JSON Schema 2020-12 validator does: left to the client)."""
        return self._output_contract(name)[2]

    def _output_contract(self, name: str) -> tuple[Tool | None, bool, Validator | None]:
        tool = self.host.toolkit.get(name)
        if tool is None:
            return None, False, None
        cached = self._structured.get(name)
        if cached is not None and cached[0] is tool:
            return cached
        schema = listed_output_schema(tool)
        contract = (tool, schema is not None, _output_validator(name, schema))
        if len(self._structured) > 4096:
            self._structured.clear()
        self._structured[name] = contract
        return contract

    def has_deferred(self, held: CapabilitySet) -> bool:
        toolkit = self.host.toolkit
        everything = toolkit.definitions(capabilities=held, include_deferred=True)
        return len(everything) != len(toolkit.definitions(capabilities=held))

    # -- changes -----------------------------------------------------------------------------------

    def _watch_sources(self) -> None:
        for source in self.host.toolkit.sources:
            if id(source) not in self._watched:
                self._watched.add(id(source))
                source.subscribe(lambda _source: self.tools_changed())

    def tools_changed(self) -> None:
        """Tell every peer that listens that the tool list changed."""
        self._listings.clear()
        for peer in list(self.peers):
            peer.announce_list_changed()

    def forget(self, peer: MCPPeer) -> None:
        self.peers.discard(peer)


class MCPPeer:
    """One MCP conversation: its era, its session, its running calls and subscriptions."""

    def __init__(
        self,
        service: MCPService,
        send: Send | None,
        *,
        http_session: str = "",
        stateful: bool = True,
    ) -> None:
        self.service = service
        self.stateful = stateful
        self._saved = False
        self.send = send
        self.reachable: Callable[[], bool] = lambda: True  # whether ``send`` reaches the client
        self.era = ""  # "legacy" | "modern", decided by the first request
        self.version = ""
        self.initialized = False
        self.client_info: dict[str, Any] = {}
        self.http_session = http_session
        self._loaded: frozenset[str] = frozenset()
        self._session: Session | None = None
        self._calls: dict[Any, asyncio.Future[Any]] = {}
        self._cancelled: set[asyncio.Future[Any]] = set()  # the client cancelled these
        self._closing: set[asyncio.Future[Any]] = set()  # closing the session cancelled these
        # tools/call tasks counted in the session's active_calls: a cancelled call's slot is
        # free at once (the client may call again right away), not once its tool has stopped
        self._counted: set[asyncio.Future[Any]] = set()
        self._listens: dict[Any, Send] = {}
        self._closed = False
        self._asks: dict[str, asyncio.Future[Any]] = {}  # our requests to the client
        self._ask_seq = 0
        self._elicitation = False  # the client declared it can answer elicitation/create
        # the capability override asked for at initialize (2025; toolmesh extension): it holds
        # for the whole connection. A 2026-07-28 request's own override holds for it alone.
        self._override: Any = None

    # -- entry point -------------------------------------------------------------------------------

    async def handle(
        self,
        message: Any,
        *,
        notify: Send | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes | None:
        """Answer one decoded JSON-RPC message; None for notifications and cancelled calls.

        ``notify`` carries this request's own notifications (progress); ``headers`` are the
        HTTP request's headers (lower-case), checked against a 2026-07-28 envelope."""
        if isinstance(message, list) and message and self.version in BATCH_VERSIONS:
            return await self._batch(message, notify, headers)
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(None, INVALID_REQUEST, "expected one JSON-RPC 2.0 request object")
        if "method" not in message and "id" in message:
            self._answered(message)  # the client's answer to one of our requests
            return None
        method = message.get("method")
        request_id = message.get("id")
        if "id" not in message:
            if isinstance(method, str):
                self._notification(method, message.get("params"))
            return None  # a response from the client, or a notification: nothing to answer
        if not isinstance(method, str) or not _valid_id(request_id):
            return _error(request_id, INVALID_REQUEST, "a request needs a string method and an id")
        params = message.get("params")
        if params is not None and not isinstance(params, dict):
            return _error(request_id, INVALID_PARAMS, "params must be an object")
        try:
            answer = await self._request(method, request_id, params or {}, notify, headers)
        except _RpcError as exc:
            return _error(request_id, exc.code, exc.message, exc.data)
        if not self._saved and self.stateful:
            self._saved = True
            await self.save_session()
        return answer

    async def _batch(
        self, messages: list[Any], notify: Send | None, headers: Mapping[str, str] | None
    ) -> bytes | None:
        """A JSON-RPC batch, which the 2025-03-26 revision (only) has clients send: its
        messages run concurrently, and their answers come back as one array (none when all
        were notifications or answers)."""
        handled = (
            _nested_batch()
            if isinstance(m, list)
            else self.handle(m, notify=notify, headers=headers)
            for m in messages
        )
        replies = await asyncio.gather(*handled)
        answered = [reply for reply in replies if reply is not None]
        return b"[" + b",".join(answered) + b"]" if answered else None

    async def _request(
        self,
        method: str,
        request_id: Any,
        params: dict[str, Any],
        notify: Send | None,
        headers: Mapping[str, str] | None,
    ) -> bytes | None:
        self._settle_era(method, params, headers)
        held = self._requested_capabilities(params)
        if method == "initialize":
            return self._initialize(request_id, params)
        if method == "ping":
            return self._result(request_id, "{}")
        if self.era == "legacy" and not self.initialized:
            raise _RpcError(
                INVALID_REQUEST, "send initialize (and notifications/initialized) first"
            )
        if method == "tools/call":
            return await self._call(request_id, params, notify or self.send, held)
        if method == "tools/list":
            cursor = params.get("cursor")
            if cursor not in (None, ""):  # the listing is one page: no cursor was ever given out
                raise _RpcError(INVALID_PARAMS, f"unknown cursor {str(cursor)[:64]!r}")
            return self._list(request_id, held)
        if method == "server/discover":
            return self._discover(request_id)
        if method == "subscriptions/listen" and self.era == "modern":
            return await self._listen(request_id, params, notify or self.send)
        raise _RpcError(METHOD_NOT_FOUND, f"method {method!r} is not served here")

    def _settle_era(
        self, method: str, params: dict[str, Any], headers: Mapping[str, str] | None
    ) -> None:
        enveloped = isinstance(meta := params.get("_meta"), dict) and PROTOCOL_VERSION_KEY in meta
        if not self.era:
            self.era = "modern" if enveloped and method != "initialize" else "legacy"
        if self.era == "modern":
            if method == "initialize":
                raise _RpcError(
                    UNSUPPORTED_PROTOCOL_VERSION,
                    "this connection serves the 2026-07-28 protocol; initialize is not accepted",
                    {
                        "supported": list(MODERN_VERSIONS),
                        "requested": params.get("protocolVersion"),
                    },
                )
            self._check_envelope(method, params, headers)
        elif enveloped and method != "initialize":
            raise _RpcError(
                INVALID_REQUEST,
                "this connection serves the handshake era; 2026-07-28 envelopes are not accepted",
            )

    def _check_envelope(
        self, method: str, params: dict[str, Any], headers: Mapping[str, str] | None
    ) -> None:
        from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request

        verdict = classify_inbound_request(
            {"method": method, "params": params},
            headers=headers,
            supported_modern_versions=MODERN_VERSIONS,
        )
        if isinstance(verdict, InboundLadderRejection):
            raise _RpcError(verdict.code, verdict.message, verdict.data)
        self.version = verdict.protocol_version
        info = verdict.client_info
        if isinstance(info, dict):
            self.client_info = info

    # -- handshake and discovery -------------------------------------------------------------------

    def _initialize(self, request_id: Any, params: dict[str, Any]) -> bytes:
        requested = params.get("protocolVersion")
        self.version = requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE
        info = params.get("clientInfo")
        if isinstance(info, dict):
            self.client_info = info
        capabilities = params.get("capabilities")
        if not isinstance(capabilities, dict):
            capabilities = {}
        self._elicitation = isinstance(capabilities.get("elicitation"), dict)
        experimental = capabilities.get("experimental")
        # this initialize's own override: a refused one must not stick to the client's retry
        self._override = experimental.get(OVERRIDE_KEY) if isinstance(experimental, dict) else None
        self.session  # noqa: B018 - settle the capability set now: a refusal answers initialize
        self.initialized = True  # notifications/initialized is optional in practice
        result: dict[str, Any] = {
            "protocolVersion": self.version,
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": self.service.server_info,
        }
        if self.service.instructions:
            result["instructions"] = self.service.instructions
        return self._result(request_id, json.dumps(result))

    def _discover(self, request_id: Any) -> bytes:
        result: dict[str, Any] = {
            "supportedVersions": list(MODERN_VERSIONS),
            "capabilities": {"tools": {"listChanged": True}},
            "ttlMs": 0,
            "cacheScope": "private",
        }
        if self.service.instructions:
            result["instructions"] = self.service.instructions
        return self._result(request_id, json.dumps(result))

    def _notification(self, method: str, params: Any) -> None:
        if method == "notifications/initialized":
            self.initialized = True
        elif method == "notifications/cancelled" and isinstance(params, dict):
            key = _id_key(params.get("requestId"))
            task = self._calls.get(key)
            if task is not None and task not in self._cancelled:
                self._cancelled.add(task)
                self._uncount(task)
                task.cancel()

    def _uncount(self, task: asyncio.Future[Any]) -> None:
        if task in self._counted:
            self._counted.discard(task)
            self.session.active_calls -= 1

    # -- tools -------------------------------------------------------------------------------------

    @property
    def loaded(self) -> frozenset[str]:
        """Deferred tools this peer's listing includes (found by search_tools)."""
        return self._loaded if self.stateful else self.service.shared_loaded

    def _load(self, names: frozenset[str]) -> None:
        if self.stateful:
            self._loaded = self._loaded | names
            self.announce_list_changed()
        else:
            self.service.shared_loaded = self.service.shared_loaded | names
            self.service.tools_changed()

    @property
    def session(self) -> Session:
        """The toolmesh session of this conversation, made on first use."""
        if self._session is None:
            host = self.service.host
            agent = self.client_info.get("name") if isinstance(self.client_info, dict) else None
            self._session = Session(
                capabilities=self._adjusted(self._override),
                agent_id=str(agent or "mcp-client"),
                id=self.http_session or secret_id(),
                max_parallel=host.max_parallel,
                transport="mcp",
                metadata={"protocol_version": self.version},
                approver=self._approve,
            )
            if self.stateful:
                host.sessions[self._session.id] = self._session
        return self._session

    async def save_session(self) -> None:
        """Record the session in the host's store (stateful conversations only)."""
        session = self.session
        await self.service.host.store.save_session(
            SessionRecord(
                session_id=session.id,
                agent_id=session.agent_id,
                capabilities=sorted(session.capabilities.tags),
                created_at=session.created_at,
                metadata={"transport": "mcp", "host_id": self.service.host.host_id},
            )
        )

    def _list(self, request_id: Any, held: CapabilitySet | None) -> bytes:
        tools = self.service.listing_json(self._session_for(held).capabilities, self.loaded)
        if self.era == "modern":
            tail = ',"ttlMs":0,"cacheScope":"private","resultType":"complete"'
            return self._result(request_id, '{"tools":' + tools + tail + "}", stamped=False)
        return self._result(request_id, '{"tools":' + tools + "}")

    async def _call(
        self,
        request_id: Any,
        params: dict[str, Any],
        notify: Send | None,
        held: CapabilitySet | None,
    ) -> bytes | None:
        name = params.get("name")
        if not isinstance(name, str) or not name:
            raise _RpcError(INVALID_PARAMS, "tools/call needs the tool's name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise _RpcError(INVALID_PARAMS, "tools/call arguments must be an object")
        if name == self.service._search_name and name not in self.service.host.toolkit:
            return await self._searched(request_id, name, arguments, self._session_for(held))
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        on_event = _progress_sender(token, notify) if token is not None and notify else None
        spec = CallSpec(
            tool_name=name,
            arguments=arguments,
            req_id=str(request_id),
            streaming=on_event is not None,
        )
        session = self.session
        if session.active_calls >= session.max_parallel:
            raise _RpcError(
                TOO_MANY_CALLS,
                f"this session may run {session.max_parallel} calls at once; wait for one to end",
            )
        key = _id_key(request_id)
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - requests are handled in tasks
            raise RuntimeError("tools/call outside a task")
        self._calls[key] = task  # notifications/cancelled cancels it
        _CALL.set((notify, params))  # what an approval of this call needs
        session.active_calls += 1
        self._counted.add(task)
        try:
            result = await self.service.host.pipeline.call(self._session_for(held), spec, on_event)
        except ElicitationNeeded as pending:  # 2026-07-28: the client retries with its answer
            return self._result(request_id, json.dumps(pending.result))
        except asyncio.CancelledError:
            if task in self._cancelled:
                task.uncancel()  # cancelled by the client (and audited): no answer is owed
                return None
            if task in self._closing and task.cancelling() == 1:
                task.uncancel()  # by closing the session (audited): the client is told
                wire = mcp_call_result(
                    ToolResult.failure(name, ToolErrorCode.CANCELLED, _CLOSED_DURING_CALL),
                    modern=self.era == "modern",
                )
                return self._result(request_id, json.dumps(wire))
            raise
        finally:
            self._uncount(task)
            if self._calls.get(key) is task:  # the client may have reused a cancelled id
                del self._calls[key]
            self._cancelled.discard(task)
        if result.error_code == ToolErrorCode.UNKNOWN_TOOL:
            raise _RpcError(INVALID_PARAMS, result.error or f"unknown tool {name!r}")
        if result.success and self.service.promises_structure(name):
            result = self._conforming(name, result)
        wire = mcp_call_result(result, modern=self.era == "modern")
        return self._result(request_id, json.dumps(wire, ensure_ascii=False, default=str))

    def _conforming(self, name: str, result: ToolResult) -> ToolResult:
        """A success of a tool listed with an ``outputSchema``, as the spec has it ("Servers
        MUST provide structured results that conform to this schema"): one without structured
        data, or with data the schema refuses, becomes an ``isError`` result naming why (a
        client such as the SDK's would otherwise raise instead of reading a result)."""
        if not isinstance(result.data, dict):
            return _unstructured(result)
        check = self.service.output_check(name)
        if check is None:
            return result
        try:
            check(result.data)
        except ArgumentError as exc:
            return _nonconforming(result, exc)
        return result

    # -- capabilities and approvals (docs/policy.md) --------------------------------------------

    def _requested_capabilities(self, params: dict[str, Any]) -> CapabilitySet | None:
        """The set a 2026-07-28 request asks for in its ``_meta`` (None: it asks for none).

        It holds for that request alone, and a refusal (a locked host) answers that request
        alone: the era keeps no state between requests, so neither may an override."""
        meta = params.get("_meta")
        if self.era != "modern" or not isinstance(meta, dict) or OVERRIDE_KEY not in meta:
            return None
        return self._adjusted(meta[OVERRIDE_KEY])

    def _session_for(self, held: CapabilitySet | None) -> Session:
        """The session one request runs under: the conversation's own, or a copy of it (same
        id, agent, approver and state) holding the set that request asked for."""
        session = self.session
        if held is None or held is session.capabilities:
            return session
        return dataclasses.replace(session, capabilities=held)

    def _adjusted(self, asked: Any) -> CapabilitySet:
        """The host's set, adjusted by an override when the host's policy allows."""
        from toolmesh.capabilities import session_capabilities
        from toolmesh.errors import CapabilityError

        host = self.service.host
        if asked is None:
            return host.capabilities
        if not isinstance(asked, dict) or not isinstance(asked.get("capabilities", []), list):
            raise _RpcError(INVALID_PARAMS, f"{OVERRIDE_KEY} must be {{strategy, capabilities}}")
        try:
            return session_capabilities(
                host.capabilities,
                host.capability_policy,
                str(asked.get("strategy", "inherit")),
                [str(tag) for tag in asked.get("capabilities", [])],
            )
        except (CapabilityError, ConfigError) as exc:
            raise _RpcError(INVALID_REQUEST, str(exc)) from None

    async def _approve(self, request: ApprovalRequest) -> bool:
        """Ask the client: an elicitation on the call's channel (2025) or an input request
        the client answers by retrying the call (2026-07-28)."""
        send, params = _CALL.get()
        service = self.service
        if self.era == "modern":
            responses = params.get("inputResponses")
            state = params.get("requestState")
            if isinstance(responses, dict) and APPROVAL_INPUT in responses:
                sealed = unseal(service.approval_key, state, request.tool_name, request.arguments)
                if sealed is None:
                    raise ValueError("the approval's requestState is missing, expired or forged")
                if not service.spent_approvals.spend(*sealed):
                    raise ValueError("the approval's requestState was used already")
                return answer_of(responses[APPROVAL_INPUT])
            ask = {"method": "elicitation/create", "params": elicitation(request)}
            ttl = service.host.pipeline.limits.approval_timeout
            raise ElicitationNeeded(
                {
                    "resultType": "input_required",
                    "inputRequests": {APPROVAL_INPUT: ask},
                    "requestState": seal(service.approval_key, request, ttl),
                }
            )
        if not self._elicitation:
            raise ValueError("the MCP client did not declare elicitation, so it cannot approve")
        if send is None or (send is self.send and not self.reachable()):
            raise ValueError(
                "this request has no channel to ask the client on: POST it accepting "
                "text/event-stream, or open the session's GET stream first"
            )
        return answer_of(await self._ask("elicitation/create", elicitation(request), send))

    async def _ask(self, method: str, params: dict[str, Any], send: Send) -> Any:
        self._ask_seq += 1
        ask_id = f"toolmesh-{self._ask_seq}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._asks[ask_id] = future
        request = {"jsonrpc": "2.0", "id": ask_id, "method": method, "params": params}
        send(json.dumps(request).encode())
        try:
            return await future
        finally:
            self._asks.pop(ask_id, None)

    def _answered(self, message: dict[str, Any]) -> None:
        future = self._asks.get(str(message.get("id")))
        if future is None or future.done():
            return
        if "error" in message:
            error = message["error"]
            text = error.get("message") if isinstance(error, dict) else error
            future.set_exception(ValueError(f"the client answered with an error: {text}"))
        else:
            future.set_result(message.get("result"))

    async def _searched(
        self, request_id: Any, name: str, arguments: dict[str, Any], session: Session
    ) -> bytes:
        """``search_tools``, answered here and audited like every call."""
        started = time.perf_counter()
        try:
            _SEARCH_ARGUMENTS(arguments)
        except ArgumentError as exc:
            outcome = _refused_search(name, str(exc))
        else:
            outcome = self._search_answered(name, arguments, session.capabilities)
        outcome.duration_ms = int((time.perf_counter() - started) * 1000)
        spec = CallSpec(tool_name=name, arguments=arguments, req_id=str(request_id))
        await self.service.host.pipeline.record(session, spec, outcome, source="mcp-server")
        wire = mcp_call_result(outcome, modern=self.era == "modern")
        return self._result(request_id, json.dumps(wire, ensure_ascii=False))

    def _search_answered(
        self, name: str, arguments: dict[str, Any], held: CapabilitySet
    ) -> ToolResult:
        """``_search``, with a search that fails as an error result: raised, it left the
        client's request unanswered, waiting for ever."""
        try:
            return self._search(name, arguments, held)
        except Exception as exc:
            logger.exception("search_tools failed (the audit has its arguments)")
            message = f"search_tools failed: {type(exc).__name__}: {exc}"
            return ToolResult.failure(name, ToolErrorCode.TOOL_ERROR, message)

    def _search(self, name: str, arguments: dict[str, Any], held: CapabilitySet) -> ToolResult:
        query: str = arguments["query"]
        if not query.strip():
            return _refused_search(name, "search_tools needs a non-empty 'query'")
        found = self.service.host.toolkit.search(
            query,
            capabilities=held,
            limit=arguments.get("limit", _SEARCH_LIMIT),
        )
        entries = [mcp_tool_entry(tool) for tool in found]
        new = frozenset(t.name for t in found if t.definition.defer_loading) - self.loaded
        if new:
            self._load(new)
        lines = [f"{e['name']}: {e['description']}" for e in entries] or ["no tool matches"]
        return ToolResult(
            success=True,
            tool_name=name,
            data={"tools": entries},
            output="\n".join(lines),
            duration_ms=0,
        )

    # -- tool-list changes -------------------------------------------------------------------------

    async def _listen(
        self, request_id: Any, params: dict[str, Any], notify: Send | None
    ) -> bytes | None:
        wanted = params.get("notifications")
        tools = isinstance(wanted, dict) and wanted.get("toolsListChanged") is True
        if notify is None:
            raise _RpcError(INVALID_REQUEST, "subscriptions/listen needs a stream to answer on")
        honored = {"toolsListChanged": True} if tools else {}
        ack = {"notifications": honored, "_meta": {SUBSCRIPTION_ID_KEY: request_id}}
        notify(_notification("notifications/subscriptions/acknowledged", ack))
        key = _id_key(request_id)
        if tools:
            self._listens[key] = notify
            self.service.peers.add(self)  # a stateless peer hears changes while it listens
        ended = asyncio.get_running_loop().create_future()
        self._calls[key] = ended  # cancelling it ends the stream
        try:
            await ended
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
        finally:
            self._listens.pop(key, None)
            if self._calls.get(key) is ended:
                del self._calls[key]
            self._cancelled.discard(ended)
            if not self.stateful and not self._listens:
                self.service.forget(self)
        result = {"_meta": {SUBSCRIPTION_ID_KEY: request_id}, "resultType": "complete"}
        return self._result(request_id, json.dumps(result), stamped=False)

    @property
    def busy(self) -> bool:
        """Whether a call (or a listen stream) of this peer is running."""
        return bool(self._calls)

    def announce_list_changed(self) -> None:
        """Send ``notifications/tools/list_changed`` where this peer can hear it."""
        if self.era == "modern":
            for key, notify in list(self._listens.items()):
                meta = {SUBSCRIPTION_ID_KEY: key[1]}
                notify(_notification("notifications/tools/list_changed", {"_meta": meta}))
        elif self.initialized and self.send is not None:
            self.send(_notification("notifications/tools/list_changed", None))

    # -- ending ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel running calls (each is audited as cancelled) and end listen streams."""
        if self._closed:
            return
        self._closed = True
        running = list(self._calls.values())
        self._closing.update(running)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=5.0)
        self.service.forget(self)
        if self._session is not None:
            self.service.host.sessions.pop(self._session.id, None)

    # -- encoding ----------------------------------------------------------------------------------

    def _result(self, request_id: Any, result_json: str, *, stamped: bool = True) -> bytes:
        if self.era == "modern" and stamped:
            result_json = self._stamp(result_json)
        return (
            b'{"jsonrpc":"2.0","id":'
            + json.dumps(request_id).encode()
            + b',"result":'
            + result_json.encode()
            + b"}"
        )

    def _stamp(self, result_json: str) -> str:
        """A 2026-07-28 result: ``resultType`` and the ``serverInfo`` stamp."""
        body = result_json[1:-1]
        if '"_meta"' in body:  # rare (an error's code, say): merged into the result's own
            return self._stamp_merged(result_json)
        extra = '"resultType":"complete"' if '"resultType"' not in body else ""
        stamp = '"_meta":{"' + SERVER_INFO_KEY + '":' + self.service._info_json + "}"
        extra = f"{extra},{stamp}" if extra else stamp
        return "{" + body + ("," if body else "") + extra + "}"

    def _stamp_merged(self, result_json: str) -> str:
        """``_stamp`` for a result that may hold ``_meta`` itself, at its top or deeper (in
        ``structuredContent``): read, stamped at the top, written again."""
        result = json.loads(result_json)
        if not isinstance(result, dict):
            return result_json
        result.setdefault("resultType", "complete")
        meta = result.get("_meta")
        meta = dict(meta) if isinstance(meta, dict) else {}
        meta.setdefault(SERVER_INFO_KEY, self.service.server_info)
        result["_meta"] = meta
        return json.dumps(result, ensure_ascii=False)


class _RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


async def _nested_batch() -> bytes:
    return _error(None, INVALID_REQUEST, "a batch cannot hold a batch")


def _error(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    envelope = {"jsonrpc": "2.0", "id": request_id, "error": error}
    return json.dumps(envelope, separators=(",", ":")).encode()


def _notification(method: str, params: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


def _progress_sender(token: Any, notify: Send) -> Callable[[ToolEvent], None]:
    def on_event(event: ToolEvent) -> None:
        if event.kind != "progress":
            return
        params: dict[str, Any] = {
            "progressToken": token,
            "progress": event.data.get("progress", event.data.get("pct", 0)),
        }
        total = event.data.get("total", 100 if "progress" not in event.data else None)
        if total is not None:
            params["total"] = total
        if event.data.get("message"):
            params["message"] = event.data["message"]
        notify(_notification("notifications/progress", params))

    return on_event


_SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "what the tool should do"},
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": 50,
            "description": "most tools to return (10)",
        },
    },
    "required": ["query"],
}
_SEARCH_ARGUMENTS = Validator(_SEARCH_SCHEMA)  # compiled on first use


def _search_entry(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": (
            "Search every tool this server offers, including ones not listed yet, by what they "
            "do. Tools found are added to your tool list."
        ),
        "inputSchema": _SEARCH_SCHEMA,
        "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
    }


def _unstructured(result: ToolResult) -> ToolResult:
    """A success without the structured result its listed ``outputSchema`` promises (data cut
    off by the output limit, say): an ``isError`` result, which clients do not check against
    the schema ("Servers MUST provide structured results that conform to this schema")."""
    why = result.metadata.get("data_omitted") or "the tool returned no object"
    message = f"{result.tool_name} gave no structured result for its outputSchema ({why})"
    if result.output:
        message += f"; its output:\n{result.output}"
    return ToolResult.failure(result.tool_name, ToolErrorCode.TOOL_ERROR, message, result.metadata)


def _nonconforming(result: ToolResult, exc: ArgumentError) -> ToolResult:
    message = (
        f"{result.tool_name} returned a structured result its outputSchema refuses "
        f"(at {exc.path}: {exc.reason})"
    )
    if result.output:
        message += f"; its output:\n{result.output}"
    return ToolResult.failure(result.tool_name, ToolErrorCode.TOOL_ERROR, message, result.metadata)


def _output_validator(name: str, schema: dict[str, Any] | None) -> Validator | None:
    """The compiled check of a listed ``outputSchema`` (``format`` an annotation only, as
    clients check it). None when there is none to apply: no schema, a ``$ref`` cycle, keywords
    our (draft-07) validator reads otherwise than 2020-12, or one it cannot compile."""
    if schema is None or ref_cycle(schema) is not None or not validates_as_2020_12(schema):
        return None
    check = Validator(schema, formats=False)
    try:
        check(None)  # compiled now, once (a schema error is logged once): no object is None
    except ArgumentError:
        return check
    except SchemaError as exc:
        logger.warning("the outputSchema of %s cannot be checked: %s", name, exc)
        return None
    return check


def _refused_search(name: str, message: str) -> ToolResult:
    return ToolResult.failure(name, ToolErrorCode.INVALID_ARGUMENTS, message)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _id_key(value: Any) -> tuple[str, Any]:
    """Request ids compare by type and value (``1`` and ``"1"`` are different ids)."""
    return (type(value).__name__, value)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
