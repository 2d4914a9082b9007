"""The PostgreSQL mailbox's claims: they expire, so rows a taker claimed and never deleted (its
host died, lost the session's stream, or gave up on a failed delete) reach the session through
the next taker, and a slow taker overtaken returns none of the rows the other one took.

Time is the stores' ``clock`` (one ``Clock`` shared by the hosts of a test): moved, not waited
for. A "host" is a ``PostgresStore`` of its own, with a token of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from tests.fixtures.postgres import PostgresCluster
from tests.store.test_postgres import LosingReplies
from toolmesh.store import postgres
from toolmesh.store.postgres import PostgresStore

pytestmark = [pytest.mark.network_server]

T = TypeVar("T")

START = 1_000_000.0
DAY = 86_400.0  # far longer than any claim timeout


class Clock:
    """The time the stores of a test claim with: ``now``, moved by the test."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Stalling:
    """Wraps ``store.run``: its ``at``-th operation (by default the second, a take's delete)
    waits for ``go``; ``stalled`` is set once it waits. A host slow between its two steps."""

    def __init__(self, store: PostgresStore, *, at: int = 2) -> None:
        self.run = store.run
        self.at = at
        self.calls = 0
        self.stalled = asyncio.Event()
        self.go = asyncio.Event()
        store.run = self  # type: ignore[method-assign]

    async def __call__(self, operation: Callable[[Any], Awaitable[T]]) -> T:
        self.calls += 1
        if self.calls == self.at:
            self.stalled.set()
            await self.go.wait()
        return await self.run(operation)


async def stalls(stall: Stalling, take: asyncio.Future[list[bytes]]) -> None:
    """Return once ``take`` waits before its delete; fail if it ends first (it claimed none)."""
    waiting = asyncio.ensure_future(stall.stalled.wait())
    await asyncio.wait([waiting, take], return_when=asyncio.FIRST_COMPLETED)
    if not stall.stalled.is_set():
        waiting.cancel()
        pytest.fail(f"the take claimed nothing, it returned {take.result()!r}")


async def hosts(url: str, clock: Clock, count: int = 2, **options: Any) -> list[PostgresStore]:
    stores = []
    for _ in range(count):
        store = PostgresStore(url, **options)
        store.clock = clock
        await store.open()
        stores.append(store)
    return stores


async def claim_and_die(store: PostgresStore, session_id: str, claim: str) -> None:
    """A take that claims rows and never deletes them: the claim commits, every reply after it
    is lost, and the store gives up at once (reconnect_timeout=0), as a host dying would."""
    losing = LosingReplies(store, always=True)
    with pytest.raises(ConnectionResetError):
        await store.take_messages(session_id, claim=claim)
    assert losing.lost == 1  # (the claim ran; the delete never did)
    losing.active = False


async def test_rows_a_dead_taker_claimed_are_taken_by_another_after_the_timeout(
    postgres_url: str,
) -> None:
    """Before, nobody ever took them again: the session never got its messages (only
    drop_messages, later, forgot them)."""
    clock = Clock()
    dead, other = await hosts(postgres_url, clock, reconnect_timeout=0.0)
    try:
        await dead.post_messages(["s", "s", "t"], [b"a", b"b", b"x"])
        await claim_and_die(dead, "s", "host1")
        await other.post_messages(["s"], [b"c"])  # after the claim: not claimed
        assert await other.take_messages("s", claim="host2") == [b"c"]
        clock.now += DAY
        assert await other.take_messages("s", claim="host2") == [b"a", b"b"]  # oldest first
        assert await other.take_messages("s", claim="host2") == []
        assert await dead.take_messages("s", claim="host1") == []  # (none twice)
        assert await other.take_messages("t", claim="host2") == [b"x"]  # other sessions' own
    finally:
        await dead.close()
        await other.close()


async def test_before_the_timeout_the_rows_stay_with_their_claim(postgres_url: str) -> None:
    clock = Clock()
    first, other = await hosts(postgres_url, clock, reconnect_timeout=0.0)
    try:
        await first.post_messages(["s", "s"], [b"a", b"b"])
        await claim_and_die(first, "s", "host1")
        clock.now += 1.0
        assert await other.take_messages("s", claim="host2") == []
        assert await first.take_messages("s", claim="host1") == [b"a", b"b"]
        clock.now += DAY
        assert await other.take_messages("s", claim="host2") == []  # (taken: nothing left)
    finally:
        await first.close()
        await other.close()


