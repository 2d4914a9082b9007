"""Memory and registration cost of the MCP Python SDK (2.x) HTTP server with 10,000 tools.

Server: `_servers.py mcp_http --tools N` = MCPServer with `echo` plus N distinct generated tools
(`def tool_i(text: str) -> str`, each its own function object, docstring and name), registered with
`srv.add_tool(fn)`; then `streamable_http_app()` under uvicorn (127.0.0.1, ephemeral port).
The server itself reports: RSS after import+construct, wall time of the N add_tool calls, RSS after
registering, RSS once uvicorn serves. This script then reads the server's VmRSS from /proc, does one
`list_tools` over HTTP (cache bypassed) and one `call_tool("echo")`, and reads VmRSS again.

Each configuration (N=0 and N=10,000) runs in a fresh server process REPEATS times.

Run: $VENV/bin/python bench_mcp_memory.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPEATS = int(os.environ.get("PEERBENCH_REPEATS", "3"))
N_TOOLS = int(os.environ.get("PEERBENCH_N_TOOLS", "10000"))
BUDGET_S = float(os.environ.get("PEERBENCH_BUDGET_S", "55"))
T_START = time.perf_counter()


async def one(n: int) -> dict:
    from mcp import Client

    with C.Server("mcp_http", "--tools", str(n), ready_timeout=50) as srv:
        info = dict(srv.info)
        r: dict = {
            k: info.get(k)
            for k in (
                "import_and_construct_s",
                "rss_before_register_kib",
                "register_s",
                "register_us_per_tool",
                "rss_after_register_kib",
                "rss_ready_kib",
            )
        }
        r["rss_ready_proc_kib"] = srv.rss_kib()
        async with Client(f"http://127.0.0.1:{srv.port}/mcp") as c:
            t0 = time.perf_counter()
            lt = await c.list_tools(cache_mode="bypass")
            r["list_tools_http_s"] = round(time.perf_counter() - t0, 4)
            assert len(lt.tools) == n + 1, len(lt.tools)
            r["list_tools_json_bytes"] = len(lt.model_dump_json(by_alias=True, exclude_none=True))
            res = await c.call_tool("echo", {"text": "hello"})
            assert res.content[0].text == "hello"
        r["rss_after_list_kib"] = srv.rss_kib()
    return r


def agg(rows: list[dict]) -> dict:
    out = {}
    for k in rows[0]:
        vals = [row[k] for row in rows if isinstance(row.get(k), (int, float))]
        if vals:
            out[k] = C.summarize_values(vals, 4 if isinstance(vals[0], float) else 0)
    return out


async def main() -> dict:
    res: dict = {
        "bench": "mcp_memory",
        "versions": C.versions(),
        "machine": C.machine(),
        "repeats": REPEATS,
        "n_tools": N_TOOLS,
    }
    base = [await one(0) for _ in range(REPEATS)]
    big = []
    # Stay under ~55 s: start another big run only if the last one would still fit.
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        big.append(await one(N_TOOLS))
        last = time.perf_counter() - t0
        if time.perf_counter() - T_START + last > BUDGET_S and len(big) < REPEATS:
            res["budget_note"] = f"stopped after {len(big)} big runs to stay under {BUDGET_S} s"
            break
    res["big_runs"] = len(big)
    res["one_tool"] = agg(base)
    res[f"{N_TOOLS}_tools"] = agg(big)
    b = statistics_median([r["rss_after_list_kib"] for r in base])
    g = statistics_median([r["rss_after_list_kib"] for r in big])
    res["delta_rss_after_list_kib"] = g - b
    res["delta_rss_per_tool_kib"] = round((g - b) / N_TOOLS, 2)
    res["delta_rss_after_register_per_tool_kib"] = round(
        (
            statistics_median([r["rss_after_register_kib"] for r in big])
            - statistics_median([r["rss_before_register_kib"] for r in big])
        )
        / N_TOOLS,
        2,
    )
    return res


def statistics_median(v):
    import statistics

    return statistics.median(v)


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = asyncio.run(main())
    result["children_left"] = C.assert_no_children_left()
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    C.emit(result)
