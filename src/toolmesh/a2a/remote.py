"""Remote A2A agents as tools: ``agent(card_url)`` -> ``agent_tools`` -> one Tool per skill.

A call of such a tool sends the task to the agent (``SendMessage``, not blocking) and polls
``GetTask`` until the task ends: after 50 ms, then twice as long each time, up to ``poll_every``.
When the agent's card says it streams, the call uses ``SendStreamingMessage`` instead and turns
the status and artifact updates into ToolEvents. A task that needs input or authentication ends
the call at once with a result saying what the agent needs; calling the same tool again (in the
same session) answers it. At the agent's ``timeout``, or when the call is cancelled, the task is
cancelled with ``CancelTask``, in the background (a timeout is answered at once); a first request
still in flight then is let finish, as its answer names the task. An answer (or one streamed
event) larger than ``MAX_ANSWER_BYTES`` fails the call. Every result carries ``{agent, taskId,
state, polls, ms}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from toolmesh import strictjson
from toolmesh.a2a import wire
from toolmesh.a2a.card import (
    WELL_KNOWN_CARD,
    Dialect,
    Endpoint,
    check_card,
    endpoint_of,
    skills_of,
)
from toolmesh.errors import ConfigError, TransportError, excerpt
from toolmesh.models import ToolDefinition, ToolErrorCode, ToolResult
from toolmesh.tools import Tool, ToolContext
from toolmesh.transports.bodies import read_at_most
from toolmesh.transports.sse import read_events

__all__ = ["TASK_SCHEMA", "Agent", "Peer", "agent", "agent_tools", "tools_from_card"]

logger = logging.getLogger("toolmesh.a2a")

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What to ask the agent to do."}},
    "required": ["task"],
    "additionalProperties": False,
}
FIRST_POLL = 0.05
CARD_TIMEOUT = 30.0
REQUEST_TIMEOUT = 30.0
# Of one answer of an agent (or one event of its stream); past it, refused: a peer cannot make
# the caller hold more (toolmesh's own server takes requests up to 4 MB).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
CANCEL_TIMEOUT = 5.0
DEADLINE_MARGIN = 0.1  # answer before the pipeline's deadline: the result is the agent's
# Sessions whose last call left a remote task waiting for input, kept per skill: a session that
# never calls again leaves its entry, so the oldest go first beyond this many.
MAX_WAITING_SESSIONS = 10_000
DONE = wire.TERMINAL | wire.INTERRUPTED

_ids = itertools.count(1)
_background: set[asyncio.Task[Any]] = set()


@dataclass(frozen=True, slots=True)
class Agent:
    """A remote agent: where its card is, the headers its requests carry, how long a task may
    take (seconds) and how often to poll it. ``name`` is an identifier (a config key) only:
    tool names come from the card."""

    card: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 300.0
    poll_every: float = 1.0
    name: str = ""

    @property
    def card_url(self) -> str:
        """The card's URL; a bare origin gets the well-known path (as its path: a query stays
        the query, ``https://h?x=1`` -> ``https://h/.well-known/agent-card.json?x=1``)."""
        parts = urlsplit(self.card)
        if parts.path in ("", "/"):
            return urlunsplit(parts._replace(path=WELL_KNOWN_CARD))
        return self.card


def agent(
    card: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 300,
    poll_every: float = 1.0,
    *,
    name: str = "",
) -> Agent:
    """Point at a remote agent's card (``https://host/.well-known/agent-card.json``)."""
    if not isinstance(card, str) or not card.startswith(("http://", "https://")):
        raise ConfigError(f"an agent card must be an http(s) URL, not {card!r}")
    if not timeout or timeout <= 0:
        raise ConfigError(f"agent timeout must be a positive number of seconds, not {timeout!r}")
    if not poll_every or poll_every <= 0:
        raise ConfigError(f"poll_every must be a positive number of seconds, not {poll_every!r}")
    for key, value in (headers or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"agent headers must map text to text; {key!r} does not")
    return Agent(card, dict(headers or {}), float(timeout), float(poll_every), name)


