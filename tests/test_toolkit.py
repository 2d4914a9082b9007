"""Assembly: legal names, first-name-wins with a warning, aliases, wrappers, changes."""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolmesh import (
    ConfigError,
    Filtered,
    Limits,
    NameConflictError,
    Prefixed,
    Renamed,
    SearchIndex,
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


def test_a_whole_float_limit_is_that_limit_and_any_other_non_int_is_refused() -> None:
    # JSON Schema counts 2.0 as an integer, so wire callers send it: it reached heapq (TypeError)
    kit = Toolkit(*(make(f"mail_{i}", "send mail") for i in range(5)))
    assert [t.name for t in kit.search("mail", limit=2.0)] == ["mail_0", "mail_1"]  # type: ignore[arg-type]
    assert kit.search("mail", limit=0.0) == []  # type: ignore[arg-type]
    for bad in (2.5, float("nan"), float("inf"), "2", True):
        with pytest.raises(ConfigError, match="limit must be a whole number"):
            kit.search("mail", limit=bad)  # type: ignore[arg-type]


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


# -- changes to a toolkit: the same assembly as built afresh ---------------------------------------

# Names that collide as they are or once made legal, so that changes hand names over.
NAME_POOL = ["read", "write", "fs.read", "fs_read", "a b", "a_b", "list_all", "héllo", "hello"]
QUERIES = ["read", "write list", "hello tool"]


def tool_maker(rng: random.Random, clashing: float) -> Callable[[], Tool]:
    """New tools, each with a name of its own or, with probability ``clashing``, one of
    ``NAME_POOL`` (which clash, also once made legal), and a description of some length."""
    made = iter(range(10**6))

    def fresh() -> Tool:
        number = next(made)
        name = rng.choice(NAME_POOL) if rng.random() < clashing else f"only_{number}"
        return make(name, f"{name} tool {number} " + "words " * rng.randrange(20))

    return fresh


def assembly(kit: Toolkit) -> dict[str, object]:
    """What a toolkit shows of its assembly: names in order, holders, aliases, listing, search."""
    return {
        "tools": [
            (t.name, getattr(kit.source_of(t.name), "name", None), t.description) for t in kit.tools
        ],
        "deferred": sorted(kit.deferred_names()),
        "listed": [d.name for d in kit.definitions()],
        "reachable": {name: getattr(kit.get(name), "name", None) for name in NAME_POOL},
        "found": [[t.name for t in kit.search(query)] for query in QUERIES],
    }


def afresh(kit: Toolkit) -> Toolkit:
    """The toolkit assembled anew from what its sources list now."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ToolNameConflict)
        return Toolkit(
            *[ToolSet(list(s.tools()), name=s.name) for s in kit.sources],
            defer_above=kit.defer_above,
            keep_active=kit.keep_active,
        )


@pytest.mark.parametrize("defer_above", [None, 300])
def test_changes_assemble_as_a_fresh_toolkit_would(defer_above: int | None) -> None:
    """Tools added, inserted, removed, replaced, reordered and registered, in sources early and
    late: after each change the toolkit (and one that holds it as a source) shows what a toolkit
    assembled from scratch shows, deferral over the budget and search included."""
    rng = random.Random(8)
    fresh = tool_maker(rng, 0.5)

    sources = [ToolSet([fresh() for _ in range(4)], name=f"s{i}") for i in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ToolNameConflict)
        kit = Toolkit(*sources, defer_above=defer_above, keep_active=["list_*"])
        outer = Toolkit(kit)
        for step in range(250):
            source = rng.choice(sources)
            tools = source._tools
            action = rng.choice(
                ["add", "insert", "remove", "drop", "swap", "reverse", "repeat", "other"]
            )
            if action == "add":
                source.add(*(fresh() for _ in range(rng.randrange(1, 3))))
            elif action == "insert":
                tools.insert(rng.randrange(len(tools) + 1), fresh())
            elif action == "remove" and tools:
                source.remove(rng.choice(tools).name)  # every tool of that name
            elif action == "drop" and tools:
                del tools[rng.randrange(len(tools))]
            elif action == "swap" and tools:
                index = rng.randrange(len(tools))
                tools[index] = make(tools[index].name, f"{tools[index].name} again {step}")
            elif action == "reverse":
                tools.reverse()
            elif action == "repeat" and tools:
                tools.append(rng.choice(tools))  # one tool listed twice
            elif rng.random() < 0.5:
                kit.register(fresh())
            elif len(kit.sources) < 7:  # a new source, or one added again
                again = rng.random() < 0.2
                if not again:
                    sources.append(ToolSet([fresh()], name=f"s{len(sources)}"))
                kit.add(source if again else sources[-1])
            if action in ("insert", "drop", "swap", "reverse", "repeat"):
                source.changed()
            assert assembly(kit) == assembly(afresh(kit)), (step, action, source.name)
            assert [(t.name, t.description) for t in outer.tools] == [
                (t.name, t.description) for t in kit.tools
            ]
    assert len(kit) > 20 and (defer_above is None or kit.deferred_names())


def test_conflict_warnings_follow_changes_once_per_key() -> None:
    """A name handed to a new holder warns about the tools it now shuts out, once per (name,
    holder, loser); a change that leaves the conflicts as they were warns no more."""
    first, second, third = (ToolSet([make("t", n)], name=n) for n in ("first", "second", "third"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def conflicts() -> list[tuple[str, str, str]]:
            """(name, holder, loser) of each conflict warned of since the last look."""
            pattern = r"tool name '(.+)' is taken: .* '(.+)' is ignored; .* '(.+)' keeps it"
            found = [re.fullmatch(pattern, str(w.message)) for w in caught]
            caught.clear()
            return [(m[1], m[3], m[2]) for m in found if m is not None]

        kit = Toolkit(first, second, third)
        assert conflicts() == [("t", "first", "second"), ("t", "first", "third")]
        first.remove("t")
        assert conflicts() == [("t", "second", "third")]
        assert kit["t"].description == "second"
        second.add(make("t", "second again"))
        assert conflicts() == [("t", "second", "second")]
        second.add(make("t", "once more"))
        first.add(make("t", "first again"))
        assert conflicts() == []  # each of these keys was warned of before
        assert kit["t"].description == "first again"
        kit.register(make("t", "late"))
        assert conflicts() == [("t", "first", "registered")]
        kit.register(make("t", "later"))
        assert conflicts() == []
    assert kit.names() == ["t"]


def test_a_change_that_clashes_raises_with_on_conflict_error() -> None:
    early = ToolSet([make("a")], name="early")
    late = ToolSet([make("b"), make("fs_read")], name="late")
    kit = Toolkit(early, late, on_conflict="error")
    early.add(make("c"))  # no clash: fine
    assert kit.names() == ["a", "c", "b", "fs_read"]
    with pytest.raises(NameConflictError, match="'b'"):
        early.add(make("b"))  # the later source's "b" would be shut out
    other = Toolkit(ToolSet([make("fs_read")], name="plain"), on_conflict="error")
    with pytest.raises(NameConflictError, match="made legal as 'fs_read'"):
        other.register(make("fs.read"))


def test_registering_one_at_a_time_defers_as_assembling_at_once() -> None:
    """Registered after a big toolkit one by one, tools are named, listed and deferred over the
    budget as the same tools assembled together: pinned ones (``keep_active``) first."""
    from toolmesh.llm.deferred import estimate_tokens

    base = [make(f"tool_{i}", "z" * (40 + 17 * i)) for i in range(12)]
    late = [make(f"late_{i}", "z" * (30 + 23 * i)) for i in range(12)]
    late.insert(7, make("keep_me", "z" * 400))
    budget = sum(estimate_tokens(t) for t in base[:9])
    kit = Toolkit(ToolSet(base, name="base"), defer_above=budget, keep_active=["keep_*"])
    for tool_ in late:
        kit.register(tool_)
    whole = Toolkit(
        ToolSet(base, name="base"),
        ToolSet(late, name="registered"),
        defer_above=budget,
        keep_active=["keep_*"],
    )
    assert assembly(kit) == assembly(whole)
    assert "keep_me" in [d.name for d in kit.definitions()]
    assert {"late_11", "tool_11"} <= kit.deferred_names()


class Recording(SearchIndex):
    """Records what the toolkit asks of it (not what its own methods do meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[tuple[str, str]] = []
        self.busy = False

    def add(self, key: str, definition: ToolDefinition) -> None:
        self.record("add", key, lambda: super(Recording, self).add(key, definition))

    def remove(self, key: str) -> None:
        self.record("remove", key, lambda: super(Recording, self).remove(key))

    def record(self, change: str, key: str, do: Callable[[], None]) -> None:
        if not self.busy:
            self.changes.append((change, key))
        self.busy, was = True, self.busy
        try:
            do()
        finally:
            self.busy = was


def test_the_index_hears_only_of_the_tools_that_changed() -> None:
    index = Recording()
    early = ToolSet([*(make(f"early_{i}") for i in range(20)), make("shared", "early")], name="e")
    late = ToolSet([*(make(f"late_{i}") for i in range(20)), make("shared", "late")], name="l")
    with pytest.warns(ToolNameConflict):
        kit = Toolkit(early, late, search=index)
    kit.search("shared")
    assert len(index.changes) == 41

    def changes() -> list[tuple[str, str]]:
        kit.search("shared")
        done, index.changes = index.changes, []
        return sorted(done)

    index.changes = []
    late.add(make("late_new"))
    kit.register(make("registered_new"))
    assert changes() == [("add", "late_new"), ("add", "registered_new")]
    early.remove("early_3")
    late.remove("late_5")
    assert changes() == [("remove", "early_3"), ("remove", "late_5")]
    early.remove("shared")  # the later source's tool takes the name
    assert changes() == [("add", "shared")]
    assert kit["shared"].description == "late"
    early._tools.insert(0, make("early_first"))
    early.changed()
    assert changes() == [("add", "early_first")]
    assert kit.names()[:2] == ["early_first", "early_0"]


def test_a_prefixed_source_passes_on_only_what_changed() -> None:
    # A wrapper re-made every tool when its source changed one: every tool of a prefixed source
    # (an MCP server's, by default) looked changed and was indexed again.
    index = Recording()
    inner = ToolSet([make(f"tool_{i}") for i in range(20)], name="server")
    wrapped = Prefixed(Filtered(inner, deny=["tool_7"]), "srv")
    kit = Toolkit(wrapped, search=index)
    kit.search("tool")
    before = {t.name: t for t in wrapped.tools()}
    index.changes = []
    inner.add(make("tool_new"))
    inner.remove("tool_3")
    kit.search("tool")
    assert sorted(index.changes) == [("add", "srv_tool_new"), ("remove", "srv_tool_3")]
    after = {t.name: t for t in wrapped.tools()}
    assert all(after[name] is tool for name, tool in before.items() if name != "srv_tool_3")
    assert "srv_tool_7" not in after and assembly(kit) == assembly(afresh(kit))


def test_a_wrapper_renamed_since_makes_its_tools_anew_at_the_next_change() -> None:
    # Keeping the wrapped copies of unchanged tools kept their old prefix too.
    inner = ToolSet([make("read"), make("write")], name="server")
    wrapped = Prefixed(inner, "old")
    kit = Toolkit(wrapped)
    wrapped.prefix = "new"
    inner.add(make("list"))
    assert kit.names() == ["new_read", "new_write", "new_list"]
    assert assembly(kit) == assembly(afresh(kit))


def test_a_dropped_tool_leaves_no_alias_behind() -> None:
    source = ToolSet([make("fs.read"), make("other")], name="s")
    kit = Toolkit(source)
    source.remove("fs.read")
    source.add(make("fs_read", "plain"))
    assert kit.get("fs_read") is not None and kit.get("fs.read") is None
    assert assembly(kit) == assembly(afresh(kit))


def test_a_source_added_twice_conflicts_with_itself_at_every_change() -> None:
    source = ToolSet([make("t")], name="twice")
    with pytest.warns(ToolNameConflict, match="'t' from source 'twice' keeps it"):
        kit = Toolkit(source, source)
    with pytest.warns(ToolNameConflict, match="'u' from source 'twice' keeps it"):
        source.add(make("u"))
    assert kit.names() == ["t", "u"]


def test_a_refused_conflict_is_refused_at_every_change_until_it_is_gone() -> None:
    early = ToolSet([make("a")], name="early")
    late = ToolSet([make("b")], name="late")
    kit = Toolkit(early, late, on_conflict="error")
    with pytest.raises(NameConflictError, match="'b'"):
        late.add(make("b", "again"))
    with pytest.raises(NameConflictError, match="'b'"):
        early.add(make("c"))  # another change: the toolkit is re-assembled, and refuses again
    late._tools.pop()
    late.changed()
    assert kit.names() == ["a", "c", "b"]
    assert assembly(kit) == assembly(afresh(kit))


# -- a refusal (on_conflict="error") changes nothing ----------------------------------------------


def strict_kit(*sources: ToolSet) -> Toolkit:
    """A refusing toolkit over a budget that defers some tools, searched once (indexed)."""
    kit = Toolkit(*sources, on_conflict="error", defer_above=60, keep_active=["list_*"])
    kit.search("read")
    return kit


@pytest.mark.parametrize(
    ("refused", "clash"),
    [
        ([make("fresh", "fresh words"), make("fs_read", "another read")], "fs_read"),
        ([make("fresh", "fresh words"), make("only"), make("fresh", "again")], "fresh"),
    ],
    ids=["an-earlier-tools-name", "its-own-name"],
)
def test_a_refused_source_is_not_added_at_all(refused: list[Tool], clash: str) -> None:
    """``add`` claimed the tools before the clash, kept the source and subscribed to it: the
    toolkit served part of it, and its every later change was refused again."""
    early = ToolSet([make("fs.read", "read a file"), make("list_all", "w " * 40)], name="early")
    late = ToolSet([make("write", "w " * 40), make("hello", "w " * 40)], name="late")
    kit = strict_kit(early, late)
    before = assembly(kit)
    assert before["deferred"]  # the budget is part of what must stay as it was
    source = ToolSet(refused, name="refused")
    with pytest.raises(NameConflictError, match=f"name '{clash}' is taken"):
        kit.add(source)
    assert assembly(kit) == before
    assert kit.sources == [early, late] and "fresh" not in kit and kit.search("fresh") == []
    source.add(make("later"))  # not subscribed: nothing to refuse, nothing to serve
    assert "later" not in kit and assembly(kit) == before
    with pytest.raises(NameConflictError, match="'list_all'"):
        kit.add([make("third"), make("all")], prefix="list")  # wrapped, and refused too
    assert assembly(kit) == before
    early.add(make("read", "read it"))
    assert kit.names() == ["fs_read", "list_all", "read", "write", "hello"]
    assert assembly(kit) == assembly(afresh(kit))


def test_a_refused_register_keeps_none_of_its_tools() -> None:
    """``register`` left the refused tools in the registered set (the first of them claimed):
    the next change that re-assembled brought them back, and with them the clash."""
    base = ToolSet([make("fs.read", "read a file"), make("list_all", "w " * 40)], name="base")
    kit = strict_kit(base)
    before = assembly(kit)
    with pytest.raises(NameConflictError, match="'list_all'"):
        kit.register(make("x", "x marks"), make("list_all"))  # a new registered set
    assert kit.sources == [base] and assembly(kit) == before
    kit.register(make("y", "y not"))
    before = assembly(kit)
    with pytest.raises(NameConflictError, match="made legal as 'fs_read'"):
        kit.register(make("z", "zed"), make("fs.read"))  # extending the registered set
    assert assembly(kit) == before and "z" not in kit
    kit.register(make("w", "double u"))
    base.add(make("more", "more words"))
    assert kit.names() == ["fs_read", "list_all", "more", "y", "w"]
    assert assembly(kit) == assembly(afresh(kit))  # what the sources list: no z, no fs.read

    registered = ToolSet(name="registered")  # added twice: a tool registered clashes with itself
    twice = strict_kit(ToolSet([make("a")], name="base"), registered, registered)
    before = assembly(twice)
    with pytest.raises(NameConflictError, match="'solo'"):
        twice.register(make("solo"))
    assert assembly(twice) == before and registered.tools() == []


def test_a_refused_change_leaves_the_last_good_assembly_whole() -> None:
    """A change re-assembled every source and was refused half way: the toolkit served the
    tools walked by then (names missing, the index and the budget not told). Now it serves its
    last good assembly, and every change (an ``add`` or ``register`` too) is refused while the
    clash stands."""
    early = ToolSet([make("fs.read", "read a file"), make("list_all", "w " * 40)], name="early")
    late = ToolSet([make("write", "write a file"), make("hello", "w " * 40)], name="late")
    kit = strict_kit(early, late)
    before = assembly(kit)
    late._tools = [make("read", "read it again"), make("fs_read", "a clash")]  # list_changed
    with pytest.raises(NameConflictError, match="'fs_read'"):
        late.changed()
    assert assembly(kit) == before
    assert kit.get("fs.read") is kit.get("fs_read") is not None
    assert [t.name for t in kit.search("write a file", limit=1)] == ["write"]
    with pytest.raises(NameConflictError, match="'fs_read'"):
        early.add(make("more"))  # re-assembled, and refused again
    with pytest.raises(NameConflictError, match="'fs_read'"):
        kit.register(make("r"))
    with pytest.raises(NameConflictError, match="'fs_read'"):
        kit.add(ToolSet([make("s")], name="new"))
    assert assembly(kit) == before and kit.sources == [early, late]
    late._tools.pop()  # the clash is gone: the next change assembles everything
    late.changed()
    assert kit.names() == ["fs_read", "list_all", "more", "read"]
    assert assembly(kit) == assembly(afresh(kit))
    kit.register(make("r"))  # and changes are incremental again
    assert kit.names()[-1] == "r" and assembly(kit) == assembly(afresh(kit))


def test_a_toolkit_refusing_a_change_does_not_keep_the_others_from_hearing_of_it() -> None:
    """A toolkit holding another as a source refuses its change for itself: the inner toolkit
    keeps it (as a ToolSet whose ``add`` was refused keeps the tool), and the toolkits told
    after the refusing one used to go on serving the inner one's tools as they were."""
    inner = Toolkit(make("t"))
    strict = Toolkit(make("u"), inner, on_conflict="error")
    lenient = Toolkit(inner)
    with pytest.raises(NameConflictError, match="'u'"):
        inner.register(make("u"))
    assert inner.names() == lenient.names() == ["t", "u"]
    assert strict.names() == ["u", "t"]


def test_a_source_shared_by_toolkits_tells_all_of_them_when_one_refuses() -> None:
    """One ToolSet in two toolkits: the first refuses the ToolSet's new tool, and the second,
    told after it, went on serving the ToolSet as it was (``Source.changed`` stopped at the
    first listener that raised)."""
    shared = ToolSet([make("t")], name="shared")
    strict = Toolkit(make("u"), shared, on_conflict="error")
    lenient = Toolkit(shared)
    with pytest.raises(NameConflictError, match="'u'"):
        shared.add(make("u"))
    assert lenient.names() == ["t", "u"]
    assert strict.names() == ["u", "t"]  # its last good assembly


def test_a_toolkit_refused_as_it_is_made_no_longer_hears_the_toolkits_given() -> None:
    """The toolkit ``Toolkit(...)`` refused (and nobody holds) went on re-assembling at every
    change of a toolkit given to it, and raised its refusals into that toolkit's changes."""
    inner = Toolkit(make("t"))
    with pytest.raises(NameConflictError, match="'u'"):
        Toolkit(inner, make("u"), make("u"), on_conflict="error")
    inner.register(make("u"))
    assert inner.names() == ["t", "u"]


def test_a_toolkit_refused_as_it_is_made_no_longer_hears_the_sources_given() -> None:
    """Only the toolkits given were let go of: a ToolSet (an MCP server, any source) given to
    the refused toolkit still told it of every change, and its refusals were raised into that
    source's changes, though the toolkit that does hold the source took the change."""
    shared, other = ToolSet([make("a")], name="shared"), ToolSet([make("b")], name="other")
    with pytest.raises(NameConflictError, match="'a'"):
        Toolkit(shared, other, make("a"), on_conflict="error")
    kit = Toolkit(shared, Prefixed(other, "o"), on_conflict="error")
    shared.add(make("b"))  # the refused toolkit (shared, other) would refuse it
    assert kit.names() == ["a", "b", "o_b"]
    assert shared.__dict__["_listeners"] == [kit._source_changed]


async def test_create_toolkit_refused_no_longer_hears_the_sources_given() -> None:
    """``create_toolkit`` refusing a clash left the toolkits (and sources) given telling the
    toolkit it had begun, which refused them still: ``inner.register`` raised its refusal."""
    inner = Toolkit(make("t"))
    with pytest.raises(NameConflictError, match="'u'"):
        await create_toolkit(tools=[inner, make("u"), make("u")], on_conflict="error")
    inner.register(make("u"))
    assert inner.names() == ["t", "u"] and inner._watchers == []


@pytest.mark.parametrize("defer_above", [None, 300])
def test_refused_changes_leave_what_was_and_the_others_assemble_afresh(
    defer_above: int | None,
) -> None:
    """Random changes to a refusing toolkit: a refused one leaves it showing what it showed
    (``add`` and ``register`` leave no source or tool behind), an accepted one shows what a
    toolkit assembled from scratch shows, and a source it refused is not heard. A refused
    source change is often taken back, so that changes meet the toolkit both serving what its
    sources list and serving its last good assembly."""
    rng = random.Random(5)
    fresh = tool_maker(rng, 0.2)

    sources = [ToolSet([make(f"first_{i}_{j}") for j in range(3)], name=f"s{i}") for i in range(3)]
    kit = Toolkit(*sources, on_conflict="error", defer_above=defer_above, keep_active=["list_*"])
    outer = Toolkit(kit)
    outcomes = {"refused add": 0, "refused change": 0, "accepted": 0, "taken back": 0}

    def attempt(label: object, change: Callable[[], None], source: ToolSet | None) -> bool:
        """Make ``change`` (to ``source``, or through the toolkit: None) and check what the
        toolkit shows after it; whether it was refused."""
        member = source is None or source in kit.sources
        before, listed = assembly(kit), [(s, list(s.tools())) for s in kit.sources]
        try:
            change()
        except NameConflictError:
            assert member, label  # a source it does not hold is not heard
            assert assembly(kit) == before, label
            if source is None:
                assert [(s, list(s.tools())) for s in kit.sources] == listed, label
            outcomes["refused add" if source is None else "refused change"] += 1
            return True
        else:
            outcomes["accepted"] += member
            assert assembly(kit) == (assembly(afresh(kit)) if member else before), label
            return False
        finally:
            assert [(t.name, t.description) for t in outer.tools] == [
                (t.name, t.description) for t in kit.tools
            ], label

    for step in range(250):
        source = rng.choice(list(dict.fromkeys([*sources, *kit.sources])))
        assert isinstance(source, ToolSet)
        tools, kept = source._tools, list(source._tools)
        action = rng.choice(
            ["add", "insert", "remove", "drop", "swap", "reverse", "register", "source"]
        )

        def change(
            action: str = action,
            source: ToolSet = source,
            tools: list[Tool] = tools,
            step: int = step,
        ) -> None:
            if action == "add":
                source.add(fresh())
            elif action == "remove" and tools:
                source.remove(rng.choice(tools).name)  # every tool of that name
            elif action == "register":
                kit.register(*(fresh() for _ in range(rng.randrange(1, 3))))
            elif action == "source":
                again = rng.random() < 0.2  # added twice: refused unless it lists nothing
                if not again:
                    sources.append(ToolSet([fresh(), fresh()], name=f"s{len(sources)}"))
                kit.add(source if again else sources[-1])
            else:
                if action == "insert":
                    tools.insert(rng.randrange(len(tools) + 1), fresh())
                elif action == "drop" and tools:
                    del tools[rng.randrange(len(tools))]
                elif action == "swap" and tools:
                    index = rng.randrange(len(tools))
                    tools[index] = make(tools[index].name, f"{tools[index].name} again {step}")
                elif action == "reverse":
                    tools.reverse()
                source.changed()

        through_kit = action in ("register", "source")
        refused = attempt((step, action, source.name), change, None if through_kit else source)
        if refused and not through_kit and rng.random() < 0.7:

            def take_back(source: ToolSet = source, kept: list[Tool] = kept) -> None:
                source._tools = kept  # the server takes its change back
                source.changed()

            outcomes["taken back"] += 1
            attempt((step, "taken back", source.name), take_back, source)
    assert min(outcomes.values()) > 15, outcomes


def test_a_budget_changed_at_run_time_is_weighed_afresh() -> None:
    from toolmesh.llm.deferred import estimate_tokens

    tools = [make(f"tool_{i}", "w" * 200) for i in range(8)]
    cost = estimate_tokens(tools[0])
    kit = Toolkit(tools[:4], defer_above=2 * cost)
    assert [d.name for d in kit.definitions()] == ["tool_0", "tool_1"]
    kit.defer_above = 5 * cost
    kit.register(tools[4])
    assert [d.name for d in kit.definitions()] == [f"tool_{i}" for i in range(5)]
    kit.keep_active = ("tool_7",)
    kit.register(*tools[5:])
    assert [d.name for d in kit.definitions()] == ["tool_0", "tool_1", "tool_2", "tool_3", "tool_7"]
    kit.defer_above = None
    kit.register(make("free"))
    kit.defer_above = 5 * cost
    kit.register(make("last", "w" * 200))
    assert assembly(kit) == assembly(afresh(kit))


def test_a_source_gaining_two_tools_of_one_name_keeps_the_first() -> None:
    from toolmesh.llm.deferred import estimate_tokens

    source = ToolSet([make("a", "v" * 200)], name="s")
    cost = estimate_tokens(source.tools()[0])
    kit = Toolkit(source, defer_above=2 * cost)
    with pytest.warns(ToolNameConflict, match="'b' from source 's' keeps it"):
        source.add(make("b", "v" * 200), make("b", "w" * 200))
    assert [d.name for d in kit.definitions()] == ["a", "b"]
    assert kit["b"].description == "v" * 200
    assert assembly(kit) == assembly(afresh(kit))


def test_a_source_added_again_keeps_its_first_place_when_another_gains_a_tool() -> None:
    again = ToolSet([make("r")], name="again")
    middle = ToolSet([make("m")], name="middle")
    with pytest.warns(ToolNameConflict):
        kit = Toolkit(again, middle, again)
    middle.add(make("n"))
    assert kit.names() == ["r", "m", "n"]


def test_a_tool_listed_twice_conflicts_with_itself() -> None:
    first, second = make("x"), make("y")
    source = ToolSet([first, second], name="s")
    kit = Toolkit(source)
    source._tools.append(second)
    with pytest.warns(ToolNameConflict, match="'y' from source 's' keeps it"):
        source.changed()
    source._tools.insert(1, first)
    with pytest.warns(ToolNameConflict, match="'x' from source 's' keeps it"):
        source.changed()
    assert kit.names() == ["x", "y"]


def test_a_toolkit_over_budget_passes_on_only_what_changed() -> None:
    """Each change deferred the tools over the budget anew, as new objects: a toolkit holding
    this one as a source took every deferred tool for a changed one and indexed it again."""
    from toolmesh.llm.deferred import estimate_tokens

    source = ToolSet([make(f"tool_{i}", "q" * 100) for i in range(30)], name="s")
    inner = Toolkit(source, defer_above=3 * estimate_tokens(source.tools()[0]))
    index = Recording()
    outer = Toolkit(inner, search=index)
    outer.search("tool")
    index.changes = []
    source.remove("tool_20")
    source.add(make("fresh", "q" * 100))
    outer.search("tool")
    assert sorted(index.changes) == [("add", "fresh"), ("remove", "tool_20")]
    assert outer["tool_5"].definition.defer_loading and outer["fresh"].definition.defer_loading


def test_a_budget_taken_away_at_run_time_defers_no_more() -> None:
    """``defer_above=None`` set at run time: the next change listed the tools the budget had
    deferred as deferred still, unlike a toolkit made without a budget."""
    source = ToolSet([make(f"tool_{i}", "w" * 200) for i in range(4)], name="s")
    kit = Toolkit(source, defer_above=100)
    assert kit.deferred_names()
    kit.defer_above = None
    source.add(make("new"))
    assert kit.deferred_names() == set()
    assert assembly(kit) == assembly(afresh(kit))


def test_registering_into_a_source_added_again_claims_at_its_first_place() -> None:
    """The registered tools added again as the last source: a tool registered then was claimed
    after every other, losing its name to a later source that a fresh assembly gives it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ToolNameConflict)
        kit = Toolkit()
        kit.register(make("a"))
        kit.add(ToolSet([make("b", "other")], name="other"))
        kit.add(kit.sources[0])
        kit.register(make("b", "registered"), make("c"))
        assert kit.names() == ["a", "b", "c"]
        assert kit["b"].description == "registered"
        assert assembly(kit) == assembly(afresh(kit))


def test_a_wrapper_asks_its_filter_again_when_its_source_changes() -> None:
    """A tool the wrapped source still lists kept its wrapped copy, and with it whether the
    filter let it through: a filter changed since left it in (or out) for good."""
    inner = ToolSet([make("read"), make("write")], name="inner")
    filtered = Filtered(inner)
    kit = Toolkit(filtered)
    assert kit.names() == ["read", "write"]
    filtered.deny = ["write"]
    inner.add(make("list"))
    assert kit.names() == ["read", "list"]
    filtered.deny = []
    inner.add(make("more"))
    assert kit.names() == ["read", "write", "list", "more"]


@tool
def _greet(who: str = "you") -> str:
    return f"hi {who}"


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(lambda: Toolkit(_greet), id="toolkit"),
        pytest.param(lambda: _greet, id="@tool function"),
        pytest.param(lambda: [_greet], id="list"),
        pytest.param(lambda: ToolSet([_greet]), id="source"),
    ],
)
async def test_wrappers_take_whatever_toolkit_add_takes(given: Callable[[], object]) -> None:
    kit = Toolkit(
        Prefixed(given(), "p"),  # type: ignore[arg-type]
        Filtered(given(), deny=["nothing"]),  # type: ignore[arg-type]
        Renamed(given(), {"_greet": "hello"}),  # type: ignore[arg-type]
    )
    assert kit.names() == ["p__greet", "_greet", "hello"]
    assert (await kit.execute("p__greet", {"who": "me"})).data == "hi me"


def test_a_wrapper_of_something_unservable_names_itself_and_what_it_needs() -> None:
    with pytest.raises(ConfigError, match=r"^Prefixed: cannot serve 5: expected a ToolPlugin"):
        Prefixed(5, "p")  # type: ignore[arg-type]


def test_an_unawaited_factory_is_named_and_closed(tmp_path: Path) -> None:
    """create_toolkit is async: passing its coroutine says to await it, and closes it (no
    "never awaited" warning later)."""
    from toolmesh import create_toolkit

    pending = create_toolkit(builtins=True, workspace=tmp_path)
    with pytest.raises(ConfigError, match=r"await create_toolkit\(\.\.\.\) first"):
        Toolkit(pending)  # type: ignore[arg-type]
    assert pending.cr_frame is None  # closed


def test_a_conflict_between_sources_of_one_name_tells_them_apart_by_place() -> None:
    """Two ``@tool`` functions named "a" are both source 'tool:a': the message says which one
    (by the place it was added) keeps the name."""

    def a_tool(description: str) -> Tool:
        return tool(lambda: description, name="a", description=description)

    with pytest.warns(ToolNameConflict) as caught:
        Toolkit(a_tool("first"), make("b"), a_tool("second"), a_tool("third"))
    assert [str(w.message) for w in caught] == [
        f"tool name 'a' is taken: 'a' from source #{n} 'tool:a' is ignored; "
        "'a' from source #1 'tool:a' keeps it"
        for n in (3, 4)
    ]
    with pytest.raises(NameConflictError, match="from source #2 'tool:a' is ignored"):
        Toolkit(a_tool("first"), a_tool("second"), on_conflict="error")


# -- a toolkit inside another ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "own"),
    [
        ({}, []),
        ({"hooks": [lambda call: None]}, ["policy hooks"]),
        ({"capabilities": ["basic"]}, ["capabilities"]),
        ({"capability_policy": "extensible"}, ["capability_policy"]),
        ({"state_paths": ["/notes/"]}, ["state_paths"]),
        ({"limits": Limits(max_output_chars=10)}, ["limits"]),
        ({"store": "sqlite:///:memory:"}, ["store"]),
        ({"search": "hybrid"}, ["search"]),
        ({"defer_above": 1000}, ["defer_above"]),
    ],
)
def test_own_settings_name_what_another_toolkit_would_not_apply(
    settings: dict[str, Any], own: list[str]
) -> None:
    assert Toolkit(make("echo"), **settings).own_settings() == own


def test_a_toolkit_governing_itself_inside_another_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = Toolkit(make("echo"), name="inner", capabilities=["basic"])
    Toolkit(Toolkit(make("echo"), name="plain"), name="outer")
    assert caplog.records == []
    Toolkit(inner, name="outer")
    assert [r.getMessage() for r in caplog.records] == [
        "toolkit 'inner' is a source of toolkit 'outer', which governs its tools: its own "
        "capabilities do not apply to them"
    ]


# -- create_toolkit's settings over a manifest's, and capabilities as tags ------------------------


async def test_create_toolkit_settings_win_over_the_manifest_even_at_their_default(
    tmp_path: Path,
) -> None:
    """A setting equal to the default was taken for "not given": "locked" lost to the
    manifest's "extensible", and sessions could widen their capabilities."""
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[toolkit]\nname = "desk"\ncapability_policy = "extensible"\non_conflict = "error"\n'
    )
    given = await create_toolkit(
        config=manifest, name="toolmesh", capability_policy="locked", on_conflict="warn"
    )
    assert (given.name, given.capability_policy, given.on_conflict) == (
        "toolmesh",
        "locked",
        "warn",
    )
    read = await create_toolkit(config=manifest)
    assert (read.name, read.capability_policy, read.on_conflict) == ("desk", "extensible", "error")
    plain = await create_toolkit()
    assert (plain.name, plain.capability_policy, plain.on_conflict) == (
        "toolmesh",
        "locked",
        "warn",
    )


@pytest.mark.parametrize("held", [["fs::read"], "fs::read", ("fs::read",)])
def test_listing_and_search_take_capabilities_as_tags(held: Any) -> None:
    """A list of tags raised AttributeError ('list' object has no attribute 'allows')."""
    kit = Toolkit(
        Tagged(make("read_notes"), capabilities=["fs::read"]),
        Tagged(make("write_notes"), capabilities=["fs::write"]),
    )
    assert [d.name for d in kit.definitions(capabilities=held)] == ["read_notes"]
    assert [t.name for t in kit.search("notes", capabilities=held)] == ["read_notes"]


def test_holding_no_capabilities_lists_only_tools_that_need_none() -> None:
    """An empty list was read as the toolkit's own set (everything)."""
    kit = Toolkit(make("open"), Tagged(make("guarded"), capabilities=["fs::write"]))
    assert [d.name for d in kit.definitions(capabilities=[])] == ["open"]
    assert [t.name for t in kit.search("guarded open", capabilities=[])] == ["open"]
    with pytest.raises(ConfigError, match="capabilities must be a string or a list of strings"):
        kit.definitions(capabilities=5)  # type: ignore[arg-type]
