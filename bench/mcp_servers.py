"""The servers bench_mcp.py measures, each an `echo(text) -> str` tool plus N more tools.

python bench/mcp_servers.py sdk N            # the SDK's MCPServer over stdio
toolmesh serve --mcp-stdio --tools bench.mcp_servers:TOOLS   # N from BENCH_MCP_TOOLS
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from toolmesh import Tool, tool


def _numbered(i: int) -> Callable[[str], str]:
    def fn(text: str) -> str:
        return text

    fn.__name__ = fn.__qualname__ = f"tool_{i}"
    fn.__doc__ = f"Tool number {i}: returns its text argument unchanged."
    return fn


def sync_echo(text: str) -> str:
    """Return text unchanged."""
    return text


async def async_echo(text: str) -> str:
    """Return text unchanged."""
    return text


# BENCH_ECHO=async serves a coroutine (both servers await it in the event loop); the default, a
# plain function, runs on a worker thread in both servers.
echo = async_echo if os.environ.get("BENCH_ECHO") == "async" else sync_echo
echo.__name__ = "echo"


def _toolmesh_tools(n: int) -> list[Tool]:
    return [tool(echo, name="echo"), *(tool(_numbered(i)) for i in range(n))]


TOOLS = _toolmesh_tools(int(os.environ.get("BENCH_MCP_TOOLS", "0")))


def sdk_server(n: int) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench", log_level="WARNING")
    server.add_tool(echo, name="echo")
    for i in range(n):
        server.add_tool(_numbered(i))
    server.run("stdio")


if __name__ == "__main__":
    sdk_server(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
