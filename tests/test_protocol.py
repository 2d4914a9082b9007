"""The A2E messages: envelope, exact field sets, NDJSON framing and decoding errors."""

from __future__ import annotations

import json
import uuid

import pytest

from toolmesh import ProtocolError
from toolmesh.models import ToolDefinition, ToolResult
from toolmesh.protocol import (
    ErrorMessage,
    HandshakeRequest,
    HandshakeResponse,
    Ping,
    Pong,
    ToolCallRequest,
    ToolCallResponse,
    ToolListRequest,
    ToolListResponse,
    decode,
    encode,
    request_id_of,
)

SEED_LIST_REQ = (
    b'{"type":"tool/list/req","id":"a1b2c3","version":"1.0","ts":1716123456.789,'
    b'"filter_kind":"","filter_tags":[]}'
)
SEED_CALL_REQ = (
    b'{"type":"tool/call/req","id":"g7h8i9","version":"1.0","ts":1716123457.1,'
    b'"session_id":"s1k2l3","tool_name":"read_file","arguments":{"path":"/etc/hostname"},'
    b'"correlation_id":"","streaming":true,"timeout":30}'
)
SEED_CALL_RESP = (
    b'{"type":"tool/call/resp","id":"m3n4o5","version":"1.0","ts":1716123457.2,"req_id":"g7h8i9",'
    b'"data":{"success":true,"tool_name":"read_file","data":{"content":"my-host"},'
    b'"duration_ms":100},"created_at":1716123457.2}'
)


@pytest.mark.parametrize("line", [SEED_LIST_REQ, SEED_CALL_REQ, SEED_CALL_RESP])
def test_seed_examples_decode_and_encode_byte_for_byte(line: bytes) -> None:
    assert encode(decode(line)) == line + b"\n"


def test_envelope_is_filled_in() -> None:
    message = Ping()
    assert message.type == "ping" and message.version == "1.0"
    assert uuid.UUID(message.id).version == 4 and message.ts > 1.7e9
    assert Ping().id != message.id


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (ToolListRequest(), {"filter_kind", "filter_tags"}),
        (
            ToolListRequest(query="q", include_deferred=True),
            {"filter_kind", "filter_tags", "query", "include_deferred"},
        ),
        (ToolListResponse(), {"req_id", "tools"}),
        (
            ToolCallRequest(tool_name="t", arguments={}),
            {"session_id", "tool_name", "arguments", "correlation_id", "streaming", "timeout"},
        ),
        (
            ToolCallResponse(data=ToolResult(success=True, tool_name="t", duration_ms=0)),
            {"req_id", "data", "created_at"},
        ),
        (HandshakeRequest(), {"agent_id", "agent_caps", "auth_token"}),
        (
            HandshakeResponse(),
            {"req_id", "session_id", "accepted_caps", "max_parallel", "ok", "reason"},
        ),
        (Pong(), {"req_id", "uptime_seconds"}),
        (
            ErrorMessage(code="x"),
            {"req_id", "code", "message", "detail", "retryable", "capability_name"},
        ),
    ],
)
def test_each_message_has_exactly_its_fields(message: object, fields: set[str]) -> None:
    wire = json.loads(encode(message))  # type: ignore[arg-type]
    assert set(wire) == {"type", "id", "version", "ts"} | fields


def test_call_request_defaults_are_the_seeds() -> None:
    request = ToolCallRequest(tool_name="t", arguments={})
    assert (request.streaming, request.timeout, request.correlation_id, request.session_id) == (
        False,
        30,
        "",
        "",
    )
    assert json.loads(encode(request))["timeout"] == 30  # whole seconds stay an int


def test_encode_is_one_line() -> None:
    line = encode(ToolCallRequest(tool_name="t", arguments={"text": "a\nb"}))
    assert line.endswith(b"\n") and line.count(b"\n") == 1


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"{", "parse_error"),
        (b'{"type": "ping", "id": "p", "ts": NaN}', "parse_error"),  # NaN is not JSON
        (
            b'{"type": "tool/call/req", "tool_name": "t", "arguments": {"x": Infinity}}',
            "parse_error",
        ),
        (b'{"type": "ping", "id": "\\ud800"}', "parse_error"),  # a lone surrogate
        (b'{"type": "ping", "id": "p", "version": "2.0"}', "version_mismatch"),
        (b'{"type": "ping", "id": "p", "version": 1}', "invalid_message"),
        (b'"text"', "invalid_message"),
        (b"{}", "invalid_message"),
        (b'{"type": 1}', "unknown_message_type"),
        (b'{"type": "nope"}', "unknown_message_type"),
        (b'{"type": "tool/call/req", "tool_name": "t"}', "invalid_message"),
        (
            b'{"type": "tool/call/req", "tool_name": "t", "arguments": {}, "streaming": "yes"}',
            "invalid_message",
        ),
        (
            b'{"type": "tool/call/req", "tool_name": "t", "arguments": {}, "timeout": "30"}',
            "invalid_message",
        ),
        (
            b'{"type": "handshake/req", "capability_override": {"strategy": "grab"}}',
            "invalid_message",
        ),
    ],
)
def test_decode_errors_carry_precise_codes(line: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode(line)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            b'{"type": "tool/call/req", "id": "c3", "arguments": {"text": "\\ud800"}}',
            "half a surrogate pair, which is not valid Unicode",
        ),
        (b'{"type": "tool/call/req", "id": "c3", "arguments": {"x": NaN}}', "not valid JSON"),
    ],
)
def test_a_refused_line_written_by_json_dumps_still_names_its_request(
    line: bytes, says: str
) -> None:
    """Python's json.dumps writes lone surrogates and NaN; the error answers the request."""
    with pytest.raises(ProtocolError) as caught:
        decode(line)
    assert caught.value.code == "parse_error" and says in caught.value.message
    assert request_id_of(line) == "c3"


def test_a_line_too_deep_for_either_reader_has_no_request_id() -> None:
    too_deep = b'{"id": "c3", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert request_id_of(too_deep) == ""  # and no RecursionError


def test_decode_names_the_bad_field() -> None:
    with pytest.raises(ProtocolError, match="field 'streaming'"):
        decode(b'{"type": "tool/call/req", "tool_name": "t", "arguments": {}, "streaming": "yes"}')


def test_decode_refuses_oversized_lines() -> None:
    with pytest.raises(ProtocolError) as caught:
        decode(b'{"type": "ping"}' + b" " * 100, max_bytes=50)
    assert caught.value.code == "message_too_large"


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    message = decode(b'{"type": "ping", "id": "x", "future_field": 1}')
    assert isinstance(message, Ping) and message.id == "x"


def test_listing_encodes_as_pydantic_does_and_follows_replaced_definitions() -> None:
    from toolmesh.protocol import ToolListResponse, encode

    first = ToolDefinition(name="a", description="first", tags=["x"])
    second = ToolDefinition(name="b", description="second")
    message = ToolListResponse(req_id="r", tools=[first, second])
    plain = message.__pydantic_serializer__.to_json(message) + b"\n"
    assert encode(message) == plain
    assert encode(message) == plain  # from the per-definition cache
    replaced = ToolListResponse(req_id="r", tools=[first.model_copy(update={"description": "new"})])
    assert b'"description":"new"' in encode(replaced)
    assert json.loads(encode(ToolListResponse(req_id="r")))["tools"] == []


def test_minor_versions_of_1_are_read() -> None:
    assert decode(b'{"type": "ping", "id": "p", "version": "1.3"}').version == "1.3"
