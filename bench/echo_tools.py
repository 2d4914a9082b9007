"""The benchmarks' tool: echo, the same as the peers' MCP servers serve."""

from __future__ import annotations

from toolmesh import tool


@tool
async def echo(text: str) -> str:
    """Return text unchanged."""
    return text


TOOLS = [echo]
