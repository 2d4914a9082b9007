"""The LLM client against a local stub provider: both API styles, retries, errors, streaming."""

from __future__ import annotations

import asyncio
import email.utils
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fixtures.llm_stub import (
    Answer,
    StubLLM,
    anthropic_text,
    openai_text,
)
from toolmesh import ConfigError, ProviderError, create_client
from toolmesh.llm.client import retry_delay
from toolmesh.llm.loop import RunEvent


async def test_openai_style_request_and_answer() -> None:
    with StubLLM(lambda body, i: openai_text("hi there", 7, 3)) as llm:
        client = create_client(llm.base_url, "openai", "gpt-test", "sk-test", system="Be brief.")
        result = await client.run("hello")
    seen = llm.requests[0]
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["Authorization"] == "Bearer sk-test"
    assert seen.body["model"] == "gpt-test"
    assert seen.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert "tools" not in seen.body
    assert result.text == "hi there" and result.stop_reason == "stop" and result.turns == 1
    assert (result.usage.input_tokens, result.usage.output_tokens) == (7, 3)


async def test_anthropic_style_request_and_answer() -> None:
    with StubLLM(lambda body, i: anthropic_text("bonjour")) as llm:
        client = create_client(llm.base_url, style="anthropic", model="claude-test", api_key="k")
        result = await client.run("salut", system="Réponds en français.")
    seen = llm.requests[0]
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "k" and seen.headers["anthropic-version"]
    assert seen.body["system"] == "Réponds en français."
    assert seen.body["messages"] == [{"role": "user", "content": "salut"}]
    assert seen.body["max_tokens"] > 0
    assert result.text == "bonjour" and result.stop_reason == "end_turn"
    assert result.usage.total_tokens == 6


async def test_429_is_retried_after_what_retry_after_says() -> None:
    def answer(body: dict[str, Any], index: int) -> Answer:
        if index == 0:
            return Answer({"error": {"message": "slow down"}}, 429, {"Retry-After": "0"})
        return openai_text("finally")

    events: list[RunEvent] = []
    with StubLLM(answer) as llm:
        client = create_client(llm.base_url, model="m", backoff=30.0)  # backoff would be long
        result = await client.run("go", on_event=events.append)
    assert result.text == "finally" and result.retries == 1
    retry = next(e for e in events if e.kind == "retry")
    assert (retry.status, retry.wait) == (429, 0.0)
    assert len(llm.requests) == 2


async def test_5xx_is_retried_with_backoff_then_gives_up() -> None:
    with StubLLM(lambda body, i: Answer({"error": "overloaded"}, 503)) as llm:
        client = create_client(llm.base_url, model="m", max_retries=2, backoff=0.0)
        with pytest.raises(ProviderError) as caught:
            await client.run("go")
    assert caught.value.status == 503 and "overloaded" in str(caught.value)
    assert len(llm.requests) == 3


async def test_a_client_error_is_not_retried() -> None:
    bad = Answer({"error": {"message": "model not found"}}, 404)
    with StubLLM(lambda body, i: bad) as llm:
        client = create_client(llm.base_url, model="nope", backoff=0.0)
        with pytest.raises(ProviderError, match="model not found") as caught:
            await client.run("go")
    assert caught.value.status == 404 and not caught.value.retryable
    assert len(llm.requests) == 1


async def test_a_retry_that_would_pass_the_deadline_gives_up_at_once() -> None:
    late = Answer({"error": "later"}, 429, {"Retry-After": "120"})
    with StubLLM(lambda body, i: late) as llm:
        client = create_client(llm.base_url, model="m")
        started = time.monotonic()
        with pytest.raises(ProviderError, match="deadline"):
            await client.run("go", timeout=30)
    assert time.monotonic() - started < 10
    assert len(llm.requests) == 1


