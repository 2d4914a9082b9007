"""The host at the wire level: raw NDJSON lines in, raw JSON out, over every transport."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import MAX_MESSAGE_BYTES, MAX_PARALLEL, HttpPeer, RawPeer
from tests.fixtures.demo_tools import TOOLS
from toolmesh import Host
from toolmesh.store import MemoryStore
from toolmesh.transports.http import HttpServer

ENVELOPE = {"type", "id", "version", "ts"}


async def test_handshake_response_shape(raw: RawPeer) -> None:
    response = await raw.handshake()
    assert set(response) == ENVELOPE | {
        "req_id",
        "session_id",
        "accepted_caps",
        "max_parallel",
        "ok",
        "reason",
    }
    assert response["type"] == "handshake/resp" and response["req_id"] == "hs-1"
    assert response["ok"] is True and response["version"] == "1.0"
    assert response["accepted_caps"][0]["capability"] == "tools"
    assert set(response["accepted_caps"][0]) == {"capability", "enabled", "metadata"}
    assert response["max_parallel"] == MAX_PARALLEL
    assert len(response["id"]) == 32 and isinstance(response["ts"], float)


async def test_seed_list_example_round_trip(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send_line(
        b'{"type":"tool/list/req","id":"a1b2c3","version":"1.0","ts":1716123456.789,'
        b'"filter_kind":"","filter_tags":["fs"]}'
    )
    response = await raw.next_message()
    assert set(response) == ENVELOPE | {"req_id", "tools"}
    assert response["type"] == "tool/list/resp" and response["req_id"] == "a1b2c3"
    assert response["tools"] == [
        {
            "name": "read_file",
            "description": "Read file contents",
            "input_parameters": [
                {"name": "path", "type": "string", "description": "File path", "required": True}
            ],
            "output_parameters": [],
            "streaming": True,
            "idempotent": True,
            "tags": ["fs"],
            "version": "1.0.0",
            "toolkit": "seed",
            "kind": "plugin",
        }
    ]


async def test_seed_streaming_call_example(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send_line(
        b'{"type":"tool/call/req","id":"g7h8i9","version":"1.0","ts":1716123457.100,'
        b'"session_id":"","tool_name":"read_file","arguments":{"path":"/etc/hostname"},'
        b'"correlation_id":"","streaming":true,"timeout":30}'
    )
    event = await raw.next_message()
    response = await raw.next_message()
    assert set(event) == ENVELOPE | {"kind", "req_id", "data", "seq"}
    assert (event["type"], event["kind"], event["req_id"], event["seq"]) == (
        "tool/event",
        "progress",
        "g7h8i9",
        0,
    )
    assert event["data"] == {"pct": 50, "message": "Reading..."}
    assert set(response) == ENVELOPE | {"req_id", "data", "created_at"}
    assert response["type"] == "tool/call/resp" and response["req_id"] == "g7h8i9"
    data = dict(response["data"])
    assert data.pop("events")[0]["seq"] == 0
    assert isinstance(data.pop("duration_ms"), int)
    assert data == {"success": True, "tool_name": "read_file", "data": {"content": "my-host"}}


async def test_all_events_precede_the_response(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send(
        type="tool/call/req", id="c1", tool_name="count", arguments={"n": 5}, streaming=True
    )
    kinds = [await raw.next_message() for _ in range(6)]
    assert [m["type"] for m in kinds] == ["tool/event"] * 5 + ["tool/call/resp"]
    assert [m["seq"] for m in kinds[:5]] == [0, 1, 2, 3, 4]


async def test_non_streaming_call_sends_no_event_messages(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send(type="tool/call/req", id="c2", tool_name="count", arguments={"n": 2})
    response = await raw.next_message()
    assert response["type"] == "tool/call/resp"
    assert [e["seq"] for e in response["data"]["events"]] == [0, 1]


@pytest.mark.parametrize(
    ("line", "code", "mentions"),
    [
        (b"this is not json", "parse_error", "not valid JSON"),
        # nesting deep enough that json.loads would raise RecursionError
        (
            b'{"type": "ping", "id": "d", "a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "parse_error",
            "recursion limit",
        ),
        (b"[1, 2]", "invalid_message", "JSON object"),
        (b'{"id": "m1"}', "invalid_message", "no 'type'"),
        (b'{"type": "tool/teleport", "id": "m2"}', "unknown_message_type", "tool/teleport"),
        (b'{"type": "tool/call/req", "id": "m3", "arguments": {}}', "invalid_message", "tool_name"),
        (
            b'{"type": "tool/call/req", "id": "m4", "tool_name": 7, "arguments": {}}',
            "invalid_message",
            "tool_name",
        ),
        (
            b'{"type": "tool/call/req", "id": "m5", "tool_name": "echo", "arguments": "x"}',
            "invalid_message",
            "arguments",
        ),
        (
            b'{"type": "tool/list/req", "id": "m6", "filter_tags": "fs"}',
            "invalid_message",
            "filter_tags",
        ),
        (
            b'{"type": "tool/call/resp", "id": "m7", "data": {"success": true, "tool_name": "x", "duration_ms": 1}}',
            "invalid_message",
            "does not accept",
        ),
    ],
)
async def test_malformed_input_gets_an_error_and_the_session_goes_on(
    raw: RawPeer, line: bytes, code: str, mentions: str
) -> None:
    await raw.handshake()
    await raw.send_line(line)
    error = await raw.next_message()
    assert set(error) == ENVELOPE | {
        "req_id",
        "code",
        "message",
        "detail",
        "retryable",
        "capability_name",
    }
    assert error["type"] == "error" and error["code"] == code
    assert mentions in error["message"]
    if b'"id": "m' in line:
        assert error["req_id"] == line.split(b'"id": "')[1].split(b'"')[0].decode()
    await raw.send(
        type="tool/call/req", id="after", tool_name="echo", arguments={"text": "still here"}
    )
    assert (await raw.next_message())["data"]["data"] == "still here"


async def test_a_number_beyond_a_float_in_the_arguments_is_invalid_arguments(
    raw: RawPeer,
) -> None:
    """1e999 is valid JSON syntax that every parser reads as infinity: the call is refused,
    naming the number's place, instead of the tool running with it."""
    await raw.handshake()
    await raw.send_line(
        b'{"type": "tool/call/req", "id": "inf", "tool_name": "echo",'
        b' "arguments": {"text": "x", "extra": [1, 1e999]}}'
    )
    response = await raw.next_message()
    result = response["data"]
    assert response["req_id"] == "inf" and result["error_code"] == "invalid_arguments"
    assert result["metadata"] == {"path": "$.extra[1]"}
    assert "is inf, which JSON cannot carry" in result["error"]


