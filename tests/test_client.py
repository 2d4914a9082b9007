"""The seed's ToolAPI (blocking) and AsyncToolAPI over every kind of target."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MAX_PARALLEL, Served, demo_host, serve_stdio_command
from tests.fixtures.waiting import Waiting
from toolmesh import (
    AsyncClient,
    AsyncToolAPI,
    CallTimeout,
    ConfigError,
    HandshakeError,
    Host,
    ToolAPI,
    TransportError,
    connect,
    connect_async,
)
from toolmesh.errors import ArgumentError, RemoteError
from toolmesh.models import ToolEvent
from toolmesh.protocol import (
    ApprovalResponse,
    HandshakeRequest,
    HandshakeResponse,
    ToolCallRequest,
)
from toolmesh.transports.http import HttpServer


def test_toolapi_in_process(tmp_path: Path) -> None:
    client = connect(demo_host(tmp_path / "a.db"), agent_id="sync")
    tools = ToolAPI(client)
    listed = tools.list()
    assert "echo" in [t.name for t in listed]
    assert client._tools_cache == listed and tools.list() == listed  # cached (as copies)
    assert tools.list(query="github", include_deferred=True)[0].name == "github_search"
    events: list[ToolEvent] = []
    result = tools.call(
        "read_file", {"path": "/etc/hostname"}, streaming=True, on_event=events.append
    )
    assert result.data == {"content": "my-host"} and len(events) == 1
    assert tools.call("echo", {"text": "hi"}, correlation_id="c1").output == "hi"
    client.close()


def test_the_blocking_client_reads_the_state(tmp_path: Path) -> None:
    with connect(serve_stdio_command(tmp_path / "a.db"), agent_id="sync") as client:
        assert client.get_state() == ({"context": {}}, 0)
        assert ToolAPI(client).call("remember", {"key": "k", "value": "v"}).success
        assert client.get_state() == ({"context": {"k": "v"}}, 1)


def test_toolapi_over_stdio(tmp_path: Path) -> None:
    with connect(serve_stdio_command(tmp_path / "a.db"), agent_id="sync") as client:
        tools = ToolAPI(client)
        assert tools.call("add", {"a": 1, "b": 2}).data == 3
        assert [t.name for t in tools.list(tags=["fs"])] == ["read_file"]


async def test_async_toolapi_over_http(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    try:
        client = await connect_async(url, agent_id="async")
        tools = AsyncToolAPI(client)
        results = await asyncio.gather(*(tools.call("add", {"a": i, "b": 1}) for i in range(10)))
        assert [r.data for r in results] == [i + 1 for i in range(10)]
        await client.close()
        # A scheme is case-insensitive (RFC 3986): HTTP://... is the same URL.
        shouting = await connect_async(url.replace("http://", "HTTP://"), agent_id="caps")
        assert (await AsyncToolAPI(shouting).call("add", {"a": 1, "b": 1})).data == 2
        await shouting.close()
    finally:
        await server.stop()
        await host.close()


async def test_async_toolapi_accepts_a_blocking_client(tmp_path: Path) -> None:
    client = await asyncio.to_thread(connect, demo_host(tmp_path / "a.db"))
    try:
        assert (await AsyncToolAPI(client).call("echo", {"text": "bridged"})).output == "bridged"
    finally:
        await asyncio.to_thread(client.close)


def test_toolapi_refuses_an_async_client(tmp_path: Path) -> None:
    async def make() -> object:
        return await connect_async(demo_host(None))

    client = asyncio.run(make())
    with pytest.raises(TypeError, match="AsyncToolAPI"):
        ToolAPI(client)  # type: ignore[arg-type]


def test_wrong_auth_token_is_refused() -> None:
    with pytest.raises(HandshakeError, match="auth_token"):
        connect(Host(demo_host(None).toolkit, auth_token="s3cret"), auth_token="guess")
    ok = connect(Host(demo_host(None).toolkit, auth_token="s3cret"), auth_token="s3cret")
    ok.close()


def test_unreachable_targets_are_clear_errors() -> None:
    with pytest.raises(TransportError, match="cannot reach") as unreached:
        connect("http://127.0.0.1:9")
    assert str(unreached.value).count("[transport_error]") == 1  # the cause's code not repeated
    with pytest.raises(TransportError, match="cannot start"):
        connect(["/nonexistent/toolmesh-host"])
    with pytest.raises(TransportError, match="cannot connect"):
        connect(42)  # type: ignore[arg-type]


def test_host_process_that_dies_fails_pending_calls(tmp_path: Path) -> None:
    with pytest.raises((TransportError, HandshakeError)):
        connect(["python3", "-c", "import sys; sys.stdin.readline()"])


class _RecordingChannel:
    """A channel to a pretend host: accepts the handshake and records what the client sends."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.answered = asyncio.Event()
        self.deliver: Callable[[object], None] = lambda message: None

    async def open(
        self, on_message: Callable[[object], None], on_close: Callable[[str], None]
    ) -> None:
        self.deliver = on_message

    async def send(self, message: object) -> None:
        self.sent.append(message)
        if isinstance(message, HandshakeRequest):
            self.deliver(HandshakeResponse(req_id=message.id, session_id="s1"))
        if isinstance(message, ApprovalResponse):
            self.answered.set()

    async def close(self) -> None:
        pass


