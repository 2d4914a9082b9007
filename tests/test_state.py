"""State documents: atomic JSON Patch, path limits, persistence across restarts, concurrency."""

from __future__ import annotations

import asyncio
import enum
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import to_json

from tests.conftest import Served, demo_host
from toolmesh import (
    HandshakeError,
    Host,
    Output,
    ToolContext,
    ToolErrorCode,
    Toolkit,
    connect_async,
    tool,
)
from toolmesh.errors import RemoteError
from toolmesh.state import MAX_DEPTH, MAX_INT_DIGITS
from toolmesh.store import MemoryStore, SqliteStore
from toolmesh.transports.http import HttpServer


async def test_state_round_trip_over_every_transport(served: Served) -> None:
    client = served.client
    assert await client.get_state() == ({"context": {}}, 0)
    result = await client.call_tool("remember", {"key": "color", "value": "teal"})
    assert result.success and [e.kind for e in result.events] == ["activity", "state"]
    assert result.events[1].data == {
        "delta": [{"op": "add", "path": "/context/color", "value": "teal"}],
        "version": 1,
    }
    assert (await client.call_tool("recall", {"key": "color"})).output == "teal"
    assert await client.get_state() == ({"context": {"color": "teal"}}, 1)


async def test_state_survives_a_host_restart(tmp_path: Path) -> None:
    audit = tmp_path / "audit.db"
    first = demo_host(audit)
    client = await connect_async(first, agent_id="keeper")
    await client.call_tool("remember", {"key": "k", "value": "v"})
    session_id = client.session_id
    await client.close()
    await first.close()

    second = demo_host(audit)
    resumed = await connect_async(second, agent_id="keeper", session_id=session_id)
    assert resumed.session_id == session_id
    assert (await resumed.call_tool("recall", {"key": "k"})).output == "v"
    assert await resumed.get_state() == ({"context": {"k": "v"}}, 1)
    await resumed.close()
    await second.close()


async def test_resuming_someone_elses_session_is_refused(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    owner = await connect_async(host, agent_id="owner")
    with pytest.raises(HandshakeError, match="another agent"):
        await connect_async(host, agent_id="intruder", session_id=owner.session_id)
    await owner.close()
    await host.close()


async def test_hundred_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    gate = asyncio.Event()

    @tool
    async def bump(ctx: ToolContext, n: int) -> Output:
        """Append n after waiting at the gate (all calls overlap)."""
        await gate.wait()
        return Output(n, state_update=[{"op": "add", "path": "/context/items/-", "value": n}])

    @tool
    def start() -> Output:
        """Create the list."""
        return Output("ok", state_update=[{"op": "add", "path": "/context/items", "value": []}])

    toolkit = Toolkit(bump, start, store=tmp_path / "s.db")
    await toolkit.execute("start")
    calls = [asyncio.ensure_future(toolkit.execute("bump", {"n": i})) for i in range(100)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*calls)
    assert all(r.success for r in results)
    document = await toolkit.state.snapshot(toolkit.session.id)
    assert sorted(document["context"]["items"]) == list(range(100))
    reopened = Toolkit(store=tmp_path / "s.db")
    record = await reopened.store.load_state(toolkit.session.id)
    assert record is not None and record.version == 101
    await toolkit.close()


async def test_a_failing_test_op_leaves_the_state_alone() -> None:
    @tool
    def guarded() -> Output:
        """Only if n is 1."""
        return Output(
            "x",
            state_update=[
                {"op": "test", "path": "/context/n", "value": 1},
                {"op": "add", "path": "/context/m", "value": 2},
            ],
        )

    toolkit = Toolkit(guarded)
    result = await toolkit.execute("guarded")
    assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
    assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}
    assert demo_host  # the module also uses the demo host


@tool
def rawpatch(patch: list[dict[str, object]]) -> Output:
    """Return the given patch as the state update."""
    return Output("ok", state_update=patch)


