"""Approvals over every transport: approve, deny, nobody answers; decisions audited."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import APPROVAL_TIMEOUT, RawPeer, demo_host, serve_stdio_command
from toolmesh import AsyncClient, Host, Limits, ToolErrorCode, ToolEvent, connect_async
from toolmesh.transports.http import HttpServer


@dataclass
class Approving:
    client: AsyncClient
    audit: Path
    answers: list[bool | None]
    seen: list[ToolEvent]
    host: Host | None = None

    async def finish(self) -> None:
        """End the session and stop the host, so its audit file is complete."""
        await self.client.close()
        if self.host is not None:
            await self.host.close()


@pytest.fixture(params=["inprocess", "stdio", "http"])
async def approving(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Approving]:
    audit = tmp_path / "audit.db"
    answers: list[bool | None] = []
    seen: list[ToolEvent] = []

    async def on_approval(event: ToolEvent) -> bool:
        seen.append(event)
        answer = answers.pop(0)
        if answer is None:  # nobody answers
            import asyncio

            await asyncio.Event().wait()
        return bool(answer)

    if request.param == "stdio":
        client = await connect_async(serve_stdio_command(audit), on_approval=on_approval)
        yield Approving(client, audit, answers, seen)
        await client.close()
        return
    host = demo_host(audit)
    server = None
    if request.param == "http":
        server = HttpServer(host, "127.0.0.1:0")
        target: Any = await server.start()
    else:
        target = host
    client = await connect_async(target, on_approval=on_approval)
    yield Approving(client, audit, answers, seen, host)
    await client.close()
    if server is not None:
        await server.stop()
    await host.close()


async def test_approve_deny_and_no_answer(approving: Approving) -> None:
    client = approving.client
    approving.answers.extend([True, False, None])
    ok = await client.call_tool("deploy", {"env": "staging"})
    assert ok.success and ok.output == "deployed to staging"
    denied = await client.call_tool("deploy", {"env": "prod"})
    assert denied.error_code == ToolErrorCode.TOOL_DENIED and "denied" in (denied.error or "")
    silent = await client.call_tool("deploy", {"env": "moon"})
    assert silent.error_code == ToolErrorCode.TIMEOUT
    assert f"within {APPROVAL_TIMEOUT:g}s" in (silent.error or "")
    asked = approving.seen[0]
    assert asked.kind == "approval" and asked.seq == 0
    assert asked.data["tool_name"] == "deploy" and asked.data["arguments"] == {"env": "staging"}
    await approving.finish()
    rows = (
        sqlite3.connect(approving.audit)
        .execute("SELECT tool_name, success, error_code, decision FROM audit")
        .fetchall()
    )
    assert [r for r in rows if r[0] == "deploy"] == [
        ("deploy", 1, None, "approval:approved"),
        ("deploy", 0, "tool_denied", "approval:denied"),
        ("deploy", 0, "timeout", "approval:timeout"),
    ]


async def test_approval_on_the_wire(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send(type="tool/call/req", id="d1", tool_name="deploy", arguments={"env": "qa"})
    event = await raw.next_message()
    assert (event["type"], event["kind"], event["req_id"], event["seq"]) == (
        "tool/event",
        "approval",
        "d1",
        0,
    )
    assert set(event["data"]) == {"approval_id", "tool_name", "arguments", "reason"}
    await raw.send(
        type="tool/approval/resp", id="a1", req_id=event["data"]["approval_id"], approved=True
    )
    response = await raw.next_message()
    assert response["type"] == "tool/call/resp" and response["data"]["data"] == "deployed to qa"
    assert response["data"]["events"][0]["kind"] == "approval"
    await raw.send(type="tool/approval/resp", id="a2", req_id="nothing-pending", approved=True)
    error = await raw.next_message()
    assert error["type"] == "error" and "nothing-pending" in error["message"]


async def test_in_process_without_an_approver_is_denied_at_once() -> None:
    host = demo_host(None)
    client = await connect_async(host)
    result = await client.call_tool("deploy", {"env": "x"})
    assert result.error_code == ToolErrorCode.TOOL_DENIED and "no approval handler" in (
        result.error or ""
    )
    await client.close()
    await host.close()
    assert json.dumps  # keep the import used for readers of failures


@pytest.mark.parametrize("transport", ["inprocess", "stdio", "http"])
async def test_a_raising_or_non_bool_approval_handler_denies_at_once(
    transport: str, tmp_path: Path
) -> None:
    """Not the approval timeout: a handler that raises, or answers "no", is a denial now."""
    audit = tmp_path / "audit.db"
    answers: list[Any] = [ZeroDivisionError("boom"), "no", 1, True]

    async def on_approval(event: ToolEvent) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    host: Host | None = None
    server: HttpServer | None = None
    target: Any
    if transport == "stdio":
        target = serve_stdio_command(audit)
    else:
        host = demo_host(audit)
        if transport == "http":
            server = HttpServer(host, "127.0.0.1:0")
            target = await server.start()
        else:
            target = host
    client = await connect_async(target, on_approval=on_approval)
    results = [await client.call_tool("deploy", {"env": f"e{i}"}) for i in range(4)]
    await client.close()
    if server is not None:
        await server.stop()
    if host is not None:
        await host.close()
    assert [r.error_code for r in results] == [ToolErrorCode.TOOL_DENIED] * 3 + [None]
    assert results[3].output == "deployed to e3"
    rows = sqlite3.connect(audit).execute("SELECT tool_name, decision FROM audit").fetchall()
    decisions = [d for name, d in rows if name == "deploy"]
    # In-process the pipeline sees the failure itself; over the wire the client answers
    # approved=false, failed=true with the reason, and the host records the same.
    assert "ZeroDivisionError: boom" in (results[0].error or "")
    assert "answered 'no' (str), not True or False" in (results[1].error or "")
    assert decisions == ["approval:failed"] * 3 + ["approval:approved"]


async def test_an_in_process_approver_must_answer_true_to_approve() -> None:
    host = demo_host(None)
    toolkit = host.toolkit
    outcomes = []
    for answer in ("no", "yes", 1, None, [], True, False):

        async def approver(request: Any, answer: Any = answer) -> Any:
            return answer

        result = await toolkit.execute("deploy", {"env": "x"}, on_approval=approver)
        outcomes.append((result.error_code, result.error))
    await host.close()
    assert [code for code, _ in outcomes] == [ToolErrorCode.TOOL_DENIED] * 5 + [
        None,
        ToolErrorCode.TOOL_DENIED,
    ]
    assert outcomes[0][1] == (
        "approval failed: the approver answered 'no' (str), not True or False"
    )
    assert outcomes[6][1] == "the approver denied 'deploy'"


@pytest.mark.parametrize("answer", [True, False])
async def test_toolkit_execute_shows_the_approval_event_first(answer: bool) -> None:
    """As every transport does: the approval event at seq 0 to ``on_event``, and in the result
    whether or not the tool ran."""
    host = demo_host(None)
    seen: list[tuple[int, str]] = []

    async def approver(request: Any) -> bool:
        return answer

    result = await host.toolkit.execute(
        "deploy",
        {"env": "x"},
        on_approval=approver,
        on_event=lambda e: seen.append((e.seq, e.kind)),
    )
    await host.close()
    assert seen[0] == (0, "approval")
    assert [(e.seq, e.kind) for e in result.events][:1] == [(0, "approval")]


async def test_closing_an_in_process_client_ends_its_pending_approval(tmp_path: Path) -> None:
    """The call ends at once, denied and audited, instead of waiting out the approval timeout."""
    import asyncio

    host = demo_host(tmp_path / "audit.db", limits=Limits(approval_timeout=60.0))
    asked = asyncio.Event()

    async def on_approval(event: ToolEvent) -> bool:
        asked.set()
        await asyncio.Event().wait()  # nobody ever answers
        return True

    client = await connect_async(host, on_approval=on_approval)
    call = asyncio.ensure_future(client.call_tool("deploy", {"env": "x"}))
    await asked.wait()
    await client.close()
    async with asyncio.timeout(5.0):  # not the 60 s approval timeout
        result = await call
    await host.close()
    assert result.error_code == ToolErrorCode.TOOL_DENIED
    assert "connection closed before the approval was answered" in (result.error or "")
    rows = sqlite3.connect(tmp_path / "audit.db").execute("SELECT decision FROM audit").fetchall()
    assert rows == [("approval:failed",)]


async def test_a_call_cancelled_while_it_waits_for_approval_is_audited_so() -> None:
    import asyncio

    from tests.fixtures.demo_tools import deploy
    from toolmesh import Toolkit
    from toolmesh.store import MemoryStore

    asked = asyncio.Event()

    async def silent(request: Any) -> bool:
        asked.set()
        await asyncio.Event().wait()  # nobody answers
        return True

    store = MemoryStore()
    kit = Toolkit(deploy, store=store)
    call = asyncio.ensure_future(kit.execute("deploy", {"env": "x"}, on_approval=silent))
    await asked.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    (entry,) = store.audit
    assert (entry.error_code, entry.decision) == ("cancelled", "approval:cancelled")  # was ""


async def test_what_runs_is_what_was_approved() -> None:
    """The approver (or the caller) changing a nested argument while the approval waits used
    to change what the tool ran, after the policy had judged the arguments."""
    from toolmesh import Toolkit, tool

    ran: list[Any] = []

    @tool(requires_approval=True)
    def deploy(target: dict[str, str]) -> str:
        """Deploy somewhere."""
        ran.append(dict(target))
        return "deployed"

    toolkit = Toolkit(deploy)
    nested = {"env": "staging"}

    async def approver(request: Any) -> bool:
        request.arguments["target"]["env"] = "prod"  # an approver changing what it judged
        nested["env"] = "prod"  # and the caller's own dict, changed while the approval waits
        return True

    result = await toolkit.execute("deploy", {"target": nested}, on_approval=approver)
    assert result.success, result.error
    assert ran == [{"env": "staging"}]


async def test_an_approval_asked_behind_others_has_its_full_time_once_shown() -> None:
    """An approver that shows one request at a time (a served A2A task) calls ``shown()`` when
    it shows the next: the approval timeout then runs from there. It ran from the ask, so
    the time a request waited behind others was taken from the time to answer it."""
    import asyncio

    from toolmesh import Toolkit, tool

    @tool(requires_approval=True)
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    async def queued_approver(request: Any) -> bool:
        await asyncio.sleep(0.6)  # behind another request: a slow human's time, not a sync
        request.shown()
        await asyncio.sleep(0.6)  # this one's own answer, within its full second
        return True

    toolkit = Toolkit(deploy, limits=Limits(approval_timeout=1.0))
    result = await toolkit.execute("deploy", on_approval=queued_approver)
    assert result.success, result.error
    unshown = await toolkit.execute(
        "deploy", on_approval=lambda request: asyncio.sleep(1.2, result=True)
    )
    assert unshown.error_code == ToolErrorCode.TIMEOUT  # never shown again: one second it is
