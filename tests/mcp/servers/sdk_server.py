"""MCP servers built on the official SDK, for the tests. Run as a script:

python sdk_server.py tools      # MCPServer: wait, hold, progress, cancellations, add_tool, crash, ...
python sdk_server.py paged      # lowlevel Server whose tools/list comes in pages of two
python sdk_server.py garbage    # prints non-JSON lines to stdout, then serves `tools`
python sdk_server.py hang       # never answers (and ignores end of input)

With $GATE_PORT set, it first reports its pid to 127.0.0.1:$GATE_PORT and waits to be let go
(tests/sources/gate.py): a test can act while the server is still starting.
"""

import asyncio
import contextlib
import os
import sys
import time
from typing import Any

CANCELLED = asyncio.Event()


def tools_server() -> Any:
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("fixture")
    seen = {"cancelled": 0}

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        print("garbage from a tool", flush=True)  # stdout is the protocol: the SDK must cope
        return text

    async def sleep_noticing_cancellation(seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            seen["cancelled"] += 1
            CANCELLED.set()
            raise

    @server.tool()
    async def wait(seconds: float) -> str:
        """Wait, noticing cancellation."""
        await sleep_noticing_cancellation(seconds)
        return "waited"

    @server.tool()
    async def hold(seconds: float, ctx: Context) -> str:
        """Report progress once (the call is running at the server), then wait as `wait` does."""
        await ctx.report_progress(0, 1, "holding")
        await sleep_noticing_cancellation(seconds)
        return "held"

    @server.tool()
    async def cancelled_calls() -> int:
        """How many calls were cancelled, once one was (within 10 s)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(CANCELLED.wait(), 10)
        return seen["cancelled"]

    @server.tool()
    async def steps(count: int, pause: float, ctx: Context) -> str:
        """Report progress `count` times, `pause` seconds apart."""
        for i in range(count):
            await asyncio.sleep(pause)
            await ctx.report_progress(i + 1, count, f"step {i + 1}")
        return f"{count} steps"

    @server.tool()
    async def add_tool(name: str, ctx: Context) -> str:
        """Add a tool called `name` and announce the change."""

        def made() -> str:
            return name

        server.add_tool(made, name=name, description=f"the tool {name}")
        if ctx.request_context.protocol_version == "2026-07-28":
            await ctx.notify_tools_changed()
        else:
            await ctx.request_context.session.send_tool_list_changed()
        return "added"

    @server.tool()
    def crash() -> str:
        """Exit the server process at once."""
        sys.stderr.write("fixture: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)

    @server.tool()
    def fail() -> str:
        """Raise an error."""
        raise ValueError("this tool always fails")

    return server


def paged_server() -> Any:
    import mcp_types as types
    from mcp.server import Server

    names = [f"t{i}" for i in range(5)]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        start = int(params.cursor) if params and params.cursor else 0
        page = [
            types.Tool(name=n, description=f"tool {n}", input_schema={"type": "object"})
            for n in names[start : start + 2]
        ]
        more = start + 2 < len(names)
        return types.ListToolsResult(tools=page, next_cursor=str(start + 2) if more else None)

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

    return Server("paged", on_list_tools=list_tools, on_call_tool=call_tool)


def wait_at_the_gate() -> None:
    import socket

    told = socket.create_connection(("127.0.0.1", int(os.environ["GATE_PORT"])))
    told.sendall(b"%d\n" % os.getpid())
    told.recv(1)  # a line (or the gate's end) lets it go


def main() -> None:
    mode = sys.argv[1]
    if os.environ.get("GATE_PORT"):
        wait_at_the_gate()
    if mode == "hang":
        sys.stderr.write("fixture: hanging\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    if mode == "garbage":
        print("this is not JSON-RPC", flush=True)
        print("{not json either", flush=True)
        mode = "tools"
    if mode == "tools":
        tools_server().run("stdio")
        return
    server = paged_server()

    async def run() -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(run())


if __name__ == "__main__":
    main()
