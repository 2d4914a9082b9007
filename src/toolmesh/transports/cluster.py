"""HTTP sessions served by several hosts that share one PostgreSQL store.

Behind a load balancer each request of a session may reach a different host. Nothing about a
session lives on one host only:

- ``POST /session`` saves the session in the store; any host can then take its requests (it
  *adopts* the session: a local connection restored from the stored record, handshake included).
- A call runs on the host that received it, through that host's pipeline (policy, validation,
  state, audit), so work spreads over the hosts.
- Its events and response go to the session's stream: straight into the local queue when this
  host holds the stream, else into the store's mailbox, with a signal that wakes the host that
  holds it (one statement: the rows and the signal commit together). A stream attaching
  collects what waited; a stream that ends hands what it had not sent back to the mailbox.
  Both survive a lost reply: a post carries an id its poster chose (a retried post adds
  nothing, even once its messages were collected), and the host collecting claims the rows
  with its token for the session before deleting them (a retried or a later take finds what
  a lost reply had claimed). Rows another host claimed and never deleted (it died between its
  two steps) are taken again once its claim expires, without waiting for the next message.
- A session's backlog is bounded as on one host (``MAX_UNSENT_BYTES``), wherever it waits:
  a host reckons what waits in the mailbox for a session (its last count, plus what it posted
  since), and past half the limit its posts also count what waits there, from every host (a
  count reads the session's rows: it is made only then). The reckoning only grows until the
  next count (the stream's host collects without telling), so past the limit it is checked:
  ``POST /send`` answers 429 and events that are only streamed are dropped, with a note, only
  while a count made since the posts (at most ``COUNT_TRUSTED_SECONDS`` old) confirms it;
  until one does, events go on and what waits is counted again at once. What this host
  posted that is not in the store yet always counts (it is held here). The host holding a
  stream nobody reads leaves what arrives in the mailbox, where the other hosts see it,
  until its queue is read.
- A new stream takes over: the host holding an older stream of the session ends it.
- An approval is answered wherever the answer arrives: the store records which host waits for
  it, and the answer is signalled to that host.

What stays per host: running calls (a host that dies takes its running calls with it; every
call it finished is audited), ``max_parallel`` (counted per host) and duplicate request ids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from toolmesh import strictjson
from toolmesh.capabilities import CapabilitySet
from toolmesh.host import SUPPORTED_A2E_CAPS, Host
from toolmesh.models import secret_id
from toolmesh.pipeline import ApprovalRequest
from toolmesh.pipeline import ask as ask_approver
from toolmesh.protocol import encode
from toolmesh.session import Session
from toolmesh.store.base import SessionRecord
from toolmesh.transports import http
from toolmesh.transports.http import (
    _END,
    IDLE_SESSION_SECONDS,
    _only_streamed,
    _Peer,
    _Sessions,
    _StreamQueue,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.responses import Response

    from toolmesh.models import ToolEvent
    from toolmesh.store.postgres import PostgresStore

__all__ = ["ClusterPeer", "ClusterSessions"]

logger = logging.getLogger("toolmesh.cluster")

MAIL, APPROVAL, STREAM = "mail", "approval", "stream"
PRUNE_EVERY_SECONDS = 60.0
COUNT_TRUSTED_SECONDS = 0.25
"""How long a count that found a session's backlog past the limit drops its events: the
stream's host may collect what waits at any time, so past it events go on again until a new
count confirms the backlog."""
RECOUNT_EVERY_SECONDS = 0.1
"""While a session's backlog as reckoned here is past the limit, how often (at most) what waits
for it is counted again: while its events are dropped, before the last count stops being
trusted (so a backlog that stays keeps its events dropped)."""


class _ClusterQueue(_StreamQueue):
    """A session's queue on a host of several: ``unsent_bytes`` also counts what waits
    elsewhere (``mailbox_bytes``: as last counted, plus what this host posted since; an
    estimate that only grows between counts), ``unflushed_bytes`` is what this host posted that
    is not in the store yet (held here; ``sending_bytes`` of it on its way, which a count made
    meanwhile may already see), and ``when_read`` calls back once the stream has read the queue
    down to the limit."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self.mailbox_bytes = 0
        self.unflushed_bytes = 0
        self.sending_bytes = 0
        self.learned_at = -math.inf  # when the count last learned was asked (monotonic)
        self.counted_bytes = 0  # what the last confirming count found in the mailbox
        self.counted_at = -math.inf  # when it was asked
        self._when_read: Callable[[], None] | None = None

    def posted(self, size: int) -> None:
        self.unsent_bytes += size
        self.mailbox_bytes += size
        self.unflushed_bytes += size

    def sending(self, size: int) -> None:
        """``size`` bytes this host posted are on their way to the store."""
        self.sending_bytes += size

    def flushed(self, size: int) -> None:
        """The ``size`` bytes on their way are in the store now (or lost): not held here."""
        self.unflushed_bytes = max(0, self.unflushed_bytes - size)
        self.sending_bytes = max(0, self.sending_bytes - size)

    def learn_mailbox(self, size: int, asked_at: float, *, confirms: bool) -> None:
        """A count asked at ``asked_at`` found ``size`` bytes in the mailbox (what this host
        has not flushed yet waits too). It ``confirms`` a backlog when it was made after the
        posts it saw (not by a post itself: the stream's host had no time to collect them)."""
        if asked_at < self.learned_at:
            return  # an older count answered late
        self.learned_at = asked_at
        self._reckon(size + self.unflushed_bytes)
        if confirms:
            self.counted_bytes, self.counted_at = size, asked_at

    def forget_mailbox(self, now: float) -> None:
        """A stream of this host collects what waits in the mailbox: it comes into the queue."""
        self.learned_at, self.counted_bytes, self.counted_at = now, 0, now
        self._reckon(0)

    def confirmed_bytes(self, now: float) -> int:
        """The backlog as far as it is known, not merely reckoned: what waits in the queue,
        what this host has not sent to the store yet, and what a count still trusted found
        (or, if more, what is on its way: the count may have seen it land, or not)."""
        queued = self.unsent_bytes - self.mailbox_bytes
        counted = self.counted_bytes if now - self.counted_at < COUNT_TRUSTED_SECONDS else 0
        unsent = self.unflushed_bytes - self.sending_bytes
        return queued + unsent + max(counted, self.sending_bytes)

    def _reckon(self, mailbox_bytes: int) -> None:
        self.unsent_bytes += mailbox_bytes - self.mailbox_bytes
        self.mailbox_bytes = mailbox_bytes

    def when_read(self, callback: Callable[[], None]) -> None:
        self._when_read = callback

    def _get(self) -> bytes | None:
        item = super()._get()
        if self._when_read is not None and self.unsent_bytes <= http.MAX_UNSENT_BYTES:
            callback, self._when_read = self._when_read, None
            callback()
        return item


