"""The Store contract, run against every implementation (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from toolmesh import Host, Toolkit, connect_async, tool
from toolmesh.audit import AuditEntry
from toolmesh.store import MemoryStore, Store, open_store
from toolmesh.store.base import A2A_FINAL_STATES, A2ATaskRecord, SessionRecord

StoreFactory = Callable[[], Store]


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Stores over one database: every call gives a new store object on the same data."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
    else:
        request.applymarker(pytest.mark.network_server)
        url = request.getfixturevalue("postgres_url")
    return lambda: open_store(url)


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[Store]:
    opened = make_store()
    await opened.open()
    yield opened
    await opened.close()


async def test_audit_entries_come_back_newest_first(store: Store) -> None:
    await store.append_audit(AuditEntry(tool_name="a", success=True, session_id="s"))
    await store.append_audit(AuditEntry(tool_name="b", success=False, error_code="timeout"))
    newest = await store.recent_audit(limit=1)
    assert [(e.tool_name, e.success, e.error_code) for e in newest] == [("b", False, "timeout")]
    assert [e.tool_name for e in await store.recent_audit()] == ["b", "a"]


async def test_text_no_database_can_hold_is_kept_escaped(make_store: StoreFactory) -> None:
    """A lone surrogate (an in-process caller can pass one) and NUL (JSON allows it, PostgreSQL
    text does not) are stored as their escapes; the entry is kept, and the host stays healthy."""
    host = Host(Toolkit(), store=make_store())
    client = await connect_async(host, agent_id="odd")
    for name in ("ec\udc80ho", "nul\x00name"):
        result = await client.call_tool(name, {})
        assert result.error_code == "unknown_tool"
    await client.close()
    assert host.healthy
    names = [entry.tool_name for entry in await host.store.recent_audit()]
    await host.close()
    assert names == ["nul\\x00name", "ec\\udc80ho"]


async def test_batched_entries_are_kept_through_close(make_store: StoreFactory) -> None:
    first = make_store()
    await first.open()
    for index in range(5):
        await first.append_audit(AuditEntry(tool_name=f"t{index}", success=True), durable=False)
    await first.close()
    second = make_store()
    await second.open()
    assert [e.tool_name for e in await second.recent_audit()] == [f"t{i}" for i in range(4, -1, -1)]
    await second.close()


async def test_durable_entries_are_visible_to_another_store_at_once(
    make_store: StoreFactory,
) -> None:
    writer, reader = make_store(), make_store()
    await writer.open()
    await reader.open()
    entry = AuditEntry(
        tool_name="t",
        success=True,
        session_id="s1",
        agent_id="a",
        req_id="r",
        duration_ms=7,
        input_bytes=3,
        output_bytes=4,
        args_digest="d",
        decision="rule",
        host_id="h",
        transport="http",
        source="python",
    )
    await writer.append_audit(entry)
    (seen,) = await reader.recent_audit()
    assert seen == entry
    await writer.close()
    await reader.close()


async def test_sessions_are_created_and_updated(store: Store) -> None:
    assert await store.load_session("nope") is None
    await store.save_session(SessionRecord("s", "", [], 1.5, {"transport": "http"}))
    await store.save_session(SessionRecord("s", "agent", ["fs::read"], 9.0, {"a2e_caps": ["t"]}))
    record = await store.load_session("s")
    assert record is not None
    assert (record.agent_id, record.capabilities, record.metadata) == (
        "agent",
        ["fs::read"],
        {"a2e_caps": ["t"]},
    )
    assert record.created_at == 1.5  # kept from the first save


async def test_state_is_compare_and_set(store: Store) -> None:
    assert await store.load_state("s") is None
    assert await store.save_state("s", {"context": {"n": 1}}, expected_version=0)
    assert not await store.save_state("s", {"context": {"n": 9}}, expected_version=0)
    assert await store.save_state("s", {"context": {"n": 2}}, expected_version=1)
    assert not await store.save_state("s", {"context": {"n": 9}}, expected_version=1)
    record = await store.load_state("s")
    assert record is not None and (record.document, record.version) == ({"context": {"n": 2}}, 2)


async def test_concurrent_writers_lose_no_update(make_store: StoreFactory) -> None:
    """Two stores (two hosts) race compare-and-set updates of one document."""
    stores = [make_store(), make_store()]
    for each in stores:
        await each.open()

    async def increment(each: Store, times: int) -> None:
        done = 0
        while done < times:
            current = await each.load_state("shared")
            version = current.version if current else 0
            count = current.document["n"] if current else 0
            if await each.save_state("shared", {"n": count + 1}, expected_version=version):
                done += 1

    await asyncio.gather(increment(stores[0], 20), increment(stores[1], 20))
    record = await stores[0].load_state("shared")
    assert record is not None and record.document == {"n": 40} and record.version == 40
    for each in stores:
        await each.close()


async def test_a2a_tasks_are_shared(make_store: StoreFactory) -> None:
    """A task one host saves, another finds, lists and replaces (issue 6's task store)."""
    first, second = make_store(), make_store()
    await first.open()
    await second.open()
    for index, (task_id, context, state) in enumerate(
        [("t1", "c1", "completed"), ("t2", "c1", "working"), ("t3", "c2", "completed")]
    ):
        doc = {"id": task_id, "contextId": context, "n": index}
        await first.save_a2a_task(A2ATaskRecord(task_id, context, state, float(index), doc))
    loaded = await second.load_a2a_task("t2")
    assert loaded is not None and loaded.document == {"id": "t2", "contextId": "c1", "n": 1}
    assert await second.load_a2a_task("nope") is None
    records, total = await second.list_a2a_tasks(context_id="c1")
    assert [r.task_id for r in records] == ["t2", "t1"] and total == 2  # newest first
    records, total = await second.list_a2a_tasks(state="completed", limit=1, offset=1)
    assert [r.task_id for r in records] == ["t1"] and total == 2
    records, total = await second.list_a2a_tasks()
    assert total == 3 and len(records) == 3
    await second.save_a2a_task(A2ATaskRecord("t2", "c1", "canceled", 9.0, {"id": "t2"}))
    replaced = await first.load_a2a_task("t2")
    assert replaced is not None and (replaced.state, replaced.document) == (
        "canceled",
        {"id": "t2"},
    )
    await first.close()
    await second.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def two_hosts(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Store, Store]]:
    """The stores of two hosts on one database (in memory: one store, shared by nobody else)."""
    if request.param == "memory":
        store = MemoryStore()
        yield store, store
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
    else:
        request.applymarker(pytest.mark.network_server)
        url = request.getfixturevalue("postgres_url")
    stores = open_store(url), open_store(url)
    for each in stores:
        await each.open()
    yield stores
    for each in stores:
        await each.close()