@pytest.mark.parametrize(
    "op",
    [
        {"op": "replace", "path": "/context", "value": "clobbered"},
        {"op": "remove", "path": "/context"},
        {"op": "add", "path": "/context", "value": {}},
        {"op": "move", "from": "/context", "path": "/context/inner"},
    ],
)
async def test_the_context_container_itself_cannot_be_replaced_or_removed(
    op: dict[str, object],
) -> None:
    async with Toolkit(rawpatch) as toolkit:
        await toolkit.execute(
            "rawpatch", {"patch": [{"op": "add", "path": "/context/a", "value": 1}]}
        )
        refused = await toolkit.execute("rawpatch", {"patch": [op]})
        assert refused.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "'/context' is the container itself" in (refused.error or "")
        later = await toolkit.execute(
            "rawpatch", {"patch": [{"op": "add", "path": "/context/b", "value": 2}]}
        )
        assert later.success  # the document is still usable
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {"a": 1, "b": 2}}


@pytest.mark.parametrize("prefix", ["/context/", "/context"])
async def test_a_state_prefix_means_strictly_under_it_with_or_without_the_slash(
    prefix: str,
) -> None:
    async with Toolkit(rawpatch, state_paths=[prefix]) as toolkit:
        for path, allowed in [
            ("/context/a", True),
            ("/context", False),
            ("/contextual", False),
            ("/other", False),
        ]:
            op = {"op": "add", "path": path, "value": 1}
            result = await toolkit.execute("rawpatch", {"patch": [op]})
            assert result.success is allowed, (path, result.error)
            if not allowed:
                assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
                assert repr(path) in (result.error or "")


