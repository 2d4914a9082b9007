"""a2a-sdk (1.x, protobuf types) echo agent over the JSON-RPC HTTP binding, server in its own process.

Server: `_servers.py a2a` = Starlette app from `create_agent_card_routes` + `create_jsonrpc_routes`,
`DefaultRequestHandler` (= DefaultRequestHandlerV2) with `InMemoryTaskStore` and an AgentExecutor
that enqueues the Task, adds the user text as an artifact (TaskUpdater.add_artifact) and completes
it. uvicorn on 127.0.0.1, ephemeral port, h11, access log off.
Client: `a2a.client.create_client(url, ClientConfig(streaming=...))` (resolves the agent card from
/.well-known/agent-card.json, then JSON-RPC over its own httpx.AsyncClient). Each call builds a new
`SendMessageRequest` (fresh message_id) and drains `client.send_message(...)`; the final Task must
be COMPLETED with the echoed artifact.

Variants:
  blocking:  card streaming=False, client streaming=False -> `SendMessage` request/response.
  streaming: card streaming=True,  client streaming=True  -> `SendStreamingMessage` (SSE).
Measures per variant: connect (card fetch + client build), sequential N_SEQ round trips,
N_CONC round trips by CONC concurrent workers sharing one client; REPEATS runs each.

Run: $VENV/bin/python bench_a2a.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPEATS = int(os.environ.get("PEERBENCH_REPEATS", "3"))
CONNECTS = 3
N_SEQ = 300
N_CONC = 500
CONC = 50
WARMUP = 30


async def bench_variant(streaming: bool) -> dict:
    from a2a.client import ClientConfig, create_client
    from a2a.helpers import new_text_part
    from a2a.types import Message, Role, SendMessageRequest, TaskState

    out: dict = {}
    with C.Server("a2a", *(["--streaming"] if streaming else [])) as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        out["server_rss_ready_kib"] = srv.info.get("rss_ready_kib")
        connects = []
        for _ in range(CONNECTS):
            t0 = time.perf_counter()
            c = await create_client(url, ClientConfig(streaming=streaming))
            connects.append((time.perf_counter() - t0) * 1e3)
            await c.close()
        out["connect_ms"] = C.summarize_values(connects, 2)

        client = await create_client(url, ClientConfig(streaming=streaming))
        try:

            async def call(check: bool = False):
                req = SendMessageRequest(
                    message=Message(
                        message_id=uuid.uuid4().hex,
                        role=Role.ROLE_USER,
                        parts=[new_text_part("hello")],
                    )
                )
                seen = []
                async for ev in client.send_message(req):
                    if check:
                        seen.append(ev)
                return seen

            seen = await call(check=True)
            out["events_per_call"] = len(seen)
            out["event_kinds"] = [ev.WhichOneof("payload") for ev in seen]
            texts, state = [], None
            for ev in seen:
                if ev.HasField("task"):
                    texts += [p.text for a in ev.task.artifacts for p in a.parts]
                    state = ev.task.status.state
                if ev.HasField("artifact_update"):
                    texts += [p.text for p in ev.artifact_update.artifact.parts]
                if ev.HasField("status_update"):
                    state = ev.status_update.status.state
            assert "hello" in texts and state == TaskState.TASK_STATE_COMPLETED, seen

            for _ in range(WARMUP):
                await call()
            out["sequential"] = C.summarize(
                [await C.time_sequential(call, N_SEQ, srv.pid) for _ in range(REPEATS)]
            )
            await C.time_concurrent(call, 100, CONC)
            out["concurrent"] = C.summarize(
                [await C.time_concurrent(call, N_CONC, CONC, srv.pid) for _ in range(REPEATS)]
            )
        finally:
            await client.close()
        out["server_rss_after_kib"] = srv.rss_kib()
    return out


async def main() -> dict:
    res: dict = {
        "bench": "a2a",
        "versions": C.versions(),
        "machine": C.machine(),
        "repeats": REPEATS,
        "n_seq": N_SEQ,
        "n_conc": N_CONC,
        "concurrency": CONC,
    }
    res["blocking"] = await bench_variant(streaming=False)
    if os.environ.get("PEERBENCH_A2A_STREAMING", "1") == "1":
        if C.over_budget():
            res.setdefault("skipped", []).append(
                f"streaming: soft budget {C.SOFT_BUDGET_S} s reached"
            )
        else:
            res["streaming"] = await bench_variant(streaming=True)
    return res


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = asyncio.run(main())
    result["children_left"] = C.assert_no_children_left()
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    C.emit(result)
