"""The PostgreSQL audit flush: a refused row blocks no other, a lost server keeps rows (bounded)."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from tests.conftest import demo_host
from tests.fixtures.postgres import PostgresCluster
from toolmesh import connect_async
from toolmesh.audit import AuditEntry
from toolmesh.store import postgres
from toolmesh.store.postgres import PostgresStore

pytestmark = [pytest.mark.network_server]


def entry(name: str) -> AuditEntry:
    return AuditEntry(tool_name=name, success=True)


def refuse(cluster: PostgresCluster, url: str, tool_name: str) -> None:
    """What an operator may do to the table: from now on the server refuses some rows."""
    cluster.sql(
        f"ALTER TABLE audit ADD CONSTRAINT refused CHECK (tool_name <> '{tool_name}')",
        url.rsplit("/", 1)[1],
    )


async def stored_names(store: PostgresStore) -> list[str]:
    return [e.tool_name for e in reversed(await store.recent_audit(100))]


def lost_entries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage().rsplit("entry follows so it is not lost: ", 1)[1]
        for record in caplog.records
        if record.name == "toolmesh.audit" and "entry follows" in record.getMessage()
    ]


async def test_a_refused_row_blocks_no_other_and_is_counted(
    postgres_url: str, postgres_cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A row the server refused put its whole batch back, and every later flush failed on it:
    no later row was stored, and the rows of callers gone were counted nowhere."""
    caplog.set_level(logging.ERROR, logger="toolmesh.audit")
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        refuse(postgres_cluster, postgres_url, "bad")
        await store.append_audit(entry("g1"), durable=False)
        await store.append_audit(entry("bad"), durable=False)
        await store.append_audit(entry("g2"), durable=False)
        await store.append_audit(entry("g3"))  # durable, and its own row is fine: no error
        assert store.audit_rows_lost == 1  # the refused row of a caller gone, logged in full
        (logged,) = lost_entries(caplog)
        assert '"tool_name": "bad"' in logged

        # A durable caller's own refused row is its to report: raised to it, not counted.
        with pytest.raises(asyncpg.CheckViolationError):
            await store.append_audit(entry("bad"))
        await store.append_audit(entry("g4"), durable=False)
        with pytest.raises(asyncpg.CheckViolationError):
            await store.append_audit(entry("bad"))  # g4, batched with it, is stored
        assert store.audit_rows_lost == 1

        await store.append_audit(entry("bad"), durable=False)
        await store.append_audit(entry("g5"), durable=False)
        await store.flush()  # nobody to raise to: logged and counted
        assert store.audit_rows_lost == 2 and len(lost_entries(caplog)) == 2

        await store.append_audit(entry("g6"))  # nothing refused was kept to block it
        assert await stored_names(store) == ["g1", "g2", "g3", "g4", "g5", "g6"]
    finally:
        await store.close()


