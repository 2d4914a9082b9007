"""The shared store: PostgreSQL, for several hosts serving as one (``postgresql://...``).

It keeps what SQLite keeps (audit, sessions, state) in the same schema versions, plus the
tables that let hosts share HTTP sessions (see ``toolmesh.transports.cluster``). The driver is
asyncpg: asyncio-native, a connection pool and LISTEN/NOTIFY built in, and the fastest Python
driver on the short statements a call makes (binary protocol, statements prepared once per
connection).

Every host is a client of the same database, so:

- state updates are compare-and-set on a version column, and a write carries a token,
  recorded in the same statement (kept ``WRITE_TOKEN_SECONDS``), so a retry after a lost
  connection can tell whether its own write landed, even once another host wrote after it
  (never applied twice);
- an audit row carries a unique id, so a retried insert is harmless (exactly once); rows wait
  for the next flush while the server is unreachable (at most ``MAX_WAITING_ROWS``), and a row
  the server refuses is set aside (logged in full, counted) so it blocks no other;
- a post to the mailbox of a session's stream carries an id (recorded while messages are
  kept), and a message is claimed before it is deleted, so a post or a take retried after a
  lost reply neither doubles nor loses a message; a claim expires (``CLAIM_TIMEOUT``), so rows
  claimed by a host that died or went away reach the session through the next host to take,
  and a take returns only the rows it deleted while still holding their claim (recorded per
  take), so a message is never returned by two takes; a take also tells when the claims of
  other takers on the session's rows expire (``take_mail``), for its caller to take again then;
- a post can also count the bytes that wait for the sessions it posts to (``count``), so
  hosts bound a session's backlog wherever its answers wait;
- JSON documents (tasks, sessions, state) and the keys of tasks are stored with NUL written as
  the text ``\\x00`` (JSONB and TEXT refuse NUL, JSON allows it), as audit rows are;
- a host serving A2A tasks says it is alive every few seconds (``host_alive``) and records
  itself with each task it writes (``save_a2a_task_on``); a task whose host stopped being seen
  (``HOST_TIMEOUT``) is one that host will never finish, which any other host may settle
  (``orphaned_a2a_tasks``);
- ``shared = True`` tells the state manager to read documents through, never from a cache;
- a lost connection (a restart, a failover) is retried for ``reconnect_timeout`` seconds, and
  the listener reconnects by itself, then asks subscribers to resync (signals may be lost);
- migrations run under an advisory lock, so hosts starting together apply each one once.

One NOTIFY channel (``toolmesh``) carries every signal as ``"<topic> <payload>"``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from toolmesh.audit import AuditEntry, log_lost_entry, storable
from toolmesh.errors import ConfigError
from toolmesh.store.base import (
    A2A_FINAL_STATES,
    A2ATaskRecord,
    SessionRecord,
    StateRecord,
    Store,
    _check_payload,
    _check_topic,
)

__all__ = [
    "CLAIM_MARGIN",
    "CLAIM_TIMEOUT",
    "CLUSTER_MIGRATIONS",
    "HOST_GAP",
    "HOST_TIMEOUT",
    "MAX_WAITING_ROWS",
    "MIGRATIONS",
    "WRITE_TOKEN_SECONDS",
    "PostgresStore",
    "display_url",
]

logger = logging.getLogger("toolmesh.store")

T = TypeVar("T")
Connection = Any  # asyncpg.Connection or the pool's proxy of one
CHANNEL = "toolmesh"
_MIGRATION_LOCK = 0x746F6F6C  # "tool": the advisory lock hosts take while migrating
MAX_WAITING_ROWS = 10_000
POOL_CLOSE_TIMEOUT = 5.0  # then the pool's connections are terminated, not waited for
"""Audit rows kept for the next flush while the server is unreachable; beyond that the oldest
are logged in full (``toolmesh.audit.log_lost_entry``) and counted in ``audit_rows_lost``."""
CLAIM_TIMEOUT = 30.0
"""Seconds after which mailbox rows claimed by a take (and not deleted) may be claimed by
another. A live taker holds a claim only between its two statements (milliseconds), or while
``run`` rides out a lost connection before retrying its delete; a claim older than this is one
whose host died, lost the session's stream or gave up, and nobody would ever take its rows.
30 s is far above a take's round trips (and a pool wait), in line with the default
``reconnect_timeout``, and far below the age at which ``drop_messages`` forgets messages
(``IDLE_SESSION_SECONDS``, 600 s). Expiring early is safe, only less tidy: a taker deletes
only the rows it still holds, so a slow taker overtaken returns fewer rows, never a row
another take returns."""
WRITE_TOKEN_SECONDS = 600.0
"""Seconds a state write's token is kept (``state_writes``), for a retry after a lost reply to
find that its write landed. A retry comes within the writer's ``reconnect_timeout`` (30 s by
default) of the lost reply: 600 s (as long as ``drop_messages`` keeps mailbox posts) leaves a
wide margin, and the table holds about ten minutes of state writes."""
_TOKENS_FORGOTTEN = 8
"""Expired tokens each state write deletes: more than the one it adds, so the table shrinks
back after a burst of writes."""
CLAIM_MARGIN = 0.05
"""Seconds after another taker's claim expires at which ``take_mail`` says to take again (the
expiry itself is a strict comparison, on the database server's clock)."""
HOST_TIMEOUT = 30.0
"""Seconds after its last heartbeat (``host_alive``) at which a host counts as gone, and the
tasks it was running as never to be finished. The A2A server beats every 5 s
(``toolmesh.a2a.server.HEARTBEAT_INTERVAL``): 30 s is six beats, so a beat or two delayed (a
slow statement, a busy event loop, a pool wait, a short reconnect) never makes a live host look
gone, while a client polling a dead host's task learns of it within half a minute. It is the
time a lost connection is retried for (``reconnect_timeout``) too: a host that has been unable
to write for that long has given up on its tasks' writes anyway."""
HOST_GAP = 15.0
"""The longest gap between two heartbeats of one host that still counts as beating steadily.
A host judges others gone only after beating steadily itself for ``HOST_TIMEOUT``: when the
database was away (a restart, a failover), every host's heartbeat is late once it is back, and
until the others have had the time to beat again none of them looks gone to anyone. 15 s is
three beats: after a shorter gap, a live host's last beat is at most 5 + 15 + 5 s old (a beat
before the gap, the gap, the next beat after it), inside ``HOST_TIMEOUT``."""

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE audit (
            id BIGSERIAL PRIMARY KEY,
            uid TEXT NOT NULL UNIQUE,
            ts DOUBLE PRECISION NOT NULL,
            session_id TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            req_id TEXT NOT NULL,
            correlation_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            source TEXT NOT NULL,
            transport TEXT NOT NULL,
            success BOOLEAN NOT NULL,
            error_code TEXT,
            duration_ms BIGINT NOT NULL,
            input_bytes BIGINT NOT NULL,
            output_bytes BIGINT NOT NULL,
            args_digest TEXT NOT NULL,
            decision TEXT NOT NULL,
            host_id TEXT NOT NULL
        );
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            capabilities JSONB NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            metadata JSONB NOT NULL
        );
        CREATE TABLE state (
            session_id TEXT PRIMARY KEY,
            document JSONB NOT NULL,
            version BIGINT NOT NULL,
            writer TEXT NOT NULL
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
            updated_at DOUBLE PRECISION NOT NULL,
            document JSONB NOT NULL
        );
        CREATE INDEX a2a_tasks_by_context ON a2a_tasks (context_id, updated_at);
        """,
    ),
]
"""The store's schema, numbered as SQLite's (``toolmesh.store.sqlite.MIGRATIONS``)."""

CLUSTER_MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE mailbox (
            id BIGSERIAL PRIMARY KEY,
            session_id TEXT NOT NULL,
            message BYTEA NOT NULL,
            posted_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX mailbox_by_session ON mailbox (session_id, id);
        CREATE TABLE approvals (
            approval_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            host_id TEXT NOT NULL,
            asked_at DOUBLE PRECISION NOT NULL
        );
        """,
    ),
    (
        2,
        # mailbox_posts: the id each post carries, kept as long as messages are, so a post
        # retried after a lost reply adds nothing (its messages may have been taken since);
        # claim: the token of the host taking rows, so a take retried after a lost reply finds
        # the rows it claimed.
        """
        CREATE TABLE mailbox_posts (
            posted_at DOUBLE PRECISION NOT NULL,
            post_id TEXT NOT NULL,
            PRIMARY KEY (posted_at, post_id)
        );
        ALTER TABLE mailbox ADD COLUMN claim TEXT;
        """,
    ),
    (
        3,
        # claimed_at: when the claim was made (the database server's clock), so a claim
        # nobody completes expires (CLAIM_TIMEOUT) and another taker may claim the rows; the
        # rows claimed before this migration count as claimed now (their taker may be alive).
        # mailbox_takes: the rows each take deleted, kept as long as posts are, so a delete
        # retried after a lost reply returns what its first try deleted, and only that (a
        # claim that expired meanwhile may have been taken over: those rows are not its own).
        """
        ALTER TABLE mailbox ADD COLUMN claimed_at DOUBLE PRECISION;
        UPDATE mailbox SET claimed_at = extract(epoch FROM statement_timestamp())
        WHERE claim IS NOT NULL;
        CREATE TABLE mailbox_takes (
            taken_at DOUBLE PRECISION NOT NULL,
            take_id TEXT NOT NULL,
            ids BIGINT[] NOT NULL,
            PRIMARY KEY (taken_at, take_id)
        );
        """,
    ),
    (
        4,
        # hosts: when each host serving A2A tasks was last seen (seen_at, the database server's
        # clock) and since when it has been seen steadily (up_since: no gap over HOST_GAP), so
        # a task whose host stopped is told from one whose host is busy with it.
        # a2a_tasks.host_id: the host that wrote the task (it runs it, when the task goes on);
        # host_at: the updated_at of that write. A host of the previous version rewrites a task
        # without touching either, so a host is taken as the task's only while host_at is its
        # updated_at; tasks written before this migration have none (reported as stored).
        """
        CREATE TABLE hosts (
            host_id TEXT PRIMARY KEY,
            seen_at DOUBLE PRECISION NOT NULL,
            up_since DOUBLE PRECISION NOT NULL
        );
        ALTER TABLE a2a_tasks ADD COLUMN host_id TEXT, ADD COLUMN host_at DOUBLE PRECISION;
        """,
    ),
    (
        5,
        # state_writes: the token of each state write (state.writer holds only the latest), kept
        # WRITE_TOKEN_SECONDS (the database server's clock), so a write retried after a lost
        # reply finds that it landed even when another host wrote after it. written_at is
        # indexed for the writes that forget the expired tokens.
        """
        CREATE TABLE state_writes (
            token TEXT PRIMARY KEY,
            written_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX state_writes_by_time ON state_writes (written_at);
        """,
    ),
]
"""PostgreSQL-only tables for hosts that share HTTP sessions: messages waiting for the host that
holds a session's stream, and which host waits for which approval; which hosts are alive, and
which host runs each A2A task; the tokens of recent state writes."""

