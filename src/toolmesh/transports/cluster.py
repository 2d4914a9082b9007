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
  a lost reply had claimed).
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
from toolmesh.transports.http import _END, IDLE_SESSION_SECONDS, _Peer, _Sessions

if TYPE_CHECKING:
    from toolmesh.store.postgres import PostgresStore

__all__ = ["ClusterPeer", "ClusterSessions"]

logger = logging.getLogger("toolmesh.cluster")

MAIL, APPROVAL, STREAM = "mail", "approval", "stream"
PRUNE_EVERY_SECONDS = 60.0


class ClusterPeer(_Peer):
    """A session as this host serves it: messages go to whichever host holds its stream."""

    def __init__(self, sessions: ClusterSessions, session_id: str) -> None:
        super().__init__(sessions.host, session_id)
        self.sessions = sessions
        self.pulling = False
        self.pull_again = False
        self.approvals_shared = False
        self.claim = secret_id()  # this host's token for the mailbox rows it takes

    def _deliver(self, message: Any) -> None:
        if self.stream_owner is not None:
            super()._deliver(message)  # this host's stream: its backlog bounded as on one host
        else:
            self.sessions.post(self.id, encode(message))

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
                await self.store.post_messages([s for s, _ in batch], [d for _, d in batch])
            except Exception:
                logger.exception("%d message(s) for session streams were lost", len(batch))

    def attached(self, peer: _Peer) -> None:
        if isinstance(peer, ClusterPeer):
            self.pull(peer)
            self._spawn(self._publish(STREAM, json.dumps([peer.id, self.host.host_id])))

    def detached(self, peer: _Peer) -> None:
        leftovers = []
        while not peer.queue.empty():
            data = peer.queue.get_nowait()
            if data:
                leftovers.append(data)
        for data in leftovers:  # for whichever host holds the next stream
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
                for data in await self.store.take_messages(peer.id, claim=peer.claim):
                    peer.queue.put_nowait(data)
                if peer.stream_owner is None:
                    self.detached(peer)  # the stream ended meanwhile: pass them on
                    return
                if not peer.pull_again:
                    return
        except Exception:
            # (what was claimed stays in the mailbox, for the next pull with the same claim)
            logger.exception("could not collect the messages of session %s", peer.id)
        finally:
            peer.pulling = False

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
        if host_id != self.host.host_id and peer is not None and peer.stream_owner is not None:
            peer.stream_owner = None  # another host's stream took over: end ours
            self.detached(peer)
            peer.queue.put_nowait(_END)

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
            if peer.stream_owner is not None:
                self.detached(peer)  # what this host's streams did not send yet goes on
                peer.stream_owner = None  # and so do the answers of the calls closing cancels
        await super().close()
        if self._poster is not None:
            await asyncio.gather(self._poster, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
