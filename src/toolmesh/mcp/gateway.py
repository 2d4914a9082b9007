"""Many MCP servers behind one MCP endpoint: toolmesh as an MCP gateway.

The upstream servers become sources of one toolkit: every tool is named ``{server}_{tool}``
(two servers may not share a prefix, and the toolkit refuses or warns about any other
collision), one capability policy governs every call, one audit log records them, and one search
index ranks them all. A server with a big catalogue can be deferred (``defer_loading``): its
tools are then not listed but found through the ``search_tools`` tool the MCP server adds, and
loaded into the session that searched.

Serve it with ``toolmesh serve --mcp-stdio --mcp-config servers.json`` or
``toolmesh serve --http 127.0.0.1:8765 --mcp --mcp-config servers.json``; in code::

    host = gateway_host("servers.json", audit="gateway-audit.db", defer_over=50)
    await serve_mcp_stdio(host)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolmesh.capabilities import CapabilityPolicy
from toolmesh.host import Host
from toolmesh.mcp.config import MCPServerConfig, mcp_configs
from toolmesh.mcp.source import mcp_source
from toolmesh.pipeline import Limits, PolicyHook
from toolmesh.store import Store
from toolmesh.toolkit import OnConflict

__all__ = ["gateway_configs", "gateway_host"]


def gateway_configs(servers: Any, *, defer_over: int | None = None) -> list[MCPServerConfig]:
    """The upstream servers, each deferred past ``defer_over`` tools unless it says otherwise."""
    configs = mcp_configs(servers)
    if defer_over is None:
        return configs
    return [
        dataclasses.replace(c, defer_loading=defer_over) if c.defer_loading is False else c
        for c in configs
    ]


def gateway_host(
    servers: Any,
    *,
    defer_over: int | None = None,
    audit: Store | str | Path | None = None,
    capabilities: Sequence[str] | None = None,
    capability_policy: CapabilityPolicy = "locked",
    on_conflict: OnConflict = "warn",
    hooks: Sequence[PolicyHook] = (),
    limits: Limits | None = None,
    name: str = "toolmesh-gateway",
) -> Host:
    """A host whose toolkit is every configured MCP server (connected when the host starts)."""
    sources = [mcp_source(c) for c in gateway_configs(servers, defer_over=defer_over)]
    host = Host(
        *sources,
        audit=audit,
        capabilities=capabilities,
        capability_policy=capability_policy,
        limits=limits,
        hooks=hooks,
    )
    host.toolkit.name = name
    host.toolkit.on_conflict = on_conflict  # names are claimed when the servers answer
    return host
