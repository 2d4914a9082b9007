"""Servers for bench_a2a.py, each in its own process; each prints {"port": N} once it listens on
127.0.0.1:N and exits when its stdin closes.

    python bench/_a2a_servers.py stub                the model: a fixed chat completion at once
    python bench/_a2a_servers.py peer --llm URL      a2a-sdk 1.x agent whose executor runs the
                                                     same agent loop (toolmesh's LLM client over
                                                     the same skills) and returns its text
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

ANSWER = json.dumps(
    {
        "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


def _watch_stdin() -> None:
    def watch() -> None:
        while sys.stdin.buffer.read(1):
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _ready(port: int) -> None:
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)


async def stub() -> None:
    """HTTP/1.1 with keep-alive on bare asyncio streams: the model costs next to nothing."""
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
        + ANSWER
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(response)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    _ready(server.sockets[0].getsockname()[1])
    await server.serve_forever()


def peer_app(holder: dict[str, int], llm: str) -> Any:
    from a2a.helpers import new_task_from_user_message, new_text_part
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
    from starlette.applications import Starlette

    from toolmesh import Toolkit, create_client
    from toolmesh.sources.skills import SkillsSource

    toolkit = Toolkit(SkillsSource(REPO / "examples" / "skills"))
    client = create_client(llm, model="m")

    class LoopExecutor(AgentExecutor):
        """What a toolmesh task does: run the agent loop, answer with its text as an artifact."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.message is not None
            task = context.current_task or new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            result = await client.run(context.get_user_input(), toolkit=toolkit)
            await updater.add_artifact([new_text_part(result.text)], name="response")
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise RuntimeError("not cancelable")

    def card(url: str) -> AgentCard:
        return AgentCard(
            name="desk",
            description="the same agent",
            version="1.0",
            supported_interfaces=[
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
            ],
            capabilities=AgentCapabilities(streaming=False),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=[AgentSkill(id="hello-world", name="hello-world", description="d", tags=["t"])],
        )

    base = card("http://127.0.0.1:0/")

    async def modifier(_card: AgentCard) -> AgentCard:
        return card(f"http://127.0.0.1:{holder['port']}/")

    handler = DefaultRequestHandler(
        agent_executor=LoopExecutor(), task_store=InMemoryTaskStore(), agent_card=base
    )
    routes = create_agent_card_routes(base, card_modifier=modifier)
    return Starlette(routes=[*routes, *create_jsonrpc_routes(handler, "/")])


async def peer(llm: str) -> None:
    import uvicorn

    holder: dict[str, int] = {}
    config = uvicorn.Config(
        peer_app(holder, llm), host="127.0.0.1", port=0, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    holder["port"] = server.servers[0].sockets[0].getsockname()[1]
    _ready(holder["port"])
    await task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stub", "peer"])
    parser.add_argument("--llm", default="")
    args = parser.parse_args()
    _watch_stdin()
    server = stub() if args.mode == "stub" else peer(args.llm)
    try:  # as `uvicorn.run` and `toolmesh serve --http` do: uvloop when it is installed
        import uvloop
    except ImportError:
        asyncio.run(server)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(server)


if __name__ == "__main__":
    main()
