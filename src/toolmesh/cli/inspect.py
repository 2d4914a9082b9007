"""``toolmesh tools`` and ``toolmesh call``: look at and call tools of any host."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from toolmesh import strictjson
from toolmesh.cli.loading import parse_target
from toolmesh.cli.serve import add_source_options, build_host, positive_float
from toolmesh.errors import ConfigError

if TYPE_CHECKING:
    from toolmesh.client import AsyncClient
    from toolmesh.models import ToolEvent

__all__ = ["add_parsers"]


def add_parsers(commands: Any) -> None:
    tools = commands.add_parser(
        "tools",
        help="list or search tools",
        description="List the tools a host serves, or search them (deferred ones included).",
    )
    tools.add_argument("--search", metavar="QUERY", help="rank tools by relevance to QUERY")
    add_target_options(tools)
    tools.add_argument("--json", action="store_true", help="print the definitions as JSON")
    tools.set_defaults(run=run_tools)

    call = commands.add_parser(
        "call",
        help="call one tool",
        description="Call one tool and print its result as JSON (exit 1 if it failed).",
    )
    call.add_argument("name", help="the tool's name")
    call.add_argument("--args", default="{}", metavar="JSON", help="arguments as a JSON object")
    call.add_argument("--stream", action="store_true", help="show events as they arrive")
    call.add_argument(
        "--timeout", type=positive_float, default=30.0, help="deadline in seconds (default 30)"
    )
    add_target_options(call)
    call.set_defaults(run=run_call)


def add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        metavar="T",
        help="an http(s) URL, MODULE:ATTR, or a host command (e.g. 'toolmesh serve --stdio ...')",
    )
    parser.add_argument("--auth-token", help="bearer token / handshake token for the host")
    add_source_options(parser)


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[AsyncClient]:
    """A client of the target; a host or toolkit made here is closed with it (its sources'
    processes, a Ray cluster it started, its audit rows)."""
    from toolmesh.cli.agents import agent_toolkit, looks_like_card
    from toolmesh.client import connect_async
    from toolmesh.host import Host
    from toolmesh.toolkit import Toolkit

    if args.target is None:
        target: Any = build_host(args, audit=None)
    else:  # an empty --target is an error, not "no target"
        target = parse_target(args.target)
        if isinstance(target, str) and looks_like_card(target):  # a remote A2A agent's skills
            target = await agent_toolkit(target)
    local = target if isinstance(target, Host | Toolkit) else None
    try:
        client = await connect_async(target, agent_id="toolmesh-cli", auth_token=args.auth_token)
        try:
            yield client
        finally:
            await client.close()
    finally:
        if local is not None:
            await local.close()


def run_tools(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with _client(args) as client:
            if args.search:
                found = await client.list_tools(args.search, include_deferred=True)
            else:
                found = await client.list_tools()
        if args.json:
            print(json.dumps([d.model_dump(mode="json") for d in found], indent=2))
            return 0
        width = max((len(d.name) for d in found), default=4)
        for d in found:
            summary = d.description.strip().splitlines()[0] if d.description.strip() else ""
            marks = " (deferred)" if d.defer_loading else ""
            print(f"{d.name:<{width}}  {summary}{marks}")
        if not found:
            print(
                "no tools" if not args.search else f"no tools match {args.search!r}",
                file=sys.stderr,
            )
        return 0

    return asyncio.run(main())


def run_call(args: argparse.Namespace) -> int:
    try:
        arguments = strictjson.loads(args.args)
    except ValueError as exc:
        raise ConfigError(f"--args is not valid JSON: {exc}") from exc
    if not isinstance(arguments, dict):
        raise ConfigError('--args must be a JSON object, e.g. \'{"path": "a.txt"}\'')

    async def main() -> int:
        async with _client(args) as client:
            result = await client.call_tool(
                args.name,
                arguments,
                streaming=args.stream,
                on_event=_show_event if args.stream else None,
                timeout=args.timeout,
            )
        if args.stream:
            print(file=sys.stderr)
        shown = {**result.model_dump(mode="json"), "output": result.output}
        print(json.dumps(shown, indent=2, ensure_ascii=False))
        return 0 if result.success else 1

    return asyncio.run(main())


def _show_event(event: ToolEvent) -> None:
    data = event.data
    if event.kind == "progress":
        pct = int(data.get("pct", 0))
        filled = pct * 30 // 100
        bar = "#" * filled + "-" * (30 - filled)
        sys.stderr.write(f"\r[{bar}] {pct:3d}% {data.get('message', '')}"[:100])
    else:
        text = data.get("message") or json.dumps(data, ensure_ascii=False)
        sys.stderr.write(f"\n{event.kind}: {text}")
    sys.stderr.flush()
