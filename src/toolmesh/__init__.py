"""toolmesh: one Python runtime that gives LLM agents their tools.

Tools come from many sources (Python functions, A2E ToolPlugins, toolkits, remote A2A agents,
...); one pipeline governs every call (capability policy, argument validation, deadlines, events,
output limits, state updates, audit); hosts serve them in-process, over stdio and over HTTP, and
a toolkit can answer as an A2A agent whose tasks an LLM client runs.

Names are imported on first use, so `toolmesh serve --stdio` starts without loading the client,
the HTTP stack or anything else it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolmesh import capabilities
    from toolmesh.a2a import Agent, agent, agent_tools, parse_agents_config
    from toolmesh.client import AsyncClient, AsyncToolAPI, Client, ToolAPI, connect, connect_async
    from toolmesh.errors import (
        ArgumentError,
        AuditError,
        CallTimeout,
        CapabilityError,
        ConfigError,
        HandshakeError,
        NameConflictError,
        ProtocolError,
        ProviderError,
        RemoteError,
        SchemaError,
        StateError,
        ToolCallFailed,
        ToolCallParseError,
        ToolmeshError,
        TransportError,
    )
    from toolmesh.host import Host
    from toolmesh.llm import LLMClient, RunResult, create_client
    from toolmesh.manifest import Manifest, load_manifest
    from toolmesh.mcp.config import MCPServerConfig, parse_mcp_config
    from toolmesh.models import ToolDefinition, ToolErrorCode, ToolEvent, ToolParameter, ToolResult
    from toolmesh.pipeline import Decision, Limits
    from toolmesh.schema import parameters_to_schema, schema_to_parameters
    from toolmesh.search import Ranking, SearchIndex
    from toolmesh.session import Session
    from toolmesh.sources.base import Source, SourceStatus, ToolSet
    from toolmesh.sources.functions import FunctionTool, tool
    from toolmesh.sources.http import HttpEndpoint, HttpSource, http_tool
    from toolmesh.sources.openapi import OpenAPISource
    from toolmesh.sources.plugin import ToolPlugin
    from toolmesh.sources.tool_search import ToolSearchSource
    from toolmesh.sources.wrappers import Filtered, Prefixed, Renamed, Tagged
    from toolmesh.toolkit import Toolkit, ToolNameConflict, create_toolkit, sanitize_name
    from toolmesh.tools import Output, Tool, ToolContext

__version__ = "0.1.0"

_LOCATIONS: dict[str, str] = {
    "ToolCallParseError": "toolmesh.errors",
    "OpenAPISource": "toolmesh.sources.openapi",
    "http_tool": "toolmesh.sources.http",
    "HttpSource": "toolmesh.sources.http",
    "HttpEndpoint": "toolmesh.sources.http",
    "load_manifest": "toolmesh.manifest",
    "Manifest": "toolmesh.manifest",
    "Agent": "toolmesh.a2a",
    "agent": "toolmesh.a2a",
    "agent_tools": "toolmesh.a2a",
    "parse_agents_config": "toolmesh.a2a",
    "LLMClient": "toolmesh.llm",
    "RunResult": "toolmesh.llm",
    "create_client": "toolmesh.llm",
    "ProviderError": "toolmesh.errors",
    "MCPServerConfig": "toolmesh.mcp.config",
    "parse_mcp_config": "toolmesh.mcp.config",
    "ArgumentError": "toolmesh.errors",
    "AuditError": "toolmesh.errors",
    "CallTimeout": "toolmesh.errors",
    "CapabilityError": "toolmesh.errors",
    "ConfigError": "toolmesh.errors",
    "HandshakeError": "toolmesh.errors",
    "NameConflictError": "toolmesh.errors",
    "ProtocolError": "toolmesh.errors",
    "RemoteError": "toolmesh.errors",
    "SchemaError": "toolmesh.errors",
    "StateError": "toolmesh.errors",
    "ToolCallFailed": "toolmesh.errors",
    "ToolmeshError": "toolmesh.errors",
    "TransportError": "toolmesh.errors",
    "AsyncClient": "toolmesh.client",
    "AsyncToolAPI": "toolmesh.client",
    "Client": "toolmesh.client",
    "Decision": "toolmesh.pipeline",
    "Filtered": "toolmesh.sources.wrappers",
    "FunctionTool": "toolmesh.sources.functions",
    "Host": "toolmesh.host",
    "Limits": "toolmesh.pipeline",
    "Output": "toolmesh.tools",
    "Prefixed": "toolmesh.sources.wrappers",
    "Ranking": "toolmesh.search",
    "Renamed": "toolmesh.sources.wrappers",
    "SearchIndex": "toolmesh.search",
    "Session": "toolmesh.session",
    "Source": "toolmesh.sources.base",
    "SourceStatus": "toolmesh.sources.base",
    "Tagged": "toolmesh.sources.wrappers",
    "Tool": "toolmesh.tools",
    "ToolAPI": "toolmesh.client",
    "ToolContext": "toolmesh.tools",
    "ToolDefinition": "toolmesh.models",
    "ToolErrorCode": "toolmesh.models",
    "ToolEvent": "toolmesh.models",
    "ToolNameConflict": "toolmesh.toolkit",
    "ToolParameter": "toolmesh.models",
    "ToolPlugin": "toolmesh.sources.plugin",
    "ToolResult": "toolmesh.models",
    "ToolSearchSource": "toolmesh.sources.tool_search",
    "ToolSet": "toolmesh.sources.base",
    "Toolkit": "toolmesh.toolkit",
    "connect": "toolmesh.client",
    "connect_async": "toolmesh.client",
    "create_toolkit": "toolmesh.toolkit",
    "parameters_to_schema": "toolmesh.schema",
    "sanitize_name": "toolmesh.toolkit",
    "schema_to_parameters": "toolmesh.schema",
    "tool": "toolmesh.sources.functions",
}

__all__ = [
    "Agent",
    "ArgumentError",
    "AsyncClient",
    "AsyncToolAPI",
    "AuditError",
    "CallTimeout",
    "CapabilityError",
    "Client",
    "ConfigError",
    "Decision",
    "Filtered",
    "FunctionTool",
    "HandshakeError",
    "Host",
    "HttpEndpoint",
    "HttpSource",
    "LLMClient",
    "Limits",
    "MCPServerConfig",
    "Manifest",
    "NameConflictError",
    "OpenAPISource",
    "Output",
    "Prefixed",
    "ProtocolError",
    "ProviderError",
    "Ranking",
    "RemoteError",
    "Renamed",
    "RunResult",
    "SchemaError",
    "SearchIndex",
    "Session",
    "Source",
    "SourceStatus",
    "StateError",
    "Tagged",
    "Tool",
    "ToolAPI",
    "ToolCallFailed",
    "ToolCallParseError",
    "ToolContext",
    "ToolDefinition",
    "ToolErrorCode",
    "ToolEvent",
    "ToolNameConflict",
    "ToolParameter",
    "ToolPlugin",
    "ToolResult",
    "ToolSearchSource",
    "ToolSet",
    "Toolkit",
    "ToolmeshError",
    "TransportError",
    "__version__",
    "agent",
    "agent_tools",
    "capabilities",
    "connect",
    "connect_async",
    "create_client",
    "create_toolkit",
    "http_tool",
    "load_manifest",
    "parameters_to_schema",
    "parse_agents_config",
    "parse_mcp_config",
    "sanitize_name",
    "schema_to_parameters",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "capabilities":
        return importlib.import_module("toolmesh.capabilities")
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolmesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
