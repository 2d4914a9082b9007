"""``toolmesh agents``: remote A2A agents in toolmesh.toml; and ``serve --a2a``, a toolkit
answering as an A2A agent whose tasks an LLM runs.

    toolmesh agents add CARD_URL [--name KEY] [--header 'Name: value'] [--config FILE]
    toolmesh agents list [--config FILE]
    toolmesh serve --http HOST:PORT --a2a NAME --llm BASE_URL --model M [--skills DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from toolmesh.cli.loading import default_audit
from toolmesh.cli.serve import positive_float
from toolmesh.errors import ConfigError

__all__ = ["add_parser", "agent_toolkit", "looks_like_card", "serve_agent"]

DEFAULT_CONFIG = "toolmesh.toml"
API_KEY_VARIABLES = {
    "openai": ("TOOLMESH_LLM_API_KEY", "OPENAI_API_KEY"),
    "anthropic": ("TOOLMESH_LLM_API_KEY", "ANTHROPIC_API_KEY"),
    "gemini": ("TOOLMESH_LLM_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"),
}


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "agents",
        help="remote A2A agents: add one to toolmesh.toml, list them",
        description="Remote A2A agents whose skills become tools ([agents] in toolmesh.toml).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser(
        "add",
        help="fetch an agent's card, show its tools and add it to the manifest",
        description="Fetch the agent card at CARD_URL, show the tools its skills become, and "
        "add it as [agents.KEY] to the manifest.",
    )
    add.add_argument("card", metavar="CARD_URL", help="the card's URL, or the agent's origin")
    add.add_argument("--name", metavar="KEY", help="the entry's key (default: from the card)")
    add.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header for every request; write secrets as ${VARIABLE} (repeatable)",
    )
    # positive_float: 0 read as "not given" and became 300, nan was taken as a deadline
    add.add_argument("--timeout", type=positive_float, help="seconds a task may take (default 300)")
    add.add_argument("--config", default=DEFAULT_CONFIG, help=f"the manifest ({DEFAULT_CONFIG})")
    add.set_defaults(run=run_add)
    listed = actions.add_parser("list", help="list the agents of the manifest")
    listed.add_argument("--config", default=DEFAULT_CONFIG, help=f"the manifest ({DEFAULT_CONFIG})")
    listed.set_defaults(run=run_list)


# -- agents add / list ---------------------------------------------------------------------------


def run_add(args: argparse.Namespace) -> int:
    from toolmesh.a2a import agent
    from toolmesh.a2a.config import expand_variables
    from toolmesh.toolkit import sanitize_name

    if args.name is not None and not args.name.strip():
        raise ConfigError("--name must not be empty")
    path = Path(args.config)
    existing = _agents_table(_read_manifest(path), path)  # a broken manifest: before fetching
    headers = dict(_header(h) for h in args.header)
    resolved = {k: expand_variables(v, f"--header {k}") for k, v in headers.items()}
    described = agent(args.card, resolved, args.timeout or 300.0)
    tools, card = asyncio.run(_fetch_tools(described))
    key = args.name or sanitize_name(str(card["name"])).lower()
    table = f"[agents.{_toml_key(key)}]"
    if key in existing:
        raise ConfigError(f"{path} already has {table}; choose another --name")
    entry = [table, f"card = {json.dumps(described.card_url)}"]
    if headers:
        pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in headers.items())
        entry.append(f"headers = {{ {pairs} }}")
    if args.timeout:
        entry.append(f"timeout = {args.timeout:g}")
    _append_checked(path, "\n".join(entry) + "\n", key, described.card_url)
    print(f"added {table} to {path}: {card['name']!r} with {len(tools)} tools")
    for tool in tools:
        print(f"  {tool.name}  {tool.description}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from toolmesh.a2a import parse_agents_config

    path = Path(args.config)
    table = _agents_table(_read_manifest(path), path)
    for key, entry in table.items():
        card = entry.get("card", "?") if isinstance(entry, dict) else "?"
        try:  # each on its own: one entry's unset ${VARIABLE} must not hide the others
            enabled = bool(parse_agents_config({"agents": {key: entry}}))
        except ConfigError as exc:
            print(f"{key}  {card}  (not usable here: {exc})")
            continue
        print(f"{key}  {card}{'' if enabled else '  (disabled)'}")
    if not table:
        print(f"no agents in {path}", file=sys.stderr)
    return 0


async def _fetch_tools(described: Any) -> tuple[list[Any], dict[str, Any]]:
    from toolmesh import a2a
    from toolmesh.a2a.card import check_card
    from toolmesh.a2a.remote import tools_from_card

    url = described.card_url
    card = check_card(await a2a._fetch_card(url, dict(described.headers), 30.0), url)
    return tools_from_card(described, card, url), card


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ConfigError(f"--header wants 'Name: value', not {text!r}")
    return name.strip(), value.strip()


def _read_manifest(path: Path) -> dict[str, Any]:
    import tomllib  # here, not at the top: keeps it off `toolmesh serve`'s start-up path

    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _agents_table(document: dict[str, Any], path: Path) -> dict[str, Any]:
    table = document.get("agents", {})
    if not isinstance(table, dict):
        raise ConfigError("must be a table of agents ([agents.KEY])", location=f"{path}: agents")
    return table


def _toml_key(key: str) -> str:
    """``key`` as one TOML key: bare when it can be, else quoted (``a.b`` bare would nest)."""
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return key
    return json.dumps(key)  # a JSON string is a TOML basic string


def _append_checked(path: Path, block: str, key: str, card_url: str) -> None:
    """Append ``block``, writing the file only if the result still parses and reads back as
    ``[agents.KEY]`` with this card."""
    import tomllib

    before = path.read_text(encoding="utf-8") if path.exists() else ""
    separator = "" if not before else "\n" if before.endswith("\n") else "\n\n"
    after = before + separator + block
    try:
        parsed = tomllib.loads(after)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot add the entry to {path} without breaking it: {exc}") from exc
    entry = parsed.get("agents", {}).get(key)
    if not isinstance(entry, dict) or entry.get("card") != card_url:
        raise ConfigError(f"cannot add [agents] entry {key!r} to {path}: it would not read back")
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(after, encoding="utf-8")
    temporary.replace(path)


# -- tools/call --target CARD_URL ----------------------------------------------------------------


def looks_like_card(target: str) -> bool:
    """Whether a ``--target`` names an agent card rather than an A2E host: a card is a JSON
    document, and an A2E host's URL is a base its paths (``/session``...) are put after."""
    if not target.startswith(("http://", "https://")):
        return False
    path = urlsplit(target).path
    return "/.well-known/agent" in path or path.lower().endswith(".json")


