"""The SDK's per-request context as the server's handlers receive it.

The SDK builds one per inbound message (``ServerRunner._make_context``): its lifespan state is the default
lifespan's empty dict (mcpipe gives the low-level server none of its own, and reads none), and its request
is the Starlette request an HTTP transport attached (``None`` over stdio and in memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from starlette.requests import Request

__all__ = ["RequestContext"]

RequestContext: TypeAlias = "ServerRequestContext[Mapping[str, object], Request]"
"""The context of one request to the server (a 2025-11-25 or 2026-07-28 one, over any transport)."""
