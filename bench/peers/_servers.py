"""Server processes for the peer benchmarks. Started by the bench_*.py scripts, not by hand.

    python3 _servers.py starlette                      # minimal JSON endpoint POST /echo
    python3 _servers.py mcp_http [--tools N] [--json-response] [--stateless]
    python3 _servers.py mcp_stdio                      # MCP server on stdin/stdout
    python3 _servers.py a2a [--streaming]              # A2A echo agent (JSON-RPC binding)
    python3 _servers.py fastmcp_http                   # standalone FastMCP package, streamable HTTP

HTTP servers listen on 127.0.0.1 with an ephemeral port (uvicorn port=0) and, once serving, print one
JSON line {"port": ..., "pid": ..., ...} to stdout. They exit when their stdin reaches EOF (the parent
holds the pipe), on SIGTERM, or after a hard cap of PEERBENCH_SERVER_MAX_S seconds (default 180).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time


def rss_kib() -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def _guards(watch_stdin: bool) -> None:
    cap = float(os.environ.get("PEERBENCH_SERVER_MAX_S", "180"))
    t = threading.Timer(cap, lambda: os._exit(3))
    t.daemon = True
    t.start()
    if watch_stdin:

        def _watch():
            try:
                while sys.stdin.buffer.read(1):
                    pass
            except Exception:
                pass
            os._exit(0)

        threading.Thread(target=_watch, daemon=True).start()


async def _serve(app, extra: dict) -> None:
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise SystemExit("uvicorn exited before start")
        await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    extra = {
        "port": port,
        "pid": os.getpid(),
        "rss_ready_kib": rss_kib(),
        "uvicorn_http": getattr(getattr(config, "http_protocol_class", None), "__name__", None),
        "uvicorn_loop": config.loop,
        **extra,
    }
    sys.stdout.write(json.dumps(extra) + "\n")
    sys.stdout.flush()
    await task


# ------------------------------------------------------------------ starlette baseline


def starlette_app():
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"text": body["text"]})

    return Starlette(routes=[Route("/echo", echo, methods=["POST"])])


# ------------------------------------------------------------------ MCP (official SDK)


def make_tool(i: int):
    def fn(text: str) -> str:
        return text

    fn.__name__ = f"tool_{i}"
    fn.__qualname__ = f"tool_{i}"
    fn.__doc__ = f"Tool number {i}: returns its text argument unchanged."
    return fn


def mcp_server(n_extra_tools: int = 0):
    """MCPServer (mcp 2.x name of FastMCP) with `echo` plus n extra distinct tools. Returns (srv, info)."""
    t0 = time.perf_counter()
    from mcp.server.mcpserver import MCPServer

    srv = MCPServer("peerbench", log_level="WARNING")

    @srv.tool()
    def echo(text: str) -> str:
        """Return text unchanged."""
        return text

    info = {
        "import_and_construct_s": round(time.perf_counter() - t0, 4),
        "rss_before_register_kib": rss_kib(),
    }
    if n_extra_tools:
        fns = [make_tool(i) for i in range(n_extra_tools)]
        t0 = time.perf_counter()
        for fn in fns:
            srv.add_tool(fn)
        dt = time.perf_counter() - t0
        info.update(
            {
                "tools_registered": n_extra_tools,
                "register_s": round(dt, 4),
                "register_us_per_tool": round(dt / n_extra_tools * 1e6, 1),
                "rss_after_register_kib": rss_kib(),
            }
        )
    return srv, info


def run_mcp_http(args) -> None:
    srv, info = mcp_server(args.tools)
    t0 = time.perf_counter()
    app = srv.streamable_http_app(json_response=args.json_response, stateless_http=args.stateless)
    info["build_app_s"] = round(time.perf_counter() - t0, 4)
    info["json_response"] = args.json_response
    info["stateless"] = args.stateless
    asyncio.run(_serve(app, info))


def run_mcp_stdio(args) -> None:
    srv, info = mcp_server(0)
    sys.stderr.write(f"PEERBENCH_PID {os.getpid()} {info['import_and_construct_s']}\n")
    sys.stderr.flush()
    srv.run("stdio")


# ------------------------------------------------------------------ FastMCP (standalone package)


def run_fastmcp_http(args) -> None:
    from fastmcp import FastMCP

    srv = FastMCP("peerbench")

    @srv.tool
    def echo(text: str) -> str:
        """Return text unchanged."""
        return text

    app = srv.http_app(json_response=args.json_response, stateless_http=args.stateless)
    asyncio.run(_serve(app, {"json_response": args.json_response, "stateless": args.stateless}))


# ------------------------------------------------------------------ A2A


def a2a_app(port_holder: dict, streaming: bool):
    """Built lazily because the card must carry the URL, which needs the port; we use a card_modifier."""
    from starlette.applications import Starlette

    from a2a.helpers import new_task_from_user_message, new_text_part
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill

    class EchoExecutor(AgentExecutor):
        """Echo the task text as an artifact and complete the task."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            text = context.get_user_input()
            task = context.current_task or new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            await updater.add_artifact([new_text_part(text)])
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise RuntimeError("cancel not supported")

    def card(url: str) -> AgentCard:
        return AgentCard(
            name="echo",
            description="echoes text",
            version="1.0",
            supported_interfaces=[
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
            ],
            capabilities=AgentCapabilities(streaming=streaming),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["echo"])],
        )

    base_card = card("http://127.0.0.1:0/")

    async def modifier(_c: AgentCard) -> AgentCard:
        return card(f"http://127.0.0.1:{port_holder['port']}/")

    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=base_card
    )
    routes = create_agent_card_routes(base_card, card_modifier=modifier) + create_jsonrpc_routes(
        handler, "/"
    )
    return Starlette(routes=routes)


async def _serve_a2a(streaming: bool) -> None:
    import uvicorn

    holder: dict = {}
    app = a2a_app(holder, streaming)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise SystemExit("uvicorn exited before start")
        await asyncio.sleep(0.005)
    holder["port"] = server.servers[0].sockets[0].getsockname()[1]
    sys.stdout.write(
        json.dumps(
            {
                "port": holder["port"],
                "pid": os.getpid(),
                "rss_ready_kib": rss_kib(),
                "streaming": streaming,
            }
        )
        + "\n"
    )
    sys.stdout.flush()
    await task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["starlette", "mcp_http", "mcp_stdio", "a2a", "fastmcp_http"])
    ap.add_argument("--tools", type=int, default=0)
    ap.add_argument("--json-response", action="store_true")
    ap.add_argument("--stateless", action="store_true")
    ap.add_argument("--streaming", action="store_true")
    args = ap.parse_args()
    _guards(watch_stdin=args.mode != "mcp_stdio")
    if args.mode == "starlette":
        asyncio.run(_serve(starlette_app(), {}))
    elif args.mode == "mcp_http":
        run_mcp_http(args)
    elif args.mode == "mcp_stdio":
        run_mcp_stdio(args)
    elif args.mode == "fastmcp_http":
        run_fastmcp_http(args)
    elif args.mode == "a2a":
        asyncio.run(_serve_a2a(args.streaming))


if __name__ == "__main__":
    main()