class ClusterPeer(_Peer):
    """A session as this host serves it: messages go to whichever host holds its stream."""

    def __init__(self, sessions: ClusterSessions, session_id: str) -> None:
        super().__init__(sessions.host, session_id)
        self.queue: _ClusterQueue = _ClusterQueue()
        self.sessions = sessions
        self.pulling = False
        self.pull_again = False
        self.pull_timer: asyncio.TimerHandle | None = None  # when others' claims expire
        self.counting = False  # a count of what waits in the mailbox is on its way
        self.recounted_at = -math.inf  # when the last one was asked (monotonic)
        self.approvals_shared = False
        self.claim = secret_id()  # this host's token for the mailbox rows it takes

    def _deliver(self, message: Any) -> None:
        if self.stream_owner is not None:
            super()._deliver(message)  # this host's stream: its backlog bounded as on one host
        elif self.queue.unsent_bytes > http.MAX_UNSENT_BYTES and _only_streamed(message):
            self._past_limit(message)
        else:
            if self._dropping:
                self._dropping.clear()
            self.post(encode(message))

    def _past_limit(self, event: ToolEvent) -> None:
        """The backlog as reckoned here is past the limit, but the reckoning still counts what
        the stream's host may have collected since: ``event`` is dropped (as on one host) only
        while what is known confirms it, else it goes on and what waits is counted now."""
        now = time.monotonic()
        if self.queue.confirmed_bytes(now) > http.MAX_UNSENT_BYTES:
            self._drop(event)
        else:
            self.post(encode(event))  # (its call's note, if any, still holds: not cleared)
        self.sessions.recount(self, now)

    def _queue_note(self, data: bytes) -> None:
        if self.stream_owner is not None:
            super()._queue_note(data)
        else:
            self.post(data)

    def post(self, data: bytes) -> None:
        """Send ``data`` to the stream through the mailbox, counted in the backlog."""
        self.queue.posted(len(data))
        self.sessions.post(self.id, data)

    async def receive(self, body: bytes) -> None:
        connection = self.connection
        if connection.session is None and b'"handshake/req"' not in body:
            await self.sessions.restore(self)  # the handshake may have been answered elsewhere
        if b'"tool/approval/resp"' in body and await self.sessions.forward_approval(self, body):
            return
        await connection.receive_line(body)
        if connection.session is not None and not self.approvals_shared:
            self.sessions.share_approvals(self, connection.session)


