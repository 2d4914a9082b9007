"""Several hosts sharing one PostgreSQL serve as one: a session spans hosts behind a balancer."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import HttpPeer, demo_host
from tests.fixtures.demo_tools import TOOLS
from tests.store.test_postgres import LosingReplies
from toolmesh import AsyncClient, Host, ToolContext, tool
from toolmesh.models import ToolEvent
from toolmesh.protocol import ToolCallRequest, encode
from toolmesh.store import open_store
from toolmesh.store.postgres import PostgresStore
from toolmesh.transports.http import SESSION_HEADER, HttpChannel, HttpServer

pytestmark = [pytest.mark.network_server]


class SpreadChannel(HttpChannel):
    """What a load balancer does to one client: the session is created on one host, the stream
    held by another, and every message POSTed to the next host in turn."""

    def __init__(self, create: str, stream: str, sends: Sequence[str]) -> None:
        super().__init__(create)
        self.create_url, self.stream_url = create, stream
        self.sends = itertools.cycle(sends)

    async def open(
        self, on_message: Callable[[Any], None], on_close: Callable[[str], None]
    ) -> None:
        status, text = await self._post(f"{self.create_url}/session", b"")
        assert status == 200, text
        self.session_id = json.loads(text)["session_id"]
        self._session = {SESSION_HEADER: self.session_id}
        self.base = self.stream_url
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read(on_message, on_close, opened))
        await opened

    async def send(self, message: Any) -> None:
        self.base = next(self.sends)
        await super().send(message)


class Cluster:
    def __init__(self, url: str) -> None:
        self.url = url
        self.hosts: list[Host] = []
        self.servers: list[HttpServer] = []
        self.urls: list[str] = []

    async def start(self, count: int) -> None:
        for index in range(count):
            host = demo_host(None, store=self.url, host_id=f"host{index}")
            server = HttpServer(host, "127.0.0.1:0")
            self.urls.append(await server.start())
            self.hosts.append(host)
            self.servers.append(server)

    async def client(self, create: int, stream: int, sends: Sequence[int], **options: Any) -> Any:
        channel = SpreadChannel(self.urls[create], self.urls[stream], [self.urls[i] for i in sends])
        client = AsyncClient(channel, agent_id=options.pop("agent_id", "tester"), **options)
        await client.start()
        return client

    async def stop(self) -> None:
        for server, host in zip(self.servers, self.hosts, strict=True):
            await server.stop()
            await host.close()


@pytest.fixture
async def cluster(postgres_url: str) -> AsyncIterator[Cluster]:
    running = Cluster(postgres_url)
    await running.start(3)
    yield running
    await running.stop()


async def audit_of(url: str) -> list[Any]:
    store = open_store(url)
    await store.open()
    try:
        return list(reversed(await store.recent_audit(limit=1000)))
    finally:
        await store.close()


async def test_a_session_created_on_one_host_is_served_by_all(cluster: Cluster) -> None:
    client = await cluster.client(create=0, stream=1, sends=[2, 0, 1])
    tools = await client.list_tools()
    assert "count" in {t.name for t in tools}
    events: list[ToolEvent] = []
    results = [await client.call_tool("count", {"n": 3}, on_event=events.append) for _ in range(3)]
    assert all(r.success and r.data == {"counted": 3} for r in results), results
    assert [e.seq for e in events] == [0, 1, 2] * 3  # each call's events, in order, before it
    await client.close()
    audit = await audit_of(cluster.url)
    assert [e.tool_name for e in audit] == ["count"] * 3  # once each
    assert {e.host_id for e in audit} == {"host0", "host1", "host2"}  # run where they arrived


async def test_state_patches_from_different_hosts_are_never_lost(cluster: Cluster) -> None:
    client = await cluster.client(create=0, stream=0, sends=[0, 1, 2])
    keys = [f"k{i}" for i in range(24)]
    results = await asyncio.gather(
        *(client.call_tool("remember", {"key": k, "value": k}) for k in keys)
    )
    assert all(r.success for r in results), [r.error for r in results if not r.success]
    state, version = await client.get_state()
    assert state["context"] == {k: k for k in keys}
    assert version == len(keys)
    await client.close()


async def test_no_host_hands_out_a_stale_document(cluster: Cluster) -> None:
    client = await cluster.client(create=0, stream=0, sends=[0, 1])
    for value in ("one", "two", "three", "four"):
        # each write lands on one host, the read after it on the other
        assert (await client.call_tool("remember", {"key": "k", "value": value})).success
        assert (await client.call_tool("recall", {"key": "k"})).data == value
    await client.close()


async def test_an_approval_is_answered_through_another_host(cluster: Cluster) -> None:
    async def approve(event: ToolEvent) -> bool:
        return True

    # sends alternate: the call reaches host 1, the answer host 2
    client = await cluster.client(create=0, stream=0, sends=[2, 1], on_approval=approve)
    result = await client.call_tool("deploy", {"env": "prod"})
    assert result.success, result.error
    await client.close()
    (entry,) = await audit_of(cluster.url)
    assert entry.host_id == "host1" and entry.decision.endswith("approval:approved")


async def test_a_new_stream_on_another_host_takes_over(cluster: Cluster) -> None:
    client = await cluster.client(create=0, stream=0, sends=[1])
    assert (await client.call_tool("echo", {"text": "a"})).data == "a"
    old_stream = client._channel._reader
    headers = {SESSION_HEADER: client.session_id}
    call = ToolCallRequest(id="r2", tool_name="echo", arguments={"text": "b"})
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("GET", f"{cluster.urls[2]}/stream", headers=headers) as stream,
    ):
        await asyncio.wait_for(asyncio.shield(old_stream), 10)  # host 0 ended its stream
        await http.post(f"{cluster.urls[1]}/send", headers=headers, content=encode(call))
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                answer = json.loads(line[5:])
                break
    assert (answer["type"], answer["req_id"], answer["data"]["data"]) == (
        "tool/call/resp",
        "r2",
        "b",
    )
    await client.close()


async def test_a_stream_held_here_keeps_its_backlog_bound(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events for a stream this host holds went into its queue without the one-host bound."""
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", 2_000)
    client = await cluster.client(create=0, stream=0, sends=[0])
    streamed: list[ToolEvent] = []
    result = await client.call_tool("count", {"n": 300}, streaming=True, on_event=streamed.append)
    await client.close()
    assert result.success and result.data == {"counted": 300}
    notes = [e for e in streamed if e.kind == "log"]
    assert len(notes) == 1 and "further events are dropped" in notes[0].data["message"]
    assert 5 < len(streamed) < 100  # the 300 events were emitted at once: most were dropped


