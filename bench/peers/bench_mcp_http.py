"""MCP Python SDK (package `mcp`, 2.x) over streamable HTTP, server in its own process.

Server: `_servers.py mcp_http` = MCPServer with `echo`, `srv.streamable_http_app()` (SDK defaults:
stateful sessions, SSE-framed responses) under uvicorn on 127.0.0.1, ephemeral port, h11, asyncio
loop, access log off, log level warning.
Client: `mcp.Client("http://127.0.0.1:PORT/mcp")` (its own httpx2 AsyncClient, SDK default timeouts).

Measures, for client mode="auto" (default; settles on protocol 2026-07-28) and mode="legacy"
(2025-11-25 initialize handshake + Mcp-Session-Id):
  connect:    `async with Client(url)` ready (probe/handshake), CONNECTS runs.
  sequential: N_SEQ sequential `call_tool("echo", ...)` per run.
  concurrent: N_CONC calls total by CONC asyncio workers sharing one Client session, per run.
Optionally (PEERBENCH_MCP_HTTP_JSON=1) the same against a server with json_response=True.

Run: $VENV/bin/python bench_mcp_http.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPEATS = int(os.environ.get("PEERBENCH_REPEATS", "3"))
CONNECTS = 5
N_SEQ = 500
N_CONC = 2000
CONC = 50
WARMUP = 50
MODES = os.environ.get("PEERBENCH_MCP_MODES", "auto,legacy").split(",")


async def bench_mode(url: str, mode: str, srv: C.Server) -> dict:
    from mcp import Client

    out: dict = {}
    connects = []
    for _ in range(CONNECTS):
        t0 = time.perf_counter()
        async with Client(url, mode=mode):
            connects.append((time.perf_counter() - t0) * 1e3)
    out["connect_ms"] = C.summarize_values(connects, 2)

    async with Client(url, mode=mode) as c:
        out["protocol_version"] = c.protocol_version
        r = await c.call_tool("echo", {"text": "hello"})
        assert not r.is_error and r.content[0].text == "hello", r

        async def call():
            r = await c.call_tool("echo", {"text": "hello"})
            if r.is_error:
                raise RuntimeError(r)

        for _ in range(WARMUP):
            await call()
        out["echo_sequential"] = C.summarize(
            [await C.time_sequential(call, N_SEQ, srv.pid) for _ in range(REPEATS)]
        )
        await C.time_concurrent(call, 200, CONC)
        out["echo_concurrent"] = C.summarize(
            [await C.time_concurrent(call, N_CONC, CONC, srv.pid) for _ in range(REPEATS)]
        )
    out["server_rss_after_kib"] = srv.rss_kib()
    return out


async def main() -> dict:
    res: dict = {
        "bench": "mcp_streamable_http",
        "versions": C.versions("opentelemetry-api"),
        "machine": C.machine(),
        "repeats": REPEATS,
        "n_seq": N_SEQ,
        "n_conc": N_CONC,
        "concurrency": CONC,
    }
    variants = [("default", ())]
    if os.environ.get("PEERBENCH_MCP_HTTP_JSON") == "1":
        variants.append(("json_response", ("--json-response",)))
    for name, flags in variants:
        with C.Server("mcp_http", *flags) as srv:
            url = f"http://127.0.0.1:{srv.port}/mcp"
            v = {
                "server": {
                    k: srv.info.get(k)
                    for k in (
                        "rss_ready_kib",
                        "uvicorn_http",
                        "uvicorn_loop",
                        "json_response",
                        "stateless",
                    )
                }
            }
            for i, mode in enumerate(MODES):
                if (i or name != "default") and C.over_budget():
                    res.setdefault("skipped", []).append(
                        f"{name}/{mode}: soft budget {C.SOFT_BUDGET_S} s reached"
                    )
                    continue
                v[mode] = await bench_mode(url, mode, srv)
            res[name] = v
    return res


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = asyncio.run(main())
    result["children_left"] = C.assert_no_children_left()
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    C.emit(result)
