"""Past one machine: several hosts on one PostgreSQL, and tools on Ray (issue 9).

    .venv/bin/python bench/bench_scale.py [--seconds 4] [--rounds 3] [--calls 400]

1. Calls/s of `toolmesh serve --http` processes sharing one PostgreSQL (1, 2, 3 hosts), with
   the raw HTTP load client of bench/rawhttp.py: sessions spread over the hosts, each session
   sticky to one host (a balancer with affinity), plus a row where every session's calls go to
   another host than its stream (no affinity: each answer crosses the database). One SQLite
   host under the same load is the reference.
2. Store cost per call: the in-process pipeline with an HTTP-labelled session (so every audit
   entry is committed before the result returns, as for any remote caller), on the memory,
   SQLite and PostgreSQL stores; a plain call and a call that updates the session state.
3. Ray: a trivial tool on Ray vs in-process, and a bare Ray task round trip as the anchor.
4. A CPU-heavy batch (pure-Python loops) in-process (threads: one core, the GIL) vs on Ray.

PostgreSQL runs durable (fsync on) in a private cluster; Ray is a local cluster of 2 CPUs. Rounds
are interleaved and medians reported, with the load average of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import rawhttp  # noqa: E402
from tests.fixtures.postgres import running_cluster  # noqa: E402

from toolmesh import Host, Output, tool  # noqa: E402
from toolmesh.protocol import HandshakeRequest, ToolCallRequest  # noqa: E402

TOOLS = "bench.echo_tools:TOOLS"


# -- 1. hosts on one PostgreSQL ------------------------------------------------------------------


class HostProcess:
    def __init__(self, store: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolmesh", "serve", "--http", "127.0.0.1:0", "--tools", TOOLS,
             "--store", store, "--max-parallel", "64"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().strip().rsplit(":", 1)[1])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)


async def session_load(
    create: int, stream: int, send: int, concurrency: int, stop_at: float
) -> int:
    """One session: created on `create`, streamed from `stream`, calls POSTed to `send`."""
    control = await rawhttp.Connection.open("127.0.0.1", create)
    _, _, body = await control.request("POST", "/session")
    session = json.loads(body)["session_id"]
    headers = {"X-Session-Id": session, "Content-Type": "application/json"}
    streamer = await rawhttp.Connection.open("127.0.0.1", stream)
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def pump() -> None:
        async for message in streamer.events("/stream", {"X-Session-Id": session}):
            future = waiting.pop(message.get("req_id", ""), None)
            if future is not None:
                future.set_result(message)

    pumping = asyncio.ensure_future(pump())
    senders = [await rawhttp.Connection.open("127.0.0.1", send) for _ in range(concurrency)]
    ids = itertools.count()

    async def send_one(conn: rawhttp.Connection, message: dict[str, Any]) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        waiting[message["id"]] = future
        status, _, _ = await conn.request("POST", "/send", headers, json.dumps(message).encode())
        assert status == 200, status
        return await asyncio.wait_for(future, 30)

    await send_one(senders[0], {"type": "handshake/req", "id": "hs", "agent_caps": ["tools"]})
    done = 0

    async def worker(conn: rawhttp.Connection) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            message = {"type": "tool/call/req", "id": f"c{next(ids)}", "tool_name": "echo",
                       "arguments": {"text": "hello"}}  # fmt: skip
            reply = await send_one(conn, message)
            assert reply["data"]["success"], reply
            done += 1

    await asyncio.gather(*(worker(conn) for conn in senders))
    pumping.cancel()
    await asyncio.gather(pumping, return_exceptions=True)
    for conn in [control, streamer, *senders]:
        await conn.close()
    return done


async def throughput(ports: list[int], affinity: bool, seconds: float) -> float:
    sessions, concurrency = 6, 4
    stop_at = time.monotonic() + seconds + 0.5  # (the first half second is set-up)
    jobs = []
    for index in range(sessions):
        home = ports[index % len(ports)]
        other = ports[(index + 1) % len(ports)]
        jobs.append(session_load(home, home, home if affinity else other, concurrency, stop_at))
    started = time.monotonic()
    counts = await asyncio.gather(*jobs)
    return sum(counts) / (time.monotonic() - started)


async def bench_hosts(url: str, sqlite_path: str, seconds: float, rounds: int) -> dict[str, Any]:
    hosts = [HostProcess(url) for _ in range(3)]
    sqlite_host = HostProcess(f"sqlite:///{sqlite_path}")
    cases: dict[str, Callable[[], Awaitable[float]]] = {
        "1 host, SQLite": lambda: throughput([sqlite_host.port], True, seconds),
        "1 host, PostgreSQL": lambda: throughput([hosts[0].port], True, seconds),
        "2 hosts, PostgreSQL": lambda: throughput([h.port for h in hosts[:2]], True, seconds),
        "3 hosts, PostgreSQL": lambda: throughput([h.port for h in hosts], True, seconds),
        "2 hosts, no affinity": lambda: throughput([h.port for h in hosts[:2]], False, seconds),
        "3 hosts, no affinity": lambda: throughput([h.port for h in hosts], False, seconds),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for _ in range(rounds):
            for name, case in cases.items():
                results[name].append(await case())
    finally:
        for host in [*hosts, sqlite_host]:
            host.stop()
    return {name: statistics.median(values) for name, values in results.items()}


# -- 2. store cost per call -----------------------------------------------------------------------


@tool
def echo(text: str) -> str:
    """Echo."""
    return text


@tool
def remember(key: str) -> Output:
    """Update the state."""
    return Output("ok", state_update=[{"op": "add", "path": f"/context/{key}", "value": 1}])


async def per_call_us(store: str, tool_name: str, calls: int) -> float:
    host = Host(echo, remember, store=store)
    await host.start()
    connection = host.connect(lambda _m: None, transport="http")  # durable audit, as remote
    await connection.request(HandshakeRequest(id="hs", agent_caps=["tools"]))
    samples = []
    for index in range(calls):
        request = ToolCallRequest(
            id=f"c{index}", tool_name=tool_name,
            arguments={"text": "x"} if tool_name == "echo" else {"key": f"k{index % 50}"},
        )  # fmt: skip
        started = time.perf_counter()
        response = await connection.request(request)
        samples.append(time.perf_counter() - started)
        assert response.data.success, response.data.error
    await connection.close()
    await host.close()
    return statistics.median(samples) * 1e6


async def bench_stores(url: str, folder: str, calls: int, rounds: int) -> dict[str, Any]:
    results: dict[str, list[float]] = {}
    for round_index in range(rounds):
        for store_name, store in (
            ("memory", "memory://"),
            ("SQLite", f"sqlite:///{folder}/store{round_index}.db"),
            ("PostgreSQL", url),
            ("PostgreSQL, synchronous_commit=off", f"{url}?synchronous_commit=off"),
        ):
            for tool_name in ("echo", "remember"):
                key = f"{store_name}/{tool_name}"
                results.setdefault(key, []).append(await per_call_us(store, tool_name, calls))
    return {key: statistics.median(values) for key, values in results.items()}


# -- 3 and 4. Ray ---------------------------------------------------------------------------------


async def bench_ray(calls: int, rounds: int) -> dict[str, Any]:
    from tests.fixtures import ray_tools
    from tests.fixtures.ray_cluster import local_ray

    from toolmesh import Host, connect_async
    from toolmesh.sources.functions import tools_of
    from toolmesh.sources.ray import OnRay

    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    with local_ray(num_cpus=2) as ray:

        @ray.remote
        def noop(value: int) -> int:
            return value

        local = Host(tools_of(ray_tools.TOOLS), store="memory://")
        placed = Host(OnRay(tools_of(ray_tools.TOOLS)), store="memory://")
        clients = {"in-process": await connect_async(local), "Ray": await connect_async(placed)}
        for _ in range(10):  # warm both workers
            await asyncio.gather(*(clients["Ray"].call_tool("burn", {"n": 0}) for _ in range(2)))
            await asyncio.gather(noop.remote(1), noop.remote(2))
        for _ in range(rounds):
            samples = []
            for _ in range(calls):
                started = time.perf_counter()
                ray.get(noop.remote(1))
                samples.append(time.perf_counter() - started)
            add("bare Ray task (ray.get)", statistics.median(samples) * 1e3)
            for name, client in clients.items():
                samples = []
                for _ in range(calls):
                    started = time.perf_counter()
                    result = await client.call_tool("burn", {"n": 0})
                    samples.append(time.perf_counter() - started)
                    assert result.success, result.error
                add(f"trivial tool, {name}", statistics.median(samples) * 1e3)
            for name, client in clients.items():
                started = time.perf_counter()
                batch = await asyncio.gather(
                    *(client.call_tool("burn", {"n": 2_000_000}, timeout=300) for _ in range(8))
                )
                assert all(r.success for r in batch)
                add(f"CPU batch (8 x 2M loop), {name}", (time.perf_counter() - started) * 1e3)
        for client in clients.values():
            await client.close()
        await local.close()
        await placed.close()
    return {key: statistics.median(values) for key, values in results.items()}


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--skip", action="append", default=[], choices=["hosts", "stores", "ray"])
    args = parser.parse_args()
    load_start = os.getloadavg()
    report: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_at_start": load_start}
    with tempfile.TemporaryDirectory() as folder, running_cluster(durable=True) as cluster:
        if "hosts" not in args.skip:
            url = cluster.create("hosts")
            report["calls_per_second"] = asyncio.run(
                bench_hosts(url, f"{folder}/host.db", args.seconds, args.rounds)
            )
        if "stores" not in args.skip:
            url = cluster.create("stores")
            report["store_us_per_call"] = asyncio.run(
                bench_stores(url, folder, args.calls, args.rounds)
            )
    if "ray" not in args.skip:
        report["ray_ms"] = asyncio.run(bench_ray(args.calls // 2, args.rounds))
    report["loadavg_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
