"""Issue 6's benchmark: a toolkit served as an A2A agent vs an a2a-sdk 1.x agent, same run.

One round trip is SendMessage (blocking, so the task runs to completion) then GetTask, both
checked: the task is completed and its artifact holds the model's answer. Behind both agents the
model is the same local stub (bench/_a2a_servers.py stub, answering at once) and each task runs
the same agent loop (toolmesh's LLM client over examples/skills): the a2a-sdk side runs it in an
AgentExecutor with the SDK's InMemoryTaskStore and DefaultRequestHandler.

    toolmesh.memory   `toolmesh serve --a2a ... --audit :memory:`  (tasks in in-memory SQLite)
    toolmesh.sqlite   `toolmesh serve --a2a ... --audit FILE`      (tasks durable in a WAL file)
    a2a_sdk           bench/_a2a_servers.py peer

Clients, the same for every server: the raw HTTP/1.1 client (rawhttp.py: JSON-RPC by hand, so
the client costs little), one round trip at a time and 16 at once (16 connections), and the
a2a-sdk's own client (create_client + send_message + get_task). Runs alternate between the
sides; medians of --repeats runs, ratios toolmesh / SDK.

    .venv/bin/python bench/bench_a2a.py [--repeats 3] [--n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _common as C  # noqa: E402
import rawhttp  # noqa: E402

REPO = HERE.parent
WARMUP = 30
CONCURRENCY = 16


@contextmanager
def process(command: list[str]) -> Iterator[tuple[int, int]]:
    """Start a server; yield (port, pid); stop it by closing its stdin, then by its pid."""
    proc = subprocess.Popen(
        command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    C._CHILDREN[proc.pid] = proc
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        port = json.loads(line)["port"] if line.startswith("{") else int(line.rsplit(":", 1)[1])
        yield port, proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.terminate()
        proc.wait(10)
        C._CHILDREN.pop(proc.pid, None)


def toolmesh_server(llm: str, audit: str) -> list[str]:
    return [
        sys.executable, "-m", "toolmesh", "serve", "--http", "127.0.0.1:0", "--a2a", "desk",
        "--llm", llm, "--model", "m", "--skills", "examples/skills", "--audit", audit,
    ]  # fmt: skip


def sdk_server(llm: str) -> list[str]:
    return [sys.executable, str(HERE / "_a2a_servers.py"), "peer", "--llm", llm]


async def raw_round_trips(
    port: int, path: str, pid: int, n: int, concurrency: int = 1
) -> dict[str, Any]:
    pool: asyncio.Queue[rawhttp.Connection] = asyncio.Queue()
    for _ in range(concurrency):
        pool.put_nowait(await rawhttp.Connection.open("127.0.0.1", port))
    headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}

    async def call() -> None:
        conn = await pool.get()
        try:
            await round_trip(conn)
        finally:
            pool.put_nowait(conn)

    async def round_trip(conn: rawhttp.Connection) -> None:
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "hi"}]}
        send = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        _s, _h, body = await conn.request("POST", path, headers, json.dumps(send).encode())
        task = json.loads(body)["result"]["task"]
        get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task["id"]}}
        _s, _h, body = await conn.request("POST", path, headers, json.dumps(get).encode())
        got = json.loads(body)["result"]
        if (
            got["status"]["state"] != "TASK_STATE_COMPLETED"
            or got["artifacts"][0]["parts"][0]["text"] != "ok"
        ):
            raise RuntimeError(got)

    try:
        for _ in range(WARMUP):
            await call()
        if concurrency == 1:
            return await C.time_sequential(call, n, pid)
        return await C.time_concurrent(call, n, concurrency, pid)
    finally:
        while not pool.empty():
            await pool.get_nowait().close()


async def sdk_round_trips(port: int, pid: int, n: int) -> dict[str, Any]:
    from a2a.client import ClientConfig, create_client
    from a2a.helpers import new_text_part
    from a2a.types import GetTaskRequest, Message, Role, SendMessageRequest, TaskState

    client = await create_client(f"http://127.0.0.1:{port}/", ClientConfig(streaming=False))

    async def call() -> None:
        message = Message(
            message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[new_text_part("hi")]
        )
        [event] = [e async for e in client.send_message(SendMessageRequest(message=message))]
        got = await client.get_task(GetTaskRequest(id=event.task.id))
        if (
            got.status.state != TaskState.TASK_STATE_COMPLETED
            or got.artifacts[0].parts[0].text != "ok"
        ):
            raise RuntimeError(got)

    try:
        for _ in range(WARMUP):
            await call()
        return await C.time_sequential(call, n, pid)
    finally:
        await client.close()


Measure = Callable[[], Awaitable[dict[str, Any]]]


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    row = {
        "round_trips_per_s": round(statistics.median(r["calls_per_s"] for r in runs), 1),
        "best": round(max(r["calls_per_s"] for r in runs), 1),
        "p50_us": round(statistics.median(r["p50_us"] for r in runs)),
    }
    cpu = [r.get("server_cpu_us_per_call") for r in runs]
    if all(c is not None for c in cpu):
        row["server_cpu_us"] = round(statistics.median(c for c in cpu if c is not None))
    return row


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": C.machine(), "loadavg_start": os.getloadavg(), "n": args.n}
    audit = str(Path(tempfile.mkdtemp(prefix="tmbench-a2a-")) / "tasks.db")
    with process([sys.executable, str(HERE / "_a2a_servers.py"), "stub"]) as (stub_port, _pid):
        llm = f"http://127.0.0.1:{stub_port}/v1"
        with (
            process(toolmesh_server(llm, ":memory:")) as memory,
            process(toolmesh_server(llm, audit)) as sqlite,
            process(sdk_server(llm)) as sdk,
        ):
            sides: dict[str, dict[str, Measure]] = {
                "raw_client": {
                    "toolmesh.memory": lambda: raw_round_trips(
                        memory[0], "/a2a", memory[1], args.n
                    ),
                    "toolmesh.sqlite": lambda: raw_round_trips(
                        sqlite[0], "/a2a", sqlite[1], args.n
                    ),
                    "a2a_sdk": lambda: raw_round_trips(sdk[0], "/", sdk[1], args.n),
                },
                f"raw_client_{CONCURRENCY}_concurrent": {
                    "toolmesh.memory": lambda: raw_round_trips(
                        memory[0], "/a2a", memory[1], args.n, CONCURRENCY
                    ),
                    "toolmesh.sqlite": lambda: raw_round_trips(
                        sqlite[0], "/a2a", sqlite[1], args.n, CONCURRENCY
                    ),
                    "a2a_sdk": lambda: raw_round_trips(sdk[0], "/", sdk[1], args.n, CONCURRENCY),
                },
                "a2a_sdk_client": {
                    "toolmesh.memory": lambda: sdk_round_trips(memory[0], memory[1], args.n),
                    "toolmesh.sqlite": lambda: sdk_round_trips(sqlite[0], sqlite[1], args.n),
                    "a2a_sdk": lambda: sdk_round_trips(sdk[0], sdk[1], args.n),
                },
            }
            for client_name, measures in sides.items():
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in measures}
                order = list(measures)
                for repeat in range(args.repeats):
                    for name in order if repeat % 2 == 0 else list(reversed(order)):
                        runs[name].append(await measures[name]())
                table = {name: summary(r) for name, r in runs.items()}
                base = table["a2a_sdk"]["round_trips_per_s"]
                for name in ("toolmesh.memory", "toolmesh.sqlite"):
                    table[name]["ratio_vs_sdk"] = round(table[name]["round_trips_per_s"] / base, 2)
                out[client_name] = table
                print(client_name, json.dumps(table), file=sys.stderr, flush=True)
    out["loadavg_end"] = os.getloadavg()
    out["versions"] = C.versions("toolmesh", "a2a-sdk", "uvicorn", "httpx", "starlette")
    print(json.dumps(out))
    assert not C.assert_no_children_left()


if __name__ == "__main__":
    asyncio.run(main())
