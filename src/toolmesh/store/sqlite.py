"""The embedded default store: one SQLite file in WAL mode (audit, sessions, state, A2A tasks).

A commit in WAL mode with ``synchronous=NORMAL`` survives the process being killed (it is in
the WAL file before ``commit`` returns) and costs about 20 us. An audit entry for a call that
came over a transport is committed before its response leaves (calls finishing together share
the commit). Entries of in-process calls are committed together at the end of the event-loop
iteration they finished in, or every ``BATCH_ROWS`` rows: a crash can lose only those, and
only together with the callers that received their results in the same process.

The audit table has no secondary index: each one would add a page write to every call, and the
log is read newest-first by rowid. Other processes (``toolmesh audit``) can
read the file while a host writes it.
"""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pydantic_core import to_json

from toolmesh.audit import AuditEntry, log_lost_entry, storable
from toolmesh.errors import ConfigError
from toolmesh.store.base import (
    A2A_FINAL_STATES,
    A2ATaskRecord,
    SessionRecord,
    StateRecord,
    Store,
)

__all__ = ["BATCH_ROWS", "MIGRATIONS", "SqliteStore"]

BATCH_ROWS = 128
BUSY_TIMEOUT_S = 5.0  # how long a statement waits for another connection's write lock

_AUDIT_COLUMNS = (
    "ts",
    "session_id",
    "agent_id",
    "req_id",
    "correlation_id",
    "tool_name",
    "source",
    "transport",
    "success",
    "error_code",
    "duration_ms",
    "input_bytes",
    "output_bytes",
    "args_digest",
    "decision",
    "host_id",
)

_audit_row = operator.attrgetter(*_AUDIT_COLUMNS)  # an entry's values in column order, in C

# A task's first end is final: a stored task in a final state is kept (see Store.save_a2a_task)
_SAVE_A2A_TASK = (
    "INSERT INTO a2a_tasks (task_id, context_id, state, updated_at, document) "  # noqa: S608 - placeholders
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
    "context_id = excluded.context_id, state = excluded.state, "
    "updated_at = excluded.updated_at, document = excluded.document "
    f"WHERE a2a_tasks.state NOT IN ({', '.join('?' for _ in A2A_FINAL_STATES)}) "
    "OR a2a_tasks.document = excluded.document"
)

