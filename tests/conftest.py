"""Shared fixtures. ``served`` runs a test against the same host over every transport."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.demo_tools import RELEASE, TOOLS
from tests.fixtures.postgres import PostgresCluster, find_bin_dir, running_cluster
from toolmesh import AsyncClient, Host, Limits, connect_async
from toolmesh.protocol import encode
from toolmesh.transports.http import HttpServer

REPO = Path(__file__).resolve().parent.parent
HOST_CAPABILITIES = ["demo"]
MAX_PARALLEL = 2
MAX_MESSAGE_BYTES = 1024 * 1024
APPROVAL_TIMEOUT = 1.0


def toolmesh_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "toolmesh", *args]


def serve_stdio_command(audit: Path, *extra: str) -> list[str]:
    return toolmesh_command(
        "serve",
        "--stdio",
        "--tools",
        "tests.fixtures.demo_tools:TOOLS",
        "--audit",
        str(audit),
        "--capability",
        "demo",
        "--max-parallel",
        str(MAX_PARALLEL),
        "--max-message-bytes",
        str(MAX_MESSAGE_BYTES),
        "--approval-timeout",
        str(APPROVAL_TIMEOUT),
        *extra,
    )


@dataclass
class Served:
    """A connected client and where its host writes the audit log."""

    client: AsyncClient
    audit: Path
    transport: str
    host: Host | None = None

    async def finish(self) -> None:
        """End the session and stop the host, so its audit file is complete."""
        await self.client.close()
        if self.host is not None:
            await self.host.close()

    def audit_rows(self) -> list[dict[str, Any]]:
        db = sqlite3.connect(self.audit)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute("SELECT * FROM audit ORDER BY id")]
        finally:
            db.close()


def demo_host(audit: Path | str | None, **options: Any) -> Host:
    settings: dict[str, Any] = {
        "capabilities": HOST_CAPABILITIES,
        "max_parallel": MAX_PARALLEL,
        "max_message_bytes": MAX_MESSAGE_BYTES,
        "limits": Limits(approval_timeout=APPROVAL_TIMEOUT),
        **options,
    }
    return Host(*TOOLS, audit=audit, **settings)


@pytest.fixture(params=["inprocess", "stdio", "http"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    """A client connected to the demo host over each transport in turn."""
    RELEASE.clear()
    audit = tmp_path / "audit.db"
    transport = request.param
    if transport == "stdio":
        client = await connect_async(serve_stdio_command(audit), agent_id="tester")
        yield Served(client, audit, transport)
        await client.close()
        return
    host = demo_host(audit)
    if transport == "inprocess":
        client = await connect_async(host, agent_id="tester")
        yield Served(client, audit, transport, host)
        await client.close()
        await host.close()
        return
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    client = await connect_async(url, agent_id="tester")
    yield Served(client, audit, transport, host)
    await client.close()
    await server.stop()
    await host.close()
    RELEASE.set()


@pytest.fixture(autouse=True)
def _release_blocked_tools() -> Any:
    yield
    RELEASE.set()  # let threads of tools that ignored their deadline finish


class RawPeer:
    """Speaks raw NDJSON lines to a host and reads raw JSON messages back."""

    async def send_line(self, line: bytes) -> None:
        raise NotImplementedError

    async def next_message(self) -> dict[str, Any]:
        raise NotImplementedError

    async def send(self, **message: Any) -> None:
        await self.send_line(json.dumps(message).encode())

    async def handshake(self, **extra: Any) -> dict[str, Any]:
        await self.send(
            type="handshake/req", id="hs-1", agent_id="raw", agent_caps=["tools"], **extra
        )
        return await self.next_message()

    async def close(self) -> None:
        pass


class InProcessPeer(RawPeer):
    def __init__(self, host: Host) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.connection = host.connect(lambda m: self.queue.put_nowait(encode(m)))

    async def send_line(self, line: bytes) -> None:
        await self.connection.receive_line(line)

    async def next_message(self) -> dict[str, Any]:
        return dict(json.loads(await asyncio.wait_for(self.queue.get(), 30)))

    async def close(self) -> None:
        await self.connection.close()


class StdioPeer(RawPeer):
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def send_line(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        await self.process.stdin.drain()

    async def next_message(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert line, "the host closed its stdout"
        return dict(json.loads(line))

    async def close(self) -> None:
        """Go away as a crashed client would: the host cancels what runs and exits."""
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


class HttpPeer(RawPeer):
    def __init__(self, url: str, client: httpx.AsyncClient, session_id: str) -> None:
        self.url = url
        self.client = client
        self.session_id = session_id
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        headers = {"X-Session-Id": self.session_id, "Accept": "text/event-stream"}
        async with self.client.stream("GET", f"{self.url}/stream", headers=headers) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    self.queue.put_nowait(line[6:].encode())

    async def send_line(self, line: bytes) -> None:
        response = await self.client.post(
            f"{self.url}/send",
            content=line,
            headers={"X-Session-Id": self.session_id, "Content-Type": "text/plain"},
        )
        assert response.status_code == 200 and response.json() == {"ok": True}

    async def next_message(self) -> dict[str, Any]:
        return dict(json.loads(await asyncio.wait_for(self.queue.get(), 30)))

    async def close(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.client.aclose()


@pytest.fixture(params=["inprocess", "stdio", "http"])
async def raw(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RawPeer]:
    """A raw NDJSON peer of the demo host over each transport (no handshake done yet)."""
    RELEASE.clear()
    audit = tmp_path / "audit.db"
    peer: RawPeer
    if request.param == "stdio":
        process = await asyncio.create_subprocess_exec(
            *serve_stdio_command(audit),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,
        )
        peer = StdioPeer(process)
        yield peer
        await peer.close()
        return
    host = demo_host(audit)
    if request.param == "inprocess":
        await host.start()
        peer = InProcessPeer(host)
        yield peer
        await peer.close()
        await host.close()
        return
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    http = httpx.AsyncClient(timeout=30)
    session_id = (await http.post(f"{url}/session")).json()["session_id"]
    peer = HttpPeer(url, http, session_id)
    yield peer
    await peer.close()
    await server.stop()
    await host.close()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One private PostgreSQL for the whole run (127.0.0.1, a free port, a temporary folder)."""
    if find_bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (make setup installs it)")
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """The URL of a new, empty database of the shared cluster."""
    return postgres_cluster.create()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster for the whole run (127.0.0.1; stopped at the end)."""
    from tests.fixtures.ray_cluster import local_ray, ray_is_installed

    if not ray_is_installed():  # (without importing it: see local_ray)
        pytest.skip("Ray is not installed (the ray extra)")
    with local_ray() as ray:
        yield ray
