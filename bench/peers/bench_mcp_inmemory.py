"""MCP Python SDK (package `mcp`, 2.x), client and server in one process, no sockets.

In mcp 2.x `FastMCP` is renamed `mcp.server.mcpserver.MCPServer`, and
`mcp.shared.memory.create_connected_server_and_client_session` is gone; the equivalent is
`mcp.Client(server_instance)`, which connects in-process. It has two paths, both measured:

  mode="auto"   (the default): protocol 2026-07-28, a DirectDispatcher pair; requests go to the
                server's handler by direct await, no JSON-RPC framing, no streams.
  mode="legacy": protocol 2025-11-25 initialize handshake; JSON-RPC message objects over a pair of
                anyio memory streams (InMemoryTransport), i.e. what v1's
                create_connected_server_and_client_session did.

Measures, per mode:
  echo:       sequential `call_tool("echo", {"text": "hello"})`, N_CALLS calls per run.
  list_tools: a second server with 1000 registered tools (+ echo); `list_tools(cache_mode="bypass")`
              (the 2.x client caches listings by default; bypass forces a server round trip),
              N_LISTS per run.
  connect:    time for `async with Client(server)` to be ready (in-process handshake).

Run: $VENV/bin/python bench_mcp_inmemory.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _servers import mcp_server  # noqa: E402

REPEATS = int(os.environ.get("PEERBENCH_REPEATS", "3"))
N_CALLS = 2000
N_TOOLS = 1000
N_LISTS = 20
WARMUP = 100


async def bench_mode(mode: str, srv, big) -> dict:
    from mcp import Client

    out: dict = {}
    connects = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        async with Client(srv, mode=mode) as c:
            connects.append((time.perf_counter() - t0) * 1e3)
    out["connect_ms"] = C.summarize_values(connects)

    async with Client(srv, mode=mode) as c:
        out["protocol_version"] = c.protocol_version
        r = await c.call_tool("echo", {"text": "hello"})
        assert not r.is_error and r.content[0].text == "hello", r

        async def call():
            await c.call_tool("echo", {"text": "hello"})

        for _ in range(WARMUP):
            await call()
        out["echo_sequential"] = C.summarize(
            [await C.time_sequential(call, N_CALLS) for _ in range(REPEATS)]
        )

    async with Client(big, mode=mode) as c:
        lt = await c.list_tools(cache_mode="bypass")
        assert len(lt.tools) == N_TOOLS + 1, len(lt.tools)
        out["list_tools_n_tools"] = len(lt.tools)
        out["list_tools_json_bytes"] = len(lt.model_dump_json(by_alias=True, exclude_none=True))

        async def lst():
            await c.list_tools(cache_mode="bypass")

        for _ in range(3):
            await lst()
        out["list_tools_1000"] = C.summarize(
            [await C.time_sequential(lst, N_LISTS) for _ in range(REPEATS)]
        )
    return out


async def main() -> dict:
    res: dict = {
        "bench": "mcp_inmemory",
        "versions": C.versions(),
        "machine": C.machine(),
        "repeats": REPEATS,
        "n_calls": N_CALLS,
        "n_lists": N_LISTS,
    }
    srv, _ = mcp_server(0)
    big, info = mcp_server(N_TOOLS)
    res["register_1000_tools_s"] = info["register_s"]
    for mode in ("auto", "legacy"):
        if mode != "auto" and C.over_budget():
            res.setdefault("skipped", []).append(f"{mode}: soft budget {C.SOFT_BUDGET_S} s reached")
            continue
        res[mode] = await bench_mode(mode, srv, big)
    return res


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = asyncio.run(main())
    result["children_left"] = C.assert_no_children_left()
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    C.emit(result)
