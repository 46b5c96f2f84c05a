"""Serving a config document with the real app, and calling its tools with the SDK's Client: what the
step-kind tests (kafka, nats, grpc, sql) share."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp import Client

from mcpipe.config import parse_config
from mcpipe.server import App, open_app


@asynccontextmanager
async def served(doc: dict[str, Any], base_dir: str = ".") -> AsyncIterator[App]:
    """An app serving the config ``doc``, with audit and the built-in tools off (no environment)."""
    doc = {"audit": {"enabled": False}, "builtins": False, **doc}
    async with open_app(parse_config(json.dumps(doc), "json", base_dir=base_dir, environ={})) as app:
        yield app


async def call(client: Client, name: str, args: dict[str, Any]) -> tuple[bool, Any]:
    """Call a tool: whether it failed, and its structured content (its text when it has none)."""
    r = await client.call_tool(name, args)
    text = r.content[0].text  # type: ignore[union-attr]
    return r.is_error, (r.structured_content if r.structured_content is not None else text)
