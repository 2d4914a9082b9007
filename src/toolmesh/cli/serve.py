"""``toolmesh serve``: a host over stdio or HTTP."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from toolmesh.cli.loading import DEFAULT_AUDIT, load_sources
from toolmesh.cli.loading import default_audit as audit_default
from toolmesh.errors import ConfigError
from toolmesh.host import Host
from toolmesh.pipeline import Limits
from toolmesh.protocol import DEFAULT_MAX_MESSAGE_BYTES
from toolmesh.store import MemoryStore
from toolmesh.toolkit import Toolkit, ToolkitSource
from toolmesh.tools import busy_threads

__all__ = ["add_parser"]

AUTH_ENV = "TOOLMESH_AUTH_TOKEN"  # the variable: `serve` requires its token, `tools`/`call` send it
DEFAULT_WORKSPACE = "workspace"


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="serve tools to agents over stdio or HTTP",
        description=(
            "Serve tools to agents: A2E over NDJSON on stdio, A2E over HTTP+SSE (plus MCP at "
            "/mcp with --mcp), or MCP on stdio (--mcp-stdio)."
        ),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="speak NDJSON on stdin/stdout")
    mode.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="listen for HTTP (default 127.0.0.1:8765); prints the URL as its first line",
    )
    mode.add_argument("--mcp-stdio", action="store_true", help="speak MCP on stdin/stdout")
    parser.add_argument(
        "--mcp", action="store_true", help="with --http: also serve MCP (streamable HTTP) at /mcp"
    )
    add_source_options(parser)
    parser.add_argument(
        "--audit",
        metavar="PATH",
        default=None,  # not given: the manifest's, else TOOLMESH_AUDIT, else DEFAULT_AUDIT
        help=f"SQLite file for the audit log (default: the manifest's, else env "
        f"TOOLMESH_AUDIT, else {DEFAULT_AUDIT}; ':memory:' keeps none); "
        "shorthand for --store sqlite:///PATH",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("TOOLMESH_STORE"),
        help="where the audit log, sessions and state live: sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DB (hosts sharing one database serve as one; "
        "env TOOLMESH_STORE); wins over --audit",
    )
    parser.add_argument(
        "--auth-token",
        default=None,  # not given: TOOLMESH_AUTH_TOKEN, read in run() (given, it must apply)
        help="require this bearer token (HTTP) and handshake auth_token; "
        f"required to listen beyond loopback (env {AUTH_ENV})",
    )
    parser.add_argument(
        "--capability",
        action="append",
        default=None,
        metavar="TAG",
        help="a capability tag the host grants (repeatable; default: all)",
    )
    parser.add_argument(
        "--capability-policy",
        choices=["locked", "extensible"],
        default=None,
        help="whether sessions may change the capability set (default: the manifest's, "
        "else locked)",
    )
    parser.add_argument(
        "--max-parallel",
        type=positive_int,
        default=8,
        help="calls one session may run at once (default 8)",
    )
    parser.add_argument(
        "--approval-timeout",
        type=positive_float,
        default=None,
        help="seconds a call needing approval waits for an answer (default 300)",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help=f"largest message accepted (default {DEFAULT_MAX_MESSAGE_BYTES})",
    )
    parser.add_argument(
        "--workspace",
        metavar="DIR",
        default=None,  # not given: DEFAULT_WORKSPACE, set in run() (given, it must apply)
        help="with no --tools, --config, --mcp-config or --skills: serve the built-in tools "
        f"confined to DIR (default ./{DEFAULT_WORKSPACE}, created if missing)",
    )
    from toolmesh.cli.agents import add_serve_options

    add_serve_options(parser)
    parser.set_defaults(run=run)


def add_source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="a ToolPlugin (class or instance), Toolkit, @tool function or list of these",
    )
    parser.add_argument("--config", metavar="FILE", help="a toolmesh.toml manifest")
    parser.add_argument(
        "--mcp-config",
        action="append",
        default=[],
        metavar="FILE",
        help="MCP servers as sources: a JSON file in the mcpServers shape (repeatable)",
    )
    parser.add_argument(
        "--mcp-defer-over",
        type=non_negative_int,
        metavar="N",
        help="defer the tools of an MCP server with more than N of them (found by search)",
    )


def check_source_options(args: argparse.Namespace) -> None:
    """ConfigError for a source option that would be ignored without a word."""
    if args.mcp_defer_over is not None and not args.mcp_config:
        raise ConfigError(
            "--mcp-defer-over defers the tools of --mcp-config servers: give --mcp-config FILE"
        )


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (0 or less would refuse everything)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"wants a whole number above 0, not {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"wants a whole number, 0 or more, not {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: seconds above 0; 0, negative, nan and inf would mean no deadline."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"wants a number of seconds above 0, not {text!r}")
    return value


def build_host(
    args: argparse.Namespace, *, audit: str | None, default_audit: str | None = None
) -> Host:
    """The host the options describe. ``audit`` is the store the command line chose (None: not
    chosen); then the manifest's applies, else ``default_audit`` (None: the toolkit's own)."""
    sources = cli_sources(args, lone_toolkit_served=not args.config)
    if args.config:
        return _manifest_host(args, sources, audit=audit, default_audit=default_audit)
    toolkit = _lone_toolkit(sources)
    if toolkit is not None:
        return _toolkit_host(args, toolkit, audit=audit, default_audit=default_audit)
    if audit is None:
        audit = default_audit
        if default_audit is not None:
            args.audit = audit  # for the banner
    if not sources:  # the default toolkit: the built-in tools, confined to the workspace
        from toolmesh.sources.builtins import builtin_source

        workspace = getattr(args, "workspace", DEFAULT_WORKSPACE)  # `tools`/`call` have none
        sources = [builtin_source(True, workspace=workspace)]
    return Host(*sources, audit=audit, limits=cli_limits(args), **_host_options(args))


def _host_options(args: argparse.Namespace, *, capabilities: bool = True) -> dict[str, Any]:
    """What the command line sets of a host beside its sources, store and limits (with
    ``capabilities``: its capability set and policy too, else a manifest's toolkit has them)."""
    options: dict[str, Any] = {
        "max_parallel": getattr(args, "max_parallel", 8),
        "auth_token": getattr(args, "auth_token", None),
        "max_message_bytes": getattr(args, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES),
    }
    if capabilities:
        options["capabilities"] = getattr(args, "capability", None)
        options["capability_policy"] = getattr(args, "capability_policy", None)
    return options


def cli_sources(args: argparse.Namespace, *, lone_toolkit_served: bool = False) -> list[Any]:
    """The sources the command line names, besides a manifest's: ``--tools``, ``--skills`` and
    the servers of each ``--mcp-config`` file (plain ``serve`` and ``serve --a2a`` alike).

    A Toolkit among them would be governed by the toolkit it joins, so one with a policy or
    settings of its own is refused there, rather than served without them; alone, it is served
    as it is where the caller does that (``lone_toolkit_served``)."""
    sources = load_sources(args.tools)
    if getattr(args, "skills", None):
        from toolmesh.sources.skills import SkillsSource

        sources.append(SkillsSource(args.skills))
    if getattr(args, "mcp_config", None):
        from toolmesh.mcp.gateway import gateway_configs
        from toolmesh.mcp.source import mcp_source

        defer = getattr(args, "mcp_defer_over", None)
        for path in args.mcp_config:
            sources += [mcp_source(c) for c in gateway_configs(path, defer_over=defer)]
    joined = bool(args.config) or len(sources) > 1
    if joined or not lone_toolkit_served:
        _refuse_governed_toolkits(args.tools, sources, joined=joined)
    return sources


def _lone_toolkit(sources: list[Any]) -> Toolkit | None:
    """The toolkit, when the sources are one ``--tools`` Toolkit and nothing else."""
    if len(sources) == 1 and isinstance(sources[0], ToolkitSource):
        return sources[0].toolkit
    return None


def _refuse_governed_toolkits(specs: list[str], sources: list[Any], *, joined: bool) -> None:
    # load_sources gives one source per spec, first: the spec names the toolkit
    for spec, source in zip(specs, sources, strict=False):
        own = source.toolkit.own_settings() if isinstance(source, ToolkitSource) else []
        if not own:
            continue
        if joined:
            fix = "beside other sources: serve it alone, or add the other sources to it"
        else:  # `serve --a2a` builds a toolkit of its own
            fix = "here: declare them in a manifest (--config) instead"
        raise ConfigError(
            f"--tools {spec} is a Toolkit with its own {', '.join(own)}, "
            f"which would not apply {fix}"
        )


def _toolkit_host(
    args: argparse.Namespace, toolkit: Toolkit, *, audit: str | None, default_audit: str | None
) -> Host:
    """A host of a lone ``--tools`` Toolkit as it is: its policy, capabilities, limits, state
    paths and search hold, and its store unless the command line chose one (a toolkit with no
    store of its own gets the default audit file)."""
    if audit is None and isinstance(toolkit.store, MemoryStore):
        audit = default_audit
    if audit is not None:
        args.audit = audit  # for the banner
    elif hasattr(args, "audit"):
        args.audit = f"the toolkit's {type(toolkit.store).__name__}"
    return Host(
        toolkit,
        audit=audit,
        limits=cli_limits(args, toolkit.pipeline.limits),
        owns_toolkit=True,  # served by this host alone: it opens the sources and closes them
        **_host_options(args),
    )


def cli_limits(args: argparse.Namespace, base: Limits | None = None) -> Limits:
    """``base`` (default: the defaults), with the approval timeout the command line gave."""
    base = base or Limits()
    timeout = getattr(args, "approval_timeout", None)
    return base if timeout is None else dataclasses.replace(base, approval_timeout=timeout)


def _manifest_host(
    args: argparse.Namespace,
    sources: list[Any],
    *,
    audit: str | None,
    default_audit: str | None,
) -> Host:
    """A host of the manifest's toolkit (``--tools`` sources after its own). The manifest gives
    the audit file, the capabilities and the policy unless the command line does."""
    from toolmesh.manifest import load_manifest

    manifest = load_manifest(args.config)
    if audit is None and default_audit is not None:  # serve without --audit/--store
        audit = manifest.store or manifest.audit or default_audit
        args.audit = audit  # for the banner
    toolkit = manifest.toolkit(
        *sources,
        capabilities=getattr(args, "capability", None),
        capability_policy=getattr(args, "capability_policy", None),
        audit=audit,
    )
    return Host(
        toolkit,
        limits=cli_limits(args, toolkit.pipeline.limits),
        owns_toolkit=True,  # built for this host: it opens the sources and closes them
        **_host_options(args, capabilities=False),
    )


def run(args: argparse.Namespace) -> int:
    _refuse_ignored_options(args)
    if args.auth_token is None:
        args.auth_token = os.environ.get(AUTH_ENV)
    if args.workspace is None:
        args.workspace = DEFAULT_WORKSPACE
    args.llm_style = args.llm_style or "openai"
    if args.store:
        args.audit = args.store
    default_audit = audit_default()
    if args.a2a:
        from toolmesh.cli.agents import serve_agent

        if args.mcp_stdio:  # the agent is served over HTTP (with --mcp, MCP at /mcp beside it)
            raise ConfigError("--a2a serves over HTTP and cannot be combined with --mcp-stdio")
        if args.audit is None:
            args.audit = default_audit
        return serve_agent(args)
    host = build_host(args, audit=args.audit, default_audit=default_audit)
    if args.mcp and not args.http:
        raise ConfigError("--mcp serves MCP beside A2E over HTTP: give --http HOST:PORT too")
    if args.mcp_stdio:
        from toolmesh.mcp.stdio import serve_mcp_stdio

        # uvloop halves the thread hop of blocking tools, which MCP clients call back to back
        _run(_until_stopped(serve_mcp_stdio(host), host))
        _leave_stuck_threads()
        return 0
    if args.stdio:
        from toolmesh.transports.stdio import serve_stdio

        _run(_until_stopped(serve_stdio(host), host))
        _leave_stuck_threads()
        return 0
    from toolmesh.transports.http import serve_http

    def ready(url: str) -> None:
        print(url, flush=True)
        print(
            f"toolmesh: serving {len(host.toolkit)} tools at {url} "
            f"(store: {_shown(args.audit)}); Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

    bind = args.http or "127.0.0.1:8765"
    routes = []
    if args.mcp:
        from toolmesh.mcp.http import mcp_routes

        routes = mcp_routes(host, auth_token=args.auth_token)
    serving = serve_http(
        host, bind, auth_token=args.auth_token, on_ready=ready, extra_routes=routes
    )
    _run(_until_stopped(serving, host))
    _leave_stuck_threads()
    return 0


def _refuse_ignored_options(args: argparse.Namespace) -> None:
    """ConfigError for options this way of serving would ignore without a word."""
    check_source_options(args)
    if not args.a2a:
        agent_only = {
            "--llm": args.llm,
            "--model": args.model,
            "--llm-style": args.llm_style,
            "--a2a-description": args.a2a_description,
        }
        given = [option for option, value in agent_only.items() if value]
        if given:
            verb = "configures" if len(given) == 1 else "configure"
            raise ConfigError(f"{' and '.join(given)} {verb} the A2A agent: give --a2a NAME too")
    named = args.tools or args.config or args.mcp_config or args.skills
    if args.workspace is not None and named:
        raise ConfigError(
            "--workspace confines the built-in tools, which are served only without --tools, "
            "--config, --mcp-config and --skills"
        )
    if args.mcp_stdio and args.auth_token:
        raise ConfigError(
            "--auth-token has no effect with --mcp-stdio: MCP over stdio has no "
            "authentication (its only client is the process that started it)"
        )


def _shown(store: str) -> str:
    """A store URL for the banner, its password hidden."""
    if "@" not in store:
        return store
    scheme, _, rest = store.partition("://")
    credentials, _, place = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in credentials else ''}@{place}"


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run the server on uvloop when it is installed (the `fast` extra): its C pipes and sockets
    take about a third off a stdio round trip, for 1-2 ms of import. TOOLMESH_LOOP=asyncio
    chooses asyncio's own loop."""
    choice = os.environ.get("TOOLMESH_LOOP") or "uvloop"
    try:
        if choice != "uvloop":
            raise ImportError("asyncio's own loop was chosen")
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def _leave_stuck_threads() -> None:
    """Exit now if tools that ignored their deadline still hold threads: Python would otherwise
    wait for them forever at exit. The host is closed and its audit log committed by now."""
    stuck = busy_threads()
    if stuck:
        print(
            f"toolmesh: {stuck} tool thread(s) still running after their calls were stopped "
            "(a blocking tool cannot be interrupted); exiting without waiting for them",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(0)


async def _until_stopped(serving: Any, host: Host) -> None:
    """Run ``serving`` until it ends or SIGINT/SIGTERM arrives, then close the host."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(serving)
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        try:
            await host.close()
        finally:  # uvloop leaves them installed past the loop's end (main() may run again)
            for signum in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signum)