async def test_an_unknown_session_is_refused_by_every_host(cluster: Cluster) -> None:
    async with httpx.AsyncClient() as http:
        for url in cluster.urls:
            answer = await http.post(f"{url}/send", headers={SESSION_HEADER: "nope"}, content=b"{}")
            assert answer.status_code == 404


async def test_replies_the_store_loses_neither_double_nor_lose_messages(cluster: Cluster) -> None:
    """Every store operation of every host commits, then its reply is lost (the connection
    drops) and it is retried: a retried post queued the events and answers twice, a retried
    take lost what the first try had taken (the call never got its answer)."""
    losing = [LosingReplies(host.store) for host in cluster.hosts]  # type: ignore[arg-type]
    client = await cluster.client(create=0, stream=1, sends=[2, 0])
    events: list[ToolEvent] = []
    results = [
        await client.call_tool("count", {"n": 3}, on_event=events.append, timeout=20)
        for _ in range(2)
    ]
    assert all(r.success and r.data == {"counted": 3} for r in results), results
    assert [e.seq for e in events] == [0, 1, 2] * 2  # each once, in order
    await client.close()
    assert all(loser.lost for loser in losing)
    for loser in losing:
        loser.active = False
    audit = await audit_of(cluster.url)
    # (the handshake went to host 2, then the calls to host 0 and host 2): each audited once
    assert [(e.tool_name, e.host_id) for e in audit] == [("count", "host0"), ("count", "host2")]