_AUDIT_COLUMNS = (
    ("uid", "text"),
    ("ts", "float8"),
    ("session_id", "text"),
    ("agent_id", "text"),
    ("req_id", "text"),
    ("correlation_id", "text"),
    ("tool_name", "text"),
    ("source", "text"),
    ("transport", "text"),
    ("success", "bool"),
    ("error_code", "text"),
    ("duration_ms", "int8"),
    ("input_bytes", "int8"),
    ("output_bytes", "int8"),
    ("args_digest", "text"),
    ("decision", "text"),
    ("host_id", "text"),
)
_ARRAYS = ", ".join(f"${i}::{kind}[]" for i, (_, kind) in enumerate(_AUDIT_COLUMNS, 1))
_INSERT_AUDIT = (
    f"INSERT INTO audit ({', '.join(name for name, _ in _AUDIT_COLUMNS)}) "  # noqa: S608
    f"SELECT * FROM unnest({_ARRAYS}) ON CONFLICT (uid) DO NOTHING"
)
_READ_COLUMNS = [name for name, _ in _AUDIT_COLUMNS[1:]]

# A take, step 1: claim the session's rows that are free, already this token's (a retry, or a
# take after a failed one), or claimed longer ago than the timeout ($4) by a taker that never
# finished. $3: the time of the store's ``clock``; NULL: the database server's clock (one
# clock for every host, so hosts' clocks drifting apart cannot expire a live claim early). A
# claim without a time (made by a host of the previous version still running during an
# upgrade, whose delete does not check the claim) never expires, as before.
# The same statement tells, in a last row with no id, in how many seconds the first of the
# claims other takers still hold on the session's rows expires (rows of a host that died
# between its two steps: nothing else would ever have them taken); none when there are none.
_CLAIM_ROWS = (
    "WITH clock AS (SELECT COALESCE($3::float8, "
    "extract(epoch FROM statement_timestamp())::float8) AS now), "
    "claimed AS (UPDATE mailbox SET claim = $2, claimed_at = clock.now FROM clock "
    "WHERE session_id = $1 AND (claim IS NULL OR claim = $2 OR claimed_at < clock.now - $4) "
    "RETURNING id, message) "
    "SELECT id, message, NULL::float8 AS expires_in FROM claimed UNION ALL "
    "SELECT NULL, NULL, min(m.claimed_at) + $4 - min(clock.now) FROM mailbox m, clock "
    "WHERE m.session_id = $1 AND m.claim <> $2 AND m.claimed_at >= clock.now - $4 "
    "HAVING count(*) > 0"
)
# Step 2: delete the claimed rows this token still holds (a taker that took over an expired
# claim keeps its rows), and record which were deleted ($3, $4: this take's time and id). A
# retry after a lost reply deletes nothing and conflicts: it returns the record instead.
_DELETE_CLAIMED = (
    "WITH gone AS (DELETE FROM mailbox WHERE id = ANY($1::bigint[]) AND claim = $2 "
    "RETURNING id), "
    "took AS (INSERT INTO mailbox_takes (taken_at, take_id, ids) "
    "SELECT $3, $4, COALESCE(array_agg(id), '{}') FROM gone ON CONFLICT DO NOTHING "
    "RETURNING ids) "
    "SELECT ids FROM took UNION ALL "
    "SELECT ids FROM mailbox_takes WHERE taken_at = $3 AND take_id = $4"
)