async def agent_tools(ag: Agent | str) -> list[Tool]:
    """Fetch the agent's card and return one Tool per skill (nothing is registered)."""
    from toolmesh import a2a as package  # looked up here so _fetch_card can be replaced

    described = agent(ag) if isinstance(ag, str) else ag
    url = described.card_url
    card = await package._fetch_card(url, dict(described.headers), min(described.timeout, 30.0))
    return tools_from_card(described, check_card(card, url), url)


def tools_from_card(
    ag: Agent, card: Mapping[str, Any], card_url: str, peer: Peer | None = None
) -> list[Tool]:
    """One Tool per skill of ``card``: ``sanitize(card.name)_sanitize(skill.id or name)``."""
    from toolmesh.toolkit import sanitize_name

    endpoint = endpoint_of(card, card_url)
    peer = peer or Peer(endpoint, ag.headers)
    agent_name = str(card["name"]).strip()
    prefix = sanitize_name(agent_name)
    tools = []
    for skill in skills_of(card):
        key = str(skill.get("id") or skill.get("name")).strip()
        definition = ToolDefinition(
            name=sanitize_name(f"{prefix}_{sanitize_name(key)}"),
            description=_first_text(skill.get("description"), skill.get("name"), key),
            tags=[t for t in skill.get("tags") or [] if isinstance(t, str)],
            toolkit=agent_name,
            kind="a2a",
        )
        run = SkillCall(ag, agent_name, key, peer)
        tools.append(Tool(definition, run, source="a2a", input_schema=TASK_SCHEMA))
    return tools


# -- the JSON-RPC peer -----------------------------------------------------------------------------


