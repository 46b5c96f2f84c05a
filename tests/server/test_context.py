"""The typed request context: what a tool learns about its call, in typed fields, not ``extras`` keys."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from mcp import Client

from kit.servers import make_config
from mcpipe.gateway import PIPE_TOOL, Gateway
from mcpipe.interaction import Interaction
from mcpipe.server import open_app
from mcpipe.tools import ToolContext, ToolRegistry

seen: list[ToolContext] = []
probe = ToolRegistry()


@probe.tool
def look(ctx: ToolContext) -> dict[str, Any]:
    """Record the context the call got."""
    seen.append(ctx)
    return {"ok": True}


@pytest.mark.parametrize(("mode", "era"), [("2026-07-28", "2026-07-28"), ("legacy", "2025-11-25")])
async def test_a_tool_learns_era_interaction_progress_and_its_callers_registry_from_typed_fields(mode, era):
    seen.clear()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        pass

    with trio.fail_after(20):
        async with open_app(make_config(), extra_sources=[probe]) as app, Client(app.server, mode=mode) as client:
            await client.call_tool("look", {}, progress_callback=on_progress)
            await client.call_tool(PIPE_TOOL, {"steps": [{"id": "s", "tool": "look"}]})
    direct, piped = seen
    for ctx in (direct, piped):
        assert ctx.era == era and isinstance(ctx.interaction, Interaction)
        assert isinstance(ctx.tools, Gateway) and ctx.tools is app.gateway
        assert ctx.sdk_context is not None and ctx.extras == {}  # mcpipe keeps nothing in extras
    assert direct.has_progress and direct.wants_progress and direct.step is None
    assert not piped.has_progress and piped.step == "s" and piped.pipeline is not None
