"""The A2E ToolPlugin contract of seed 000 and its list dispatch rules."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import toolmesh_command
from tests.fixtures.demo_tools import SeedPlugin
from toolmesh import (
    AsyncToolAPI,
    Host,
    ToolDefinition,
    ToolErrorCode,
    ToolEvent,
    Toolkit,
    ToolPlugin,
    connect_async,
)


class Indexed(ToolPlugin):
    name = "indexed"

    def _list_tools(self) -> list[ToolDefinition]:
        return [
            ToolDefinition(name="a", description="first", tags=["x", "y"]),
            ToolDefinition(name="b", description="second", tags=["x"]),
            ToolDefinition(
                name="c", description="hidden third", tags=["x", "y"], defer_loading=True
            ),
        ]

    def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if tool_name == "b":
            raise RuntimeError("b is broken")
        return {"tool": tool_name, "thread": threading.current_thread().name}

    def _search_tools(
        self,
        query: str,
        filter_tags: list[str] | None = None,
        tools: list[ToolDefinition] | None = None,
    ) -> list[ToolDefinition]:
        # A custom strategy: reverse alphabetical, everything matches.
        return sorted(self._list_tools(), key=lambda t: t.name, reverse=True)


async def test_empty_query_lists_non_deferred_tools() -> None:
    async with Host(Indexed()) as host:
        client = await connect_async(host)
        assert [t.name for t in await client.list_tools()] == ["a", "b"]
        assert [t.name for t in await client.list_tools(tags=["x", "y"])] == ["a"]
        await client.close()


async def test_query_uses_the_plugins_own_search_including_deferred() -> None:
    async with Host(Indexed()) as host:
        client = await connect_async(host)
        found = await client.list_tools("anything", include_deferred=True)
        assert [t.name for t in found] == ["c", "b", "a"]
        assert [t.name for t in await client.list_tools("anything")] == ["b", "a"]
        await client.close()


def test_default_search_ranks_by_relevance() -> None:
    plugin = SeedPlugin()
    found = plugin._search_tools("look for github repos")
    assert found[0].name == "github_search"
    assert [t.name for t in plugin._search_tools("read file", filter_tags=["fs"])] == ["read_file"]
    assert plugin._search_tools("github", filter_tags=["fs"]) == []


async def test_execute_runs_off_the_event_loop_and_errors_become_results() -> None:
    kit = Toolkit(Indexed())
    ok = await kit.execute("a")
    assert ok.data["tool"] == "a" and ok.data["thread"].startswith("toolmesh-tool")
    failed = await kit.execute("b")
    assert failed.error_code == ToolErrorCode.TOOL_ERROR and "b is broken" in (failed.error or "")


async def test_emit_reaches_the_right_call_and_the_callback() -> None:
    plugin = SeedPlugin()
    seen: list[ToolEvent] = []
    plugin.set_event_callback(seen.append)
    kit = Toolkit(plugin)
    events: list[ToolEvent] = []
    result = await kit.execute("read_file", {"path": "/x"}, on_event=events.append)
    assert [e.data for e in events] == [{"pct": 50, "message": "Reading..."}]
    assert [e.seq for e in result.events] == [0]
    assert [e.data["pct"] for e in seen] == [50]


async def test_toolresult_shaped_dicts_are_taken_as_results() -> None:
    class Legacy(ToolPlugin):
        def _list_tools(self) -> list[ToolDefinition]:
            return [ToolDefinition(name="old", description="returns a ToolResult dict")]

        def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return {
                "success": False,
                "tool_name": "old",
                "error": "legacy failure",
                "duration_ms": 3,
            }

    result = await Toolkit(Legacy()).execute("old")
    assert result.success is False and result.error == "legacy failure"


class FlakySearch(ToolPlugin):
    """A plugin whose own search raises ("boom") or returns names, not definitions ("bad")."""

    name = "flaky"

    def __init__(self) -> None:
        super().__init__()
        self.searches: list[str] = []

    def _list_tools(self) -> list[ToolDefinition]:
        return [
            ToolDefinition(name="alpha_tool", description="alpha boom"),
            ToolDefinition(name="beta_tool", description="beta bad"),
        ]

    def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"tool": tool_name}

    def _search_tools(
        self,
        query: str,
        filter_tags: list[str] | None = None,
        tools: list[ToolDefinition] | None = None,
    ) -> list[ToolDefinition]:
        self.searches.append(query)
        if query == "boom":
            raise RuntimeError("search broke")
        if query == "bad":
            return ["beta_tool"]  # type: ignore[list-item]
        return list(reversed(self._list_tools()))


FLAKY_SEARCH = FlakySearch()


async def test_a_failing_plugin_search_falls_back_to_toolmesh_ranking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = FlakySearch()
    async with Host(plugin) as host:
        client = await connect_async(host)
        api = AsyncToolAPI(client)
        with caplog.at_level(logging.WARNING, logger="toolmesh.plugin"):
            assert [t.name for t in await api.list(query="boom")] == ["alpha_tool"]
            assert [t.name for t in await api.list(query="bad")] == ["beta_tool"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("flaky" in w and "RuntimeError: search broke" in w for w in warnings)
        assert any("flaky" in w and "'beta_tool'" in w and "ToolDefinition" in w for w in warnings)
        # The plugin's own ranking still serves a query it answers properly.
        assert [t.name for t in await api.list(query="tool")] == ["beta_tool", "alpha_tool"]
        assert (await api.call("alpha_tool", {})).success
        await client.close()
    assert plugin.searches == ["boom", "bad", "tool"]  # asked once per query


async def test_a_failing_plugin_search_keeps_a_stdio_host_serving(tmp_path: Path) -> None:
    command = toolmesh_command(
        "serve",
        "--stdio",
        "--tools",
        "tests.sources.test_plugin:FLAKY_SEARCH",
        "--audit",
        str(tmp_path / "audit.db"),
    )
    client = await connect_async(command, agent_id="tester")
    try:
        assert [t.name for t in await client.list_tools("boom")] == ["alpha_tool"]
        assert [t.name for t in await client.list_tools("bad")] == ["beta_tool"]
        assert (await client.call_tool("beta_tool", {})).success
    finally:
        await client.close()


async def test_the_event_callback_gets_each_event_as_recorded() -> None:
    class Steps(ToolPlugin):
        name = "steps"

        def _list_tools(self) -> list[ToolDefinition]:
            return [ToolDefinition(name="steps", description="emits three statuses")]

        def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            for message in ("first", "second", "third"):
                self.emit("status", {"message": message})
            return {"done": True}

    plugin = Steps()
    seen: list[ToolEvent] = []
    plugin.set_event_callback(seen.append)
    result = await Toolkit(plugin).execute("steps")
    recorded = [(e.seq, e.data["message"]) for e in result.events]
    assert recorded == [(0, "first"), (1, "second"), (2, "third")]
    assert [(e.seq, e.data["message"]) for e in seen] == recorded
    assert seen == result.events


# -- emit from a thread the plugin starts ------------------------------------------------------


class Threaded(ToolPlugin):
    """Emits from threads it starts: a Thread, a pool's workers, a Thread in the call's context."""

    name = "threaded"

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[Exception] = []
        self.barrier: threading.Barrier | None = None  # holds calls until N run at once

    def _list_tools(self) -> list[ToolDefinition]:
        names = ["thread", "pool", "in_context", "bad_data"]
        return [ToolDefinition(name=n, description=n) for n in names]

    def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.barrier is not None:
            self.barrier.wait(timeout=30)  # every call is running: no emit is unambiguous
        pct = arguments.get("pct", 50)
        if tool_name == "pool":
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda p: self.emit("progress", {"pct": p, "message": ""}), [1, 2]))
        else:
            target: Callable[..., Any] = self._emit_bad if tool_name == "bad_data" else self.emit
            args: tuple[Any, ...] = ("progress", {"pct": pct, "message": tool_name})
            if tool_name == "in_context":  # the documented way to tell the thread whose it is
                target, args = contextvars.copy_context().run, (target, *args)
            helper = threading.Thread(target=target, args=args)
            helper.start()
            helper.join()
        if self.barrier is not None:
            self.barrier.wait(timeout=30)  # no call ends before every helper has emitted
        return {"ok": tool_name}

    def _emit_bad(self, kind: str, data: dict[str, Any]) -> None:
        for bad in ({"pct": "half"}, {"pct": 1, "message": "", "at": object()}):
            try:
                self.emit(kind, bad)
            except ValueError as exc:
                self.refused.append(exc)


async def test_emit_from_a_thread_the_plugin_starts_reaches_the_call() -> None:
    # The call was looked up in a context variable, which threads do not inherit: the event
    # reached neither result.events nor on_event, only the plugin-wide callback.
    plugin = Threaded()
    seen: list[ToolEvent] = []
    plugin.set_event_callback(seen.append)
    kit = Toolkit(plugin)
    for name, pcts in [("thread", [50]), ("pool", [1, 2])]:
        seen.clear()
        streamed: list[ToolEvent] = []
        result = await kit.execute(name, {}, on_event=streamed.append)
        assert result.success, result
        assert sorted(e.data["pct"] for e in result.events) == pcts
        assert streamed == result.events
        assert sorted(seen, key=lambda e: e.seq or 0) == result.events  # the very events


async def test_emit_from_a_thread_checks_the_event_data(caplog: pytest.LogCaptureFixture) -> None:
    """Data with no JSON form was encoded later, in a callback on the event loop: the
    ValueError reached nobody but asyncio's log, and the thread went on unaware."""
    plugin = Threaded()
    seen: list[ToolEvent] = []
    plugin.set_event_callback(seen.append)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        result = await Toolkit(plugin).execute("bad_data", {})
    assert result.success and result.events == [] and seen == []
    refused = [str(e) for e in plugin.refused]
    assert refused[0] == "progress event field 'pct' must be int"
    assert refused[1].startswith("the data of a 'progress' event must be JSON")
    assert len(refused) == 2 and caplog.records == []