class Peer:
    """JSON-RPC to one agent endpoint, in its dialect (switched once if the peer turns out to
    speak the other one). Uses a shared HTTP client while ``open``, else one per call."""

    def __init__(self, endpoint: Endpoint, headers: Mapping[str, str]) -> None:
        self.url = endpoint.url
        self.dialect: Dialect = endpoint.dialect
        self.streaming = endpoint.streaming
        self.headers = {"Content-Type": "application/json", **headers}
        self._switched = False
        self._shared: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settling: set[asyncio.Task[None]] = set()  # calls' cleanups (SkillCall._settle)

    def new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=self.headers, timeout=httpx.Timeout(REQUEST_TIMEOUT, read=None)
        )

    def open(self) -> None:
        self._shared = self.new_client()
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        # The calls' cleanups first (each ends within CANCEL_TIMEOUT): one may wait for a first
        # request on the shared client, whose answer names the task it cancels.
        here = asyncio.get_running_loop()
        settling = [job for job in self._settling if job.get_loop() is here]
        if settling:
            await asyncio.wait(settling)
        shared, self._shared = self._shared, None
        if shared is not None:
            await shared.aclose()

    def client(self) -> tuple[httpx.AsyncClient, bool]:
        """The shared client while open (on this loop), else a new one, and whether it is new
        (then the caller closes it)."""
        if self._shared is not None and self._loop is asyncio.get_running_loop():
            return self._shared, False
        return self.new_client(), True

    def track(self, job: asyncio.Task[None]) -> None:
        """Keep a call's cleanup until it ends, and have ``close`` wait for it."""
        for jobs in (self._settling, _background):
            jobs.add(job)
            job.add_done_callback(jobs.discard)

    def _body(
        self, method: str, params: dict[str, Any], dialect: Dialect
    ) -> tuple[dict[str, Any], dict[str, str]]:
        if dialect == "0.3":
            name = wire.METHODS_V03[method]
            return _rpc(name, wire.params_to_v03(method, params)), {}
        return _rpc(method, params), {wire.VERSION_HEADER: wire.A2A_VERSION}

    async def call(self, http: httpx.AsyncClient, method: str, params: dict[str, Any]) -> Any:
        """The result of one request, in the 1.0 shape; RpcError for an error answer."""
        dialect = self.dialect
        try:
            return await self._call(http, method, params, dialect)
        except wire.RpcError as exc:
            if not self._may_retry(exc, dialect):
                raise
            other = _other(dialect)
            try:
                result = await self._call(http, method, params, other)
            except wire.RpcError as retry:
                if _refuses_dialect(retry):  # the peer lacks the method in both (a CancelTask
                    raise exc from None  # it does not offer): its other calls keep the dialect
                self._switch(other)
                raise retry from None
            self._switch(other)
            return result

    async def _call(
        self, http: httpx.AsyncClient, method: str, params: dict[str, Any], dialect: Dialect
    ) -> Any:
        body, headers = self._body(method, params, dialect)
        async with http.stream("POST", self.url, json=body, headers=headers) as response:
            answer = await _read_answer(response, self.url)
        payload = _answer(response, answer, self.url)
        return self._result(method, payload["result"], dialect)

    def _may_retry(self, exc: wire.RpcError, dialect: Dialect) -> bool:
        """Whether a request refused in ``dialect`` goes again in the other one: not once the
        peer was found to speak ``dialect`` (each dialect is tried once, ever)."""
        return _refuses_dialect(exc) and not (self._switched and self.dialect == dialect)

    def _switch(self, dialect: Dialect) -> None:
        """Speak ``dialect`` from now on: the peer answered in it. Only then is the switch made,
        so the calls running meanwhile keep the dialect that works (a CancelTask in the
        background trying the other one does not send them there)."""
        if self.dialect != dialect:
            logger.info("A2A peer %s speaks v%s; switching", self.url, dialect)
        self._switched = True
        self.dialect = dialect

    def _result(self, method: str, result: Any, dialect: Dialect) -> Any:
        if dialect == "0.3":
            if method == "SendMessage":
                return wire.from_v03(result)
            return wire.task_from_v03(result)
        if method == "SendMessage" and isinstance(result, dict) and "status" in result:
            return {"task": result}  # a peer that answers with the bare Task
        return result

    async def stream(
        self, http: httpx.AsyncClient, params: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any]]:
        """The events of a SendStreamingMessage, each as a 1.0 StreamResponse."""
        response, dialect = await self._open_stream(http, params)
        try:
            async for _event, data in read_events(response, MAX_ANSWER_BYTES):
                payload = _decode(data, self.url)
                if "error" in payload:
                    raise _rpc_error(payload["error"])
                item = payload.get("result")
                if dialect == "0.3":
                    yield wire.stream_item_from_v03(item)
                elif isinstance(item, dict):
                    yield item
        finally:
            await response.aclose()

    async def _open_stream(
        self, http: httpx.AsyncClient, params: dict[str, Any]
    ) -> tuple[httpx.Response, Dialect]:
        """The event stream answering a SendStreamingMessage, and its dialect (the other one
        tried once, as ``call`` does)."""
        dialect = self.dialect
        try:
            return await self._stream_response(http, params, dialect), dialect
        except wire.RpcError as exc:
            if not self._may_retry(exc, dialect):
                raise
        other = _other(dialect)
        try:
            response = await self._stream_response(http, params, other)
        except wire.RpcError as retry:
            if not _refuses_dialect(retry):
                self._switch(other)
            raise
        self._switch(other)
        return response, other

    async def _stream_response(
        self, http: httpx.AsyncClient, params: dict[str, Any], dialect: Dialect
    ) -> httpx.Response:
        body, headers = self._body("SendStreamingMessage", params, dialect)
        headers["Accept"] = "text/event-stream"
        request = http.build_request("POST", self.url, json=body, headers=headers)
        response = await http.send(request, stream=True)
        if "text/event-stream" in response.headers.get("content-type", ""):
            return response
        try:
            answer = await _read_answer(response, self.url)
        finally:
            await response.aclose()
        _answer(response, answer, self.url)  # an error answer raises what it says
        raise TransportError(f"{self.url} did not answer with an event stream")