def _nested(levels: int) -> Any:
    """A value ``levels`` arrays deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _self_containing() -> Any:
    value: list[Any] = []
    value.append(value)
    return value


NOT_JSON: dict[str, tuple[Callable[[], Any], str, str]] = {
    # name: (value, where the message says it is, what it says is wrong)
    "nan": (lambda: float("nan"), "/context/v", "is nan, which JSON cannot hold"),
    "infinity": (lambda: {"a": [1, float("inf")]}, "/context/v/a/1", "is inf"),
    "set": (lambda: {1, 2}, "/context/v", "is a Python set, which is not JSON"),
    "bytes": (lambda: [b"x"], "/context/v/0", "is a Python bytes, which is not JSON"),
    "object": (object, "/context/v", "is a Python object, which is not JSON"),
    "int key": (lambda: {1: "a"}, "/context/v", "has the key 1 (int); JSON keys are text"),
    "lone surrogate": (lambda: "a\udc80b", "/context/v", "holds a lone surrogate ('\\udc80')"),
    "surrogate key": (lambda: {"k\udc80": 1}, "/context/v", "holds a lone surrogate"),
    "NUL": (lambda: {"a/b": "x\x00"}, "/context/v/a~1b", "holds NUL"),
    "self-containing": (_self_containing, "/context/v", "nests deeper than 100 levels"),
    "too deep": (lambda: _nested(MAX_DEPTH), "/context/v", "nests deeper than 100 levels"),
    # Python's json writes and reads at most 4300 digits: the SQLite store failed the call as
    # "not saved" (retryably), the memory store kept what no Python client could then read.
    "huge integer": (lambda: {"n": [-(10**5000)]}, "/context/v/n/0", "is an integer of about"),
}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("name", sorted(NOT_JSON))
async def test_a_value_that_is_not_json_is_refused_saying_where(
    tmp_path: Path, kind: str, name: str
) -> None:
    """Before: NaN, sets, int keys... were kept by the memory store (and then broke or changed
    on the wire), and the SQLite store raised TypeError/ValueError/UnicodeEncodeError out of
    ``execute`` (no result, no audit entry); too deep a value raised RecursionError."""
    make, where, reason = NOT_JSON[name]

    @tool
    def put() -> Output:
        """Store a value that is not JSON."""
        return Output("ok", state_update=[{"op": "add", "path": "/context/v", "value": make()}])

    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "s.db")
    async with Toolkit(put, rawpatch, store=store) as toolkit:
        result = await toolkit.execute("put")
        assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE, result.error
        assert f"state_update[0]: the value at {where!r} {reason}" in (result.error or "")
        assert result.state_update is None  # not sent back: no peer could read it
        assert await toolkit.store.load_state(toolkit.session.id) is None
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}
        audited = await toolkit.store.recent_audit(limit=1)
        assert [e.error_code for e in audited] == ["invalid_state_update"]
        good = [{"op": "add", "path": "/context/ok", "value": 1}]
        assert (await toolkit.execute("rawpatch", {"patch": good})).success


class Level(enum.IntEnum):
    HIGH = 2


class Color(str, enum.Enum):  # noqa: UP042 - its str() is "Color.TEAL", not its value
    TEAL = "teal"


async def test_tuples_and_enum_members_are_kept_as_the_json_a_restart_reads_back(
    tmp_path: Path,
) -> None:
    """Before: the cache kept the tuple and the enum members while SQLite stored a list and
    plain values, so the document changed under the session at the next restart."""

    @tool
    def put() -> Output:
        """Store Python values that have a JSON form."""
        value = {"pair": (1, 2), "level": Level.HIGH, "color": Color.TEAL}
        return Output("ok", state_update=[{"op": "add", "path": "/context/v", "value": value}])

    path = tmp_path / "s.db"
    async with Toolkit(put, store=path) as toolkit:
        assert (await toolkit.execute("put")).success
        cached = toolkit.state.cached(toolkit.session.id)
        session_id = toolkit.session.id
    async with Toolkit(store=path) as reopened:
        stored = await reopened.store.load_state(session_id)
    expected = {"context": {"v": {"pair": [1, 2], "level": 2, "color": "teal"}}}
    assert stored is not None and stored.document == cached == expected
    assert cached is not None
    assert [type(cached["context"]["v"][k]) for k in ("pair", "level", "color")] == [
        list,
        int,
        str,
    ]


async def test_an_op_that_is_not_text_is_refused() -> None:
    """Before: ``{"op": ["add"]}`` raised TypeError (unhashable) out of ``execute``."""
    async with Toolkit(rawpatch) as toolkit:
        bad = [{"op": ["add"], "path": "/context/a", "value": 1}]
        result = await toolkit.execute("rawpatch", {"patch": bad})
        assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "state_update[0]: 'op' must be one of" in (result.error or "")


async def test_the_error_names_the_operation_that_failed() -> None:
    async with Toolkit(rawpatch) as toolkit:
        for patch, message in [
            (
                [
                    {"op": "add", "path": "/context/a", "value": 1},
                    {"op": "remove", "path": "/context/nope"},
                ],
                "state_update[1] (remove '/context/nope') not applied: ",
            ),
            (
                [{"op": "move", "from": "/context/nope", "path": "/context/b"}],
                "state_update[0] (move '/context/nope' -> '/context/b') not applied: "
                "'/context/nope' does not exist",
            ),
        ]:
            result = await toolkit.execute("rawpatch", {"patch": patch})
            assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
            assert message in (result.error or "")
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}


async def test_repeated_copies_cannot_blow_up_the_document() -> None:
    """Each copy of the list into itself doubles it: before, 40 such operations would have
    built 2**40 values (the host hangs, then runs out of memory); eight already made 25 MB."""
    async with Toolkit(rawpatch) as toolkit:
        copy = {"op": "copy", "from": "/context/a", "path": "/context/a/-"}
        patch = [{"op": "add", "path": "/context/a", "value": ["x" * 100_000]}, *[copy] * 8]
        result = await toolkit.execute("rawpatch", {"patch": patch})
        assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "state_update[8] (copy '/context/a' -> '/context/a/-'): the update adds more" in (
            result.error or ""
        )
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}


@pytest.mark.parametrize("op", ["copy", "move"])
async def test_copy_or_move_cannot_nest_the_document_too_deep(op: str) -> None:
    async with Toolkit(rawpatch) as toolkit:
        deep = _nested(MAX_DEPTH - 3)  # at /context/d/x: the deepest a value may nest there
        setup = [
            {"op": "add", "path": "/context/d", "value": {"x": deep}},
            {"op": "add", "path": "/context/e", "value": {}},
        ]
        assert (await toolkit.execute("rawpatch", {"patch": setup})).success
        too_deep = [{"op": op, "from": "/context/d", "path": "/context/e/f"}]  # one level more
        result = await toolkit.execute("rawpatch", {"patch": too_deep})
        assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert f"would nest the document deeper than {MAX_DEPTH} levels" in (result.error or "")
        fits = [{"op": op, "from": "/context/d", "path": "/context/g"}]
        assert (await toolkit.execute("rawpatch", {"patch": fits})).success


@tool
def nest(levels: int) -> Output:
    """Store a value that many arrays deep."""
    return Output(
        "ok", state_update=[{"op": "add", "path": "/context/v", "value": _nested(levels)}]
    )


async def test_the_deepest_document_allowed_reaches_a_client_over_http() -> None:
    """Before: a document a client cannot parse (pydantic-core stops at 200 levels) was stored,
    and the client dropped the call's response: the call hung until its timeout."""
    host = Host(nest)
    server = HttpServer(host, "127.0.0.1:0")
    client = await connect_async(await server.start(), agent_id="deep")
    try:
        deepest = await client.call_tool("nest", {"levels": MAX_DEPTH - 2}, timeout=10)
        assert deepest.success, deepest.error
        document, version = await client.get_state()
        assert document == {"context": {"v": _nested(MAX_DEPTH - 2)}} and version == 1
        for levels in (MAX_DEPTH - 1, 200):
            refused = await client.call_tool("nest", {"levels": levels}, timeout=10)
            assert refused.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert (await client.get_state())[1] == 1
    finally:
        await client.close()
        await server.stop()
        await host.close()


