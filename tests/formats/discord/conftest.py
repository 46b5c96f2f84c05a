"""Fixtures of the discord-mcp format's tests: the stand-in tools, and mcpipe serving ``mcp_pipeline`` over
them, reached through the SDK's own client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from mcp import Client

from kit.discord import Standins
from kit.servers import make_config
from mcpipe.server import open_app

Call = Callable[[dict[str, Any]], Awaitable[Any]]


@pytest.fixture
def standins() -> Standins:
    """discord-mcp's tools as stand-ins, plus the bench's ``fake_tool_*`` and the tests' ``x``."""
    return Standins("x", *(f"fake_tool_{i}" for i in range(1, 6)))


@pytest.fixture
async def client(standins: Standins) -> AsyncIterator[Client]:
    """The SDK's client, in memory, of an mcpipe serving ``mcp_pipeline`` (``[pipe] mcp_pipeline = true``)."""
    config = make_config(pipe={"mcp_pipeline": True})
    async with open_app(config, extra_sources=[standins.registry]) as app, Client(app.server) as c:
        yield c


@pytest.fixture
def pipeline(client: Client) -> Call:
    """``await pipeline({"steps": [...]})``: one ``mcp_pipeline`` call; answers the SDK's CallToolResult."""

    async def call(arguments: dict[str, Any]) -> Any:
        return await client.call_tool("mcp_pipeline", arguments)

    return call