async def test_a_handshake_with_nul_in_its_agent_id_is_refused_not_a_server_error(
    cluster: Cluster,
) -> None:
    """PostgreSQL refuses U+0000 in text: saving the session failed, and POST /send answered
    500 with no handshake answer on the stream."""
    http = httpx.AsyncClient(timeout=30)
    session_id = (await http.post(f"{cluster.urls[0]}/session")).json()["session_id"]
    peer = HttpPeer(cluster.urls[0], http, session_id)
    try:
        await peer.send_line(
            b'{"type":"handshake/req","id":"hs","agent_id":"a\\u0000b","agent_caps":["tools"]}'
        )  # (answered 200)
        answer = await peer.next_message()
        assert (answer["type"], answer["ok"]) == ("handshake/resp", False)
        assert answer["reason"] == "agent_id must not hold NUL (\\u0000)"
    finally:
        await peer.close()


async def first_message(stream: httpx.Response) -> dict[str, Any]:
    async for line in stream.aiter_lines():
        if line.startswith("data:"):
            return dict(json.loads(line[5:]))
    raise AssertionError("the stream ended")


async def test_messages_a_dead_host_claimed_reach_the_stream_without_other_mail(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host claimed a message for the session's stream and died before deleting it: the
    host holding the stream took it only when another message came for the session (which
    may never come: it was a call's answer, say). It is taken once the claim expires."""
    monkeypatch.setattr("toolmesh.store.postgres.CLAIM_TIMEOUT", 0.5)
    async with httpx.AsyncClient(timeout=30) as http:
        session_id = (await http.post(f"{cluster.urls[0]}/session")).json()["session_id"]
        db = await asyncpg.connect(cluster.url)
        try:  # the claim of a take that never deleted
            await db.execute(
                "INSERT INTO mailbox (session_id, message, posted_at, claim, claimed_at) "
                "VALUES ($1, $2, $3, 'dead host', extract(epoch FROM statement_timestamp()))",
                session_id,
                b'{"note": "claimed by a host that died"}',
                time.time(),
            )
        finally:
            await db.close()
        headers = {SESSION_HEADER: session_id}
        async with http.stream("GET", f"{cluster.urls[1]}/stream", headers=headers) as stream:
            message = await asyncio.wait_for(first_message(stream), 20)
    assert message == {"note": "claimed by a host that died"}


async def sent(url: str, session_id: str, http: httpx.AsyncClient, **message: Any) -> Any:
    return await http.post(
        f"{url}/send", headers={SESSION_HEADER: session_id}, content=json.dumps(message)
    )


async def answered(server: HttpServer, session_id: str, *req_ids: str) -> None:
    """Return once the host has answered the calls ``req_ids`` it runs for the session, and
    posted to the mailbox everything it had to."""
    sessions: Any = server._sessions
    running = sessions.peers[session_id].connection._calls
    await asyncio.gather(*(running[i] for i in req_ids if i in running))
    while sessions._poster is not None and not sessions._poster.done():
        await asyncio.shield(sessions._poster)


def call(req_id: str, tool_name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "type": "tool/call/req",
        "id": req_id,
        "tool_name": tool_name,
        "arguments": arguments,
        "streaming": True,
    }


HANDSHAKE = {"type": "handshake/req", "id": "hs", "agent_id": "a", "agent_caps": ["tools"]}
LONG = "x" * 5_000  # (echo answers at once: its answer is sent before POST /send returns)


async def test_a_backlog_in_the_mailbox_is_bounded_as_on_one_host(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose stream no host held: every answer went to the mailbox, without limit
    (one host answers 429 past MAX_UNSENT_BYTES, and drops events that are only streamed)."""
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", 2_000)
    gate = asyncio.Event()

    @tool
    async def chatter(ctx: ToolContext, n: int) -> str:
        """Reports once, waits for the test, then reports n times at once."""
        ctx.progress(0, "started")
        await gate.wait()
        for i in range(n):
            ctx.progress(i, f"step {i}")
        return "done"

    hosts = [
        Host(*TOOLS, chatter, store=postgres_url, host_id=f"h{i}", capabilities=["demo"])
        for i in range(2)
    ]
    servers = [HttpServer(host, "127.0.0.1:0") for host in hosts]
    first, second = [await server.start() for server in servers]
    http = httpx.AsyncClient(timeout=30)
    stream: HttpPeer | None = None
    try:
        session_id = (await http.post(f"{first}/session")).json()["session_id"]
        for message in (HANDSHAKE, call("c1", "chatter", n=50), call("c2", "echo", text=LONG)):
            assert (await sent(second, session_id, http, **message)).status_code == 200
        await answered(servers[1], session_id, "c2")  # over 2,000 bytes wait in the mailbox
        refused = await sent(second, session_id, http, **call("c3", "echo", text="x"))
        assert refused.status_code == 429 and "wait for GET /stream" in refused.json()["error"]
        gate.set()  # c1's 50 events come while the backlog is past the limit
        await answered(servers[1], session_id, "c1")
        stream = HttpPeer(first, http, session_id)
        answers = [await stream.next_message()]
        while answers[-1].get("req_id") != "c1" or answers[-1]["type"] != "tool/call/resp":
            answers.append(await stream.next_message())
        events = [m for m in answers if m["type"] == "tool/event" and m["req_id"] == "c1"]
        assert [e["kind"] for e in events] == ["progress", "log"]  # the first, then the note
        assert "further events are dropped" in events[1]["data"]["message"]
        assert answers[-1]["data"]["success"] is True
        # the stream read what waited: the host counts again, and takes calls again
        assert (
            await sent(second, session_id, http, **call("c4", "echo", text="y"))
        ).status_code == 200
        answer = await stream.next_message()
        assert (answer["req_id"], answer["data"]["data"]) == ("c4", "y")
    finally:
        gate.set()
        if stream is not None:
            await stream.close()
        await http.aclose()
        for server, host in zip(servers, hosts, strict=True):
            await server.stop()
            await host.close()


async def test_a_stream_nobody_reads_leaves_the_backlog_where_every_host_sees_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host holding the stream took every message from the mailbox into its queue, read
    or not: the other hosts saw an empty mailbox and took calls without limit."""
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", 2_000)
    holder, other = cluster.urls[0], cluster.urls[1]
    async with httpx.AsyncClient(timeout=30) as http:
        session_id = (await http.post(f"{holder}/session")).json()["session_id"]
        sessions: Any = cluster.servers[0]._sessions
        peer = sessions.peers[session_id]
        owner = peer.stream_owner = object()  # a GET /stream whose client does not read
        sessions.attached(peer)
        try:
            assert (await sent(holder, session_id, http, **HANDSHAKE)).status_code == 200
            assert (
                await sent(holder, session_id, http, **call("c1", "echo", text=LONG))
            ).status_code == 200
            await answered(cluster.servers[0], session_id, "c1")  # its queue is past the limit
            assert (
                await sent(other, session_id, http, **call("c2", "echo", text=LONG))
            ).status_code == 200
            await answered(cluster.servers[1], session_id, "c2")  # it stays in the mailbox
            refused = await sent(other, session_id, http, **call("c3", "echo", text="x"))
            assert refused.status_code == 429
            while not peer.queue.empty():  # the stream reads what its host holds
                peer.queue.get_nowait()
            answer = await asyncio.wait_for(peer.queue.get(), 10)  # then what waited
            assert b'"req_id":"c2"' in answer
            assert (
                await sent(other, session_id, http, **call("c4", "echo", text="y"))
            ).status_code == 200
        finally:
            if peer.stream_owner is owner:
                peer.stream_owner = None
                sessions.detached(peer)


async def test_events_a_stream_on_another_host_has_read_are_not_counted_as_a_backlog(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host running a call reckoned what waited in the mailbox as its last count plus what
    it posted since, though the stream's host had collected it: a client reading its stream
    promptly lost the events of a call whose host counted a post before the stream took it."""
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", 2_000)
    streamed: list[ToolEvent] = []
    arrived = asyncio.Event()

    async def streamed_at_least(count: int) -> None:
        while len(streamed) < count:
            arrived.clear()
            await arrived.wait()

    @tool
    async def pair_then_more(ctx: ToolContext) -> str:
        """Two events at once (more than the limit together), then three, one at a time."""
        gate.armed = True
        ctx.log("pair " + "a" * 1_000)
        ctx.log("pair " + "b" * 1_000)  # posted with the first, and counted by their post
        await streamed_at_least(2)  # the client read both: nothing waits any more
        for i in range(3):
            ctx.log(f"more {i}")
            await streamed_at_least(3 + i)
        return "done"

    hosts = [
        Host(*TOOLS, pair_then_more, store=postgres_url, host_id=f"h{i}", capabilities=["demo"])
        for i in range(2)
    ]
    gate = TakesAfterCountedPost(hosts[0].store, hosts[1].store, b'"pair b')  # type: ignore[arg-type]
    servers = [HttpServer(host, "127.0.0.1:0") for host in hosts]
    urls = [await server.start() for server in servers]
    client = AsyncClient(SpreadChannel(urls[0], urls[0], [urls[1]]), agent_id="tester")
    await client.start()

    def on_event(event: ToolEvent) -> None:
        streamed.append(event)
        arrived.set()

    try:
        result = await client.call_tool("pair_then_more", {}, on_event=on_event, timeout=30)
    finally:
        await client.close()
        for server, host in zip(servers, hosts, strict=True):
            await server.stop()
            await host.close()
    assert result.success, result
    assert gate.counted.is_set()  # (the pair's post counted both, before they were taken)
    messages = [e.data["message"] for e in streamed]
    assert not any("dropped" in m for m in messages), messages[2:]
    assert messages[2:] == ["more 0", "more 1", "more 2"]


async def test_events_the_calls_host_has_not_posted_yet_count_in_the_backlog(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the call's host holds for the mailbox is known for sure (no count needed): a burst
    emitted at once, before any of it reached the store, is bounded as on one host."""
    monkeypatch.setattr("toolmesh.transports.http.MAX_UNSENT_BYTES", 2_000)

    @tool
    async def burst(ctx: ToolContext) -> str:
        """Fifty events at once: none reaches the store before the last is emitted."""
        for i in range(50):
            ctx.log(f"event {i} " + "x" * 100)
        return "done"

    hosts = [
        Host(*TOOLS, burst, store=postgres_url, host_id=f"h{i}", capabilities=["demo"])
        for i in range(2)
    ]
    servers = [HttpServer(host, "127.0.0.1:0") for host in hosts]
    urls = [await server.start() for server in servers]
    client = AsyncClient(SpreadChannel(urls[0], urls[0], [urls[1]]), agent_id="tester")
    await client.start()
    streamed: list[ToolEvent] = []
    try:
        result = await client.call_tool("burst", {}, on_event=streamed.append, timeout=30)
    finally:
        await client.close()
        for server, host in zip(servers, hosts, strict=True):
            await server.stop()
            await host.close()
    assert result.success and len(result.events) == 50
    messages = [e.data["message"] for e in streamed]
    assert "further events are dropped" in messages[-1]
    assert messages[:-1] == [f"event {i} " + "x" * 100 for i in range(len(messages) - 1)]
    assert 5 < len(messages) < 20


class TakesAfterCountedPost:
    """Once ``armed``, the stream's host takes its mail only after the post of the message
    holding ``marker`` has counted what waits (as when the stream's host is a little slower
    than the post): that count finds what the stream then takes at once."""

    def __init__(
        self, stream_store: PostgresStore, call_store: PostgresStore, marker: bytes
    ) -> None:
        self.armed = False
        self.counted = asyncio.Event()
        self.marker = marker
        self._take_mail, self._post_messages = stream_store.take_mail, call_store.post_messages
        stream_store.take_mail = self.take_mail  # type: ignore[method-assign]
        call_store.post_messages = self.post_messages  # type: ignore[method-assign]

    async def take_mail(self, session_id: str, claim: str = "") -> Any:
        if self.armed:
            await self.counted.wait()
        return await self._take_mail(session_id, claim)

    async def post_messages(
        self, session_ids: Sequence[str], messages: Sequence[bytes], count: Any = ()
    ) -> dict[str, int]:
        waiting = await self._post_messages(session_ids, messages, count)
        if count and any(self.marker in message for message in messages):
            self.counted.set()
        return waiting