async def test_a_retry_after_beyond_max_retry_wait_fails_at_once() -> None:
    # Without a run timeout, "Retry-After: 3600" (an exhausted quota) held the run for an hour.
    quota = Answer({"error": "quota"}, 429, {"Retry-After": "3600"})
    with StubLLM(lambda body, i: quota) as llm:
        client = create_client(llm.base_url, model="m")
        with pytest.raises(ProviderError, match=r"wait 3600s .*max_retry_wait \(60s\)") as caught:
            await asyncio.wait_for(client.run("go"), 30)
        assert caught.value.status == 429 and caught.value.detail["retry_after"] == 3600.0
        assert len(llm.requests) == 1
    with pytest.raises(ConfigError, match="max_retry_wait"):
        create_client("http://127.0.0.1:9/v1", model="m", max_retry_wait=-1)


async def test_unreachable_provider_is_a_provider_error() -> None:
    client = create_client("http://127.0.0.1:9/v1", model="m", max_retries=1, backoff=0.0)
    with pytest.raises(ProviderError, match="no answer") as caught:
        await client.run("go")
    assert caught.value.status == 0


async def test_a_proxy_configured_for_the_host_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with StubLLM(lambda body, i: openai_text("direct")) as llm:
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # a proxy nobody answers at
        proxied = create_client(llm.base_url, model="m", max_retries=1, backoff=0.0)
        with pytest.raises(ProviderError, match="no answer"):
            await proxied.run("go")
        assert llm.requests == []  # it went to the proxy, not around it
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        bypassed = create_client(llm.base_url, model="m")
        assert (await bypassed.run("go")).text == "direct"


async def test_an_answer_in_the_wrong_shape_is_a_provider_error() -> None:
    with StubLLM(lambda body, i: Answer({"unexpected": True})) as llm:
        client = create_client(llm.base_url, model="m")
        with pytest.raises(ProviderError, match="expected shape"):
            await client.run("go")


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="style"):
        create_client("http://127.0.0.1:1/v1", style="cohere", model="m")
    with pytest.raises(ConfigError, match="model"):
        create_client("http://127.0.0.1:1/v1")
    with pytest.raises(ConfigError, match="URL"):
        create_client("127.0.0.1:1", model="m")
    with pytest.raises(ConfigError, match="options must be JSON"):
        create_client("http://127.0.0.1:1/v1", model="m", options={"temperature": float("nan")})
    for timeout in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="timeout must be a number of seconds above 0"):
            create_client("http://127.0.0.1:1/v1", model="m", timeout=timeout)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"timeout": 0}, "timeout must be"),
        ({"timeout": -1}, "timeout must be"),
        ({"tool_timeout": -1}, "tool_timeout must be"),
        ({"max_turns": 2.5}, "max_turns must be a whole number"),
        ({"max_turns": 0}, "max_turns must be a whole number"),
    ],
)
async def test_bad_run_settings_are_config_errors(options: dict[str, Any], says: str) -> None:
    client = create_client("http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ConfigError, match=says):
        await client.run("go", **options)


def test_retry_delay() -> None:
    assert retry_delay({"Retry-After": "2"}, 0, 0.5, 30) == 2.0
    assert retry_delay({"retry-after-ms": "250"}, 5, 0.5, 30) == 0.25
    soon = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 50 < retry_delay({"Retry-After": soon}, 0, 0.5, 30) <= 60
    assert 3.2 <= retry_delay({}, 3, 0.5, 30) <= 4.0  # 0.5 * 2**3, less up to 20% jitter
    assert 24 <= retry_delay({}, 10, 0.5, 30) <= 30  # capped


async def test_streaming_openai_text_and_tool_calls() -> None:
    chunks = [
        ("", {"choices": [{"delta": {"content": "Hel"}}]}),
        ("", {"choices": [{"delta": {"content": "lo"}}]}),
        ("", {"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ("", {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}),
        ("", "[DONE]"),
    ]
    with StubLLM(lambda body, i: Answer(events=chunks)) as llm:
        client = create_client(llm.base_url, model="m")
        events = [e async for e in client.stream("hi")]
    assert llm.requests[0].body["stream"] is True
    assert [e.text for e in events if e.kind == "text"] == ["Hel", "lo"]
    done = events[-1]
    assert done.kind == "done" and done.result is not None
    assert done.result.text == "Hello" and done.result.usage.output_tokens == 5


async def test_streaming_anthropic() -> None:
    events_sent = [
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 9}}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Bon"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "jour"},
            },
        ),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 4},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    with StubLLM(lambda body, i: Answer(events=events_sent)) as llm:
        client = create_client(llm.base_url, style="anthropic", model="m")
        result = await client.run("hi", stream=True)
    assert result.text == "Bonjour" and result.stop_reason == "end_turn"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (9, 4)


