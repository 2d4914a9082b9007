"""The API styles against a local stub provider, through ``client.run``: the calls of each answer
(whole or streamed) read against the tools that request offered, a tool no provider form can
express left out of the request rather than failing it, Anthropic's thinking blocks sent back."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.fixtures.llm_stub import (
    Answer,
    StubLLM,
    anthropic_calls,
    anthropic_text,
    gemini_calls,
    gemini_response,
    gemini_text,
    openai_calls,
    openai_text,
)
from tests.llm.catalogue import count_nodes
from tests.llm.test_loop import add, scripted
from toolmesh import Tool, ToolDefinition, Toolkit, create_client

STYLES = ["openai", "anthropic", "gemini"]


async def _echo(arguments: dict[str, Any], ctx: object) -> str:
    return json.dumps(arguments, sort_keys=True)


def _tool(name: str, schema: dict[str, Any]) -> Tool:
    return Tool(ToolDefinition(name=name, description="A tool."), _echo, input_schema=schema)  # type: ignore[arg-type]


# An OpenAPI operation's parameters: keys Anthropic and Gemini refuse, one of them optional.
LIST_ITEMS = _tool(
    "list_items",
    {
        "type": "object",
        "properties": {"$top": {"type": "integer"}, "filter[name]": {"type": "string"}},
        "required": ["$top"],
        "additionalProperties": False,
    },
)
# What each provider's model sends for "$top: 3" and no filter, in that provider's form of it:
# OpenAI's strict mode makes the optional filter required and nullable.
SENT = {
    "openai": {"$top": 3, "filter[name]": None},
    "anthropic": {"_top": 3},
    "gemini": {"_top": 3},
}


def _calls(style: str, name: str, arguments: dict[str, Any], *, stream: bool) -> Answer:
    if not stream:
        if style == "openai":
            return openai_calls(("c1", name, arguments))
        if style == "anthropic":
            return anthropic_calls(("c1", name, arguments))
        return gemini_calls((name, arguments))
    if style == "openai":
        part = {
            "index": 0,
            "id": "c1",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        delta = {"choices": [{"delta": {"tool_calls": [part]}, "finish_reason": "tool_calls"}]}
        return Answer(events=[("", delta), ("", "[DONE]")])
    if style == "anthropic":
        start = {"type": "tool_use", "id": "c1", "name": name, "input": {}}
        json_delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
        return Answer(
            events=[
                _anthropic_event("content_block_start", index=0, content_block=start),
                _anthropic_event("content_block_delta", index=0, delta=json_delta),
                *_anthropic_end("tool_use"),
            ]
        )
    return Answer(
        events=[("", gemini_response({"functionCall": {"name": name, "args": arguments}}))]
    )


def _text(style: str, text: str) -> Answer:
    return {"openai": openai_text, "anthropic": anthropic_text, "gemini": gemini_text}[style](text)


def _anthropic_event(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return kind, {"type": kind, **fields}


def _anthropic_end(stop_reason: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        _anthropic_event("message_delta", delta={"stop_reason": stop_reason}, usage={}),
        _anthropic_event("message_stop"),
    ]


def _client(base_url: str, style: str, **settings: Any) -> Any:
    return create_client(base_url, style=style, model="m", **settings)


# -- calls read against the offered tools --------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("style", STYLES)
async def test_a_call_runs_with_the_tools_own_keys_and_without_strict_nulls(
    style: str, stream: bool
) -> None:
    """The loop ran each call as the model sent it: OpenAI's strict-mode null for an omitted
    optional argument was refused (``$["filter[name]"]: must be string``), and the keys
    Anthropic's and Gemini's forms renamed (``_top``) were refused as missing ``$top``."""
    answers = scripted(_calls(style, "list_items", SENT[style], stream=stream), _text(style, "ok"))
    with StubLLM(answers) as llm:
        result = await _client(llm.base_url, style).run(
            "three items", toolkit=Toolkit(LIST_ITEMS), stream=stream
        )
    [(call, outcome)] = result.tool_calls
    assert call.name == "list_items" and call.arguments == {"$top": 3}
    assert outcome.success and outcome.output == '{"$top": 3}', outcome


async def test_a_call_to_a_tool_not_offered_is_still_an_unknown_tool() -> None:
    answers = scripted(openai_calls(("c1", "nowhere", {"x": None})), openai_text("ok"))
    with StubLLM(answers) as llm:
        result = await _client(llm.base_url, "openai").run("go", toolkit=Toolkit(LIST_ITEMS))
    [(call, outcome)] = result.tool_calls
    assert call.arguments == {"x": None} and outcome.error_code == "unknown_tool"


# -- a tool a provider's form cannot express -----------------------------------------------------

ID_OR_PATH = _tool(
    "get_resource",
    {
        "anyOf": [
            {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            {
                "type": "object",
                "properties": {"full_path": {"type": "string"}},
                "required": ["full_path"],
            },
        ]
    },
)


@pytest.mark.parametrize("style", STYLES)
async def test_a_root_union_is_offered_as_one_object_and_its_calls_run(style: str) -> None:
    """A root that is only ``anyOf`` (as ``z.union`` makes it) raised SchemaError from every
    ``client.run`` of the toolkit, before a single request."""
    sent = {"id": "r1", "full_path": None} if style == "openai" else {"id": "r1"}
    answers = scripted(_calls(style, "get_resource", sent, stream=False), _text(style, "ok"))
    with StubLLM(answers) as llm:
        result = await _client(llm.base_url, style).run("get r1", toolkit=Toolkit(add, ID_OR_PATH))
    assert result.text == "ok"
    [(call, outcome)] = result.tool_calls
    assert outcome.success and call.arguments == {"id": "r1"}, outcome
    body = json.dumps(llm.requests[0].body["tools"])
    assert "The arguments must match at least one of: (1) requires id; (2) requires full_path." in (
        body
    )


@pytest.mark.parametrize("style", STYLES)
async def test_a_tool_no_form_can_express_is_left_out_with_a_warning(
    style: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One such tool made every request of the run fail: the whole toolkit's agent stopped."""
    text_only = _tool("shout", {"type": "string"})
    kit = Toolkit(add, text_only, count_nodes)  # count_nodes: a recursive type, not for Gemini
    answers = scripted(_calls(style, "add", {"a": 1, "b": 2}, stream=False), _text(style, "3"))
    with caplog.at_level(logging.WARNING, logger="toolmesh.llm"), StubLLM(answers) as llm:
        result = await _client(llm.base_url, style).run("1+2", toolkit=kit)
    assert result.text == "3" and result.tool_calls[0][1].data == 3
    tools = llm.requests[0].body["tools"]
    if style == "gemini":
        names = [d["name"] for d in tools[0]["function_declarations"]]
    else:
        names = [t["function"]["name"] if style == "openai" else t["name"] for t in tools]
    assert names == (["add"] if style == "gemini" else ["add", "count_nodes"])
    warned = [r.getMessage() for r in caplog.records if r.name == "toolmesh.llm"]
    assert any("'shout' is left out" in m and "must be an object" in m for m in warned)
    assert (style == "gemini") == any("'count_nodes' is left out" in m for m in warned)
    assert len(warned) == len(set(warned))  # once each, not with every request