class LockedStore(MemoryStore):
    async def save_state(
        self, session_id: str, document: dict[str, Any], *, expected_version: int
    ) -> bool:
        raise sqlite3.OperationalError("database is locked")


async def test_a_store_that_fails_to_save_fails_the_call_which_is_still_audited() -> None:
    """Before: the store's error escaped ``execute``: no result, no audit entry."""
    store = LockedStore()
    async with Toolkit(rawpatch, store=store) as toolkit:
        patch = [{"op": "add", "path": "/context/a", "value": 1}]
        result = await toolkit.execute("rawpatch", {"patch": patch})
        assert not result.success and result.error_code == ToolErrorCode.TOOL_ERROR
        assert result.error_code.retryable
        assert result.error == (
            "state update not saved, the state is unchanged: OperationalError: database is locked"
        )
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}
        assert [e.error_code for e in await store.recent_audit()] == ["tool_error"]


async def test_a_locked_sqlite_file_fails_the_call_and_the_next_one_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("toolmesh.store.sqlite.BUSY_TIMEOUT_S", 0.05)
    path = tmp_path / "s.db"
    async with Toolkit(rawpatch, store=path) as toolkit:
        first = [{"op": "add", "path": "/context/a", "value": 1}]
        assert (await toolkit.execute("rawpatch", {"patch": first})).success
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        second = [{"op": "add", "path": "/context/b", "value": 2}]
        locked = await toolkit.execute("rawpatch", {"patch": second})
        other.execute("ROLLBACK")
        other.close()
        assert locked.error_code == ToolErrorCode.TOOL_ERROR
        assert "database is locked" in (locked.error or "")
        assert (await toolkit.execute("rawpatch", {"patch": second})).success
        stored = await toolkit.store.load_state(toolkit.session.id)
        assert stored is not None
        assert (stored.document, stored.version) == ({"context": {"a": 1, "b": 2}}, 2)


