"""Python tools the scheduler tests run pipelines against, with what they saw."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from mcpipe.tools import ToolContext, ToolRegistry, ToolResult


@dataclass
class Probe:
    """What the test tools saw: the order of calls, how many ran at once, which were cancelled."""

    log: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    cancelled: list[str] = field(default_factory=list)
    contexts: list[ToolContext] = field(default_factory=list)


def make_tools(probe: Probe) -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    async def echo(value: Any = None) -> dict[str, Any]:
        """Answer {"value": value}."""
        probe.log.append(f"echo {value}")
        return {"value": value}

    @reg.tool
    async def wait(ms: float, label: str = "", value: Any = None) -> dict[str, Any]:
        """Sleep ms milliseconds, counting how many calls are in flight."""
        probe.log.append(f"start {label}")
        probe.in_flight += 1
        probe.max_in_flight = max(probe.max_in_flight, probe.in_flight)
        try:
            await trio.sleep(ms / 1000)
        except trio.Cancelled:
            probe.cancelled.append(label)
            raise
        finally:
            probe.in_flight -= 1
        probe.log.append(f"end {label}")
        return {"label": label, "value": value}

    @reg.tool
    async def fail(message: str = "it failed", after_ms: float = 0) -> ToolResult:
        """Report a handled failure (isError)."""
        if after_ms:
            await trio.sleep(after_ms / 1000)
        probe.log.append(f"fail {message}")
        return ToolResult.error(message)

    @reg.tool
    async def boom(message: str = "boom") -> str:
        """Raise."""
        raise RuntimeError(message)

    @reg.tool
    def text(value: str) -> str:
        """Answer one text block."""
        return value

    @reg.tool
    async def blocks(texts: list[str]) -> ToolResult:
        """Answer one text block per item."""
        return ToolResult([{"type": "text", "text": t} for t in texts])

    @reg.tool
    async def whoami(ctx: ToolContext) -> dict[str, Any]:
        """Answer the context the call got."""
        probe.contexts.append(ctx)
        return {"pipeline": ctx.pipeline, "step": ctx.step, "request_id": ctx.request_id}

    # The tools of seed 000.
    @reg.tool
    async def web_search(query: str) -> dict[str, Any]:
        probe.log.append(f"search {query}")
        return {"results": [{"url": f"https://example.org/{query.replace(' ', '-')}", "title": query}]}

    @reg.tool
    async def web_fetch(url: str) -> dict[str, Any]:
        probe.log.append(f"fetch {url}")
        await trio.sleep(0.05)
        return {"url": url, "content": f"<content of {url}>"}

    @reg.tool
    def extract_key_info(query: str, materials: str) -> dict[str, Any]:
        probe.log.append("extract")
        return {"contexts": [f"{query}: {line}" for line in materials.splitlines()]}

    return reg


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
def tools(probe: Probe) -> ToolRegistry:
    return make_tools(probe)


@pytest.fixture
def run(tools: ToolRegistry):
    """``await run(spec, **kwargs)``: run_pipeline against the test tools, bounded in time."""
    from mcpipe.runtime import run_pipeline

    async def go(spec: Any, registry: Any = None, **kwargs: Any) -> dict[str, Any]:
        with trio.fail_after(60):
            return await run_pipeline(spec, registry if registry is not None else tools, **kwargs)

    return go
