"""State documents: atomic JSON Patch, path limits, persistence across restarts, concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import Served, demo_host
from toolmesh import (
    HandshakeError,
    Output,
    ToolContext,
    ToolErrorCode,
    Toolkit,
    connect_async,
    tool,
)


async def test_state_round_trip_over_every_transport(served: Served) -> None:
    client = served.client
    assert await client.get_state() == ({"context": {}}, 0)
    result = await client.call_tool("remember", {"key": "color", "value": "teal"})
    assert result.success and [e.kind for e in result.events] == ["activity", "state"]
    assert result.events[1].data == {
        "delta": [{"op": "add", "path": "/context/color", "value": "teal"}],
        "version": 1,
    }
    assert (await client.call_tool("recall", {"key": "color"})).output == "teal"
    assert await client.get_state() == ({"context": {"color": "teal"}}, 1)


async def test_state_survives_a_host_restart(tmp_path: Path) -> None:
    audit = tmp_path / "audit.db"
    first = demo_host(audit)
    client = await connect_async(first, agent_id="keeper")
    await client.call_tool("remember", {"key": "k", "value": "v"})
    session_id = client.session_id
    await client.close()
    await first.close()

    second = demo_host(audit)
    resumed = await connect_async(second, agent_id="keeper", session_id=session_id)
    assert resumed.session_id == session_id
    assert (await resumed.call_tool("recall", {"key": "k"})).output == "v"
    assert await resumed.get_state() == ({"context": {"k": "v"}}, 1)
    await resumed.close()
    await second.close()


async def test_resuming_someone_elses_session_is_refused(tmp_path: Path) -> None:
    host = demo_host(tmp_path / "a.db")
    owner = await connect_async(host, agent_id="owner")
    with pytest.raises(HandshakeError, match="another agent"):
        await connect_async(host, agent_id="intruder", session_id=owner.session_id)
    await owner.close()
    await host.close()


async def test_hundred_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    gate = asyncio.Event()

    @tool
    async def bump(ctx: ToolContext, n: int) -> Output:
        """Append n after waiting at the gate (all calls overlap)."""
        await gate.wait()
        return Output(n, state_update=[{"op": "add", "path": "/context/items/-", "value": n}])

    @tool
    def start() -> Output:
        """Create the list."""
        return Output("ok", state_update=[{"op": "add", "path": "/context/items", "value": []}])

    toolkit = Toolkit(bump, start, store=tmp_path / "s.db")
    await toolkit.execute("start")
    calls = [asyncio.ensure_future(toolkit.execute("bump", {"n": i})) for i in range(100)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*calls)
    assert all(r.success for r in results)
    document = await toolkit.state.snapshot(toolkit.session.id)
    assert sorted(document["context"]["items"]) == list(range(100))
    reopened = Toolkit(store=tmp_path / "s.db")
    record = await reopened.store.load_state(toolkit.session.id)
    assert record is not None and record.version == 101
    await toolkit.close()


async def test_a_failing_test_op_leaves_the_state_alone() -> None:
    @tool
    def guarded() -> Output:
        """Only if n is 1."""
        return Output(
            "x",
            state_update=[
                {"op": "test", "path": "/context/n", "value": 1},
                {"op": "add", "path": "/context/m", "value": 2},
            ],
        )

    toolkit = Toolkit(guarded)
    result = await toolkit.execute("guarded")
    assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
    assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {}}
    assert demo_host  # the module also uses the demo host


@tool
def rawpatch(patch: list[dict[str, object]]) -> Output:
    """Return the given patch as the state update."""
    return Output("ok", state_update=patch)


@pytest.mark.parametrize(
    "op",
    [
        {"op": "replace", "path": "/context", "value": "clobbered"},
        {"op": "remove", "path": "/context"},
        {"op": "add", "path": "/context", "value": {}},
        {"op": "move", "from": "/context", "path": "/context/inner"},
    ],
)
async def test_the_context_container_itself_cannot_be_replaced_or_removed(
    op: dict[str, object],
) -> None:
    async with Toolkit(rawpatch) as toolkit:
        await toolkit.execute(
            "rawpatch", {"patch": [{"op": "add", "path": "/context/a", "value": 1}]}
        )
        refused = await toolkit.execute("rawpatch", {"patch": [op]})
        assert refused.error_code == ToolErrorCode.INVALID_STATE_UPDATE
        assert "'/context' is the container itself" in (refused.error or "")
        later = await toolkit.execute(
            "rawpatch", {"patch": [{"op": "add", "path": "/context/b", "value": 2}]}
        )
        assert later.success  # the document is still usable
        assert await toolkit.state.snapshot(toolkit.session.id) == {"context": {"a": 1, "b": 2}}


@pytest.mark.parametrize("prefix", ["/context/", "/context"])
async def test_a_state_prefix_means_strictly_under_it_with_or_without_the_slash(
    prefix: str,
) -> None:
    async with Toolkit(rawpatch, state_paths=[prefix]) as toolkit:
        for path, allowed in [
            ("/context/a", True),
            ("/context", False),
            ("/contextual", False),
            ("/other", False),
        ]:
            op = {"op": "add", "path": path, "value": 1}
            result = await toolkit.execute("rawpatch", {"patch": [op]})
            assert result.success is allowed, (path, result.error)
            if not allowed:
                assert result.error_code == ToolErrorCode.INVALID_STATE_UPDATE
                assert repr(path) in (result.error or "")