# A state write (compare-and-set on the version; for version 1 an insert that finds no row)
# records its token ($3) in the same statement, so a retry after a lost reply finds it landed
# even once another writer changed the row again. It also forgets a few tokens older than $4
# (WRITE_TOKEN_SECONDS), skipping those another write is forgetting: it never waits for one,
# and the table holds only the recent writes, however long the hosts run.
_NOW = "extract(epoch FROM statement_timestamp())::float8"  # the database server's clock
_STATE_WRITE = (
    "WITH written AS ({write}), "  # noqa: S608
    # (the cutoff a plain expression, not a join: the index finds the oldest few at once)
    "forgot AS (DELETE FROM state_writes WHERE token = ANY(ARRAY(SELECT token "
    f"FROM state_writes WHERE written_at < {_NOW} - $4 "
    f"ORDER BY written_at LIMIT {_TOKENS_FORGOTTEN} FOR UPDATE SKIP LOCKED))) "
    f"INSERT INTO state_writes (token, written_at) SELECT $3, {_NOW} FROM written"
)
_INSERT_STATE = _STATE_WRITE.format(
    write="INSERT INTO state (session_id, document, version, writer) VALUES ($1, $2, 1, $3) "
    "ON CONFLICT (session_id) DO NOTHING RETURNING 1"
)
_UPDATE_STATE = _STATE_WRITE.format(  # $5: the version the update expects
    write="UPDATE state SET document = $2, version = version + 1, writer = $3 "
    "WHERE session_id = $1 AND version = $5 RETURNING 1"
)

