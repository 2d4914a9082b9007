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
from toolmesh.store import A2ATaskRecord, SqliteStore, open_store
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
