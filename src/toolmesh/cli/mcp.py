"""``toolmesh mcp status``: connect to every configured MCP server at once and report."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from toolmesh.errors import ConfigError

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="MCP servers: check the configured ones",
        description="Work with the MCP servers toolmesh is configured to use.",
    )
    actions = mcp.add_subparsers(dest="mcp_command", metavar="ACTION")
    status = actions.add_parser(
        "status",
        help="connect to every server and show which answer",
        description=(
            "Connect to every configured MCP server concurrently and show each one's state "
            "(connected / failed / disabled, with the reason) and tool count. Exit 1 when one "
            "failed."
        ),
    )
    status.add_argument(
        "config",
        nargs="*",
        metavar="FILE",
        help="MCP configurations: JSON (mcpServers shape) or toolmesh.toml (default: "
        "./toolmesh.toml, then ./.mcp.json)",
    )
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.set_defaults(run=run_status)
    mcp.set_defaults(run=lambda _args: _usage(mcp))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_status(args: argparse.Namespace) -> int:
    from pathlib import Path

    from toolmesh.mcp.config import load_mcp_config

    files = args.config or [p for p in ("toolmesh.toml", ".mcp.json") if Path(p).exists()][:1]
    if not files:
        raise ConfigError("no MCP configuration: give a FILE (JSON or toolmesh.toml)")
    configs = [config for path in files for config in load_mcp_config(path)]
    report = asyncio.run(_check(configs))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 1 if any(row["state"] == "failed" for row in report) else 0


async def _check(configs: list[Any]) -> list[dict[str, Any]]:
    from toolmesh.mcp.source import MCPSource

    sources = [MCPSource(config) for config in configs]
    try:
        await asyncio.gather(*(source.open() for source in sources))
        return [
            {
                "name": source.name,
                "state": source.status.state,
                "reason": source.status.reason,
                "tools": _served(source),
                "listed": len(source.tools()),
                "protocol": source.protocol_version,
                "transport": source.config.transport,
                "where": source.config.describe(),
            }
            for source in sources
        ]
    finally:
        await asyncio.gather(*(source.close() for source in sources))


def _served(source: Any) -> int:
    """How many of the server's tools toolmesh serves: its ``allow`` and ``deny`` applied."""
    from toolmesh.sources.wrappers import Filtered

    config = source.config
    if not (config.allow or config.deny):
        return len(source.tools())
    return len(Filtered(source, allow=config.allow, deny=config.deny).tools())


def _print_table(report: list[dict[str, Any]]) -> None:
    if not report:
        print("no MCP servers configured")
        return
    width = max(len(row["name"]) for row in report)
    for row in report:
        detail = row["reason"] or f"{row['transport']}: {row['where']}"
        tools = ""
        if row["state"] == "connected":
            tools = f"{row['tools']} tool{'' if row['tools'] == 1 else 's'}"
            if row["listed"] != row["tools"]:
                tools += f" (of {row['listed']})"
        line = f"{row['name']:<{width}}  {row['state']:<9}  {tools:<9}  {row['protocol']:<10}  "
        print((line + detail).rstrip())
    sys.stdout.flush()
