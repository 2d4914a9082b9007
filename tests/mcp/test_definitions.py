"""MCP tool descriptions <-> ToolDefinitions."""

from __future__ import annotations

from toolmesh import tool
from toolmesh.mcp.definitions import definition_from_mcp, mcp_tool_entry


def test_an_mcp_tool_keeps_its_hints_schemas_and_title() -> None:
    definition = definition_from_mcp(
        {
            "name": "delete_repo",
            "title": "Delete a repository",
            "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
            "outputSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            "annotations": {"destructiveHint": True, "openWorldHint": True, "readOnlyHint": None},
        },
        server="gh",
        defer_loading=True,
    )
    assert definition.description == "Delete a repository"  # no description: the title
    assert definition.annotations == {
        "destructiveHint": True,
        "openWorldHint": True,
        "title": "Delete a repository",
    }
    assert definition.tags == ["mcp", "gh", "destructive", "open_world"]
    assert not definition.idempotent and definition.defer_loading and definition.kind == "mcp"
    assert definition.output_schema == {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    assert [p.name for p in definition.output_parameters] == ["ok"]


@tool(idempotent=True, annotations={"title": "Add", "readOnlyHint": True})
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


def test_a_toolmesh_tool_as_an_mcp_tool() -> None:
    entry = mcp_tool_entry(add)
    assert entry["name"] == "add" and entry["title"] == "Add"
    assert entry["inputSchema"]["type"] == "object"
    assert entry["inputSchema"]["required"] == ["a", "b"]
    assert entry["annotations"] == {"readOnlyHint": True, "idempotentHint": True, "title": "Add"}
    assert entry["outputSchema"]["type"] == "object"
