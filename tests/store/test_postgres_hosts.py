"""Which hosts are alive, and which host runs each A2A task (PostgreSQL): a task whose host
stopped beating is an orphan another host may settle; one whose host lives, the reader's own,
one written without a host (or last by a host of the previous version), and any while the
reader itself cannot tell (it has not beaten steadily for the timeout), are not.

Time is the stores' ``clock`` (one ``Clock`` shared by the hosts of a test): moved, not waited
for. A "host" is a ``PostgresStore`` of its own and the id it beats with."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.postgres import PostgresCluster
from tests.store.test_postgres_mailbox import START, Clock, hosts
from toolmesh.store import A2ATaskRecord, postgres
from toolmesh.store.base import A2A_FINAL_STATES
from toolmesh.store.postgres import PostgresStore

pytestmark = [pytest.mark.network_server]

STEP = 5.0  # a beat every 5 s, as the A2A server's heartbeat (HEARTBEAT_INTERVAL)

# What a host of the previous version writes for a task: it knows no host columns.
_PREVIOUS_SAVE = (
    "INSERT INTO a2a_tasks (task_id, context_id, state, updated_at, document) "
    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id) DO UPDATE SET "
    "context_id = excluded.context_id, state = excluded.state, "
    "updated_at = excluded.updated_at, document = excluded.document "
    "WHERE a2a_tasks.state <> ALL($6::text[]) "
    "OR a2a_tasks.document = excluded.document"
)


async def previous_save(store: PostgresStore, record: A2ATaskRecord) -> None:
    await store.pool.execute(
        _PREVIOUS_SAVE,
        record.task_id,
        record.context_id,
        record.state,
        record.updated_at,
        json.dumps(record.document),
        list(A2A_FINAL_STATES),
    )


def _task(task_id: str, state: str = "working", updated_at: float = 1.0) -> A2ATaskRecord:
    doc = {"id": task_id, "contextId": "c", "status": {"state": state}}
    return A2ATaskRecord(task_id, "c", state, updated_at, doc)


async def beat(clock: Clock, seconds: float, *beating: tuple[PostgresStore, str]) -> None:
    """Each host of ``beating`` beats now and every ``STEP`` as the clock moves on by
    ``seconds``: they beat steadily throughout."""
    end = clock.now + seconds
    while True:
        for store, host_id in beating:
            await store.host_alive(host_id)
        if clock.now >= end:
            return
        clock.now = min(clock.now + STEP, end)


async def test_a_task_whose_host_stopped_beating_is_an_orphan(postgres_url: str) -> None:
    clock = Clock(START)
    reader, writer = await hosts(postgres_url, clock)
    try:
        await writer.host_alive("w")
        await reader.host_alive("r")
        assert await writer.save_a2a_task_on(_task("t-w"), "w")
        assert await reader.save_a2a_task_on(_task("t-r"), "r")
        assert await reader.save_a2a_task(_task("t-none"))  # written without a host
        ids = {"t-w", "t-r", "t-none", "t-unknown"}
        assert await reader.orphaned_a2a_tasks(ids, "r") == set()  # r cannot tell yet
        await beat(clock, postgres.HOST_TIMEOUT, (reader, "r"), (writer, "w"))
        assert await reader.orphaned_a2a_tasks(ids, "r") == set()  # w lives
        await beat(clock, postgres.HOST_TIMEOUT + STEP, (reader, "r"))  # w stopped beating
        assert await reader.orphaned_a2a_tasks(ids, "r") == {"t-w"}
        rows = await reader.pool.fetch("SELECT host_id FROM hosts")
        assert [row["host_id"] for row in rows] == ["r"]  # the beats forget hosts gone
        assert await reader.orphaned_a2a_tasks(ids, "") == set()  # a host without an id
        await writer.host_alive("w")  # it was only slow: its task is its own again
        assert await reader.orphaned_a2a_tasks(ids, "r") == set()
        await writer.host_gone("w")  # a clean close: no need to wait for the timeout
        assert await reader.orphaned_a2a_tasks(ids, "r") == {"t-w"}
        assert await reader.orphaned_a2a_tasks(set(), "r") == set()
    finally:
        for store in (reader, writer):
            await store.close()


async def test_after_the_database_was_away_nobody_is_judged_until_the_others_could_beat(
    postgres_url: str,
) -> None:
    """Every heartbeat is late once the database is back (a restart, a failover): a reader
    judges nobody until it has beaten steadily for the timeout again, by when the hosts alive
    have beaten too. Nor does a reader whose own beats stopped."""
    clock = Clock(START)
    reader, writer = await hosts(postgres_url, clock)
    try:
        assert await writer.save_a2a_task_on(_task("t"), "w")
        await beat(clock, postgres.HOST_TIMEOUT, (reader, "r"), (writer, "w"))
        clock.now += 600.0  # the database was away for ten minutes: no beat landed
        await reader.host_alive("r")  # the reader's first beat back: its steady run restarts
        assert await reader.orphaned_a2a_tasks({"t"}, "r") == set()  # w has not had its turn
        await writer.host_alive("w")
        await beat(clock, postgres.HOST_TIMEOUT, (reader, "r"), (writer, "w"))
        assert await reader.orphaned_a2a_tasks({"t"}, "r") == set()  # w came back
        await beat(clock, postgres.HOST_TIMEOUT + STEP, (reader, "r"))
        assert await reader.orphaned_a2a_tasks({"t"}, "r") == {"t"}  # w did not, this time
        clock.now += postgres.HOST_GAP + 1.0  # the reader's own beats stopped meanwhile
        assert await reader.orphaned_a2a_tasks({"t"}, "r") == set()
    finally:
        for store in (reader, writer):
            await store.close()


async def test_beats_within_the_gap_are_one_steady_run(postgres_url: str) -> None:
    clock = Clock(START)
    [store] = await hosts(postgres_url, clock, count=1)
    query = "SELECT up_since FROM hosts WHERE host_id = 'h'"
    try:
        await store.host_alive("h")
        clock.now += postgres.HOST_GAP
        await store.host_alive("h")
        assert await store.pool.fetchval(query) == START
        clock.now += postgres.HOST_GAP + 1.0
        await store.host_alive("h")
        assert await store.pool.fetchval(query) == clock.now
    finally:
        await store.close()


async def test_a_task_a_host_of_the_previous_version_rewrote_has_no_host(
    postgres_url: str,
) -> None:
    """During an upgrade a host of the previous version goes on with a task a new host wrote
    (a reply resuming it): it leaves the host columns as they were, and the task is not taken
    for that host's, whose leaving would otherwise fail a task running elsewhere."""
    clock = Clock(START)
    reader, writer = await hosts(postgres_url, clock)
    try:
        await beat(clock, postgres.HOST_TIMEOUT, (reader, "r"), (writer, "w"))
        assert await writer.save_a2a_task_on(_task("t", "input-required"), "w")
        await previous_save(reader, _task("t", "working", updated_at=2.0))
        await writer.host_gone("w")
        assert await reader.orphaned_a2a_tasks({"t"}, "r") == set()  # reported as stored
        assert await writer.save_a2a_task_on(_task("t", "working", updated_at=3.0), "w")
        assert await reader.orphaned_a2a_tasks({"t"}, "r") == {"t"}  # w's own write again
    finally:
        for store in (reader, writer):
            await store.close()


