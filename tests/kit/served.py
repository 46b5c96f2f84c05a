"""Serving a config document with the real app, and calling its tools with the SDK's Client: what the
step-kind tests (kafka, nats, grpc, sql) and the interop tests (beside another library's service) share."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from mcp import Client
from mcp.types import CallToolResult

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


async def call_beside(
    service: Callable[[str, threading.Event, threading.Event], None],
    address: str,
    doc: dict[str, Any],
    name: str,
    args: dict[str, Any],
) -> CallToolResult:
    """Call tool ``name`` of an app serving ``doc`` while ``service(address, ready, stop)`` (another library's
    blocking service loop) runs in a thread: called once it sets ``ready``; told to end with ``stop``."""
    ready, stop = threading.Event(), threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, service, address, ready, stop)
        try:
            assert await trio.to_thread.run_sync(ready.wait, 30), "the service did not start within 30 s"
            async with served(doc) as app, Client(app.server) as client:
                return await client.call_tool(name, args)
        finally:
            stop.set()