async def _wire_answer(handler: Callable[[ToolEvent], object]) -> ApprovalResponse:
    channel = _RecordingChannel()
    client = await AsyncClient(channel, on_approval=handler).start()  # type: ignore[arg-type]
    channel.deliver(ToolEvent(kind="approval", req_id="c1", data={"approval_id": "ap1"}))
    await channel.answered.wait()
    await client.close()
    [answer] = [m for m in channel.sent if isinstance(m, ApprovalResponse)]
    return answer


async def _raises(event: ToolEvent) -> bool:
    raise RuntimeError("approver is down")


@pytest.mark.parametrize(
    ("handler", "reason"),
    [
        (lambda e: 1 / 0, "the approval handler raised ZeroDivisionError: division by zero"),
        (_raises, "the approval handler raised RuntimeError: approver is down"),
        (lambda e: "no", "the approval handler answered 'no' (str), not True or False"),
        (lambda e: None, "the approval handler answered None (NoneType), not True or False"),
    ],
)
async def test_a_failing_wire_approval_handler_denies_at_once_with_the_reason(
    handler: Callable[[ToolEvent], object], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="toolmesh.client"):
        answer = await _wire_answer(handler)
    assert (answer.req_id, answer.approved, answer.reason) == ("ap1", False, reason)
    assert reason in caplog.text


async def test_a_wire_approval_handler_answering_true_or_false_is_sent_as_is() -> None:
    approved = await _wire_answer(lambda e: True)
    denied = await _wire_answer(lambda e: False)
    assert (approved.approved, approved.reason) == (True, "")
    assert (denied.approved, denied.reason) == (False, "")


async def test_a_call_too_large_to_send_fails_at_once(served: Served) -> None:
    from tests.conftest import MAX_MESSAGE_BYTES

    huge = {"text": "x" * (MAX_MESSAGE_BYTES + 10)}
    if served.transport == "inprocess":  # no wire, no message: no size limit
        assert (await served.client.call_tool("echo", huge)).success
        return
    with pytest.raises(RemoteError, match="exceeds the limit"):  # not a wait for the timeout
        await served.client.call_tool("echo", huge, timeout=60)
    assert (await served.client.call_tool("echo", {"text": "ok"})).data == "ok"


async def test_calls_given_up_keep_their_slot_until_the_host_is_done(served: Served) -> None:
    """A2E cannot cancel a call: one the caller gave up on runs on at the host, which counts
    it against max_parallel. Its slot here is given back when the host answers it, so the
    next call waits for a free slot instead of being refused (max_parallel_exceeded)."""
    client = served.client

    async def hold_all() -> None:
        calls = [client.call_tool("hold", {"seconds": 1.5}) for _ in range(MAX_PARALLEL)]
        await asyncio.gather(*calls)

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):  # every call was sent at once; they hold 1.5 s
            await hold_all()
    result = await client.call_tool("echo", {"text": "next"})
    assert result.success and result.data == "next"


