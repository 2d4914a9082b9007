"""What a call returns is the same over every transport, and always arrives: a result is bounded
whole (error, metadata, events too), NaN and infinity are null everywhere, event data that is
not JSON is refused when emitted, and the approval event is streamed and returned alike."""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from toolmesh import (
    AsyncClient,
    Host,
    Limits,
    ToolContext,
    ToolErrorCode,
    ToolEvent,
    ToolResult,
    connect_async,
    tool,
)
from toolmesh.protocol import DEFAULT_MAX_MESSAGE_BYTES, ToolCallResponse, encode
from toolmesh.state import MAX_PATCH_BYTES
from toolmesh.transports.http import HttpServer

HUGE = 20_000_000  # characters: more than one wire message may carry (16 MiB)
WORST = "\x01"  # a character JSON writes as six bytes (\u0001): the costliest text there is


@tool
async def fail_loudly(n: int) -> str:
    """Fails with a long message."""
    raise RuntimeError("e" * n)


@tool
async def big_metadata(n: int) -> ToolResult:
    """A result with large metadata."""
    return ToolResult(
        success=True, tool_name="big_metadata", data="small", duration_ms=0, metadata={"m": "m" * n}
    )


@tool
async def big_log(ctx: ToolContext, n: int) -> str:
    """Logs a long line, then a short one."""
    ctx.log("l" * n)
    ctx.status("after")
    return "fine"


@tool
async def not_finite() -> dict[str, Any]:
    """Numbers JSON has not."""
    return {"nan": math.nan, "inf": math.inf, "list": [-math.inf, 1.5]}


@tool
async def nan_alone() -> float:
    """Not a number."""
    return math.nan


@tool
async def emits_an_object(ctx: ToolContext) -> str:
    """Emits data that is not JSON."""
    ctx.emit("custom", {"when": object()})
    return "done"


@tool(requires_approval=True)
async def deploy(env: str) -> str:
    """Deploys, once approved."""
    return f"deployed {env}"


