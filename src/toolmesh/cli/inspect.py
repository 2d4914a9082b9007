"""``toolmesh tools`` and ``toolmesh call``: look at and call tools of any host."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from toolmesh import strictjson
from toolmesh.cli.loading import default_audit, parse_target
from toolmesh.cli.serve import (
    AUTH_ENV,
    add_source_options,
    build_host,
    check_source_options,
    positive_float,
)
from toolmesh.errors import ConfigError, TransportError, excerpt

if TYPE_CHECKING:
    from toolmesh.client import AsyncClient
    from toolmesh.models import ToolEvent

__all__ = ["add_parsers"]

# What an HTTP server that is no A2E host answers POST /session with (http.server: 501).
_NOT_A2E = re.compile(r"/session answered (404|405|501)\b")


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
        help="an A2E host's http(s) URL, an A2A agent card's URL (its path ends in .json or "
        "holds /.well-known/agent), MODULE:ATTR, or a host command "
        "(e.g. 'toolmesh serve --stdio ...')",
    )
    parser.add_argument(
        "--auth-token",
        help=f"the bearer / handshake token of a --target host (default: env "
        f"{AUTH_ENV}); with a card URL, sent to the agent as a bearer token",
    )
    add_source_options(parser)


def refuse_ignored_options(args: argparse.Namespace) -> None:
    """ConfigError for options the command would otherwise ignore without a word."""
    if args.target is not None:
        made_here = {
            "--tools": bool(args.tools),
            "--config": args.config is not None,
            "--mcp-config": bool(args.mcp_config),
            "--mcp-defer-over": args.mcp_defer_over is not None,
        }
        given = [option for option, present in made_here.items() if present]
        if given:
            raise ConfigError(
                f"--target cannot be combined with {' or '.join(given)}: --target names the "
                "host to use, the source options make one here"
            )
    check_source_options(args)


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace, *, audited: bool = False) -> AsyncIterator[AsyncClient]:
    """A client of the target; a host or toolkit made here is closed with it (its sources'
    processes, a Ray cluster it started, its audit rows). ``audited``: a host made here keeps
    the audit log where `toolmesh serve` would (the manifest's, else TOOLMESH_AUDIT, else
    DEFAULT_AUDIT), since its calls are calls like any other."""
    from toolmesh.host import Host
    from toolmesh.toolkit import Toolkit

    target = await _target(args, audited)
    local = target if isinstance(target, Host | Toolkit) else None
    try:
        client = await _connect(target, None if local is not None else _remote_token(args))
        try:
            yield client
        finally:
            await client.close()
    finally:
        if local is not None:
            await local.close()


async def _target(args: argparse.Namespace, audited: bool) -> Any:
    """What ``--target`` (or, without it, the source options) names: a Host or Toolkit made
    here, a URL or a command."""
    from toolmesh.cli.agents import agent_toolkit, looks_like_card
    from toolmesh.host import Host
    from toolmesh.toolkit import Toolkit

    audit = default_audit() if audited else None
    if args.target is None:
        _refuse_token_here(args)
        return build_host(args, audit=None, default_audit=audit)
    # an empty --target is an error, not "no target"
    target = parse_target(args.target, audit=audit)
    if isinstance(target, str) and looks_like_card(target):  # a remote A2A agent's skills
        return await agent_toolkit(target, auth_token=args.auth_token, audit=audit)
    if isinstance(target, Host | Toolkit) and args.auth_token:
        await target.close()
        _refuse_token_here(args)
    return target


def _refuse_token_here(args: argparse.Namespace) -> None:
    if args.auth_token:
        raise ConfigError(
            "--auth-token is for a host reached over HTTP or stdio (--target URL or COMMAND); "
            "a host run in this process takes none"
        )


def _remote_token(args: argparse.Namespace) -> str | None:
    """The token for an A2E host over HTTP or stdio: --auth-token, else the variable that
    `toolmesh serve` reads, so one exported token serves both ends."""
    return args.auth_token or os.environ.get(AUTH_ENV) or None


async def _connect(target: Any, auth_token: str | None) -> AsyncClient:
    from toolmesh.client import connect_async

    try:
        return await connect_async(target, agent_id="toolmesh-cli", auth_token=auth_token)
    except TransportError as exc:
        if isinstance(target, str) and _NOT_A2E.search(exc.message):
            raise _not_an_a2e_host(target, exc) from exc
        raise


def _not_an_a2e_host(url: str, exc: TransportError) -> ConfigError:
    """The error for an http(s) target that answers, but not as an A2E host does: it may be an
    A2A agent given by its origin, or a card URL of a shape not taken for one."""
    from urllib.parse import urlsplit

    from toolmesh.a2a.card import WELL_KNOWN_CARD

    parts = urlsplit(url)
    card = f"{parts.scheme}://{parts.netloc}{WELL_KNOWN_CARD}"
    base = url.rstrip("/")
    said = exc.message
    if said.startswith(base + "/"):  # "http://h/session answered 501: ..." names the URL twice
        said = "POST " + said[len(base) :]
    return ConfigError(
        f"{url} is not an A2E host ({excerpt(said)}); for an A2A agent, give its "
        f"card's URL: --target {card}"
    )


def run_tools(args: argparse.Namespace) -> int:
    refuse_ignored_options(args)

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
    refuse_ignored_options(args)
    try:
        arguments = strictjson.loads(args.args)
    except ValueError as exc:
        raise ConfigError(f"--args is not valid JSON: {exc}") from exc
    if not isinstance(arguments, dict):
        raise ConfigError('--args must be a JSON object, e.g. \'{"path": "a.txt"}\'')

    async def main() -> int:
        async with _client(args, audited=True) as client:
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
