"""Stand-ins of discord-mcp's tools, for the ``mcp_pipeline`` tests (``tests/formats/discord``).

Each stand-in has the name, arguments and answer shape of discord-mcp's tool (``messages_send`` answers
``{message_id, channel_id, jump_url, timestamp}``, a Discord error is an ``isError`` result whose structured
content is ``{code, retriable, category, recovery_hint, ...}``: ``errors/format.ts``). Any other name answers
as the synthetic ``invoke`` of discord's ``pipeline.bench.ts`` does: ``{tool, received, field, count}``.

A test scripts answers the way discord's tests mock ``invoke`` (``vi.fn().mockResolvedValueOnce(...)``):
``standins.respond("messages_send", ok({...}), err("DISCORD_NOT_FOUND", "gone"))``, and reads the calls made
(``standins.calls``: ``(tool, args)`` in order).

    python discord.py    # the same tools as a stdio MCP server: a discord-mcp for mcpipe to front, with an
                         # `mcp_pipeline` of its own (which mcpipe's replaces); STANDIN_FAIL=tool:CODE:message
                         # makes one tool fail
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from mcp_types import CallToolResult, TextContent

from mcpipe.tools import ToolContext, ToolRegistry, ToolResult

SERVER = str(Path(__file__).resolve())
"""This file, run as a stdio MCP server."""

GUILD = "111122223333444455"


def ok(data: dict[str, Any]) -> ToolResult:
    """A success as discord's tests build it: one text block ``ok`` and the structured content."""
    return ToolResult([{"type": "text", "text": "ok"}], data)


def err(code: str, message: str, *, retriable: bool = False) -> ToolResult:
    """A Discord error as discord's tests build it: ``isError``, the message as text, and
    ``{code, retriable, category}``."""
    return ToolResult(
        [{"type": "text", "text": message}], {"code": code, "retriable": retriable, "category": "client"}, True
    )


def answer(tool: str, args: dict[str, Any]) -> ToolResult:
    """What the stand-in of ``tool`` answers ``args`` with (deterministic, shaped as discord-mcp's)."""
    if tool == "messages_send":
        channel = str(args.get("channel_id", ""))
        mid = "888899990000111122"
        return ok(
            {
                "message_id": mid,
                "channel_id": channel,
                "jump_url": f"https://discord.com/channels/{GUILD}/{channel}/{mid}",
                "timestamp": "2030-01-01T16:30:00.000Z",
            }
        )
    if tool == "events_create":
        keys = ("guild_id", "name", "description")
        times = {k: _iso(args.get(k)) for k in ("scheduled_start_time", "scheduled_end_time")}
        event = {"id": "333344445555666677", **{k: args.get(k) for k in keys}, **times}
        return ok({**event, "status": 1, "entity_type": args.get("entity_type"), "channel_id": None})
    if tool == "members_add_role":
        return ok({"added": True, "user_id": args.get("user_id"), "role_id": args.get("role_id")})
    if tool == "channels_list":
        channels = [
            {"id": "222233334444555566", "name": "announcements"},
            {"id": "222233334444555577", "name": "general"},
        ]
        return ok({"guild_id": args.get("guild_id"), "channels": channels, "count": len(channels)})
    if tool == "roles_list":
        return ok({"guild_id": args.get("guild_id"), "roles": [{"id": "555566667777888899", "name": "event-host"}]})
    if tool == "messages_read":
        return ok({"channel_id": args.get("channel_id"), "messages": [{"id": "msg_1", "content": "hello"}]})
    if tool == "messages_delete":
        return ok({"deleted": True, "message_id": args.get("message_id")})
    # pipeline.bench.ts's synthetic invoke.
    return ToolResult(
        [{"type": "text", "text": f"{tool} ok"}],
        {"tool": tool, "received": args, "field": "value-from-step", "count": 3},
    )


def _iso(value: Any) -> Any:
    """A timestamp as Discord writes it back (milliseconds added)."""
    if isinstance(value, str) and value.endswith("Z") and "." not in value:
        return value[:-1] + ".000Z"
    return value


STANDIN_NAMES = (
    "messages_send",
    "events_create",
    "members_add_role",
    "channels_list",
    "roles_list",
    "messages_read",
    "messages_delete",
)


class _Tool:
    """One stand-in, as a tool: any arguments, the scripted answer first, else its own."""

    def __init__(self, name: str, owner: Standins) -> None:
        self.name = name
        self.description = f"Stand-in of discord-mcp's `{name}`."
        self.input_schema: dict[str, Any] = {"type": "object"}
        self.output_schema: dict[str, Any] | None = None
        self.owner = owner

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.owner.calls.append((self.name, args))
        queue = self.owner.scripted[self.name]
        if queue:
            return queue.popleft()
        return answer(self.name, args)


class Standins:
    """Stand-in tools with scripted answers and a record of the calls.

    Args:
        names: the tools beyond discord-mcp's seven (``fake_tool_1``, ``x``: they answer as the bench's invoke).
    """

    def __init__(self, *names: str) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.scripted: defaultdict[str, deque[ToolResult]] = defaultdict(deque)
        self.registry = ToolRegistry()
        for name in (*STANDIN_NAMES, *names):
            self.registry.register(_Tool(name, self))

    def respond(self, tool: str, *results: ToolResult) -> None:
        """The next answers of ``tool``, in order (then its own again)."""
        self.scripted[tool].extend(results)

    def called(self) -> list[str]:
        """The tools called, in order."""
        return [name for name, _ in self.calls]


def _serve() -> None:
    """The stand-ins as a stdio MCP server (a discord-mcp to front)."""
    import anyio
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("discord-standin")
    fail = os.environ.get("STANDIN_FAIL", "")
    failing, _, rest = fail.partition(":")
    code, _, message = rest.partition(":")

    def wire(result: ToolResult) -> CallToolResult:
        blocks = [TextContent(type="text", text=b["text"]) for b in result.content]
        return CallToolResult(content=blocks, structured_content=result.structured, is_error=result.is_error)

    def make(name: str) -> None:
        async def tool(args: dict[str, Any] | None = None, **kwargs: Any) -> CallToolResult:
            given = {**(args or {}), **kwargs}
            if name == failing:
                return wire(err(code, message))
            return wire(answer(name, given))

        tool.__name__ = name
        server.add_tool(_loose(tool, name), name=name, description=f"Stand-in of discord-mcp's `{name}`.")

    for name in STANDIN_NAMES:
        make(name)

    def own_pipeline(steps: list[Any]) -> CallToolResult:
        """The server's own mcp_pipeline: mcpipe fronting this server must never call it."""
        return wire(ToolResult.text("the downstream's own mcp_pipeline ran"))

    server.add_tool(own_pipeline, name="mcp_pipeline", description="The stand-in server's own pipeline.")
    anyio.run(server.run_stdio_async)


def _loose(fn: Any, tool_name: str) -> Any:
    """A tool function taking the stand-ins' arguments (the SDK derives a schema from the signature)."""

    async def tool(
        channel_id: str | None = None,
        content: str | None = None,
        guild_id: str | None = None,
        name: str | None = None,
        description: str | None = None,
        scheduled_start_time: str | None = None,
        scheduled_end_time: str | None = None,
        entity_type: int | None = None,
        privacy_level: int | None = None,
        entity_metadata: dict[str, Any] | None = None,
        user_id: str | None = None,
        role_id: str | None = None,
        message_id: str | None = None,
    ) -> CallToolResult:
        given = {k: v for k, v in locals().items() if v is not None}
        result: CallToolResult = await fn(given)
        return result

    tool.__name__ = tool_name
    return tool


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _serve()
