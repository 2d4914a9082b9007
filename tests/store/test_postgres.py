"""What only the PostgreSQL store does: URLs, migrations by concurrent hosts, clear failures."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import REPO, toolmesh_command
from tests.fixtures.postgres import PostgresCluster
from toolmesh import ConfigError
from toolmesh.audit import AuditEntry
from toolmesh.manifest import load_manifest
from toolmesh.state import StateManager
from toolmesh.store import A2ATaskRecord, SessionRecord, SqliteStore, Store, open_store, postgres
from toolmesh.store.postgres import PostgresStore, display_url

pytestmark = [pytest.mark.network_server]

T = TypeVar("T")


class LosingReplies:
    """Wraps ``store.run``: while ``active``, the first try of each operation runs its SQL
    (committed) and then its reply is lost, as when the connection drops at that moment (an
    error ``_lost`` accepts, so ``run`` retries). ``always``: every try's reply is lost.
    ``meanwhile``: what other hosts do between the lost reply and the retry."""

    def __init__(
        self,
        store: PostgresStore,
        *,
        always: bool = False,
        meanwhile: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.run = store.run
        self.active = True
        self.always = always
        self.meanwhile = meanwhile
        self.lost = 0
        store.run = self  # type: ignore[method-assign]

    async def __call__(self, operation: Callable[[Any], Awaitable[T]]) -> T:
        tries = 0

        async def once(db: Any) -> T:
            nonlocal tries
            tries += 1
            result = await operation(db)
            if self.active and (tries == 1 or self.always):
                self.lost += 1
                if self.meanwhile is not None:
                    await self.meanwhile()
                raise ConnectionResetError("the reply was lost")
            return result

        return await self.run(once)


def test_urls_pick_the_postgres_store() -> None:
    for url in ("postgresql://u@127.0.0.1:5/db", "postgres://u@127.0.0.1:5/db"):
        store = open_store(url)
        assert isinstance(store, PostgresStore) and store.shared
    assert display_url("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert "secret" not in repr(open_store("postgresql://u:secret@h:5/db"))


async def test_an_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    store = PostgresStore(f"postgresql://u:pw@127.0.0.1:{port}/db", connect_timeout=2)
    with pytest.raises(ConfigError, match=r"cannot use postgresql://u:\*\*\*@127.0.0.1"):
        await store.open()


async def test_hosts_starting_together_migrate_once(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    stores = [PostgresStore(postgres_url) for _ in range(4)]
    await asyncio.gather(*(store.open() for store in stores))
    database = postgres_url.rsplit("/", 1)[1]
    applied = postgres_cluster.sql(
        "SELECT track || ':' || version FROM schema_version ORDER BY track, version", database
    )
    assert applied.split() == [
        "cluster:1",
        "cluster:2",
        "cluster:3",
        "cluster:4",
        "cluster:5",
        "store:1",
        "store:2",
    ]
    for store in stores:
        await store.close()


async def test_the_manifest_names_the_store(tmp_path: Path, postgres_url: str) -> None:
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(f'[toolkit]\nstore = "{postgres_url}"\n')
    assert isinstance(load_manifest(manifest).toolkit().store, PostgresStore)
    manifest.write_text('[toolkit]\nstore = "sqlite:///data/audit.db"\n')
    store = load_manifest(manifest).toolkit().store
    assert isinstance(store, SqliteStore) and store.path == str(tmp_path / "data/audit.db")
    manifest.write_text('[toolkit]\nstore = "x.db"\naudit = "y.db"\n')
    with pytest.raises(ConfigError, match="either store or audit"):
        load_manifest(manifest)
    manifest.write_text('[toolkit]\nstore = "x.db"\n')
    with pytest.raises(ConfigError, match=r"toolkit\.store: must be a URL"):
        load_manifest(manifest)


async def test_the_audit_command_reads_a_shared_store(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    await store.append_audit(AuditEntry(tool_name="shared", success=True, host_id="h1"))
    await store.close()
    shown = await asyncio.to_thread(
        subprocess.run,
        toolmesh_command("audit", "--db", postgres_url, "--json"),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    (entry,) = [json.loads(line) for line in shown.stdout.splitlines()]
    assert (entry["tool_name"], entry["host_id"]) == ("shared", "h1")


async def test_a_refused_signal_connection_fails_open_instead_of_hanging(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """The pool connected, then the connection that listens for signals was refused (the role's
    or the server's connection limit): open() waited for it forever, logging once a second."""
    database = postgres_url.rsplit("/", 1)[1]
    role = f"one_conn_{database}"
    postgres_cluster.sql(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
    postgres_cluster.sql(f'ALTER DATABASE "{database}" OWNER TO "{role}"')
    url = postgres_cluster.url(database).replace("toolmesh@", f"{role}@", 1)
    store = PostgresStore(url, min_connections=1, max_connections=1)
    with pytest.raises(ConfigError, match=r"listens for signals.*too many connections"):
        await asyncio.wait_for(store.open(), 30)  # (the old code never returned)
    with pytest.raises(ConfigError, match="not open"):
        store.pool  # noqa: B018 - nothing was left open
    postgres_cluster.sql(f'ALTER ROLE "{role}" CONNECTION LIMIT 2')
    await store.open()  # the same store opens once the limit allows it
    await store.append_audit(AuditEntry(tool_name="t", success=True))
    assert [e.tool_name for e in await store.recent_audit(5)] == ["t"]
    await store.close()


async def test_a_post_retried_after_a_lost_reply_is_stored_once(postgres_url: str) -> None:
    """The retried insert of a post whose reply was lost queued every message twice."""
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        losing = LosingReplies(store)
        await store.post_messages(["s1", "s1", "s2"], [b"a", b"b", b"c"])
        assert losing.lost == 1
        losing.active = False
        assert await store.take_messages("s1") == [b"a", b"b"]
        assert await store.take_messages("s2") == [b"c"]
    finally:
        await store.close()


async def test_a_post_retried_after_its_messages_were_taken_adds_nothing(
    postgres_url: str,
) -> None:
    """The stream's host may take the messages before the poster retries: the retry must still
    find that its post landed (the rows it would conflict with are gone by then)."""
    poster, taker = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await poster.open()
    await taker.open()
    try:
        taken: list[bytes] = []

        async def take() -> None:
            taken.extend(await taker.take_messages("s1"))

        LosingReplies(poster, meanwhile=take)
        await poster.post_messages(["s1", "s1"], [b"a", b"b"])
        assert taken == [b"a", b"b"]
        assert await taker.take_messages("s1") == []  # the retry added nothing
    finally:
        await poster.close()
        await taker.close()


async def test_pruning_forgets_old_posts_too(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        await store.post_messages(["s1", "s2"], [b"a", b"b"])
        await store.post_messages(["s1"], [b"c"])
        assert await store.drop_messages(older_than=-60) == 3  # (everything is older than that)
        database = postgres_url.rsplit("/", 1)[1]
        assert postgres_cluster.sql("SELECT count(*) FROM mailbox_posts", database) == "0"
    finally:
        await store.close()


async def test_a_take_retried_after_a_lost_reply_loses_nothing(postgres_url: str) -> None:
    """The messages a take had deleted before its reply was lost were gone: the retry found
    none (and nobody delivered them)."""
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        await store.post_messages(["s1", "s1", "s2"], [b"a", b"b", b"c"])
        losing = LosingReplies(store)  # (both the claim's reply and the delete's are lost)
        assert await store.take_messages("s1") == [b"a", b"b"]
        assert losing.lost >= 1
        await store.post_messages(["s1"], [b"d"])
        assert await store.take_messages("s1") == [b"d"]  # each message once
        losing.active = False
        assert await store.take_messages("s1") == []
        assert await store.take_messages("s2") == [b"c"]
    finally:
        await store.close()


async def test_a_failed_take_leaves_its_claim_for_the_next_take(postgres_url: str) -> None:
    """A take whose reply stays lost (the server gone for longer than reconnect_timeout) may
    have claimed rows: no other taker gets them (no duplicate), its next take does."""
    store = PostgresStore(postgres_url, reconnect_timeout=0.0)
    await store.open()
    try:
        await store.post_messages(["s", "s"], [b"a", b"b"])
        losing = LosingReplies(store, always=True)
        with pytest.raises(ConnectionResetError):
            await store.take_messages("s", claim="host1")
        losing.active = False
        assert await store.take_messages("s", claim="host2") == []
        await store.post_messages(["s"], [b"c"])
        assert await store.take_messages("s", claim="host1") == [b"a", b"b", b"c"]
        assert await store.take_messages("s", claim="host2") == []
    finally:
        await store.close()


async def test_takers_racing_for_a_session_get_each_message_once(postgres_url: str) -> None:
    store = PostgresStore(postgres_url, min_connections=4)
    await store.open()
    try:
        sent = [f"m{i}".encode() for i in range(200)]
        await store.post_messages(["s"] * len(sent), sent)
        taken = await asyncio.gather(
            *(store.take_messages("s", claim=f"host{i}") for i in range(4))
        )
        assert sorted(m for batch in taken for m in batch) == sorted(sent)
        assert all(batch == sorted(batch, key=sent.index) for batch in taken)  # oldest first
    finally:
        await store.close()


async def test_a_tasks_end_retried_after_a_lost_reply_is_still_its_own(postgres_url: str) -> None:
    """The retry of an end whose reply was lost finds that end stored (its own write): it is
    written, not refused as a task already ended; another host's end meanwhile is refused."""
    runner, canceler = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await runner.open()
    await canceler.open()
    try:
        doc = {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}
        canceled = {**doc, "status": {"state": "TASK_STATE_CANCELED"}}
        refused: list[bool] = []

        async def cancel() -> None:
            refused.append(
                not await canceler.save_a2a_task(A2ATaskRecord("t", "c", "canceled", 2.0, canceled))
            )

        losing = LosingReplies(runner, meanwhile=cancel)
        assert await runner.save_a2a_task(A2ATaskRecord("t", "c", "completed", 1.0, doc))
        assert losing.lost == 1 and refused == [True]
        kept = await canceler.load_a2a_task("t")
        assert kept is not None and (kept.state, kept.document) == ("completed", doc)
    finally:
        await runner.close()
        await canceler.close()


def once(action: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[object]]:
    """``action`` the first time it is awaited, nothing after."""
    done = False

    async def first_time() -> object:
        nonlocal done
        if done:
            return None
        done = True
        return await action()

    return first_time


APPEND_A = [{"op": "add", "path": "/context/log/-", "value": "A"}]
APPEND_B = [{"op": "add", "path": "/context/log/-", "value": "B"}]


async def test_a_state_update_retried_after_another_host_wrote_is_applied_once(
    postgres_url: str,
) -> None:
    """The retry of an update whose reply was lost knew its own write only while it was the
    latest: once another host had written after it, the retry took its write for lost, and the
    state manager applied the update again ("A" twice)."""
    mine, theirs = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await mine.open()
    await theirs.open()
    try:
        here, there = StateManager(mine), StateManager(theirs)
        await here.apply("s", [{"op": "add", "path": "/context/log", "value": []}])
        losing = LosingReplies(mine, meanwhile=once(lambda: there.apply("s", APPEND_B)))
        record = await here.apply("s", APPEND_A)
        assert losing.lost >= 1
        losing.active = False
        stored = await theirs.load_state("s")
        assert stored is not None
        assert (stored.document, stored.version) == ({"context": {"log": ["A", "B"]}}, 3)
        assert record.version == 2  # its own write, which the retry found
    finally:
        await mine.close()
        await theirs.close()


async def test_a_first_state_write_retried_after_another_host_wrote_is_applied_once(
    postgres_url: str,
) -> None:
    """The same for the write that creates the session's state (an insert)."""
    mine, theirs = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await mine.open()
    await theirs.open()
    try:
        here, there = StateManager(mine), StateManager(theirs)
        await here.current("s")  # read (nothing stored yet): the write starts from it
        losing = LosingReplies(mine, meanwhile=once(lambda: there.apply("s", APPEND_B)))
        await here.apply("s", [{"op": "add", "path": "/context/log", "value": ["A"]}])
        losing.active = False
        stored = await theirs.load_state("s")
        assert stored is not None  # (before: A's update applied again, over B's: ["A"], 3)
        assert (stored.document, stored.version) == ({"context": {"log": ["A", "B"]}}, 2)
        assert losing.lost == 1
    finally:
        await mine.close()
        await theirs.close()


async def test_state_write_tokens_are_forgotten_once_old(
    postgres_url: str, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    database = postgres_url.rsplit("/", 1)[1]
    try:
        for version in range(20):
            assert await store.save_state("s", {"n": version}, expected_version=version)
        assert postgres_cluster.sql("SELECT count(*) FROM state_writes", database) == "20"
        monkeypatch.setattr("toolmesh.store.postgres.WRITE_TOKEN_SECONDS", -60.0)  # all old
        assert await store.save_state("s", {"n": 20}, expected_version=20)  # forgets 8
        assert await store.save_state("s", {"n": 21}, expected_version=21)  # and 8 more
        assert postgres_cluster.sql("SELECT count(*) FROM state_writes", database) == "6"
    finally:
        await store.close()


NUL_TASK = {
    "id": "t\x00",
    "contextId": "c\x00",
    "status": {"state": "TASK_STATE_COMPLETED"},
    "history": [{"parts": [{"text": "a\x00b"}], "metadata": {"k\x00": ["\x00"]}}],
}


def as_kept(value: Any, store: Store) -> Any:
    """``value`` as ``store`` gives it back: PostgreSQL writes each NUL as the text \\x00 (as
    audit rows keep it), SQLite keeps it."""
    if not isinstance(store, PostgresStore):
        return value
    return json.loads(json.dumps(value).replace("\\u0000", "\\\\x00"))


async def test_documents_with_nul_are_kept_as_by_sqlite(postgres_url: str, tmp_path: Path) -> None:
    """JSONB refuses U+0000, which JSON allows: an A2A message holding it failed with -32603,
    and a model's answer holding it never had its task's end recorded (written again every
    5 s, forever). Both stores now keep such tasks, states and sessions."""
    for store in (PostgresStore(postgres_url), SqliteStore(str(tmp_path / "s.db"))):
        await store.open()
        try:
            await keeps_nul(store)
        finally:
            await store.close()


async def keeps_nul(store: Store) -> None:
    record = A2ATaskRecord("t\x00", "c\x00", "completed", 1.0, NUL_TASK)
    assert await store.save_a2a_task(record)
    assert await store.save_a2a_task(record)  # (its own write, again: written)
    found = await store.load_a2a_task("t\x00")
    assert found is not None and found.document == as_kept(NUL_TASK, store)
    listed, total = await store.list_a2a_tasks(context_id="c\x00")
    assert total == 1 and listed[0].document == as_kept(NUL_TASK, store)
    working = {**NUL_TASK, "id": "w\x00", "status": {"state": "TASK_STATE_WORKING"}}
    first = A2ATaskRecord("w\x00", "c\x00", "working", 1.0, working)
    assert await store.save_a2a_task_on(first, "h1")
    done = A2ATaskRecord("w\x00", "c\x00", "completed", 2.0, NUL_TASK)
    assert await store.replace_a2a_task_on(done, "h1", first)  # compared as it was written
    document = {"context": {"x\x00": "y\x00"}}
    assert await store.save_state("s", document, expected_version=0)
    state = await store.load_state("s")
    assert state is not None and (state.document, state.version) == (as_kept(document, store), 1)
    metadata = {"note": "n\x00"}
    await store.save_session(SessionRecord("s", "agent", ["a"], 1.0, metadata))
    session = await store.load_session("s")
    assert session is not None and session.metadata == as_kept(metadata, store)


async def test_a_database_of_the_previous_schema_keeps_its_states(
    postgres_url: str, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database the previous version made (cluster migrations 1-4), with a state it wrote:
    cluster migration 5 adds the tokens of state writes, and the state goes on from there."""
    database = postgres_url.rsplit("/", 1)[1]
    monkeypatch.setattr(postgres, "CLUSTER_MIGRATIONS", postgres.CLUSTER_MIGRATIONS[:4])
    previous = PostgresStore(postgres_url)
    await previous.open()
    await previous.close()
    monkeypatch.undo()
    postgres_cluster.sql(  # (as the previous version wrote a state: its token in the row only)
        "INSERT INTO state (session_id, document, version, writer) "
        """VALUES ('s', '{"context": {"log": []}}', 1, 'a token')""",
        database,
    )
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        assert postgres_cluster.migrations(database) == "1 2 3 4 5"
        losing = LosingReplies(store)
        await StateManager(store).apply("s", APPEND_A)
        assert losing.lost >= 1
        losing.active = False
        stored = await store.load_state("s")
        assert stored is not None
        assert (stored.document, stored.version) == ({"context": {"log": ["A"]}}, 2)
    finally:
        await store.close()


async def test_a_post_counts_what_waits_for_a_session_when_asked(postgres_url: str) -> None:
    poster, other = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await poster.open()
    await other.open()
    try:
        assert await poster.post_messages(["s", "t"], [b"ab", b"c"]) == {}
        await other.post_messages(["s"], [b"de"])
        losing = LosingReplies(poster)  # (a retried post still counts, once)
        assert await poster.post_messages(["s", "t"], [b"f", b"g"], count=["s"]) == {"s": 5}
        assert losing.lost == 1
        losing.active = False
        assert await poster.waiting_bytes("t") == 2
        assert await other.take_messages("s") == [b"ab", b"de", b"f"]
        assert await poster.waiting_bytes("s") == 0
    finally:
        await poster.close()
        await other.close()