# A compare-and-set (see Store.replace_a2a_task_on): the task is replaced only while its stored
# document is still the one expected (or already the one written: a retry finds its own write)
_REPLACE_A2A_TASK = (
    "UPDATE a2a_tasks SET context_id = ?, state = ?, updated_at = ?, document = ? "  # noqa: S608 - placeholders
    "WHERE task_id = ? AND (document = ? AND state NOT IN "
    f"({', '.join('?' for _ in A2A_FINAL_STATES)}) OR document = ?)"
)

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE audit (
            id INTEGER PRIMARY KEY,
            ts REAL NOT NULL,
            session_id TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            req_id TEXT NOT NULL,
            correlation_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            source TEXT NOT NULL,
            transport TEXT NOT NULL,
            success INTEGER NOT NULL,
            error_code TEXT,
            duration_ms INTEGER NOT NULL,
            input_bytes INTEGER NOT NULL,
            output_bytes INTEGER NOT NULL,
            args_digest TEXT NOT NULL,
            decision TEXT NOT NULL,
            host_id TEXT NOT NULL
        );
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            capabilities TEXT NOT NULL,
            created_at REAL NOT NULL,
            metadata TEXT NOT NULL
        );
        CREATE TABLE state (
            session_id TEXT PRIMARY KEY,
            document TEXT NOT NULL,
            version INTEGER NOT NULL
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE a2a_tasks (
            task_id TEXT PRIMARY KEY,
            context_id TEXT NOT NULL,
            state TEXT NOT NULL,
            updated_at REAL NOT NULL,
            document TEXT NOT NULL
        );
        CREATE INDEX a2a_tasks_by_context ON a2a_tasks (context_id, updated_at);
        """,
    ),
]
"""Schema versions, applied in order on open; ``schema_version`` records the last one applied."""


class SqliteStore(Store):
    """Audit, sessions and state in one SQLite file (or ``:memory:``)."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self.url = f"sqlite:///{self.path}"
        self._db: sqlite3.Connection | None = None
        self._lock = threading.RLock()  # a sync client may call from its own loop thread
        self._pending: list[tuple[Any, ...]] = []  # audit rows waiting for the next commit
        self._commit_scheduled = False
        self._insert_audit = (
            f"INSERT INTO audit ({', '.join(_AUDIT_COLUMNS)}) "  # noqa: S608 - fixed columns
            f"VALUES ({', '.join('?' for _ in _AUDIT_COLUMNS)})"
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        self.connection()

    def connection(self) -> sqlite3.Connection:
        """The open connection, opening and migrating the file on first use."""
        if self._db is None:
            self._db = self._connect()
        return self._db

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            target = Path(self.path).expanduser().resolve()
            if not target.parent.is_dir():
                raise ConfigError(f"audit database folder {target.parent} does not exist")
            if target.is_dir():  # SQLite would say only "unable to open database file"
                raise ConfigError(f"{target} is a folder; give the path of a database file")
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"cannot use {self.path} as a toolmesh database: {exc}") from exc
        try:
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            # Look before touching: WAL mode and the migrations would change someone else's file.
            _check_ours(db, self.path)
            _use_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            _migrate(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise ConfigError(f"cannot use {self.path} as a toolmesh database: {exc}") from exc
        except BaseException:
            db.close()
            raise
        return db

    async def close(self) -> None:
        if self._db is not None:
            self.commit()
            self._db.close()
            self._db = None

    def commit(self, *, last_reported: bool = False) -> None:
        """Write and commit the rows appended without ``durable`` (a no-op when there are none).
        On failure every row is logged in full and counted in ``audit_rows_lost``;
        ``last_reported``: but the newest, whose caller reports it, so the error is raised to
        it. Otherwise nobody is left to raise to (a scheduled commit, or a session being saved
        that has no part in those rows), and the error ends here."""
        with self._lock:
            self._commit_scheduled = False
            if not self._pending:
                return
            rows, self._pending = self._pending, []
            try:
                try:
                    self._insert(rows)
                except UnicodeEncodeError:  # text sqlite3 cannot write (a lone surrogate)
                    self._insert([storable(row) for row in rows])
            except Exception as exc:
                # Rows batched from earlier calls have no caller left to report them.
                orphans = rows[:-1] if last_reported else rows
                for row in orphans:
                    log_lost_entry(AuditEntry(**dict(zip(_AUDIT_COLUMNS, row, strict=True))), exc)
                self.audit_rows_lost += len(orphans)
                if last_reported:
                    raise

    def _insert(self, rows: list[tuple[Any, ...]]) -> None:
        db = self.connection()
        if len(rows) == 1:
            db.execute(self._insert_audit, rows[0])  # one statement is one transaction
            return
        db.execute("BEGIN")
        try:
            db.executemany(self._insert_audit, rows)
            db.execute("COMMIT")
        except BaseException:
            # SQLite rolls back by itself on some errors (a full disk): a ROLLBACK then would
            # fail and hide the real error. A failed COMMIT leaves it open: end it here.
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _commit_soon(self) -> None:
        if not self._commit_scheduled:
            self._commit_scheduled = True
            asyncio.get_running_loop().call_soon(self.commit)

    # -- audit -----------------------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry, *, durable: bool = True) -> None:
        row = _audit_row(entry)
        with self._lock:
            self._pending.append(row)
            if durable or len(self._pending) >= BATCH_ROWS:
                self.commit(last_reported=True)  # one transaction for this row and any waiting
            else:
                self._commit_soon()

    async def recent_audit(self, limit: int = 20) -> list[AuditEntry]:
        self.commit()
        return read_audit(self.connection(), limit)

    # -- sessions and state ----------------------------------------------------------------------

    async def save_session(self, record: SessionRecord) -> None:
        with self._lock:
            self.commit()
            self.connection().execute(
                "INSERT INTO sessions (session_id, agent_id, capabilities, created_at, metadata) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET "
                "agent_id=excluded.agent_id, capabilities=excluded.capabilities, "
                "metadata=excluded.metadata",
                (
                    record.session_id,
                    record.agent_id,
                    json.dumps(record.capabilities),
                    record.created_at,
                    json.dumps(record.metadata),
                ),
            )

    async def load_session(self, session_id: str) -> SessionRecord | None:
        row = (
            self.connection()
            .execute(
                "SELECT agent_id, capabilities, created_at, metadata FROM sessions "
                "WHERE session_id = ?",
                (session_id,),
            )
            .fetchone()
        )
        if row is None:
            return None
        return SessionRecord(session_id, row[0], json.loads(row[1]), row[2], json.loads(row[3]))

    async def load_state(self, session_id: str) -> StateRecord | None:
        row = (
            self.connection()
            .execute("SELECT document, version FROM state WHERE session_id = ?", (session_id,))
            .fetchone()
        )
        return None if row is None else StateRecord(json.loads(row[0]), row[1])

    async def save_state(
        self, session_id: str, document: dict[str, Any], *, expected_version: int
    ) -> bool:
        text = json.dumps(document, ensure_ascii=False)
        with self._lock:
            self.commit()
            db = self.connection()
            if expected_version == 0:
                cursor = db.execute(
                    "INSERT INTO state (session_id, document, version) VALUES (?, ?, 1) "
                    "ON CONFLICT(session_id) DO NOTHING",
                    (session_id, text),
                )
            else:
                cursor = db.execute(
                    "UPDATE state SET document = ?, version = version + 1 "
                    "WHERE session_id = ? AND version = ?",
                    (text, session_id, expected_version),
                )
        return cursor.rowcount == 1

    # -- A2A tasks -------------------------------------------------------------------------------

    async def save_a2a_task(self, record: A2ATaskRecord) -> bool:
        text = to_json(record.document).decode()
        with self._lock:
            self.commit()
            cursor = self.connection().execute(
                _SAVE_A2A_TASK,
                (
                    record.task_id,
                    record.context_id,
                    record.state,
                    record.updated_at,
                    text,
                    *A2A_FINAL_STATES,
                ),
            )
        return cursor.rowcount == 1

    async def replace_a2a_task_on(
        self, record: A2ATaskRecord, host_id: str, expected: A2ATaskRecord
    ) -> bool:
        # The stored text is to_json of the document; so is the expectation's (a document
        # read back, json.loads of that text, serializes to the same text again)
        text = to_json(record.document).decode()
        with self._lock:
            self.commit()
            cursor = self.connection().execute(
                _REPLACE_A2A_TASK,
                (
                    record.context_id,
                    record.state,
                    record.updated_at,
                    text,
                    record.task_id,
                    to_json(expected.document).decode(),
                    *A2A_FINAL_STATES,
                    text,
                ),
            )
        return cursor.rowcount == 1

    async def load_a2a_task(self, task_id: str) -> A2ATaskRecord | None:
        row = (
            self.connection()
            .execute(
                "SELECT task_id, context_id, state, updated_at, document FROM a2a_tasks "
                "WHERE task_id = ?",
                (task_id,),
            )
            .fetchone()
        )
        return None if row is None else _task_record(row)

    async def list_a2a_tasks(
        self,
        *,
        context_id: str = "",
        state: str = "",
        updated_after: float = 0.0,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[A2ATaskRecord], int]:
        where: list[str] = []
        values: list[str | float] = []
        if context_id:
            where.append("context_id = ?")
            values.append(context_id)
        if state:
            where.append("state = ?")
            values.append(state)
        if updated_after:
            where.append("updated_at > ?")
            values.append(updated_after)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        db = self.connection()
        total = db.execute(f"SELECT COUNT(*) FROM a2a_tasks{clause}", values).fetchone()[0]  # noqa: S608
        rows = db.execute(
            "SELECT task_id, context_id, state, updated_at, document FROM a2a_tasks"  # noqa: S608
            f"{clause} ORDER BY updated_at DESC LIMIT ? OFFSET ?",
            [*values, limit, offset],
        ).fetchall()
        return [_task_record(row) for row in rows], int(total)


def _task_record(row: tuple[Any, ...]) -> A2ATaskRecord:
    return A2ATaskRecord(row[0], row[1], row[2], row[3], json.loads(row[4]))


def _check_ours(db: sqlite3.Connection, path: str) -> None:
    """Refuse a database that has tables but no ``schema_version``: it belongs to someone else.
    An empty one (a new file) is fine. Only reads, so a refused file is left as it was."""
    names = [
        row[0]
        for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        )
    ]
    if names and "schema_version" not in names:
        raise ConfigError(
            f"{path} is not a toolmesh database (it has tables: {', '.join(names)}); "
            "give a new or toolmesh-made file"
        )


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch the file to WAL mode. The switch needs the file to itself and fails at once,
    without the busy timeout, while another connection opens the same new file (a second host,
    `toolmesh audit`): try again until that one is done or the timeout has passed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)


def _migrate(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    for version, script in MIGRATIONS:
        if version > _schema_version(db):
            db.execute("BEGIN IMMEDIATE")
            try:
                # Look again under the write lock: another process opening the same new file
                # (a second host, `toolmesh audit`) may have applied it since.
                if version > _schema_version(db):
                    for statement in filter(str.strip, script.split(";")):
                        db.execute(statement)
                    db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise


def _schema_version(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def read_audit(db: sqlite3.Connection, limit: int) -> list[AuditEntry]:
    """The newest ``limit`` entries of an open toolmesh database, newest first."""
    rows = db.execute(
        f"SELECT {', '.join(_AUDIT_COLUMNS)} FROM audit ORDER BY id DESC LIMIT ?",  # noqa: S608
        (limit,),
    ).fetchall()
    entries = []
    for row in rows:
        values = dict(zip(_AUDIT_COLUMNS, row, strict=True))
        values["success"] = bool(values["success"])
        entries.append(AuditEntry(**values))
    return entries
