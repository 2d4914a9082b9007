"""The agent loop: ask the model, run the tools it calls, give it the results, until it answers.

Every tool call goes through the toolkit's pipeline (``toolkit.execute``: policy, validation,
deadline, events, audit). The calls of one turn run concurrently and their results go back in
the order the model made them. Deferred tools stay out of the request until the model finds them
with ``tool_search``; the tools it finds are offered from the next turn on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import inf
from typing import TYPE_CHECKING, Any, Literal

from toolmesh.errors import ArgumentError, CallTimeout, ConfigError
from toolmesh.llm.styles import ChatMessage, ModelCall, Usage
from toolmesh.models import ToolDefinition, ToolErrorCode, ToolEvent, ToolResult, new_id
from toolmesh.session import Session
from toolmesh.tools import Tool, ToolContext

if TYPE_CHECKING:
    from toolmesh.llm.client import LLMClient
    from toolmesh.toolkit import Toolkit

__all__ = ["SEARCH_TOOL", "TURN_RESULT_CHARS", "RunEvent", "RunResult", "run"]

SEARCH_TOOL = "tool_search"
SEARCH_LIMIT = 5
TURN_RESULT_CHARS = 200_000  # as much as one call's output may be (Limits.max_output_chars)

EventKind = Literal["text", "tool_call", "tool_event", "tool_result", "retry", "done"]


@dataclass(slots=True)
class RunResult:
    """What a run produced: the final text, the whole conversation and what it cost."""

    text: str
    messages: list[ChatMessage]
    usage: Usage
    turns: int
    stop_reason: str  # the model's own ("stop", "end_turn", ...), or "max_turns"
    tool_calls: list[tuple[ModelCall, ToolResult]] = field(default_factory=list)
    retries: int = 0
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Something that happened during a run, in order.

    ``text``: a text delta (``text``); ``tool_call``: the model asked for ``call``;
    ``tool_event``: a tool streamed ``event``; ``tool_result``: ``call`` finished with
    ``tool_result``; ``retry``: the provider answered ``status`` and the client waits ``wait``
    seconds; ``done``: the run ended with ``result`` (the last event, unless the run raised).
    """

    kind: EventKind
    turn: int = 0
    text: str = ""
    call: ModelCall | None = None
    tool_result: ToolResult | None = None
    event: ToolEvent | None = None
    status: int = 0
    wait: float = 0.0
    result: RunResult | None = None


async def run(
    client: LLMClient,
    prompt: str | Sequence[ChatMessage],
    *,
    toolkit: Toolkit | None = None,
    tools: Sequence[Tool | Callable[..., Any]] = (),
    system: str | None = None,
    history: Sequence[ChatMessage] = (),
    max_turns: int = 10,
    timeout: float | None = None,
    tool_timeout: float | None = None,
    stream: bool = False,
    on_event: Callable[[RunEvent], None] | None = None,
    session: Session | None = None,
    skills_prompt: bool = True,
    max_turn_result_chars: int | None = TURN_RESULT_CHARS,
) -> RunResult:
    """Run ``prompt`` to a final answer.

    ``toolkit`` (or a list of ``tools``) gives the model its tools; ``system`` replaces the
    client's system prompt (the toolkit's skills catalogue is appended unless
    ``skills_prompt=False``); ``history`` is an earlier conversation to continue. At most
    ``max_turns`` model requests are made; ``timeout`` bounds the whole run (``CallTimeout``);
    ``tool_timeout`` each tool call. ``stream`` asks the provider to stream its answers, and
    ``on_event`` hears every ``RunEvent``. Cancelling the run cancels its running tools.
    The results of one turn's calls, as the model reads them, share ``max_turn_result_chars``
    (None: no bound): each result is bounded on its own, but a turn of many parallel calls
    would otherwise send the provider more than its context holds, and the run would end in
    its refusal. Results within an even share are sent whole, the others cut to share what is
    left, each with a note saying so (not counted); ``RunResult.tool_calls`` and events keep
    them whole.
    """
    _check_count("max_turns", max_turns)
    if max_turn_result_chars is not None:
        _check_count("max_turn_result_chars", max_turn_result_chars)
    for name, seconds in (("timeout", timeout), ("tool_timeout", tool_timeout)):
        if seconds is not None and not (isinstance(seconds, int | float) and 0 < seconds < inf):
            raise ConfigError(f"{name} must be a number of seconds above 0, not {seconds!r}")
    kit = _toolkit_of(toolkit, tools)
    session = session or (kit.session if kit else None)
    loop = _Loop(client, kit, session, on_event, tool_timeout, max_turn_result_chars)
    instructions = client.system if system is None else system
    if kit is not None and skills_prompt:
        catalogue = kit.skills_prompt()
        instructions = "\n\n".join(p for p in (instructions, catalogue) if p)
    messages = [*history]
    messages.extend([ChatMessage("user", prompt)] if isinstance(prompt, str) else prompt)
    if timeout is None:
        result = await loop.run(messages, instructions, max_turns, stream, deadline=None)
    else:
        try:
            async with asyncio.timeout(timeout):
                deadline = time.monotonic() + timeout
                result = await loop.run(
                    messages, instructions, max_turns, stream, deadline=deadline
                )
        except TimeoutError:
            raise CallTimeout(f"the run did not finish within {timeout:g}s") from None
    loop.emit(RunEvent("done", turn=loop.turn, result=result))
    return result


