"""The seed's ToolAPI (blocking) and AsyncToolAPI over every kind of target."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import demo_host, serve_stdio_command
from toolmesh import (
    AsyncToolAPI,
    HandshakeError,
    Host,
    ToolAPI,
    TransportError,
    connect,
    connect_async,
)
from toolmesh.models import ToolEvent
from toolmesh.transports.http import HttpServer


def test_toolapi_in_process(tmp_path: Path) -> None:
    client = connect(demo_host(tmp_path / "a.db"), agent_id="sync")
    tools = ToolAPI(client)
    listed = tools.list()
    assert "echo" in [t.name for t in listed]
    assert client._tools_cache is listed and tools.list() is listed  # cached
    assert tools.list(query="github", include_deferred=True)[0].name == "github_search"
    events: list[ToolEvent] = []
    result = tools.call(
        "read_file", {"path": "/etc/hostname"}, streaming=True, on_event=events.append
    )
    assert result.data == {"content": "my-host"} and len(events) == 1
    assert tools.call("echo", {"text": "hi"}, correlation_id="c1").output == "hi"
    client.close()


def test_toolapi_over_stdio(tmp_path: Path) -> None:
    with connect(serve_stdio_command(tmp_path / "a.db"), agent_id="sync") as client:
        tools = ToolAPI(client)
        assert tools.call("add", {"a": 1, "b": 2}).data == 3
        assert [t.name for t in tools.list(tags=["fs"])] == ["read_file"]


async def test_async_toolapi_over_http(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    try:
        client = await connect_async(url, agent_id="async")
        tools = AsyncToolAPI(client)
        results = await asyncio.gather(*(tools.call("add", {"a": i, "b": 1}) for i in range(10)))
        assert [r.data for r in results] == [i + 1 for i in range(10)]
        await client.close()
    finally:
        await server.stop()
        await host.close()


async def test_async_toolapi_accepts_a_blocking_client(tmp_path: Path) -> None:
    client = await asyncio.to_thread(connect, demo_host(tmp_path / "a.db"))
    try:
        assert (await AsyncToolAPI(client).call("echo", {"text": "bridged"})).output == "bridged"
    finally:
        await asyncio.to_thread(client.close)


def test_toolapi_refuses_an_async_client(tmp_path: Path) -> None:
    async def make() -> object:
        return await connect_async(demo_host(None))

    client = asyncio.run(make())
    with pytest.raises(TypeError, match="AsyncToolAPI"):
        ToolAPI(client)  # type: ignore[arg-type]


def test_wrong_auth_token_is_refused() -> None:
    with pytest.raises(HandshakeError, match="auth_token"):
        connect(Host(demo_host(None).toolkit, auth_token="s3cret"), auth_token="guess")
    ok = connect(Host(demo_host(None).toolkit, auth_token="s3cret"), auth_token="s3cret")
    ok.close()


def test_unreachable_targets_are_clear_errors() -> None:
    with pytest.raises(TransportError, match="cannot reach"):
        connect("http://127.0.0.1:9")
    with pytest.raises(TransportError, match="cannot start"):
        connect(["/nonexistent/toolmesh-host"])
    with pytest.raises(TransportError, match="cannot connect"):
        connect(42)  # type: ignore[arg-type]


def test_host_process_that_dies_fails_pending_calls(tmp_path: Path) -> None:
    with pytest.raises((TransportError, HandshakeError)):
        connect(["python3", "-c", "import sys; sys.stdin.readline()"])
