"""Hosted MCP tools' client side: which servers a tenant may reach (policy.py), connections pinned
to the checked addresses (pinning.py), and listings and calls through the ``mcp`` SDK (client.py).
The engine's loop is gateway/engine/hosted.py."""

from adapters.mcp.client import McpHost
from adapters.mcp.types import McpCallResult, McpServer, McpTool

__all__ = ["McpCallResult", "McpHost", "McpServer", "McpTool"]