def _refuses_dialect(exc: wire.RpcError) -> bool:
    """Whether an error says the peer does not know the method in the dialect it was sent in."""
    return exc.code in (wire.METHOD_NOT_FOUND, wire.VERSION_NOT_SUPPORTED)


def _rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}


def _other(dialect: Dialect) -> Dialect:
    return "1.0" if dialect == "0.3" else "0.3"


async def _read_answer(response: httpx.Response, url: str) -> bytes:
    """A response's body, refused once it passes ``MAX_ANSWER_BYTES`` (not read on)."""
    body, cut = await read_at_most(response, MAX_ANSWER_BYTES)
    if cut:
        raise TransportError(
            f"{url} answered with more than {MAX_ANSWER_BYTES} bytes (the limit of an "
            "agent's answer); not read on"
        )
    return body


def _answer(response: httpx.Response, body: bytes, url: str) -> dict[str, Any]:
    """The JSON-RPC response ``body`` of ``response``, an error answer raised as what it says."""
    if response.status_code >= 400 and "json" not in response.headers.get("content-type", ""):
        raise TransportError(f"{url} answered {response.status_code}: {excerpt(_text(body))}")
    payload = _decode(body, url)
    if response.status_code >= 400 and not isinstance(payload.get("error"), dict):
        # an HTTP refusal with a JSON body (401 {"error": "missing or wrong bearer token"})
        detail = payload.get("error") or payload.get("message") or _text(body)
        raise TransportError(f"{url} answered {response.status_code}: {excerpt(str(detail))}")
    if "error" in payload:
        raise _rpc_error(payload["error"])
    if "result" not in payload:
        raise TransportError(f"{url} answered without a JSON-RPC result")
    return payload


def _text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


def _decode(data: str | bytes, url: str) -> dict[str, Any]:
    try:
        payload = strictjson.loads(data)
    except ValueError:
        raise TransportError(f"{url} answered with something that is not JSON") from None
    if not isinstance(payload, dict):
        raise TransportError(f"{url} answered with JSON that is not a JSON-RPC response")
    return payload


def _rpc_error(error: Any) -> wire.RpcError:
    if not isinstance(error, dict):
        return wire.RpcError(wire.INTERNAL_ERROR, str(error))
    code = error.get("code")
    return wire.RpcError(
        code if isinstance(code, int) else wire.INTERNAL_ERROR,
        str(error.get("message") or "no message"),
        error.get("data"),
    )


# -- one call of a skill -------------------------------------------------------------------------


@dataclass(slots=True)
class _Progress:
    """What a call knows about its task so far."""

    task_id: str = ""
    context_id: str = ""
    state: str = "submitted"
    polls: int = 0
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # agent messages, in order
    named: asyncio.Event = field(default_factory=asyncio.Event)  # set once task_id is known

    def name_task(self, task_id: Any, context_id: Any) -> None:
        """The ids the agent gave its task (the first known ones stay)."""
        self.task_id = self.task_id or str(task_id or "")
        self.context_id = self.context_id or str(context_id or "")
        if self.task_id:
            self.named.set()

    def take_task(self, task: Any) -> None:
        if not isinstance(task, dict) or not isinstance(task.get("status"), dict):
            raise TransportError("the agent answered with something that is not a task")
        if not (task.get("id") or self.task_id):
            raise TransportError("the agent answered with a task that has no id")
        self.task_id = str(task.get("id") or self.task_id)
        self.context_id = str(task.get("contextId") or self.context_id)
        self.named.set()
        self.state = wire.task_state(task)
        if task.get("artifacts"):
            self.artifacts = _objects(task["artifacts"], "the task's artifacts")
        status_message = _shaped(task["status"].get("message"), "the task's status message")
        history = [
            m for m in _objects(task.get("history"), "the task's history") if wire.is_agent(m)
        ]
        self.messages = history + ([status_message] if status_message else [])

    def take_artifact(self, update: dict[str, Any]) -> dict[str, Any]:
        artifact = _shaped(update.get("artifact"), "an artifact update's artifact")
        if not isinstance(artifact.get("parts", []), list):
            raise TransportError("the agent answered with an artifact whose parts are not a list")
        key = artifact.get("artifactId")
        held = next((a for a in self.artifacts if key and a.get("artifactId") == key), None)
        if held is not None and update.get("append"):
            held["parts"] = [*held.get("parts", []), *artifact.get("parts", [])]
        elif held is not None:
            held.update(artifact)
        else:
            self.artifacts.append(dict(artifact))
        return artifact

    def output(self) -> str:
        texts = [wire.text_of(a.get("parts")) for a in self.artifacts]
        joined = "\n".join(t for t in texts if t)
        if joined:
            return joined
        return self.last_message()

    def last_message(self) -> str:
        for message in reversed(self.messages):
            text = wire.text_of(message.get("parts"))
            if text:
                return text
        return ""


