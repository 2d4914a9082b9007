"""Assembly: legal names, first-name-wins with a warning, aliases, wrappers, changes."""

from __future__ import annotations

import pytest

from toolmesh import (
    ConfigError,
    Filtered,
    NameConflictError,
    Prefixed,
    Renamed,
    Tagged,
    Tool,
    ToolDefinition,
    Toolkit,
    ToolNameConflict,
    ToolSet,
    create_toolkit,
    sanitize_name,
    tool,
)


def make(name: str, description: str = "d") -> Tool:
    async def run(arguments: dict[str, object], ctx: object) -> str:
        return f"{name}:{description}"

    return Tool(ToolDefinition(name=name, description=description), run)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("read_file", "read_file"),
        ("fs.read", "fs_read"),
        ("a b/c", "a_b_c"),
        ("", "tool"),
        ("ok-name", "ok-name"),
        ("héllo", "hello"),  # accents are dropped, not turned into "_"
        ("café_au_lait", "cafe_au_lait"),
    ],
)
def test_sanitize_name(name: str, expected: str) -> None:
    assert sanitize_name(name) == expected


def test_long_names_stay_distinct_within_64_characters() -> None:
    first, second = sanitize_name("x" * 80 + "a"), sanitize_name("x" * 80 + "b")
    assert len(first) == len(second) == 64 and first != second


async def test_duplicate_first_wins_with_a_warning_naming_both_sources() -> None:
    with pytest.warns(ToolNameConflict, match="'one'.*'two'|'two'.*'one'"):
        kit = Toolkit(
            ToolSet([make("t", "first")], name="one"), ToolSet([make("t", "second")], name="two")
        )
    assert (await kit.execute("t")).output == "t:first"


def test_collision_after_sanitizing_is_detected() -> None:
    with pytest.warns(ToolNameConflict, match="made legal as 'fs_read'"):
        kit = Toolkit(ToolSet([make("fs_read")], name="a"), ToolSet([make("fs.read")], name="b"))
    assert kit.names() == ["fs_read"]


def test_on_conflict_error() -> None:
    with pytest.raises(NameConflictError, match="'t'"):
        Toolkit(make("t"), make("t"), on_conflict="error")


async def test_original_name_stays_reachable() -> None:
    kit = Toolkit(make("fs.read"))
    assert kit.names() == ["fs_read"]
    assert kit.get("fs.read") is kit.get("fs_read")
    assert (await kit.execute("fs.read")).success


async def test_register_adds_after_existing_tools() -> None:
    kit = Toolkit(make("t", "first"))
    with pytest.warns(ToolNameConflict):
        kit.register(make("t", "late"))
    kit.register(make("u"))

    @tool
    def v() -> str:
        """v"""
        return "v"

    kit.register(v)
    assert kit.names() == ["t", "u", "v"]
    assert (await kit.execute("t")).output == "t:first"
    assert (await kit.execute("v")).output == "v"


async def test_wrappers_compose_and_keep_the_executor() -> None:
    source = ToolSet([make("list_issues"), make("delete_repo"), make("get_user")], name="gh")
    wrapped = Prefixed(Renamed(Filtered(source, deny=["delete_*"]), {"get_user": "whoami"}), "gh")
    tagged = Tagged(wrapped, capabilities=["net::github"], tags=["github"])
    kit = Toolkit(tagged)
    assert kit.names() == ["gh_list_issues", "gh_whoami"]
    assert kit["gh_whoami"].definition.capabilities == ["net::github"]
    assert kit["gh_whoami"].definition.tags == ["github"]
    assert (await kit.execute("gh_whoami")).output == "get_user:d"
    assert Toolkit(Filtered(source, allow=["get_*"])).names() == ["get_user"]


def test_source_prefix_option() -> None:
    kit = Toolkit()
    kit.add([make("a"), make("b")], prefix="x")
    assert kit.names() == ["x_a", "x_b"]


