"""The seed 000 data models: fields, defaults and the exact JSON of the seed's wire examples."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from toolmesh import ToolDefinition, ToolErrorCode, ToolEvent, ToolParameter, ToolResult
from toolmesh.models import check_event_data, new_id, secret_id

SEED_LIST_TOOL = (
    '{"name":"read_file","description":"Read file contents","input_parameters":[{"name":"path",'
    '"type":"string","description":"File path","required":true}],"output_parameters":[],'
    '"streaming":true,"idempotent":true,"tags":["fs"],"version":"1.0.0","toolkit":null}'
)
SEED_RESULT = (
    '{"success":true,"tool_name":"read_file","data":{"content":"my-host"},"duration_ms":100}'
)


def test_tool_definition_serializes_exactly_as_the_seed_example() -> None:
    definition = ToolDefinition(
        name="read_file",
        description="Read file contents",
        input_parameters=[
            ToolParameter(name="path", type="string", description="File path", required=True)
        ],
        idempotent=True,
        tags=["fs"],
    )
    assert definition.model_dump_json() == SEED_LIST_TOOL
    assert ToolDefinition.model_validate_json(SEED_LIST_TOOL) == definition


def test_tool_definition_defaults_match_the_seed_table() -> None:
    d = ToolDefinition(name="t", description="d")
    assert (d.input_parameters, d.output_parameters, d.streaming, d.idempotent) == (
        [],
        [],
        True,
        False,
    )
    assert (d.tags, d.version, d.toolkit, d.defer_loading) == ([], "1.0.0", None, False)
    assert d.capabilities == []
    other = ToolDefinition(name="u", description="e")
    d.tags.append("mine")  # each definition's default list is its own
    assert other.tags == [] and ToolResult(success=True, tool_name="t", duration_ms=0).events == []


def test_extensions_appear_on_the_wire_only_when_set() -> None:
    d = ToolDefinition(name="t", description="d", defer_loading=True, capabilities=["fs::read"])
    wire = json.loads(d.model_dump_json())
    assert wire["defer_loading"] is True and wire["capabilities"] == ["fs::read"]
    assert "input_schema" not in wire and "requires_approval" not in wire


def test_tool_parameter_is_recursive_with_items() -> None:
    parameter = ToolParameter(
        name="user",
        type="object",
        description="A user",
        properties={
            "tags": ToolParameter(
                name="tags",
                type="array",
                description="Labels",
                items=ToolParameter(name="items", type="string", description=""),
            ),
            "role": ToolParameter(name="role", type="string", description="", enum=["a", "b"]),
        },
    )
    again = ToolParameter.model_validate_json(parameter.model_dump_json())
    assert again == parameter
    assert again.properties is not None and again.properties["tags"].items is not None


def test_tool_result_serializes_exactly_as_the_seed_example() -> None:
    result = ToolResult(
        success=True, tool_name="read_file", data={"content": "my-host"}, duration_ms=100
    )
    assert result.model_dump_json() == SEED_RESULT
    parsed = ToolResult.model_validate_json(SEED_RESULT)
    assert parsed.output == '{"content": "my-host"}' and parsed.is_error is False


def test_tool_result_output_travels_only_when_not_derivable() -> None:
    own = ToolResult(success=True, tool_name="t", data={"a": 1}, output="one", duration_ms=1)
    assert json.loads(own.model_dump_json())["output"] == "one"
    assert ToolResult.model_validate_json(own.model_dump_json()).output == "one"
    failed = ToolResult(
        success=False, tool_name="t", error="bad", error_code="tool_error", duration_ms=1
    )
    assert failed.output == "bad" and failed.is_error
    assert "output" not in json.loads(failed.model_dump_json())


def test_error_codes_and_retryable_flags() -> None:
    assert ToolErrorCode.UNKNOWN_TOOL == "unknown_tool" and not ToolErrorCode.UNKNOWN_TOOL.retryable
    assert ToolErrorCode.TOOL_DENIED == "tool_denied" and not ToolErrorCode.TOOL_DENIED.retryable
    assert ToolErrorCode.TOOL_ERROR == "tool_error" and ToolErrorCode.TOOL_ERROR.retryable
    assert ToolErrorCode.TIMEOUT.retryable and not ToolErrorCode.INVALID_ARGUMENTS.retryable


def test_tool_event_shape_matches_the_seed_example() -> None:
    line = (
        '{"type":"tool/event","id":"j0k1l2","version":"1.0","ts":1716123457.15,"kind":"progress",'
        '"req_id":"g7h8i9","data":{"pct":50,"message":"Reading..."},"seq":0}'
    )
    event = ToolEvent.model_validate_json(line)
    assert event.model_dump_json() == line


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("progress", {"pct": 5, "message": "x"}),
        ("status", {"message": "x"}),
        ("artifact", {"name": "a", "mime": "text/plain", "chunk": "x", "final": True}),
        ("log", {"level": "info", "message": "x"}),
        ("activity", {"anything": 1}),
    ],
)
def test_event_data_shapes_accept_the_seed_forms(kind: str, data: dict[str, object]) -> None:
    check_event_data(kind, data)


@pytest.mark.parametrize(
    ("kind", "data", "message"),
    [
        ("progress", {"message": "x"}, "needs 'pct'"),
        ("progress", {"pct": "5", "message": "x"}, "'pct' must be int"),
        ("progress", {"pct": True, "message": "x"}, "'pct' must be int"),
        ("artifact", {"name": "a", "mime": "m", "chunk": "c"}, "needs 'final'"),
        ("log", {"level": 1, "message": "x"}, "'level' must be str"),
    ],
)
def test_event_data_shapes_refuse_other_forms(
    kind: str, data: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_event_data(kind, data)


@pytest.mark.parametrize("make", [new_id, secret_id])
def test_ids_are_distinct_uuid4_hex(make: Callable[[], str]) -> None:
    ids = {make() for _ in range(2000)}
    assert len(ids) == 2000
    for value in list(ids)[:50]:
        parsed = uuid.UUID(value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex == value


def test_secret_ids_differ_in_a_forked_child() -> None:
    """The buffered random bytes are not shared with a child process."""
    import os

    secret_id()  # the parent has read random bytes into its buffer
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(writer, secret_id().encode())
        os._exit(0)
    os.close(writer)
    theirs = os.read(reader, 64).decode()
    os.close(reader)
    os.waitpid(child, 0)
    ours = {secret_id() for _ in range(300)}  # past the parent's current buffer, too
    assert len(theirs) == 32 and theirs not in ours