def _check_count(name: str, count: object) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, not {count!r}")


def _toolkit_of(toolkit: Toolkit | None, tools: Sequence[Any]) -> Toolkit | None:
    if toolkit is not None and tools:
        raise ConfigError("give run() either toolkit= or tools=, not both")
    if tools:
        from toolmesh.toolkit import Toolkit

        return Toolkit(list(tools), name="run")
    return toolkit


class _Loop:
    def __init__(
        self,
        client: LLMClient,
        toolkit: Toolkit | None,
        session: Session | None,
        on_event: Callable[[RunEvent], None] | None,
        tool_timeout: float | None,
        turn_result_chars: int | None,
    ) -> None:
        self.client = client
        self.toolkit = toolkit
        self.session = session
        self.on_event = on_event
        self.tool_timeout = tool_timeout
        self.run_id = new_id()
        self.loaded: dict[str, Tool] = {}  # found by tool_search, offered from the next turn
        self.usage = Usage()
        self.retries = 0
        self.turn = 0
        self.turn_result_chars = turn_result_chars
        self.deadline: float | None = None

    def emit(self, event: RunEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    async def run(
        self,
        messages: list[ChatMessage],
        system: str,
        max_turns: int,
        stream: bool,
        *,
        deadline: float | None,
    ) -> RunResult:
        self.deadline = deadline
        done: list[tuple[ModelCall, ToolResult]] = []
        text, stop = "", ""
        # Every call id of the conversation: providers refuse a conversation where two calls
        # share one (Anthropic: "tool_use ids must be unique"), and a result answers one call.
        used = {c.id for m in messages for c in m.tool_calls} | {
            m.tool_call_id for m in messages if m.tool_call_id
        }
        for self.turn in range(1, max_turns + 1):
            reply = await self.client.complete(
                messages,
                system=system,
                tools=self.offered(),
                stream=stream,
                on_text=self._on_text if self.on_event is not None else None,
                on_retry=self._on_retry,
                deadline=deadline,
            )
            self.usage.add(reply.usage)
            calls = self._identified(reply.tool_calls, used)
            messages.append(ChatMessage("assistant", reply.text, calls, thinking=reply.thinking))
            text, stop = reply.text, reply.stop_reason
            if not calls:
                return self._result(text, messages, stop, done)
            for call in calls:
                self.emit(RunEvent("tool_call", self.turn, call=call))
            results = await asyncio.gather(*(self.call(c) for c in calls))
            texts = _within(list(map(_for_model, results)), self.turn_result_chars)
            for call, result, sent in zip(calls, results, texts, strict=True):
                done.append((call, result))
                messages.append(ChatMessage("tool", sent, [], call.id, is_error=result.is_error))
                self.emit(RunEvent("tool_result", self.turn, call=call, tool_result=result))
        return self._result(text, messages, "max_turns", done)

    def _identified(self, calls: list[ModelCall], used: set[str]) -> list[ModelCall]:
        """The calls of this turn, each with an id no other call of the conversation has: a
        call without one, or with one already taken (a model repeating ``call_0``, two calls of
        one turn alike), gets a new one, and its result answers that."""
        out: list[ModelCall] = []
        for i, call in enumerate(calls):
            if not call.id or call.id in used:
                fresh, n = f"call_{self.turn}_{i}", 0
                while fresh in used:
                    n += 1
                    fresh = f"call_{self.turn}_{i}_{n}"
                call = dataclasses.replace(call, id=fresh)  # its signature, if any, kept
            used.add(call.id)
            out.append(call)
        return out

    def _result(
        self,
        text: str,
        messages: list[ChatMessage],
        stop: str,
        done: list[tuple[ModelCall, ToolResult]],
    ) -> RunResult:
        return RunResult(
            text, messages, self.usage, self.turn, stop, done, self.retries, self.run_id
        )

    def _on_text(self, delta: str) -> None:
        self.emit(RunEvent("text", self.turn, text=delta))

    def _on_retry(self, status: int, wait: float) -> None:
        self.retries += 1
        self.emit(RunEvent("retry", self.turn, status=status, wait=wait))

    # -- tools -----------------------------------------------------------------------------------

    def offered(self) -> list[Tool]:
        """The tools of the next request: the visible ones, those found by search, and
        ``tool_search`` while deferred tools remain."""
        kit = self.toolkit
        if kit is None:
            return []
        held = self.session.capabilities if self.session is not None else None
        visible = kit.definitions(capabilities=held)
        tools = [kit[d.name] for d in visible]
        names = {t.name for t in tools}
        tools.extend(t for name, t in self.loaded.items() if name not in names)
        everything = kit.definitions(capabilities=held, include_deferred=True)
        if len(everything) > len(visible) + len(self.loaded) and SEARCH_TOOL not in kit:
            tools.append(_SEARCH)
        return tools

    async def call(self, call: ModelCall) -> ToolResult:
        if call.error:
            return _refused(call, ToolErrorCode.INVALID_ARGUMENTS, call.error)
        kit = self.toolkit
        if kit is None:
            return _refused(call, ToolErrorCode.UNKNOWN_TOOL, f"unknown tool {call.name!r}")
        if call.name == SEARCH_TOOL and SEARCH_TOOL not in kit:
            return self.search(kit, call)
        timeout = self.tool_timeout
        if self.deadline is not None:
            left = max(0.001, self.deadline - time.monotonic())
            timeout = min(timeout, left) if timeout is not None else left
        on_event = None
        if self.on_event is not None:

            def on_event(event: ToolEvent, call: ModelCall = call) -> None:
                self.emit(RunEvent("tool_event", self.turn, call=call, event=event))

        result = await kit.execute(
            call.name,
            call.arguments,
            timeout=timeout,
            on_event=on_event,
            correlation_id=self.run_id,
            session=self.session,
        )
        # The toolkit's own tool_search tools name what they found: offer it from the next turn.
        for name in result.metadata.get("tool_references", ()) if result.success else ():
            found = kit.get(name)
            if found is not None:
                self.loaded.setdefault(found.name, found)
        return result

    def search(self, kit: Toolkit, call: ModelCall) -> ToolResult:
        started = time.perf_counter()
        try:
            _SEARCH.validate(call.arguments)
        except ArgumentError as exc:  # a limit of 0 or 500 is the model's mistake: say so
            return _refused(call, ToolErrorCode.INVALID_ARGUMENTS, str(exc))
        query: str = call.arguments["query"]
        if not query.strip():
            return _refused(call, ToolErrorCode.INVALID_ARGUMENTS, "give a non-empty 'query'")
        # A whole number (the schema checked): 2.0 is one too, for JSON Schema's "integer".
        limit = int(call.arguments.get("limit", SEARCH_LIMIT))
        held = self.session.capabilities if self.session is not None else None
        found = kit.search(query, capabilities=held, limit=limit)
        for tool in found:
            if tool.definition.defer_loading:
                self.loaded.setdefault(tool.name, tool)
        lines = [f"- {t.name}: {_first_line(t.description)}" for t in found]
        text = (
            "Found these tools; they can be called from now on:\n" + "\n".join(lines)
            if found
            else f"No tools match {query!r}."
        )
        return ToolResult(
            success=True,
            tool_name=SEARCH_TOOL,
            data=[t.name for t in found],
            output=text,
            duration_ms=int((time.perf_counter() - started) * 1000),
        )


async def _never(arguments: dict[str, Any], ctx: ToolContext) -> None:  # pragma: no cover
    raise RuntimeError("tool_search runs inside the agent loop")


_SEARCH = Tool(
    ToolDefinition(
        name=SEARCH_TOOL,
        description=(
            "Search for more tools by what they do. The tools found can be called from the "
            "next turn on."
        ),
    ),
    _never,
    source="loop",
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What the tool should do."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 20,
                "description": "At most this many tools (1-20).",
            },
        },
        "required": ["query"],
    },
)


def _refused(call: ModelCall, code: ToolErrorCode, message: str) -> ToolResult:
    return ToolResult.failure(call.name, code, message)


def _for_model(result: ToolResult) -> str:
    text = result.output or ""
    if result.success:
        return text
    return f"Error [{result.error_code}]: {text}"


def _within(texts: list[str], budget: int | None) -> list[str]:
    """``texts`` sharing ``budget`` characters: the short ones whole (shortest first, each
    within an even share of what is left), the rest cut to an even share of the remainder."""
    if budget is None or sum(map(len, texts)) <= budget:
        return texts
    share, left = {}, budget
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for rank, i in enumerate(order):
        even = left // (len(texts) - rank)
        if len(texts[i]) > even:
            share.update(dict.fromkeys(order[rank:], even))
            break
        left -= len(texts[i])
    out = []
    for i, text in enumerate(texts):
        limit = share.get(i)
        if limit is None or len(text) <= limit:
            out.append(text)
            continue
        note = (
            f"\n[... cut here: {len(text)} characters in all; the {len(texts)} tool results "
            f"of this turn share {budget}]"
        )
        out.append(text[:limit] + note)
    return out


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""
