"""toolmesh: one Python runtime that gives LLM agents their tools.

Tools come from many sources (Python functions, A2E ToolPlugins, toolkits, ...); one pipeline
governs every call (capability policy, argument validation, deadlines, events, output limits,
state updates, audit); hosts serve them in-process, over stdio and over HTTP.
"""

from toolmesh import capabilities
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
    RemoteError,
    SchemaError,
    StateError,
    ToolCallFailed,
    ToolmeshError,
    TransportError,
)
from toolmesh.host import Host
from toolmesh.mcp.config import MCPServerConfig, parse_mcp_config
from toolmesh.models import ToolDefinition, ToolErrorCode, ToolEvent, ToolParameter, ToolResult
from toolmesh.pipeline import Decision, Limits
from toolmesh.schema import parameters_to_schema, schema_to_parameters
from toolmesh.session import Session
from toolmesh.sources.base import Source, SourceStatus, ToolSet
from toolmesh.sources.functions import FunctionTool, tool
from toolmesh.sources.plugin import ToolPlugin
from toolmesh.sources.wrappers import Filtered, Prefixed, Renamed, Tagged
from toolmesh.toolkit import Toolkit, ToolNameConflict, create_toolkit, sanitize_name
from toolmesh.tools import Output, Tool, ToolContext

__version__ = "0.1.0"

__all__ = [
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
    "Limits",
    "MCPServerConfig",
    "NameConflictError",
    "Output",
    "Prefixed",
    "ProtocolError",
    "RemoteError",
    "Renamed",
    "SchemaError",
    "Session",
    "Source",
    "SourceStatus",
    "StateError",
    "Tagged",
    "Tool",
    "ToolAPI",
    "ToolCallFailed",
    "ToolContext",
    "ToolDefinition",
    "ToolErrorCode",
    "ToolEvent",
    "ToolNameConflict",
    "ToolParameter",
    "ToolPlugin",
    "ToolResult",
    "ToolSet",
    "Toolkit",
    "ToolmeshError",
    "TransportError",
    "__version__",
    "capabilities",
    "connect",
    "connect_async",
    "create_toolkit",
    "parameters_to_schema",
    "parse_mcp_config",
    "sanitize_name",
    "schema_to_parameters",
    "tool",
]
