"""Issue 2's benchmark: toolmesh's A2E host vs the official MCP SDK 2.x, same machine, same run.

The tool is `echo(text) -> text` called with {"text": "hello"}, the result checked every time.

    inprocess   toolmesh AsyncToolAPI over connect_async(Host)   vs  mcp.Client(MCPServer) in-memory
    stdio       toolmesh over `toolmesh serve --stdio`           vs  mcp.Client over an MCPServer stdio process
    http        the same raw HTTP/1.1 load client (rawhttp.py, on asyncio, and its blocking twin)
                against both servers in subprocesses; also each side's own client (toolmesh
                connect_async(url), mcp.Client on httpx2); and floor.py's bare A2E binding
                (no pipeline) against MCP with the same clients
    cold start  spawn + handshake + first list of a fresh host process; and floor.py's import
                of asyncio and pydantic (spawn to its "ready" line)

Measurements alternate between the two sides within each repeat; medians are reported with the
best run. `ratio` is toolmesh / MCP for throughput, the median over repeats of the ratio within
each (with its range; `ratio_of_medians` beside it), and cold start is toolmesh / MCP in time.

    .venv/bin/python bench/bench_a2e.py [--repeats 3] [--only inprocess,stdio,http,floor,cold]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _common as C  # noqa: E402
import rawhttp  # noqa: E402

REPO = HERE.parent
FLOOR = str(HERE / "floor.py")
TOOLS = "bench.echo_tools:TOOLS"
N_INPROC, N_STDIO, N_HTTP, N_CONC, CONC = 5000, 2000, 3000, 2000, 50
COLD = 21  # cold starts of each side; seven left a median 0.27-0.45 of MCP's from run to run


def toolmesh_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "toolmesh", *args]


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


# -- in-process --------------------------------------------------------------------------------------


async def inproc_toolmesh(audit: str) -> dict[str, Any]:
    from bench.echo_tools import TOOLS as tools
    from toolmesh import AsyncToolAPI, Host, connect_async

    host = Host(*tools, audit=audit)
    client = await connect_async(host, agent_id="bench")
    api = AsyncToolAPI(client)

    async def call() -> None:
        r = await api.call("echo", {"text": "hello"})
        if r.data != "hello":
            raise RuntimeError(r)

    for _ in range(200):
        await call()
    result = await C.time_sequential(call, N_INPROC)
    await client.close()
    await host.close()
    return result


async def inproc_mcp(mode: str) -> dict[str, Any]:
    from _servers import mcp_server
    from mcp import Client

    srv, _ = mcp_server(0)
    async with Client(srv, mode=mode) as c:

        async def call() -> None:
            r = await c.call_tool("echo", {"text": "hello"})
            if r.is_error or r.content[0].text != "hello":
                raise RuntimeError(r)

        for _ in range(200):
            await call()
        return await C.time_sequential(call, N_INPROC // 2)


# -- stdio -------------------------------------------------------------------------------------------


async def stdio_toolmesh(audit: str) -> dict[str, Any]:
    from toolmesh import AsyncToolAPI, connect_async

    client = await connect_async(
        toolmesh_cmd("serve", "--stdio", "--tools", TOOLS, "--audit", audit)
    )
    api = AsyncToolAPI(client)

    async def call() -> None:
        if (await api.call("echo", {"text": "hello"})).data != "hello":
            raise RuntimeError("bad echo")

    for _ in range(100):
        await call()
    result = await C.time_sequential(call, N_STDIO)
    await client.close()
    return result


async def stdio_mcp(mode: str) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[C.SERVERS, "mcp_stdio"])
    async with Client(params, mode=mode) as c:

        async def call() -> None:
            r = await c.call_tool("echo", {"text": "hello"})
            if r.is_error:
                raise RuntimeError(r)

        for _ in range(100):
            await call()
        return await C.time_sequential(call, N_STDIO // 2)


# -- cold start --------------------------------------------------------------------------------------


async def cold_toolmesh() -> float:
    from toolmesh import connect_async

    t0 = time.perf_counter()
    client = await connect_async(
        toolmesh_cmd("serve", "--stdio", "--tools", TOOLS, "--audit", ":memory:")
    )
    tools = await client.list_tools()
    elapsed = (time.perf_counter() - t0) * 1e3
    if [t.name for t in tools] != ["echo"]:
        raise RuntimeError(tools)
    await client.close()
    return elapsed


async def cold_floor() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, FLOOR, "import", stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    elapsed = (time.perf_counter() - t0) * 1e3
    if line != b"ready\n" or await proc.wait() != 0:
        raise RuntimeError(f"floor.py import failed ({line!r}, exit {proc.returncode})")
    return elapsed


async def cold_mcp() -> float:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[C.SERVERS, "mcp_stdio"])
    t0 = time.perf_counter()
    async with Client(params, mode="auto") as c:
        tools = await c.list_tools(cache_mode="bypass")
        elapsed = (time.perf_counter() - t0) * 1e3
        if len(tools.tools) != 1:
            raise RuntimeError(tools)
    return elapsed


# -- HTTP --------------------------------------------------------------------------------------------


class ToolmeshHttpServer:
    def __init__(self, audit: str) -> None:
        self.audit = audit

    def __enter__(self) -> ToolmeshHttpServer:
        self.proc = subprocess.Popen(
            toolmesh_cmd(
                "serve",
                "--http",
                "127.0.0.1:0",
                "--tools",
                TOOLS,
                "--audit",
                self.audit,
                "--max-parallel",
                "64",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
            text=True,
        )
        C._CHILDREN[self.proc.pid] = self.proc
        assert self.proc.stdout is not None
        url = self.proc.stdout.readline().strip()
        self.port = int(url.rsplit(":", 1)[1])
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class FloorHttpServer(ToolmeshHttpServer):
    """floor.py's bare A2E binding; it exits when its stdin closes."""

    def __init__(self) -> None:
        super().__init__("")

    def __enter__(self) -> FloorHttpServer:
        self.proc = subprocess.Popen(
            [sys.executable, FLOOR, "http"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        C._CHILDREN[self.proc.pid] = self.proc
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().strip().rsplit(":", 1)[1])
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        super().__exit__(*exc)


def http_server(side: str, audit: str) -> Any:
    if side == "toolmesh":
        return ToolmeshHttpServer(audit)
    return FloorHttpServer() if side == "floor" else C.Server("mcp_http")


# The messages every load client sends, and the checks of their answers.
HANDSHAKE = {"type": "handshake/req", "id": "hs", "agent_caps": ["tools"]}
MCP_ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
MCP_INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()


def a2e_call(counter: int) -> dict[str, Any]:
    return {
        "type": "tool/call/req",
        "id": f"c{counter}",
        "tool_name": "echo",
        "arguments": {"text": "hello"},
    }


def check_a2e(reply: dict[str, Any]) -> None:
    if reply.get("type") != "tool/call/resp" or reply["data"]["data"] != "hello":
        raise RuntimeError(reply)


def mcp_call(counter: int) -> bytes:
    message = {
        "jsonrpc": "2.0",
        "id": counter,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hello"}},
    }
    return json.dumps(message).encode()


def mcp_session(status: int, head: dict[str, str], body: bytes) -> dict[str, str]:
    """The headers of an MCP session's requests, from its initialize answer."""
    if status != 200:
        raise RuntimeError(f"initialize answered {status}: {body[:200]!r}")
    return {
        **MCP_ACCEPT,
        "mcp-session-id": head["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }


def check_mcp(body: bytes) -> None:
    payloads = rawhttp.sse_payloads(body) if b"data:" in body else [json.loads(body)]
    result = payloads[-1]["result"]
    if result["content"][0]["text"] != "hello":
        raise RuntimeError(result)


async def raw_toolmesh_client(port: int, pool: int = 1) -> tuple[Any, Any]:
    """A sequential/concurrent `call()` on the raw client, plus a closer."""
    control = await rawhttp.Connection.open("127.0.0.1", port)
    _status, _, body = await control.request("POST", "/session")
    session = json.loads(body)["session_id"]
    headers = {"X-Session-Id": session, "Content-Type": "application/json"}
    stream_conn = await rawhttp.Connection.open("127.0.0.1", port)
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def pump() -> None:
        async for message in stream_conn.events("/stream", {"X-Session-Id": session}):
            future = waiting.pop(message.get("req_id", ""), None)
            if future is not None:
                future.set_result(message)

    pump_task = asyncio.ensure_future(pump())
    counter = 0

    async def send(conn: rawhttp.Connection, message: dict[str, Any]) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        waiting[message["id"]] = future
        status, _, _ = await conn.request("POST", "/send", headers, json.dumps(message).encode())
        if status != 200:
            raise RuntimeError(status)
        return await future

    await send(control, HANDSHAKE)
    conns = [control] + [await rawhttp.Connection.open("127.0.0.1", port) for _ in range(pool - 1)]
    free: asyncio.Queue[rawhttp.Connection] = asyncio.Queue()
    for conn in conns:
        free.put_nowait(conn)

    async def call() -> None:
        nonlocal counter
        counter += 1
        conn = await free.get()
        try:
            reply = await send(conn, a2e_call(counter))
        finally:
            free.put_nowait(conn)
        check_a2e(reply)

    async def close() -> None:
        pump_task.cancel()
        await asyncio.gather(pump_task, return_exceptions=True)
        for conn in [*conns, stream_conn]:
            await conn.close()

    return call, close


async def raw_mcp_client(port: int, pool: int = 1) -> tuple[Any, Any]:
    """The same raw client speaking MCP streamable HTTP (2025-11-25 handshake, SSE answers)."""
    first = await rawhttp.Connection.open("127.0.0.1", port)
    init = json.dumps(MCP_INIT).encode()
    headers = mcp_session(*await first.request("POST", "/mcp", MCP_ACCEPT, init))
    await first.request("POST", "/mcp", headers, MCP_INITIALIZED)
    conns = [first] + [await rawhttp.Connection.open("127.0.0.1", port) for _ in range(pool - 1)]
    free: asyncio.Queue[rawhttp.Connection] = asyncio.Queue()
    for conn in conns:
        free.put_nowait(conn)
    counter = 0

    async def call() -> None:
        nonlocal counter
        counter += 1
        conn = await free.get()
        try:
            _status, _head, body = await conn.request("POST", "/mcp", headers, mcp_call(counter))
        finally:
            free.put_nowait(conn)
        check_mcp(body)

    async def close() -> None:
        for conn in conns:
            await conn.close()

    return call, close


def blocking_a2e_client(port: int) -> Any:
    """A sequential `call()` over A2E's HTTP binding on rawhttp.BlockingConnection."""
    control = rawhttp.BlockingConnection("127.0.0.1", port)
    _status, _, body = control.request("POST", "/session")
    session = json.loads(body)["session_id"]
    headers = {"X-Session-Id": session, "Content-Type": "application/json"}
    stream = rawhttp.BlockingConnection("127.0.0.1", port)
    stream.open_events("/stream", {"X-Session-Id": session})
    counter = 0

    def send(message: dict[str, Any]) -> dict[str, Any]:
        status, _, _ = control.request("POST", "/send", headers, json.dumps(message).encode())
        if status != 200:
            raise RuntimeError(status)
        while True:
            reply = stream.next_event()
            if reply.get("req_id") == message["id"]:
                return reply

    send(HANDSHAKE)

    async def call() -> None:
        nonlocal counter
        counter += 1
        check_a2e(send(a2e_call(counter)))

    def close() -> None:
        control.close()
        stream.close()

    return call, close


def blocking_mcp_client(port: int) -> Any:
    """The same blocking client speaking MCP streamable HTTP (as raw_mcp_client does)."""
    conn = rawhttp.BlockingConnection("127.0.0.1", port)
    headers = mcp_session(*conn.request("POST", "/mcp", MCP_ACCEPT, json.dumps(MCP_INIT).encode()))
    conn.request("POST", "/mcp", headers, MCP_INITIALIZED)
    counter = 0

    async def call() -> None:
        nonlocal counter
        counter += 1
        check_mcp(conn.request("POST", "/mcp", headers, mcp_call(counter))[2])

    return call, conn.close


async def http_blocking(side: str, audit: str) -> dict[str, Any]:
    with http_server(side, audit) as server:
        maker = blocking_mcp_client if side == "mcp" else blocking_a2e_client
        call, close = maker(server.port)
        for _ in range(100):
            await call()
        result = await C.time_sequential(call, N_HTTP, server.pid)
        close()
    return result


async def http_raw(side: str, audit: str, concurrency: int) -> dict[str, Any]:
    with http_server(side, audit) as server:
        maker = raw_mcp_client if side == "mcp" else raw_toolmesh_client
        call, close = await maker(server.port, pool=concurrency)
        for _ in range(100):
            await call()
        if concurrency == 1:
            result = await C.time_sequential(call, N_HTTP, server.pid)
        else:
            result = await C.time_concurrent(call, N_CONC, concurrency, server.pid)
        await close()
    return result


async def http_native(side: str, audit: str) -> dict[str, Any]:
    server: Any = ToolmeshHttpServer(audit) if side == "toolmesh" else C.Server("mcp_http")
    with server:
        url = f"http://127.0.0.1:{server.port}"
        if side == "toolmesh":
            from toolmesh import connect_async

            client = await connect_async(url)

            async def call() -> None:
                if (await client.call_tool("echo", {"text": "hello"})).data != "hello":
                    raise RuntimeError("bad echo")

            for _ in range(50):
                await call()
            result = await C.time_sequential(call, N_HTTP // 2, server.pid)
            await client.close()
            return result
        from mcp import Client

        async with Client(url + "/mcp", mode="auto") as c:

            async def mcall() -> None:
                if (await c.call_tool("echo", {"text": "hello"})).is_error:
                    raise RuntimeError("bad echo")

            for _ in range(50):
                await mcall()
            return await C.time_sequential(mcall, N_HTTP // 2, server.pid)


# -- driver ------------------------------------------------------------------------------------------


def ratio(
    ours: list[dict[str, Any]], theirs: list[dict[str, Any]], side: str = "toolmesh"
) -> dict[str, Any]:
    a, b = median_of(ours, "calls_per_s"), median_of(theirs, "calls_per_s")
    paired = [x["calls_per_s"] / y["calls_per_s"] for x, y in zip(ours, theirs, strict=True)]
    row = {
        f"{side}_calls_per_s": round(a),
        f"{side}_best": round(max(r["calls_per_s"] for r in ours)),
        "mcp_calls_per_s": round(b),
        "mcp_best": round(max(r["calls_per_s"] for r in theirs)),
        f"{side}_p50_us": round(median_of(ours, "p50_us"), 1),
        "mcp_p50_us": round(median_of(theirs, "p50_us"), 1),
        "ratio_of_medians": round(a / b, 2),
        # Each repeat measures both sides back to back: the ratio within a repeat is spared the
        # drift of a shared machine's speed between repeats (it moves by half over minutes).
        "ratio": round(statistics.median(paired), 2),
        "ratio_range": [round(min(paired), 2), round(max(paired), 2)],
    }
    if "server_cpu_us_per_call" in ours[0] and ours[0]["server_cpu_us_per_call"] is not None:
        row[f"{side}_server_cpu_us"] = round(median_of(ours, "server_cpu_us_per_call"))
        row["mcp_server_cpu_us"] = round(median_of(theirs, "server_cpu_us_per_call"))
    if "client_cpu_us_per_call" in ours[0] and ours[0]["client_cpu_us_per_call"] is not None:
        row[f"{side}_client_cpu_us"] = round(median_of(ours, "client_cpu_us_per_call"))
        row["mcp_client_cpu_us"] = round(median_of(theirs, "client_cpu_us_per_call"))
    return row


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="inprocess,stdio,http,floor,cold")
    args = parser.parse_args()
    only = set(args.only.split(","))
    out: dict[str, Any] = {"machine": C.machine(), "loadavg_start": os.getloadavg()}
    tmp = tempfile.mkdtemp(prefix="tmbench-")
    audit = str(Path(tmp) / "audit.db")

    async def pair(name: str, ours: Any, theirs: Any, side: str = "toolmesh") -> None:
        a: list[dict[str, Any]] = []
        b: list[dict[str, Any]] = []
        for i in range(args.repeats):
            first, second = (ours, theirs) if i % 2 == 0 else (theirs, ours)
            r1, r2 = await first(), await second()
            (a if first is ours else b).append(r1)
            (b if first is ours else a).append(r2)
        out[name] = ratio(a, b, side)
        print(name, json.dumps(out[name]), file=sys.stderr, flush=True)

    if "inprocess" in only:
        await pair(
            "inprocess.sqlite_audit", lambda: inproc_toolmesh(audit), lambda: inproc_mcp("auto")
        )
        await pair(
            "inprocess.memory_audit",
            lambda: inproc_toolmesh("memory://"),
            lambda: inproc_mcp("auto"),
        )
    if "stdio" in only:
        await pair("stdio", lambda: stdio_toolmesh(audit), lambda: stdio_mcp("auto"))
    if "http" in only:
        await pair(
            "http.raw_client.sequential",
            lambda: http_raw("toolmesh", audit, 1),
            lambda: http_raw("mcp", audit, 1),
        )
        await pair(
            "http.raw_client.concurrent50",
            lambda: http_raw("toolmesh", audit, CONC),
            lambda: http_raw("mcp", audit, CONC),
        )
        await pair(
            "http.blocking_client.sequential",
            lambda: http_blocking("toolmesh", audit),
            lambda: http_blocking("mcp", audit),
        )
        await pair(
            "http.own_clients.sequential",
            lambda: http_native("toolmesh", audit),
            lambda: http_native("mcp", audit),
        )
    if "floor" in only:
        await pair(
            "http.floor.raw_client.sequential",
            lambda: http_raw("floor", audit, 1),
            lambda: http_raw("mcp", audit, 1),
            "floor",
        )
        await pair(
            "http.floor.blocking_client.sequential",
            lambda: http_blocking("floor", audit),
            lambda: http_blocking("mcp", audit),
            "floor",
        )
    if "cold" in only:
        # Both sides start from bytecode, as installed packages do (pip compiles a wheel's
        # modules; an editable checkout's may be stale, and PYTHONDONTWRITEBYTECODE, set on
        # some machines, would have every start compile them again).
        for folder in (REPO / "src" / "toolmesh", HERE):
            compileall.compile_dir(str(folder), quiet=1)
        ours: list[float] = []
        theirs: list[float] = []
        floor: list[float] = []
        for i in range(COLD):
            order = [(ours, cold_toolmesh), (theirs, cold_mcp), (floor, cold_floor)]
            for times, measure in order[i % 3 :] + order[: i % 3]:
                times.append(await measure())
        out["cold_start_ms"] = {
            "toolmesh_median": round(statistics.median(ours), 1),
            "toolmesh_best": round(min(ours), 1),
            "mcp_median": round(statistics.median(theirs), 1),
            "mcp_best": round(min(theirs), 1),
            "fraction_of_mcp": round(statistics.median(ours) / statistics.median(theirs), 3),
            "floor_median": round(statistics.median(floor), 1),
            "floor_fraction_of_mcp": round(statistics.median(floor) / statistics.median(theirs), 3),
        }
        print("cold", json.dumps(out["cold_start_ms"]), file=sys.stderr, flush=True)
    out["loadavg_end"] = os.getloadavg()
    out["versions"] = C.versions("toolmesh", "mcp", "pydantic", "uvicorn", "httpx")
    print(json.dumps(out))
    assert not C.assert_no_children_left()


if __name__ == "__main__":
    asyncio.run(main())