async def test_oversized_message_is_refused_and_the_session_goes_on(raw: RawPeer) -> None:
    await raw.handshake()
    payload = "x" * (MAX_MESSAGE_BYTES + 10)
    await raw.send(type="tool/call/req", id="huge", tool_name="echo", arguments={"text": payload})
    error = await raw.next_message()
    assert error["code"] == "message_too_large"
    assert error["detail"]["limit"] == MAX_MESSAGE_BYTES
    assert error["req_id"] == "huge"  # read from the message's start: its caller is answered
    await raw.send(type="tool/call/req", id="after", tool_name="echo", arguments={"text": "ok"})
    assert (await raw.next_message())["data"]["data"] == "ok"


async def test_tool_messages_need_a_handshake(raw: RawPeer) -> None:
    await raw.send(type="tool/list/req", id="early")
    error = await raw.next_message()
    assert (error["code"], error["req_id"]) == ("handshake_required", "early")
    assert (await raw.handshake())["ok"] is True


async def test_tool_messages_need_the_tools_capability(raw: RawPeer) -> None:
    await raw.send(type="handshake/req", id="hs", agent_id="raw", agent_caps=["streaming"])
    response = await raw.next_message()
    assert response["ok"] is True and response["accepted_caps"] == []
    await raw.send(type="tool/call/req", id="c", tool_name="echo", arguments={"text": "x"})
    error = await raw.next_message()
    assert error["code"] == "capability_not_negotiated"
    assert error["capability_name"] == "tools"