async def test_an_on_event_callback_that_raises_costs_neither_the_call_nor_the_session(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """The callback is the caller's: its failure is logged. It once failed the tool in-process
    (a retryable tool_error for a tool that had succeeded), left the answer unread over stdio
    until the call's timeout, and ended the HTTP stream (the whole session)."""

    def fails(_event: ToolEvent) -> None:
        raise RuntimeError("the caller's callback fails")

    client = served.client
    with caplog.at_level(logging.ERROR, logger="toolmesh.client"):
        result = await client.call_tool("count", {"n": 2}, on_event=fails, timeout=1)
    assert result.success and result.data == {"counted": 2} and len(result.events) == 2
    assert "on_event callback" in caplog.text
    assert (await client.call_tool("add", {"a": 1, "b": 2}, timeout=1)).data == 3


def test_the_blocking_client_refuses_a_call_from_its_own_thread(tmp_path: Path) -> None:
    """An on_event callback runs on the client's loop thread: using the blocking client there
    waited for itself forever (every later call too). It is refused, naming the cause."""
    import threading

    client = connect(demo_host(tmp_path / "a.db"))
    tools = ToolAPI(client)
    refusals: list[BaseException] = []

    def reenters(_event: ToolEvent) -> None:
        try:
            tools.list()
        except RuntimeError as exc:
            refusals.append(exc)

    outcome: list[object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(tools.call("count", {"n": 1}, on_event=reenters)),
        daemon=True,  # with the old code it never ends
    )
    worker.start()
    worker.join(timeout=30)
    assert outcome, "the call deadlocked"
    assert "its own event-loop thread" in str(refusals[0])
    assert tools.call("add", {"a": 1, "b": 1}).data == 2
    client.close()


def test_a_closed_blocking_client_says_it_is_closed(tmp_path: Path) -> None:
    client = connect(demo_host(tmp_path / "a.db"))
    tools = ToolAPI(client)
    assert tools.list()
    client.close()
    with pytest.raises(TransportError, match="client closed"):  # was "Event loop is closed"
        tools.list()
    with pytest.raises(TransportError, match="client closed"):
        tools.call("add", {"a": 1, "b": 1})


async def test_an_in_process_call_waiting_for_a_slot_fails_cleanly_on_close(
    tmp_path: Path,
) -> None:
    host = demo_host(tmp_path / "a.db")
    client = await connect_async(host)
    running = [
        asyncio.ensure_future(client.call_tool("hold", {"seconds": 60}))
        for _ in range(MAX_PARALLEL)
    ]
    waiting = asyncio.ensure_future(client.call_tool("echo", {"text": "late"}))
    slots = client._slots
    assert slots is not None
    while not slots._waiters:  # yield until the last call waits for a slot
        await asyncio.sleep(0)
    await client.close()
    with pytest.raises(TransportError, match="not connected"):  # was an AttributeError
        await waiting
    for call in running:
        assert (await call).error_code == "cancelled"
    await host.close()


async def test_a_call_after_the_connection_was_lost_fails_at_once(tmp_path: Path) -> None:
    """The HTTP stream ended (here: its reader stopped) while the host still takes POSTs: a
    later request was sent anyway and waited out its whole timeout for an answer."""
    host = demo_host(tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    client = await connect_async(url)
    try:
        channel: Any = client._channel
        channel._reader.cancel()
        await asyncio.gather(channel._reader, return_exceptions=True)
        async with asyncio.timeout(3):  # the call's own timeout plus grace is 6 s
            with pytest.raises(TransportError, match="not connected"):
                await client.call_tool("add", {"a": 1, "b": 1}, timeout=1)
    finally:
        await client.close()
        await server.stop()
        await host.close()


async def test_the_listing_cache_is_a_copy_and_follows_an_in_process_toolkit(
    tmp_path: Path,
) -> None:
    from toolmesh import Toolkit, tool

    @tool
    def first() -> str:
        """The first tool."""
        return "1"

    @tool
    def second() -> str:
        """The second tool."""
        return "2"

    toolkit = Toolkit([first])
    host = Host(toolkit, audit=None)
    client = await connect_async(host)
    try:
        tools = AsyncToolAPI(client)
        listed = await tools.list()
        listed.clear()  # the caller's list, not the cache
        assert [t.name for t in await tools.list()] == ["first"]
        toolkit.add(second)
        assert [t.name for t in await tools.list()] == ["first", "second"]  # was stale
    finally:
        await client.close()
        await host.close()


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
async def test_a_timeout_that_is_not_a_positive_number_is_refused(
    served: Served, timeout: float
) -> None:
    """Each side read these its own way: the host ran 0 or NaN under its default deadline
    (30 s) while the client gave up after its 5 s grace, NaN at once; inf was an
    invalid_message over the wire and an hour in-process."""
    with pytest.raises(ConfigError, match="timeout: must be a positive number of seconds"):
        await served.client.call_tool("add", {"a": 1, "b": 1}, timeout=timeout)


async def test_async_toolapi_over_a_closed_blocking_client_says_it_is_closed(
    tmp_path: Path,
) -> None:
    client = await asyncio.to_thread(connect, demo_host(tmp_path / "a.db"))
    await asyncio.to_thread(client.close)
    with pytest.raises(TransportError, match="client closed"):  # was "Event loop is closed"
        await AsyncToolAPI(client).call("echo", {"text": "x"})


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        ({"tool_name": None}, ConfigError, "tool_name: must be a tool's name (a str), not None"),
        ({"timeout": "5"}, ConfigError, "timeout: must be a positive number of seconds, not '5'"),
        ({"timeout": True}, ConfigError, "timeout: must be a positive number of seconds"),
        ({"streaming": "yes"}, ConfigError, "streaming: must be True or False, not 'yes'"),
        ({"on_event": 5}, ConfigError, "on_event: must be a callable or None, not 5"),
        ({"correlation_id": 7}, ConfigError, "correlation_id: must be a str or None, not 7"),
        ({"arguments": [1]}, ArgumentError, "the arguments must be a mapping of parameter"),
    ],
)
async def test_a_wrong_call_parameter_is_named(
    served: Served, call: dict[str, Any], error: type[Exception], says: str
) -> None:
    """They raised TypeErrors from deep inside ('NoneType' object is not iterable, '<' not
    supported between int and str), or pydantic's ValidationError over the wire only."""
    tools = AsyncToolAPI(served.client)
    with pytest.raises(error, match=re.escape(says)):
        await tools.call(**{"tool_name": "add", "arguments": {"a": 1, "b": 2}, **call})
    assert (await tools.call("add", {"a": 1, "b": 2})).data == 3  # the session goes on