# A heartbeat: host $1 seen now ($2: the time of the store's ``clock``; NULL: the database
# server's, as for claims). Its steady run of beats goes on if its previous beat came within $3
# (HOST_GAP), else it starts now (the host is new, or was away).
_HOST_ALIVE = (
    "WITH clock AS (SELECT COALESCE($2::float8, "
    "extract(epoch FROM statement_timestamp())::float8) AS now) "
    "INSERT INTO hosts (host_id, seen_at, up_since) SELECT $1, now, now FROM clock "
    "ON CONFLICT (host_id) DO UPDATE SET seen_at = excluded.seen_at, up_since = CASE "
    "WHEN hosts.seen_at >= excluded.seen_at - $3 THEN hosts.up_since "
    "ELSE excluded.up_since END"
)
# Then the rows of the other hosts not seen for $3 (HOST_TIMEOUT) are forgotten: a host without
# a row is as gone as one whose row is that old, and one coming back starts a new run either
# way, so the table holds the hosts alive, however many died. A statement of its own, skipping
# the rows others hold: it never waits, and a heartbeat locks only its own row (hosts coming
# back together after an outage, each row stale, cannot deadlock).
_FORGET_HOSTS = (
    "WITH clock AS (SELECT COALESCE($2::float8, "
    "extract(epoch FROM statement_timestamp())::float8) AS now) "
    "DELETE FROM hosts WHERE host_id IN (SELECT host_id FROM hosts, clock "
    "WHERE host_id <> $1 AND seen_at < clock.now - $3 FOR UPDATE OF hosts SKIP LOCKED)"
)
# Of the tasks $3, those whose recorded host (by a write it made: host_at) is not the reader
# ($1) and has not been seen for $4 (HOST_TIMEOUT, a closed host's row is gone): none unless
# the reader itself has been beating steadily (its last beat within $5, HOST_GAP) for $4, so
# that after the database was away the others have had the time to beat again. $2: as above.
_ORPHANED = (
    "WITH clock AS (SELECT COALESCE($2::float8, "
    "extract(epoch FROM statement_timestamp())::float8) AS now) "
    "SELECT t.task_id FROM a2a_tasks t, clock "
    "WHERE t.task_id = ANY($3::text[]) AND t.host_id <> $1 AND t.host_at = t.updated_at "
    "AND EXISTS (SELECT 1 FROM hosts r WHERE r.host_id = $1 "
    "AND r.seen_at >= clock.now - $5 AND r.up_since <= clock.now - $4) "
    "AND NOT EXISTS (SELECT 1 FROM hosts h WHERE h.host_id = t.host_id "
    "AND h.seen_at >= clock.now - $4)"
)


def _jsonb_text(document: Any) -> str:
    """A document as its JSONB column is written. JSONB refuses NUL, which JSON allows: in
    keys and values alike it is written as the text ``\\x00``, as audit rows keep it
    (``toolmesh.audit.storable``): the document is kept, its NUL visible, as SQLite keeps it
    whole, instead of refused."""
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    if "\\u0000" in text:  # (JSON's escape of NUL; rare: only then is the document walked)
        text = json.dumps(_without_nul(document), ensure_ascii=False, separators=(",", ":"))
    return text


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(item) for item in value]
    return value


def _text(value: str) -> str:
    """``value`` as a TEXT column keeps it: NUL written as ``\\x00`` (as in ``_jsonb_text``)."""
    return value.replace("\x00", "\\x00") if "\x00" in value else value


def display_url(url: str) -> str:
    """``url`` with its password hidden, for logs and banners."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection went away (worth reconnecting and retrying)."""
    if isinstance(
        exc,
        asyncpg.PostgresConnectionError
        | asyncpg.exceptions.OperatorInterventionError
        | OSError
        | TimeoutError,
    ):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc)


def _passing(exc: BaseException) -> bool:
    """Whether an audit insert that failed with ``exc`` may succeed later as it is: the server
    is unreachable, out of resources (a full disk, too many connections) or read-only (a
    standby during a failover). Its rows wait for the next flush instead of being given up."""
    return _lost(exc) or isinstance(
        exc, asyncpg.InsufficientResourcesError | asyncpg.ReadOnlySQLTransactionError
    )


