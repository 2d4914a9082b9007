"""The API styles a model provider speaks: OpenAI Chat Completions, Anthropic Messages and
Gemini generateContent.

The agent loop keeps its conversation in one neutral form (``ChatMessage``: user text, an
assistant reply with tool calls, a tool result). A ``Style`` turns it into one provider's request
body and that provider's answer (whole, or streamed as server-sent events) back into a ``Reply``,
its tool calls read against the tools that request offered (their own names, keys and optional
arguments back, as ``parse_tool_call`` gives them). Most OpenAI-compatible servers (vLLM,
llama.cpp, Ollama, LiteLLM, ...) speak the first style.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from toolmesh import strictjson
from toolmesh.errors import ConfigError, ProviderError, SchemaError, ToolCallParseError
from toolmesh.llm.calls import parse_tool_call
from toolmesh.llm.formats import to_anthropic, to_gemini, to_openai
from toolmesh.models import new_id
from toolmesh.tools import Tool

__all__ = [
    "AnthropicStyle",
    "ChatMessage",
    "GeminiStyle",
    "ModelCall",
    "OpenAIStyle",
    "Reply",
    "StreamParser",
    "Style",
    "Usage",
    "style_named",
]

logger = logging.getLogger("toolmesh.llm")

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
GEMINI_MADE_UP_ID = "gemini_call_"  # starts the ids given to calls Gemini sent without one
# The value Google documents for a call with no signature of its own (one another model made, a
# history written by hand): Gemini 3 refuses a function call of the current turn without one.
GEMINI_NO_SIGNATURE = "skip_thought_signature_validator"

ANTHROPIC_THINKING = ("thinking", "redacted_thinking")  # blocks sent back as they came
_LEFT_OUT_LIMIT = 10_000  # tools a client remembers having warned about

OnText = Callable[[str], None]


@dataclass(slots=True)
class ModelCall:
    """A tool call the model asked for (read by ``toolmesh.llm.calls.parse_tool_call``);
    ``error`` says why it could not be read, and then it is answered, not run. ``signature``
    is an opaque token the provider wants back with the call (Gemini's ``thoughtSignature``)."""

    id: str
    name: str
    arguments: dict[str, Any]
    error: str = ""
    signature: str = ""


@dataclass(slots=True)
class Usage:
    """Tokens spent, added up over every request of a run."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens


@dataclass(slots=True)
class Reply:
    """One answer of the model: its text, the tools it wants called, why it stopped, and
    Anthropic's thinking blocks (``ChatMessage.thinking``)."""

    text: str = ""
    tool_calls: list[ModelCall] = field(default_factory=list)
    stop_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    thinking: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class ChatMessage:
    """One entry of the neutral conversation. ``thinking``: an assistant reply's ``thinking``
    and ``redacted_thinking`` blocks (Anthropic's extended thinking), verbatim with their
    signatures: Anthropic refuses a tool-use turn sent back without them."""

    role: Literal["user", "assistant", "tool"]
    text: str = ""
    tool_calls: list[ModelCall] = field(default_factory=list)
    tool_call_id: str = ""
    is_error: bool = False
    thinking: list[dict[str, Any]] = field(default_factory=list)


class StreamParser(ABC):
    """Collects one streamed answer from its server-sent events; its calls are read against
    the ``tools`` the request offered."""

    def __init__(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> None:
        self.reply = Reply()
        self._on_text = on_text
        self._offered = _by_provider_name(tools)
        self.ended = False  # the provider said the answer is complete (a stream may be cut)

    def _text(self, delta: str) -> None:
        if delta:
            self.reply.text += delta
            if self._on_text is not None:
                self._on_text(delta)

    @abstractmethod
    def feed(self, event: str, data: str) -> None:
        """Take one event (its name, possibly empty, and its data)."""

    def finish(self) -> Reply:
        return self.reply


class Style(ABC):
    """How one provider's API is asked and answers (one instance per client)."""

    name: str

    def __init__(self) -> None:
        self._left_out: set[tuple[str, str]] = set()  # (tool, why): warned about once

    def expressible(
        self, tools: Sequence[Tool], convert: Callable[[Sequence[Tool]], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """``convert(tools)``, the request's tools in this provider's form. A tool the form
        cannot express (a root that is no object; a recursive type, for Gemini) is left out of
        the request, with a warning, rather than failing every request of the run."""
        try:
            return convert(tools)  # nearly always: all at once
        except SchemaError:
            pass
        out: list[dict[str, Any]] = []
        for tool in tools:
            try:
                out.extend(convert([tool]))
            except SchemaError as exc:
                self._warn_left_out(tool.name, str(exc))
        return out

    def _warn_left_out(self, name: str, why: str) -> None:
        if (name, why) in self._left_out:
            return
        if len(self._left_out) >= _LEFT_OUT_LIMIT:
            self._left_out.clear()
        self._left_out.add((name, why))
        logger.warning("tool %r is left out of the requests to %s: %s", name, self.name, why)

    @abstractmethod
    def url(self, base_url: str, model: str, *, stream: bool) -> str:
        """The endpoint under ``base_url`` (Gemini's names the model, and differs for a stream)."""

    @abstractmethod
    def headers(self, api_key: str | None) -> dict[str, str]:
        """Authentication and version headers."""

    @abstractmethod
    def body(
        self,
        model: str,
        system: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool],
        *,
        stream: bool,
        options: dict[str, Any],
    ) -> dict[str, Any]:
        """The request body."""

    @abstractmethod
    def parse(self, payload: Any, tools: Sequence[Tool] = ()) -> Reply:
        """The reply in a whole (non-streamed) answer, its calls read against the offered
        ``tools``."""

    @abstractmethod
    def stream_parser(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> StreamParser:
        """A parser for one streamed answer to a request that offered ``tools``."""


# -- OpenAI Chat Completions ---------------------------------------------------------------------


class OpenAIStyle(Style):
    name = "openai"

    def url(self, base_url: str, model: str, *, stream: bool) -> str:
        return base_url.rstrip("/") + "/chat/completions"

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def body(
        self,
        model: str,
        system: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool],
        *,
        stream: bool,
        options: dict[str, Any],
    ) -> dict[str, Any]:
        wire: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        wire.extend(_openai_message(m) for m in messages)
        body: dict[str, Any] = {"model": model, "messages": wire, **options}
        sent = self.expressible(tools, to_openai)
        if sent:
            body["tools"] = sent
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def parse(self, payload: Any, tools: Sequence[Tool] = ()) -> Reply:
        try:
            choice = payload["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise _malformed(payload, "no choices[0].message") from None
        listed = message.get("tool_calls") or []
        if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
            # A call that cannot be read cannot be answered either: not dropped in silence.
            raise _malformed(payload, "tool_calls is not a list of objects")
        offered = _by_provider_name(tools)
        calls = [
            _call(
                c, str(c.get("id") or ""), str((c.get("function") or {}).get("name") or ""), offered
            )
            for c in listed
        ]
        return Reply(
            text=_openai_text(message.get("content")),
            tool_calls=calls,
            stop_reason=choice.get("finish_reason") or "",
            usage=_openai_usage(payload.get("usage")),
        )

    def stream_parser(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> StreamParser:
        return _OpenAIStream(on_text, tools)


def _openai_message(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
    if message.role == "user":
        return {"role": "user", "content": message.text}
    # ``null`` content goes only with tool calls: an assistant message with neither is refused
    # (a model may answer nothing at all, and that reply may come back as history).
    content = message.text or (None if message.tool_calls else "")
    wire: dict[str, Any] = {"role": "assistant", "content": content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in message.tool_calls
        ]
    return wire


def _openai_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _openai_usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


class _OpenAIStream(StreamParser):
    def __init__(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> None:
        super().__init__(on_text, tools)
        self._calls: list[dict[str, str]] = []  # in the order they started
        self._at: dict[int, dict[str, str]] = {}  # a delta's index: the call it adds to now

    def _slot(self, part: dict[str, Any]) -> dict[str, str]:
        """The call a streamed tool-call delta belongs to. By its ``index``, as OpenAI sends
        them; but a delta with another ``id`` than the call at its index starts a new call
        (Ollama and some gateways give every call of a turn index 0), and without an index a
        delta continues the last call unless it starts one (an id or name of its own)."""
        index = part.get("index")
        given = part.get("id") or ""
        if index is not None:
            slot = self._at.get(int(index))
        else:
            slot = self._calls[-1] if self._calls else None
            named = (part.get("function") or {}).get("name")
            if slot is not None and not given and named and slot["name"]:
                slot = None  # a whole new call, without index or id
        if slot is None or (given and slot["id"] and given != slot["id"]):
            slot = {"id": "", "name": "", "args": ""}
            self._calls.append(slot)
            if index is not None:
                self._at[int(index)] = slot
        return slot

    def feed(self, event: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self.ended = True
            return
        chunk = _json(data)
        if chunk.get("error"):  # a provider failing mid-stream (OpenAI, vLLM, LiteLLM)
            raise _stream_error(chunk["error"])
        if chunk.get("usage"):
            self.reply.usage = _openai_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            self._text(_openai_text(delta.get("content")))
            for part in delta.get("tool_calls") or []:
                slot = self._slot(part)
                function = part.get("function") or {}
                slot["id"] = part.get("id") or slot["id"]
                slot["name"] += function.get("name") or ""
                slot["args"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.reply.stop_reason = choice["finish_reason"]
                self.ended = True

    def finish(self) -> Reply:
        self.reply.tool_calls = [
            _call(
                {"id": s["id"], "function": {"name": s["name"], "arguments": s["args"]}},
                s["id"],
                s["name"],
                self._offered,
            )
            for s in self._calls
        ]
        return self.reply


# -- Anthropic Messages --------------------------------------------------------------------------


class AnthropicStyle(Style):
    name = "anthropic"

    def url(self, base_url: str, model: str, *, stream: bool) -> str:
        return base_url.rstrip("/") + "/messages"

    def headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def body(
        self,
        model: str,
        system: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool],
        *,
        stream: bool,
        options: dict[str, Any],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": _anthropic_messages(messages),
            **options,
        }
        if system:
            body["system"] = system
        sent = self.expressible(tools, to_anthropic)
        if sent:
            body["tools"] = sent
        if stream:
            body["stream"] = True
        return body

    def parse(self, payload: Any, tools: Sequence[Tool] = ()) -> Reply:
        if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
            raise _malformed(payload, "no content list")
        reply = Reply(
            stop_reason=payload.get("stop_reason") or "",
            usage=_anthropic_usage(payload.get("usage")),
        )
        offered = _by_provider_name(tools)
        for block in payload["content"]:
            if block.get("type") == "text":
                reply.text += block.get("text", "")
            elif block.get("type") == "tool_use":
                call_id, name = str(block.get("id") or ""), str(block.get("name") or "")
                reply.tool_calls.append(_call(block, call_id, name, offered))
            elif block.get("type") in ANTHROPIC_THINKING:
                reply.thinking.append(dict(block))  # verbatim: Anthropic checks the signature
        return reply

    def stream_parser(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> StreamParser:
        return _AnthropicStream(on_text, tools)


def _anthropic_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Tool results travel as tool_result blocks of a user message; consecutive ones share it."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.text,
                "is_error": message.is_error,
            }
            last = wire[-1] if wire else None
            if last is not None and last["role"] == "user" and isinstance(last["content"], list):
                last["content"].append(block)
            else:
                wire.append({"role": "user", "content": [block]})
        elif message.role == "user":
            wire.append({"role": "user", "content": message.text})
        else:
            content: list[dict[str, Any]] = []
            if message.text:
                content.append({"type": "text", "text": message.text})
            content.extend(
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in message.tool_calls
            )
            if content:  # an empty reply (Claude may end a turn with none) is refused as history
                # Thinking first, as it came: with thinking on, Anthropic refuses a tool-use
                # turn without its thinking blocks ("Expected `thinking` or
                # `redacted_thinking`, but found `tool_use`").
                content[:0] = [dict(block) for block in message.thinking]
                wire.append({"role": "assistant", "content": content})
    return wire


def _anthropic_usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    return Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))


class _AnthropicStream(StreamParser):
    def __init__(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> None:
        super().__init__(on_text, tools)
        self._blocks: dict[int, dict[str, str]] = {}
        self._thinking: dict[int, dict[str, Any]] = {}  # by index: the blocks as they grow

    def feed(self, event: str, data: str) -> None:
        chunk = _json(data)
        kind = chunk.get("type") or event
        if kind == "message_start":
            self.reply.usage = _anthropic_usage((chunk.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            block = chunk.get("content_block") or {}
            if block.get("type") == "tool_use":
                given = block.get("input")
                self._blocks[int(chunk.get("index", 0))] = {
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "args": "",
                    # Anthropic starts with ``{}`` and streams the input; some gateways put it
                    # whole here and stream none: kept for a block no delta fills.
                    "start": json.dumps(given) if given else "",
                }
            elif block.get("type") in ANTHROPIC_THINKING:
                self._thinking[int(chunk.get("index", 0))] = dict(block)
            elif block.get("text"):
                self._text(block["text"])
        elif kind == "content_block_delta":
            delta = chunk.get("delta") or {}
            if delta.get("type") == "text_delta":
                self._text(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                slot = self._blocks.get(int(chunk.get("index", 0)))
                if slot is not None:
                    slot["args"] += delta.get("partial_json", "")
            elif delta.get("type") in ("thinking_delta", "signature_delta"):
                self._think(int(chunk.get("index", 0)), delta)
        elif kind == "message_stop":
            self.ended = True
        elif kind == "message_delta":
            delta = chunk.get("delta") or {}
            self.reply.stop_reason = delta.get("stop_reason") or self.reply.stop_reason
            self.ended = self.ended or bool(delta.get("stop_reason"))
            usage = chunk.get("usage") or {}
            self.reply.usage.output_tokens = int(
                usage.get("output_tokens") or self.reply.usage.output_tokens
            )
        elif kind == "error":
            error = chunk.get("error") or {}
            raise ProviderError(f"the stream reported an error: {error.get('message', chunk)}")

    def _think(self, index: int, delta: Mapping[str, Any]) -> None:
        """A thinking block grows by ``thinking_delta``s, and gets its signature last."""
        block = self._thinking.setdefault(index, {"type": "thinking", "thinking": ""})
        key = "thinking" if delta.get("type") == "thinking_delta" else "signature"
        block[key] = str(block.get(key) or "") + str(delta.get(key) or "")

    def finish(self) -> Reply:
        self.reply.tool_calls = [
            _call(
                {
                    "type": "tool_use",
                    "id": s["id"],
                    "name": s["name"],
                    "input": s["args"] or s["start"],
                },
                s["id"],
                s["name"],
                self._offered,
            )
            for _, s in sorted(self._blocks.items())
        ]
        self.reply.thinking = [block for _, block in sorted(self._thinking.items())]
        return self.reply


# -- Gemini generateContent ---------------------------------------------------------------------


class GeminiStyle(Style):
    """Gemini's own API (``https://generativelanguage.googleapis.com/v1beta``): the model is in
    the URL, not the body, and a stream is asked for by its endpoint. ``options`` are top-level
    request fields as in the other styles: ``{"generationConfig": {"temperature": 0}}``."""

    name = "gemini"

    def url(self, base_url: str, model: str, *, stream: bool) -> str:
        # As google-genai names models: "gemini-x" is "models/gemini-x"; quoted, so that a
        # name cannot add a query of its own.
        path = model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"
        method = "streamGenerateContent" if stream else "generateContent"
        # A base URL may carry a query of its own (``?key=...``): kept, after the path.
        base = urlsplit(base_url)
        query = "&".join(q for q in (base.query, "alt=sse" if stream else "") if q)
        endpoint = f"{base.path.rstrip('/')}/{quote(path, safe='/')}:{method}"
        return urlunsplit(base._replace(path=endpoint, query=query))

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def body(
        self,
        model: str,
        system: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool],
        *,
        stream: bool,
        options: dict[str, Any],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"contents": _gemini_contents(messages), **options}
        if system:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        declarations = self.expressible(tools, _gemini_declarations)
        if declarations:
            body["tools"] = [{"function_declarations": declarations}]
        return body

    def parse(self, payload: Any, tools: Sequence[Tool] = ()) -> Reply:
        candidate = _gemini_candidate(payload)
        if candidate is None:
            raise _malformed(payload, "no candidates")
        reply = Reply(
            stop_reason=candidate.get("finishReason") or "",
            usage=_gemini_usage(payload.get("usageMetadata")),
        )
        offered = _by_provider_name(tools)
        for part in _gemini_parts(candidate, payload):
            if "functionCall" in part:
                reply.tool_calls.append(_gemini_call(part, offered))
            elif not part.get("thought"):  # a thought summary (includeThoughts) is no answer
                reply.text += part.get("text", "")
        return reply

    def stream_parser(self, on_text: OnText | None, tools: Sequence[Tool] = ()) -> StreamParser:
        return _GeminiStream(on_text, tools)


def _gemini_contents(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Tool results travel as functionResponse parts of a user content; consecutive ones share
    it (Gemini wants every response to a turn's calls in the turn after it)."""
    wire: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # call id: the function's name, which a response must repeat
    answers: list[dict[str, Any]] | None = None  # the parts of the current tool results
    for message in messages:
        if message.role == "tool":
            name = called.get(message.tool_call_id)
            if name is None:
                raise ConfigError(
                    f"the tool result for {message.tool_call_id!r} answers no call of the "
                    "conversation; Gemini needs the called function's name"
                )
            # The response must be an object: the tool's text goes under "output", or under
            # "error" for a failure, the keys Gemini documents for the two.
            outcome = "error" if message.is_error else "output"
            response = {"name": name, "response": {outcome: message.text}}
            if answers is None:
                answers = []
                wire.append({"role": "user", "parts": answers})
            answers.append({"functionResponse": {**_gemini_id(message.tool_call_id), **response}})
            continue
        answers = None
        if message.role == "user":
            wire.append({"role": "user", "parts": [{"text": message.text}]})
        else:
            parts: list[dict[str, Any]] = [{"text": message.text}] if message.text else []
            # Gemini signs the first call of a step only (parallel calls share it); a step
            # none of whose calls is signed came from elsewhere and gets the stand-in.
            unsigned = not any(call.signature for call in message.tool_calls)
            for index, call in enumerate(message.tool_calls):
                called[call.id] = call.name
                function = {**_gemini_id(call.id), "name": call.name, "args": call.arguments}
                part: dict[str, Any] = {"functionCall": function}
                if call.signature:
                    part["thoughtSignature"] = call.signature
                elif unsigned and index == 0:
                    part["thoughtSignature"] = GEMINI_NO_SIGNATURE
                parts.append(part)
            if parts:  # Gemini refuses a content without parts (a model may answer nothing)
                wire.append({"role": "model", "parts": parts})
    return wire


def _gemini_id(call_id: str) -> dict[str, str]:
    """The ``id`` field of a call or its response: only an id Gemini gave is sent back."""
    return {} if call_id.startswith(GEMINI_MADE_UP_ID) else {"id": call_id}


def _gemini_candidate(payload: Any) -> dict[str, Any] | None:
    """The first candidate of a GenerateContentResponse, None when it has none; a ProviderError
    naming the reason when Gemini blocked the prompt."""
    if not isinstance(payload, dict):
        raise _malformed(payload, "not an object")
    feedback = payload.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if reason:
        raise ProviderError(
            f"Gemini blocked the prompt and gave no answer (promptFeedback.blockReason: {reason})",
            status=200,
            body=json.dumps(payload)[:500],
        )
    candidates = payload.get("candidates")
    if not candidates:
        return None
    if not isinstance(candidates, list) or not isinstance(candidates[0], dict):
        raise _malformed(payload, "candidates is not a list of objects")
    return candidates[0]


def _gemini_parts(candidate: dict[str, Any], payload: Any) -> list[dict[str, Any]]:
    # A candidate stopped early (SAFETY, MAX_TOKENS) may have no content: no parts, no text.
    content = candidate.get("content") or {}
    parts = (content.get("parts") or []) if isinstance(content, dict) else None
    if not isinstance(parts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("functionCall", {}), dict) for p in parts
    ):
        # A call that cannot be read cannot be answered either: not dropped in silence.
        raise _malformed(payload, "candidates[0].content.parts is not a list of parts")
    return parts


def _gemini_call(part: dict[str, Any], offered: Mapping[str, Tool]) -> ModelCall:
    """The call in a functionCall part. Gemini gives most calls no id; each gets a unique one
    here, since the loop would renumber it in a new ModelCall without its thoughtSignature
    (which Gemini 3 refuses the next request without)."""
    function = part["functionCall"]
    made_up = GEMINI_MADE_UP_ID + new_id()[:16]
    name = str(function.get("name") or "")
    call = _call(part, str(function.get("id") or made_up), name, offered)
    call.signature = str(part.get("thoughtSignature") or "")
    return call


def _gemini_usage(usage: Any) -> Usage:
    """Thinking tokens are billed as output, and candidatesTokenCount leaves them out; with the
    tool-use prompt as input, the two add up to Gemini's totalTokenCount."""
    if not isinstance(usage, dict):
        return Usage()
    return Usage(
        int(usage.get("promptTokenCount") or 0) + int(usage.get("toolUsePromptTokenCount") or 0),
        int(usage.get("candidatesTokenCount") or 0) + int(usage.get("thoughtsTokenCount") or 0),
    )


class _GeminiStream(StreamParser):
    """Each ``data:`` is a whole GenerateContentResponse: text deltas, calls sent whole, usage
    so far; the chunk with a finishReason ends the answer."""

    def feed(self, event: str, data: str) -> None:
        chunk = _json(data)
        if chunk.get("error"):  # a failure mid-stream, in Google's error shape
            raise _stream_error(chunk["error"])
        if chunk.get("usageMetadata"):
            self.reply.usage = _gemini_usage(chunk["usageMetadata"])
        candidate = _gemini_candidate(chunk)
        if candidate is None:
            return
        for part in _gemini_parts(candidate, chunk):
            if "functionCall" in part:
                self.reply.tool_calls.append(_gemini_call(part, self._offered))
            elif not part.get("thought"):
                self._text(part.get("text", ""))
        if candidate.get("finishReason"):
            self.reply.stop_reason = candidate["finishReason"]
            self.ended = True


# -- shared ----------------------------------------------------------------------------------------


def _gemini_declarations(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    declarations: list[dict[str, Any]] = to_gemini(tools)[0]["function_declarations"]
    return declarations


def _by_provider_name(tools: Sequence[Tool]) -> dict[str, Tool]:
    """The tools of a request by the name the provider knows them by."""
    from toolmesh.toolkit import sanitize_name

    return {sanitize_name(tool.name): tool for tool in tools}


def _call(raw: dict[str, Any], call_id: str, name: str, offered: Mapping[str, Tool]) -> ModelCall:
    """A call in a provider's own shape, read by ``parse_tool_call`` against the tool the
    request offered by that name: its own name, keys the provider's form renamed and no nulls
    strict mode added. A name no offered tool has stays as it is, for the toolkit to refuse
    (``unknown_tool``) rather than a parse error."""
    tool = offered.get(name)
    try:
        parsed = parse_tool_call(raw, None if tool is None else [tool])
    except ToolCallParseError as exc:
        return ModelCall(call_id, name, {}, str(exc))
    return ModelCall(parsed.id or call_id, parsed.name, parsed.arguments)


def _json(data: str) -> dict[str, Any]:
    try:
        value = strictjson.loads(data)
    except ValueError:
        raise ProviderError(f"the stream sent data that is not JSON: {data[:200]!r}") from None
    return value if isinstance(value, dict) else {}


def _stream_error(error: Any) -> ProviderError:
    """The error an OpenAI-style stream reports in a chunk (``{"error": {"message": ...}}``):
    the provider's own words, not "the stream was cut off"."""
    said = error.get("message") if isinstance(error, dict) else error
    text = str(said or error)[:300]
    return ProviderError(f"the stream reported an error: {text}", body=json.dumps(error)[:2000])


def _malformed(payload: Any, what: str) -> ProviderError:
    return ProviderError(
        f"the provider's answer is not in the expected shape ({what})",
        status=200,
        body=json.dumps(payload)[:500] if payload is not None else "",
    )


_STYLES: dict[str, type[Style]] = {
    "openai": OpenAIStyle,
    "anthropic": AnthropicStyle,
    "gemini": GeminiStyle,
}


def style_named(name: str) -> Style:
    """The style called ``name`` ("openai", "anthropic" or "gemini")."""
    style = _STYLES.get(name)
    if style is None:
        raise ConfigError(f"style must be 'openai', 'anthropic' or 'gemini', not {name!r}")
    return style()