def _task(task_id: str, state: str, says: str = "") -> A2ATaskRecord:
    doc = {"id": task_id, "contextId": "c", "status": {"state": state}, "says": says}
    return A2ATaskRecord(task_id, "c", state, 1.0, doc)


async def test_a_tasks_first_end_is_final(two_hosts: tuple[Store, Store]) -> None:
    """Whichever host records a task's end first, that end stays: later writes of the task,
    ends or not, are refused and say so. Its own document again (a retry) is written."""
    first, second = two_hosts
    for state in ("submitted", "working", "input-required", "working"):
        assert await first.save_a2a_task(_task("t", state))  # a task that runs goes on
    loaded = await second.load_a2a_task("t")
    assert loaded is not None and loaded.state == "working"
    for end in A2A_FINAL_STATES:
        task_id = f"t-{end}"
        assert await first.save_a2a_task(_task(task_id, "working"))
        assert await first.save_a2a_task(_task(task_id, end, "the first end"))
        for late in [*A2A_FINAL_STATES, "working", "input-required"]:
            assert not await second.save_a2a_task(_task(task_id, late, "a later one"))
        assert await first.save_a2a_task(_task(task_id, end, "the first end"))
        kept = await second.load_a2a_task(task_id)
        assert kept is not None
        assert (kept.state, kept.document) == (end, _task(task_id, end, "the first end").document)
        records, total = await second.list_a2a_tasks(state=end)
        assert total == 1 and [r.task_id for r in records] == [task_id]


