"""The SQLite store: migrations, audit rows, state compare-and-set, reopening."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from toolmesh import ConfigError, Host, Toolkit, connect_async, tool
from toolmesh.audit import AuditEntry
from toolmesh.store import MemoryStore, SqliteStore, open_store
from toolmesh.store.base import A2ATaskRecord, SessionRecord
from toolmesh.store.sqlite import BATCH_ROWS, _audit_row


async def test_schema_is_migrated_once(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    store = SqliteStore(path)
    await store.open()
    await store.append_audit(AuditEntry(tool_name="t", success=True))
    await store.close()
    again = SqliteStore(path)
    await again.open()
    assert [e.tool_name for e in await again.recent_audit()] == ["t"]
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(1,), (2,)]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    await again.close()


async def test_state_compare_and_set(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    assert await store.save_state("s", {"v": 1}, expected_version=0)
    assert not await store.save_state("s", {"v": 2}, expected_version=0)
    assert await store.save_state("s", {"v": 2}, expected_version=1)
    record = await store.load_state("s")
    assert record is not None and (record.document, record.version) == ({"v": 2}, 2)
    await store.save_session(SessionRecord("s", "agent", ["fs"], 1.0, {"k": "v"}))
    loaded = await store.load_session("s")
    assert loaded is not None and loaded.capabilities == ["fs"]
    await store.close()


def test_open_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store(None), MemoryStore)
    assert isinstance(open_store("memory://"), MemoryStore)
    relative = open_store("sqlite:///audit.db")
    assert isinstance(relative, SqliteStore) and relative.path == "audit.db"
    absolute = open_store(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(absolute, SqliteStore) and absolute.path == f"{tmp_path}/a.db"
    with pytest.raises(ConfigError, match="unsupported store URL"):
        open_store("redis://x")


async def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        await SqliteStore(tmp_path / "nope" / "a.db").open()


async def test_a_folder_where_the_file_should_be_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "audit.db").mkdir()
    with pytest.raises(ConfigError, match=r"audit\.db is a folder; give the path of a database"):
        await SqliteStore(tmp_path / "audit.db").open()


async def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError, match="cannot use"):
        await SqliteStore(path).open()


class BrokenStore(MemoryStore):
    async def append_audit(self, entry: AuditEntry, *, durable: bool = True) -> None:
        raise OSError("disk full")


async def test_a_failing_audit_sink_is_reported_loudly(caplog: pytest.LogCaptureFixture) -> None:
    @tool
    def ping() -> str:
        """p"""
        return "pong"

    host = Host(Toolkit(ping), store=BrokenStore())
    with caplog.at_level(logging.ERROR, logger="toolmesh.audit"):
        result = await host.toolkit.execute("ping")
        from toolmesh import connect_async

        client = await connect_async(host)
        await client.call_tool("ping", {})
        await client.close()
    assert result.success
    assert not host.healthy and host.health()["status"] == "degraded"
    assert "disk full" in caplog.text and '"tool_name": "ping"' in caplog.text


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a2a_tasks(tmp_path: Path, kind: str) -> None:
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "t.db")
    for index, (task_id, context, state) in enumerate(
        [("t1", "c1", "completed"), ("t2", "c1", "working"), ("t3", "c2", "completed")]
    ):
        doc = {"id": task_id, "contextId": context, "n": index}
        await store.save_a2a_task(A2ATaskRecord(task_id, context, state, float(index), doc))
    loaded = await store.load_a2a_task("t2")
    assert loaded is not None and loaded.document == {"id": "t2", "contextId": "c1", "n": 1}
    assert await store.load_a2a_task("nope") is None
    records, total = await store.list_a2a_tasks(context_id="c1")
    assert [r.task_id for r in records] == ["t2", "t1"] and total == 2  # newest first
    records, total = await store.list_a2a_tasks(state="completed", limit=1, offset=1)
    assert [r.task_id for r in records] == ["t1"] and total == 2
    await store.save_a2a_task(A2ATaskRecord("t2", "c1", "completed", 9.0, {"id": "t2"}))
    replaced = await store.load_a2a_task("t2")
    assert replaced is not None and replaced.state == "completed"
    await store.close()


@pytest.mark.parametrize(
    ("schema", "tables"),
    [
        ("CREATE TABLE audit (id INTEGER PRIMARY KEY, who, what)", "audit"),
        ("CREATE TABLE users (id INTEGER PRIMARY KEY); CREATE VIEW v AS SELECT 1", "users, v"),
    ],
)
async def test_a_foreign_database_is_refused_and_left_untouched(
    tmp_path: Path, schema: str, tables: str
) -> None:
    path = tmp_path / "theirs.db"
    foreign = sqlite3.connect(path)
    foreign.executescript(schema)
    foreign.close()
    before = path.read_bytes()
    with pytest.raises(
        ConfigError, match=rf"is not a toolmesh database \(it has tables: {tables}\)"
    ):
        await SqliteStore(path).open()
    # No WAL switch, no schema_version, no toolmesh tables: the file is exactly as it was.
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]


async def test_an_empty_file_or_our_own_database_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    store = SqliteStore(path)
    await store.open()
    await store.close()
    again = SqliteStore(path)  # now it has schema_version: ours
    await again.open()
    await again.append_audit(AuditEntry(tool_name="t", success=True))
    assert [e.tool_name for e in await again.recent_audit()] == ["t"]
    await again.close()


async def test_two_stores_creating_one_new_file_at_once_both_open_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes opening the same new file (two hosts, or `toolmesh audit` as a host
    starts): the second migrates it while the first is about to. Before, the first applied the
    migrations again and failed: "table audit already exists"."""
    path = tmp_path / "new.db"
    other = SqliteStore(path)
    connect = sqlite3.connect
    traced: list[sqlite3.Connection] = []

    def first_is_overtaken(*args: object, **kwargs: object) -> sqlite3.Connection:
        db = connect(*args, **kwargs)  # type: ignore[call-overload]

        def on_statement(sql: str) -> None:
            # A statement is traced as it starts, before it takes any lock.
            if sql.startswith("BEGIN IMMEDIATE") and other._db is None:
                other.connection()

        if not traced:  # the first store's connection only
            traced.append(db)
            db.set_trace_callback(on_statement)
        return db

    monkeypatch.setattr(sqlite3, "connect", first_is_overtaken)
    first = SqliteStore(path)
    await first.open()
    assert other._db is not None  # the other store did migrate the file in between
    monkeypatch.undo()
    await first.append_audit(AuditEntry(tool_name="t", success=True))
    assert [e.tool_name for e in await other.recent_audit()] == ["t"]
    versions = sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchall()
    assert versions == [(1,), (2,)]
    await first.close()
    await other.close()


