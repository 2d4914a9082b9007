"""MCP servers as toolmesh sources, against real servers: mcp-server-time (PyPI), the reference
"everything" server (npm) over stdio and streamable HTTP, and SDK-built fixture servers for
pagination, list changes, cancellation and faults."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from tests.fixtures.gate import PidGate, Snapshot, gone
from tests.fixtures.web import serve_app
from tests.mcp.conftest import (
    everything_stdio,
    fixture_server,
    live_children,
    raw_server,
    time_server,
)
from tests.mcp.servers import raw_http
from toolmesh import ToolEvent, Toolkit
from toolmesh.mcp.config import MCPServerConfig, parse_mcp_server
from toolmesh.mcp.source import MCPSource, mcp_source
from toolmesh.store import MemoryStore

pytestmark = [pytest.mark.network_server, pytest.mark.slow]


async def started(*configs: MCPServerConfig) -> Toolkit:
    return await Toolkit(*[mcp_source(c) for c in configs]).start()


# -- mcp-server-time ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_time_server_tools_are_listed_and_called(mode: str) -> None:
    async with await started(time_server(mode=mode)) as toolkit:
        source = toolkit.sources[0]
        assert source.status.state == "connected"
        assert toolkit.source_of("time_get_current_time") is source
        definition = toolkit["time_get_current_time"].definition
        assert definition.kind == "mcp"
        assert definition.annotations == {
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        }
        assert definition.idempotent
        assert {"read_only", "idempotent", "mcp", "time"} <= set(definition.tags)
        assert definition.output_schema is not None
        assert definition.output_schema["title"] == "TimeResult"

        result = await toolkit.execute("time_get_current_time", {"timezone": "Asia/Tokyo"})
        assert result.success, result.error
        assert result.data["timezone"] == "Asia/Tokyo"  # structuredContent
        assert '"timezone": "Asia/Tokyo"' in (result.output or "")  # the text block
        assert result.tool_name == "time_get_current_time"

        failed = await toolkit.execute("time_get_current_time", {"timezone": "Nowhere/City"})
        assert not failed.success
        assert failed.error_code == "tool_error"
        assert "Invalid timezone" in (failed.error or "")

        invalid = await toolkit.execute("time_get_current_time", {"timezone": 3})
        assert invalid.error_code == "invalid_arguments"  # checked before reaching the server


# -- the everything server ---------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def everything(everything_http: str) -> AsyncIterator[Toolkit]:
    """The everything server twice: over stdio (node child) and over streamable HTTP."""
    http = parse_mcp_server("web", {"url": everything_http})
    toolkit = await started(everything_stdio(reset_timeout_on_progress=True), http)
    yield toolkit
    await toolkit.close()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("prefix", ["every", "web"])
async def test_everything_lists_calls_and_keeps_content(everything: Toolkit, prefix: str) -> None:
    assert all(s.status.state == "connected" for s in everything.sources)
    echo = await everything.execute(f"{prefix}_echo", {"message": "hi"})
    assert echo.success and echo.output == "Echo: hi"

    structured = await everything.execute(
        f"{prefix}_get-structured-content", {"location": "Chicago"}
    )
    assert structured.success
    assert set(structured.data) == {"temperature", "conditions", "humidity"}
    assert everything[f"{prefix}_get-structured-content"].definition.output_schema is not None

    image = await everything.execute(f"{prefix}_get-tiny-image", {})
    artifacts = [e for e in image.events if e.kind == "artifact"]
    assert artifacts and artifacts[0].data["mime"] == "image/png"
    assert "image you requested" in (image.output or "")

    error = await everything.execute(f"{prefix}_get-sum", {"a": "one", "b": 2})
    assert not error.success  # the server's own validation, reported as isError
    assert error.error_code in ("tool_error", "invalid_arguments")


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("prefix", ["every", "web"])
async def test_everything_progress_arrives_while_the_call_runs(
    everything: Toolkit, prefix: str
) -> None:
    events: list[ToolEvent] = []
    result = await everything.execute(
        f"{prefix}_trigger-long-running-operation",
        {"duration": 0.3, "steps": 3},
        on_event=events.append,
    )
    assert result.success, result.error
    progress = [e.data for e in events if e.kind == "progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert [p["pct"] for p in progress] == [33, 67, 100]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("prefix", ["every", "web"])
async def test_everything_call_is_cancelled_at_its_deadline(
    everything: Toolkit, prefix: str
) -> None:
    result = await everything.execute(
        f"{prefix}_trigger-long-running-operation", {"duration": 30, "steps": 2}, timeout=0.3
    )
    assert result.error_code == "timeout"
    again = await everything.execute(f"{prefix}_echo", {"message": "still here"})
    assert again.success  # the connection survives a cancelled call


@pytest.mark.asyncio(loop_scope="module")
async def test_progress_extends_the_deadline_when_configured(everything: Toolkit) -> None:
    # 0.6 s of work in 4 steps, under a 0.4 s timeout restarted by every progress notification
    result = await everything.execute(
        "every_trigger-long-running-operation", {"duration": 0.6, "steps": 4}, timeout=0.4
    )
    assert result.success, result.error
    cut = await everything.execute(
        "web_trigger-long-running-operation", {"duration": 0.6, "steps": 4}, timeout=0.4
    )
    assert cut.error_code == "timeout"  # not configured for this server


# -- fixture servers: pagination, list changes, cancellation, faults ----------------------------


async def test_tools_list_pagination_is_followed() -> None:
    async with await started(fixture_server("paged", name="paged", prefix="")) as toolkit:
        assert toolkit.names() == ["t0", "t1", "t2", "t3", "t4"]
        result = await toolkit.execute("t3", {})
        assert result.output == "t3"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_list_changed_refreshes_the_toolkit(mode: str) -> None:
    async with await started(fixture_server(mode=mode)) as toolkit:
        source = toolkit.sources[0]
        changed = asyncio.Event()
        source.subscribe(lambda _s: changed.set())
        result = await toolkit.execute("fx_add_tool", {"name": "fresh"})
        assert result.success, result.error
        await asyncio.wait_for(changed.wait(), 10)
        assert "fx_fresh" in toolkit
        made = await toolkit.execute("fx_fresh", {})
        assert made.output == "fresh"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_deadline_and_caller_cancel_the_request_at_the_server(mode: str) -> None:
    async with await started(fixture_server(mode=mode)) as toolkit:
        timed_out = await toolkit.execute("fx_wait", {"seconds": 30}, timeout=0.3)
        assert timed_out.error_code == "timeout"
        seen = await toolkit.execute("fx_cancelled_calls", {})
        assert seen.data == {"result": 1}  # notifications/cancelled reached the server

        call = asyncio.ensure_future(toolkit.execute("fx_wait", {"seconds": 30}))
        events: list[ToolEvent] = []
        steps = await toolkit.execute("fx_steps", {"count": 1, "pause": 0}, on_event=events.append)
        assert steps.success  # the server is busy with `wait` and still answers
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


# A server's calls run in the caller's own task (its tools promise to end promptly when
# cancelled): the deadline and Toolkit.close() cancel that task and take the cancellation back.


def on_running(running: asyncio.Event) -> Callable[[ToolEvent], None]:
    """An event sink that sets ``running`` at the first progress (`fx_hold` is at the server)."""

    def sink(event: ToolEvent) -> None:
        if event.kind == "progress":
            running.set()

    return sink


async def test_a_call_ended_in_the_callers_task_leaves_nothing_behind() -> None:
    before, children = Snapshot(), live_children()
    store = MemoryStore()
    toolkit = await Toolkit(mcp_source(fixture_server()), store=store).start()
    this = asyncio.current_task()
    timed_out = await toolkit.execute("fx_wait", {"seconds": 30}, timeout=0.2)
    assert timed_out.error_code == "timeout"
    assert this is not None and this.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending for this task's next await

    running = asyncio.Event()
    call = asyncio.ensure_future(
        toolkit.execute("fx_hold", {"seconds": 30}, timeout=60, on_event=on_running(running))
    )
    await running.wait()
    await toolkit.close()  # ends the running call first
    result = await call
    assert result.error_code == "cancelled"
    assert "the toolkit is closing" in (result.error or "")
    assert [e.error_code for e in store.audit] == ["timeout", "cancelled"]
    assert live_children() == children
    assert await before.left() == (set(), set())


async def test_a_caller_cancelled_as_the_toolkit_closes_stays_cancelled() -> None:
    store = MemoryStore()
    toolkit = await Toolkit(mcp_source(fixture_server()), store=store).start()
    closing: list[asyncio.Future[None]] = []

    def both_at_once(event: ToolEvent) -> None:
        if event.kind == "progress" and not closing:
            # In one turn of the loop: the close's abort of the call, then the caller's cancel.
            closing.append(asyncio.ensure_future(toolkit.close()))
            call.cancel()

    call = asyncio.ensure_future(
        toolkit.execute("fx_hold", {"seconds": 30}, timeout=60, on_event=both_at_once)
    )
    with pytest.raises(asyncio.CancelledError):
        await call
    await closing[0]
    assert [e.error_code for e in store.audit] == ["cancelled"]


async def test_progress_extends_the_deadline_no_further_than_max_total_timeout() -> None:
    config = fixture_server(reset_timeout_on_progress=True, max_total_timeout=1.0)
    async with await started(config) as toolkit:
        events: list[ToolEvent] = []
        began = time.monotonic()
        cut = await toolkit.execute(
            "fx_steps", {"count": 50, "pause": 0.1}, timeout=0.5, on_event=events.append
        )
        elapsed = time.monotonic() - began
        assert cut.error_code == "timeout"
        assert cut.error == "tool 'fx_steps' timed out after 0.5s (deadline extended by progress)"
        assert 1.0 <= elapsed < 4  # cut at max_total_timeout, not after the 5 s of steps
        assert len([e for e in events if e.kind == "progress"]) >= 5
        this = asyncio.current_task()
        assert this is not None and this.cancelling() == 0
        again = await toolkit.execute("fx_echo", {"text": "next"})
        assert again.output == "next"  # the connection survives the cut


async def test_a_crashed_server_fails_running_calls_and_restarts() -> None:
    before = live_children()
    async with await started(fixture_server()) as toolkit:
        source = toolkit.sources[0]
        crashed = await toolkit.execute("fx_crash", {})
        assert not crashed.success
        assert "went away during the call" in (crashed.error or "")
        assert "crashing on purpose" in (crashed.error or "")  # its stderr explains
        assert source.status.state == "failed"
        again = await toolkit.execute("fx_echo", {"text": "back"})
        assert again.success and again.output == "back"  # restarted by the call
        assert source.status.state == "connected"
    assert live_children() == before


async def test_a_secret_the_server_prints_is_masked_in_the_status_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server quoting its rejected token on stderr put it in the status reason, the
    warning and `toolmesh mcp status`; docs/mcp.md says configured values are never shown."""
    import sys

    script = "import os,sys; sys.stderr.write('bad token ' + os.environ['GH_TOKEN'] + chr(10))"
    config = parse_mcp_server(
        "gh",
        {
            "command": sys.executable,
            "args": ["-c", script + "; sys.exit(1)"],
            "env": {"GH_TOKEN": "ghp_SUPERSECRET123", "DEBUG": "1"},
            "connect_timeout": 5,
        },
    )
    caplog.set_level(logging.DEBUG, logger="toolmesh.mcp")
    async with await started(config) as toolkit:
        reason = toolkit.sources[0].status.reason
    assert "bad token ***" in reason and "ghp_SUPERSECRET123" not in reason
    assert "ghp_SUPERSECRET123" not in caplog.text


