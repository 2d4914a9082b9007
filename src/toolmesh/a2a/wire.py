"""A2A on the wire: the JSON shapes of A2A 1.0 and of v0.3, and the translation between them.

toolmesh works in the A2A 1.0 shapes (the protobuf JSON mapping the a2a-sdk 1.x speaks:
``{"task": {...}}``, ``"TASK_STATE_COMPLETED"``, ``"ROLE_USER"``, parts ``{"text": "..."}``) and
translates at the edge for v0.3 peers (``"kind": "task"``, ``"completed"``, ``"user"``, parts
``{"kind": "text", "text": "..."}``, method names ``message/send`` and friends).
"""

from __future__ import annotations

import base64
import datetime
import json
import time
from typing import Any

from toolmesh.models import new_id

__all__ = [
    "INTERRUPTED",
    "METHODS_V03",
    "ROLES",
    "TASK_STATES",
    "TERMINAL",
    "RpcError",
    "check_message",
    "enum_name",
    "from_v03",
    "json_names",
    "message",
    "normal_message",
    "params_from_v03",
    "params_to_v03",
    "parse_timestamp",
    "raw_size",
    "short_state",
    "state_name",
    "stream_item_from_v03",
    "stream_item_to_v03",
    "task_from_v03",
    "task_to_v03",
    "text_of",
    "timestamp",
    "without_nulls",
]

JsonObject = dict[str, Any]

A2A_VERSION = "1.0"
VERSION_HEADER = "A2A-Version"

# JSON-RPC error codes (A2A adds -32001 and up to the standard ones).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004
EXTENDED_CARD_NOT_CONFIGURED = -32007
VERSION_NOT_SUPPORTED = -32009

_SHORT = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_CANCELED": "canceled",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_REJECTED": "rejected",
    "TASK_STATE_AUTH_REQUIRED": "auth-required",
    "TASK_STATE_UNSPECIFIED": "unknown",
}
_LONG = {short: long for long, short in _SHORT.items()}

TASK_STATES = (
    "TASK_STATE_UNSPECIFIED",
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
)
"""The TaskState names in the order of their numbers (TASK_STATE_COMPLETED is 3)."""
ROLES = ("ROLE_UNSPECIFIED", "ROLE_USER", "ROLE_AGENT")
"""The Role names in the order of their numbers."""

TERMINAL = frozenset({"completed", "failed", "canceled", "rejected"})
"""Short names of the states a task never leaves."""
INTERRUPTED = frozenset({"input-required", "auth-required"})
"""Short names of the states where the agent waits for its caller."""

METHODS_V03 = {
    "SendMessage": "message/send",
    "SendStreamingMessage": "message/stream",
    "GetTask": "tasks/get",
    "CancelTask": "tasks/cancel",
    "SubscribeToTask": "tasks/resubscribe",
    "CreateTaskPushNotificationConfig": "tasks/pushNotificationConfig/set",
    "GetTaskPushNotificationConfig": "tasks/pushNotificationConfig/get",
    "ListTaskPushNotificationConfigs": "tasks/pushNotificationConfig/list",
    "DeleteTaskPushNotificationConfig": "tasks/pushNotificationConfig/delete",
    "GetExtendedAgentCard": "agent/getAuthenticatedExtendedCard",
}
"""A2A 1.0 method names and their v0.3 equivalents."""


