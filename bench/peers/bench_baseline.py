"""Physical floors for a tool call, to compare the frameworks against.

1. `await echo(text)` of a plain async function (no framework, no task switch).
2. `await asyncio.create_task(echo(text))` (one task spawn + switch per call, what a dispatcher pays).
3. Request/response through a pair of anyio memory object streams to a server task (an in-process
   transport floor: two queue hops and two task switches per call).
4. httpx.AsyncClient POST of a small JSON body to a minimal Starlette endpoint under uvicorn, in a
   separate server process on 127.0.0.1 (sequential 500, and 50-concurrent 2000 total).
5. The same POST written by hand on an asyncio stream (keep-alive HTTP/1.1): the HTTP floor without
   httpx's client cost.

Each measurement runs REPEATS times; the JSON line reports median/min/max across runs.
Run: $VENV/bin/python bench_baseline.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPEATS = int(os.environ.get("PEERBENCH_REPEATS", "3"))
N_FUNC = 200_000
N_TASK = 50_000
N_STREAM = 20_000
N_HTTP_SEQ = 500
N_HTTP_CONC = 2000
CONC = 50


async def echo(text: str) -> str:
    return text


async def bench_await() -> dict:
    # Batch timing (no per-call timer) for throughput; per-call timing for percentiles.
    batch = []
    for _ in range(REPEATS):
        t0 = time.perf_counter_ns()
        for _ in range(N_FUNC):
            await echo("hello")
        batch.append(N_FUNC / ((time.perf_counter_ns() - t0) / 1e9))
    timed = [await C.time_sequential(lambda: echo("hello"), N_FUNC) for _ in range(REPEATS)]
    # cost of the timer itself (two perf_counter_ns calls + append), to subtract mentally
    t0 = time.perf_counter_ns()
    lat = []
    pc = time.perf_counter_ns
    for _ in range(N_FUNC):
        s = pc()
        lat.append(pc() - s)
    timer_ns = sorted(lat)[len(lat) // 2]
    return {
        "untimed_calls_per_s": C.summarize_values(batch, 0),
        "timed": C.summarize(timed),
        "timer_overhead_p50_ns": timer_ns,
    }


async def bench_task() -> dict:
    runs = [
        await C.time_sequential(lambda: asyncio.create_task(echo("hello")), N_TASK)
        for _ in range(REPEATS)
    ]
    return C.summarize(runs)


async def bench_memory_streams() -> dict:
    import anyio

    c2s_send, c2s_recv = anyio.create_memory_object_stream(1)
    s2c_send, s2c_recv = anyio.create_memory_object_stream(1)

    async def server():
        async for msg in c2s_recv:
            await s2c_send.send(await echo(msg))

    async def call():
        await c2s_send.send("hello")
        return await s2c_recv.receive()

    async with anyio.create_task_group() as tg:
        tg.start_soon(server)
        runs = [await C.time_sequential(call, N_STREAM) for _ in range(REPEATS)]
        await c2s_send.aclose()
    return C.summarize(runs)


async def bench_http(port: int, pid: int) -> dict:
    import httpx

    url = f"http://127.0.0.1:{port}/echo"
    out = {}
    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=CONC, max_keepalive_connections=CONC)
    ) as client:

        async def call():
            r = await client.post(url, json={"text": "hello"})
            assert r.status_code == 200

        r = await client.post(url, json={"text": "hello"})
        assert r.json() == {"text": "hello"}, r.text
        for _ in range(50):
            await call()
        out["httpx_sequential"] = C.summarize(
            [await C.time_sequential(call, N_HTTP_SEQ, pid) for _ in range(REPEATS)]
        )
        await C.time_concurrent(call, 200, CONC)  # open the pool
        out["httpx_concurrent"] = C.summarize(
            [await C.time_concurrent(call, N_HTTP_CONC, CONC, pid) for _ in range(REPEATS)]
        )

    # Hand-written keep-alive HTTP/1.1 on asyncio streams (a queue of CONC open connections).
    body = json.dumps({"text": "hello"}).encode()
    req = (
        b"POST /echo HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    pool: asyncio.LifoQueue = asyncio.LifoQueue()
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CONC)]
    for c in conns:
        pool.put_nowait(c)

    async def raw_call():
        reader, writer = await pool.get()
        try:
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            data = await reader.readexactly(n)
            assert data.startswith(b'{"text"'), data
        finally:
            pool.put_nowait((reader, writer))

    for _ in range(50):
        await raw_call()
    out["raw_asyncio_stream_sequential"] = C.summarize(
        [await C.time_sequential(raw_call, N_HTTP_SEQ, pid) for _ in range(REPEATS)]
    )
    await C.time_concurrent(raw_call, 200, CONC)
    out["raw_asyncio_stream_concurrent"] = C.summarize(
        [await C.time_concurrent(raw_call, N_HTTP_CONC, CONC, pid) for _ in range(REPEATS)]
    )
    for _, writer in conns:
        writer.close()
    return out


async def main() -> dict:
    res: dict = {
        "bench": "baseline",
        "versions": C.versions(),
        "machine": C.machine(),
        "repeats": REPEATS,
    }
    res["await_async_fn"] = await bench_await()
    res["await_create_task"] = await bench_task()
    res["anyio_memory_stream_roundtrip"] = await bench_memory_streams()
    with C.Server("starlette") as srv:
        res["server"] = {
            "rss_ready_kib": srv.info.get("rss_ready_kib"),
            "uvicorn_http": srv.info.get("uvicorn_http"),
        }
        res["starlette_http"] = await bench_http(srv.port, srv.pid)
    return res


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = asyncio.run(main())
    result["children_left"] = C.assert_no_children_left()
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    C.emit(result)
