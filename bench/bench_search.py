"""Issue 8's benchmark: search quality, and listing and search at catalogue scale, vs MCPServer.

    .venv/bin/python bench/bench_search.py [--only retrieval,scale,mcp] [--sizes 100,1000,10000]
                                            [--split test] [--hybrid] [--repeats 5]

retrieval  recall@1, recall@5 and nDCG@10 on bench/retrieval (held-out ``test`` queries by
           default) for: the seed's substring match, plain BM25 (bm25s, concatenated text),
           toolmesh lexical (BM25F), and with --hybrid toolmesh hybrid (needs the semantic extra
           and the model package; the first run embeds the catalogue, later runs read the cache).
scale      the real catalogue (1,519 tools from MCP servers, GitHub's OpenAPI and NESTFUL),
           repeated under prefixes up to each size: time to register (Tools built from JSON
           Schema, then the Toolkit with its index), default listing in-process (first after a
           change, and cached), the A2E wire listing (tool/list/resp encoded), search p50/p95 over
           the retrieval queries and over short keyword queries, memory per tool (tracemalloc).
mcp        the same catalogue in the MCP SDK's MCPServer (one function per tool, with the tool's
           parameters as its signature): registration time, memory per tool, and list_tools over
           the in-memory Client (cache bypassed), for the same sizes.

Times are medians of --repeats runs, interleaved between toolmesh and MCPServer where both run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import keyword
import os
import re
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "retrieval"))
sys.path.insert(0, str(HERE.parent / "src"))

import evaluate as E  # noqa: E402

from toolmesh import ToolDefinition, Toolkit  # noqa: E402
from toolmesh.protocol import ToolListResponse, encode  # noqa: E402
from toolmesh.sources.base import ToolSet  # noqa: E402
from toolmesh.tools import Tool, ToolContext  # noqa: E402

SHORT_QUERIES = [
    "create issue",
    "search flights",
    "read file",
    "list pull requests",
    "weather forecast",
    "send slack message",
    "hotel reviews",
    "git commit",
    "delete repository webhook",
    "currency exchange rate",
]


async def _noop(arguments: dict[str, Any], ctx: ToolContext) -> Any:
    return None


def catalogue(size: int) -> list[dict[str, Any]]:
    """``size`` tool records: the real set, then copies of it under prefixes s1_, s2_, ..."""
    base = E.load_tools()
    out = []
    copy = 0
    while len(out) < size:
        for record in base:
            if len(out) >= size:
                break
            name = record["name"] if copy == 0 else f"s{copy}_{record['name']}"
            out.append({**record, "name": name})
        copy += 1
    return out


def build_tools(records: list[dict[str, Any]]) -> list[Tool]:
    return [
        Tool(
            ToolDefinition(name=r["name"], description=r["description"], tags=r["tags"]),
            _noop,
            source="bench",
            input_schema=r["input_schema"],
        )
        for r in records
    ]


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# -- retrieval --------------------------------------------------------------------------------------


def retrieval(split: str, hybrid: bool) -> list[dict[str, Any]]:
    defs = E.definitions(E.load_tools())
    queries = E.load_queries(split)
    names = ["substring", "bm25", "bm25-stemmed", "lexical"] + (["hybrid"] if hybrid else [])
    rows = []
    for name in names:
        started = time.perf_counter()
        ranker = E.RANKERS[name](defs)
        build = time.perf_counter() - started
        result = E.evaluate(ranker, queries)
        rows.append({"ranker": name, "build_s": round(build, 2), **result})
        print(
            f"  {name:14} R@1 {result['recall@1']:.3f}  R@5 {result['recall@5']:.3f}  "
            f"nDCG@10 {result['ndcg@10']:.3f}  {result['ms_per_query']:.2f} ms/query",
            flush=True,
        )
    return rows


# -- toolmesh at scale ------------------------------------------------------------------------------


def toolmesh_scale(size: int, repeats: int) -> dict[str, Any]:
    records = catalogue(size)
    register, assemble, assemble_cpu, cold, warm, wire, wire_bytes = [], [], [], [], [], [], []
    indexing: list[float] = []
    kit: Toolkit | None = None
    for _ in range(repeats):
        kit = None
        gc.collect()
        started = time.perf_counter()
        tools = build_tools(records)
        built = time.perf_counter()
        cpu = time.process_time()
        kit = Toolkit(ToolSet(tools, name="catalogue"))
        assemble_cpu.append(time.process_time() - cpu)
        done = time.perf_counter()
        register.append(done - started)
        assemble.append(done - built)
        gc.collect()
        started = time.perf_counter()
        listing = kit.definitions()
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(100):
            listing = kit.definitions()
        warm.append((time.perf_counter() - started) / 100)
        started = time.perf_counter()
        data = encode(ToolListResponse(req_id="r", tools=listing))
        wire.append(time.perf_counter() - started)
        wire_bytes.append(len(data))
        # The search index is built by the first search (a toolkit that is never searched never
        # pays for it): time that first search apart.
        started = time.perf_counter()
        kit.search("create an issue", limit=10)
        indexing.append(time.perf_counter() - started)
    assert kit is not None
    started = time.perf_counter()
    data = encode(ToolListResponse(req_id="r", tools=kit.definitions()))
    wire_again = time.perf_counter() - started
    kit = None
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kit = Toolkit(ToolSet(build_tools(records), name="catalogue"))
    kit.definitions()
    kit.search("create an issue")  # the index included
    memory = (tracemalloc.get_traced_memory()[0] - before) / size
    tracemalloc.stop()
    long_queries = [q["query"] for q in E.load_queries("all")][:300]
    search_long = _search_times(kit, long_queries)
    search_short = _search_times(kit, SHORT_QUERIES * 30)
    return {
        "tools": size,
        "register_ms": 1000 * median(register),
        "assemble_ms": 1000 * median(assemble),
        "assemble_cpu_ms": 1000 * median(assemble_cpu),
        "first_search_ms": 1000 * median(indexing),
        "list_first_ms": 1000 * median(cold),
        "list_cached_ms": 1000 * median(warm),
        "wire_list_first_ms": 1000 * median(wire),
        "wire_list_again_ms": 1000 * wire_again,
        "wire_list_bytes": int(median(wire_bytes)),
        "search_long_p50_ms": 1000 * percentile(search_long, 0.5),
        "search_long_p95_ms": 1000 * percentile(search_long, 0.95),
        "search_short_p50_ms": 1000 * percentile(search_short, 0.5),
        "search_short_p95_ms": 1000 * percentile(search_short, 0.95),
        "memory_per_tool_kb": memory / 1024,
    }


def _search_times(kit: Toolkit, queries: list[str]) -> list[float]:
    for q in queries[:20]:
        kit.search(q, limit=10)  # warm the stemmer cache
    times = []
    for q in queries:
        started = time.perf_counter()
        kit.search(q, limit=10)
        times.append(time.perf_counter() - started)
    return times


def toolmesh_incremental(size: int) -> dict[str, Any]:
    """A source of ``size`` tools changes (list_changed): 10 tools added, then 10 removed, each
    followed by a search."""
    records = catalogue(size + 10)
    source = ToolSet(build_tools(records[:size]), name="server")
    kit = Toolkit(source)
    kit.search("create issue")
    extra = build_tools(records[size:])
    # Each change is timed with the next search, which brings the index up to date.
    started = time.perf_counter()
    source.add(*extra)
    kit.search("create issue")
    added = time.perf_counter() - started
    started = time.perf_counter()
    for tool in extra:
        source._tools.remove(tool)
    source.changed()
    kit.search("create issue")
    removed = time.perf_counter() - started
    return {"tools": size, "add_10_ms": 1000 * added, "remove_10_ms": 1000 * removed}


# -- MCPServer --------------------------------------------------------------------------------------

_PY_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}
_PY_TYPES.update({"array": "list", "object": "dict"})


def mcp_function(record: dict[str, Any]) -> Any:
    """A function whose signature carries the tool's parameters (as MCPServer derives schemas)."""
    params = []
    seen = set()
    required = set(record["input_schema"].get("required", []))
    props = record["input_schema"].get("properties", {})
    for name, prop in sorted(props.items(), key=lambda kv: kv[0] not in required):
        ident = re.sub(r"\W", "_", name)
        if not ident or ident[0].isdigit() or keyword.iskeyword(ident) or ident in seen:
            continue
        seen.add(ident)
        kind = prop.get("type") if isinstance(prop, dict) else None
        hint = _PY_TYPES.get(kind if isinstance(kind, str) else "string", "str")
        params.append(f"{ident}: {hint}" if name in required else f"{ident}: {hint} | None = None")
    source = f"def f({', '.join(params)}) -> str:\n    return ''\n"
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    return namespace["f"]