def test_source_changes_update_names_and_index() -> None:
    early = ToolSet([make("shared", "early")], name="early")
    late = ToolSet([make("shared", "late"), make("other")], name="late")
    with pytest.warns(ToolNameConflict):
        kit = Toolkit(early, late)
    assert kit["shared"].description == "early"
    early.remove("shared")  # the later source's tool takes the name
    assert kit["shared"].description == "late"
    assert [t.name for t in kit.search("late")] == ["shared"]
    late.remove("other")
    assert "other" not in kit and kit.search("other") == []


def test_listing_filters_deferred_kind_and_tags() -> None:
    deferred = make("hidden").replace(defer_loading=True, tags=["a"])
    shown = make("shown").replace(tags=["a", "b"])
    kit = Toolkit(deferred, shown)
    assert [d.name for d in kit.definitions()] == ["shown"]
    assert [d.name for d in kit.definitions(include_deferred=True, tags=["a"])] == [
        "hidden",
        "shown",
    ]
    assert [d.name for d in kit.definitions(tags=["a", "b"])] == ["shown"]
    assert [d.name for d in kit.definitions(kind="mcp")] == []


async def test_create_toolkit_and_context_manager() -> None:
    async with await create_toolkit(tools=[make("a")]) as kit:
        assert (await kit.execute("a")).success
        assert [t.name for t in kit.tools] == ["a"]


async def test_execute_result_and_a_toolkit_served_by_a_host() -> None:
    from toolmesh import AsyncToolAPI, Host, connect_async

    @tool
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    async with await create_toolkit(tools=[divide]) as kit:
        ok = await kit.execute("divide", {"a": 1, "b": 4})
        assert (ok.is_error, ok.output, ok.metadata, ok.data) == (False, "0.25", {}, 0.25)
        failed = await kit.execute("divide", {"a": 1, "b": 0})
        assert failed.is_error and failed.error_code == "tool_error"
        assert "ZeroDivisionError" in (failed.output or "")
        assert kit.get("divide") is kit.tools[0]
        async with Host(kit) as host:
            client = await connect_async(host, agent_id="t")
            try:
                api = AsyncToolAPI(client)
                assert [d.name for d in await api.list()] == ["divide"]
                assert (await api.call("divide", {"a": 9, "b": 3})).data == 3.0
            finally:
                await client.close()


# -- search and deferred loading (issue 8) --------------------------------------------------------


def test_deferred_tools_are_hidden_from_the_list_and_found_by_search() -> None:
    kit = Toolkit(make("send_invoice", "Email an invoice").replace(defer_loading=True), make("a"))
    assert [d.name for d in kit.definitions()] == ["a"]
    assert [t.name for t in kit.search("invoice")] == ["send_invoice"]
    assert kit.search("invoice", include_deferred=False) == []
    assert kit.deferred_names() == {"send_invoice"}


def test_search_respects_capabilities_kind_tags_and_limit() -> None:
    tools = [make(f"mail_{i}", "send mail").replace(tags=["mail"]) for i in range(5)]
    secret = make("mail_secret", "send mail").replace(capabilities=["secret"])
    kit = Toolkit(*tools, secret)
    from toolmesh.capabilities import CapabilitySet

    held = CapabilitySet(["other"])
    assert "mail_secret" not in [t.name for t in kit.search("mail", capabilities=held)]
    assert [t.name for t in kit.search("mail", limit=2)] == ["mail_0", "mail_1"]
    assert kit.search("mail", tags=["nope"]) == []