async def test_hung_and_garbage_servers_do_not_hold_up_the_toolkit() -> None:
    before = live_children()
    hung = fixture_server("hang", name="hung", connect_timeout=0.5)
    noisy = fixture_server("garbage", name="noisy")
    missing = parse_mcp_server("missing", {"command": "/nonexistent/mcp-server"})
    off = parse_mcp_server("off", {"command": "whatever", "disabled": True})
    async with await started(hung, noisy, missing, off) as toolkit:
        states = {s.name: s.status for s in toolkit.sources}
        assert states["hung"].state == "failed"
        assert "connect timeout of 0.5s" in states["hung"].reason
        assert states["missing"].state == "failed"
        assert "cannot start" in states["missing"].reason
        assert states["off"].state == "disabled"
        assert states["noisy"].state == "connected"  # garbage lines are skipped
        result = await toolkit.execute("noisy_echo", {"text": "clean"})
        assert result.output == "clean"
        failed = await toolkit.execute("hung_anything", {})
        assert failed.error_code == "unknown_tool"
    assert live_children() == before


async def test_closing_the_toolkit_leaves_no_child_process() -> None:
    before = live_children()
    toolkit = await started(time_server(), everything_stdio(), fixture_server())
    assert len(live_children() - before) == 3
    await toolkit.close()
    assert live_children() == before