async def test_a_host_whose_audit_rows_are_refused_is_degraded(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    store = PostgresStore(postgres_url)
    host = demo_host(None, store=store)
    client = await connect_async(host, agent_id="tester")  # in process: rows are batched
    refuse(postgres_cluster, postgres_url, "echo")
    assert (await client.call_tool("echo", {"text": "a"})).success
    assert (await client.call_tool("count", {"n": 1})).success
    await client.close()
    await host.close()  # (the old code raised here: the refused row was still pending)
    assert host.health()["status"] == "degraded" and host.health()["audit_failures"] == 1
    reader = PostgresStore(postgres_url)
    await reader.open()
    try:
        assert await stored_names(reader) == ["count"]
    finally:
        await reader.close()


async def test_rows_wait_for_an_unreachable_server_but_not_without_bound(
    postgres_url: str,
    postgres_cluster: PostgresCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the server is away rows wait for it; the old code kept every one of them."""
    caplog.set_level(logging.ERROR, logger="toolmesh.audit")
    monkeypatch.setattr(postgres, "MAX_WAITING_ROWS", 3, raising=False)  # (the old code: none)
    store = PostgresStore(postgres_url, reconnect_timeout=0.2)
    await store.open()
    try:
        await store.append_audit(entry("before"))
        postgres_cluster.stop("fast")
        try:
            with pytest.raises(Exception) as raised:
                await store.append_audit(entry("w1"))  # a durable caller hears of it
            assert postgres._lost(raised.value)
            await store.append_audit(entry("w2"), durable=False)
            await store.append_audit(entry("w3"), durable=False)
            with pytest.raises(Exception) as raised:
                await store.flush()
            assert postgres._lost(raised.value)
            assert store.audit_rows_lost == 0  # three rows wait: none lost yet
            await store.append_audit(entry("w4"), durable=False)
            await store.append_audit(entry("w5"), durable=False)
            with pytest.raises(Exception) as raised:
                await store.flush()
            assert postgres._lost(raised.value)
            assert store.audit_rows_lost == 2  # the two oldest were given up, logged in full
            logged = lost_entries(caplog)
            assert len(logged) == 2
            assert '"tool_name": "w1"' in logged[0] and '"tool_name": "w2"' in logged[1]
        finally:
            await asyncio.to_thread(postgres_cluster.start)
        store.reconnect_timeout = 30.0
        await store.flush()  # the server is back: what waited is stored, once
        assert await stored_names(store) == ["before", "w3", "w4", "w5"]
    finally:
        await store.close()


async def test_closing_while_the_server_is_away_logs_the_waiting_rows_and_closes(
    postgres_url: str, postgres_cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """close() raised the flush's error and stopped there: the pool stayed open, and the rows
    that waited were dropped without a word."""
    caplog.set_level(logging.ERROR, logger="toolmesh.audit")
    store = PostgresStore(postgres_url, reconnect_timeout=0.2)
    await store.open()
    await store.append_audit(entry("stored"))
    postgres_cluster.stop("fast")
    try:
        await store.append_audit(entry("w1"), durable=False)
        await store.append_audit(entry("w2"), durable=False)
        await store.close()  # no error: what it could not store is logged, and it closes
        assert store._pool is None  # type: ignore[attr-defined]
        assert store.audit_rows_lost == 2
        logged = lost_entries(caplog)
        assert '"tool_name": "w1"' in logged[0] and '"tool_name": "w2"' in logged[1]
    finally:
        await asyncio.to_thread(postgres_cluster.start)
    reopened = PostgresStore(postgres_url)
    await reopened.open()
    try:
        assert await stored_names(reopened) == ["stored"]  # nothing stored twice, or half
    finally:
        await reopened.close()


async def test_a_cancelled_insert_keeps_its_rows(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    holder = await asyncpg.connect(postgres_url)
    try:
        await store.append_audit(entry("a"))
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("LOCK TABLE audit IN ACCESS EXCLUSIVE MODE")
        appending = asyncio.ensure_future(store.append_audit(entry("b")))
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'audit'::regclass "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        while not await holder.fetchval(waiting):  # until the insert waits (a round trip each)
            pass
        appending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await appending
        await transaction.rollback()
        assert store.audit_rows_lost == 0
        assert await stored_names(store) == ["a", "b"]  # kept for the next flush
    finally:
        await holder.close()
        await store.close()


@pytest.mark.parametrize(("sqlstate", "kind"), [("25006", "read-only"), ("53300", "full")])
async def test_rows_wait_while_the_server_is_read_only_or_out_of_resources(
    postgres_url: str, postgres_cluster: PostgresCluster, sqlstate: str, kind: str
) -> None:
    """A standby during a failover (read-only) or a server out of connections or disk refuses
    every row for a while: the rows wait for the next flush, as for a lost server, and are
    stored once it passes; none is given up."""
    database = postgres_url.rsplit("/", 1)[1]
    store = PostgresStore(postgres_url)
    await store.open()  # makes the audit table
    try:
        postgres_cluster.sql(
            "CREATE FUNCTION passing() RETURNS trigger AS $$ BEGIN "
            f"RAISE EXCEPTION 'the server is {kind} for now' USING ERRCODE = '{sqlstate}'; "
            "END $$ LANGUAGE plpgsql; "
            "CREATE TRIGGER passing BEFORE INSERT ON audit EXECUTE FUNCTION passing()",
            database,
        )
        await store.append_audit(entry("w1"), durable=False)
        with pytest.raises(asyncpg.PostgresError):
            await store.append_audit(entry("w2"))  # a durable caller hears of it
        assert store.audit_rows_lost == 0
        postgres_cluster.sql("DROP TRIGGER passing ON audit", database)
        await store.flush()
        assert await stored_names(store) == ["w1", "w2"]
        assert store.audit_rows_lost == 0
    finally:
        await store.close()