@pytest.mark.parametrize("stored", ["{not json", "[1, 2]"])
async def test_a_damaged_state_record_fails_the_call_and_the_read_clearly(
    stored: str, tmp_path: Path
) -> None:
    path = tmp_path / "a.db"
    host = demo_host(path)
    client = await connect_async(host)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        "INSERT INTO state (session_id, document, version) VALUES (?, ?, 1)",
        (client.session_id, stored),
    )
    db.close()
    result = await client.call_tool("recall", {"key": "k"})
    assert result.error_code == ToolErrorCode.TOOL_ERROR  # not an exception out of the host
    assert f"stored state of session {client.session_id}" in (result.error or "")
    with pytest.raises(RemoteError, match="stored state of session") as refused:
        await client.get_state()
    assert refused.value.code == "runtime_error"
    await client.close()
    await host.close()


async def test_a_patch_refused_by_a_stale_copy_is_judged_again_on_the_stored_document(
    tmp_path: Path,
) -> None:
    from toolmesh.state import StateManager

    path = tmp_path / "a.db"
    first, second = SqliteStore(path), SqliteStore(path)  # two processes on one file
    one, two = StateManager(first), StateManager(second)
    await one.apply("s", [{"op": "add", "path": "/context/n", "value": 1}])
    assert (await two.current("s")).document == {"context": {"n": 1}}  # two caches it
    await one.apply("s", [{"op": "replace", "path": "/context/n", "value": 2}])
    checked = [
        {"op": "test", "path": "/context/n", "value": 2},
        {"op": "add", "path": "/context/seen", "value": True},
    ]
    record = await two.apply("s", checked)  # its copy says 1: the store says 2
    assert (record.document, record.version) == ({"context": {"n": 2, "seen": True}}, 3)
    await first.close()
    await second.close()


async def test_the_longest_integer_allowed_is_kept_and_read_back(tmp_path: Path) -> None:
    longest = int("9" * MAX_INT_DIGITS)

    @tool
    def put(sign: int) -> Output:
        """Store a long integer."""
        return Output(
            "ok", state_update=[{"op": "add", "path": "/context/n", "value": sign * longest}]
        )

    async with Toolkit(put, store=SqliteStore(tmp_path / "s.db")) as toolkit:
        assert (await toolkit.execute("put", {"sign": -1})).success
        assert (await toolkit.execute("put", {"sign": 1})).success
        session_id = toolkit.session.id
    reopened = SqliteStore(tmp_path / "s.db")  # what a restarted host reads
    record = await reopened.load_state(session_id)
    await reopened.close()
    assert record is not None and record.document == {"context": {"n": longest}}
    assert record.version == 2


async def test_the_names_of_new_members_count_towards_the_update_limit() -> None:
    """Before: only values were counted, so an ``add`` (or ``move``) to a member with a long
    name added it for free: five adds stored 20 Mi characters of names, past the limit (the
    fourth passes it: each path is a little longer than its name)."""
    from toolmesh.state import MAX_UPDATE_SIZE

    @tool
    def names() -> Output:
        """Add members with long names."""
        n = MAX_UPDATE_SIZE // 4
        return Output(
            "ok",
            state_update=[{"op": "add", "path": "/context/" + c * n, "value": 1} for c in "abcde"],
        )

    async with Toolkit(names) as toolkit:
        result = await toolkit.execute("names")
        assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "state_update[3]: the update adds more than" in (result.error or "")
        assert await toolkit.store.load_state(toolkit.session.id) is None
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}


async def test_a_refusal_does_not_quote_the_document() -> None:
    """Before: the JSON Patch library's reason quoted whole values of the document (``member
    'nope' not found in {...}`` names the whole container; a failed ``test`` both values): a
    state of 6 MB made each refusal's error 6 MB, and a larger one an error no peer can read."""
    big = {f"k{i}": "x" * 100 for i in range(10_000)}  # about 1 MB
    async with Toolkit(rawpatch) as toolkit:
        put = [{"op": "add", "path": "/context/big", "value": big}]
        assert (await toolkit.execute("rawpatch", {"patch": put})).success
        for op, reason in [
            (
                {"op": "add", "path": "/context/big/nope/x", "value": 1},
                "state_update[0] (add '/context/big/nope/x') not applied: member 'nope' not found",
            ),
            (
                {"op": "test", "path": "/context/big", "value": {"k0": "y"}},
                "state_update[0] (test '/context/big') not applied: {'k0': ",
            ),
        ]:
            result = await toolkit.execute("rawpatch", {"patch": [op]})
            assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
            error = result.error or ""
            assert error.startswith(reason), error[:200]
            assert len(error) < 1000 and "characters, cut)" in error
        assert (await toolkit.state.current(toolkit.session.id)).version == 1