async def test_arguments_none_are_no_arguments_and_names_must_be_text(served: Served) -> None:
    tools = AsyncToolAPI(served.client)
    result = await tools.call("echo", None)
    assert result.error_code == "invalid_arguments"  # echo needs a text: none was given
    assert "text" in (result.error or "")
    if served.transport != "inprocess":  # in-process the pipeline answers invalid_arguments
        with pytest.raises(ArgumentError, match=r"the arguments cannot be sent: arguments\.1"):
            await tools.call("echo", {1: "x"})


def test_the_blocking_toolapi_names_a_wrong_parameter_too(tmp_path: Path) -> None:
    with connect(demo_host(tmp_path / "a.db")) as client:
        tools = ToolAPI(client)
        assert tools.call("add", None).error_code == "invalid_arguments"
        with pytest.raises(ConfigError, match="tool_name: must be a tool's name"):
            tools.call(None, {})  # type: ignore[arg-type]
        with pytest.raises(
            ConfigError, match="tags: must be a list of tag names or None, not 'fs'"
        ):
            tools.list(tags="fs")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("listing", "says"),
    [
        ({"query": None}, "query: must be a str, not None"),
        ({"include_deferred": "no"}, "include_deferred: must be True or False, not 'no'"),
        ({"tags": "fs"}, "tags: must be a list of tag names or None, not 'fs'"),
        ({"tags": ["fs", 1]}, "tags: must be a list of tag names or None"),
        ({"kind": 3}, "kind: must be a str, not 3"),
    ],
)
async def test_a_wrong_listing_parameter_is_named(
    served: Served, listing: dict[str, Any], says: str
) -> None:
    """A str for tags was read as its characters (the tags "f" and "s"), silently."""
    with pytest.raises(ConfigError, match=re.escape(says)):
        await AsyncToolAPI(served.client).list(**listing)


