"""Faults of a real cluster: `toolmesh serve --http --store postgresql://...` processes.

- kill -9 of one host mid-call: the other host's clients go on, every call the dead host
  finished is audited once, and no state document is damaged;
- a PostgreSQL restart: the hosts reconnect and keep serving (calls made while it is down
  wait for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import REPO, toolmesh_command
from tests.fixtures.postgres import PostgresCluster
from tests.transports.test_cluster import SpreadChannel
from toolmesh import AsyncClient, connect_async
from toolmesh.errors import TransportError
from toolmesh.models import ToolEvent
from toolmesh.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.network_server]


class HostProcess:
    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url

    @classmethod
    async def start(cls, store: str) -> HostProcess:
        process = await asyncio.create_subprocess_exec(
            *toolmesh_command(
                "serve",
                "--http",
                "127.0.0.1:0",
                "--store",
                store,
                "--tools",
                "tests.fixtures.demo_tools:TOOLS",
                "--tools",
                "tests.fixtures.ray_tools:TOOLS",
            ),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert line.startswith(b"http://"), line
        return cls(process, line.decode().strip())

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


@pytest.fixture
async def two_hosts(postgres_url: str) -> AsyncIterator[list[HostProcess]]:
    hosts = list(
        await asyncio.gather(HostProcess.start(postgres_url), HostProcess.start(postgres_url))
    )
    yield hosts
    for host in hosts:
        await host.stop()


async def stored(url: str) -> tuple[list[Any], dict[str, Any]]:
    """The audit log (oldest first) and every state document, as another host would see them."""
    store = open_store(url)
    await store.open()
    try:
        audit = list(reversed(await store.recent_audit(limit=10_000)))
        states = {}
        for session_id in {entry.session_id for entry in audit}:
            states[session_id] = await store.load_state(session_id)
        return audit, states
    finally:
        await store.close()


async def test_a_host_killed_mid_call_harms_no_other_client(
    two_hosts: list[HostProcess], postgres_url: str
) -> None:
    doomed, survivor = two_hosts
    victim = await connect_async(doomed.url, agent_id="victim")
    bystander = await connect_async(survivor.url, agent_id="bystander")
    for index in range(5):
        assert (await victim.call_tool("remember", {"key": f"v{index}", "value": "x"})).success
        assert (await bystander.call_tool("remember", {"key": f"b{index}", "value": "y"})).success

    running = asyncio.get_running_loop().create_future()

    def started(event: ToolEvent) -> None:
        if not running.done():
            running.set_result(None)

    cut_short = asyncio.ensure_future(
        victim.call_tool("stall", {"seconds": 60}, on_event=started, timeout=60)
    )
    in_flight = [
        asyncio.ensure_future(bystander.call_tool("hold", {"seconds": 0.2})) for _ in range(3)
    ]
    await asyncio.wait_for(running, 30)
    os.kill(doomed.process.pid, signal.SIGKILL)
    await doomed.process.wait()

    with pytest.raises(TransportError):
        await cut_short
    finished = [await call for call in in_flight]
    assert all(result.success for result in finished)
    for index in range(5, 8):  # the other host serves on
        assert (await bystander.call_tool("remember", {"key": f"b{index}", "value": "y"})).success
    with contextlib.suppress(TransportError):
        await victim.close()

    audit, states = await stored(postgres_url)
    victims = [e for e in audit if e.session_id == victim.session_id]
    assert [e.tool_name for e in victims] == ["remember"] * 5  # each finished call, once
    bystanders = [e for e in audit if e.session_id == bystander.session_id]
    assert sorted(e.tool_name for e in bystanders) == ["hold"] * 3 + ["remember"] * 8
    victim_state = states[victim.session_id]
    assert victim_state.document == {"context": {f"v{i}": "x" for i in range(5)}}
    assert victim_state.version == 5
    assert states[bystander.session_id].version == 8
    await bystander.close()


async def test_hosts_reconnect_after_a_postgresql_restart(
    two_hosts: list[HostProcess], postgres_cluster: PostgresCluster
) -> None:
    first, second = two_hosts
    # stream on one host, calls through the other: routing needs the signal connection too
    client = AsyncClient(SpreadChannel(first.url, first.url, [second.url]), agent_id="a")
    await client.start()
    assert (await client.call_tool("remember", {"key": "before", "value": "1"})).success

    postgres_cluster.stop("fast")  # connections are cut; calls made now wait for it
    during = [
        asyncio.ensure_future(client.call_tool("remember", {"key": f"d{i}", "value": "2"}))
        for i in range(3)
    ]
    await asyncio.to_thread(postgres_cluster.start)
    results = [await call for call in during]
    assert all(r.success for r in results), [r.error for r in results]
    for index in range(3):
        result = await client.call_tool("remember", {"key": f"after{index}", "value": "3"})
        assert result.success, result.error
    state, version = await client.get_state()
    assert set(state["context"]) == {"before", "d0", "d1", "d2", "after0", "after1", "after2"}
    assert version == 7
    await client.close()