async def test_hosts_ending_tasks_together_keep_one_end_each(
    two_hosts: tuple[Store, Store],
) -> None:
    """One host completes each task as the other cancels it, concurrently: one write of each
    task is written, the other refused, and the task holds the written one."""
    first, second = two_hosts
    ids = [f"t{n}" for n in range(20)]
    for task_id in ids:
        assert await first.save_a2a_task(_task(task_id, "working"))
    outcomes = await asyncio.gather(
        *(first.save_a2a_task(_task(task_id, "completed")) for task_id in ids),
        *(second.save_a2a_task(_task(task_id, "canceled")) for task_id in ids),
    )
    for task_id, completed, canceled in zip(ids, outcomes[:20], outcomes[20:], strict=True):
        assert completed != canceled, task_id
        kept = await first.load_a2a_task(task_id)
        assert kept is not None and kept.state == ("completed" if completed else "canceled")


async def test_published_signals_reach_subscribers(make_store: StoreFactory) -> None:
    """A signal published through one store reaches the subscribers of every store on the same
    database (PostgreSQL) or of the same store (SQLite, one process)."""
    publisher = make_store()
    await publisher.open()
    listener = publisher if not publisher.shared else make_store()
    await listener.open()
    arrived: asyncio.Queue[str] = asyncio.Queue()
    unsubscribe = listener.subscribe("a2a.cancel", arrived.put_nowait)
    await publisher.publish("a2a.cancel", "task-1")
    assert await asyncio.wait_for(arrived.get(), 10) == "task-1"
    unsubscribe()
    with pytest.raises(ValueError, match="topic"):
        await publisher.publish("Bad Topic", "x")
    with pytest.raises(ValueError, match="under"):
        await publisher.publish("big", "x" * 8000)
    await publisher.close()
    await listener.close()


async def test_a_host_on_the_store_audits_each_call_once(make_store: StoreFactory) -> None:
    @tool
    def remember(value: str) -> str:
        """Remember a value in the session state."""
        return value

    host = Host(Toolkit(remember), store=make_store())
    async with host:
        client = await connect_async(host, agent_id="tester")
        result = await client.call_tool("remember", {"value": "x"})
        assert result.success
        await client.close()
    reader = make_store()
    await reader.open()
    entries = await reader.recent_audit()
    assert [(e.tool_name, e.agent_id, e.success) for e in entries] == [("remember", "tester", True)]
    await reader.close()


async def test_a2a_task_replace_is_a_compare_and_set(two_hosts: tuple[Store, Store]) -> None:
    """Two hosts read a task waiting for input and both replace it (each resuming it with its
    reply): the first write is made; the second's expectation is stale, and it is refused and
    changes nothing. The write made again counts as written (a retry after a lost reply); an
    unknown task, or an ended one (even as expected), is not written."""
    first, second = two_hosts
    assert await first.save_a2a_task(_task("t", "input-required", "a question"))
    read_first, read_second = await first.load_a2a_task("t"), await second.load_a2a_task("t")
    assert read_first is not None and read_second is not None
    resumed = _task("t", "input-required", "the first reply")
    assert await first.replace_a2a_task_on(resumed, "h1", read_first)
    assert await first.replace_a2a_task_on(resumed, "h1", read_first)  # its own write, again
    stale = _task("t", "input-required", "the second reply")
    assert not await second.replace_a2a_task_on(stale, "h2", read_second)
    kept = await second.load_a2a_task("t")
    assert kept is not None and kept.document == resumed.document
    records, total = await second.list_a2a_tasks()
    assert [r.document for r in records] == [resumed.document] and total == 1
    assert not await second.replace_a2a_task_on(_task("u", "working"), "h2", read_second)
    assert await second.load_a2a_task("u") is None
    assert await first.save_a2a_task(_task("t", "completed", "the end"))
    ended = await first.load_a2a_task("t")
    assert ended is not None
    assert not await second.replace_a2a_task_on(_task("t", "working"), "h2", ended)
    kept = await first.load_a2a_task("t")
    assert kept is not None and kept.document == ended.document