async def test_a_take_says_when_the_claims_of_other_takers_expire(
    postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """A take that found rows another taker claimed said nothing: the stream's host took again
    only when the next message came for the session (which might never come), so the rows of
    a taker that died waited. The take now says in how many seconds to take again."""
    clock = Clock()
    dead, other = await hosts(postgres_url, clock, reconnect_timeout=0.0)
    try:
        await dead.post_messages(["s", "s", "t"], [b"a", b"b", b"x"])
        await claim_and_die(dead, "s", "host1")
        clock.now += 10.0
        left = postgres.CLAIM_TIMEOUT - 10.0 + postgres.CLAIM_MARGIN
        assert await other.take_mail("s", claim="host2") == ([], pytest.approx(left))
        assert await dead.take_mail("s", claim="host1") == ([b"a", b"b"], None)  # its own
        assert await other.take_mail("t", claim="host2") == ([b"x"], None)
        await dead.post_messages(["s"], [b"c"])
        await claim_and_die(dead, "s", "host1")
        taken, wait = await other.take_mail("s", claim="host2")
        assert (taken, wait) == ([], pytest.approx(postgres.CLAIM_TIMEOUT + postgres.CLAIM_MARGIN))
        assert wait is not None
        clock.now += wait  # taken again when it said: the claim has expired
        assert await other.take_mail("s", claim="host2") == ([b"c"], None)
        # a claim of the previous version (no time) never expires: no use taking again
        await dead.post_messages(["s"], [b"d"])
        database = postgres_url.rsplit("/", 1)[1]
        postgres_cluster.sql("UPDATE mailbox SET claim = 'old', claimed_at = NULL", database)
        assert await other.take_mail("s", claim="host2") == ([], None)
    finally:
        await dead.close()
        await other.close()


async def test_a_claim_expires_once_it_is_older_than_claim_timeout(postgres_url: str) -> None:
    clock = Clock()
    first, other = await hosts(postgres_url, clock, reconnect_timeout=0.0)
    try:
        await first.post_messages(["s"], [b"a"])
        await claim_and_die(first, "s", "host1")
        clock.now = START + postgres.CLAIM_TIMEOUT  # exactly the bound: still held
        assert await other.take_messages("s", claim="host2") == []
        clock.now = START + postgres.CLAIM_TIMEOUT + 0.001
        assert await other.take_messages("s", claim="host2") == [b"a"]
    finally:
        await first.close()
        await other.close()


@pytest.mark.parametrize("second_done", [True, False], ids=["taken", "claimed"])
async def test_a_slow_taker_overtaken_returns_none_of_the_others_rows(
    postgres_url: str, postgres_cluster: PostgresCluster, second_done: bool
) -> None:
    """The first taker claims, then stalls past the timeout before its delete; the second
    claims the rows and has deleted them already (``taken``) or not yet (``claimed``). Before,
    the second could not take them at all; and a delete by id alone would have let the first
    return (and delete) rows the second had claimed: both would deliver them."""
    clock = Clock()
    slow, second = await hosts(postgres_url, clock)
    try:
        await slow.post_messages(["s", "s"], [b"a", b"b"])
        slow_stall, second_stall = Stalling(slow), Stalling(second)
        slow_take = asyncio.ensure_future(slow.take_messages("s", claim="host1"))
        await stalls(slow_stall, slow_take)  # host1 claimed both rows; its delete waits
        clock.now += DAY
        second_take = asyncio.ensure_future(second.take_messages("s", claim="host2"))
        await stalls(second_stall, second_take)  # host2 claimed them over; its delete waits
        if second_done:
            second_stall.go.set()
            assert await second_take == [b"a", b"b"]
        slow_stall.go.set()
        assert await slow_take == []
        if not second_done:
            second_stall.go.set()
            assert await second_take == [b"a", b"b"]
        database = postgres_url.rsplit("/", 1)[1]
        assert postgres_cluster.sql("SELECT count(*) FROM mailbox", database) == "0"
        assert await slow.take_messages("s", claim="host1") == []
    finally:
        await slow.close()
        await second.close()


async def test_a_slow_taker_whose_claim_expired_unclaimed_still_takes_its_rows(
    postgres_url: str,
) -> None:
    clock = Clock()
    (slow,) = await hosts(postgres_url, clock, count=1)
    try:
        await slow.post_messages(["s", "s"], [b"a", b"b"])
        stall = Stalling(slow)
        take = asyncio.ensure_future(slow.take_messages("s", claim="host1"))
        await stalls(stall, take)
        clock.now += DAY  # expired, but nobody took them over
        stall.go.set()
        assert await take == [b"a", b"b"]
    finally:
        await slow.close()


async def test_a_take_retried_after_lost_replies_still_returns_its_rows(
    postgres_url: str,
) -> None:
    """The claim's reply and the delete's are lost (both committed): the retries find the rows
    the token claimed, and the record of what the delete deleted; nothing is left, nothing is
    returned twice, and the timeout is not what makes it work (no time passes)."""
    clock = Clock()
    taker, other = await hosts(postgres_url, clock)
    try:
        await taker.post_messages(["s", "s"], [b"a", b"b"])
        losing = LosingReplies(taker)
        assert await taker.take_messages("s", claim="host1") == [b"a", b"b"]
        assert losing.lost == 2
        losing.active = False
        assert await taker.take_messages("s", claim="host1") == []
        clock.now += DAY
        assert await other.take_messages("s", claim="host2") == []
    finally:
        await taker.close()
        await other.close()


async def test_a_claim_retried_after_it_was_taken_over_returns_nothing_twice(
    postgres_url: str,
) -> None:
    """The claim's reply is lost and its retry comes after the timeout, once another host took
    the rows over: each message is returned once, by the host that took it."""
    clock = Clock()
    slow, other = await hosts(postgres_url, clock)
    try:
        await slow.post_messages(["s", "s"], [b"a", b"b"])
        taken: list[bytes] = []

        async def take_over() -> None:
            clock.now += DAY
            taken.extend(await other.take_messages("s", claim="host2"))

        LosingReplies(slow, meanwhile=take_over)
        assert await slow.take_messages("s", claim="host1") == []
        assert taken == [b"a", b"b"]
    finally:
        await slow.close()
        await other.close()


async def test_a_delete_retried_while_its_first_try_still_commits_returns_its_rows(
    postgres_url: str,
) -> None:
    """The connection of the delete's first try is lost while the server still runs it: the
    retry waits for its row locks and commits after it. The retry deletes nothing, and the
    first try's record of what it deleted is not in the retry's snapshot: it is looked up
    again, else those messages would be lost (deleted, returned by neither try)."""
    store = PostgresStore(postgres_url, min_connections=3)
    await store.open()
    try:
        await store.post_messages(["s", "s"], [b"a", b"b"])
        run = store.run
        calls = 0

        async def overlapping(operation: Callable[[Any], Awaitable[T]]) -> T:
            nonlocal calls
            calls += 1
            if calls != 2:  # the claim runs as usual
                return await run(operation)
            async with store.pool.acquire() as first:
                first_try = first.transaction()
                await first_try.start()
                await operation(first)  # done, not committed yet
                retry = asyncio.ensure_future(run(operation))
                await asyncio.wait_for(waiting_for_a_lock(store), 30)
                await first_try.commit()
                return await retry

        store.run = overlapping  # type: ignore[method-assign]
        assert await store.take_messages("s", claim="host1") == [b"a", b"b"]
        store.run = run  # type: ignore[method-assign]
        assert await store.take_messages("s", claim="host1") == []
    finally:
        await store.close()


async def waiting_for_a_lock(store: PostgresStore) -> None:
    """Return once a statement of this database waits for a lock (polled, no sleep)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while not await store.pool.fetchval(query):
        pass


async def test_a_database_of_the_previous_schema_is_upgraded(
    postgres_url: str, postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database the previous version made (cluster migrations 1-2), with messages waiting,
    two of them claimed by a host that died before the upgrade: cluster migration 3 adds the
    claim times (those claims count as made at the upgrade) and the record of takes."""
    database = postgres_url.rsplit("/", 1)[1]
    monkeypatch.setattr(postgres, "CLUSTER_MIGRATIONS", postgres.CLUSTER_MIGRATIONS[:2])
    previous = PostgresStore(postgres_url)
    await previous.open()
    await previous.post_messages(["s", "s", "s"], [b"a", b"b", b"c"])
    await previous.close()
    monkeypatch.undo()
    # (what the previous version's take did before its host died: the claim only)
    postgres_cluster.sql(
        "UPDATE mailbox SET claim = 'dead' "
        "WHERE id IN (SELECT id FROM mailbox ORDER BY id LIMIT 2)",
        database,
    )
    columns = (
        "SELECT string_agg(column_name, ' ' ORDER BY column_name) "
        "FROM information_schema.columns WHERE table_name = 'mailbox'"
    )
    assert postgres_cluster.sql(columns, database) == "claim id message posted_at session_id"

    store = PostgresStore(postgres_url)
    await store.open()
    try:
        assert postgres_cluster.migrations(database) == "1 2 3 4 5"
        assert "claimed_at" in postgres_cluster.sql(columns, database).split()
        stamped = postgres_cluster.sql(
            "SELECT string_agg(coalesce(claim, '-') || ':' || (claimed_at IS NOT NULL)::text, "
            "' ' ORDER BY id) FROM mailbox",
            database,
        )
        assert stamped == "dead:true dead:true -:false"
        upgraded_at = float(postgres_cluster.sql("SELECT max(claimed_at) FROM mailbox", database))
        clock = Clock(upgraded_at + 1.0)
        store.clock = clock
        assert await store.take_messages("s", claim="host2") == [b"c"]  # the claims still hold
        clock.now = upgraded_at + DAY
        assert await store.take_messages("s", claim="host2") == [b"a", b"b"]
        assert postgres_cluster.sql("SELECT count(*) FROM mailbox_takes", database) == "2"
    finally:
        await store.close()
