"""A toolkit served as an A2A agent: the agent card and the JSON-RPC endpoint.

    GET  /.well-known/agent-card.json   the card (A2A 1.0 fields, plus the v0.3 ones)
    POST /a2a                           JSON-RPC: SendMessage, SendStreamingMessage, GetTask,
                                        CancelTask, ListTasks, SubscribeToTask, and the v0.3
                                        message/send, message/stream, tasks/get, tasks/cancel,
                                        tasks/resubscribe; the push-notification methods
                                        answer -32003 and GetExtendedAgentCard -32007 (the
                                        card claims neither)

The card's skills are the toolkit's skills (its SKILL.md folders). A message creates a task that
runs the LLM client's agent loop over the toolkit's tools; the skill named in the message's
``metadata.skillId`` has its instructions put in the system prompt; its file parts are described
to the model (name, media type, size), which cannot read them. A message with the ``contextId``
of earlier tasks continues the conversation of those that completed. ``SendStreamingMessage``
streams the task, its status updates (one per tool call) and its artifact. A request without an
``id`` (a JSON-RPC notification, which gets no answer) is an invalid request: it is not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic_core import to_json
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from toolmesh import strictjson
from toolmesh.a2a import wire
from toolmesh.a2a.card import WELL_KNOWN_CARD
from toolmesh.a2a.tasks import RunningTask, TaskBoard, approval_of, status_update
from toolmesh.capabilities import CapabilitySet, session_capabilities
from toolmesh.eager import start_eagerly
from toolmesh.errors import CallTimeout, CapabilityError, ConfigError, ProviderError
from toolmesh.llm.loop import RunEvent
from toolmesh.llm.styles import ChatMessage
from toolmesh.models import new_id, secret_id
from toolmesh.pipeline import ApprovalRequest
from toolmesh.sources.skills import Skill
from toolmesh.store.base import Store
from toolmesh.transports.http import HotRoute, refuse_unwelcome
from toolmesh.transports.sse import encode_event

if TYPE_CHECKING:
    from toolmesh.llm.client import LLMClient
    from toolmesh.toolkit import Toolkit

__all__ = ["RPC_PATH", "A2AServer"]

logger = logging.getLogger("toolmesh.a2a.server")

RPC_PATH = "/a2a"
MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_PAGE = 50
MAX_PAGE = 100
STOPPED = "the server stopped before the task finished"

JsonObject = dict[str, Any]
_V03_TO_V10 = {v03: v10 for v10, v03 in wire.METHODS_V03.items()}


OVERRIDE_KEY = "toolmesh/capability_override"
"""Message metadata asking to adjust the capability set for a task (toolmesh extension)."""


CANCEL_TOPIC = "a2a.cancel"
"""The store signal that asks whichever host runs a task to cancel it."""

HEARTBEAT_INTERVAL = 5.0
"""Seconds between the heartbeats (``Store.host_alive``) of a server whose store is shared: the
others take it as gone, and its unfinished tasks as never to be finished, 30 s after its last
one (``toolmesh.store.postgres.HOST_TIMEOUT``). Six beats to a timeout: a beat or two delayed (a
slow statement, a busy event loop, a short reconnect) never makes a live host look gone. A beat
is one short statement on a pooled connection: a few hosts beating every 5 s cost nothing."""

END_RETRY_INTERVAL = 5.0
"""Seconds between attempts to record the ends that could not be written as their tasks ended
(the store away beyond its ``reconnect_timeout``): until one is, the store holds the task as
working, and, while this host beats, the other hosts report it so."""


class A2AServer:
    """Serves one toolkit as one A2A agent; ``routes()`` mount it on an HTTP server."""

    def __init__(
        self,
        toolkit: Toolkit,
        client: LLMClient,
        *,
        name: str,
        description: str = "",
        version: str = "",
        instructions: str = "",
        store: Store | None = None,
        max_turns: int = 10,
        auth_token: str | None = None,
        allowed_origins: tuple[str, ...] = (),
    ) -> None:
        if not name or not isinstance(name, str):
            raise ConfigError("an A2A agent needs a name (a2a={'name': ...})")
        self.toolkit = toolkit
        self.client = client
        self.name = name
        self.description = description or f"{name}: an agent with {toolkit.name}'s tools"
        self.version = version or _package_version()
        self.instructions = instructions
        self.max_turns = max_turns
        self.auth_token = auth_token or None
        self.allowed_origins = set(allowed_origins)
        self.board = TaskBoard(store or toolkit.store)
        self._stopping = False
        self._heartbeat: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._resyncing: asyncio.Task[None] | None = None  # looking up running tasks
        self._resync_again = False  # a resync was asked while one ran
        self._rewriting: asyncio.Task[None] | None = None  # recording ends written in vain
        self._methods: dict[str, Callable[[JsonObject, Any, bool], Awaitable[Response]]] = {
            "SendMessage": self._send_message,
            "SendStreamingMessage": self._send_streaming_message,
            "GetTask": self._get_task,
            "CancelTask": self._cancel_task,
            "ListTasks": self._list_tasks,
            "SubscribeToTask": self._subscribe,
            # The card says pushNotifications: false and has no extended card; these answer
            # the errors A2A names for that, not "method not found" (which a client, ours
            # included, reads as "speak the other protocol version").
            "CreateTaskPushNotificationConfig": _no_push_notifications,
            "GetTaskPushNotificationConfig": _no_push_notifications,
            "ListTaskPushNotificationConfigs": _no_push_notifications,
            "DeleteTaskPushNotificationConfig": _no_push_notifications,
            "GetExtendedAgentCard": _no_extended_card,
        }

    @property
    def host_id(self) -> str:
        """This server's id among the hosts sharing its store, from ``start`` on (none with a
        store of its own): the tasks it writes name it, and it beats under it."""
        return self.board.host_id

    def routes(self) -> list[BaseRoute]:
        return [
            Route(WELL_KNOWN_CARD, self._card, methods=["GET"]),
            Route("/.well-known/agent.json", self._card, methods=["GET"]),  # v0.2 clients
            HotRoute(RPC_PATH, _AsgiEndpoint(self._endpoint), methods=["POST"]),
        ]

    async def start(self) -> None:
        store = self.board.store
        await store.open()
        if store.shared and self._unsubscribe is None:  # hosts sharing one store (PostgreSQL)
            self._unsubscribe = store.subscribe(
                CANCEL_TOPIC, self._cancel_here, resync=self._resync
            )
        if store.shared and self._heartbeat is None:
            # The tasks this server writes name it, and it says it is alive before it serves
            # and every few seconds after: once it stops, another host reading one of its
            # unfinished tasks records it as failed (see TaskBoard._settle).
            self.board.host_id = _own_host_id(self.toolkit.pipeline.host_id)
            await store.host_alive(self.host_id)
            self._heartbeat = asyncio.ensure_future(self._keep_alive())

    async def _keep_alive(self) -> None:
        store = self.board.store
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
            try:
                await store.host_alive(self.host_id)
            except Exception as exc:  # away beyond its reconnect_timeout: the next beat retries
                logger.warning("could not tell the store that this host is alive: %s", exc)

    def _cancel_here(self, task_id: str) -> None:
        """Another host was asked to cancel a task: stop it if it runs here (and is not
        ending already). A write this host makes for the task finds the cancel in the store
        too, and stops it the same way, should this notice be lost (see ``TaskBoard.save``)."""
        running = self.board.running.get(task_id)
        if running is not None:
            running.stop()

    def _resync(self) -> None:
        """Cancel notices may have been missed (the store's listener lost its connection and
        has it again): the running tasks are looked up, and those ended meanwhile stopped.
        Without this, one that writes nothing more ran on to its end, calling the model and
        its tools for a task that was over."""
        if not self.board.running:
            return
        if self._resyncing is not None and not self._resyncing.done():
            # The one running may have read some tasks before notices were lost again: it
            # looks them all up again once done.
            self._resync_again = True
            return
        self._resyncing = asyncio.ensure_future(self._stop_ended())

    async def _stop_ended(self) -> None:
        while True:
            self._resync_again = False
            for task_id, running in list(self.board.running.items()):
                try:
                    record = await self.board.store.load_a2a_task(task_id)
                except Exception:  # the store went away again: its next resync looks again
                    logger.warning("could not look up task %s after a reconnect", task_id)
                    return
                if record is not None and record.state in wire.TERMINAL:
                    running.stop()
            if not self._resync_again:
                return

    async def close(self) -> None:
        """Stop the running tasks (recorded as failed: the server stopped); with a shared
        store, then stop saying this host is alive (a task it could not end in time is failed by
        the next host that reads it)."""
        self._stopping = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._resyncing is not None:
            self._resyncing.cancel()
            await asyncio.gather(self._resyncing, return_exceptions=True)
            self._resyncing = None
        jobs = [r.job for r in self.board.running.values() if r.job is not None]
        for job in jobs:
            job.cancel()
        if jobs:
            await asyncio.wait(jobs, timeout=5.0)
        await self._last_rewrite()
        if self._heartbeat is not None:  # alive while its tasks' ends were written; now gone
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None
            try:
                await self.board.store.host_gone(self.host_id)
            except Exception as exc:  # its row ages out instead (HOST_TIMEOUT)
                logger.warning("could not tell the store that this host stopped: %s", exc)

    # -- the card ----------------------------------------------------------------------------------

    def card(self, base_url: str) -> JsonObject:
        url = base_url.rstrip("/") + RPC_PATH
        card: JsonObject = {
            "name": self.name,
            "description": self.description,
            "supportedInterfaces": [
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            ],
            "version": self.version,
            "capabilities": {"streaming": True, "pushNotifications": False},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": self._skills(),
            # v0.3 fields, for clients that predate supportedInterfaces
            "url": url,
            "protocolVersion": "0.3.0",
            "preferredTransport": "JSONRPC",
        }
        if self.auth_token:
            # Both shapes in one: 1.0 readers take the httpAuthSecurityScheme (the a2a-sdk's
            # parse_agent_card ignores the rest), v0.3 readers the type and scheme beside it
            # (else they read a mutualTLS scheme), and each its own list of requirements.
            bearer = {
                "httpAuthSecurityScheme": {"scheme": "Bearer"},  # 1.0
                "type": "http",  # v0.3
                "scheme": "Bearer",  # v0.3
            }
            card["securitySchemes"] = {"bearer": bearer}
            card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]  # 1.0
            card["security"] = [{"bearer": []}]  # v0.3
        return card

    def _skills(self) -> list[JsonObject]:
        skills = [_card_skill(s) for s in self.toolkit.skills]
        if skills:
            return skills
        return [
            {
                "id": "chat",
                "name": self.name,
                "description": self.description,
                "tags": ["chat"],
            }
        ]

    async def _card(self, request: Request) -> Response:
        return JSONResponse(self.card(str(request.base_url)))

    # -- JSON-RPC --------------------------------------------------------------------------------

    async def _endpoint(self, request: Request) -> Response:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        request_id: Any = None
        try:
            body = await _bounded_body(request)
            try:
                payload = strictjson.loads(body)  # Rust: a few times json.loads
            except ValueError as exc:
                return _error(None, wire.RpcError(wire.PARSE_ERROR, f"invalid JSON: {exc}"))
            if isinstance(payload, dict):
                request_id = _request_id(payload.get("id"))
            method, params = _check_request(payload)
            params = wire.json_names(params)
            legacy = method in _V03_TO_V10
            name = _V03_TO_V10.get(method, method)
            handler = self._methods.get(name)
            if handler is None:
                raise wire.RpcError(wire.METHOD_NOT_FOUND, f"method {method!r} not found")
            if not legacy:
                _check_version(request.headers.get(wire.VERSION_HEADER))
            if legacy:
                params = wire.params_from_v03(name, params)
            return await handler(params, request_id, legacy)
        except wire.RpcError as exc:
            return _error(request_id, exc)
        except Exception as exc:
            logger.exception("A2A request failed")
            return _error(request_id, wire.RpcError(wire.INTERNAL_ERROR, f"internal error: {exc}"))

    def _refuse(self, request: Request) -> Response | None:
        return refuse_unwelcome(request.headers, self.allowed_origins, self.auth_token)

    # -- methods -----------------------------------------------------------------------------------

    async def _send_message(self, params: JsonObject, request_id: Any, legacy: bool) -> Response:
        config = wire.json_names(_object(params, "configuration"), "configuration")
        _object(config, "configuration.taskPushNotificationConfig")
        modes = config.get("acceptedOutputModes")
        if modes is not None and (
            not isinstance(modes, list) or not all(isinstance(m, str) for m in modes)
        ):
            raise wire.RpcError(
                wire.INVALID_PARAMS,
                f"configuration.acceptedOutputModes must be a list of strings, not {modes!r}"[:200],
            )
        waits = not _flag(config, "returnImmediately", False)
        history_length = _history_length(config.get("historyLength"))
        running = await self._start(params, creator_waits=waits)
        if running.job is not None and waits:
            # Until it ends or waits for input; the task outlives a client that went away
            # (cancelling this wait cancels only the waiting).
            await running.settled()
        task = _view(running.doc, history_length)
        result = wire.task_to_v03(task) if legacy else {"task": task}
        return _result(request_id, result)

    async def _send_streaming_message(
        self, params: JsonObject, request_id: Any, legacy: bool
    ) -> Response:
        running = await self._start(params, listen=True)
        queue = running.listeners[-1]
        return _event_stream(request_id, legacy, {"task": running.snapshot}, running, queue)

    async def _subscribe(self, params: JsonObject, request_id: Any, legacy: bool) -> Response:
        task_id = _task_id(params)
        running = self.board.running.get(task_id)
        if running is None:
            if await self.board.get(task_id) is None:
                raise _not_found(task_id)
            raise wire.RpcError(
                wire.UNSUPPORTED_OPERATION, f"task {task_id!r} is not running; use GetTask"
            )
        if running.paused:  # it waits for its caller: the stream ends at once, as a streamed
            # message's does there (listening would hold the client until someone answers)
            return _event_stream(
                request_id, legacy, {"task": _view(running.doc, None)}, running, None
            )
        queue = running.listen()
        # a copy as it stands now: the live document would be read when the stream starts,
        # after updates the queue already holds
        return _event_stream(request_id, legacy, {"task": _view(running.doc, None)}, running, queue)

    async def _get_task(self, params: JsonObject, request_id: Any, legacy: bool) -> Response:
        task_id = _task_id(params)
        history_length = _history_length(params.get("historyLength"))
        doc = await self.board.get(task_id)
        if doc is None:
            raise _not_found(task_id)
        task = _view(doc, history_length)
        return _result(request_id, wire.task_to_v03(task) if legacy else task)

    async def _cancel_task(self, params: JsonObject, request_id: Any, legacy: bool) -> Response:
        task_id = _task_id(params)
        _object(params, "metadata")  # not used, but a list or a text there is not metadata
        running = self.board.running.get(task_id)
        if running is not None and running.job is not None:
            if running.ending:  # it ended; its end is being written
                raise _not_cancelable(task_id, running.ending)
            running.job.cancel()
            await asyncio.gather(running.job, return_exceptions=True)
            doc = running.doc  # its end as stored
        else:
            found = await self.board.get(task_id)
            if found is None:
                raise _not_found(task_id)
            if wire.task_state(found) in wire.TERMINAL:
                raise _not_cancelable(task_id, wire.task_state(found))
            status = {"state": wire.state_name("canceled"), "timestamp": wire.timestamp()}
            canceled = {**found, "status": status}  # (``found`` may be this host's cached copy)
            doc = await self.board.save(canceled)
            if doc is not canceled:  # it ended first (on the host running it): that end stands
                raise _not_cancelable(task_id, wire.task_state(doc))
            if self.board.store.shared:  # the task may run on another host: tell it
                await self.board.store.publish(CANCEL_TOPIC, task_id)
        task = _view(doc, None)
        return _result(request_id, wire.task_to_v03(task) if legacy else task)

    async def _list_tasks(self, params: JsonObject, request_id: Any, legacy: bool) -> Response:
        size = _integer(params.get("pageSize"), "pageSize must be a positive integer")
        if size is None:
            size = DEFAULT_PAGE
        elif size < 1:
            raise wire.RpcError(wire.INVALID_PARAMS, "pageSize must be a positive integer")
        history_length = _history_length(params.get("historyLength"))
        with_artifacts = _flag(params, "includeArtifacts", False)
        size = min(size, MAX_PAGE)
        token = params.get("pageToken") or "0"
        # the tokens this server gives out are offsets: digits, and nowhere near 2**63
        if not isinstance(token, str) or not _ascii_digits(token) or len(token) > 15:
            raise wire.RpcError(wire.INVALID_PARAMS, f"unknown pageToken {token!r}")
        context_id = params.get("contextId")
        if context_id is not None and not isinstance(context_id, str):
            # read as text, [] or 0 listed every conversation's tasks and 5 those of "5"
            raise wire.RpcError(
                wire.INVALID_PARAMS, f"contextId must be a string, not {context_id!r}"[:200]
            )
        docs, total = await self.board.page(
            context_id=context_id or "",
            state=_state_filter(params.get("status")),
            updated_after=_timestamp_filter(params.get("statusTimestampAfter")),
            limit=size,
            offset=int(token),
        )
        tasks = [_view(d, history_length, with_artifacts) for d in docs]
        result: JsonObject = {"tasks": tasks, "pageSize": size, "totalSize": total}
        following = int(token) + len(docs)
        if following < total:
            result["nextPageToken"] = str(following)
        return _result(request_id, result)

    # -- running tasks -----------------------------------------------------------------------------

    async def _start(
        self, params: JsonObject, *, listen: bool = False, creator_waits: bool = False
    ) -> RunningTask:
        """Create (or resume) the task a message asks for and start it. A task whose creator
        waits for its end is written to the store when it ends or pauses (see tasks.py)."""
        message = params.get("message")
        if isinstance(message, dict):
            message = wire.normal_message(message)
        if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
            raise wire.RpcError(wire.INVALID_PARAMS, "params.message with parts is required")
        wire.check_message(message)
        await self._check_not_ended(message)
        waiting = self._waiting_for_approval(message)
        if waiting is not None:
            if listen:
                waiting.listen()
            waiting.snapshot = _view(waiting.doc, None)  # the reply's stream starts from here
            return waiting
        prompt = wire.text_of(message["parts"]).strip()
        if not prompt:
            raise wire.RpcError(
                wire.INVALID_PARAMS,
                "the message has no content for the model: it needs a part with text, data or "
                "a file (raw bytes, a url or a filename)",
            )
        metadata = {**_object(params, "metadata"), **_object(message, "message.metadata")}
        held = self._capabilities(metadata.get(OVERRIDE_KEY))
        running = await self._task_for(message, prompt)
        running.capabilities = held
        if listen:
            running.listen()
        skill_id = metadata.get("skillId") or metadata.get("skill_id") or metadata.get("skill")
        unknown = ""
        if isinstance(skill_id, str) and skill_id:
            running.skill = next((s for s in self.toolkit.skills if s.name == skill_id), None)
            if running.skill is None and skill_id != "chat":
                known = ", ".join(s.name for s in self.toolkit.skills) or "none"
                unknown = f"this agent has no skill {skill_id!r} (its skills: {known})"
            elif running.skill is not None:
                running.doc.setdefault("metadata", {})["skillId"] = skill_id
        if unknown:
            running.set_status("rejected", unknown)
            running.snapshot = _view(running.doc, None)
            await self._save_unstarted(running)
            running.publish({})  # the end of a listener's stream
            return running
        if listen or not creator_waits or self.board.store.shared:
            await self._save_unstarted(running)
        running.snapshot = _view(running.doc, None)  # as it stands before it starts
        self.board.running[running.id] = running
        # Eagerly: the task's first step (up to sending the model request) runs now, in its task.
        running.job = start_eagerly(self._execute(running))
        return running

    async def _save_unstarted(self, running: RunningTask) -> None:
        """Write a task ``_start`` has not started (nor registered) yet. The interrupted task a
        message resumes may have been ended through another host since it was read: that end
        stands, and the message is refused as it would have been had it come after it. Or
        another reply may have resumed it since (through another host, at the same moment):
        its write is a compare-and-set against the task as it was read, so only one of them
        goes on, and the other is refused, having run nothing."""
        stored = await self.board.save(running.doc, expected=running.resumes)
        if stored is not running.doc:
            state = wire.task_state(stored)
            if state in wire.TERMINAL:
                raise _ended_already(running.id, state)
            raise wire.RpcError(
                wire.INVALID_REQUEST,
                f"task {running.id!r} is being resumed through another request; get the task "
                "(GetTask) to follow it, and reply once it asks for input again",
            )
        running.resumes = None
        running.stored = True  # (not yet in the board's running tasks, whose flag save sets)

    async def _task_for(self, message: JsonObject, prompt: str) -> RunningTask:
        """A new task for ``message``, or the interrupted task it answers."""
        task_id = message.get("taskId")
        if isinstance(task_id, str) and task_id:
            if task_id in self.board.running:
                raise wire.RpcError(wire.INVALID_REQUEST, f"task {task_id!r} is still running")
            doc = await self.board.get(task_id)
            if doc is None:
                raise _not_found(task_id)
            _check_same_context(message, doc)
            if wire.task_state(doc) not in wire.INTERRUPTED:
                raise _ended_already(task_id, wire.task_state(doc))
            if approval_of(doc) is not None:  # its approval waits in another host's job
                raise wire.RpcError(
                    wire.INVALID_REQUEST,
                    f"task {task_id!r} waits for an approval on the host that runs it; send "
                    "the reply there",
                )
            # The task as read is what its write expects to replace (see _save_unstarted): it
            # goes on as a copy, so it stays as read (a cached copy is not changed either).
            running = RunningTask(
                copy.deepcopy(doc), prompt, history=_chat(doc.get("history") or [])
            )
            running.resumes = doc
        else:
            context_id = message.get("contextId")
            if isinstance(context_id, str) and context_id:
                history = await self.board.conversation(context_id)
            else:
                context_id, history = secret_id(), []
            doc = {
                "id": secret_id(),
                "contextId": context_id,
                "status": {"state": wire.state_name("submitted"), "timestamp": wire.timestamp()},
                "history": [],
            }
            running = RunningTask(doc, prompt, history=history)
        stored = {**message, "taskId": running.id, "contextId": running.doc["contextId"]}
        stored.setdefault("messageId", new_id())
        running.doc.setdefault("history", []).append(stored)
        return running

    async def _execute(self, running: RunningTask) -> None:
        running.set_status("working")
        # Always: a SubscribeToTask (or a GetTask) coming later sees the tool being called too,
        # not only a streaming creator; set_status tells only the listeners there are.
        on_event = _progress_reporter(running)
        # A call needing approval puts the task in input-required until the client answers.
        # The session is the task's conversation (its contextId): its tools' state is that
        # conversation's, kept across its tasks and apart from every other conversation's.
        session = dataclasses.replace(
            self.toolkit.session,
            id=_session_of_context(str(running.doc["contextId"])),
            # A remote caller's calls, audited as such (and durably: it does not share this
            # host's fate, as an in-process caller does)
            transport="a2a",
            capabilities=running.capabilities or self.toolkit.session.capabilities,
            approver=functools.partial(self._ask_approval, running),
        )
        try:
            result = await self.client.run(
                running.prompt,
                toolkit=self.toolkit,
                system=self._system(running.skill),
                history=running.history,
                max_turns=self.max_turns,
                on_event=on_event,
                session=session,
            )
        except asyncio.CancelledError:
            state, text = ("failed", STOPPED) if self._stopping else ("canceled", "")
            await self._finish(running, state, text)
            raise
        except Exception as exc:
            # The caller learns that the run failed, and how; the details (the model's URL, the
            # provider's own words, which may echo a credential) stay in this server's log.
            logger.warning("A2A task %s failed: %s", running.id, exc, exc_info=exc)
            await self._finish(running, "failed", _failure_for_caller(exc))
            return
        if result.stop_reason == "max_turns":  # cut off while still calling tools: its last
            # text (often none) is not an answer, and "completed" would say it is
            await self._finish(
                running,
                "failed",
                f"the model was still calling tools after {self.max_turns} turns "
                "(the agent's max_turns) and gave no answer"
                + (f"; its last words: {result.text}" if result.text.strip() else ""),
            )
        else:
            await self._finish(running, "completed", answer=result.text)

    def _capabilities(self, asked: Any) -> CapabilitySet | None:
        """The task's capability set when the message asks to adjust the toolkit's."""
        if asked is None:
            return None
        if not isinstance(asked, dict) or not isinstance(asked.get("capabilities", []), list):
            raise wire.RpcError(
                wire.INVALID_PARAMS, f"{OVERRIDE_KEY} must be {{strategy, capabilities}}"
            )
        try:
            return session_capabilities(
                self.toolkit.capabilities,
                self.toolkit.capability_policy,
                str(asked.get("strategy", "inherit")),
                [str(tag) for tag in asked.get("capabilities", [])],
            )
        except (CapabilityError, ConfigError) as exc:
            raise wire.RpcError(wire.INVALID_PARAMS, str(exc)) from None

    async def _ask_approval(self, running: RunningTask, request: ApprovalRequest) -> bool:
        """Ask the A2A client: the task waits in input-required for 'approve' or 'deny'. The
        calls of one turn that need approval are asked one after another: the task shows one
        approval at a time, and one reply answers the approval it shows."""
        if running.asking is None:
            running.asking = asyncio.Lock()
        async with running.asking:
            return await self._ask_one_approval(running, request)

    async def _ask_one_approval(self, running: RunningTask, request: ApprovalRequest) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        running.approval = future
        arguments = json.dumps(dict(request.arguments), ensure_ascii=False, default=str)
        status = running.status(
            "input-required",
            f"Approval needed: {request.reason}. Tool {request.tool_name!r} with arguments "
            f"{arguments}. Reply 'approve' or 'deny' in this task.",
        )
        status["message"]["metadata"] = {
            "approval": {
                "approvalId": request.id,
                "toolName": request.tool_name,
                "arguments": dict(request.arguments),
                "reason": request.reason,
            }
        }
        before, running.doc["status"] = running.doc["status"], status
        asked = running.doc
        try:
            if await self.board.save(asked) is not asked:
                # The store holds an end of the task: it was ended through another host, whose
                # notice did not reach this one. Nothing is asked (nor told, nor waited for):
                # the board stopped this job, which is cancelled at its next await, here, and
                # ends with the stored end. (Were it not, it is stopped all the same.)
                running.doc["status"] = before
                await asyncio.sleep(0)
                raise asyncio.CancelledError
            if not future.done():  # (a reply to what GetTask here showed may have come first)
                running.publish(status_update(running.doc))  # told once it is stored
                running.pause()
                request.shown()  # asked behind others, perhaps: its time to answer starts now
            return await future
        finally:
            running.pause(False)
            running.approval = None
            if running.state == "input-required":
                running.set_status("working")

    async def _check_not_ended(self, message: JsonObject) -> None:
        """With a shared store, a reply to an approval a task running here waits for is
        refused when the store holds an end of the task (canceled through another host, whose
        notice did not reach this one): the task is stopped, and the call is not run."""
        running = self.board.running.get(str(message.get("taskId") or ""))
        if not self.board.store.shared or running is None or running.approval is None:
            return
        doc = await self.board.get(running.id)  # stops the task when it ended elsewhere
        if doc is not None and wire.task_state(doc) in wire.TERMINAL:
            raise _ended_already(running.id, wire.task_state(doc))

    def _waiting_for_approval(self, message: JsonObject) -> RunningTask | None:
        """The running task this message answers an approval of, with the answer given."""
        running = self.board.running.get(str(message.get("taskId") or ""))
        if running is None or running.approval is None or running.approval.done():
            return None
        _check_same_context(message, running.doc)
        answer = _approval_answer(message)
        if answer is None:
            raise wire.RpcError(
                wire.INVALID_PARAMS,
                f"task {running.id!r} waits for an approval: reply 'approve' or 'deny'",
            )
        stored = {**message, "taskId": running.id, "contextId": running.doc["contextId"]}
        stored.setdefault("messageId", new_id())
        running.doc.setdefault("history", []).append(stored)
        running.approval.set_result(answer)
        running.pause(False)  # answered: it no longer waits for input, it works again
        running.set_status("working")
        return running

    async def _finish(
        self, running: RunningTask, state: str, text: str = "", *, answer: str | None = None
    ) -> None:
        """End the task in ``state`` (completed with ``answer``): record its end, then tell it
        to the listeners and to whoever waits. Another host may have recorded an end first (a
        cancel through it): that end is the task's, and is what they all get instead."""
        end, updates = _end_of(running, state, text, answer)
        running.ending = state
        saving = asyncio.ensure_future(self._record_end(end))
        stored = end
        try:
            try:
                stored = await asyncio.shield(saving)
            except asyncio.CancelledError:  # the job was stopped (close()) as its end was written:
                stored = await saving  # it is still recorded, or a restart would call it failed
                raise
        finally:
            running.doc = stored
            for update in updates if stored is end else [status_update(stored)]:
                running.publish(update)
            self.board.forget(running)
            # Its state stays in the store for the conversation's next task; this host's cached
            # copy goes, or a server that talks to many conversations would keep them all.
            if not any(
                other.doc["contextId"] == running.doc["contextId"]
                for other in self.board.running.values()
            ):
                self.toolkit.state.forget(_session_of_context(str(running.doc["contextId"])))
            running.publish({})  # the end of every listener's stream

    async def _record_end(self, end: JsonObject) -> JsonObject:
        """Record a task's end; the task as the store holds it then. One that cannot be
        recorded (the store away beyond its ``reconnect_timeout``) is told as it is, and
        written again every ``END_RETRY_INTERVAL`` until it is: else the store would hold the
        task as working for ever, and, this host being alive, every host would report it so."""
        try:
            return await self.board.save(end)
        except Exception as exc:
            logger.warning(
                "could not record the end of A2A task %s (tried again every %s s): %s",
                end["id"],
                END_RETRY_INTERVAL,
                exc,
            )
            self.board.unwritten[str(end["id"])] = end
            if self._rewriting is None or self._rewriting.done():
                self._rewriting = asyncio.ensure_future(self._rewrite_ends())
            return end

    async def _rewrite_ends(self) -> None:
        while self.board.unwritten:
            await asyncio.sleep(END_RETRY_INTERVAL)
            try:
                await self.board.store_unwritten()
            except Exception as exc:
                logger.warning(
                    "could not record the ends of %d A2A tasks yet: %s",
                    len(self.board.unwritten),
                    exc,
                )

    async def _last_rewrite(self) -> None:
        """As the server stops, one last attempt at the ends not recorded yet (bounded: the
        store may still be away). Those left are failed by whoever reads them next: the next
        host to judge this one gone, or this store's next server."""
        if self._rewriting is not None:
            self._rewriting.cancel()
            await asyncio.gather(self._rewriting, return_exceptions=True)
            self._rewriting = None
        if not self.board.unwritten:
            return
        try:
            await asyncio.wait_for(self.board.store_unwritten(), 5.0)
        except Exception as exc:
            logger.warning(
                "the ends of %d A2A tasks were never recorded (%s): they will be read as "
                "failed, the server having stopped",
                len(self.board.unwritten),
                str(exc) or "timed out",
            )

    def _system(self, skill: Skill | None) -> str:
        base = (
            self.instructions
            or self.client.system
            or (
                f"You are {self.name}, an agent others reach over the A2A protocol. "
                f"{self.description}"
            )
        )
        if skill is None:
            return base
        return f"{base}\n\nFollow the skill {skill.name!r}:\n{skill.instructions}"


