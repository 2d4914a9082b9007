"""MCP tool descriptions <-> toolmesh ToolDefinitions, both ways.

An MCP tool keeps its exact input and output JSON Schemas and its behaviour hints
(``readOnlyHint``, ``destructiveHint``, ``idempotentHint``, ``openWorldHint``, ``title``) on
``ToolDefinition.annotations``; ``idempotent`` follows ``idempotentHint`` and the hints that are
set become tags (``read_only``, ``destructive``, ``idempotent``, ``open_world``), so a listing can
be filtered by them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_types import ListToolsResult
from mcp_types import methods as wire_methods
from pydantic import ValidationError

from toolmesh.errors import SchemaError
from toolmesh.models import ToolDefinition
from toolmesh.schema import schema_to_parameters
from toolmesh.tools import Tool

__all__ = [
    "HINTS",
    "definition_from_mcp",
    "input_schema_of",
    "listed_output_schema",
    "mcp_tool_entry",
    "usable_tool_entries",
]

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
_HINT_TAGS = {
    "readOnlyHint": "read_only",
    "destructiveHint": "destructive",
    "idempotentHint": "idempotent",
    "openWorldHint": "open_world",
}
_EMPTY_INPUT: dict[str, Any] = {"type": "object", "properties": {}}


def definition_from_mcp(
    tool: Mapping[str, Any], *, server: str, defer_loading: bool = False
) -> ToolDefinition:
    """The ToolDefinition of one MCP tool (``tool`` in its wire form, camelCase keys)."""
    annotations = _annotations(tool)
    output_schema = tool.get("outputSchema")
    output_parameters = []
    if isinstance(output_schema, Mapping):
        try:
            output_parameters = schema_to_parameters(output_schema)
        except SchemaError:
            output_parameters = []  # the exact schema still travels as output_schema
    tags = ["mcp", server]
    tags += [_HINT_TAGS[h] for h in HINTS if annotations.get(h) is True]
    return ToolDefinition(
        name=str(tool["name"]),
        description=str(tool.get("description") or annotations.get("title") or tool["name"]),
        output_parameters=output_parameters,
        idempotent=annotations.get("idempotentHint") is True,
        tags=list(dict.fromkeys(tags)),
        toolkit=server,
        defer_loading=defer_loading,
        kind="mcp",
        output_schema=dict(output_schema) if isinstance(output_schema, Mapping) else None,
        annotations=annotations or None,
    )


def input_schema_of(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An MCP tool's input schema (an empty object schema when it gave none)."""
    schema = tool.get("inputSchema")
    return dict(schema) if isinstance(schema, Mapping) else dict(_EMPTY_INPUT)


def usable_tool_entries(result: Mapping[str, Any], *, version: str) -> tuple[list[Any], list[str]]:
    """The entries of a raw ``tools/list`` result the SDK will accept, and what was wrong.

    The SDK rejects a whole listing for one malformed tool; here a bad field is dropped instead
    (a bad input schema becomes the empty object schema: the server validates its own
    arguments) and only an entry without a usable name is left out."""
    if not _listing_errors(result, version) and all(map(_named, result["tools"])):
        return list(result["tools"]), []  # the usual case: one check of the whole listing
    kept: list[Any] = []
    problems: list[str] = []
    for index, entry in enumerate(result["tools"]):
        fixed, problem = _repaired_entry(result, entry, version)
        if problem:
            problems.append(f"tool {_label(entry, index)}: {problem}")
        if fixed is not None:
            kept.append(fixed)
    return kept, problems


def _repaired_entry(
    result: Mapping[str, Any], entry: Any, version: str
) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(entry, Mapping):
        return None, f"left out (not an object but {type(entry).__name__})"
    if isinstance(entry.get("name"), str) and not _named(entry):
        return None, "left out (name: empty)"  # the SDK takes it: a call would name no tool
    fixed = dict(entry)
    dropped: list[str] = []
    for _ in range(len(entry) + 1):
        errors = _entry_errors(result, fixed, version)
        if not errors:
            return fixed, f"ignored {'; '.join(dropped)}" if dropped else ""
        if "name" in errors:
            return None, f"left out (name: {errors['name']})"
        for key, message in errors.items():
            dropped.append(f"{key} ({message})")
            if key == "inputSchema":
                fixed[key] = dict(_EMPTY_INPUT)
            else:
                fixed.pop(key, None)
    return None, "left out (malformed)"


def _entry_errors(result: Mapping[str, Any], entry: dict[str, Any], version: str) -> dict[str, str]:
    """The top-level fields of one entry that break the schema, each with the first message."""
    errors: dict[str, str] = {}
    for exc in _listing_errors({**result, "tools": [entry]}, version):
        _add_entry_errors(errors, exc)
    return errors


def _listing_errors(listing: Mapping[str, Any], version: str) -> list[ValidationError]:
    """Why the SDK would refuse ``listing``: the negotiated revision's rules, then its model."""
    errors: list[ValidationError] = []
    try:
        wire_methods.validate_server_result("tools/list", version, listing)
    except ValidationError as exc:
        errors.append(exc)
    except (KeyError, ValueError):
        pass  # a revision the SDK has no table for: the general model below still applies
    try:
        ListToolsResult.model_validate(listing, by_name=False)
    except ValidationError as exc:
        errors.append(exc)
    return errors


def _add_entry_errors(errors: dict[str, str], exc: ValidationError) -> None:
    for error in exc.errors(include_url=False):
        where = error["loc"]
        if len(where) > 2 and where[:2] == ("tools", 0):  # not the listing's own fields
            errors.setdefault(str(where[2]), str(error["msg"]))


def _named(entry: Mapping[str, Any]) -> bool:
    """Whether an entry has a name a call can use: a string, and not blank."""
    name = entry.get("name")
    return isinstance(name, str) and bool(name.strip())


def _label(entry: Any, index: int) -> str:
    return repr(entry["name"]) if isinstance(entry, Mapping) and _named(entry) else f"#{index}"


def mcp_tool_entry(tool: Tool) -> dict[str, Any]:
    """How a toolmesh tool is listed over MCP (``tools/list`` wire form)."""
    definition = tool.definition
    entry: dict[str, Any] = {
        "name": definition.name,
        "description": definition.description,
        "inputSchema": _object_schema(tool.input_schema),
    }
    annotations = dict(definition.annotations or {})
    title = annotations.pop("title", None)
    if isinstance(title, str):
        entry["title"] = title
    hints: dict[str, Any] = {
        k: v for k, v in annotations.items() if k in HINTS and isinstance(v, bool)
    }
    if definition.idempotent and "idempotentHint" not in hints:
        hints["idempotentHint"] = True
    if isinstance(title, str):
        hints["title"] = title
    if hints:
        entry["annotations"] = hints
    output = listed_output_schema(tool)
    if output is not None:
        entry["outputSchema"] = output
    return entry


def listed_output_schema(tool: Tool) -> dict[str, Any] | None:
    """The ``outputSchema`` a tool is listed with over MCP: only an object schema (MCP requires
    one there); a tool listed with one must answer with ``structuredContent``."""
    output = tool.output_schema
    if output is not None and output.get("type") == "object":
        return output
    return None


def _annotations(tool: Mapping[str, Any]) -> dict[str, Any]:
    raw = tool.get("annotations")
    annotations = {k: v for k, v in (raw or {}).items() if v is not None}
    title = tool.get("title") or annotations.get("title")
    if title:
        annotations["title"] = title
    return annotations


def _object_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """MCP wants ``{"type": "object", ...}`` at the top of every input schema."""
    if schema.get("type") == "object":
        return dict(schema)
    return {"type": "object", **schema}