async def test_an_answer_larger_than_the_client_reads_fails_its_call_at_once(
    tmp_path: Path,
) -> None:
    """The client skipped the oversized line and the call waited out its timeout (65 s)."""
    from toolmesh.transports.stdio import StdioChannel

    channel = StdioChannel(serve_stdio_command(tmp_path / "a.db"), max_message_bytes=100_000)
    client = await AsyncClient(channel).start()
    try:
        async with asyncio.timeout(20):
            with pytest.raises(RemoteError, match=r"could not be read: message of \d+ bytes"):
                await client.call_tool("echo", {"text": "x" * 150_000}, timeout=60)
        assert (await client.call_tool("echo", {"text": "small"})).data == "small"
    finally:
        await client.close()


async def test_closing_a_client_whose_call_was_given_up_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    """A caller cancelled (Ctrl-C) leaves its call running on the host: the client's close told
    the host to drain it for 10 s, and over HTTP waited that long. The host stops it now."""
    waiting = Waiting()
    host = Host(waiting.tool, audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    try:
        client = await connect_async(url)
        call = asyncio.ensure_future(AsyncToolAPI(client).call("wait_forever", {}))
        await waiting.until_started()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        async with asyncio.timeout(5):  # the drain would take 10 s
            await client.close()
    finally:
        await server.stop()
        await host.close()


class _StalledChannel:
    """A channel to a host that takes the connection, then never answers: ``open``, or the
    ``send`` of the handshake (the one named), waits forever."""

    def __init__(self, stalls: str) -> None:
        self.stalls = stalls
        self.closed = False

    async def open(
        self, on_message: Callable[[object], None], on_close: Callable[[str], None]
    ) -> None:
        if self.stalls == "open":
            await asyncio.Event().wait()

    async def send(self, message: object) -> None:
        if self.stalls == "send" and isinstance(message, HandshakeRequest):
            await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True


@pytest.mark.timeout(30)  # the guard: the opening and the handshake's send had no deadline
@pytest.mark.parametrize(
    ("stalls", "error", "says"),
    [
        ("open", TransportError, "the host did not answer within 0.2s of connecting"),
        ("send", CallTimeout, "no answer to the handshake within 0.2s of connecting"),
    ],
)
async def test_connecting_to_a_host_that_never_answers_fails_at_the_connect_timeout(
    stalls: str, error: type[Exception], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("toolmesh.client.CONNECT_TIMEOUT_SECONDS", 0.2, raising=False)
    channel = _StalledChannel(stalls)
    with pytest.raises(error, match=re.escape(says)):
        await AsyncClient(channel).start()  # type: ignore[arg-type]
    assert channel.closed


class _CallStallingChannel(_RecordingChannel):
    """A host that takes the handshake, then never finishes taking a tool call (an HTTP POST
    /send it does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.sending: list[ToolCallRequest] = []
        self.cancelled: list[ToolCallRequest] = []
        self.in_send = asyncio.Event()

    async def send(self, message: object) -> None:
        await super().send(message)
        if not isinstance(message, ToolCallRequest):
            return
        self.sending.append(message)
        self.in_send.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(message)
            raise


@pytest.mark.timeout(30)
async def test_close_fails_the_calls_whose_send_the_host_never_finished(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """close() set the calls' error on futures nobody awaited (their callers still waited on
    the send): asyncio logged 'Future exception was never retrieved', and each call ended only
    at its deadline, as a timeout."""
    channel = _CallStallingChannel()
    client = await AsyncClient(channel).start()  # type: ignore[arg-type]
    calls = [
        asyncio.ensure_future(client.call_tool("echo", {"text": str(i)}, timeout=600))
        for i in range(2)
    ]
    while len(channel.sending) < 2:
        channel.in_send.clear()
        await channel.in_send.wait()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        async with asyncio.timeout(5):  # (the calls' deadline is ten minutes away)
            await client.close()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        gc.collect()
    assert [type(o) for o in outcomes] == [TransportError, TransportError], outcomes
    assert all("connection to the host lost" in str(o) for o in outcomes)
    assert channel.cancelled == channel.sending  # the stalled sends end with their calls
    assert "never retrieved" not in caplog.text
