"""The A2E protocol suite: every test runs over in-process, stdio and HTTP (``served``)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MAX_PARALLEL, Served
from tests.fixtures.demo_tools import echo
from tests.fixtures.waiting import Waiting
from toolmesh import (
    ConfigError,
    HandshakeError,
    Host,
    ToolErrorCode,
    ToolEvent,
    connect_async,
    tool,
)
from toolmesh.sources.base import ToolSet


async def test_handshake_negotiates_tools_and_limits(served: Served) -> None:
    client = served.client
    assert client.session_id
    assert [c.capability for c in client.accepted_caps] == ["tools"]
    assert client.accepted_caps[0].metadata["capabilities"] == ["demo"]
    assert client.max_parallel == MAX_PARALLEL


async def test_the_handshake_counts_the_tools_the_session_may_call() -> None:
    @tool
    def plain() -> str:
        return "p"

    @tool(capabilities=["fs"])
    def reads() -> str:
        return "r"

    @tool(defer_loading=True)
    def found() -> str:
        return "f"

    async with Host(plain, reads, found, capabilities=["net"]) as host:
        client = await connect_async(host)
        assert client.accepted_caps[0].metadata["tools"] == 2  # not `reads`; `found` by search
        await client.close()


async def test_list_shows_active_tools_only(served: Served) -> None:
    names = [t.name for t in await served.client.list_tools()]
    assert "echo" in names and "read_file" in names
    assert "github_search" not in names  # deferred: found by search only


async def test_search_finds_deferred_tools_by_meaning(served: Served) -> None:
    found = await served.client.list_tools("find repositories on github", include_deferred=True)
    assert found and found[0].name == "github_search"
    without = await served.client.list_tools("find repositories on github")
    assert "github_search" not in [t.name for t in without]


async def test_filter_tags_are_anded_and_kind_filters(served: Served) -> None:
    both = await served.client.list_tools(
        "github", include_deferred=True, tags=["network", "github"]
    )
    assert [t.name for t in both] == ["github_search"]
    none = await served.client.list_tools("github", include_deferred=True, tags=["network", "fs"])
    assert none == []
    plugin_tools = await served.client.list_tools(kind="plugin")
    assert [t.name for t in plugin_tools] == ["read_file"]
    python_tools = await served.client.list_tools(kind="python")
    assert "echo" in [t.name for t in python_tools] and "read_file" not in [
        t.name for t in python_tools
    ]


async def test_call_success(served: Served) -> None:
    result = await served.client.call_tool("add", {"a": 2, "b": 3})
    assert result.success and result.data == 5 and result.output == "5"
    assert result.tool_name == "add" and result.duration_ms >= 0


async def test_seed_plugin_call_streams_progress_before_the_result(served: Served) -> None:
    events: list[ToolEvent] = []
    result = await served.client.call_tool(
        "read_file", {"path": "/etc/hostname"}, streaming=True, on_event=events.append
    )
    assert result.data == {"content": "my-host"}
    assert [(e.kind, e.data, e.seq) for e in events] == [
        ("progress", {"pct": 50, "message": "Reading..."}, 0)
    ]
    assert [e.seq for e in result.events] == [0]


async def test_event_seq_counts_per_call(served: Served) -> None:
    events: list[ToolEvent] = []
    result = await served.client.call_tool("count", {"n": 4}, on_event=events.append)
    assert [e.seq for e in events] == [0, 1, 2, 3]
    assert [e.data["pct"] for e in events] == [25, 50, 75, 100]
    assert all(e.req_id == events[0].req_id for e in events)
    again: list[ToolEvent] = []
    await served.client.call_tool("count", {"n": 2}, on_event=again.append)
    assert [e.seq for e in again] == [0, 1]
    assert result.data == {"counted": 4}


async def test_events_are_collected_without_streaming(served: Served) -> None:
    result = await served.client.call_tool("count", {"n": 2})
    assert [e.seq for e in result.events] == [0, 1]


async def test_unknown_tool_is_a_result(served: Served) -> None:
    result = await served.client.call_tool("ech", {"text": "x"})
    assert not result.success and result.error_code == ToolErrorCode.UNKNOWN_TOOL
    assert "did you mean 'echo'" in (result.error or "")


async def test_validation_names_the_bad_field(served: Served) -> None:
    result = await served.client.call_tool("register_user", {"user": {"name": "Ann", "age": "old"}})
    assert result.error_code == ToolErrorCode.INVALID_ARGUMENTS
    assert result.metadata["path"] == "$.user.age"
    assert "$.user.age" in (result.error or "")

    missing = await served.client.call_tool("register_user", {"user": {"name": "Ann"}})
    assert missing.metadata["path"] == "$.user.age"
    assert "missing required property 'age'" in (missing.error or "")

    bad_enum = await served.client.call_tool(
        "register_user", {"user": {"name": "Ann", "age": 3}, "mode": "reckless"}
    )
    assert bad_enum.metadata["path"] == "$.mode"

    extra = await served.client.call_tool("add", {"a": 1, "b": 2, "c": 3})
    assert extra.metadata["path"] == "$.c"

    ok = await served.client.call_tool(
        "register_user", {"user": {"name": "Ann", "age": 3}, "mode": "fast"}
    )
    assert ok.data == {"name": "Ann", "age": 3, "mode": "fast"}


async def test_exception_becomes_tool_error(served: Served) -> None:
    result = await served.client.call_tool("boom", {})
    assert result.error_code == ToolErrorCode.TOOL_ERROR
    assert result.error == "ValueError: kaboom"
    assert ToolErrorCode(result.error_code).retryable


async def test_deadline_returns_promptly_when_the_tool_ignores_it(served: Served) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await served.client.call_tool("block", {"seconds": 60}, timeout=0.3)
    elapsed = loop.time() - started
    assert result.error_code == ToolErrorCode.TIMEOUT
    assert "timed out after 0.3s" in (result.error or "")
    assert elapsed < 5  # promptly: the blocked thread is abandoned, not waited for


async def test_tool_needing_a_capability_the_session_lacks_is_denied(served: Served) -> None:
    result = await served.client.call_tool("secret", {})
    assert result.error_code == ToolErrorCode.TOOL_DENIED
    assert "secret::read" in (result.error or "")
    assert "secret" not in [t.name for t in await served.client.list_tools()]


async def test_output_is_bounded(served: Served) -> None:
    result = await served.client.call_tool("big", {"n": 250_000})
    assert result.truncated
    assert len(result.output or "") < 201_000
    assert "output truncated: 200000 of 250000 characters shown" in (result.output or "")


async def test_every_outcome_is_audited(served: Served) -> None:
    client = served.client
    await client.call_tool("echo", {"text": "hello"}, correlation_id="turn-1")
    await client.call_tool("boom", {})
    await client.call_tool("nope", {})
    await client.call_tool("secret", {})
    await client.call_tool("add", {"a": "x", "b": 1})
    await client.call_tool("block", {"seconds": 60}, timeout=0.2)
    session_id = client.session_id
    await served.finish()
    rows = served.audit_rows()
    assert [(r["tool_name"], r["success"], r["error_code"]) for r in rows] == [
        ("echo", 1, None),
        ("boom", 0, "tool_error"),
        ("nope", 0, "unknown_tool"),
        ("secret", 0, "tool_denied"),
        ("add", 0, "invalid_arguments"),
        ("block", 0, "timeout"),
    ]
    first = rows[0]
    assert first["session_id"] == session_id
    assert first["agent_id"] == "tester"
    assert first["correlation_id"] == "turn-1"
    assert first["input_bytes"] == len('{"text":"hello"}')
    assert first["output_bytes"] == len("hello")
    assert len(first["args_digest"]) == 64
    assert first["transport"] == served.transport
    assert rows[3]["decision"] == "capability:secret::read"


async def test_text_that_is_not_unicode_still_reaches_the_caller(served: Served) -> None:
    events: list[ToolEvent] = []
    result = await served.client.call_tool("odd_text", {}, on_event=events.append, timeout=10)
    assert result.success and result.data == "caf\ufffd.txt"  # it used to never arrive
    assert [e.data["message"] for e in events] == ["reading caf\ufffd"]
    made = await served.client.call_tool("handmade", {}, timeout=10)
    assert made.success and made.data == "ok" and isinstance(made.metadata["at"], str)


async def test_ping(served: Served) -> None:
    assert await served.client.ping() >= 0


async def test_calls_beyond_max_parallel_wait_their_turn(served: Served) -> None:
    """The client queues calls past the host's max_parallel instead of having them refused."""
    results = await asyncio.gather(
        *(served.client.call_tool("hold", {"seconds": 0.01}) for _ in range(MAX_PARALLEL + 3))
    )
    assert [r.data for r in results] == ["held"] * (MAX_PARALLEL + 3)


