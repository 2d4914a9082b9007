"""The Gemini style (``create_client(..., style="gemini")``, the generateContent API) against a
local stub provider: the exact requests, the agent loop, streaming, blocked and malformed
answers, retries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.genai import types as genai

from tests.fixtures.llm_stub import (
    Answer,
    StubLLM,
    gemini_calls,
    gemini_response,
    gemini_text,
)
from tests.llm.test_loop import add, deferred_tool, scripted
from toolmesh import ConfigError, ProviderError, Toolkit, create_client
from toolmesh.llm import ChatMessage, LLMClient, ModelCall
from toolmesh.llm.loop import RunEvent
from toolmesh.llm.styles import GEMINI_MADE_UP_ID, GEMINI_NO_SIGNATURE


def gemini(base_url: str, **settings: Any) -> LLMClient:
    settings.setdefault("model", "gemini-test")
    return create_client(base_url, style="gemini", **settings)


def check_with_genai(body: dict[str, Any]) -> None:
    """The request's fields are what google-genai's own types (no unknown keys) accept."""
    assert set(body) <= {"contents", "systemInstruction", "tools", "generationConfig"}
    for content in [
        *body["contents"],
        *([body["systemInstruction"]] if "systemInstruction" in body else []),
    ]:
        genai.Content.model_validate(content)
    for entry in body.get("tools", []):
        genai.Tool.model_validate(entry)
    genai.GenerationConfig.model_validate(body.get("generationConfig", {}))


# -- the requests ----------------------------------------------------------------------------------


async def test_the_first_and_second_request_of_a_tool_call() -> None:
    kit = Toolkit(add)
    answers = scripted(gemini_calls(("add", {"a": 2, "b": 3})), gemini_text("it is 5"))
    with StubLLM(answers) as llm:
        client = gemini(llm.base_url, api_key="g-key", system="Be brief.")
        result = await client.run("2+3?", toolkit=kit)
    first, second = llm.requests
    for seen in (first, second):
        check_with_genai(seen.body)
        assert seen.path == "/v1/models/gemini-test:generateContent"
        assert seen.headers["x-goog-api-key"] == "g-key"
        assert "Authorization" not in seen.headers
    question = {"role": "user", "parts": [{"text": "2+3?"}]}
    assert first.body == {  # the model is in the URL, a stream in the endpoint: neither here
        "contents": [question],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": kit.to_gemini(),
    }
    unsigned = {
        "functionCall": {"name": "add", "args": {"a": 2, "b": 3}},
        "thoughtSignature": GEMINI_NO_SIGNATURE,  # Gemini signed nothing: the stand-in
    }
    assert second.body["contents"] == [
        question,
        {"role": "model", "parts": [unsigned]},
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "add", "response": {"output": "5"}}}],
        },
    ]
    assert result.text == "it is 5" and result.turns == 2 and result.stop_reason == "STOP"
    [(call, outcome)] = result.tool_calls
    assert call.arguments == {"a": 2, "b": 3} and outcome.data == 5
    assert call.id.startswith(GEMINI_MADE_UP_ID)  # Gemini gave none; not sent back
    assert (result.usage.input_tokens, result.usage.output_tokens) == (6 + 4, 1 + 2)


async def test_ids_and_thought_signatures_gemini_gives_are_sent_back() -> None:
    answer = Answer(
        gemini_response(
            {"text": "Let me see.", "thought": True},  # a thought summary: not the answer
            {"text": "Adding."},
            {
                "functionCall": {"id": "fc-1", "name": "add", "args": {"a": 1}},
                "thoughtSignature": "c2ln",
            },
            {"functionCall": {"name": "nope", "args": {}}},
        )
    )
    with StubLLM(scripted(answer, gemini_text("done"))) as llm:
        result = await gemini(llm.base_url).run("go", toolkit=Toolkit(add))
    check_with_genai(llm.requests[1].body)
    model, answers = llm.requests[1].body["contents"][1:]
    assert model == {
        "role": "model",
        "parts": [
            {"text": "Adding."},
            {
                "functionCall": {"id": "fc-1", "name": "add", "args": {"a": 1}},
                "thoughtSignature": "c2ln",
            },
            {"functionCall": {"name": "nope", "args": {}}},
        ],
    }
    first, second = (p["functionResponse"] for p in answers["parts"])
    # A failure (here arguments the schema refuses, an unknown tool) goes back as "error".
    assert first["id"] == "fc-1" and first["name"] == "add"
    assert first["response"]["error"].startswith("Error [invalid_arguments]")
    assert "id" not in second and second["name"] == "nope"
    assert second["response"] == {"error": "Error [unknown_tool]: unknown tool 'nope'"}
    assert result.tool_calls[0][0].id == "fc-1"
    assert result.messages[1].text == "Adding."


async def test_calls_another_model_made_carry_the_documented_stand_in_signature() -> None:
    # A history from an OpenAI or Anthropic run has no signatures; Gemini 3 refuses a call of
    # the current turn without one (400 "Function call is missing a thought_signature").
    history = [
        ChatMessage(role="user", text="sum both"),
        ChatMessage(
            role="assistant",
            tool_calls=[
                ModelCall(id="call_a", name="add", arguments={"a": 1, "b": 2}),
                ModelCall(id="call_b", name="add", arguments={"a": 3, "b": 4}),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="call_a", text="3"),
        ChatMessage(role="tool", tool_call_id="call_b", text="7"),
        ChatMessage(role="assistant", text="3 and 7"),
        ChatMessage(role="user", text="again, signed"),
        ChatMessage(
            role="assistant",
            tool_calls=[
                ModelCall(id="fc-1", name="add", arguments={"a": 1}, signature="c2ln"),
                ModelCall(id="fc-2", name="add", arguments={"a": 2}),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="fc-1", text="1"),
        ChatMessage(role="tool", tool_call_id="fc-2", text="2"),
    ]
    with StubLLM(scripted(gemini_text("done"))) as llm:
        await gemini(llm.base_url).complete(history)
    [request] = llm.requests
    check_with_genai(request.body)
    model = [c["parts"] for c in request.body["contents"] if c["role"] == "model"]
    other, _answer, signed = model
    # Only the first call of a step is signed, as Gemini signs parallel calls.
    assert other[0]["thoughtSignature"] == GEMINI_NO_SIGNATURE
    assert "thoughtSignature" not in other[1]
    assert signed[0]["thoughtSignature"] == "c2ln" and "thoughtSignature" not in signed[1]


async def test_a_call_renumbered_by_the_loop_keeps_its_thought_signature() -> None:
    # Two calls of one turn under one id: the loop gives the second a fresh id, and rebuilt it
    # without its thoughtSignature (Gemini 3 refuses the next request then).
    calls = [
        {"functionCall": {"id": "fc", "name": "add", "args": {"a": 1, "b": 1}}},
        {
            "functionCall": {"id": "fc", "name": "add", "args": {"a": 2, "b": 2}},
            "thoughtSignature": "c2ln",
        },
    ]
    with StubLLM(scripted(Answer(gemini_response(*calls)), gemini_text("done"))) as llm:
        result = await gemini(llm.base_url).run("go", toolkit=Toolkit(add))
    first, second = (call for call, _outcome in result.tool_calls)
    assert first.id == "fc" and second.id not in ("", "fc") and second.signature == "c2ln"
    parts = llm.requests[1].body["contents"][1]["parts"]
    assert parts[1] == {
        "functionCall": {"id": second.id, "name": "add", "args": {"a": 2, "b": 2}},
        "thoughtSignature": "c2ln",
    }


async def test_a_model_named_with_its_resource_prefix_and_a_stream() -> None:
    streamed = Answer(events=[("", gemini_response({"text": "hi"}))])
    with StubLLM(scripted(streamed, gemini_text("hi"))) as llm:
        client = gemini(llm.base_url + "/", model="models/gemini-2.5-flash")
        await client.run("a", stream=True)
        await client.run("b")
    assert [r.path for r in llm.requests] == [
        "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        "/v1/models/gemini-2.5-flash:generateContent",
    ]
    assert "stream" not in llm.requests[0].body


async def test_options_are_top_level_fields_and_complete_reads_one_reply() -> None:
    config = {"temperature": 0, "maxOutputTokens": 64}
    with StubLLM(lambda body, i: gemini_text("hello")) as llm:
        client = gemini(llm.base_url, options={"generationConfig": config})
        reply = await client.complete([ChatMessage("user", "hi")], system="Greet.")
    check_with_genai(llm.requests[0].body)
    assert llm.requests[0].body == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": config,
        "systemInstruction": {"parts": [{"text": "Greet."}]},
    }
    assert (reply.text, reply.stop_reason, reply.tool_calls) == ("hello", "STOP", [])
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 2)


async def test_thinking_tokens_count_as_output() -> None:
    answer = gemini_response({"text": "42"})
    answer["usageMetadata"] = {
        "promptTokenCount": 10,
        "candidatesTokenCount": 3,
        "thoughtsTokenCount": 20,
        "totalTokenCount": 33,
    }
    with StubLLM(lambda body, i: Answer(answer)) as llm:
        result = await gemini(llm.base_url).run("?")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 23)
    assert result.usage.total_tokens == 33


# -- the agent loop --------------------------------------------------------------------------------


async def test_parallel_calls_answer_in_call_order_in_one_content() -> None:
    answers = scripted(
        gemini_calls(("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2})), gemini_text("2, 4")
    )
    with StubLLM(answers) as llm:
        result = await gemini(llm.base_url).run("sums", toolkit=Toolkit(add))
    assert result.text == "2, 4"
    *_, responses = llm.requests[1].body["contents"]
    assert responses["role"] == "user"
    assert [p["functionResponse"]["response"] for p in responses["parts"]] == [
        {"output": "2"},
        {"output": "4"},
    ]


async def test_call_ids_are_unique_across_turns_and_history_ids_go_back() -> None:
    answers = scripted(
        gemini_calls(("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})),
        gemini_calls(("add", {"a": 5, "b": 6})),
        gemini_text("done"),
    )
    history = [  # from another run (another style, perhaps): its ids are kept
        ChatMessage("user", "before"),
        ChatMessage("assistant", "", [ModelCall("call_1_1", "add", {"a": 0, "b": 0})]),
        ChatMessage("tool", "0", [], "call_1_1"),
    ]
    with StubLLM(answers) as llm:
        result = await gemini(llm.base_url).run("sums", toolkit=Toolkit(add), history=history)
    ids = [call.id for call, _outcome in result.tool_calls]
    assert len(set(ids)) == 3 and "call_1_1" not in ids
    assert [outcome.data for _call, outcome in result.tool_calls] == [3, 7, 11]
    check_with_genai(llm.requests[-1].body)
    wire = llm.requests[-1].body["contents"]
    assert wire[1]["parts"][0]["functionCall"]["id"] == "call_1_1"
    assert wire[2]["parts"][0]["functionResponse"]["id"] == "call_1_1"
    assert json.dumps(wire).count('"id"') == 2  # the ids made up here are not sent
    responses = [p["functionResponse"] for c in wire for p in c["parts"] if "functionResponse" in p]
    assert [r["response"] for r in responses] == [{"output": str(n)} for n in (0, 3, 7, 11)]


async def test_max_turns_stops_a_model_that_keeps_calling() -> None:
    with StubLLM(scripted(gemini_calls(("add", {"a": 1, "b": 1})))) as llm:
        result = await gemini(llm.base_url).run("loop", toolkit=Toolkit(add), max_turns=3)
    assert result.stop_reason == "max_turns" and len(llm.requests) == 3


async def test_deferred_tools_are_found_with_tool_search() -> None:
    answers = scripted(
        gemini_calls(("tool_search", {"query": "weather forecast"})),
        gemini_calls(("weather_forecast", {"city": "Oslo"})),
        gemini_text("Sunny."),
    )
    with StubLLM(answers) as llm:
        result = await gemini(llm.base_url).run("weather?", toolkit=Toolkit(add, deferred_tool()))
    offered = [
        [d["name"] for d in r.body["tools"][0]["function_declarations"]] for r in llm.requests
    ]
    assert offered[0] == ["add", "tool_search"]
    assert offered[1] == ["add", "weather_forecast"]
    assert result.tool_calls[1][1].output == "sunny in Oslo"


async def test_an_empty_reply_can_be_sent_back_as_history() -> None:
    empty = Answer(gemini_response())  # a model may answer no parts at all
    with StubLLM(scripted(empty, gemini_text("hello"))) as llm:
        client = gemini(llm.base_url)
        first = await client.run("hi")
        assert first.text == "" and first.messages[-1].role == "assistant"
        await client.run("again?", history=first.messages)
    # Gemini refuses a content without parts: the empty reply is left out.
    assert [c["role"] for c in llm.requests[1].body["contents"]] == ["user", "user"]


async def test_a_tool_result_answering_no_call_is_a_config_error() -> None:
    client = gemini("http://127.0.0.1:9/v1beta")
    with pytest.raises(ConfigError, match="answers no call of the conversation"):
        await client.run("go", history=[ChatMessage("tool", "5", [], "lost")])


# -- streaming -------------------------------------------------------------------------------------


async def test_streaming_text() -> None:
    chunks = [
        (
            "",
            gemini_response({"text": "Thinking.", "thought": True}, finish_reason=None, usage=None),
        ),
        ("", gemini_response({"text": "Hel"}, finish_reason=None, usage=None)),
        ("", gemini_response({"text": "lo"}, usage=(2, 5))),
    ]
    with StubLLM(lambda body, i: Answer(events=chunks)) as llm:
        events = [e async for e in gemini(llm.base_url).stream("hi")]
    assert llm.requests[0].path == "/v1/models/gemini-test:streamGenerateContent?alt=sse"
    assert [e.text for e in events if e.kind == "text"] == ["Hel", "lo"]
    done = events[-1].result
    assert done is not None and done.text == "Hello" and done.stop_reason == "STOP"
    assert (done.usage.input_tokens, done.usage.output_tokens) == (2, 5)


async def test_a_streamed_function_call() -> None:
    call = {"functionCall": {"name": "add", "args": {"a": 2, "b": 5}}, "thoughtSignature": "c2ln"}
    chunks = [
        ("", gemini_response({"text": "Sure."}, finish_reason=None, usage=None)),
        ("", gemini_response(call, usage=(3, 4))),
    ]

    def answer(body: dict[str, Any], index: int) -> Answer:
        return (
            Answer(events=chunks)
            if index == 0
            else Answer(events=[("", gemini_response({"text": "7"}))])
        )

    with StubLLM(answer) as llm:
        events = [e async for e in gemini(llm.base_url).stream("2+5", toolkit=Toolkit(add))]
    [called] = [e.call for e in events if e.kind == "tool_call"]
    assert called is not None and called.arguments == {"a": 2, "b": 5}
    [finished] = [e.tool_result for e in events if e.kind == "tool_result"]
    assert finished is not None and finished.data == 7
    assert events[-1].result is not None and events[-1].result.text == "7"
    check_with_genai(llm.requests[1].body)
    model = llm.requests[1].body["contents"][1]
    assert model == {
        "role": "model",
        "parts": [
            {"text": "Sure."},
            {"functionCall": {"name": "add", "args": {"a": 2, "b": 5}}, "thoughtSignature": "c2ln"},
        ],
    }


async def test_a_stream_cut_off_before_its_finish_reason_is_a_provider_error() -> None:
    chunks = [("", gemini_response({"text": "The answer is "}, finish_reason=None))]
    with StubLLM(lambda body, i: Answer(events=chunks)) as llm:
        client = gemini(llm.base_url, max_retries=0)
        with pytest.raises(ProviderError, match="was cut off"):
            await client.run("hi", stream=True)


async def test_an_error_reported_in_the_stream_is_named() -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    chunks = [("", gemini_response({"text": "Hi"}, finish_reason=None)), ("", error)]
    with StubLLM(lambda body, i: Answer(events=chunks)) as llm:
        client = gemini(llm.base_url, max_retries=0)
        with pytest.raises(ProviderError, match="The model is overloaded") as caught:
            await client.run("hi", stream=True)
    assert "cut off" not in str(caught.value) and "UNAVAILABLE" in caught.value.body


# -- blocked and malformed answers -----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_blocked_prompt_is_a_provider_error_naming_the_reason(stream: bool) -> None:
    blocked = {
        "promptFeedback": {
            "blockReason": "PROHIBITED_CONTENT",
            "safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT", "probability": "HIGH"}],
        },
        "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
    }
    answer = Answer(events=[("", blocked)]) if stream else Answer(blocked)
    with StubLLM(lambda body, i: answer) as llm:
        client = gemini(llm.base_url)
        with pytest.raises(ProviderError, match=r"blockReason: PROHIBITED_CONTENT") as caught:
            await client.run("bad", stream=stream)
    assert caught.value.status == 200 and not caught.value.retryable
    assert len(llm.requests) == 1


async def test_a_candidate_stopped_without_content_is_an_empty_answer() -> None:
    stopped = {"candidates": [{"finishReason": "SAFETY", "index": 0}]}
    with StubLLM(lambda body, i: Answer(stopped)) as llm:
        result = await gemini(llm.base_url).run("hm")
    assert (result.text, result.stop_reason) == ("", "SAFETY")


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({}, "no candidates"),
        ([gemini_response({"text": "x"})], "not an object"),  # streamGenerateContent without SSE
        ({"candidates": "x"}, "candidates is not a list of objects"),
        ({"candidates": ["x"]}, "candidates is not a list of objects"),
        ({"candidates": [{"content": "x"}]}, "parts is not a list of parts"),
        ({"candidates": [{"content": {"parts": {"text": "x"}}}]}, "parts is not a list of parts"),
        ({"candidates": [{"content": {"parts": ["x"]}}]}, "parts is not a list of parts"),
        ({"candidates": [{"content": {"parts": [{"functionCall": "add"}]}}]}, "list of parts"),
        ({"candidates": [{"content": {"parts": [{"text": 5}]}}]}, "does not expect"),
        (
            {**gemini_response({"text": "x"}), "usageMetadata": {"promptTokenCount": "many"}},
            "does not expect",
        ),
    ],
)
async def test_an_answer_of_another_shape_is_a_provider_error(answer: Any, says: str) -> None:
    with StubLLM(lambda body, i: Answer(answer)) as llm:
        client = gemini(llm.base_url, max_retries=0)
        with pytest.raises(ProviderError, match=says) as caught:
            await client.run("go")
    assert caught.value.status == 200


async def test_a_streamed_chunk_of_another_shape_is_a_provider_error() -> None:
    chunks = [("", {"candidates": [{"content": {"parts": [{"functionCall": ["add"]}]}}]})]
    with StubLLM(lambda body, i: Answer(events=chunks)) as llm:
        client = gemini(llm.base_url, max_retries=0)
        with pytest.raises(ProviderError, match="parts is not a list of parts"):
            await client.run("go", stream=True)


# -- errors and retries ----------------------------------------------------------------------------


async def test_429_is_retried() -> None:
    exhausted = {
        "error": {"code": 429, "message": "Quota exceeded.", "status": "RESOURCE_EXHAUSTED"}
    }

    def answer(body: dict[str, Any], index: int) -> Answer:
        return Answer(exhausted, 429, {"Retry-After": "0"}) if index == 0 else gemini_text("ok")

    events: list[RunEvent] = []
    with StubLLM(answer) as llm:
        client = gemini(llm.base_url, backoff=30.0)  # the backoff would be long
        result = await client.run("go", on_event=events.append)
    assert result.text == "ok" and result.retries == 1
    assert [(e.status, e.wait) for e in events if e.kind == "retry"] == [(429, 0.0)]
    assert [r.path for r in llm.requests] == ["/v1/models/gemini-test:generateContent"] * 2


async def test_the_retry_delay_gemini_gives_in_its_body_is_waited() -> None:
    # Gemini puts its wait in a RetryInfo detail of the body, not in a header: it was ignored
    # (exponential backoff instead), and a quota's "retry in an hour" not seen.
    def exhausted(delay: str) -> dict[str, Any]:
        info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
        return {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [info]}}

    def answer(body: dict[str, Any], index: int) -> Answer:
        return Answer(exhausted("0.01s"), 429) if index == 0 else gemini_text("ok")

    events: list[RunEvent] = []
    with StubLLM(answer) as llm:
        result = await gemini(llm.base_url, backoff=30.0).run("go", on_event=events.append)
    assert result.text == "ok"
    assert [(e.status, e.wait) for e in events if e.kind == "retry"] == [(429, 0.01)]
    hour = Answer(exhausted("3600s"), 429)
    with StubLLM(lambda body, i: hour) as llm, pytest.raises(ProviderError, match=r"wait 3600s"):
        await gemini(llm.base_url).run("go")
    assert len(llm.requests) == 1


async def test_a_refusal_says_what_gemini_said() -> None:
    invalid = {
        "error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}
    }
    with StubLLM(lambda body, i: Answer(invalid, 400)) as llm:
        client = gemini(llm.base_url, api_key="wrong")
        with pytest.raises(ProviderError, match=r"generateContent answered 400: API key not valid"):
            await client.run("go")
    assert len(llm.requests) == 1


async def test_a_429_wrapped_in_a_list_shows_its_message_and_waits_its_delay() -> None:
    # Google may wrap an error body in a list of one (google-genai unwraps it): the message was
    # shown as the raw JSON, and the RetryInfo delay not seen (backoff instead).
    info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.01s"}
    error = {"code": 429, "message": "Quota exceeded.", "status": "RESOURCE_EXHAUSTED"}
    wrapped = [{"error": {**error, "details": [info]}}]

    def answer(body: dict[str, Any], index: int) -> Answer:
        return Answer(wrapped, 429) if index == 0 else gemini_text("ok")

    events: list[RunEvent] = []
    with StubLLM(answer) as llm:
        result = await gemini(llm.base_url, backoff=30.0).run("go", on_event=events.append)
    assert result.text == "ok"
    assert [(e.status, e.wait) for e in events if e.kind == "retry"] == [(429, 0.01)]
    refusing = StubLLM(lambda body, i: Answer([{"error": error}], 403))
    with refusing as llm, pytest.raises(ProviderError) as refused:
        await gemini(llm.base_url).run("go")
    assert str(refused.value).endswith("answered 403: Quota exceeded.")


# -- a base URL with a query ------------------------------------------------------------------------


async def test_a_base_url_with_a_query_keeps_it_after_the_path() -> None:
    # An API key in the query (``?key=``, as Google's own examples pass it): the model's path
    # was appended after the query, so the server saw the wrong path, and a stream's "?alt=sse"
    # made a second "?".
    streamed = Answer(events=[("", gemini_response({"text": "hi"}))])
    with StubLLM(scripted(streamed, gemini_text("hi"))) as llm:
        client = gemini(llm.base_url + "/?key=g-key")
        await client.run("a", stream=True)
        await client.run("b")
    assert [r.path for r in llm.requests] == [
        "/v1/models/gemini-test:streamGenerateContent?key=g-key&alt=sse",
        "/v1/models/gemini-test:generateContent?key=g-key",
    ]


async def test_an_api_key_in_the_query_is_masked_in_messages() -> None:
    error = {"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}
    with StubLLM(lambda body, i: Answer(error, 400)) as llm:
        client = gemini(llm.base_url + "?key=s3cret-key")
        with pytest.raises(ProviderError) as refused:
            await client.run("go")
    assert "s3cret-key" not in str(refused.value) and "s3cret-key" not in repr(client)
    assert "key=***" in str(refused.value) and "API key not valid." in str(refused.value)