# -- Anthropic's thinking blocks -----------------------------------------------------------------

THINKING = {"type": "thinking", "thinking": "I should add.", "signature": "EqQBCgIYAhIM"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}


def _thinking_answer(stream: bool) -> Answer:
    if not stream:
        return Answer(
            {
                "type": "message",
                "role": "assistant",
                "content": [THINKING, REDACTED, TOOL_USE],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        )
    thinking_start = {"type": "thinking", "thinking": ""}
    use_start = {**TOOL_USE, "input": {}}
    return Answer(
        events=[
            _anthropic_event("message_start", message={"usage": {"input_tokens": 1}}),
            _anthropic_event("content_block_start", index=0, content_block=thinking_start),
            *(
                _anthropic_event("content_block_delta", index=0, delta=delta)
                for delta in (
                    {"type": "thinking_delta", "thinking": "I should "},
                    {"type": "thinking_delta", "thinking": "add."},
                    {"type": "signature_delta", "signature": THINKING["signature"]},
                )
            ),
            _anthropic_event("content_block_stop", index=0),
            _anthropic_event("content_block_start", index=1, content_block=REDACTED),
            _anthropic_event("content_block_stop", index=1),
            _anthropic_event("content_block_start", index=2, content_block=use_start),
            _anthropic_event(
                "content_block_delta",
                index=2,
                delta={"type": "input_json_delta", "partial_json": '{"a": 1, "b": 2}'},
            ),
            *_anthropic_end("tool_use"),
        ]
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_thinking_blocks_go_back_first_and_verbatim_with_the_tool_use(stream: bool) -> None:
    """With thinking on, Anthropic refuses a tool-use turn sent back without its thinking
    blocks ("Expected `thinking` or `redacted_thinking`, but found `tool_use`")."""
    thinking_on = {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    answers = scripted(_thinking_answer(stream), anthropic_text("3"))
    with StubLLM(answers) as llm:
        client = _client(llm.base_url, "anthropic", options=thinking_on)
        result = await client.run("1+2?", toolkit=Toolkit(add), stream=stream)
    assert result.text == "3" and result.tool_calls[0][1].data == 3
    assistant = llm.requests[1].body["messages"][1]
    assert assistant == {"role": "assistant", "content": [THINKING, REDACTED, TOOL_USE]}
    assert result.messages[1].thinking == [THINKING, REDACTED]