class ContendedStore(MemoryStore):
    """A store another host always writes to first."""

    async def save_state(
        self, session_id: str, document: dict[str, Any], *, expected_version: int
    ) -> bool:
        return False


async def test_a_state_contended_at_every_attempt_fails_the_call_retryably() -> None:
    """Before: it failed as ``invalid_state_update``, which is not retryable, though the update
    was fine and the same call can succeed once the other writers pause."""
    async with Toolkit(rawpatch, store=ContendedStore()) as toolkit:
        patch = [{"op": "add", "path": "/context/a", "value": 1}]
        result = await toolkit.execute("rawpatch", {"patch": patch})
        assert result.error_code == ToolErrorCode.TOOL_ERROR and result.error_code.retryable
        assert result.error == (
            "state update not saved, the state is unchanged: StateContendedError: "
            f"state of session {toolkit.session.id} is contended; update not applied"
        )
        assert result.state_update is None and result.events == []
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}


@pytest.mark.parametrize("char", ["x", "\x01"])  # "\x01" is six bytes of JSON ("\u0001")
async def test_an_update_too_large_to_answer_is_refused_before_it_is_applied(char: str) -> None:
    """A 9 MB update was applied and stored, and its answer, which carries the patch twice
    (``state_update`` and the ``state`` event), was more than one message may hold: the client
    never read it, timed out, and a retry would apply it again."""
    from toolmesh.protocol import DEFAULT_MAX_MESSAGE_BYTES, ToolCallResponse, encode
    from toolmesh.state import MAX_PATCH_BYTES

    @tool
    def big(length: int) -> Output:
        """Store a long text."""
        return Output(
            "ok", state_update=[{"op": "add", "path": "/context/s", "value": char * length}]
        )

    fits = MAX_PATCH_BYTES // (len(to_json(char)) - 2) - 100  # the bytes of one char, unquoted
    async with Toolkit(big) as toolkit:
        refused = await toolkit.execute("big", {"length": fits + 200})
        assert refused.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "one answer can carry back" in (refused.error or "")
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}
        stored = await toolkit.execute("big", {"length": fits})
        assert stored.success, stored.error
        answer = encode(ToolCallResponse(req_id="r", data=stored))
        assert len(answer) < DEFAULT_MAX_MESSAGE_BYTES  # it reaches the caller


async def test_a_document_stays_small_enough_to_be_read_whole() -> None:
    """Updates of a few MiB each grew a document past what a state/get/resp can carry: the
    state could then never be read over the wire again."""
    from toolmesh.state import MAX_DOCUMENT_BYTES

    @tool
    def grow(key: str, length: int) -> Output:
        """Store a long text under key."""
        return Output(
            "ok", state_update=[{"op": "add", "path": f"/context/{key}", "value": "x" * length}]
        )

    @tool
    def drop(key: str) -> Output:
        """Remove key."""
        return Output("ok", state_update=[{"op": "remove", "path": f"/context/{key}"}])

    part = MAX_DOCUMENT_BYTES // 3
    async with Toolkit(grow, drop) as toolkit:
        for key in "ab":
            assert (await toolkit.execute("grow", {"key": key, "length": part})).success
        refused = await toolkit.execute("grow", {"key": "c", "length": part})
        assert refused.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "more than the" in (refused.error or "")
        assert set((await toolkit.state.snapshot(toolkit.session.id))["context"]) == {"a", "b"}
        assert (await toolkit.execute("drop", {"key": "a"})).success  # shrinking is fine
        assert (await toolkit.execute("grow", {"key": "c", "length": part})).success