@tool
async def maximal(ctx: ToolContext) -> ToolResult:
    """Every part of a result as large as the default limits let it be, in the costliest text."""
    limits = Limits()
    text = WORST * (2 * limits.max_output_chars)
    ctx.log(WORST * ((limits.max_events_bytes - 300) // 6))  # about all the events may keep
    ctx.status("left out of the result: the events' budget is spent")
    value = WORST * ((MAX_PATCH_BYTES - 100) // 6)  # the largest update the state takes
    return ToolResult(
        success=True,
        tool_name="maximal",
        output=text,
        error=text,
        data=text,
        metadata={"m": WORST * (limits.max_metadata_bytes // 6 - 10)},
        state_update=[{"op": "add", "path": "/context/big", "value": value}],
        duration_ms=0,
    )


TOOLS = [
    fail_loudly,
    big_metadata,
    big_log,
    not_finite,
    nan_alone,
    emits_an_object,
    deploy,
    maximal,
]

Connect = Callable[..., Awaitable[AsyncClient]]


@pytest.fixture(params=["inprocess", "stdio", "http"])
async def connect(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Connect]:
    """Connects clients (with the options given) to a host of TOOLS over each transport."""
    clients: list[AsyncClient] = []
    host = Host(*TOOLS, audit=tmp_path / "audit.db")
    server = HttpServer(host, "127.0.0.1:0") if request.param == "http" else None
    url = await server.start() if server is not None else ""

    async def connected(**options: Any) -> AsyncClient:
        if request.param == "inprocess":
            target: Any = host
        elif request.param == "http":
            target = url
        else:
            target = [sys.executable, "-m", "toolmesh", "serve", "--stdio"]
            target += ["--tools", f"{__name__}:TOOLS", "--audit", str(tmp_path / "stdio.db")]
        client = await connect_async(target, **options)
        clients.append(client)
        return client

    yield connected
    for client in clients:
        await client.close()
    if server is not None:
        await server.stop()
    await host.close()


async def test_an_error_too_long_for_a_message_is_cut_and_answered(connect: Connect) -> None:
    """Its whole 20 MB came back in-process; over HTTP the answer was dropped as undecodable and
    the call waited out its timeout."""
    client = await connect()
    result = await client.call_tool("fail_loudly", {"n": HUGE}, timeout=30)
    limit = Limits().max_output_chars
    assert result.error_code == ToolErrorCode.TOOL_ERROR and result.truncated
    assert result.error is not None and result.error.startswith("RuntimeError: eee")
    assert result.error.endswith(f"[error truncated: {limit} of {HUGE + 14} characters shown]")
    assert result.output == result.error


async def test_metadata_too_large_for_a_message_becomes_a_note(connect: Connect) -> None:
    client = await connect()
    result = await client.call_tool("big_metadata", {"n": HUGE}, timeout=30)
    assert result.success and result.truncated and result.data == "small"
    assert list(result.metadata) == ["metadata_omitted"]
    assert "more than 65536" in result.metadata["metadata_omitted"]


async def test_an_event_too_large_for_a_message_becomes_a_note(connect: Connect) -> None:
    client = await connect()
    streamed: list[ToolEvent] = []
    result = await client.call_tool("big_log", {"n": HUGE}, on_event=streamed.append, timeout=30)
    assert result.success and result.data == "fine" and result.truncated
    for events in (streamed, result.events):
        assert [(e.seq, e.kind) for e in events] == [(0, "log"), (1, "status")]
        assert list(events[0].data) == ["data_omitted"]
        assert events[1].data == {"message": "after"}


async def test_the_largest_bounded_result_fits_well_within_a_message(connect: Connect) -> None:
    client = await connect()
    result = await client.call_tool("maximal", {}, timeout=30)
    assert result.success and result.truncated
    assert [e.kind for e in result.events] == ["log", "state"]  # the status did not fit
    assert result.metadata["events_omitted"] == 1
    assert len(result.metadata["m"]) < Limits().max_metadata_bytes // 6
    message = encode(ToolCallResponse(req_id="r" * 32, data=result))
    assert len(message) < DEFAULT_MAX_MESSAGE_BYTES - 2 * 1024 * 1024


async def test_nan_and_infinity_are_null_on_every_transport(connect: Connect) -> None:
    """In-process they stayed NaN (and the output text said NaN, which is not JSON) while the
    wire sent null."""
    client = await connect()
    result = await client.call_tool("not_finite", {})
    assert result.data == {"nan": None, "inf": None, "list": [None, 1.5]}
    assert result.output == '{"nan": null, "inf": null, "list": [null, 1.5]}'
    alone = await client.call_tool("nan_alone", {})
    assert alone.success and alone.data is None and alone.output == ""


async def test_event_data_that_is_not_json_is_refused_alike(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process the event was kept; over HTTP a traceback was logged from the event loop and
    the call failed as a result that could not be sent."""
    client = await connect()
    with caplog.at_level(logging.ERROR):
        result = await client.call_tool("emits_an_object", {}, streaming=True)
    assert result.error_code == ToolErrorCode.TOOL_ERROR and result.events == []
    assert result.error is not None
    assert result.error.startswith("ValueError: the data of a 'custom' event must be JSON")
    assert "Exception in callback" not in caplog.text


@pytest.mark.parametrize("approve", [True, False])
async def test_the_approval_event_is_streamed_and_returned_alike(
    connect: Connect, approve: bool
) -> None:
    """In-process on_event never saw it; a denied call returned no events on any transport."""
    client = await connect(on_approval=lambda event: approve)
    streamed: list[ToolEvent] = []
    result = await client.call_tool("deploy", {"env": "prod"}, on_event=streamed.append)
    assert result.success is approve
    for events in (streamed, result.events):
        assert [(e.seq, e.kind) for e in events] == [(0, "approval")]
        assert events[0].data["tool_name"] == "deploy"


async def test_an_answer_too_large_to_read_fails_its_call_at_once(tmp_path: Path) -> None:
    """A host whose limits let an answer grow past what the client reads (16 MiB): the call
    fails now, saying why, instead of waiting for its timeout (it waited 65 s here)."""
    from toolmesh.errors import RemoteError

    host = Host(fail_loudly, limits=Limits(max_output_chars=HUGE), audit=tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    client = await connect_async(await server.start())
    try:
        async with asyncio.timeout(30):
            with pytest.raises(
                RemoteError, match=r"message_too_large\] the host's answer .* could not be read"
            ):
                await client.call_tool("fail_loudly", {"n": 17_000_000}, timeout=60)
    finally:
        await client.close()
        await server.stop()
        await host.close()