async def test_a_provider_that_ignores_stream_still_works() -> None:
    with StubLLM(lambda body, i: openai_text("whole")) as llm:
        client = create_client(llm.base_url, model="m")
        texts = [e.text async for e in client.stream("hi") if e.kind == "text"]
    assert texts == ["whole"]


async def test_streamed_tool_calls_are_assembled_in_both_styles() -> None:
    from toolmesh import Toolkit, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    openai_chunks = [
        (
            "",
            {
                "choices": [
                    {
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "c1",
                                    "function": {"name": "add", "arguments": '{"a": 2,'},
                                }
                            ]
                        }
                    }
                ]
            },
        ),
        (
            "",
            {
                "choices": [
                    {
                        "delta": {
                            "tool_calls": [{"index": 0, "function": {"arguments": ' "b": 5}'}}]
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            },
        ),
        ("", "[DONE]"),
    ]
    anthropic_events = [
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 1}}}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t1", "name": "add"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": 2, "b"'},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": ": 5}"},
            },
        ),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 3},
            },
        ),
    ]
    for style, first in (("openai", openai_chunks), ("anthropic", anthropic_events)):
        final = openai_text("7") if style == "openai" else anthropic_text("7")

        def answer(
            body: dict[str, Any], index: int, first: Any = first, final: Answer = final
        ) -> Answer:
            return Answer(events=first) if index == 0 else final

        with StubLLM(answer) as llm:
            client = create_client(llm.base_url, style=style, model="m")
            events = [e async for e in client.stream("2+5", toolkit=Toolkit(add))]
        calls = [e.call for e in events if e.kind == "tool_call"]
        assert calls[0] is not None and calls[0].arguments == {"a": 2, "b": 5}, style
        results = [e.tool_result for e in events if e.kind == "tool_result"]
        assert results[0] is not None and results[0].data == 7
        assert events[-1].result is not None and events[-1].result.text == "7"


@pytest.mark.parametrize(
    ("style", "events"),
    [
        ("openai", [("", {"choices": [{"delta": {"content": "The answer is "}}]})]),
        (
            "anthropic",
            [
                ("message_start", {"type": "message_start", "message": {"usage": {}}}),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "Hi"},
                    },
                ),
            ],
        ),
    ],
)
async def test_a_stream_cut_off_before_its_end_is_a_provider_error(
    style: str, events: list[Any]
) -> None:
    with StubLLM(lambda body, i: Answer(events=events)) as llm:
        client = create_client(llm.base_url, style, "m", max_retries=0)
        with pytest.raises(ProviderError, match="was cut off"):
            await client.run("hi", stream=True)


@pytest.mark.parametrize(
    "answer",
    [
        {"choices": [{"message": "hi"}]},
        {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "many"}},
    ],
)
async def test_an_answer_of_another_shape_is_a_provider_error(answer: dict[str, Any]) -> None:
    with StubLLM(lambda body, i: Answer(answer)) as llm:
        client = create_client(llm.base_url, model="m", max_retries=0)
        with pytest.raises(ProviderError, match="shape this client does not expect"):
            await client.run("go")


