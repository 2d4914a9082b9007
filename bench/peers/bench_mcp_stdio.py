"""MCP Python SDK (package `mcp`, 2.x) over stdio: the client spawns the server as a subprocess.

Server: `_servers.py mcp_stdio` (MCPServer with `echo`, `srv.run("stdio")`), spawned by
`mcp.Client(StdioServerParameters(command=sys.executable, args=[...]))`, which uses
`mcp.client.stdio.stdio_client` (new session/process group; on exit: close stdin, wait 2 s, then
kill the tree).

Measures, for mode="auto" (SDK default: probe `server/discover`, here it settles on 2026-07-28)
and mode="legacy" (initialize handshake, 2025-11-25):
  cold_start: spawn + handshake + first `list_tools` (cache bypassed), COLD runs, each a fresh process.
              Also split into spawn+handshake and first list_tools.
  echo:       sequential `call_tool("echo", ...)`, N_CALLS per run, REPEATS runs in one session.

  process_floor: `python -c pass` (interpreter start), and the time each spawned server reports for
              importing mcp and constructing its MCPServer: how much of the cold start is SDK import.

Run: $VENV/bin/python bench_mcp_stdio.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPEATS = int(os.environ.get("PEERBENCH_REPEATS", "3"))
COLD = int(os.environ.get("PEERBENCH_COLD", "5"))
N_CALLS = 1000
WARMUP = 50


def params():
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[C.SERVERS, "mcp_stdio"])


def server_reports(errlog) -> list[tuple[int, float]]:
    """(pid, seconds the server spent importing mcp and building MCPServer) for each server started."""
    errlog.flush()
    errlog.seek(0)
    out = []
    for line in errlog.read().splitlines():
        if line.startswith("PEERBENCH_PID "):
            _, pid, imp = line.split()
            out.append((int(pid), float(imp)))
    return out


def ensure_dead(pids: list[int]) -> list[int]:
    """Kill (by PID) any server we spawned that is still alive; return those PIDs."""
    import signal

    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        alive.append(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


async def bench_mode(mode: str, errlog) -> dict:
    from mcp import Client

    out: dict = {}
    total, handshake, first_list, close = [], [], [], []
    for _ in range(COLD):
        t0 = time.perf_counter()
        c = Client(params(), mode=mode)
        await c.__aenter__()
        t1 = time.perf_counter()
        lt = await c.list_tools(cache_mode="bypass")
        t2 = time.perf_counter()
        assert len(lt.tools) == 1
        await c.__aexit__(None, None, None)
        t3 = time.perf_counter()
        total.append((t2 - t0) * 1e3)
        handshake.append((t1 - t0) * 1e3)
        first_list.append((t2 - t1) * 1e3)
        close.append((t3 - t2) * 1e3)
    out["cold_start_ms"] = C.summarize_values(total, 1)
    out["cold_spawn_plus_handshake_ms"] = C.summarize_values(handshake, 1)
    out["cold_first_list_tools_ms"] = C.summarize_values(first_list, 1)
    out["shutdown_ms"] = C.summarize_values(close, 1)

    async with Client(params(), mode=mode) as c:
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
    return out


def process_floor() -> dict:
    """How much of the cold start is just starting the interpreter (the SDK import is reported by each
    server itself, see server_import_and_construct_ms)."""
    import subprocess

    vals = []
    for _ in range(COLD):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        vals.append((time.perf_counter() - t0) * 1e3)
    return {"python_startup_ms": C.summarize_values(vals, 1)}


async def main(errlog) -> dict:
    res: dict = {
        "bench": "mcp_stdio",
        "versions": C.versions(),
        "machine": C.machine(),
        "repeats": REPEATS,
        "cold_runs": COLD,
        "n_calls": N_CALLS,
    }
    res["process_floor"] = process_floor()
    for mode in ("auto", "legacy"):
        if mode != "auto" and C.over_budget():
            res.setdefault("skipped", []).append(f"{mode}: soft budget {C.SOFT_BUDGET_S} s reached")
            continue
        res[mode] = await bench_mode(mode, errlog)
    return res


if __name__ == "__main__":
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errlog:
        # stdio_client writes the server's stderr to sys.stderr by default; the server prints its PID
        # there, so point our stderr at a temp file for the duration (fd-level, children inherit it).
        saved = os.dup(2)
        os.dup2(errlog.fileno(), 2)
        try:
            result = asyncio.run(main(errlog))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            reports = server_reports(errlog)
            pids = [p for p, _ in reports]
            left = ensure_dead(pids)
    result["process_floor"]["server_import_and_construct_ms"] = C.summarize_values(
        [imp * 1e3 for _, imp in reports], 1
    )
    result["servers_spawned"] = len(pids)
    result["servers_left_alive"] = left
    result["children_left"] = C.assert_no_children_left()
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    C.emit(result)