async def test_second_handshake_is_refused(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send(type="handshake/req", id="again", agent_caps=["tools"])
    error = await raw.next_message()
    assert error["type"] == "error" and error["req_id"] == "again"


async def test_locked_host_refuses_capability_override(raw: RawPeer) -> None:
    response = await raw.handshake(
        capability_override={"strategy": "extend", "capabilities": ["secret"]}
    )
    assert response["ok"] is False and "locked" in response["reason"]
    assert response["max_parallel"] == MAX_PARALLEL  # the host's, not the model's default


async def test_max_parallel_is_enforced_by_the_host(raw: RawPeer) -> None:
    await raw.handshake()
    for i in range(MAX_PARALLEL):
        await raw.send(
            type="tool/call/req",
            id=f"h{i}",
            tool_name="hold",
            arguments={"seconds": 30},
            timeout=60,
        )
    await raw.send(type="tool/call/req", id="extra", tool_name="echo", arguments={"text": "x"})
    error = await raw.next_message()
    assert (error["code"], error["req_id"], error["retryable"]) == (
        "max_parallel_exceeded",
        "extra",
        True,
    )


async def test_duplicate_request_id_is_refused(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send(
        type="tool/call/req", id="same", tool_name="hold", arguments={"seconds": 30}, timeout=60
    )
    await raw.send(type="tool/call/req", id="same", tool_name="echo", arguments={"text": "x"})
    error = await raw.next_message()
    assert (error["code"], error["req_id"]) == ("duplicate_request", "same")


async def test_ping_pong(raw: RawPeer) -> None:
    await raw.send(type="ping", id="p1")
    pong: dict[str, Any] = await raw.next_message()
    assert (pong["type"], pong["req_id"]) == ("pong", "p1")
    assert pong["uptime_seconds"] >= 0


async def test_a_call_a_shutdown_cuts_off_is_answered_as_cancelled(raw: RawPeer) -> None:
    await raw.handshake()
    await raw.send(type="tool/call/req", id="long", tool_name="hold", arguments={"seconds": 60})
    await raw.send(type="shutdown", id="bye", timeout=0)  # no grace: the call is cut off
    answer = await raw.next_message()
    assert answer["type"] == "tool/call/resp" and answer["req_id"] == "long"
    assert answer["data"]["success"] is False and answer["data"]["error_code"] == "cancelled"


async def test_a_blank_query_lists_as_an_empty_one(raw: RawPeer) -> None:
    """A query of spaces was taken for a search, which found nothing: the peer got no tools
    where the empty query lists them all."""
    await raw.handshake()
    await raw.send(type="tool/list/req", id="empty", query="")
    listed = [t["name"] for t in (await raw.next_message())["tools"]]
    await raw.send(type="tool/list/req", id="blank", query="   ")
    blank = await raw.next_message()
    assert listed and [t["name"] for t in blank["tools"]] == listed


@pytest.mark.parametrize("field", ["agent_id", "session_id", "auth_token"])
async def test_a_handshake_with_nul_in_an_id_is_refused_clearly(raw: RawPeer, field: str) -> None:
    """JSON allows U+0000 in a string, which PostgreSQL refuses in text: the session was saved
    on SQLite, and failed with HTTP 500 on PostgreSQL. It is refused on every store."""
    fields = {"agent_id": "raw", field: "a\x00b"}
    await raw.send(type="handshake/req", id="hs-0", agent_caps=["tools"], **fields)
    response = await raw.next_message()
    assert response["ok"] is False
    assert response["reason"] == f"{field} must not hold NUL (\\u0000)"
    assert (await raw.handshake())["ok"] is True  # the connection goes on


class UnreachableStore(MemoryStore):
    """A store whose server went away: reading a session's state fails as a lost connection
    does; the audit is written."""

    async def load_state(self, session_id: str) -> Any:
        raise ConnectionRefusedError("[Errno 111] Connect call failed ('127.0.0.1', 5432)")


async def test_a_call_whose_state_cannot_be_read_is_answered_and_audited() -> None:
    """Before: the store's error escaped the call's task ("Task exception was never
    retrieved"): the peer never got an answer, and nothing was audited."""
    store = UnreachableStore()
    host = Host(*TOOLS, store=store, capabilities=["demo"])
    server = HttpServer(host, "127.0.0.1:0")
    url = await server.start()
    http = httpx.AsyncClient(timeout=30)
    session_id = (await http.post(f"{url}/session")).json()["session_id"]
    peer = HttpPeer(url, http, session_id)
    try:
        assert (await peer.handshake())["ok"] is True
        await peer.send(type="tool/call/req", id="c1", tool_name="echo", arguments={"text": "x"})
        answer = await peer.next_message()
        assert (answer["type"], answer["req_id"]) == ("tool/call/resp", "c1")
        assert answer["data"]["success"] is False
        assert answer["data"]["error_code"] == "tool_error"
        assert answer["data"]["error"].startswith(
            "the session state could not be read, so the tool did not run: ConnectionRefusedError"
        )
        [entry] = await store.recent_audit()
        assert (entry.req_id, entry.error_code) == ("c1", "tool_error")
    finally:
        await peer.close()
        await server.stop()
        await host.close()