class PostgresStore(Store):
    """Audit, sessions and state in one PostgreSQL database, shared by every host."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        min_connections: int = 1,
        max_connections: int = 10,
        reconnect_timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        if urlsplit(url).scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"a PostgreSQL store wants a postgresql:// URL, not {url!r}")
        self.url = url
        self.min_connections = min_connections
        self.max_connections = max_connections
        self.reconnect_timeout = reconnect_timeout
        self.connect_timeout = connect_timeout
        self._pool: asyncpg.Pool | None = None
        self._pending: list[tuple[Any, ...]] = []  # audit rows waiting for the next flush
        self._flushes: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False
        self._listener: asyncio.Task[None] | None = None
        self._open_lock: asyncio.Lock | None = None
        self.clock: Callable[[], float] | None = None
        """The time mailbox claims and host heartbeats are stamped and aged with (seconds since
        the epoch); None: the database server's clock. Tests set it to move time without
        waiting."""

    def __repr__(self) -> str:
        return f"PostgresStore({display_url(self.url)!r})"

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._pool is not None:
                return
            try:
                pool = await asyncpg.create_pool(
                    self.url,
                    min_size=self.min_connections,
                    max_size=self.max_connections,
                    timeout=self.connect_timeout,
                    reset=_nothing_to_reset,
                )
            except Exception as exc:
                raise ConfigError(
                    f"cannot use {display_url(self.url)} as a toolmesh store: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            try:
                async with pool.acquire() as connection:
                    await _migrate(connection)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            listening: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._listener = asyncio.ensure_future(self._listen(listening))
            try:
                await listening
            except BaseException as exc:
                # The signal connection was refused (too many connections, say): without it
                # this host would never hear the others, and waiting would never end.
                self._listener.cancel()
                await asyncio.gather(self._listener, return_exceptions=True)
                self._listener, self._pool = None, None
                await pool.close()
                if not isinstance(exc, Exception):
                    raise
                raise ConfigError(
                    f"cannot use {display_url(self.url)} as a toolmesh store: the connection "
                    f"that listens for signals failed: {type(exc).__name__}: {exc}"
                ) from exc

    async def close(self) -> None:
        """Insert the rows still waiting, then close. When they cannot be inserted (the server
        away longer than ``reconnect_timeout``), nobody is left to flush them: each is logged
        in full and counted in ``audit_rows_lost``, and the store closes all the same."""
        if self._pool is None:
            return
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        try:
            await self.flush()
        except Exception as exc:
            rows, self._pending = self._pending, []
            self._lose([(row, exc) for row in rows])
            logger.error(
                "PostgreSQL store closed with %d audit rows not stored (each logged): %s",
                len(rows),
                exc,
            )
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        pool, self._pool = self._pool, None
        try:
            await asyncio.wait_for(pool.close(), POOL_CLOSE_TIMEOUT)
        except Exception:  # a server that never answers the goodbye (or the timeout)
            pool.terminate()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise ConfigError(f"{self!r} is not open: await store.open() first")
        return self._pool

    async def run(self, operation: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``operation`` on a pooled connection, reconnecting and retrying it while the
        server is unreachable (up to ``reconnect_timeout`` seconds). Operations must be safe to
        run twice: the first try may have committed before its connection was lost."""
        deadline: float | None = None
        delay = 0.05
        while True:
            try:
                async with self.pool.acquire() as connection:
                    return await operation(connection)
            except Exception as exc:
                if not _lost(exc):
                    raise
                now = time.monotonic()
                deadline = deadline or now + self.reconnect_timeout
                if now >= deadline:
                    raise
                logger.warning("PostgreSQL connection lost (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- audit -----------------------------------------------------------------------------------

    async def append_audit(self, entry: AuditEntry, *, durable: bool = True) -> None:
        self._pending.append(storable(_audit_row(entry)))  # PostgreSQL text holds no NUL
        if durable:
            await self._flush(last_reported=True)  # this row is the last of the batch
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            task = asyncio.ensure_future(self._flush_soon())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(0)  # entries finishing in this loop iteration share the insert
        self._flush_scheduled = False
        try:
            await self.flush()
        except Exception as exc:
            logger.error("audit rows wait for the next flush: %s", exc)

    async def flush(self) -> None:
        """Insert the audit rows appended so far (committed when this returns). A row the
        server refuses is logged in full and counted in ``audit_rows_lost``; while the server
        is unreachable the rows wait for the next flush and the error is raised."""
        await self._flush(last_reported=False)

    async def _flush(self, *, last_reported: bool) -> None:
        """Insert the pending rows in one statement. When the failure may pass (``_passing``)
        or the insert is cancelled, they wait for the next flush. Any other failure is a row the
        server refuses (a constraint, an altered table, a revoked grant): the rows are then
        inserted one by one, so the good ones are stored and the refused ones block nothing.
        Each refused row is logged and counted; ``last_reported``: but the newest, whose
        caller (a durable append) reports it, so its error is raised to it instead."""
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        try:
            await self._insert(rows)
            return
        except Exception as exc:
            if _passing(exc):
                self._wait(rows, exc)
                raise
            error = exc
        except BaseException as exc:
            self._wait(rows, exc)
            raise
        refused: list[tuple[tuple[Any, ...], BaseException]] = []
        if len(rows) == 1:
            refused.append((rows[0], error))
        else:
            done = 0
            try:
                for row in rows:
                    try:
                        await self._insert([row])
                    except Exception as exc:
                        if _passing(exc):
                            raise
                        refused.append((row, exc))
                    done += 1
            except BaseException as exc:
                self._lose(refused)
                self._wait(rows[done:], exc)
                raise
        if last_reported and refused and refused[-1][0] is rows[-1]:
            _, own = refused.pop()
            self._lose(refused)
            raise own
        self._lose(refused)

    async def _insert(self, rows: list[tuple[Any, ...]]) -> None:
        columns = [list(column) for column in zip(*rows, strict=True)]
        await self.run(lambda db: db.execute(_INSERT_AUDIT, *columns))

    def _wait(self, rows: list[tuple[Any, ...]], exc: BaseException) -> None:
        """Keep ``rows`` for the next flush, ahead of the newer ones; beyond
        ``MAX_WAITING_ROWS`` the oldest are given up (logged in full and counted)."""
        self._pending[:0] = rows
        excess = len(self._pending) - MAX_WAITING_ROWS
        if excess > 0:
            given_up = self._pending[:excess]
            del self._pending[:excess]
            self._lose([(row, exc) for row in given_up])

    def _lose(self, rows: list[tuple[tuple[Any, ...], BaseException]]) -> None:
        for row, exc in rows:
            log_lost_entry(AuditEntry(**dict(zip(_READ_COLUMNS, row[1:], strict=True))), exc)
        self.audit_rows_lost += len(rows)

    async def recent_audit(self, limit: int = 20) -> list[AuditEntry]:
        await self.flush()
        query = f"SELECT {', '.join(_READ_COLUMNS)} FROM audit ORDER BY id DESC LIMIT $1"  # noqa: S608
        rows = await self.run(lambda db: db.fetch(query, limit))
        return [AuditEntry(**dict(row)) for row in rows]

    # -- sessions and state ----------------------------------------------------------------------

    async def save_session(self, record: SessionRecord) -> None:
        await self.run(
            lambda db: db.execute(
                "INSERT INTO sessions (session_id, agent_id, capabilities, created_at, metadata) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_id) DO UPDATE SET "
                "agent_id = excluded.agent_id, capabilities = excluded.capabilities, "
                "metadata = excluded.metadata",
                record.session_id,
                record.agent_id,
                _jsonb_text(record.capabilities),
                record.created_at,
                _jsonb_text(record.metadata),
            )
        )

    async def load_session(self, session_id: str) -> SessionRecord | None:
        row = await self.run(
            lambda db: db.fetchrow(
                "SELECT agent_id, capabilities, created_at, metadata FROM sessions "
                "WHERE session_id = $1",
                session_id,
            )
        )
        if row is None:
            return None
        return SessionRecord(
            session_id,
            row["agent_id"],
            json.loads(row["capabilities"]),
            row["created_at"],
            json.loads(row["metadata"]),
        )

    async def load_state(self, session_id: str) -> StateRecord | None:
        row = await self.run(
            lambda db: db.fetchrow(
                "SELECT document, version FROM state WHERE session_id = $1", session_id
            )
        )
        return None if row is None else StateRecord(json.loads(row["document"]), row["version"])

    async def save_state(
        self, session_id: str, document: dict[str, Any], *, expected_version: int
    ) -> bool:
        text = _jsonb_text(document)
        token = uuid.uuid4().hex
        attempts = 0

        async def write(db: Connection) -> bool:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and await _landed(db, token):  # before its connection was lost
                return True
            if expected_version == 0:
                status = await db.execute(
                    _INSERT_STATE, session_id, text, token, WRITE_TOKEN_SECONDS
                )
            else:
                status = await db.execute(
                    _UPDATE_STATE, session_id, text, token, WRITE_TOKEN_SECONDS, expected_version
                )
            return bool(status == "INSERT 0 1")

        return await self.run(write)

    # -- A2A tasks -------------------------------------------------------------------------------

    async def save_a2a_task(self, record: A2ATaskRecord) -> bool:
        return await self.save_a2a_task_on(record, "")

    async def save_a2a_task_on(self, record: A2ATaskRecord, host_id: str) -> bool:
        text = _jsonb_text(record.document)
        task_id, context_id = _text(record.task_id), _text(record.context_id)
        # One statement: the row is locked and its state checked as it stands, so of hosts
        # ending a task together only the first one's end is kept. A retry after a lost reply
        # finds its own document there, and counts as written. The writer is recorded with the
        # time of its write (see CLUSTER_MIGRATIONS 4); "" records none.
        status = await self.run(
            lambda db: db.execute(
                "INSERT INTO a2a_tasks (task_id, context_id, state, updated_at, document, "
                "host_id, host_at) VALUES ($1, $2, $3, $4, $5, NULLIF($7, ''), $4) "
                "ON CONFLICT (task_id) DO UPDATE SET "
                "context_id = excluded.context_id, state = excluded.state, "
                "updated_at = excluded.updated_at, document = excluded.document, "
                "host_id = excluded.host_id, host_at = excluded.host_at "
                "WHERE a2a_tasks.state <> ALL($6::text[]) "
                "OR a2a_tasks.document = excluded.document",
                task_id,
                context_id,
                record.state,
                record.updated_at,
                text,
                list(A2A_FINAL_STATES),
                host_id,
            )
        )
        return bool(status == "INSERT 0 1")

    async def replace_a2a_task_on(
        self, record: A2ATaskRecord, host_id: str, expected: A2ATaskRecord
    ) -> bool:
        text, was = _jsonb_text(record.document), _jsonb_text(expected.document)
        # One statement: the row is locked and its document compared as it stands (JSONB
        # equality, whatever the key order), so of writers resuming a task together only the
        # first one's write is made; the others find another document there. A retry after a
        # lost reply finds its own document, and counts as written.
        status = await self.run(
            lambda db: db.execute(
                "UPDATE a2a_tasks SET context_id = $2, state = $3, updated_at = $4, "
                "document = $5::jsonb, host_id = NULLIF($6, ''), host_at = $4 "
                "WHERE task_id = $1 AND (document = $7::jsonb AND state <> ALL($8::text[]) "
                "OR document = $5::jsonb)",
                _text(record.task_id),
                _text(record.context_id),
                record.state,
                record.updated_at,
                text,
                host_id,
                was,
                list(A2A_FINAL_STATES),
            )
        )
        return bool(status == "UPDATE 1")

    async def orphaned_a2a_tasks(self, task_ids: Collection[str], host_id: str) -> set[str]:
        """Of ``task_ids``, those last written by a host other than ``host_id`` that has not
        been seen for ``HOST_TIMEOUT`` seconds (or that closed); none while ``host_id`` has not
        been seen steadily for that long itself (it has just started, or the database was away:
        the others' heartbeats are late too). Judged in one statement, on one clock."""
        if not task_ids or not host_id:
            return set()
        now = None if self.clock is None else self.clock()
        rows = await self.run(
            lambda db: db.fetch(
                _ORPHANED, host_id, now, [_text(i) for i in task_ids], HOST_TIMEOUT, HOST_GAP
            )
        )
        return {str(row["task_id"]) for row in rows}

    async def load_a2a_task(self, task_id: str) -> A2ATaskRecord | None:
        row = await self.run(
            lambda db: db.fetchrow(
                "SELECT task_id, context_id, state, updated_at, document FROM a2a_tasks "
                "WHERE task_id = $1",
                _text(task_id),
            )
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
        context_id = _text(context_id)
        where = (  # '' and 0 match every context, state and time, as for SQLite
            "($1 = '' OR context_id = $1) AND ($2 = '' OR state = $2) "
            "AND ($3 = 0 OR updated_at > $3)"
        )
        total = await self.run(
            lambda db: db.fetchval(
                f"SELECT COUNT(*) FROM a2a_tasks WHERE {where}",  # noqa: S608
                context_id,
                state,
                updated_after,
            )
        )
        rows = await self.run(
            lambda db: db.fetch(
                "SELECT task_id, context_id, state, updated_at, document FROM a2a_tasks "  # noqa: S608
                f"WHERE {where} ORDER BY updated_at DESC LIMIT $4 OFFSET $5",
                context_id,
                state,
                updated_after,
                limit,
                offset,
            )
        )
        return [_task_record(row) for row in rows], int(total)

    # -- signals ---------------------------------------------------------------------------------

    async def publish(self, topic: str, payload: str) -> None:
        _check_topic(topic)
        _check_payload(payload)
        message = f"{topic} {payload}"
        await self.run(lambda db: db.execute("SELECT pg_notify($1, $2)", CHANNEL, message))

    async def _listen(self, listening: asyncio.Future[None]) -> None:
        """Hold one connection LISTENing on the channel; reconnect whenever it is lost.
        ``listening`` is settled by the first attempt: done once listening, or failed with
        why it could not connect (``open`` then fails instead of waiting forever)."""
        connected_before = False
        delay = 0.05
        while True:
            lost = asyncio.Event()
            try:
                connection = await asyncpg.connect(self.url, timeout=self.connect_timeout)
            except Exception as exc:
                if not listening.done():
                    listening.set_exception(exc)
                    return
                if not _lost(exc):
                    logger.error("cannot listen for signals: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            try:
                connection.add_termination_listener(_setter(lost))
                await connection.add_listener(CHANNEL, self._notified)
                delay = 0.05
                if not listening.done():
                    listening.set_result(None)
                if connected_before:
                    self.resync()
                connected_before = True
                await _until_lost(connection, lost)
            except Exception as exc:
                if not listening.done():
                    listening.set_exception(exc)
                    return
                if not _lost(exc):
                    logger.error("listening for signals failed: %s", exc)
            finally:
                if not connection.is_closed():
                    await asyncio.shield(connection.close(timeout=1))
            logger.warning("the PostgreSQL signal connection was lost; reconnecting")

    def _notified(self, _connection: Any, _pid: int, _channel: str, message: object) -> None:
        topic, _, payload = str(message).partition(" ")
        self.dispatch(topic, payload)

    # -- HTTP sessions shared by several hosts (toolmesh.transports.cluster) -------------------

    async def post_messages(
        self, session_ids: Sequence[str], messages: Sequence[bytes], count: Collection[str] = ()
    ) -> dict[str, int]:
        """Queue messages for the host holding each session's stream and signal it (one
        statement: rows and signals commit together). The post carries an id: a retry after
        a lost reply finds it recorded and adds nothing (nor signals again). Returns how many
        bytes then wait in the mailbox for each session of ``count`` (a second statement,
        which reads every row waiting for them: asked only when the answer matters)."""
        now = time.time()
        post_id = uuid.uuid4().hex

        async def post(db: Connection) -> dict[str, int]:
            await db.execute(
                "WITH post AS (INSERT INTO mailbox_posts (posted_at, post_id) VALUES ($3, $5) "
                "ON CONFLICT DO NOTHING RETURNING post_id), "
                "posted AS (INSERT INTO mailbox (session_id, message, posted_at) "
                "SELECT s, m, $3 FROM post, "
                "unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS t(s, m, n) ORDER BY n "
                "RETURNING session_id) "
                "SELECT pg_notify($4, 'mail ' || session_id) "
                "FROM (SELECT DISTINCT session_id FROM posted) AS d",
                list(session_ids),
                list(messages),
                now,
                CHANNEL,
                post_id,
            )
            return await _waiting(db, count) if count else {}

        return await self.run(post)

    async def waiting_bytes(self, session_id: str) -> int:
        """How many bytes of messages wait in the mailbox for ``session_id``."""
        waiting = await self.run(lambda db: _waiting(db, [session_id]))
        return waiting.get(session_id, 0)

    async def take_messages(self, session_id: str, claim: str = "") -> list[bytes]:
        """Remove and return the messages waiting for ``session_id``, oldest first (see
        ``take_mail``)."""
        messages, _claimed_for = await self.take_mail(session_id, claim)
        return messages

    async def take_mail(self, session_id: str, claim: str = "") -> tuple[list[bytes], float | None]:
        """Remove and return the messages waiting for ``session_id``, oldest first, and in how
        many seconds the first claim another taker holds on the session's rows expires (None:
        no such claim): the caller takes again then, else rows claimed by a host that died
        would wait for the session's next message.

        Two steps, each safe to retry after a lost reply: the rows are claimed with the token
        ``claim`` (rows another taker claimed are left alone for ``CLAIM_TIMEOUT`` seconds; the
        rows this token claimed before are taken again), then the rows still claimed by this
        token are deleted, and only those are returned (another taker may have claimed them
        once the claim expired: they are its own). When this raises before the delete landed,
        the messages are still in the store: the next take with the same ``claim`` returns
        them (or, once the claim expired, another taker does)."""
        claim = claim or uuid.uuid4().hex
        now = None if self.clock is None else self.clock()
        found = await self.run(
            lambda db: db.fetch(_CLAIM_ROWS, session_id, claim, now, CLAIM_TIMEOUT)
        )
        rows = [row for row in found if row["id"] is not None]
        claimed_for = next(
            (max(0.0, row["expires_in"]) + CLAIM_MARGIN for row in found if row["id"] is None),
            None,
        )
        if not rows:
            return [], claimed_for
        ids = [row["id"] for row in rows]
        taken_at, take_id = time.time(), uuid.uuid4().hex

        async def delete(db: Connection) -> set[int]:
            deleted = await db.fetchval(_DELETE_CLAIMED, ids, claim, taken_at, take_id)
            if deleted is None:
                # Conflicted with an earlier try that committed while this one waited for its
                # locks: its record was not in this statement's snapshot, it is in the next.
                deleted = await db.fetchval(
                    "SELECT ids FROM mailbox_takes WHERE taken_at = $1 AND take_id = $2",
                    taken_at,
                    take_id,
                )
            return set(deleted or ())

        deleted = await self.run(delete)
        messages = [
            bytes(row["message"])
            for row in sorted(rows, key=lambda r: r["id"])
            if row["id"] in deleted
        ]
        return messages, claimed_for

    async def drop_messages(self, older_than: float) -> int:
        """Forget messages nobody collected for ``older_than`` seconds."""
        before = time.time() - older_than

        async def drop(db: Connection) -> str:
            await db.execute("DELETE FROM mailbox_posts WHERE posted_at < $1", before)
            await db.execute("DELETE FROM mailbox_takes WHERE taken_at < $1", before)
            return str(await db.execute("DELETE FROM mailbox WHERE posted_at < $1", before))

        status = await self.run(drop)
        return int(status.split()[-1])

    # -- hosts alive ------------------------------------------------------------------------------

    async def host_alive(self, host_id: str) -> None:
        """Record that ``host_id`` is alive now (by the ``clock``): its heartbeat."""
        now = None if self.clock is None else self.clock()

        async def beat(db: Connection) -> None:
            await db.execute(_HOST_ALIVE, host_id, now, HOST_GAP)
            await db.execute(_FORGET_HOSTS, host_id, now, HOST_TIMEOUT)

        await self.run(beat)

    async def host_gone(self, host_id: str) -> None:
        """Forget ``host_id`` (it stopped cleanly): its tasks left unfinished are orphans."""
        await self.run(lambda db: db.execute("DELETE FROM hosts WHERE host_id = $1", host_id))

    async def approval_asked(self, approval_id: str, session_id: str, host_id: str) -> None:
        await self.run(
            lambda db: db.execute(
                "INSERT INTO approvals (approval_id, session_id, host_id, asked_at) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (approval_id) DO NOTHING",
                approval_id,
                session_id,
                host_id,
                time.time(),
            )
        )

    async def approval_host(self, approval_id: str, session_id: str) -> str | None:
        """The host waiting for an approval of ``session_id``, or None when none waits."""
        value = await self.run(
            lambda db: db.fetchval(
                "SELECT host_id FROM approvals WHERE approval_id = $1 AND session_id = $2",
                approval_id,
                session_id,
            )
        )
        return None if value is None else str(value)

    async def approval_done(self, approval_id: str) -> None:
        await self.run(
            lambda db: db.execute("DELETE FROM approvals WHERE approval_id = $1", approval_id)
        )


async def _nothing_to_reset(_connection: Connection) -> None:
    """Pooled connections are returned as they were taken: the store leaves no session state
    (no SET, LISTEN, cursor or session lock), so asyncpg's reset query, a round trip on every
    release, is skipped."""


def _setter(event: asyncio.Event) -> Callable[[Any], None]:
    return lambda _connection: event.set()


async def _until_lost(connection: asyncpg.Connection, lost: asyncio.Event) -> None:
    """Return once the connection is gone: its termination listener fires, or a periodic
    check fails (a half-open socket never tells)."""
    while not lost.is_set():
        try:
            await asyncio.wait_for(lost.wait(), timeout=5.0)
        except TimeoutError:
            try:
                await connection.execute("SELECT 1", timeout=5.0)
            except Exception:
                return


def _task_record(row: Any) -> A2ATaskRecord:
    return A2ATaskRecord(
        row["task_id"],
        row["context_id"],
        row["state"],
        row["updated_at"],
        json.loads(row["document"]),
    )


def _audit_row(entry: AuditEntry) -> tuple[Any, ...]:
    return (
        uuid.uuid4().hex,
        entry.ts,
        entry.session_id,
        entry.agent_id,
        entry.req_id,
        entry.correlation_id,
        entry.tool_name,
        entry.source,
        entry.transport,
        entry.success,
        entry.error_code,
        entry.duration_ms,
        entry.input_bytes,
        entry.output_bytes,
        entry.args_digest,
        entry.decision,
        entry.host_id,
    )


async def _waiting(db: Connection, session_ids: Collection[str]) -> dict[str, int]:
    """How many bytes of messages wait in the mailbox for each of ``session_ids``."""
    rows = await db.fetch(
        "SELECT session_id, sum(octet_length(message)) AS size FROM mailbox "
        "WHERE session_id = ANY($1::text[]) GROUP BY session_id",
        list(session_ids),
    )
    return dict.fromkeys(session_ids, 0) | {
        str(row["session_id"]): int(row["size"]) for row in rows
    }


async def _landed(db: Connection, token: str) -> bool:
    """Whether the state write carrying ``token`` committed (its reply may have been lost)."""
    return bool(
        await db.fetchval("SELECT EXISTS (SELECT 1 FROM state_writes WHERE token = $1)", token)
    )


async def _migrate(connection: Connection) -> None:
    """Apply every migration not applied yet, in order, one host at a time."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            "track TEXT NOT NULL, version INTEGER NOT NULL, applied_at DOUBLE PRECISION NOT NULL, "
            "PRIMARY KEY (track, version))"
        )
        rows = await connection.fetch("SELECT track, version FROM schema_version")
        applied = {(row["track"], row["version"]) for row in rows}
        for track, migrations in (("store", MIGRATIONS), ("cluster", CLUSTER_MIGRATIONS)):
            for version, script in migrations:
                if (track, version) in applied:
                    continue
                await connection.execute(script)
                await connection.execute(
                    "INSERT INTO schema_version (track, version, applied_at) VALUES ($1, $2, $3)",
                    track,
                    version,
                    time.time(),
                )
