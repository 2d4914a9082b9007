"""MCP both ways, measured against the official SDK in the same run (ratios, not absolutes).

(1) source overhead: `echo` of an SDK MCPServer over stdio, called through toolmesh's MCP
    source (the whole pipeline: validation, deadline, events, audit) vs directly with the SDK's
    `mcp.Client` on an identical server. Goal: overhead <= 10%.
(2) server: toolmesh's MCP server (`toolmesh serve --mcp-stdio`, audit to a SQLite file) vs the
    SDK's own MCPServer, both serving `echo` plus 1,000 more tools, both driven by the same
    clients: a thin JSON-RPC client (shows the servers' own cost) and the SDK's `mcp.Client`.
    Goals: calls/s >= 2x, listing 1,000 tools >= 5x faster.

Runs are interleaved (A, B, A, B, ...) and summarized by their medians, as in
/work/shared/bench-peers. Everything runs on this machine over pipes; no network.

    .venv/bin/python bench/bench_mcp.py            # ~1 minute; BENCH_REPEATS=5 by default
    BENCH_ECHO=async .venv/bin/python bench/bench_mcp.py   # echo as a coroutine in both servers
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))
CALLS = int(os.environ.get("BENCH_CALLS", "500"))
LISTS = int(os.environ.get("BENCH_LISTS", "10"))
N_TOOLS = 1000
WARMUP = 50


def sdk_command(n_tools: int) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "mcp_servers.py"), "sdk", str(n_tools)]


def toolmesh_command(audit: str) -> list[str]:
    base = [sys.executable, "-m", "toolmesh", "serve", "--mcp-stdio"]
    return [*base, "--tools", "bench.mcp_servers:TOOLS", "--audit", audit]


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> float:
    """Calls per second over n sequential calls."""
    start = time.perf_counter()
    for _ in range(n):
        await call()
    return n / (time.perf_counter() - start)


# -- (1) the MCP source vs the SDK client ------------------------------------------------------


async def source_overhead() -> dict[str, Any]:
    from mcp import Client, StdioServerParameters
    from toolmesh import Toolkit
    from toolmesh.mcp.config import parse_mcp_server
    from toolmesh.mcp.source import mcp_source

    command = sdk_command(0)
    params = StdioServerParameters(command=command[0], args=command[1:])
    config = parse_mcp_server("bench", {"command": command[0], "args": command[1:]})
    toolkit = await Toolkit(mcp_source(config)).start()
    arguments = {"text": "hello"}
    direct_rates, source_rates = [], []
    async with Client(params) as client:

        async def direct() -> None:
            await client.call_tool("echo", arguments)

        async def through_toolmesh() -> None:
            result = await toolkit.execute("bench_echo", arguments)
            if not result.success:
                raise RuntimeError(result.error)

        for call in (direct, through_toolmesh):
            for _ in range(WARMUP):
                await call()
        for _ in range(REPEATS):
            direct_rates.append(await timed(direct, CALLS))
            source_rates.append(await timed(through_toolmesh, CALLS))
    await toolkit.close()
    direct_median = statistics.median(direct_rates)
    source_median = statistics.median(source_rates)
    return {
        "direct_calls_per_s": round(direct_median, 1),
        "source_calls_per_s": round(source_median, 1),
        "overhead": round(direct_median / source_median - 1, 4),
        "runs": {
            "direct": [round(r) for r in direct_rates],
            "source": [round(r) for r in source_rates],
        },
    }


# -- (2) toolmesh's MCP server vs the SDK's MCPServer -----------------------------------------


class RawClient:
    """A thin JSON-RPC client over a server's stdin/stdout (2025-11-25 handshake)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command = command
        self.env = env
        self.next_id = 0

    async def __aenter__(self) -> RawClient:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=ROOT,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=1 << 26,
        )
        info = {"name": "bench", "version": "0"}
        await self.request(
            "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": info}
        )
        self.write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    def write(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        self.write({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        assert self.process.stdout is not None
        while True:
            reply: dict[str, Any] = json.loads(await self.process.stdout.readline())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply["result"]  # type: ignore[no-any-return]


async def server_comparison(audit: str) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "BENCH_MCP_TOOLS": str(N_TOOLS), "PYTHONPATH": str(ROOT)}
    servers = {"sdk": sdk_command(N_TOOLS), "toolmesh": toolmesh_command(audit)}
    arguments = {"text": "hello"}
    raw_calls: dict[str, list[float]] = {name: [] for name in servers}
    raw_lists: dict[str, list[float]] = {name: [] for name in servers}
    sdk_calls: dict[str, list[float]] = {name: [] for name in servers}
    sdk_lists: dict[str, list[float]] = {name: [] for name in servers}

    for _ in range(REPEATS):
        for name, command in servers.items():
            async with RawClient(command, env) as raw:
                listed = await raw.request("tools/list", {})
                assert len(listed["tools"]) >= N_TOOLS + 1, name

                async def call(raw: RawClient = raw) -> None:
                    result = await raw.request(
                        "tools/call", {"name": "echo", "arguments": arguments}
                    )
                    assert result["content"][0]["text"] == "hello"

                async def list_tools(raw: RawClient = raw) -> None:
                    await raw.request("tools/list", {})

                await timed(call, WARMUP)
                raw_calls[name].append(await timed(call, CALLS))
                raw_lists[name].append(1 / await timed(list_tools, LISTS))

            params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=ROOT)
            async with Client(params, mode="legacy") as client:
                await client.list_tools(cache_mode="bypass")

                async def sdk_call(client: Client = client) -> None:
                    await client.call_tool("echo", arguments)

                async def sdk_list(client: Client = client) -> None:
                    await client.list_tools(cache_mode="bypass")

                await timed(sdk_call, WARMUP)
                sdk_calls[name].append(await timed(sdk_call, CALLS))
                sdk_lists[name].append(1 / await timed(sdk_list, LISTS))

    def median(values: list[float]) -> float:
        return statistics.median(values)

    return {
        "thin_client": {
            "calls_per_s": {n: round(median(v)) for n, v in raw_calls.items()},
            "calls_ratio": round(median(raw_calls["toolmesh"]) / median(raw_calls["sdk"]), 2),
            "list_1000_ms": {n: round(median(v) * 1000, 2) for n, v in raw_lists.items()},
            "list_speedup": round(median(raw_lists["sdk"]) / median(raw_lists["toolmesh"]), 1),
        },
        "sdk_client": {
            "calls_per_s": {n: round(median(v)) for n, v in sdk_calls.items()},
            "calls_ratio": round(median(sdk_calls["toolmesh"]) / median(sdk_calls["sdk"]), 2),
            "list_1000_ms": {n: round(median(v) * 1000, 2) for n, v in sdk_lists.items()},
            "list_speedup": round(median(sdk_lists["sdk"]) / median(sdk_lists["toolmesh"]), 1),
        },
    }


async def main() -> None:
    load_before = os.getloadavg()
    echo = os.environ.get("BENCH_ECHO", "sync")
    report: dict[str, Any] = {"repeats": REPEATS, "calls": CALLS, "lists": LISTS, "echo": echo}
    report["source"] = await source_overhead()
    with tempfile.TemporaryDirectory() as folder:
        report["server"] = await server_comparison(str(Path(folder) / "audit.db"))
    report["loadavg"] = {"start": load_before, "end": os.getloadavg()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