# -- helpers ---------------------------------------------------------------------------------------


_YES = frozenset({"approve", "approved", "yes", "y", "allow", "ok"})
_NO = frozenset({"deny", "denied", "no", "n", "reject"})


def _own_host_id(candidate: str) -> str:
    """The id a server runs under among the hosts sharing its store: new at every start, after
    its toolkit's host id (the one its calls are audited with) when it has one. A host started
    again under a name it was given must not take the unfinished tasks of its earlier run for
    its own, nor a toolkit served twice in one process the other server's."""
    run = new_id()[:8]
    return f"{candidate}.{run}" if candidate else run


def _approval_answer(message: JsonObject) -> bool | None:
    """True/False from a reply: metadata ``approved``, or a text starting approve/deny."""
    metadata = message.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("approved"), bool):
        return bool(metadata["approved"])
    words = wire.text_of(message.get("parts") or []).strip().lower().split()
    first = words[0].strip(".!,") if words else ""
    if first in _YES:
        return True
    if first in _NO:
        return False
    return None


def _package_version() -> str:
    from toolmesh import __version__

    return __version__


def _card_skill(skill: Skill) -> JsonObject:
    tags = skill.metadata.get("tags")
    examples = skill.metadata.get("examples")
    entry: JsonObject = {
        "id": skill.name,
        "name": skill.name,
        "description": skill.summary,  # bounded: the card is fetched by every caller
        "tags": [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else ["skill"],
    }
    if isinstance(examples, list):
        entry["examples"] = [e for e in examples if isinstance(e, str)]
    return entry


def _chat(messages: list[JsonObject]) -> list[ChatMessage]:
    return [
        ChatMessage("assistant" if wire.is_agent(m) else "user", wire.text_of(m.get("parts")))
        for m in messages
    ]


def _failure_for_caller(exc: Exception) -> str:
    """What a remote caller is told of a failed run: the kind of failure, not its details."""
    if isinstance(exc, ProviderError):
        answered = f" (it answered HTTP {exc.status})" if exc.status else " (no answer)"
        return f"the agent's model provider failed{answered}; the agent's log has the details"
    if isinstance(exc, CallTimeout):
        return "the agent ran out of time before it had an answer"
    return f"the agent failed ({type(exc).__name__}); the agent's log has the details"


def _end_of(
    running: RunningTask, state: str, text: str, answer: str | None
) -> tuple[JsonObject, list[JsonObject]]:
    """The task ended in ``state`` (completed with ``answer``), as a new document, and the
    stream items that tell it. The running task's own document is left as it is, and shown,
    until the store has its end."""
    doc = running.doc
    end = {**doc, "history": list(doc.get("history") or [])}
    updates: list[JsonObject] = []
    if answer is not None:
        artifact = {"artifactId": new_id(), "name": "response", "parts": [{"text": answer}]}
        end["artifacts"] = [artifact]
        end["history"].append(
            wire.message("agent", answer, context_id=doc["contextId"], task_id=running.id)
        )
        update = {
            "taskId": running.id,
            "contextId": doc["contextId"],
            "artifact": artifact,
            "lastChunk": True,
        }
        updates.append({"artifactUpdate": update})
    end["status"] = running.status(state, text)
    updates.append(status_update(end))
    return end, updates


def _progress_reporter(running: RunningTask) -> Callable[[RunEvent], None]:
    def report(event: RunEvent) -> None:
        if event.kind == "tool_call" and event.call is not None:
            running.set_status("working", f"calling {event.call.name}")

    return report


async def _bounded_body(request: Request) -> bytes:
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > MAX_REQUEST_BYTES:
            raise wire.RpcError(
                wire.INVALID_REQUEST, f"the request is larger than {MAX_REQUEST_BYTES} bytes"
            )
    return bytes(chunks)


def _request_id(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int | None):
        return None
    return value


def _check_request(payload: Any) -> tuple[str, JsonObject]:
    if not isinstance(payload, dict):
        raise wire.RpcError(wire.INVALID_REQUEST, "a request must be a JSON object")
    if payload.get("jsonrpc") != "2.0":
        raise wire.RpcError(wire.INVALID_REQUEST, "'jsonrpc' must be exactly '2.0'")
    if "id" not in payload:
        # A notification would get no answer, but every A2A method has one to give (a task, a
        # task id): it is refused, not run unseen. The a2a-sdk's server runs it and answers it.
        raise wire.RpcError(
            wire.INVALID_REQUEST,
            "'id' is required: A2A methods answer every request, and a JSON-RPC notification "
            "(a request without an id) cannot be answered",
        )
    request_id = payload["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
        raise wire.RpcError(wire.INVALID_REQUEST, "'id' must be a string, an integer or null")
    method = payload.get("method")
    if not isinstance(method, str) or not method:
        raise wire.RpcError(wire.INVALID_REQUEST, "'method' is required")
    params = payload.get("params", {})
    if not isinstance(params, dict):
        raise wire.RpcError(wire.INVALID_PARAMS, "'params' must be an object")
    return method, params


def _check_version(version: str | None) -> None:
    if version and not version.strip().startswith("1."):
        raise wire.RpcError(
            wire.VERSION_NOT_SUPPORTED,
            f"A2A version {version!r} is not supported by the 1.0 methods; "
            "v0.3 clients use message/send and friends",
        )


async def _no_push_notifications(params: JsonObject, request_id: Any, legacy: bool) -> Response:
    raise wire.RpcError(wire.PUSH_NOT_SUPPORTED, "this agent does not send push notifications")


async def _no_extended_card(params: JsonObject, request_id: Any, legacy: bool) -> Response:
    raise wire.RpcError(
        wire.EXTENDED_CARD_NOT_CONFIGURED, "this agent has no extended card; its card is public"
    )


def _task_id(params: JsonObject) -> str:
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise wire.RpcError(wire.INVALID_PARAMS, "params.id (the task id) is required")
    return task_id


def _ended_already(task_id: str, state: str) -> wire.RpcError:
    return wire.RpcError(
        wire.INVALID_REQUEST,
        f"task {task_id!r} is {state}; send a new message with its contextId to continue the "
        "conversation",
    )


def _not_cancelable(task_id: str, state: str) -> wire.RpcError:
    return wire.RpcError(
        wire.TASK_NOT_CANCELABLE, f"task {task_id!r} is {state} and cannot be canceled"
    )


def _check_same_context(message: JsonObject, doc: JsonObject) -> None:
    """A message that names a task and another conversation is refused (A2A: an agent rejects a
    contextId that differs from its task's), not taken into the task's conversation unseen."""
    asked = message.get("contextId")
    if asked and asked != doc.get("contextId"):
        raise wire.RpcError(
            wire.INVALID_PARAMS,
            f"message.contextId is not the contextId of task {doc.get('id')!r}: a message "
            "answering a task belongs to that task's conversation (or leave contextId out)",
        )


def _not_found(task_id: str) -> wire.RpcError:
    return wire.RpcError(wire.TASK_NOT_FOUND, f"task {task_id!r} not found")


def _view(
    doc: JsonObject, history_length: int | None, include_artifacts: bool = True
) -> JsonObject:
    """A task as answered: history cut to its last ``history_length`` messages if asked."""
    view = dict(doc)
    history = list(view.get("history") or [])
    view["history"] = history
    if history_length is not None:
        view["history"] = history[-history_length:] if history_length > 0 else []
        if not view["history"]:
            view.pop("history")
    if not include_artifacts:
        view.pop("artifacts", None)
    return view


def _history_length(value: Any) -> int | None:
    """A request's historyLength: None (the whole history) when absent. A negative or
    non-integer one is invalid (as the a2a-sdk's servers answer), not silently "none"."""
    refusal = f"historyLength must be a non-negative integer, not {value!r}"
    number = _integer(value, refusal)
    if number is not None and number < 0:
        raise wire.RpcError(wire.INVALID_PARAMS, refusal[:200])
    return number


_INT32 = range(-(2**31), 2**31)


def _integer(value: Any, refusal: str) -> int | None:
    """An int32 field of the request as the protobuf JSON mapping (the a2a-sdk's parser) reads
    it: a number with no fraction (``5``, ``5.0``) or its text (``"5"``, ``"1e1"``); None when
    absent. Anything else, a boolean included, is refused with ``refusal``."""
    number: int | None = None
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and 0 < len(value) <= 32 and value.strip() == value:
        try:
            number = int(value)
        except ValueError:
            with contextlib.suppress(ValueError):
                as_float = float(value)
                if as_float.is_integer():
                    number = int(as_float)
    if number is None or number not in _INT32:
        raise wire.RpcError(wire.INVALID_PARAMS, refusal[:200])
    return number


def _ascii_digits(text: str) -> bool:
    """Digits 0-9 only: ``str.isdigit`` is true of "²" too, which ``int`` refuses."""
    return text.isascii() and text.isdigit()


def _flag(params: JsonObject, key: str, default: bool) -> bool:
    """An optional boolean field: the text "false" must not count as true."""
    value = params.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise wire.RpcError(
            wire.INVALID_PARAMS, f"{key} must be true or false, not {value!r}"[:200]
        )
    return value


def _timestamp_filter(value: Any) -> float:
    """ListTasks' ``statusTimestampAfter`` (RFC 3339 text) as epoch seconds, 0 when absent.
    Read as the protobuf JSON mapping reads a Timestamp: a date alone, or a time without its
    offset, is refused rather than taken as UTC (it may have meant the sender's local time)."""
    if value is None or value == "":
        return 0.0
    try:
        if not isinstance(value, str) or not _RFC3339.fullmatch(value):
            raise ValueError
        return wire.parse_timestamp(value)
    except ValueError:
        raise wire.RpcError(
            wire.INVALID_PARAMS,
            f"statusTimestampAfter must be an RFC 3339 time, not {value!r}"[:200],
        ) from None


_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)", re.ASCII)


def _state_filter(value: Any) -> str:
    """The short state a ListTasks ``status`` asks for ("" for any); an unknown one is invalid
    rather than a filter that matches nothing."""
    value = wire.enum_name(value, wire.TASK_STATES)  # the mapping allows 3 for COMPLETED
    if value in (None, "", "TASK_STATE_UNSPECIFIED"):
        return ""
    state = wire.short_state(value)
    if state == "unknown":
        raise wire.RpcError(wire.INVALID_PARAMS, f"unknown task state {value!r}"[:200])
    return state


def _dumps(value: Any) -> bytes:
    return to_json(value)  # compact UTF-8 JSON, in Rust: a few times json.dumps's speed


def _result(request_id: Any, result: Any) -> Response:
    return Response(
        _dumps({"jsonrpc": "2.0", "id": request_id, "result": result}),
        media_type="application/json",
    )


def _error(request_id: Any, error: wire.RpcError) -> Response:
    return Response(
        _dumps({"jsonrpc": "2.0", "id": request_id, "error": error.to_json()}),
        media_type="application/json",
    )


def _event_stream(
    request_id: Any,
    legacy: bool,
    first: JsonObject,
    running: RunningTask,
    queue: asyncio.Queue[JsonObject] | None,
) -> Response:
    """The stream of ``first`` and then what ``queue`` gets (nothing more without one)."""

    async def events() -> AsyncIterator[bytes]:
        try:
            item = first
            while item:
                shown = wire.stream_item_to_v03(item) if legacy else item
                yield encode_event(_dumps({"jsonrpc": "2.0", "id": request_id, "result": shown}))
                if _interrupts(item) or queue is None:
                    break  # the task waits for its caller: the stream ends, as A2A's servers do
                item = await queue.get()
        finally:
            with contextlib.suppress(ValueError):
                if queue is not None:
                    running.listeners.remove(queue)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _object(params: JsonObject, key: str) -> JsonObject:
    """An optional object field of the request (``a.b`` names a nested one in the error)."""
    value = params.get(key.rpartition(".")[2])
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise wire.RpcError(wire.INVALID_PARAMS, f"{key} must be an object, not {value!r}"[:200])
    return value


def _interrupts(item: JsonObject) -> bool:
    """Whether a stream item moves the task to a state where it waits for its caller."""
    update = item.get("statusUpdate")
    return isinstance(update, dict) and wire.task_state(update) in wire.INTERRUPTED


class _AsgiEndpoint:
    """The JSON-RPC endpoint as a bare ASGI app (Starlette's request/response wrapper and its
    exception handling cost more than this endpoint's own work)."""

    def __init__(self, handle: Callable[[Request], Awaitable[Response]]) -> None:
        self.handle = handle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        response = await self.handle(Request(scope, receive))
        await response(scope, receive, send)


_PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _session_of_context(context_id: str) -> str:
    """The session (state, audit) of an A2A conversation: ``a2a:`` and its contextId, or ``a2a:~``
    and the contextId's digest when it is long or holds other characters (a state key stays
    short and plain whatever a client sends). ``~`` is not a character of a plain contextId, so
    no contextId is given another one's session by naming its digest."""
    if _PLAIN_ID.fullmatch(context_id):
        return f"a2a:{context_id}"
    digest = hashlib.sha256(context_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"a2a:~{digest}"