class ClusterSessions(_Sessions):
    """The HTTP sessions of one host of several; the store carries what they share."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.store: PostgresStore = host.store  # type: ignore[assignment]
        self._outbox: list[tuple[str, bytes]] = []
        self._poster: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unsubscribe: list[Any] = []
        self._pruned_at = time.monotonic()

    async def start(self) -> None:
        if self._unsubscribe:
            return
        subscribe = self.store.subscribe
        self._unsubscribe = [
            subscribe(MAIL, self._on_mail, resync=self._resync),
            subscribe(APPROVAL, self._on_approval),
            subscribe(STREAM, self._on_stream),
        ]

    # -- sessions --------------------------------------------------------------------------------

    async def create(self) -> _Peer:
        self._reap()
        peer = ClusterPeer(self, secret_id())
        record = SessionRecord(
            peer.id,
            created_at=time.time(),
            metadata={"transport": "http", "host_id": self.host.host_id},
        )
        await self.store.save_session(record)
        self.peers[peer.id] = peer
        self._prune_soon()
        return peer

    async def adopt(self, session_id: str) -> _Peer | None:
        record = await self.store.load_session(session_id)
        if record is None or record.metadata.get("transport") != "http":
            return None
        peer = self.peers.get(session_id)
        if peer is None:  # (another request may have adopted it while we read)
            peer = ClusterPeer(self, session_id)
            self.peers[session_id] = peer
            self._resume(peer, record)
        return peer

    async def restore(self, peer: ClusterPeer) -> None:
        """Resume a session whose handshake another host answered."""
        record = await self.store.load_session(peer.id)
        if record is not None and peer.connection.session is None:
            self._resume(peer, record)

    def _resume(self, peer: ClusterPeer, record: SessionRecord) -> None:
        caps = record.metadata.get("a2e_caps")
        if not isinstance(caps, list):
            return  # no handshake yet
        session = Session(
            capabilities=CapabilitySet(record.capabilities),
            agent_id=record.agent_id,
            id=record.session_id,
            max_parallel=self.host.max_parallel,
            transport="http",
            a2e_caps=frozenset(caps) & SUPPORTED_A2E_CAPS,
            created_at=record.created_at,
        )
        peer.connection.resume(session)
        self.share_approvals(peer, session)

    # -- messages to the stream ------------------------------------------------------------------

    def post(self, session_id: str, data: bytes) -> None:
        """Send a message to the host holding ``session_id``'s stream (in order)."""
        self._outbox.append((session_id, data))
        if self._poster is None or self._poster.done():
            self._poster = asyncio.ensure_future(self._post())

    async def _post(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, []
            held = self._sending(batch)
            asked_at = time.monotonic()
            try:
                waiting = await self.store.post_messages(
                    [s for s, _ in batch], [d for _, d in batch], self._worth_counting(batch)
                )
            except Exception:
                logger.exception("%d message(s) for session streams were lost", len(batch))
                waiting = {}
            for queue, size in held:
                queue.flushed(size)
            for session_id, size in waiting.items():
                # (counted by the post itself: it does not confirm a backlog)
                self._learn_mailbox(session_id, size, asked_at, confirms=False)

    def _sending(self, batch: list[tuple[str, bytes]]) -> list[tuple[_ClusterQueue, int]]:
        """Mark the messages of ``batch`` on their way to the store: the queues of their
        sessions, with how many bytes each has in it."""
        sizes: dict[str, int] = {}
        for session_id, data in batch:
            sizes[session_id] = sizes.get(session_id, 0) + len(data)
        held = []
        for session_id, size in sizes.items():
            peer = self.peers.get(session_id)
            if isinstance(peer, ClusterPeer):
                peer.queue.sending(size)
                held.append((peer.queue, size))
        return held

    def _worth_counting(self, batch: list[tuple[str, bytes]]) -> list[str]:
        """The sessions of ``batch`` whose backlog may near the limit: what waits for them in
        the mailbox as this host reckons it (its last count, plus what it posted since; the
        other hosts' posts are not known here) is past half of it. Their post counts what
        waits for them; the others' costs nothing more."""
        mark = http.MAX_UNSENT_BYTES // 2
        worth = []
        for session_id in {s for s, _ in batch}:
            peer = self.peers.get(session_id)
            if isinstance(peer, ClusterPeer) and peer.queue.mailbox_bytes > mark:
                worth.append(session_id)
        return worth

    def _learn_mailbox(
        self, session_id: str, size: int, asked_at: float, *, confirms: bool
    ) -> None:
        """``size`` bytes wait in the mailbox for the stream of ``session_id``: they count in
        its backlog here, while another host (or none) holds the stream."""
        peer = self.peers.get(session_id)
        if isinstance(peer, ClusterPeer) and peer.stream_owner is None:
            peer.queue.learn_mailbox(size, asked_at, confirms=confirms)

    async def backlog_refusal(self, peer: _Peer) -> Response | None:
        if isinstance(peer, ClusterPeer) and peer.stream_owner is None:
            # The count may be stale (the stream's host collects without telling): a client
            # that read its stream since is not refused.
            try:
                await self._count(peer)
            except Exception as exc:  # the store is away: judged by the last count
                logger.warning("could not count the backlog of session %s: %s", peer.id, exc)
        return await super().backlog_refusal(peer)

    def recount(self, peer: ClusterPeer, now: float) -> None:
        """Count again what waits for ``peer``'s stream, its backlog as reckoned here being
        past the limit: one count at a time, at most every RECOUNT_EVERY_SECONDS."""
        if peer.counting or now - peer.recounted_at < RECOUNT_EVERY_SECONDS:
            return
        peer.counting, peer.recounted_at = True, now
        self._spawn(self._recount(peer))

    async def _recount(self, peer: ClusterPeer) -> None:
        try:
            await self._count(peer)
        except Exception as exc:  # judged by the last count until the next one
            logger.warning("could not count the backlog of session %s: %s", peer.id, exc)
        finally:
            peer.counting = False

    async def _count(self, peer: ClusterPeer) -> None:
        asked_at = time.monotonic()
        waiting = await self.store.waiting_bytes(peer.id)
        self._learn_mailbox(peer.id, waiting, asked_at, confirms=True)

    def attached(self, peer: _Peer) -> None:
        if isinstance(peer, ClusterPeer):
            from toolmesh.store import postgres  # (the store of a cluster; asyncpg is loaded)

            peer.queue.forget_mailbox(time.monotonic())  # what waits there comes in now
            self.pull(peer)
            # The host that held the stream before may be claiming rows as this one takes
            # (unseen by its take) and die before it deletes them: they are taken once its
            # claim expires, unless a take sees them first (and says when).
            self._pull_after(peer, postgres.CLAIM_TIMEOUT + postgres.CLAIM_MARGIN)
            self._spawn(self._publish(STREAM, json.dumps([peer.id, self.host.host_id])))

    def detached(self, peer: _Peer) -> None:
        leftovers = []
        while not peer.queue.empty():
            data = peer.queue.get_nowait()
            if data:
                leftovers.append(data)
        for data in leftovers:  # for whichever host holds the next stream
            if isinstance(peer, ClusterPeer):
                peer.post(data)
            else:
                self.post(peer.id, data)

    def pull(self, peer: ClusterPeer) -> None:
        """Collect the messages waiting in the mailbox for ``peer``'s stream."""
        if peer.pulling:
            peer.pull_again = True
            return
        peer.pulling = True
        self._spawn(self._pull(peer))

    async def _pull(self, peer: ClusterPeer) -> None:
        try:
            while True:
                peer.pull_again = False
                if peer.queue.unsent_bytes > http.MAX_UNSENT_BYTES:
                    # Nobody reads the stream: what arrives stays in the mailbox, where it
                    # bounds the backlog for every host, until the stream reads the queue.
                    peer.queue.when_read(lambda: self._pull_streamed(peer))
                    return
                messages, claimed_for = await self.store.take_mail(peer.id, claim=peer.claim)
                for data in messages:
                    peer.queue.put_nowait(data)
                if peer.stream_owner is None:
                    self.detached(peer)  # the stream ended meanwhile: pass them on
                    return
                if claimed_for is not None:
                    self._pull_after(peer, claimed_for)
                if not peer.pull_again:
                    return
        except Exception:
            # (what was claimed stays in the mailbox, for the next pull with the same claim)
            logger.exception("could not collect the messages of session %s", peer.id)
        finally:
            peer.pulling = False

    def _pull_after(self, peer: ClusterPeer, delay: float) -> None:
        """Pull again in ``delay`` seconds, when the claims another taker holds on rows of the
        session expire: a taker that died left them claimed, and nothing else would signal
        them (the next message might never come)."""
        if peer.pull_timer is not None:
            peer.pull_timer.cancel()
        loop = asyncio.get_running_loop()
        peer.pull_timer = loop.call_later(delay, self._claims_expired, peer)

    def _claims_expired(self, peer: ClusterPeer) -> None:
        peer.pull_timer = None
        self._pull_streamed(peer)

    def _pull_streamed(self, peer: ClusterPeer) -> None:
        if peer.stream_owner is not None and self.peers.get(peer.id) is peer:
            self.pull(peer)

    def _on_mail(self, session_id: str) -> None:
        peer = self.peers.get(session_id)
        if isinstance(peer, ClusterPeer) and peer.stream_owner is not None:
            self.pull(peer)

    def _resync(self) -> None:
        for peer in list(self.peers.values()):
            if isinstance(peer, ClusterPeer) and peer.stream_owner is not None:
                self.pull(peer)

    def _on_stream(self, payload: str) -> None:
        session_id, host_id = json.loads(payload)
        peer = self.peers.get(session_id)
        if host_id == self.host.host_id or not isinstance(peer, ClusterPeer):
            return
        if peer.stream_owner is not None:
            peer.stream_owner = None  # another host's stream took over: end ours
            self.detached(peer)
            peer.queue.put_nowait(_END)
        else:
            # the new stream collects what waits (not what this host still holds)
            peer.queue.learn_mailbox(0, time.monotonic(), confirms=True)

    # -- approvals -------------------------------------------------------------------------------

    def share_approvals(self, peer: ClusterPeer, session: Session) -> None:
        """Record each approval this host waits for, so an answer reaching another host finds
        its way here."""
        peer.approvals_shared = True
        ask = session.approver
        if ask is None:
            return
        store, host_id = self.store, self.host.host_id

        async def approver(request: ApprovalRequest) -> Any:
            await store.approval_asked(request.id, session.id, host_id)
            try:
                return await ask_approver(ask, request)
            finally:
                self._spawn(store.approval_done(request.id))

        session.approver = approver

    async def forward_approval(self, peer: ClusterPeer, body: bytes) -> bool:
        """Send an approval answer to the host waiting for it; False to answer it here."""
        try:
            approval_id = strictjson.loads(body)["req_id"]
        except (ValueError, KeyError, TypeError):
            return False
        if not isinstance(approval_id, str):
            return False
        waiting = await self.store.approval_host(approval_id, peer.id)
        if waiting is None or waiting == self.host.host_id:
            return False
        payload = json.dumps([waiting, peer.id, body.decode("utf-8", "replace")])
        try:
            await self.store.publish(APPROVAL, payload)
        except ValueError:
            return False  # too large to signal: answered (refused) here
        return True

    def _on_approval(self, payload: str) -> None:
        host_id, session_id, body = json.loads(payload)
        peer = self.peers.get(session_id)
        if host_id == self.host.host_id and peer is not None:
            self._spawn(peer.connection.receive_line(body))

    # -- housekeeping ----------------------------------------------------------------------------

    def _prune_soon(self) -> None:
        now = time.monotonic()
        if now - self._pruned_at > PRUNE_EVERY_SECONDS:
            self._pruned_at = now
            self._spawn(self.store.drop_messages(older_than=IDLE_SESSION_SECONDS))

    async def _publish(self, topic: str, payload: str) -> None:
        await self.store.publish(topic, payload)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("cluster housekeeping failed: %s", task.exception())

    async def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        for peer in list(self.peers.values()):
            if isinstance(peer, ClusterPeer) and peer.pull_timer is not None:
                peer.pull_timer.cancel()
            if peer.stream_owner is not None:
                self.detached(peer)  # what this host's streams did not send yet goes on
                peer.stream_owner = None  # and so do the answers of the calls closing cancels
        await super().close()
        if self._poster is not None:
            await asyncio.gather(self._poster, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