async def agent_toolkit(
    card_url: str, *, auth_token: str | None = None, audit: str | None = None
) -> Any:
    """A started toolkit holding the remote agent's tools, ``auth_token`` sent as its bearer
    token, its calls audited to ``audit`` (None: kept in memory); ConfigError if it is
    unavailable."""
    from toolmesh.a2a import agent
    from toolmesh.toolkit import create_toolkit

    headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
    toolkit = await create_toolkit(agents=[agent(card_url, headers)], name="agent", audit=audit)
    source = toolkit.sources[0]
    if source.status.state != "connected":
        await toolkit.close()
        raise ConfigError(f"the agent is unavailable: {source.status.reason}")
    return toolkit


# -- serve --a2a -----------------------------------------------------------------------------------


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("A2A agent (with --http)")
    group.add_argument("--a2a", metavar="NAME", help="also answer as the A2A agent NAME")
    group.add_argument("--a2a-description", default="", metavar="TEXT", help="its description")
    group.add_argument("--llm", metavar="BASE_URL", help="the model API its tasks run on")
    group.add_argument("--model", metavar="M", help="the model name")
    group.add_argument(
        "--llm-style",
        choices=["openai", "anthropic", "gemini"],
        default=None,  # not given: openai, set by `serve` (given without --a2a, it is refused)
        help="the API style (default openai); the key comes from TOOLMESH_LLM_API_KEY, "
        "else OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY (then GOOGLE_API_KEY)",
    )
    group.add_argument(
        "--skills", metavar="DIR", help="a skills folder to serve (the card's skills)"
    )