def test_incremental_index_through_source_changed() -> None:
    server = ToolSet([make(f"tool_{i}", f"does thing {i}") for i in range(50)], name="server")
    kit = Toolkit(server)
    assert kit.search("thing 7", limit=1)[0].name == "tool_7"  # the first search indexes
    index = kit._index
    before = {name: index._docs[name] for name in kit.names()}
    server._tools.append(make("fresh_widget", "makes widgets"))  # what an MCP list_changed does
    server._tools = [t for t in server._tools if t.name != "tool_3"]
    server.changed()
    assert [t.name for t in kit.search("widgets")] == ["fresh_widget"]
    assert "tool_3" not in kit and kit.search("thing 3", limit=1)[0].name != "tool_3"
    unchanged = [name for name in before if name != "tool_3"]
    assert all(index._docs[name] is before[name] for name in unchanged)  # not re-indexed


def test_defer_above_keeps_the_listing_within_the_token_budget() -> None:
    from toolmesh.llm.deferred import estimate_tokens

    tools = [make(f"tool_{i}", "x" * 400) for i in range(10)]
    cost = estimate_tokens(tools[0])
    search_cost = sum(estimate_tokens(t) for t in Toolkit(tool_search=True).tools)
    budget = search_cost + 2 * cost
    kit = Toolkit(*tools, defer_above=budget, keep_active=["tool_9"], tool_search=True)
    listed = [d.name for d in kit.definitions()]
    assert listed == ["tool_search", "tool_search_regex", "tool_0", "tool_9"]
    assert sum(estimate_tokens(kit[name]) for name in listed) <= budget
    assert kit.deferred_names() == {f"tool_{i}" for i in range(1, 9)}
    assert kit.search("tool_5")[0].name == "tool_5"  # deferred, still found
    assert Toolkit(*tools, defer_above=10**6).deferred_names() == set()


def test_search_mode_option() -> None:
    with pytest.raises(ConfigError, match="'lexical' or 'hybrid'"):
        Toolkit(search="fuzzy")  # type: ignore[arg-type]
    assert "tool_search" not in Toolkit()
    assert "tool_search" in Toolkit(tool_search=True)


def test_budget_deferral_marks_definitions_and_follows_changes() -> None:
    from toolmesh.llm.deferred import estimate_tokens

    source = ToolSet([make(f"tool_{i}", "y" * 300) for i in range(4)], name="s")
    cost = estimate_tokens(source.tools()[0])
    kit = Toolkit(source, defer_above=2 * cost)
    assert [d.name for d in kit.definitions()] == ["tool_0", "tool_1"]
    assert kit["tool_3"].definition.defer_loading  # what the MCP server and the agent loop read
    source.remove("tool_0")  # room again: tool_2 comes back into the listing
    assert [d.name for d in kit.definitions()] == ["tool_1", "tool_2"]
    assert not kit["tool_2"].definition.defer_loading
    assert kit.deferred_names() == {"tool_3"}


def test_a_limit_of_zero_or_less_finds_nothing_whoever_ranks() -> None:
    class Ranked(ToolSet):
        def search(self, query: str, filter_tags: object = ()) -> list[str]:
            return ["b", "a"]  # its own ranking, not the toolkit's index

    kit = Toolkit(Ranked([make("a"), make("b")]), make("c"))
    assert {t.name for t in kit.search("d", limit=3)} == {"a", "b", "c"}
    for limit in (0, -1):
        assert kit.search("d", limit=limit) == []  # -1 was every tool but the last


def test_a_wrapped_source_that_relists_its_tools_is_seen_afresh() -> None:
    """A re-listed tool can take the place (and id) of the freed one it replaces: the wrapper
    must not take it for the old one."""
    import gc

    base = make("base")
    source = ToolSet([base.replace(name="t0")], name="s")
    kit = Toolkit(Prefixed(source, "p"))
    for i in range(1, 20):
        source._tools.clear()
        gc.collect()
        source._tools.append(base.replace(name=f"t{i}"))
        source.changed()
        assert kit.names() == [f"p_t{i}"]


async def test_names_in_scripts_ascii_cannot_spell_stay_distinct() -> None:
    weather, query = make("天气", "the weather"), make("查询", "a lookup")
    kit = Toolkit(weather, query)  # both became "__" and the second was dropped
    names = kit.names()
    assert len(names) == 2 and all(n.startswith("tool_") for n in names)
    assert len({sanitize_name("погода"), sanitize_name("почта")}) == 2
    assert (await kit.execute("天气", {})).output == "天气:the weather"  # its own name works too