async def test_switching_to_wal_is_tried_again_when_another_connection_switches_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two connections switching one new file to WAL at once: one fails at once, without the
    busy timeout (SQLite's deadlock rule). Before, opening the store then failed: "database is
    locked" (one start in five when two hosts open the same new file together)."""

    class SwitchingTooConnection(sqlite3.Connection):
        switches = 0

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "PRAGMA journal_mode=WAL":
                SwitchingTooConnection.switches += 1
                if SwitchingTooConnection.switches == 1:
                    raise sqlite3.OperationalError("database is locked")
            return super().execute(sql, *args)

    connect = sqlite3.connect
    monkeypatch.setattr(
        sqlite3,
        "connect",
        lambda *args, **kwargs: connect(*args, **kwargs, factory=SwitchingTooConnection),
    )
    store = SqliteStore(tmp_path / "new.db")
    await store.open()
    monkeypatch.undo()
    assert SwitchingTooConnection.switches == 2
    assert store.connection().execute("PRAGMA journal_mode").fetchone() == ("wal",)
    await store.close()


async def test_a_batched_commit_that_fails_is_counted_and_raises_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("toolmesh.store.sqlite.BUSY_TIMEOUT_S", 0.05)

    @tool
    def ping() -> str:
        """Pong."""
        return "pong"

    path = tmp_path / "a.db"
    host = Host(ping, audit=path)
    loop_errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
    client = await connect_async(host)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    with caplog.at_level(logging.ERROR, logger="toolmesh.audit"):
        for _ in range(2):  # in-process calls: their rows share a commit scheduled after them
            assert (await client.call_tool("ping", {})).success
        await asyncio.sleep(0)  # one turn of the loop: the scheduled commit runs (and fails)
    other.execute("ROLLBACK")
    other.close()
    assert loop_errors == []  # it used to be an "Exception in callback" traceback
    assert host.store.audit_rows_lost == 2 and not host.healthy
    assert host.health()["audit_failures"] == 2
    assert sum("ping" in record.getMessage() for record in caplog.records) == 2  # logged in full
    await client.close()
    await host.close()


def _entry(req_id: str) -> AuditEntry:
    return AuditEntry(tool_name="t", success=True, session_id="s", req_id=req_id, host_id="h")


async def test_a_full_disk_under_a_batch_reports_the_full_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite rolls a transaction back by itself when the disk is full: the store's own
    ROLLBACK then failed ("no transaction is active") and replaced the real error, in the
    caller's exception and in every lost row's log line."""
    store = SqliteStore(tmp_path / "a.db")
    await store.open()
    db = store.connection()
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count={pages}")  # no room for one more page: a full disk
    with caplog.at_level(logging.ERROR, logger="toolmesh.audit"):
        for i in range(BATCH_ROWS - 1):
            await store.append_audit(_entry(str(i)), durable=False)
        with pytest.raises(sqlite3.OperationalError, match="full"):
            await store.append_audit(_entry("last"), durable=False)  # the batch is written
    assert not db.in_transaction
    assert store.audit_rows_lost == BATCH_ROWS - 1
    assert all("full" in record.getMessage() for record in caplog.records)
    db.execute("PRAGMA max_page_count=1000000")  # room again: the store goes on
    for i in range(3):
        await store.append_audit(_entry(f"after{i}"), durable=False)
    await store.append_audit(_entry("durable"))
    assert [e.req_id for e in await store.recent_audit(5)][:4] == [
        "durable",
        "after2",
        "after1",
        "after0",
    ]
    await store.close()


async def test_a_failed_commit_of_a_batch_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A COMMIT that fails leaves its transaction open; every later batch then failed on
    BEGIN ("cannot start a transaction within a transaction") and single rows were never
    committed."""
    store = SqliteStore(tmp_path / "a.db")
    await store.open()
    real = store.connection()

    class FailingCommit:
        def __init__(self) -> None:
            self.failures = 1

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT" and self.failures:
                self.failures -= 1
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    store._db = FailingCommit()  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        store._insert([_audit_row(_entry(f"r{i}")) for i in range(2)])
    assert not real.in_transaction
    for i in range(2):
        await store.append_audit(_entry(f"n{i}"), durable=False)
    await store.append_audit(_entry("n2"))
    store._db = real
    other = sqlite3.connect(tmp_path / "a.db")
    assert other.execute("SELECT req_id FROM audit ORDER BY id").fetchall() == [
        ("n0",),
        ("n1",),
        ("n2",),
    ]
    other.close()
    await store.close()
