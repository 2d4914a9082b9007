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
from typing import TYPE_CHECKING, Any, TextIO

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
BAR_WIDTH = 30
MAX_EVENT_LINE = 100  # characters of a progress line


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
        events = _EventPrinter(sys.stderr)
        async with _client(args, audited=True) as client:
            try:
                result = await client.call_tool(
                    args.name,
                    arguments,
                    streaming=args.stream,
                    on_event=events.show if args.stream else None,
                    timeout=args.timeout,
                )
            finally:
                events.end_line()
        shown = {**result.model_dump(mode="json"), "output": result.output}
        print(json.dumps(shown, indent=2, ensure_ascii=False))
        return 0 if result.success else 1

    return asyncio.run(main())


class _EventPrinter:
    """Shows a streamed call's events, one line each. On a terminal a progress bar is redrawn
    in place while it is the last line printed; elsewhere (a file, a pipe) each bar is a line
    of its own, with no carriage returns in the output."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._redraws = out.isatty()
        self._bar_shown = 0  # characters of the bar the cursor is behind (0: at a line start)

    def show(self, event: ToolEvent) -> None:
        pct = _percent(event.data.get("pct")) if event.kind == "progress" else None
        if pct is None:
            self._line(f"{event.kind}: {_event_text(event.data)}")
        elif self._redraws:
            self._redraw(_progress_line(pct, event.data.get("message", "")))
        else:
            self._line(_progress_line(pct, event.data.get("message", "")))
        self._out.flush()

    def end_line(self) -> None:
        """End the bar the cursor is behind, if any, so what follows starts a line."""
        if self._bar_shown:
            self._out.write("\n")
            self._out.flush()
            self._bar_shown = 0

    def _line(self, text: str) -> None:
        self.end_line()
        self._out.write(f"{text}\n")

    def _redraw(self, bar: str) -> None:
        # A shorter bar than the one it replaces is padded, or the old one's tail would stay.
        self._out.write(f"\r{bar.ljust(self._bar_shown)}" if self._bar_shown else bar)
        self._bar_shown = len(bar)


def _percent(value: object) -> int | None:
    """A progress event's ``pct`` as a whole percent within 0..100; None when it is no number
    (a host that is no toolmesh may send anything, a toolmesh tool any int)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:  # NaN
        return None
    return int(min(max(value, 0), 100))


def _progress_line(pct: int, message: object) -> str:
    filled = pct * BAR_WIDTH // 100
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    text = " ".join(str(message)[:MAX_EVENT_LINE].split())  # one line, or no redrawing it
    return f"[{bar}] {pct:3d}% {text}"[:MAX_EVENT_LINE]


def _event_text(data: dict[str, Any]) -> str:
    message = data.get("message")
    return str(message) if message else json.dumps(data, ensure_ascii=False, default=str)
