"""The agent loop against a local stub provider: tools through the pipeline, parallel calls,
max_turns, deferred tools and tool_search, deadlines, cancellation, events."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.llm_stub import (
    Answer,
    StubLLM,
    anthropic_calls,
    anthropic_text,
    openai_calls,
    openai_text,
)
from toolmesh import (
    CallTimeout,
    ConfigError,
    ProviderError,
    ToolDefinition,
    Toolkit,
    create_client,
    tool,
)
from toolmesh.llm import ChatMessage, ModelCall
from toolmesh.llm.loop import RunEvent
from toolmesh.store import MemoryStore
from toolmesh.tools import Tool, ToolContext


def scripted(*answers: Answer) -> Any:
    def answer(body: dict[str, Any], index: int) -> Answer:
        return answers[min(index, len(answers) - 1)]

    return answer


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_tool_calls_run_through_the_pipeline_openai() -> None:
    kit = Toolkit(add)
    answers = scripted(openai_calls(("c1", "add", {"a": 2, "b": 3})), openai_text("it is 5"))
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run("2+3?", toolkit=kit)
    assert result.text == "it is 5" and result.turns == 2
    first, second = (r.body for r in llm.requests)
    assert first["tools"][0]["function"]["name"] == "add"
    assert second["messages"][-2]["tool_calls"][0]["id"] == "c1"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    [(call, outcome)] = result.tool_calls
    assert call.arguments == {"a": 2, "b": 3} and outcome.data == 5
    assert isinstance(kit.store, MemoryStore)
    assert [e.tool_name for e in kit.store.audit] == ["add"]  # audited like any call
    assert result.usage.total_tokens == 6 + 5


async def test_tool_calls_anthropic_style() -> None:
    kit = Toolkit(add)
    answers = scripted(
        anthropic_calls(("t1", "add", {"a": 1, "b": 1}), ("t2", "add", {"a": 2, "b": 2})),
        anthropic_text("2 and 4"),
    )
    with StubLLM(answers) as llm:
        client = create_client(llm.base_url, style="anthropic", model="m")
        result = await client.run("sums", toolkit=kit)
    assert result.text == "2 and 4"
    second = llm.requests[1].body
    assert second["tools"][0]["name"] == "add" and "input_schema" in second["tools"][0]
    assert second["messages"][1]["content"][0]["type"] == "tool_use"
    results = second["messages"][2]
    assert results["role"] == "user"
    assert [(b["tool_use_id"], b["content"]) for b in results["content"]] == [
        ("t1", "2"),
        ("t2", "4"),
    ]


async def test_parallel_calls_run_concurrently_and_answer_in_call_order() -> None:
    first_started = asyncio.Event()
    second_started = asyncio.Event()

    @tool
    async def first() -> str:
        """Wait for the second call to start."""
        first_started.set()
        await second_started.wait()
        return "one"

    @tool
    async def second() -> str:
        """Wait for the first call to start."""
        second_started.set()
        await first_started.wait()
        return "two"

    answers = scripted(openai_calls(("a", "second", {}), ("b", "first", {})), openai_text("done"))
    with StubLLM(answers) as llm:
        client = create_client(llm.base_url, model="m")
        result = await client.run("both", toolkit=Toolkit(first, second), timeout=20)
    assert result.text == "done"
    results = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [("a", "two"), ("b", "one")]


async def test_max_turns_stops_a_model_that_keeps_calling() -> None:
    with StubLLM(scripted(openai_calls(("c", "add", {"a": 1, "b": 1})))) as llm:
        client = create_client(llm.base_url, model="m")
        result = await client.run("loop", toolkit=Toolkit(add), max_turns=3)
    assert result.stop_reason == "max_turns" and result.turns == 3
    assert len(llm.requests) == 3 and len(result.tool_calls) == 3


async def test_a_run_ended_by_max_turns_answers_the_models_last_text() -> None:
    """The text of the model's last step, not what its last tool call returned (the loop over
    the turn's results, cut to share ``max_turn_result_chars``, reused the name ``text``)."""
    answer = openai_calls(("c", "add", {"a": 20, "b": 22}))
    answer.body["choices"][0]["message"]["content"] = "adding"
    with StubLLM(scripted(answer)) as llm:
        client = create_client(llm.base_url, model="m")
        result = await client.run("loop", toolkit=Toolkit(add), max_turns=2)
    assert result.stop_reason == "max_turns" and result.text == "adding"