class RpcError(Exception):
    """A JSON-RPC error, raised by the server's handlers and by a peer's answer."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"JSON-RPC error {code}: {message}")

    def to_json(self) -> JsonObject:
        error: JsonObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


# -- states, parts, messages ---------------------------------------------------------------------


def short_state(state: Any) -> str:
    """``"completed"`` for ``"TASK_STATE_COMPLETED"`` or ``"completed"``; ``"unknown"`` else."""
    if not isinstance(state, str):
        return "unknown"
    if state in _SHORT:
        return _SHORT[state]
    lowered = state.lower().replace("_", "-")
    return lowered if lowered in _LONG else "unknown"


def state_name(short: str) -> str:
    """The A2A 1.0 name of a short state name."""
    return _LONG.get(short, "TASK_STATE_UNSPECIFIED")


def task_state(task: JsonObject) -> str:
    """The short state of a task in the 1.0 shape."""
    status = task.get("status")
    return short_state(status.get("state") if isinstance(status, dict) else None)


def timestamp() -> str:
    """Now, as the RFC 3339 UTC text the protobuf JSON mapping uses."""
    now = time.time()
    second = int(now)
    global _second_text
    if _second_text[0] != second:  # the date and time of day change once a second
        _second_text = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_second_text[1]}.{int((now - second) * 1_000_000):06d}Z"


_second_text: tuple[int, str] = (-1, "")


def parse_timestamp(text: str) -> float:
    """RFC 3339 text (``2026-12-01T15:00:00.5Z``; an offset, or none for UTC) as epoch
    seconds; ValueError when it is not one."""
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def message(
    role: str,
    text: str,
    *,
    context_id: str = "",
    task_id: str = "",
    metadata: JsonObject | None = None,
) -> JsonObject:
    """A 1.0 message with one text part; ``role`` is ``"user"`` or ``"agent"``."""
    built: JsonObject = {
        "messageId": new_id(),
        "role": "ROLE_AGENT" if role == "agent" else "ROLE_USER",
        "parts": [{"text": text}],
    }
    if context_id:
        built["contextId"] = context_id
    if task_id:
        built["taskId"] = task_id
    if metadata:
        built["metadata"] = metadata
    return built


def text_of(parts: Any) -> str:
    """The text of a list of parts: text parts as they are, data parts as JSON, files described
    (``[file: report.pdf, application/pdf, 1234 bytes]``): a model cannot read the bytes, but it
    can be told what was sent."""
    if not isinstance(parts, list):
        return ""
    pieces: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif "data" in part:
            pieces.append(json.dumps(part["data"], ensure_ascii=False))
        elif any(part.get(key) for key in ("raw", "url", "filename")):
            pieces.append(_file_description(part))
    return "".join(pieces)


def _file_description(part: JsonObject) -> str:
    facts = [str(part[key]) for key in ("filename", "url", "mediaType") if part.get(key)]
    if not part.get("filename") and not part.get("url"):
        facts.insert(0, "unnamed")
    size = raw_size(part["raw"]) if isinstance(part.get("raw"), str) else None
    if size is not None:
        facts.append(f"{size} bytes")
    return f"[file: {', '.join(facts)}]"


def raw_size(raw: str) -> int | None:
    """The number of bytes a part's base64 ``raw`` holds; None when it is not base64. Decoded
    the way the protobuf JSON mapping (the a2a-sdk's parser) does: padding optional, URL-safe
    or standard alphabet."""
    try:
        encoded = raw.encode("utf-8")
        return len(base64.urlsafe_b64decode(encoded + b"=" * (4 - len(encoded) % 4)))
    except ValueError:  # binascii.Error and UnicodeEncodeError are ValueErrors
        return None


_PART_CONTENT = ("text", "raw", "url", "data")
_PART_TEXTS = ("text", "raw", "url", "filename", "mediaType")
_MESSAGE_TEXTS = ("messageId", "contextId", "taskId", "role")
_MESSAGE_LISTS = ("extensions", "referenceTaskIds")


def without_nulls(message: JsonObject) -> JsonObject:
    """``message`` with its ``null`` fields, and its parts' ``null`` fields, left out: in the
    protobuf JSON mapping A2A 1.0 uses, ``null`` is a field not set (``"contextId": null`` is
    no contextId), and clients that write unset fields so are common. Values inside
    ``metadata`` (a JSON object of the sender's) are kept as they are, and so is the ``data``
    of a part that has no other content: ``data`` is a ``google.protobuf.Value``, for which
    ``null`` is a value (a data part holding null), not a field not set."""
    cleaned = {key: value for key, value in message.items() if value is not None}
    parts = cleaned.get("parts")
    if isinstance(parts, list):
        cleaned["parts"] = [_part_without_nulls(part) for part in parts]
    return cleaned


def _part_without_nulls(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    cleaned = {key: value for key, value in part.items() if value is not None}
    if "data" in part and not any(key in cleaned for key in _PART_CONTENT):
        cleaned["data"] = None  # {"data": null} alone is a data part (null as its data)
    return cleaned


_JSON_NAMES = {
    "message_id": "messageId",
    "context_id": "contextId",
    "task_id": "taskId",
    "reference_task_ids": "referenceTaskIds",
    "media_type": "mediaType",
    "history_length": "historyLength",
    "return_immediately": "returnImmediately",
    "accepted_output_modes": "acceptedOutputModes",
    "task_push_notification_config": "taskPushNotificationConfig",
    "page_size": "pageSize",
    "page_token": "pageToken",
    "status_timestamp_after": "statusTimestampAfter",
    "include_artifacts": "includeArtifacts",
}


def json_names(value: JsonObject, where: str = "params") -> JsonObject:
    """``value`` with the fields named by their proto names (``context_id``), which the
    protobuf JSON mapping accepts as well as the JSON names, under their JSON names
    (``contextId``): read as unknown fields, a ``context_id`` started a new conversation and a
    ``history_length`` was ignored. RpcError (invalid params) when both name one field with
    different values. A constant number of look-ups, whatever the request holds."""
    renamed: JsonObject | None = None
    for proto, name in _JSON_NAMES.items():
        if proto not in value:
            continue
        if renamed is None:
            renamed = dict(value)
        given = renamed.pop(proto)
        if renamed.get(name) is None:
            renamed[name] = given
        elif given is not None and given != renamed[name]:
            raise _invalid(f"{where} has both {name} and {proto}, with different values")
    return value if renamed is None else renamed


def enum_name(value: Any, names: tuple[str, ...]) -> Any:
    """The name of an enum value sent as its number, as the protobuf JSON mapping allows
    (``1`` or ``"1"`` for ``ROLE_USER``); any other value as it is."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 3:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    return value


def normal_message(message: JsonObject) -> JsonObject:
    """A 1.0 message as the protobuf JSON mapping reads it: without its ``null`` fields
    (:func:`without_nulls`), with its fields and its parts' under their JSON names
    (:func:`json_names`) and its role by name."""
    cleaned = json_names(without_nulls(message), "message")
    if "role" in cleaned:
        cleaned["role"] = enum_name(cleaned["role"], ROLES)
    parts = cleaned.get("parts")
    if isinstance(parts, list):
        cleaned["parts"] = [
            json_names(part, f"message.parts[{index}]") if isinstance(part, dict) else part
            for index, part in enumerate(parts)
        ]
    return cleaned


def check_message(message: JsonObject) -> None:
    """RpcError (invalid params) for a 1.0 message whose fields have the wrong types. A task
    keeps its messages as sent, and one bad part would make the task (and every listing that
    holds it) unreadable to clients that parse the protobuf shapes."""
    for key in _MESSAGE_TEXTS:
        if key in message and not isinstance(message[key], str):
            raise _invalid(f"message.{key} must be a string, not {message[key]!r}")
    for key in _MESSAGE_LISTS:
        value = message.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _invalid(f"message.{key} must be a list of strings, not {value!r}")
    for index, part in enumerate(message.get("parts") or []):
        _check_part(part, f"message.parts[{index}]")


def _check_part(part: Any, where: str) -> None:
    if not isinstance(part, dict):
        raise _invalid(f"{where} must be an object, not {part!r}")
    contents = [key for key in _PART_CONTENT if key in part]
    if len(contents) > 1:
        raise _invalid(f"{where} has more than one of text, raw, url, data: {contents}")
    for key in _PART_TEXTS:
        if key in part and not isinstance(part[key], str):
            raise _invalid(f"{where}.{key} must be a string, not {part[key]!r}")
    if "metadata" in part and not isinstance(part["metadata"], dict):
        raise _invalid(f"{where}.metadata must be an object, not {part['metadata']!r}")
    if isinstance(part.get("raw"), str) and raw_size(part["raw"]) is None:
        # the a2a-sdk's parser would fail on it, and with it every read of the task
        raise _invalid(f"{where}.raw must be base64, not {part['raw']!r}")


def _invalid(text: str) -> RpcError:
    return RpcError(INVALID_PARAMS, text[:200])


def is_agent(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("ROLE_AGENT", "agent")


# -- v0.3 <-> 1.0 --------------------------------------------------------------------------------


def _part_from_v03(part: Any) -> JsonObject:
    if not isinstance(part, dict):
        return {}
    kind = part.get("kind") or part.get("type")
    out: JsonObject
    if kind == "data":
        out = {"data": part.get("data")}
    elif kind == "file":
        file = part.get("file") or {}
        if not isinstance(file, dict):
            raise RpcError(
                INVALID_PARAMS, f"a file part's file must be an object, not {file!r}"[:200]
            )
        out = {}
        if file.get("uri"):
            out["url"] = file["uri"]
        if file.get("bytes"):
            out["raw"] = file["bytes"]
        if file.get("mimeType"):
            out["mediaType"] = file["mimeType"]
        if file.get("name"):
            out["filename"] = file["name"]
    else:
        out = {"text": part.get("text", "")}
    if part.get("metadata"):
        out["metadata"] = part["metadata"]
    return out


def _part_to_v03(part: JsonObject) -> JsonObject:
    out: JsonObject
    if "text" in part:
        out = {"kind": "text", "text": part["text"]}
    elif "data" in part:
        out = {"kind": "data", "data": part["data"]}
    else:
        file: JsonObject = {}
        if part.get("url"):
            file["uri"] = part["url"]
        if part.get("raw"):
            file["bytes"] = part["raw"]
        if part.get("mediaType"):
            file["mimeType"] = part["mediaType"]
        if part.get("filename"):
            file["name"] = part["filename"]
        out = {"kind": "file", "file": file}
    if part.get("metadata"):
        out["metadata"] = part["metadata"]
    return out


def message_from_v03(value: Any) -> JsonObject:
    if not isinstance(value, dict):
        return {}
    out = {k: v for k, v in value.items() if k not in ("kind", "role", "parts")}
    out["role"] = "ROLE_AGENT" if value.get("role") == "agent" else "ROLE_USER"
    out["parts"] = [_part_from_v03(p) for p in value.get("parts") or []]
    return out


def message_to_v03(value: JsonObject) -> JsonObject:
    out = {k: v for k, v in value.items() if k not in ("role", "parts")}
    out["kind"] = "message"
    out["role"] = "agent" if value.get("role") == "ROLE_AGENT" else "user"
    out["parts"] = [_part_to_v03(p) for p in value.get("parts") or []]
    return out


def _status_from_v03(status: Any) -> JsonObject:
    if not isinstance(status, dict):
        return {"state": "TASK_STATE_UNSPECIFIED"}
    out: JsonObject = {"state": state_name(short_state(status.get("state")))}
    if status.get("message"):
        out["message"] = message_from_v03(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def _status_to_v03(status: JsonObject) -> JsonObject:
    out: JsonObject = {"state": short_state(status.get("state"))}
    if status.get("message"):
        out["message"] = message_to_v03(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def _artifact_from_v03(artifact: Any) -> JsonObject:
    if not isinstance(artifact, dict):
        return {}
    out = {k: v for k, v in artifact.items() if k != "parts"}
    out["parts"] = [_part_from_v03(p) for p in artifact.get("parts") or []]
    return out


def _artifact_to_v03(artifact: JsonObject) -> JsonObject:
    out = {k: v for k, v in artifact.items() if k != "parts"}
    out["parts"] = [_part_to_v03(p) for p in artifact.get("parts") or []]
    return out


def task_from_v03(value: Any) -> JsonObject:
    if not isinstance(value, dict):
        return {}
    out = {k: v for k, v in value.items() if k not in ("kind", "status", "artifacts", "history")}
    out["status"] = _status_from_v03(value.get("status"))
    if value.get("artifacts"):
        out["artifacts"] = [_artifact_from_v03(a) for a in value["artifacts"]]
    if value.get("history"):
        out["history"] = [message_from_v03(m) for m in value["history"]]
    return out


def task_to_v03(task: JsonObject) -> JsonObject:
    out = {k: v for k, v in task.items() if k not in ("status", "artifacts", "history")}
    out["kind"] = "task"
    out["status"] = _status_to_v03(task.get("status") or {})
    if task.get("artifacts"):
        out["artifacts"] = [_artifact_to_v03(a) for a in task["artifacts"]]
    if task.get("history"):
        out["history"] = [message_to_v03(m) for m in task["history"]]
    return out


def from_v03(value: Any) -> JsonObject:
    """A v0.3 SendMessage result (a Task or a Message) as the 1.0 ``{"task"|"message": ...}``."""
    if isinstance(value, dict) and value.get("kind") == "message":
        return {"message": message_from_v03(value)}
    return {"task": task_from_v03(value)}


def stream_item_from_v03(value: Any) -> JsonObject:
    """A v0.3 stream event as a 1.0 StreamResponse."""
    if not isinstance(value, dict):
        return {}
    kind = value.get("kind")
    if kind == "status-update":
        update = {k: v for k, v in value.items() if k not in ("kind", "status", "final")}
        update["status"] = _status_from_v03(value.get("status"))
        return {"statusUpdate": update}
    if kind == "artifact-update":
        update = {k: v for k, v in value.items() if k not in ("kind", "artifact")}
        update["artifact"] = _artifact_from_v03(value.get("artifact"))
        return {"artifactUpdate": update}
    return from_v03(value)


def stream_item_to_v03(item: JsonObject) -> JsonObject:
    """A 1.0 StreamResponse as the v0.3 event (``final`` set on the last status update)."""
    if "task" in item:
        return task_to_v03(item["task"])
    if "message" in item:
        return message_to_v03(item["message"])
    if "statusUpdate" in item:
        update = dict(item["statusUpdate"])
        update["status"] = _status_to_v03(update.get("status") or {})
        update["kind"] = "status-update"
        update["final"] = short_state(update["status"].get("state")) in TERMINAL | INTERRUPTED
        return update
    update = dict(item["artifactUpdate"])
    update["artifact"] = _artifact_to_v03(update.get("artifact") or {})
    update["kind"] = "artifact-update"
    return update


def params_to_v03(method: str, params: JsonObject) -> JsonObject:
    """The v0.3 params of a 1.0 request (the client side)."""
    if method not in ("SendMessage", "SendStreamingMessage"):
        return params
    out: JsonObject = {"message": message_to_v03(params["message"])}
    config = params.get("configuration") or {}
    converted: JsonObject = {"blocking": not config.get("returnImmediately", False)}
    if config.get("acceptedOutputModes"):
        converted["acceptedOutputModes"] = config["acceptedOutputModes"]
    if config.get("historyLength") is not None:
        converted["historyLength"] = config["historyLength"]
    out["configuration"] = converted
    if params.get("metadata"):
        out["metadata"] = params["metadata"]
    return out


def params_from_v03(method: str, params: JsonObject) -> JsonObject:
    """The 1.0 params of a v0.3 request (the server side); ``method`` is the 1.0 name."""
    if method not in ("SendMessage", "SendStreamingMessage"):
        return params
    out: JsonObject = {"message": message_from_v03(params.get("message"))}
    config = params.get("configuration") or {}
    if isinstance(config, dict):
        config = json_names(config, "configuration")
        converted: JsonObject = {}
        blocking = config.get("blocking")
        if blocking is not None:  # null is "not said", as the a2a-sdk's v0.3 model reads it
            if not isinstance(blocking, bool):  # "false" is not false (the 1.0 path agrees)
                raise _invalid(f"configuration.blocking must be true or false, not {blocking!r}")
            converted["returnImmediately"] = not blocking
        if config.get("historyLength") is not None:
            converted["historyLength"] = config["historyLength"]
        out["configuration"] = converted
    else:  # the 1.0 handler names it (as it does for a 1.0 request)
        out["configuration"] = config
    if params.get("metadata"):
        out["metadata"] = params["metadata"]
    return out