def mcp_scale(size: int, repeats: int) -> dict[str, Any]:
    import logging

    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    logging.disable(logging.WARNING)  # MCPServer warns about names with "(": not what is measured
    records = catalogue(size)
    functions = [mcp_function(r) for r in records]
    register, memory, lists = [], [], []
    for _ in range(repeats):
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        server = MCPServer("bench", log_level="WARNING")
        for fn, r in zip(functions, records, strict=True):
            server.add_tool(fn, name=r["name"], description=r["description"])
        register.append(time.perf_counter() - started)
        memory.append((tracemalloc.get_traced_memory()[0] - before) / size)
        tracemalloc.stop()

        async def list_once(server: Any = server) -> float:
            async with Client(server) as client:
                await client.list_tools(cache_mode="bypass")
                started = time.perf_counter()
                listed = await client.list_tools(cache_mode="bypass")
                elapsed = time.perf_counter() - started
                assert len(listed.tools) == size
                return elapsed

        lists.append(asyncio.run(list_once()))
    return {
        "tools": size,
        "register_ms": 1000 * median(register),
        "memory_per_tool_kb": median(memory) / 1024,
        "list_ms": 1000 * median(lists),
    }


def toolmesh_client_list(size: int, repeats: int) -> float:
    """tool/list over toolmesh's in-process client (the client's cache bypassed), median ms."""
    from toolmesh.client import connect_async

    kit = Toolkit(ToolSet(build_tools(catalogue(size)), name="catalogue"))

    async def run() -> float:
        client = await connect_async(kit)
        try:
            times = []
            for _ in range(repeats + 1):
                client.invalidate_tools_cache()
                started = time.perf_counter()
                listed = await client.list_tools()
                times.append(time.perf_counter() - started)
                assert len(listed) == size
            return median(times[1:])
        finally:
            await client.close()

    return 1000 * asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="retrieval,scale,mcp")
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--split", default="test", choices=["dev", "test", "all"])
    parser.add_argument("--hybrid", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    only = set(args.only.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, Any] = {"load_average": os.getloadavg()}
    print(f"load average {results['load_average']}")
    if "retrieval" in only:
        print(f"retrieval ({args.split} queries)")
        results["retrieval"] = retrieval(args.split, args.hybrid)
    if "scale" in only or "mcp" in only:
        results["scale"] = []
        for size in sizes:
            row: dict[str, Any] = {"tools": size}
            if "scale" in only:
                row["toolmesh"] = toolmesh_scale(size, args.repeats)
                row["toolmesh"]["client_list_ms"] = toolmesh_client_list(size, args.repeats)
                row["incremental"] = toolmesh_incremental(size)
            if "mcp" in only:
                row["mcp"] = mcp_scale(size, max(1, min(args.repeats, 3)))
            results["scale"].append(row)
            print(json.dumps(row, default=lambda v: round(v, 3)), flush=True)
    results["load_average_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=lambda v: round(v, 4)))


if __name__ == "__main__":
    main()