async def test_bad_arguments_and_unknown_tools_go_back_to_the_model() -> None:
    broken = Answer(
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "x", "function": {"name": "add", "arguments": "{not json"}},
                            {"id": "y", "function": {"name": "nope", "arguments": "{}"}},
                            {"id": "z", "function": {"name": "add", "arguments": '{"a": "1"}'}},
                        ],
                    }
                }
            ]
        }
    )
    with StubLLM(scripted(broken, openai_text("sorry"))) as llm:
        result = await create_client(llm.base_url, model="m").run("x", toolkit=Toolkit(add))
    codes = [outcome.error_code for _call, outcome in result.tool_calls]
    assert codes == ["invalid_arguments", "unknown_tool", "invalid_arguments"]
    sent = [m["content"] for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert sent[0].startswith("Error [invalid_arguments]: arguments of 'add' are not JSON")


def deferred_tool() -> Tool:
    async def forecast(arguments: dict[str, Any], ctx: ToolContext) -> str:
        return f"sunny in {arguments['city']}"

    definition = ToolDefinition(
        name="weather_forecast", description="Weather forecast for a city.", defer_loading=True
    )
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return Tool(definition, forecast, input_schema=schema)


async def test_deferred_tools_are_found_with_tool_search_and_offered_next_turn() -> None:
    kit = Toolkit(add, deferred_tool())
    answers = scripted(
        openai_calls(("s", "tool_search", {"query": "weather forecast"})),
        openai_calls(("w", "weather_forecast", {"city": "Oslo"})),
        openai_text("Sunny."),
    )
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run("weather?", toolkit=kit)
    offered = [[t["function"]["name"] for t in r.body["tools"]] for r in llm.requests]
    assert offered[0] == ["add", "tool_search"]
    assert offered[1] == ["add", "weather_forecast"]  # found: loaded, nothing left to search
    assert result.tool_calls[1][1].output == "sunny in Oslo"
    assert "weather_forecast" in result.tool_calls[0][1].output


async def test_bad_tool_search_arguments_go_back_to_the_model() -> None:
    kit = Toolkit(add, deferred_tool())
    answers = scripted(
        openai_calls(
            ("a", "tool_search", {"query": "weather", "limit": 0}),
            ("b", "tool_search", {"query": "weather", "limit": 500}),
            ("c", "tool_search", {"query": "weather", "limit": True}),
            ("d", "tool_search", {"query": 7}),
            ("e", "tool_search", {"query": "weather", "limit": 1}),
        ),
        openai_text("done"),
    )
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run("weather?", toolkit=kit)
    outcomes = [outcome for _call, outcome in result.tool_calls]
    assert [o.error_code for o in outcomes] == [*["invalid_arguments"] * 4, None]
    assert all("limit" in (o.error or "") for o in outcomes[:3])
    assert "query" in (outcomes[3].error or "")
    assert outcomes[4].data == ["weather_forecast"]


async def test_a_whole_float_limit_is_a_limit_not_a_crash() -> None:
    """JSON Schema counts 2.0 as an integer: it passed the check, then crashed the whole run
    with a TypeError from deep in the ranking."""

    def weather(kind: str) -> Tool:
        return deferred_tool().replace(
            name=f"weather_{kind}", description=f"Weather {kind} for a city."
        )

    kit = Toolkit(add, *(weather(k) for k in ("forecast", "alerts", "radar")))
    answers = scripted(
        openai_calls(
            ("a", "tool_search", {"query": "weather", "limit": 2.0}),
            ("b", "tool_search", {"query": "weather", "limit": 2.5}),
        ),
        openai_text("done"),
    )
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run("weather?", toolkit=kit)
    assert result.text == "done"
    (_, whole), (_, fraction) = result.tool_calls
    assert whole.success and len(whole.data) == 2, whole
    assert fraction.error_code == "invalid_arguments" and "limit" in (fraction.error or "")


async def test_the_toolkits_own_tool_search_loads_what_it_finds() -> None:
    kit = Toolkit(add, deferred_tool(), tool_search=True)
    answers = scripted(
        openai_calls(("s", "tool_search", {"query": "weather forecast"})),
        openai_calls(("w", "weather_forecast", {"city": "Oslo"})),
        openai_text("Sunny."),
    )
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run("weather?", toolkit=kit)
    offered = [[t["function"]["name"] for t in r.body["tools"]] for r in llm.requests]
    assert "weather_forecast" not in offered[0]
    assert "weather_forecast" in offered[1]  # the toolkit's tool_search found it: loaded
    assert result.tool_calls[1][1].output == "sunny in Oslo"


async def test_the_run_deadline_is_a_call_timeout() -> None:
    @tool
    async def wait_forever() -> None:
        """Never finish."""
        await asyncio.Event().wait()

    with StubLLM(scripted(openai_calls(("w", "wait_forever", {})))) as llm:
        client = create_client(llm.base_url, model="m")
        with pytest.raises(CallTimeout, match=r"within 0\.3s"):
            await client.run("wait", toolkit=Toolkit(wait_forever), timeout=0.3)


async def test_cancelling_a_run_cancels_its_tools() -> None:
    started = asyncio.Event()
    kit = Toolkit()

    @tool
    async def slow() -> None:
        """Wait until cancelled."""
        started.set()
        await asyncio.Event().wait()

    kit.register(slow)
    with StubLLM(scripted(openai_calls(("s", "slow", {})))) as llm:
        run = asyncio.ensure_future(create_client(llm.base_url, model="m").run("x", toolkit=kit))
        await started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert isinstance(kit.store, MemoryStore)
    assert [(e.tool_name, e.error_code) for e in kit.store.audit] == [("slow", "cancelled")]


async def test_events_in_order() -> None:
    events: list[RunEvent] = []
    answers = scripted(openai_calls(("c", "add", {"a": 1, "b": 2})), openai_text("3"))
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run(
            "1+2", toolkit=Toolkit(add), on_event=events.append
        )
    # ``done`` last, as ``client.stream`` yields it: a callback heard no end of the run
    assert [e.kind for e in events] == ["tool_call", "tool_result", "text", "done"]
    assert events[1].tool_result is not None and events[1].tool_result.data == 3
    assert events[-1].result is result and events[-1].turn == 2


async def test_stream_ends_with_one_done_and_raises_what_the_run_raised() -> None:
    with StubLLM(scripted(openai_text("hi"))) as llm:
        events = [e async for e in create_client(llm.base_url, model="m").stream("go")]
    assert [e.kind for e in events].count("done") == 1 and events[-1].kind == "done"
    with StubLLM(lambda body, i: Answer({"error": "overloaded"}, 503)) as llm:
        client = create_client(llm.base_url, model="m", max_retries=0)
        with pytest.raises(ProviderError):
            [e async for e in client.stream("go")]


async def test_history_tools_list_and_skills_prompt(tmp_path: Path) -> None:
    skill = tmp_path / "greet"
    skill.mkdir()
    (skill / "SKILL.md").write_text("---\nname: greet\ndescription: Say hello.\n---\nWave.\n")
    from toolmesh.sources.skills import SkillsSource

    kit = Toolkit(SkillsSource(tmp_path))
    history = [ChatMessage("user", "earlier"), ChatMessage("assistant", "noted")]
    with StubLLM(scripted(openai_text("ok"))) as llm:
        await create_client(llm.base_url, model="m", system="Base.").run(
            "now", toolkit=kit, history=history
        )
    messages = llm.requests[0].body["messages"]
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("Base.")
    assert "greet: Say hello." in messages[0]["content"]
    assert [m["content"] for m in messages[1:]] == ["earlier", "noted", "now"]
    assert json.dumps(llm.requests[0].body["tools"]).count('"skill"') == 1


@pytest.mark.parametrize("style", ["openai", "anthropic"])
async def test_call_ids_a_model_repeats_are_made_unique(style: str) -> None:
    make = openai_calls if style == "openai" else anthropic_calls
    final = openai_text("done") if style == "openai" else anthropic_text("done")
    answers = scripted(
        make(("c1", "add", {"a": 1, "b": 2}), ("c1", "add", {"a": 3, "b": 4})),
        make(("c1", "add", {"a": 5, "b": 6})),  # the same id again, a turn later
        final,
    )
    history = [
        ChatMessage("user", "before"),
        ChatMessage("assistant", "", [ModelCall("call_1_1", "add", {"a": 0, "b": 0})]),
        ChatMessage("tool", "0", [], "call_1_1"),
    ]
    with StubLLM(answers) as llm:
        client = create_client(llm.base_url, style=style, model="m")
        result = await client.run("sums", toolkit=Toolkit(add), history=history)
    ids = [call.id for call, _outcome in result.tool_calls]
    assert len(set(ids)) == 3 and ids[0] == "c1" and "call_1_1" not in ids
    assert [outcome.data for _call, outcome in result.tool_calls] == [3, 7, 11]
    wire = json.dumps(llm.requests[-1].body["messages"])
    for call, outcome in result.tool_calls:  # each result answers its own call, once
        if style == "openai":
            assert wire.count(f'"tool_call_id": "{call.id}"') == 1
            assert wire.count(f'"id": "{call.id}"') == 1
        else:
            assert wire.count(f'"tool_use_id": "{call.id}"') == 1
        assert f'"content": "{outcome.data}"' in wire


@pytest.mark.parametrize("style", ["openai", "anthropic"])
async def test_an_empty_reply_can_be_sent_back_as_history(style: str) -> None:
    empty = (
        Answer({"choices": [{"message": {"content": None}, "finish_reason": "stop"}]})
        if style == "openai"
        else Answer({"content": [], "stop_reason": "end_turn"})
    )
    final = openai_text("hello") if style == "openai" else anthropic_text("hello")
    with StubLLM(scripted(empty, final)) as llm:
        client = create_client(llm.base_url, style=style, model="m")
        first = await client.run("hi")
        assert first.text == "" and first.messages[-1].role == "assistant"
        await client.run("again?", history=first.messages)
    for message in llm.requests[1].body["messages"]:
        if message["role"] == "assistant":
            # OpenAI-style servers refuse null content without tool calls; Anthropic an empty one
            assert message["content"] not in (None, [])
    if style == "anthropic":
        assert [m["role"] for m in llm.requests[1].body["messages"]] == ["user", "user"]


# -- a turn's results share a budget ----------------------------------------------------------------


@tool
def blob(n: int) -> str:
    """n characters."""
    return "x" * n


async def test_the_results_of_one_turn_share_max_turn_result_chars() -> None:
    # Each result is bounded on its own (200,000 characters); many parallel calls would still
    # send the provider more than its context holds, and the run would end in its refusal.
    calls = openai_calls(
        ("c1", "blob", {"n": 100}), ("c2", "blob", {"n": 5000}), ("c3", "blob", {"n": 5000})
    )
    with StubLLM(scripted(calls, openai_text("ok"))) as llm:
        client = create_client(llm.base_url, model="m")
        result = await client.run("go", toolkit=Toolkit(blob), max_turn_result_chars=6000)
    sent = {m["tool_call_id"]: m["content"] for m in llm.requests[1].body["messages"][-3:]}
    assert sent["c1"] == "x" * 100  # within an even share: whole
    for cut in (sent["c2"], sent["c3"]):  # the rest share what is left: (6000 - 100) / 2 each
        kept, _, note = cut.partition("\n")
        assert kept == "x" * 2950
        assert note == (
            "[... cut here: 5000 characters in all; the 3 tool results of this turn share 6000]"
        )
    # What the model saw is the conversation; the results themselves stay whole.
    assert [m.text for m in result.messages if m.role == "tool"] == list(sent.values())
    assert [len(outcome.data) for _call, outcome in result.tool_calls] == [100, 5000, 5000]


async def test_max_turn_result_chars_none_sends_every_result_whole() -> None:
    calls = openai_calls(("c1", "blob", {"n": 3000}), ("c2", "blob", {"n": 3000}))
    with StubLLM(scripted(calls, openai_text("ok"))) as llm:
        client = create_client(llm.base_url, model="m")
        await client.run("go", toolkit=Toolkit(blob), max_turn_result_chars=None)
    assert [m["content"] for m in llm.requests[1].body["messages"][-2:]] == ["x" * 3000] * 2


@pytest.mark.parametrize("bad", [0, -5, True, 2.5, "100"])
async def test_max_turn_result_chars_must_be_a_positive_whole_number(bad: Any) -> None:
    client = create_client("http://127.0.0.1:9", model="m")
    with pytest.raises(ConfigError, match="max_turn_result_chars must be a whole number"):
        await client.run("go", toolkit=Toolkit(blob), max_turn_result_chars=bad)


# -- calls read against the tools each request offered -------------------------------------------


def deferred_tool_with_an_option() -> Tool:
    async def forecast(arguments: dict[str, Any], ctx: ToolContext) -> str:
        return f"{arguments.get('days', 1)} days of sun in {arguments['city']}"

    definition = ToolDefinition(
        name="weather_forecast", description="Weather forecast for a city.", defer_loading=True
    )
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"],
        "additionalProperties": False,
    }
    return Tool(definition, forecast, input_schema=schema)


