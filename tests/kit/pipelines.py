"""Helpers for the declared-pipeline tests: load ``pipelines:`` YAML into tools behind a real gateway."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import trio
import yaml

from mcpipe.compile import Limits
from mcpipe.declared import DeclaredPipelines, load_declared
from mcpipe.gateway import AuditLog, Gateway, Policy
from mcpipe.tools import ToolContext, ToolRegistry, ToolResult

PY_COMMANDS = {"commands": {"py": [sys.executable, "-c"]}, "command_kill_grace_ms": 200}


@dataclass
class Seen:
    """What the Python test tools saw."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    started: trio.Event = field(default_factory=trio.Event)
    cancelled: list[str] = field(default_factory=list)


def python_tools(seen: Seen) -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    def add(a: float, b: float) -> dict[str, Any]:
        """Add two numbers."""
        seen.calls.append(("add", (a, b)))
        return {"sum": a + b}

    @reg.tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        seen.calls.append(("shout", text))
        return text.upper()

    @reg.tool
    def refuse() -> ToolResult:
        """Answer a tool error."""
        return ToolResult.error("card declined")

    @reg.tool
    async def hang(label: str = "") -> str:
        """Say it started, then wait for a minute."""
        seen.started.set()
        try:
            await trio.sleep(60)
        except trio.Cancelled:
            seen.cancelled.append(label)
            raise
        return "finished"

    return reg


@dataclass
class Loaded:
    declared: DeclaredPipelines
    gateway: Gateway
    audit: AuditLog
    seen: Seen

    async def call(self, name: str, args: Any = None, ctx: ToolContext | None = None) -> ToolResult:
        with trio.fail_after(20):
            return await self.gateway.call(name, {} if args is None else args, ctx or ToolContext())


def load(
    text: str, *, outbound: Any = None, limits: Limits | None = None, grants: dict[str, list[str]] | None = None
) -> Loaded:
    """Load the ``pipelines:`` of a YAML document behind a gateway with the Python test tools; fail the
    test on any problem."""
    doc = yaml.safe_load(text)
    pipelines = doc["pipelines"] if isinstance(doc, dict) else doc
    seen = Seen()
    reg = python_tools(seen)
    declared, problems = load_declared(
        pipelines, outbound if outbound is not None else doc.get("outbound"), tools=reg, limits=limits
    )
    assert problems == [], "\n".join(map(str, problems))
    audit = AuditLog(None, keep=True)
    gateway = Gateway([reg, declared], policy=Policy(grants), audit=audit)
    declared.bind(gateway)
    return Loaded(declared, gateway, audit, seen)


def problems_of(text: str, *, outbound: Any = None, tools: Any = "default", limits: Limits | None = None) -> list[str]:
    """The problems of a YAML document's ``pipelines:`` (and ``outbound:``), as ``location: message``."""
    doc = yaml.safe_load(text)
    pipelines = doc["pipelines"] if isinstance(doc, dict) else doc
    reg = python_tools(Seen()) if tools == "default" else tools
    from mcpipe.declared import validate_declared

    out = outbound if outbound is not None else (doc.get("outbound") if isinstance(doc, dict) else None)
    return [str(p) for p in validate_declared(pipelines, out, reg, limits)]


def text_of(result: ToolResult) -> str:
    return result.joined_text()
