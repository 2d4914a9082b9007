"""MCP both ways, on the official ``mcp`` SDK (the ``toolmesh[mcp]`` extra).

- ``config``: server declarations (the ``mcpServers`` JSON shape, toolmesh.toml entries)
- ``source``: an MCP server's tools as governed toolmesh tools
- ``definitions``, ``results``: MCP tools and results <-> toolmesh definitions and results
- ``server``: any toolkit served over MCP (stdio, and streamable HTTP at ``/mcp``)
"""

from toolmesh.mcp.config import MCPServerConfig, load_mcp_config, parse_mcp_config

__all__ = ["MCPServerConfig", "load_mcp_config", "parse_mcp_config"]
