"""The public API is what __all__ says, and every name in it exists."""

from __future__ import annotations

import toolmesh

PINNED = {
    "ToolDefinition",
    "ToolParameter",
    "ToolResult",
    "ToolEvent",
    "ToolErrorCode",
    "ToolPlugin",
    "ToolAPI",
    "AsyncToolAPI",
    "Host",
    "connect",
    "connect_async",
    "Toolkit",
    "create_toolkit",
    "tool",
    "Tool",
    "ToolContext",
    "Output",
    "capabilities",
    # seed 002
    "Agent",
    "agent",
    "agent_tools",
    "create_client",
    "parse_agents_config",
}


def test_pinned_names_are_exported() -> None:
    assert set(toolmesh.__all__) >= PINNED


def test_every_exported_name_exists() -> None:
    for name in toolmesh.__all__:
        assert hasattr(toolmesh, name), name


def test_satisfies_is_reachable_as_documented() -> None:
    assert toolmesh.capabilities.satisfies(["math"], "math::add")
