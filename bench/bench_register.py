"""Registering 10,000 function tools and listing them: toolmesh against the MCP SDK's MCPServer.

Each measurement runs in a fresh process (so RSS deltas belong to it alone), the two sides
interleaved, ``--repeats`` times; medians are reported with their ratios. Both register the
same generated functions, one call per tool, exactly as ../shared/bench-peers does for MCP
(``def tool_i(text: str) -> str`` with its own name and docstring):

- toolmesh: ``toolkit.register(fn)`` (builds the schema and the definition; the search index is
  built by the first search, timed apart, with the memory it adds)
- MCP: ``MCPServer.add_tool(fn)`` (mcp 2.x)

Listing: toolmesh ``toolkit.definitions()``, MCP ``await server.list_tools()`` (model objects
both); then, separately timed, the two plus ``model_dump`` of each (the wire form a list
response sends).

    .venv/bin/python bench/bench_register.py [--tools 10000] [--repeats 3]

Needs the ``bench`` extra (``pip install -e '.[bench]'``) for the MCP side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def make_tool(i: int) -> Callable[[str], str]:
    def fn(text: str) -> str:
        return text

    fn.__name__ = f"tool_{i}"
    fn.__qualname__ = f"tool_{i}"
    fn.__doc__ = f"Tool number {i}: returns its text argument unchanged."
    return fn


def echo(text: str) -> str:
    """Return text unchanged."""
    return text


def measure_toolmesh(n: int) -> dict[str, Any]:
    from toolmesh import Toolkit

    kit = Toolkit(echo)
    fns = [make_tool(i) for i in range(n)]
    gc.collect()
    before = rss_kib()
    started, cpu = time.perf_counter(), time.process_time()
    for fn in fns:
        kit.register(fn)
    registered, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = rss_kib()
    started = time.perf_counter()
    listing = kit.definitions()
    listed = time.perf_counter() - started
    wire = [d.model_dump(mode="json") for d in listing]
    dumped = time.perf_counter() - started
    assert len(wire) == n + 1
    del wire
    gc.collect()
    started = time.perf_counter()
    kit.search("returns its text")
    indexed = time.perf_counter() - started
    return {
        "register_s": registered,
        "register_cpu_s": cpu,
        "rss_kib": after - before,
        "list_s": listed,
        "wire_s": dumped,
        "index_s": indexed,
        "rss_with_index_kib": rss_kib() - before,
    }


def measure_mcp(n: int) -> dict[str, Any]:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench", log_level="WARNING")
    server.add_tool(echo)
    fns = [make_tool(i) for i in range(n)]
    gc.collect()
    before = rss_kib()
    started, cpu = time.perf_counter(), time.process_time()
    for fn in fns:
        server.add_tool(fn)
    registered, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = rss_kib()
    started = time.perf_counter()
    tools = asyncio.run(server.list_tools())
    listed = time.perf_counter() - started
    wire = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    dumped = time.perf_counter() - started
    assert len(wire) == n + 1
    return {
        "register_s": registered,
        "register_cpu_s": cpu,
        "rss_kib": after - before,
        "list_s": listed,
        "wire_s": dumped,
    }


def child(side: str, n: int) -> None:
    result = measure_toolmesh(n) if side == "toolmesh" else measure_mcp(n)
    print(json.dumps(result))


def run_side(side: str, n: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", side, "--tools", str(n)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("toolmesh", "mcp", "pydantic")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["toolmesh", "mcp"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tools)
        return
    n = args.tools
    runs: dict[str, list[dict[str, Any]]] = {"toolmesh": [], "mcp": []}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for side in ("mcp", "toolmesh"):  # interleaved
            runs[side].append(run_side(side, n))
    load_after = os.getloadavg()

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    table = {}
    for side in runs:
        table[side] = {
            "register_us_per_tool": median(side, "register_s") / n * 1e6,
            "register_cpu_us_per_tool": median(side, "register_cpu_s") / n * 1e6,
            "rss_kib_per_tool": median(side, "rss_kib") / n,
            "list_ms": median(side, "list_s") * 1e3,
            "list_and_dump_ms": median(side, "wire_s") * 1e3,
        }
    table["toolmesh"]["first_search_ms"] = median("toolmesh", "index_s") * 1e3
    table["toolmesh"]["rss_kib_per_tool_with_index"] = median("toolmesh", "rss_with_index_kib") / n
    ratios = {
        "register_speedup": table["mcp"]["register_us_per_tool"]
        / table["toolmesh"]["register_us_per_tool"],
        "register_cpu_speedup": table["mcp"]["register_cpu_us_per_tool"]
        / table["toolmesh"]["register_cpu_us_per_tool"],
        "memory_fraction": table["toolmesh"]["rss_kib_per_tool"] / table["mcp"]["rss_kib_per_tool"],
        "list_speedup": table["mcp"]["list_ms"] / table["toolmesh"]["list_ms"],
        "list_and_dump_speedup": table["mcp"]["list_and_dump_ms"]
        / table["toolmesh"]["list_and_dump_ms"],
        "register_and_index_speedup": table["mcp"]["register_us_per_tool"]
        / (
            table["toolmesh"]["register_us_per_tool"]
            + table["toolmesh"]["first_search_ms"] * 1e3 / n
        ),
        "memory_fraction_with_index": table["toolmesh"]["rss_kib_per_tool_with_index"]
        / table["mcp"]["rss_kib_per_tool"],
    }
    report = {
        "tools": n,
        "repeats": args.repeats,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "versions": versions(),
        "median": {s: {k: round(v, 2) for k, v in t.items()} for s, t in table.items()},
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