def serve_agent(args: argparse.Namespace) -> int:
    """``serve --a2a``: A2E and A2A on one HTTP port until SIGINT/SIGTERM."""
    if args.stdio:
        raise ConfigError("--a2a serves over HTTP; use --http HOST:PORT instead of --stdio")
    if not args.llm or not args.model:
        raise ConfigError("--a2a needs --llm BASE_URL and --model NAME to run its tasks")
    from toolmesh.cli.serve import _leave_stuck_threads, _run

    _run(_serve_agent(args))
    _leave_stuck_threads()  # as plain `serve`: a tool thread that ignored its deadline
    return 0


def _audit_chosen(args: argparse.Namespace) -> str | None:
    """The store --audit/--store chose, or None. ``serve`` may hand over its default in
    ``args.audit`` (None, or the default path itself): that is no choice, the manifest wins."""
    audit: str | None = getattr(args, "audit", None)
    if getattr(args, "store", None):
        return audit or args.store  # `serve` copies --store into args.audit
    if audit is None or audit == default_audit():
        return None
    return audit


async def _serve_agent(args: argparse.Namespace) -> None:
    from toolmesh.cli.serve import cli_limits, cli_sources
    from toolmesh.llm import create_client
    from toolmesh.toolkit import create_toolkit

    names = API_KEY_VARIABLES[args.llm_style]
    api_key = next((os.environ[n] for n in names if os.environ.get(n)), None)
    audit = _audit_chosen(args)
    sources = cli_sources(args)  # as plain `serve`: --tools, --skills, --mcp-config
    if args.config:
        # As plain `serve --config`: the manifest's audit unless --audit/--store chose one.
        from toolmesh.manifest import load_manifest

        manifest = load_manifest(args.config)
        toolkit = await manifest.toolkit(
            *sources,
            name=args.a2a,
            capabilities=args.capability,
            capability_policy=args.capability_policy,
            audit=audit or manifest.store or manifest.audit or default_audit(),
            limits=cli_limits(args),
        ).start()
    else:
        default = not sources  # as `serve`: the built-ins when nothing else is named
        toolkit = await create_toolkit(
            tools=sources,
            builtins=default,
            workspace=args.workspace if default else None,
            audit=audit or default_audit(),
            capabilities=args.capability,
            capability_policy=args.capability_policy or "locked",
            name=args.a2a,
            limits=cli_limits(args),
        )
    try:
        client = create_client(args.llm, args.llm_style, args.model, api_key)
    except BaseException:
        await toolkit.close()
        raise
    # Handlers first: whoever reads the URL may signal at once.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        handle = await toolkit.serve(
            args.http or "127.0.0.1:8765",
            client=client,
            a2a={"name": args.a2a, "description": args.a2a_description},
            mcp=True if getattr(args, "mcp", False) else None,
            auth_token=args.auth_token,
            max_parallel=args.max_parallel,
            max_message_bytes=args.max_message_bytes,
        )
        print(handle.url, flush=True)
        also = f", MCP at {handle.url}/mcp" if getattr(args, "mcp", False) else ""
        print(
            f"toolmesh: serving {len(toolkit)} tools and the A2A agent {args.a2a!r} "
            f"(card: {handle.url}/.well-known/agent-card.json{also}); Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        waiting = asyncio.ensure_future(handle.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        await handle.stop()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # uvloop keeps them past the loop's end
            loop.remove_signal_handler(signum)
        await toolkit.close()
        await client.aclose()