async def test_a_toolkit_used_as_a_source_passes_on_its_changes() -> None:
    """The outer toolkit held the inner one's tools as they were at assembly: a tool the inner
    one dropped stayed callable, and one that gained a capability stayed callable without it."""
    from toolmesh import ToolErrorCode

    source = ToolSet([make("secret")], name="inner")
    inner = Toolkit(source)
    outer = Toolkit(inner, capabilities=["public"])
    assert (await outer.execute("secret")).success
    source._tools = [make("secret").replace(capabilities=["admin"])]
    source.changed()
    assert outer["secret"].capabilities == ["admin"]
    denied = await outer.execute("secret")
    assert denied.error_code == ToolErrorCode.TOOL_DENIED and "admin" in (denied.error or "")
    source.remove("secret")
    assert "secret" not in outer and outer.search("secret") == []
    assert (await outer.execute("secret")).error_code == ToolErrorCode.UNKNOWN_TOOL
    inner.register(make("late"))
    assert outer.names() == ["late"]


def test_a_source_ranking_its_tools_by_their_own_names_finds_renamed_ones() -> None:
    """A source ranks its tools by the names it gave them; those that were made legal
    (``fs.read`` is ``fs_read``) used to be dropped, so such a source found nothing."""

    class Ranked(ToolSet):
        def search(self, query: str, filter_tags: object = ()) -> list[str]:
            return [t.name for t in self._tools]

    kit = Toolkit(Ranked([make("fs.read"), make("über")], name="ranked"))
    assert kit.names() == ["fs_read", "uber"]
    assert [t.name for t in kit.search("read")] == ["fs_read", "uber"]


def test_a_source_whose_search_changes_the_toolkit_does_not_break_the_search() -> None:
    """A tool removed while searching (a source re-listing as it ranks) raised KeyError."""
    other = ToolSet([make("read_disk", "read a disk")], name="other")

    class Ranked(ToolSet):
        def search(self, query: str, filter_tags: object = ()) -> list[str]:
            other.remove("read_disk")
            return [t.name for t in self._tools]

    kit = Toolkit(other, Ranked([make("read_file", "read a file")], name="ranked"))
    kit.search("disk")  # the index has seen read_disk
    other.add(make("read_disk", "read a disk"))
    assert [t.name for t in kit.search("read")] == ["read_file"]


async def test_a_started_toolkit_opens_its_sources_once() -> None:
    """``async with`` on what ``create_toolkit`` returned (already started) opens nothing again:
    a second open would start a second process or connection that ``close`` never sees."""
    from toolmesh.sources.base import Source

    class Counting(Source):
        name = "counting"

        def __init__(self) -> None:
            super().__init__()
            self.opened = self.closed = 0

        def tools(self) -> list[Tool]:
            return [make("counted")]

        async def open(self) -> None:
            self.opened += 1

        async def close(self) -> None:
            self.closed += 1

    source = Counting()
    async with await create_toolkit(tools=[source]) as kit:
        await kit.start()
        assert "counted" in kit
    assert (source.opened, source.closed) == (1, 1)


async def test_a_closed_toolkit_refuses_calls(tmp_path: object) -> None:
    """A call after close() ran, and reopened the closed store (leaving its files open)."""
    from pathlib import Path

    from toolmesh import ProtocolError

    audit = Path(str(tmp_path)) / "a.db"
    kit = await Toolkit(make("echo"), store=audit).start()
    await kit.close()
    with pytest.raises(ProtocolError, match="is closed") as refused:
        await kit.execute("echo", {})
    assert refused.value.code == "shutting_down"
    assert sorted(p.name for p in audit.parent.iterdir()) == ["a.db"]  # not reopened
