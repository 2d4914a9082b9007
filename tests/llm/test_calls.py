"""Provider tool calls read back into toolkit calls, built with each provider SDK's own types."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from anthropic.types import Message, TextBlock, ToolUseBlock, Usage
from google.genai import types as genai
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import ResponseFunctionToolCall
from pydantic import BaseModel

from tests.llm.catalogue import CATALOGUE, search
from toolmesh import ToolCallParseError, ToolDefinition, Toolkit, tool
from toolmesh.llm import (
    ToolCall,
    parse_tool_call,
    parse_tool_calls,
    to_anthropic,
    to_gemini,
    to_openai,
)


def openai_chat_call(
    name: str, arguments: str, call_id: str = "call_1"
) -> ChatCompletionMessageFunctionToolCall:
    return ChatCompletionMessageFunctionToolCall(
        id=call_id, type="function", function=Function(name=name, arguments=arguments)
    )


def test_each_provider_shape_becomes_a_tool_call() -> None:
    args = {"a": 2, "b": 3}
    calls = [
        openai_chat_call("add", json.dumps(args)),
        ResponseFunctionToolCall(
            type="function_call", call_id="c2", name="add", arguments=json.dumps(args)
        ),
        ToolUseBlock(type="tool_use", id="toolu_1", name="add", input=args),
        genai.Part(function_call=genai.FunctionCall(name="add", args=args, id="g1")),
        genai.FunctionCall(name="add", args=args),
        {"functionCall": {"name": "add", "args": args}},
    ]
    parsed = [parse_tool_call(c) for c in calls]
    assert [(p.name, p.arguments) for p in parsed] == [("add", args)] * len(calls)
    assert [p.provider for p in parsed] == [
        "openai-chat",
        "openai-responses",
        "anthropic",
        "gemini",
        "gemini",
        "gemini",
    ]
    assert [p.id for p in parsed[:4]] == ["call_1", "c2", "toolu_1", "g1"]


async def test_round_trip_through_the_toolkit() -> None:
    async with Toolkit(*CATALOGUE) as kit:
        call = parse_tool_call(openai_chat_call("fs_read", '{"path": "/x"}'), kit)
        assert call.name == "fs_read"
        result = await kit.execute(call.name, call.arguments)
        assert result.data == {"path": "/x"}

        # Strict mode made `limit` and `filters` required and nullable; the model sent nulls.
        assert to_openai([search])[0]["function"]["strict"] is True
        call = parse_tool_call(
            openai_chat_call("search", '{"query": "cats", "limit": null, "filters": null}'), kit
        )
        assert call.arguments == {"query": "cats", "filters": None}  # filters accepts null
        result = await kit.execute(call.name, call.arguments)
        assert result.success and result.data == ["cats", "cats"]

        nested = {
            "person": {
                "name": "Ada",
                "age": 36,
                "address": {"street": "1 Way", "city": "London", "zip_code": None},
                "previous": None,
                "favourite": None,
            },
            "notify": None,
        }
        call = parse_tool_call(
            ToolUseBlock(type="tool_use", id="t", name="register_person", input=nested), kit
        )
        assert "previous" not in call.arguments["person"]
        assert "notify" not in call.arguments
        result = await kit.execute(call.name, call.arguments)
        assert result.success, result.error
        assert result.data == "Ada in London"


def test_parse_tool_calls_finds_every_call_in_a_response() -> None:
    chat_response = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        openai_chat_call("add", '{"a": 1, "b": 2}', "c1").model_dump(),
                        openai_chat_call("ping", "", "c2").model_dump(),
                    ],
                }
            }
        ]
    }
    assert [c.name for c in parse_tool_calls(chat_response)] == ["add", "ping"]
    message = Message(
        id="msg",
        type="message",
        role="assistant",
        model="m",
        content=[
            TextBlock(type="text", text="let me add"),
            ToolUseBlock(type="tool_use", id="t1", name="add", input={"a": 1, "b": 1}),
        ],
        stop_reason="tool_use",
        stop_sequence=None,
        usage=Usage(input_tokens=1, output_tokens=1),
    )
    assert parse_tool_calls(message) == [ToolCall("add", {"a": 1, "b": 1}, "t1", "anthropic")]
    gemini = genai.GenerateContentResponse(
        candidates=[
            genai.Candidate(
                content=genai.Content(
                    role="model",
                    parts=[
                        genai.Part(text="adding"),
                        genai.Part(
                            function_call=genai.FunctionCall(name="add", args={"a": 1, "b": 2})
                        ),
                    ],
                )
            )
        ]
    )
    assert [c.arguments for c in parse_tool_calls(gemini)] == [{"a": 1, "b": 2}]
    responses_output = {
        "output": [
            {"type": "message", "content": []},
            {"type": "function_call", "call_id": "r1", "name": "ping", "arguments": "{}"},
        ]
    }
    assert [c.id for c in parse_tool_calls(responses_output, CATALOGUE)] == ["r1"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (openai_chat_call("fs.read", "{}"), "illegal tool name 'fs.read'"),
        (openai_chat_call("x" * 65, "{}"), "illegal tool name"),
        (openai_chat_call("add", "{not json"), "arguments of 'add' are not JSON"),
        (openai_chat_call("add", "[1, 2]"), "must be a JSON object, not list"),
        ({"type": "text", "text": "hi"}, "not a tool call of OpenAI, Anthropic or Gemini"),
        ("add", "must be an object"),
    ],
)
def test_bad_calls_are_clear_errors(call: object, message: str) -> None:
    with pytest.raises(ToolCallParseError, match=message):
        parse_tool_call(call)


def test_unknown_names_are_refused_with_a_suggestion() -> None:
    kit = Toolkit(*CATALOGUE)
    with pytest.raises(ToolCallParseError, match="unknown tool 'ad'; did you mean 'add'"):
        parse_tool_call(openai_chat_call("ad", "{}"), kit)
    with pytest.raises(ToolCallParseError, match="unknown tool 'nothing_like_it'"):
        parse_tool_call(openai_chat_call("nothing_like_it", "{}"), CATALOGUE)
    assert parse_tool_call(openai_chat_call("fs_read", "{}"), CATALOGUE).name == "fs.read"


class Email(BaseModel):
    kind: Literal["email"] = "email"
    to: str
    cc: str = ""  # optional, and null is not a string


class Sms(BaseModel):
    kind: Literal["sms"] = "sms"
    phone: str
    sender: str = "me"


@tool
def notify(channel: Email | Sms) -> str:
    """Notify someone."""
    return type(channel).__name__


async def test_added_nulls_are_dropped_inside_a_union_of_objects() -> None:
    async with Toolkit(notify) as kit:
        for sent, expected in [
            ({"to": "a@b.c", "cc": None, "kind": None}, ("Email", {"to": "a@b.c"})),
            (
                {"phone": "123", "sender": None, "kind": "sms"},
                ("Sms", {"phone": "123", "kind": "sms"}),
            ),
        ]:
            arguments = json.dumps({"channel": sent})
            call = parse_tool_call(openai_chat_call("notify", arguments), kit)
            assert call.arguments == {"channel": expected[1]}
            result = await kit.execute(call.name, call.arguments)
            assert result.success and result.data == expected[0], result


def test_whitespace_arguments_are_no_arguments() -> None:
    for blank in ("", "  ", "\n"):
        assert parse_tool_call(openai_chat_call("add", blank)).arguments == {}


_OBJECT_WITH_ODD_KEYS = {
    "type": "object",
    "properties": {"@id": {"type": "string"}, "x-y": {"type": "integer"}},
}
ODD_PLACES = ToolDefinition(
    name="odd_places",
    description="Keys a provider refuses, in every place a schema can nest them.",
    input_schema={
        "type": "object",
        "properties": {
            "union": {"anyOf": [{"$ref": "#/$defs/R"}, {"type": "string"}]},
            "pair": {"type": "array", "prefixItems": [{"$ref": "#/$defs/R"}, {"type": "integer"}]},
            "merged": {"allOf": [{"$ref": "#/$defs/R"}], "description": "one R"},
            "by_name": {"type": "object", "additionalProperties": {"$ref": "#/$defs/R"}},
            "lists": {
                "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/R"}}, {"type": "null"}]
            },
        },
        "$defs": {"R": _OBJECT_WITH_ODD_KEYS},
    },
)


def test_renamed_keys_map_back_inside_unions_tuples_all_of_and_dict_values() -> None:
    (gemini,) = to_gemini([ODD_PLACES])
    genai.Tool.model_validate(gemini)
    renamed = {"_id": "i", "x_y": 1}  # the keys of R in Gemini's form
    own = {"@id": "i", "x-y": 1}
    sent = {"union": renamed, "pair": [renamed, 2], "merged": renamed, "lists": [renamed]}
    call = parse_tool_call({"name": "odd_places", "args": sent}, [ODD_PLACES])
    assert call.arguments == {"union": own, "pair": [own, 2], "merged": own, "lists": [own]}
    (anthropic,) = to_anthropic([ODD_PLACES])
    assert list(anthropic["input_schema"]["$defs"]["R"]["properties"]) == ["_id", "x-y"]
    sent = {"by_name": {"k": {"_id": "i", "x-y": 1}}}
    use = {"type": "tool_use", "id": "t", "name": "odd_places", "input": sent}
    assert parse_tool_call(use, [ODD_PLACES]).arguments == {"by_name": {"k": own}}


def test_renamed_keys_map_back_by_the_calling_providers_rule() -> None:
    """Anthropic keeps "a.b" and renames "a b" to "a_b"; Gemini renames "a.b" to "a_b" and
    "a b" to "a_b_2": "a_b" means another key for each."""
    both = ToolDefinition(
        name="both",
        description="d",
        input_schema={
            "type": "object",
            "properties": {"a.b": {"type": "integer"}, "a b": {"type": "string"}},
        },
    )
    (gemini,) = to_gemini([both])
    assert list(gemini["function_declarations"][0]["parameters"]["properties"]) == [
        "a_b",
        "a_b_2",
    ]
    from_gemini = parse_tool_call({"name": "both", "args": {"a_b": 1, "a_b_2": "s"}}, [both])
    assert from_gemini.arguments == {"a.b": 1, "a b": "s"}
    use = {"type": "tool_use", "id": "t", "name": "both", "input": {"a.b": 1, "a_b": "s"}}
    assert parse_tool_call(use, [both]).arguments == {"a.b": 1, "a b": "s"}


async def test_a_call_to_a_root_union_reads_back_against_the_object_it_was_sent_as() -> None:
    """A union at the root goes to the provider as one object of every branch's properties; in
    strict mode a model sends null for each one it leaves out, and for keys renamed there."""

    async def echo(arguments: dict[str, object], ctx: object) -> object:
        return arguments

    from toolmesh import Tool

    branch = {"type": "object", "required": [], "additionalProperties": False}
    lookup = Tool(
        ToolDefinition(name="lookup", description="By id or by path."),
        echo,  # type: ignore[arg-type]
        input_schema={
            "anyOf": [
                {**branch, "properties": {"$id": {"type": "string"}}, "required": ["$id"]},
                {
                    **branch,
                    "properties": {"full_path": {"type": "string"}},
                    "required": ["full_path"],
                },
            ]
        },
    )
    (strict,) = to_openai([lookup])
    assert strict["function"]["strict"] is True
    call = parse_tool_call(openai_chat_call("lookup", '{"$id": "7", "full_path": null}'), [lookup])
    assert call.arguments == {"$id": "7"}
    use = {"type": "tool_use", "id": "t", "name": "lookup", "input": {"_id": "7"}}
    assert parse_tool_call(use, [lookup]).arguments == {"$id": "7"}  # Anthropic's "_id"
    async with Toolkit(lookup) as kit:
        result = await kit.execute(call.name, call.arguments)
    assert result.success, result