@pytest.mark.parametrize("own_search", [False, True], ids=["loops_search", "toolkits_search"])
async def test_strict_nulls_reach_neither_tool_search_nor_a_tool_it_loaded(
    own_search: bool,
) -> None:
    """OpenAI's strict mode makes optional arguments nullable and required, so a model leaves
    one out as null: ``tool_search``'s ``limit``, then the optional argument of the deferred tool
    it found. Both were run with the null and refused (``$.limit: must be integer``)."""
    kit = Toolkit(add, deferred_tool_with_an_option(), tool_search=own_search)
    search: dict[str, Any] = {"query": "weather forecast", "limit": None}
    if own_search:
        search = {"query": "weather forecast", **dict.fromkeys(_optional_of(kit), None)}
    answers = scripted(
        openai_calls(("s", "tool_search", search)),
        openai_calls(("w", "weather_forecast", {"city": "Oslo", "days": None})),
        openai_text("Sunny."),
    )
    with StubLLM(answers) as llm:
        result = await create_client(llm.base_url, model="m").run("weather?", toolkit=kit)
    first = {t["function"]["name"]: t["function"] for t in llm.requests[0].body["tools"]}
    assert first["tool_search"]["strict"] is True
    [(_, found), (call, ran)] = result.tool_calls
    assert found.success, found
    assert "weather_forecast" in [t["function"]["name"] for t in llm.requests[1].body["tools"]]
    assert call.arguments == {"city": "Oslo"}
    assert ran.success and ran.output == "1 days of sun in Oslo", ran


def _optional_of(kit: Toolkit) -> list[str]:
    schema = kit["tool_search"].input_schema
    return [k for k in schema["properties"] if k not in schema.get("required", ())]
