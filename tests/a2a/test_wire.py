"""The A2A 1.0 and v0.3 shapes and the translation between them."""

from __future__ import annotations

from toolmesh.a2a import wire


def test_states() -> None:
    assert wire.short_state("TASK_STATE_INPUT_REQUIRED") == "input-required"
    assert wire.short_state("input-required") == "input-required"
    assert wire.short_state("whatever") == "unknown"
    assert wire.state_name("auth-required") == "TASK_STATE_AUTH_REQUIRED"


def test_task_round_trip_through_v03() -> None:
    task = {
        "id": "t",
        "contextId": "c",
        "status": {
            "state": "TASK_STATE_COMPLETED",
            "message": wire.message("agent", "done", context_id="c", task_id="t"),
        },
        "artifacts": [{"artifactId": "a", "parts": [{"text": "x"}, {"data": {"k": 1}}]}],
        "history": [wire.message("user", "do it")],
    }
    old = wire.task_to_v03(task)
    assert old["kind"] == "task" and old["status"]["state"] == "completed"
    assert old["status"]["message"]["role"] == "agent"
    assert old["artifacts"][0]["parts"] == [
        {"kind": "text", "text": "x"},
        {"kind": "data", "data": {"k": 1}},
    ]
    assert wire.task_from_v03(old) == task


def test_stream_items_and_params() -> None:
    update = {
        "statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_FAILED"}}
    }
    old = wire.stream_item_to_v03(update)
    assert old["kind"] == "status-update" and old["final"] is True
    assert wire.stream_item_from_v03(old) == update
    params = {"message": wire.message("user", "hi"), "configuration": {"returnImmediately": True}}
    v03 = wire.params_to_v03("SendMessage", params)
    assert v03["configuration"] == {"blocking": False} and v03["message"]["role"] == "user"
    assert wire.params_from_v03("SendMessage", v03) == params


def test_text_of_parts() -> None:
    parts = [{"text": "a"}, {"data": [1]}, {"url": "http://f", "filename": "f.txt"}, "junk"]
    assert wire.text_of(parts) == "a[1][file: f.txt, http://f]"
    assert wire.text_of(None) == ""
    unnamed = [{"raw": "aGVsbG8", "mediaType": "text/plain"}]  # unpadded, as protobuf allows
    assert wire.text_of(unnamed) == "[file: unnamed, text/plain, 5 bytes]"


def test_messages_as_the_protobuf_json_mapping_reads_them() -> None:
    """Proto field names are JSON names, enum numbers are names, and a part's ``data: null``
    is a value (a google.protobuf.Value), not a field not set."""
    sent = {
        "message_id": "m",
        "context_id": "c",
        "contextId": None,
        "role": "2",
        "parts": [{"text": "a", "media_type": "text/plain", "data": None}, {"data": None}],
    }
    assert wire.normal_message(sent) == {
        "messageId": "m",
        "contextId": "c",
        "role": "ROLE_AGENT",
        "parts": [{"text": "a", "mediaType": "text/plain"}, {"data": None}],
    }
    assert wire.enum_name(3, wire.TASK_STATES) == "TASK_STATE_COMPLETED"
    assert wire.enum_name(True, wire.ROLES) is True and wire.enum_name(9, wire.ROLES) == 9
    v03 = {"message": {"kind": "message", "role": "user", "parts": []}}
    v03["configuration"] = {"history_length": 2}
    assert wire.params_from_v03("SendMessage", v03)["configuration"] == {"historyLength": 2}