async def test_allow_deny_capabilities_and_prefix_apply_per_server() -> None:
    config = time_server(
        "clock",
        prefix="t",
        deny=["convert_*"],
        capabilities=["time::read"],
        tags=["clock"],
    )
    toolkit = Toolkit(mcp_source(config), capabilities=["other"])
    async with await toolkit.start():
        assert toolkit.names() == ["t_get_current_time"]
        tool = toolkit["t_get_current_time"]
        assert tool.definition.capabilities == ["time::read"]
        assert "clock" in tool.definition.tags
        denied = await toolkit.execute("t_get_current_time", {"timezone": "UTC"})
        assert denied.error_code == "tool_denied"


async def test_a_source_that_was_never_opened_serves_nothing() -> None:
    source = MCPSource(time_server())
    assert source.status.state == "pending"
    assert source.tools() == []
    await source.close()


# -- a hand-written server that breaks the spec -------------------------------------------------


async def test_malformed_tool_entries_do_not_fail_the_whole_server() -> None:
    before = live_children()
    async with await started(raw_server("malformed")) as toolkit:
        source = toolkit.sources[0]
        assert source.status.state == "connected", source.status.reason
        assert toolkit.names() == [
            "raw_no_schema",
            "raw_string_schema",
            "raw_bad_hints",
            "raw_bad_output",
            "raw_twice",
            "raw_good",
        ]
        reason = source.status.reason
        assert "tool 'no_schema': ignored inputSchema (Field required)" in reason
        assert "tool #4: left out (name:" in reason
        assert reason.startswith("6 malformed tool entries: ") and reason.endswith("and 1 more")
        assert toolkit["raw_twice"].definition.description == "first"
        assert toolkit["raw_bad_output"].definition.output_schema is None
        result = await toolkit.execute("raw_no_schema", {})
        assert result.success and result.output == "called no_schema"
    assert live_children() == before