async def test_an_error_reported_in_an_openai_stream_is_named() -> None:
    """OpenAI-compatible servers (vLLM, LiteLLM, OpenAI itself) report a failure mid-stream as
    a chunk ``{"error": {...}}``; it was skipped, and the run failed as "cut off"."""
    error = {"error": {"message": "model overloaded", "type": "server_error", "code": 503}}
    events: list[tuple[str, Any]] = [
        ("", {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
        ("", error),
    ]
    with StubLLM(lambda body, i: Answer(events=events)) as llm:
        client = create_client(llm.base_url, model="m", max_retries=0)
        with pytest.raises(ProviderError, match="model overloaded") as caught:
            await client.run("hi", stream=True)
    assert "cut off" not in str(caught.value)
    assert "server_error" in caught.value.body


@pytest.fixture
def trickling_provider() -> Iterator[str]:
    """A model server that answers 200 and then sends a byte (or an SSE comment) every 50 ms
    and never ends the answer: each read succeeds, the request never does."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            streamed = "stream" in self.path
            self.send_response(200)
            kind = "text/event-stream" if streamed else "application/json"
            self.send_header("Content-Type", kind)
            self.end_headers()
            while not stop.wait(0.05):
                try:
                    self.wfile.write(b": ping\n\n" if streamed else b" ")
                    self.wfile.flush()
                except OSError:
                    return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("stream", [False, True])
async def test_timeout_bounds_a_request_that_trickles(
    trickling_provider: str, stream: bool
) -> None:
    """``timeout=`` bounds one request: a server trickling bytes (or SSE keep-alive comments)
    passed every per-read timeout, and the run (a served A2A task has no deadline of its own)
    waited forever."""
    base = trickling_provider + ("/stream/v1" if stream else "/v1")
    client = create_client(base, model="m", timeout=0.3, max_retries=0)
    started = time.monotonic()
    async with asyncio.timeout(20):  # the old client never returned
        with pytest.raises(ProviderError, match=r"within 0\.3s"):
            await client.run("hi", stream=stream)
    assert time.monotonic() - started < 10
    await client.aclose()


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_answer_past_the_size_limit_is_refused(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolmesh.llm.client as llm_client

    monkeypatch.setattr(llm_client, "MAX_ANSWER_BYTES", 1000)
    big = "x" * 5000
    chunks = [("", {"choices": [{"delta": {"content": big}}]}), ("", "[DONE]")]
    answer = Answer(events=chunks) if streamed else openai_text(big)
    with StubLLM(lambda body, i: answer) as llm:
        client = create_client(llm.base_url, model="m")

        async def ask() -> None:
            if streamed:
                [e async for e in client.stream("hi")]
            else:
                await client.run("hi")

        with pytest.raises(ProviderError, match="larger than 1000 bytes"):
            await ask()
    assert len(llm.requests) == 1  # not retried


def _tool_delta(**part: Any) -> tuple[str, Any]:
    return ("", {"choices": [{"index": 0, "delta": {"tool_calls": [part]}}]})


_END = [
    ("", {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ("", "[DONE]"),
]


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(  # Ollama and some gateways: every call of a turn at index 0
            [
                _tool_delta(index=0, id="a", function={"name": "add", "arguments": '{"a": 1,'}),
                _tool_delta(index=0, function={"arguments": ' "b": 1}'}),
                _tool_delta(index=0, id="b", function={"name": "add", "arguments": '{"a": 2,'}),
                _tool_delta(index=0, id="b", function={"arguments": ' "b": 2}'}),  # vLLM: id again
            ],
            id="index-reused",
        ),
        pytest.param(  # older servers: no index at all
            [
                _tool_delta(id="a", function={"name": "add", "arguments": '{"a": 1,'}),
                _tool_delta(function={"arguments": ' "b": 1}'}),
                _tool_delta(function={"name": "add", "arguments": '{"a": 2, "b": 2}'}),
            ],
            id="no-index",
        ),
    ],
)
async def test_streamed_parallel_calls_stay_apart_whatever_their_index(
    chunks: list[tuple[str, Any]],
) -> None:
    from toolmesh import Toolkit, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    def answer(body: dict[str, Any], index: int) -> Answer:
        return Answer(events=[*chunks, *_END]) if index == 0 else openai_text("2 and 4")

    with StubLLM(answer) as llm:
        client = create_client(llm.base_url, model="m", max_retries=0)
        result = await client.run("sums", toolkit=Toolkit(add), stream=True)
    assert [(c.name, c.arguments, r.data) for c, r in result.tool_calls] == [
        ("add", {"a": 1, "b": 1}, 2),
        ("add", {"a": 2, "b": 2}, 4),
    ]
    sent = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in sent] == ["2", "4"]


async def test_an_anthropic_tool_use_streamed_whole_in_its_start_keeps_its_input() -> None:
    from toolmesh import Toolkit, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    start = {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 3, "b": 4}}
    events = [
        ("message_start", {"type": "message_start", "message": {"usage": {}}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": start},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
        ("message_stop", {"type": "message_stop"}),
    ]

    def answer(body: dict[str, Any], index: int) -> Answer:
        return Answer(events=events) if index == 0 else anthropic_text("7")

    with StubLLM(answer) as llm:
        client = create_client(llm.base_url, style="anthropic", model="m", max_retries=0)
        result = await client.run("3+4", toolkit=Toolkit(add), stream=True)
    [(call, outcome)] = result.tool_calls
    assert call.arguments == {"a": 3, "b": 4} and outcome.data == 7


@pytest.mark.parametrize("listed", [{"id": "c"}, "add", [{"id": "c"}, "add"]])
async def test_tool_calls_that_are_not_a_list_of_objects_are_a_provider_error(
    listed: Any,
) -> None:
    answer = {"choices": [{"message": {"content": None, "tool_calls": listed}}]}
    with StubLLM(lambda body, i: Answer(answer)) as llm:
        client = create_client(llm.base_url, model="m", max_retries=0)
        with pytest.raises(ProviderError, match="tool_calls is not a list of objects"):
            await client.run("go")


KEY = "sk-SECRET-1234567890abcdef"


@pytest.mark.parametrize(
    "settings",
    [{"api_key": KEY}, {"headers": {"api-key": KEY}}],  # the second as Azure OpenAI takes it
    ids=["api_key", "header"],
)
async def test_a_key_the_provider_echoes_is_masked_in_the_error(settings: dict[str, Any]) -> None:
    """OpenAI answers a wrong key with "Incorrect API key provided: <the key>": it was in the
    ProviderError's message and body, and from there in logs and tracebacks."""
    refusal = Answer({"error": {"message": f"Incorrect API key provided: {KEY}."}}, 401)
    with StubLLM(lambda body, i: refusal) as llm:
        client = create_client(llm.base_url, model="m", **settings)
        with pytest.raises(
            ProviderError, match=r"answered 401: Incorrect API key provided: \*\*\*\."
        ) as caught:
            await client.run("hi")
    assert KEY not in str(caught.value) and KEY not in caught.value.body
    assert "***" in caught.value.body


async def test_the_wait_a_provider_asks_for_is_reported_as_asked() -> None:
    """A "Retry-After: 7200" was reported as "asks to wait 3.6e+03s", ``retry_after`` 3600:
    the client's own cap on one wait, not the provider's ask."""
    quota = Answer({"error": "quota"}, 429, {"Retry-After": "7200"})
    with StubLLM(lambda body, i: quota) as llm:
        with pytest.raises(ProviderError, match=r"asks to wait 7200s .*\(60s\)") as caught:
            await create_client(llm.base_url, model="m").run("go")
        assert caught.value.detail["retry_after"] == 7200.0
        # Waiting that long is allowed, but one wait is capped: both are said.
        client = create_client(llm.base_url, model="m", max_retry_wait=10_000)
        with pytest.raises(
            ProviderError, match=r"in 3600s; the provider asked for 7200s\) would pass"
        ):
            await client.run("go", timeout=30)