async def test_a_cancelled_waiting_call_gives_up_its_turn(served: Served) -> None:
    client = served.client
    running = [
        asyncio.ensure_future(client.call_tool("hold", {"seconds": 0.05}))
        for _ in range(MAX_PARALLEL)
    ]
    waiting = asyncio.ensure_future(client.call_tool("add", {"a": 1, "b": 1}))
    await asyncio.sleep(0)  # let every call take its slot or its place in the queue
    waiting.cancel()
    after = await client.call_tool("add", {"a": 2, "b": 2})
    assert after.data == 4 and all(r.data == "held" for r in await asyncio.gather(*running))
    assert waiting.cancelled()


async def test_a_start_that_failed_can_be_tried_again(tmp_path: Path) -> None:
    opened: list[str] = []

    class Recorded(ToolSet):
        async def open(self) -> None:
            opened.append(self.name)
            await super().open()

    folder = tmp_path / "not-yet"
    host = Host(Recorded([echo], name="demo"), audit=folder / "audit.db")
    with pytest.raises(ConfigError, match="does not exist"):
        await host.start()
    assert opened == []  # the store failed first
    folder.mkdir()
    await host.start()  # not taken for started by the failed attempt
    assert opened == ["demo"]
    client = await connect_async(host)
    assert (await client.call_tool("echo", {"text": "now"})).success
    await client.close()
    await host.close()
    assert (folder / "audit.db").exists()