class SkillCall:
    """Runs one skill of a remote agent as a tool."""

    def __init__(self, ag: Agent, agent_name: str, skill: str, peer: Peer) -> None:
        self.agent = ag
        self.agent_name = agent_name
        self.skill = skill
        self.peer = peer
        self._waiting: dict[str, tuple[str, str]] = {}  # session -> task waiting for input

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        started = time.monotonic()
        progress = _Progress()
        waiting = self._waiting.pop(ctx.session_id, None)
        message = wire.message(
            "user",
            str(arguments["task"]),
            task_id=waiting[0] if waiting else "",
            context_id=waiting[1] if waiting else "",
            metadata={"skillId": self.skill},
        )
        budget = self.agent.timeout
        if ctx.deadline is not None:
            budget = min(budget, ctx.deadline - started - DEADLINE_MARGIN)
        http, own_client = self.peer.client()
        # The exchange runs as a task of its own, so that a call ending early (its timeout, or
        # cancelled) can leave a first request in flight to finish: its answer names the task
        # to cancel (see _settle).
        work = asyncio.ensure_future(self._exchange(http, message, progress, ctx))
        settle: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(max(budget, 0.001)):
                await asyncio.shield(work)
        except TimeoutError:
            settle = self._settle_in_background(work, progress, http if own_client else None)
            return self._result(
                ctx,
                progress,
                started,
                ToolErrorCode.TIMEOUT,
                f"the agent {self.agent_name!r} did not finish within {budget:.3g}s; "
                + (
                    "its task is being cancelled"
                    if progress.task_id
                    else "it had not answered the first request (the task it names is cancelled)"
                ),
            )
        except asyncio.CancelledError:
            settle = self._settle_in_background(work, progress, http if own_client else None)
            with contextlib.suppress(BaseException):  # cancelled again: it goes on alone
                await asyncio.shield(settle)
            raise
        except (wire.RpcError, TransportError, httpx.HTTPError, RuntimeError) as exc:
            if http.is_closed:  # the source closed (and its shared client) under the call
                return await self._closed_under(progress, ctx, started)
            if isinstance(exc, RuntimeError):
                raise
            return self._result(
                ctx,
                progress,
                started,
                ToolErrorCode.TOOL_ERROR,
                f"the agent {self.agent_name!r} failed: {exc}",
            )
        finally:
            if settle is None and own_client:  # else the cleanup closes it when done
                await http.aclose()
        return self._result(ctx, progress, started)

    async def _exchange(
        self,
        http: httpx.AsyncClient,
        message: dict[str, Any],
        progress: _Progress,
        ctx: ToolContext,
    ) -> None:
        if self.peer.streaming:
            await self._streamed(http, message, progress, ctx)
        else:
            await self._polled(http, message, progress, ctx)

    async def _polled(
        self,
        http: httpx.AsyncClient,
        message: dict[str, Any],
        progress: _Progress,
        ctx: ToolContext,
    ) -> None:
        params = {"message": message, "configuration": {"returnImmediately": True}}
        answer = await self.peer.call(http, "SendMessage", params)
        if isinstance(answer, dict) and "message" in answer and "task" not in answer:
            progress.messages.append(_shaped(answer["message"], "a message"))
            progress.state = "completed"  # the agent answered directly, without a task
            return
        progress.take_task(answer.get("task") if isinstance(answer, dict) else None)
        ctx.status(progress.state)
        await self._poll(http, progress, ctx)

    async def _poll(self, http: httpx.AsyncClient, progress: _Progress, ctx: ToolContext) -> None:
        delay = min(FIRST_POLL, self.agent.poll_every)
        while progress.state not in DONE:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.agent.poll_every)
            before = progress.state
            progress.take_task(await self.peer.call(http, "GetTask", {"id": progress.task_id}))
            progress.polls += 1
            if progress.state != before:
                ctx.status(progress.state)

    async def _streamed(
        self,
        http: httpx.AsyncClient,
        message: dict[str, Any],
        progress: _Progress,
        ctx: ToolContext,
    ) -> None:
        events = self.peer.stream(http, {"message": message})
        async with contextlib.aclosing(events):
            async for item in events:
                self._take_stream_item(item, progress, ctx)
                if progress.state in DONE:
                    return
        if not progress.task_id:
            raise TransportError("the agent's stream ended before it said anything")
        await self._poll(http, progress, ctx)  # the stream ended early: carry on by polling

    def _take_stream_item(self, item: Any, progress: _Progress, ctx: ToolContext) -> None:
        if not isinstance(item, dict):
            return
        if "task" in item:
            progress.take_task(item["task"])
        elif "message" in item:
            progress.messages.append(_shaped(item["message"], "a streamed message"))
            if not progress.task_id:
                progress.state = "completed"
        elif "statusUpdate" in item:
            update = _shaped(item["statusUpdate"], "a status update")
            progress.name_task(update.get("taskId"), update.get("contextId"))
            status = _shaped(update.get("status"), "a status update's status")
            progress.state = wire.short_state(status.get("state"))
            message = _shaped(status.get("message"), "a status update's message")
            said = wire.text_of(message.get("parts"))
            if message:
                progress.messages.append(message)
            ctx.status(f"{progress.state}: {said}" if said else progress.state)
        elif "artifactUpdate" in item:
            update = _shaped(item["artifactUpdate"], "an artifact update")
            progress.name_task(update.get("taskId"), update.get("contextId"))
            artifact = progress.take_artifact(update)
            ctx.artifact(
                str(artifact.get("name") or artifact.get("artifactId") or "artifact"),
                wire.text_of(artifact.get("parts")),
                # proto3 JSON leaves a false lastChunk out: a chunk without one is not the last
                final=bool(update.get("lastChunk", False)),
            )

    async def _cancel(self, http: httpx.AsyncClient, progress: _Progress) -> bool:
        """Ask the agent to cancel the call's task; whether it did."""
        if not progress.task_id or progress.state in wire.TERMINAL:
            return False
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT):
                task = await self.peer.call(http, "CancelTask", {"id": progress.task_id})
            progress.take_task(task)
        except Exception as exc:  # the call's outcome stands; the agent may not cancel
            logger.info("CancelTask for %s at %s failed: %s", progress.task_id, self.peer.url, exc)
            return False
        return progress.state == "canceled"  # what the agent says, not that it was asked

    async def _closed_under(
        self, progress: _Progress, ctx: ToolContext, started: float
    ) -> ToolResult:
        """The call's end when its source was closed while it ran: the agent's task is
        cancelled (with a client of its own), not left working for nobody."""
        async with self.peer.new_client() as http:
            asked = await self._cancel(http, progress)
        return self._result(
            ctx,
            progress,
            started,
            ToolErrorCode.TOOL_ERROR,
            f"the agent {self.agent_name!r} was closed during the call"
            + ("; its task was cancelled" if asked else ""),
        )

    def _settle_in_background(
        self, work: asyncio.Task[None], progress: _Progress, own_client: httpx.AsyncClient | None
    ) -> asyncio.Task[None]:
        """Start (and track) the cleanup of a call that ended early; ``own_client`` is the
        call's own client, which the cleanup closes."""
        job = asyncio.ensure_future(self._settle(work, progress, own_client))
        self.peer.track(job)
        return job

    async def _settle(
        self, work: asyncio.Task[None], progress: _Progress, own_client: httpx.AsyncClient | None
    ) -> None:
        """Cancel the remote task of a call that ended early (timed out, or cancelled itself).
        A first request still in flight is let finish first, as its answer names the task: all
        within CANCEL_TIMEOUT. CancelTask goes on a client of its own: the shared one may be
        closing with the toolkit."""
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT):
                await _named_or_done(work, progress)
                await _stopped(work)
                async with self.peer.new_client() as http:
                    await self._cancel(http, progress)
        except TimeoutError:
            logger.info(
                "the agent %s did not name or cancel the task of an ended call within %ss",
                self.peer.url,
                CANCEL_TIMEOUT,
            )
        finally:
            await _stopped(work)
            if own_client is not None:
                await own_client.aclose()

    def _result(
        self,
        ctx: ToolContext,
        progress: _Progress,
        started: float,
        code: str | None = None,
        error: str = "",
    ) -> ToolResult:
        metadata = {
            "agent": self.agent_name,
            "taskId": progress.task_id,
            "state": progress.state,
            "polls": progress.polls,
            "ms": int((time.monotonic() - started) * 1000),
        }
        if progress.context_id:
            metadata["contextId"] = progress.context_id
        if code is None:
            code, error = self._outcome(ctx, progress)
        if code is None:
            return ToolResult(
                success=True,
                tool_name=ctx.tool_name,
                data=progress.output(),
                metadata=metadata,
                duration_ms=0,
            )
        return ToolResult(
            success=False,
            tool_name=ctx.tool_name,
            error=error,
            error_code=code,
            metadata=metadata,
            duration_ms=0,
        )

    def _outcome(self, ctx: ToolContext, progress: _Progress) -> tuple[str | None, str]:
        state = progress.state
        said = progress.last_message()
        if state == "completed":
            return None, ""
        if state in wire.INTERRUPTED:
            self._waiting[ctx.session_id] = (progress.task_id, progress.context_id)
            if len(self._waiting) > MAX_WAITING_SESSIONS:
                del self._waiting[next(iter(self._waiting))]  # the longest waiting
            need = "more input" if state == "input-required" else "authentication"
            return state.replace("-", "_"), (
                f"the agent {self.agent_name!r} needs {need}: {said or 'it gave no details'}. "
                f"Call {ctx.tool_name} again with the answer as `task` to continue its task."
            )
        code = ToolErrorCode.CANCELLED if state == "canceled" else ToolErrorCode.TOOL_ERROR
        return code, f"the agent's task was {state}: {said or 'no reason given'}"


async def _named_or_done(work: asyncio.Task[None], progress: _Progress) -> None:
    """Until the agent has named the call's task, or the exchange ``work`` ended."""
    if progress.task_id or work.done():
        return
    named = asyncio.ensure_future(progress.named.wait())
    try:
        await asyncio.wait({work, named}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        named.cancel()


async def _stopped(work: asyncio.Task[None]) -> None:
    """Cancel the exchange ``work`` and wait for its end (its outcome is not the call's now)."""
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)


def _shaped(value: Any, what: str) -> dict[str, Any]:
    """An optional object of the agent's answer ({} when absent); a peer that sends another
    shape gets a clear error, not an AttributeError from deep in the call."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TransportError(
            f"the agent answered with {what} that is not an object: {value!r}"[:300]
        )
    return value


def _objects(value: Any, what: str) -> list[dict[str, Any]]:
    """An optional list of objects of the agent's answer ([] when absent)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TransportError(
            f"the agent answered with {what} that is not a list of objects: {value!r}"[:300]
        )
    return list(value)


def _first_text(*values: Any) -> str:
    for value in values:
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""
