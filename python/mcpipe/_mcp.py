"""The few MCP SDK names mcpipe's own modules need before the SDK is loaded.

``mcpipe serve`` binds and answers before it imports the SDK (``server/_http.py``, ``_serve_sdk``): the SDK's
types (``mcp_types``, the pydantic models of both protocol eras) cost most of a server's start-up. So the
modules a server imports before it binds must not import the SDK at their top. What they need of it is here:

- the protocol's constants (error codes, ``_meta`` keys, the 2026-07-28 versions), the SDK's own values copied
  (``tests/test_mcp_names.py`` checks each against the SDK, so they cannot drift);
- :class:`MCPError`, the SDK's JSON-RPC error, read as ``_mcp.MCPError`` where it is raised or caught: the
  first read imports ``mcp.shared.exceptions`` (and the SDK's types with it), after which it is a plain
  attribute of this module.

A module that uses the SDK only in annotations imports it under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mcpipe._lazy import lazy_names

if TYPE_CHECKING:
    from mcp.shared.exceptions import MCPError

__all__ = [
    "CLIENT_CAPABILITIES_META_KEY",
    "CLIENT_INFO_META_KEY",
    "CONNECTION_CLOSED",
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LOG_LEVEL_META_KEY",
    "MCP_NAME_HEADER",
    "MCP_SESSION_ID_HEADER",
    "MISSING_REQUIRED_CLIENT_CAPABILITY",
    "MODERN_PROTOCOL_VERSIONS",
    "PROTOCOL_VERSION_META_KEY",
    "SERVER_INFO_META_KEY",
    "URL_ELICITATION_REQUIRED",
    "MCPError",
]

MODERN_PROTOCOL_VERSIONS: Final[tuple[str, ...]] = ("2026-07-28",)
"""The per-request-envelope revisions (``mcp_types.version.MODERN_PROTOCOL_VERSIONS``)."""

PROTOCOL_VERSION_META_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_META_KEY: Final = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_META_KEY: Final = "io.modelcontextprotocol/serverInfo"
LOG_LEVEL_META_KEY: Final = "io.modelcontextprotocol/logLevel"

CONNECTION_CLOSED: Final = -32000
HEADER_MISMATCH: Final = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY: Final = -32021
URL_ELICITATION_REQUIRED: Final = -32042
INVALID_REQUEST: Final = -32600
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

MCP_SESSION_ID_HEADER: Final = "mcp-session-id"
MCP_NAME_HEADER: Final = "mcp-name"

__getattr__ = lazy_names(__name__, {"MCPError": "mcp.shared.exceptions"})
