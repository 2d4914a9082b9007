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
  count reads the session's rows: it is made only then); past the limit
  ``POST /send`` answers 429 (counted again in the store first) and events that are only
  streamed are dropped, with a note. The host holding a stream nobody reads leaves what
  arrives in the mailbox, where the other hosts see it, until its queue is read.
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

    from toolmesh.store.postgres import PostgresStore

__all__ = ["ClusterPeer", "ClusterSessions"]

logger = logging.getLogger("toolmesh.cluster")

MAIL, APPROVAL, STREAM = "mail", "approval", "stream"
PRUNE_EVERY_SECONDS = 60.0
RECOUNT_EVERY_SECONDS = 1.0
"""While a session's events are dropped (its mailbox past the limit as last learned), how often
what waits is counted again in the store: the stream's host may have collected it since."""


class _ClusterQueue(_StreamQueue):
    """A session's queue on a host of several: ``unsent_bytes`` also counts what waits in the
    mailbox (``mailbox_bytes``: as last counted, plus what this host posted since), and
    ``when_read`` calls back once the stream has read the queue down to the limit."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self.mailbox_bytes = 0
        self._when_read: Callable[[], None] | None = None

    def posted(self, size: int) -> None:
        self.unsent_bytes += size
        self.mailbox_bytes += size

    def learn_mailbox(self, size: int) -> None:
        self.unsent_bytes += size - self.mailbox_bytes
        self.mailbox_bytes = size

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
        self.counted_at = 0.0  # when the mailbox was last counted for dropped events
        self.approvals_shared = False
        self.claim = secret_id()  # this host's token for the mailbox rows it takes

    def _deliver(self, message: Any) -> None:
        if self.stream_owner is not None:
            super()._deliver(message)  # this host's stream: its backlog bounded as on one host
        elif self.queue.unsent_bytes > http.MAX_UNSENT_BYTES and _only_streamed(message):
            self._drop(message)  # as on one host, the limit counting what waits in the mailbox
            self.sessions.recount_soon(self)
        else:
            if self._dropping:
                self._dropping.clear()
            self.post(encode(message))

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
            try:
                waiting = await self.store.post_messages(
                    [s for s, _ in batch], [d for _, d in batch], self._worth_counting(batch)
                )
            except Exception:
                logger.exception("%d message(s) for session streams were lost", len(batch))
                continue
            for session_id, size in waiting.items():
                self._learn_mailbox(session_id, size)

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

    def _learn_mailbox(self, session_id: str, size: int) -> None:
        """``size`` bytes wait in the mailbox for the stream of ``session_id``: they count in
        its backlog here, while another host (or none) holds the stream."""
        peer = self.peers.get(session_id)
        if isinstance(peer, ClusterPeer) and peer.stream_owner is None:
            peer.queue.learn_mailbox(size)

    async def backlog_refusal(self, peer: _Peer) -> Response | None:
        if isinstance(peer, ClusterPeer) and peer.stream_owner is None:
            # The count may be stale (the stream's host collects without telling): a client
            # that read its stream since is not refused.
            try:
                self._learn_mailbox(peer.id, await self.store.waiting_bytes(peer.id))
            except Exception as exc:  # the store is away: judged by the last count
                logger.warning("could not count the backlog of session %s: %s", peer.id, exc)
        return await super().backlog_refusal(peer)

    def recount_soon(self, peer: ClusterPeer) -> None:
        """Count again what waits for ``peer``'s stream (at most every
        RECOUNT_EVERY_SECONDS): its events are dropped only while the backlog is past the
        limit, as the stream's host may have collected it since it was counted."""
        now = time.monotonic()
        if now - peer.counted_at >= RECOUNT_EVERY_SECONDS:
            peer.counted_at = now
            self._spawn(self._recount(peer))

    async def _recount(self, peer: ClusterPeer) -> None:
        self._learn_mailbox(peer.id, await self.store.waiting_bytes(peer.id))

    def attached(self, peer: _Peer) -> None:
        if isinstance(peer, ClusterPeer):
            from toolmesh.store import postgres  # (the store of a cluster; asyncpg is loaded)

            peer.queue.learn_mailbox(0)  # what waits there comes into the queue now
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
            peer.queue.learn_mailbox(0)  # the new stream collects what waits

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