async def test_with_several_calls_running_a_threads_emit_goes_to_the_callback_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = Threaded()
    plugin.barrier = threading.Barrier(3)
    seen: list[ToolEvent] = []
    plugin.set_event_callback(seen.append)
    kit = Toolkit(plugin)
    with caplog.at_level(logging.DEBUG, logger="toolmesh.plugin"):
        results = await asyncio.gather(
            kit.execute("thread", {"pct": 10}),
            kit.execute("thread", {"pct": 20}),
            kit.execute("in_context", {"pct": 30}),  # started in its call's context: found
        )
    assert all(r.success for r in results), results
    assert [r.events for r in results[:2]] == [[], []]  # whose is it? unknowable
    assert [e.data["pct"] for e in results[2].events] == [30]
    assert sorted(e.data["pct"] for e in seen) == [10, 20, 30]
    said = "while 3 calls run goes only to the plugin-wide callback"
    assert sum(said in message for message in caplog.messages) == 2


async def test_a_plugin_cannot_emit_the_events_the_host_makes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plugin's ``emit("state", ...)`` reached the call as a change of the state nobody made
    (an AG-UI front end applied it). The kind is the host's own: refused in the tool, from its
    own thread and from one it starts, never in a callback on the event loop."""

    class Forging(ToolPlugin):
        name = "forging"

        def __init__(self) -> None:
            super().__init__()
            self.refused: list[str] = []

        def _list_tools(self) -> list[ToolDefinition]:
            return [ToolDefinition(name=n, description=n) for n in ("forge", "in_thread")]

        def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            if tool_name == "forge":
                self.emit("state", {"delta": [], "version": 1})  # fails the call
            helper = threading.Thread(target=self._forge_approval)
            helper.start()
            helper.join()
            return {"ok": True}

        def _forge_approval(self) -> None:
            try:
                self.emit("approval", {"approval_id": "x", "tool_name": "rm"})
            except ValueError as exc:
                self.refused.append(str(exc))

    plugin = Forging()
    seen: list[ToolEvent] = []
    plugin.set_event_callback(seen.append)
    kit = Toolkit(plugin)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        failed = await kit.execute("forge", {})
        threaded = await kit.execute("in_thread", {})
    assert failed.error_code == ToolErrorCode.TOOL_ERROR
    assert "the 'state' event is the host's own: return Output(state_update=...)" in (
        failed.error or ""
    )
    assert threaded.success and threaded.events == [] and seen == []
    assert [message.split(":")[0] for message in plugin.refused] == [
        "the 'approval' event is the host's own"
    ]
    assert not [r for r in caplog.records if r.name == "asyncio"]  # no callback failed