async def test_a_handshake_with_text_that_is_not_unicode_is_refused(tmp_path: Path) -> None:
    host = Host(_echo_tools(), audit=tmp_path / "audit.db")
    with pytest.raises(HandshakeError, match="agent_id holds a lone surrogate"):
        await connect_async(host, agent_id="me\ud800")  # the wire's parser refuses this
    client = await connect_async(host, agent_id="fine")  # and the host goes on
    assert (await client.call_tool("echo", {"text": "ok"})).success
    await client.close()
    await host.close()


def _echo_tools() -> ToolSet:
    return ToolSet([echo], name="demo")


async def test_closing_the_host_cancels_in_process_calls(tmp_path: Path) -> None:
    """An in-process call still running when the host closes is cancelled, answered and
    audited as such; it used to run on, and audit into the closed store (opening it again,
    a file left open)."""
    waiting = Waiting()
    host = Host(waiting.tool, audit=tmp_path / "a.db")
    client = await connect_async(host)
    call = asyncio.ensure_future(client.call_tool("wait_forever", {}, timeout=60))
    await waiting.until_started()
    await host.close()
    assert call.done()
    result = call.result()
    assert result.error_code == ToolErrorCode.CANCELLED and "shutting down" in (result.error or "")
    assert host.store._db is None  # type: ignore[attr-defined]  # closed, and left closed
    rows = sqlite3.connect(tmp_path / "a.db").execute("SELECT error_code FROM audit").fetchall()
    assert rows == [("cancelled",)]
    await client.close()


async def test_a_cancelled_in_process_caller_is_still_cancelled(tmp_path: Path) -> None:
    host = Host(echo, _sleeper(), audit=tmp_path / "a.db")
    client = await connect_async(host)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await client.call_tool("sleeper", {}, timeout=60)
    assert (await client.call_tool("echo", {"text": "next"})).data == "next"
    await client.close()
    await host.close()


async def test_a_closed_session_leaves_no_cached_state(tmp_path: Path) -> None:
    host = Host(echo, audit=tmp_path / "a.db")
    for _ in range(3):
        client = await connect_async(host)
        assert (await client.call_tool("echo", {"text": "hi"})).success
        await client.close()
    assert host.sessions == {} and host.state._cache == {}
    await host.close()


def _sleeper() -> Any:
    @tool
    async def sleeper() -> str:
        """Sleeps for a minute."""
        await asyncio.sleep(60)
        return "woke"

    return sleeper


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"max_parallel": "3"}, "max_parallel must be an integer, not '3'"),
        ({"max_parallel": 2.5}, "max_parallel must be an integer, not 2.5"),
        ({"max_parallel": True}, "max_parallel must be an integer, not True"),
        ({"max_parallel": 0}, "max_parallel must be at least 1, not 0"),
        ({"max_message_bytes": "1mb"}, "max_message_bytes must be an integer, not '1mb'"),
        ({"max_message_bytes": -1}, "max_message_bytes must be at least 1, not -1"),
    ],
)
def test_host_count_settings_of_the_wrong_kind_are_config_errors(
    settings: dict[str, Any], refused: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{refused}$"):
        Host(echo, **settings)