@pytest.mark.parametrize("kind", ["blank_names", "blank_names_and_a_bad_schema"])
async def test_an_entry_with_a_blank_name_is_left_out(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The SDK accepts a name "" (it is a string): it was listed as "raw_", and calling that
    # sent "" upstream. Both ways through the mending: a listing the SDK takes whole, and one
    # it refuses for another entry.
    caplog.set_level(logging.WARNING, logger="toolmesh.mcp")
    async with await started(raw_server(kind)) as toolkit:
        source = toolkit.sources[0]
        assert source.status.state == "connected", source.status.reason
        mended = ["raw_no_schema"] if kind.endswith("bad_schema") else []
        assert toolkit.names() == ["raw_good", *mended]
        reason = source.status.reason
        assert "tool #0: left out (name: empty); tool #1: left out (name: empty)" in reason
        called = await toolkit.execute("raw_", {})
        assert called.error_code == "unknown_tool"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"MCP server 'raw': {reason}" in warnings


async def test_a_schema_with_a_ref_cycle_is_ignored_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # S = allOf[T], T = allOf[S]: deriving the parameters recursed without end, and the
    # RecursionError took down the toolkit's start, every other source with it.
    caplog.set_level(logging.WARNING, logger="toolmesh.mcp")
    async with await started(raw_server("cycles")) as toolkit:
        source = toolkit.sources[0]
        assert source.status.state == "connected", source.status.reason
        assert toolkit.names() == ["raw_fine", "raw_grow", "raw_cyc", "raw_cyc_output"]
        reason = source.status.reason
        assert "tool 'cyc': ignored inputSchema ($ref '#/$defs/" in reason
        assert "tool 'cyc_output': ignored outputSchema ($ref '#/$defs/" in reason
        assert f"MCP server 'raw': {reason}" in [r.getMessage() for r in caplog.records]
        # The bad schema is dropped as any bad field is: the server checks its own arguments.
        assert toolkit["raw_cyc"].input_schema == {"type": "object", "properties": {}}
        called = await toolkit.execute("raw_cyc", {"q": 1})
        assert called.success and called.output == "called cyc", called.error
        assert toolkit["raw_cyc_output"].definition.output_schema is None
        structured = await toolkit.execute("raw_cyc_output", {})
        assert structured.success and structured.data == {"q": 1}, structured.error
        fine = await toolkit.execute("raw_fine", {})
        assert fine.success and fine.output == "called fine"


async def test_a_ref_cycle_listed_at_a_refresh_is_ignored_too() -> None:
    async with await started(raw_server("cycles_later")) as toolkit:
        source = toolkit.sources[0]
        assert source.status.reason == ""
        changed = asyncio.Event()
        source.subscribe(lambda _s: changed.set())
        grown = await toolkit.execute("raw_grow", {})
        assert grown.success, grown.error
        await asyncio.wait_for(changed.wait(), 10)  # the refresh died before it changed anything
        assert toolkit.names() == ["raw_fine", "raw_grow", "raw_later"]
        assert "tool 'later': ignored inputSchema ($ref '#/$defs/" in source.status.reason
        later = await toolkit.execute("raw_later", {})
        assert later.success and later.output == "called later", later.error


async def test_a_malformed_call_result_is_a_short_tool_error() -> None:
    async with await started(raw_server("calls")) as toolkit:
        result = await toolkit.execute("raw_video", {})
        assert result.error_code == "tool_error"
        error = result.error or ""
        assert error.startswith("MCP server 'raw' sent a malformed result: content.0")
        assert "pydantic.dev" not in error and "\n" not in error


async def test_structured_content_is_checked_against_the_output_schema() -> None:
    async with await started(raw_server("structured")) as toolkit:
        good = await toolkit.execute("raw_count", {"send": "good"})
        assert good.success, good.error
        assert good.data == {"n": 3, "mail": "not an address"}  # format: not asserted
        wrong = await toolkit.execute("raw_count", {"send": "wrong"})
        assert wrong.error_code == "tool_error"
        assert wrong.error == (
            "MCP server 'raw': Invalid structured content returned by tool count: "
            "must be integer at $.n"
        )
        missing = await toolkit.execute("raw_count", {"send": "nothing"})
        assert missing.error == (
            "MCP server 'raw': Tool count has an output schema but did not return structured "
            "content"
        )
        # A JSON Schema 2020-12 keyword (prefixItems) is honoured too, and said on one line.
        pair = await toolkit.execute("raw_pair", {"send": "pair"})
        assert pair.error_code == "tool_error"
        assert pair.error == (
            "MCP server 'raw': Invalid structured content returned by tool pair: "
            "'one' is not of type 'integer' at $.pair[0]"
        )


async def test_a_call_ends_at_its_deadline_when_the_server_stops_reading() -> None:
    """The SDK waits up to 5 s to write its courtesy notifications/cancelled; with the server
    no longer reading and the pipe full, a call run in the caller's task would wait that long
    past its deadline."""
    before = Snapshot()
    async with await started(raw_server("deaf")) as toolkit:
        first = await toolkit.execute("raw_deaf", {}, timeout=0.2)  # the server stops reading
        assert first.error_code == "timeout"
        began = time.monotonic()
        # A request larger than the pipe holds: its write blocks, and the cancel's behind it.
        second = await toolkit.execute("raw_echo", {"text": "x" * 1_000_000}, timeout=0.2)
        assert second.error_code == "timeout"
        assert time.monotonic() - began < 3
        this = asyncio.current_task()
        assert this is not None and this.cancelling() == 0
    # The notices still waiting for the writer are dropped with the connection.
    assert await before.left() == (set(), set())


async def test_a_broken_answer_envelope_fails_its_call_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with await started(raw_server("answers")) as toolkit:
        assert toolkit.sources[0].status.state == "connected"  # the banner line is skipped
        errors = {}
        for name in ("text_result", "bad_error", "no_version"):
            # Without the repair the SDK drops such an answer and the call waits out its timeout.
            result = await toolkit.execute(f"raw_{name}", {}, timeout=20)
            assert result.error_code == "tool_error", name
            assert result.duration_ms < 10_000, name
            errors[name] = result.error or ""
        good = await toolkit.execute("raw_good", {})
        assert good.success and good.output == "called good"  # the connection is still fine
    prefix = "MCP server 'raw' sent a malformed answer: "
    assert errors["text_result"] == prefix + "result: Input should be an object"
    assert errors["bad_error"].startswith(prefix + "error.code: Input should be a valid integer")
    assert errors["no_version"] == prefix + "jsonrpc: Field required"
    sdk_records = [r for r in caplog.records if r.name.startswith("mcp.client.stdio")]
    assert sdk_records  # the SDK's own record of the banner, kept at DEBUG without a traceback
    assert all(r.levelno == logging.DEBUG and r.exc_info is None for r in sdk_records)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "MCP server 'raw' wrote a line to stdout that is not JSON-RPC (ignored): " in "".join(
        warnings
    )
    assert any("'raw server ready'" in w for w in warnings)


async def test_a_broken_answer_over_http_is_a_one_line_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serve_app(raw_http.app) as url:
        config = parse_mcp_server("rawh", {"url": f"{url}/mcp"})
        async with await started(config) as toolkit:
            assert toolkit.sources[0].status.state == "connected"
            errors = {}
            for name in ("text_result", "bad_error", "not_json"):
                result = await toolkit.execute(f"rawh_{name}", {})
                assert result.error_code == "tool_error", name
                errors[name] = result.error or ""
            good = await toolkit.execute("rawh_good", {})
            assert good.success and good.output == "called good"
    prefix = "MCP server 'rawh' sent a malformed answer: "
    assert (
        errors
        == {  # not the SDK's 1.5 KB pydantic dump with its links
            "text_result": prefix + "result: Input should be an object",
            "bad_error": prefix + "error.code: Input should be a valid integer, unable to parse "
            "string as an integer; error.message: Field required",
            "not_json": prefix + "Invalid JSON: expected value at line 1 column 1",
        }
    )
    sdk_errors = [r for r in caplog.records if r.name.startswith("mcp.") and r.exc_info]
    assert sdk_errors == []  # the SDK's ERROR tracebacks of the same answers, kept at DEBUG


async def test_progress_with_extreme_numbers_still_arrives() -> None:
    events: list[ToolEvent] = []
    async with await started(raw_server("calls")) as toolkit:
        result = await toolkit.execute("raw_good", {}, on_event=events.append)
    assert result.success, result.error
    progress = [e.data for e in events if e.kind == "progress"]
    assert [p["pct"] for p in progress] == [100, 0, 0]  # 1e300 of 1e-300 is not infinity %


async def test_an_empty_next_cursor_ends_the_listing() -> None:
    async with await started(raw_server("cursor")) as toolkit:
        assert toolkit.sources[0].status.reason == ""
        result = await toolkit.execute("raw_list_requests", {})
        assert result.output == "1"  # not asked again with cursor ""


async def test_a_missing_working_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    async with await started(raw_server("malformed", cwd=str(missing))) as toolkit:
        status = toolkit.sources[0].status
        assert status.state == "failed"
        assert f"its working folder {str(missing)!r} does not exist" in status.reason
        assert "cannot start" not in status.reason  # the command is there


# -- nothing is left behind: closing or cancelling while a server is still starting ----------


async def test_closing_while_connecting_stops_the_server_before_close_returns() -> None:
    # close() cancelled the connection being made but did not wait for it: the server was
    # still running when close() returned, and the toolkit's start raised CancelledError
    # though nobody had cancelled it.
    before, children = Snapshot(), live_children()
    async with PidGate() as gate:
        toolkit = Toolkit(mcp_source(fixture_server(env={"GATE_PORT": str(gate.port)})))
        starting = asyncio.ensure_future(toolkit.start())
        pid = await gate.arrival(starting)
        await toolkit.close()
        assert gone(pid) and live_children() == children
        await starting
    assert toolkit.sources[0].status.state == "failed"
    assert await before.left() == (set(), set())


async def test_a_cancelled_open_stops_connecting() -> None:
    # The connection is made in a task of its own, shielded from the open that asked for it:
    # cancelled (a timeout around create_toolkit, say), the open left it connecting, and the
    # server running and connected behind a caller that had given up.
    before, children = Snapshot(), live_children()
    async with PidGate() as gate:
        source = MCPSource(fixture_server(env={"GATE_PORT": str(gate.port)}))
        opening = asyncio.ensure_future(source.open())
        pid = await gate.arrival(opening)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert gone(pid) and live_children() == children
    assert await before.left() == (set(), set())
    await source.close()


async def test_closing_while_a_call_reconnects_fails_the_call_and_stops_the_server() -> None:
    before, children = Snapshot(), live_children()
    async with PidGate() as gate:
        source = mcp_source(fixture_server(env={"GATE_PORT": str(gate.port)}))
        toolkit = Toolkit(source)
        starting = asyncio.ensure_future(toolkit.start())
        first = await gate.arrival(starting)
        gate.release(first)
        await starting
        crashed = await toolkit.execute("fx_crash", {})
        assert "went away during the call" in (crashed.error or ""), crashed
        call = asyncio.ensure_future(toolkit.execute("fx_echo", {"text": "late"}))
        again = await gate.arrival(call)  # the call is starting the server again
        await source.close()  # the source itself (a toolkit's close ends its calls first)
        assert gone(again) and live_children() == children
        result = await call
        await toolkit.close()
    # A tool error saying why, not a cancellation nobody asked for.
    assert result.error_code == "tool_error", result
    assert "was closed" in (result.error or ""), result
    assert await before.left() == (set(), set())


async def test_an_http_server_refusing_says_its_status() -> None:
    """A 401 (a wrong token) or a 500 read "MCPError: Server returned an error response": the
    SDK's error names no status."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def refuse(request: Request) -> PlainTextResponse:
        return PlainTextResponse("no", status_code=int(request.path_params["status"]))

    app = Starlette(routes=[Route("/{status:int}", refuse, methods=["GET", "POST", "DELETE"])])
    async with serve_app(app) as url:
        configs = [
            parse_mcp_server(f"s{code}", {"url": f"{url}/{code}", "connect_timeout": 5})
            for code in (401, 500)
        ]
        async with await started(*configs) as toolkit:
            reasons = [source.status.reason for source in toolkit.sources]
    assert "HTTP 401 Unauthorized" in reasons[0], reasons
    assert "HTTP 500 Internal Server Error" in reasons[1], reasons