async def test_a_database_of_the_previous_schema_is_upgraded(
    postgres_url: str, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database the previous version made (cluster migrations 1-3), with tasks it wrote:
    cluster migration 4 adds the hosts and the host of each task. The tasks written before
    have none, and are never orphans (reported as stored, as before); a task written after
    records its host."""
    database = postgres_url.rsplit("/", 1)[1]
    monkeypatch.setattr(postgres, "CLUSTER_MIGRATIONS", postgres.CLUSTER_MIGRATIONS[:3])
    previous = PostgresStore(postgres_url)
    await previous.open()
    await previous_save(previous, _task("t-old"))
    await previous_save(previous, _task("t-done", "completed"))
    await previous.close()
    monkeypatch.undo()
    columns = (
        "SELECT string_agg(column_name, ' ' ORDER BY column_name) "
        "FROM information_schema.columns WHERE table_name = 'a2a_tasks'"
    )
    assert postgres_cluster.sql(columns, database) == "context_id document state task_id updated_at"

    clock = Clock(START)
    [store] = await hosts(postgres_url, clock, count=1)
    try:
        assert postgres_cluster.migrations(database) == "1 2 3 4 5"
        assert postgres_cluster.sql(columns, database) == (
            "context_id document host_at host_id state task_id updated_at"
        )
        assert postgres_cluster.sql("SELECT count(*) FROM hosts", database) == "0"
        hosted = "SELECT string_agg(task_id || ':' || coalesce(host_id, '-'), ' ' ORDER BY task_id)"
        assert postgres_cluster.sql(f"{hosted} FROM a2a_tasks", database) == "t-done:- t-old:-"
        await beat(clock, postgres.HOST_TIMEOUT, (store, "r"))  # r can tell
        assert await store.orphaned_a2a_tasks({"t-old", "t-done"}, "r") == set()
        loaded = await store.load_a2a_task("t-old")
        assert loaded is not None and loaded.state == "working"
        assert await store.save_a2a_task_on(_task("t-new"), "gone")  # a host that never beat
        assert await store.orphaned_a2a_tasks({"t-old", "t-new"}, "r") == {"t-new"}
    finally:
        await store.close()
