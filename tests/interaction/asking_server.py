"""A downstream MCP server whose tools ask the client, for the relay tests; run as its own process.

    python asking_server.py            # stdio
    python asking_server.py --http 0   # streamable HTTP on 127.0.0.1; prints the URL on stdout

It is written with the SDK's resolvers, so it asks the way the SDK does in each era: mid-call requests
over the session on 2025-11-25, an input-required result on 2026-07-28. Its tools:

- ``delete(item)``: asks the user to confirm (elicitation); answers what it did;
- ``summarize(text)``: asks the client's model (sampling); answers the reply;
- ``where()``: asks for the client's roots;
- ``both(item)``: asks for confirmation and for the roots in one round;
- ``twice(item)``: asks for confirmation, then (a second round) for the roots;
- the prompt ``topic``: asks (2026-07-28: an input-required result) which topic to write about;
- ``tally()``: counts its calls (a side effect a resumed pipeline must not repeat);
- ``caps()``: the client capabilities it was told (by name);
- ``name()``: a hand-written 2026-07-28 tool: takes the ``user_name`` answer when the request carries one (with
  or without a state), else answers an input-required result asking for it;
- ``old_style(item)``: asks to confirm the 2025-11-25 way only (a request in the middle of the call, which a
  2026-07-28 connection cannot carry).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import anyio
import trio
from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp_types import (
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    ListRootsResult,
    SamplingMessage,
    TextContent,
)
from pydantic import BaseModel

server = MCPServer("asking")
TALLY = [0]


class Confirm(BaseModel):
    ok: bool


def ask_confirm(item: str) -> Elicit[Confirm]:
    return Elicit(f"Delete {item}?", Confirm)


def ask_summary(text: str) -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {text}"))], max_tokens=20
    )


def ask_roots() -> ListRoots:
    return ListRoots()


def _verdict(item: str, answer: ElicitationResult[Confirm]) -> str:
    if isinstance(answer, AcceptedElicitation) and answer.data.ok:
        return f"deleted {item}"
    return f"kept {item} ({answer.action})"


def _uris(found: ListRootsResult) -> str:
    return ",".join(str(r.uri) for r in found.roots)


@server.tool()
async def delete(item: str, answer: Annotated[ElicitationResult[Confirm], Resolve(ask_confirm)]) -> str:
    """Delete an item once the user confirms."""
    return _verdict(item, answer)


@server.tool()
async def summarize(text: str, reply: Annotated[CreateMessageResult, Resolve(ask_summary)]) -> str:
    """Summarize a text with the client's model."""
    content = reply.content
    return f"summary: {content.text if isinstance(content, TextContent) else content}"


@server.tool()
async def where(found: Annotated[ListRootsResult, Resolve(ask_roots)]) -> str:
    """The client's roots."""
    return f"roots: {_uris(found)}"


@server.tool()
async def both(
    item: str,
    answer: Annotated[ElicitationResult[Confirm], Resolve(ask_confirm)],
    found: Annotated[ListRootsResult, Resolve(ask_roots)],
) -> str:
    """Ask two questions in one round."""
    return f"{_verdict(item, answer)} in {_uris(found)}"


def roots_after_confirm(answer: Annotated[ElicitationResult[Confirm], Resolve(ask_confirm)]) -> ListRoots:
    return ListRoots()


@server.tool()
async def twice(
    item: str,
    answer: Annotated[ElicitationResult[Confirm], Resolve(ask_confirm)],
    found: Annotated[ListRootsResult, Resolve(roots_after_confirm)],
) -> str:
    """Ask for confirmation, then (a second round, it depends on the first) for the roots."""
    return f"{_verdict(item, answer)} in {_uris(found)}"


@server.tool()
async def old_style(item: str, ctx: Context) -> str:
    """Delete an item once the user confirms, asked in the middle of the call."""
    return _verdict(item, await ctx.elicit(f"Delete {item}?", Confirm))


@server.tool()
def caps(ctx: Context) -> str:
    """The capabilities the client declared, by name."""
    declared = ctx.client_capabilities
    names = [n for n in ("elicitation", "roots", "sampling") if getattr(declared, n, None) is not None]
    return ",".join(names) or "none"


@server.tool()
async def name(ctx: Context) -> str | InputRequiredResult:
    """Greet the user by the name they give."""
    answer = (ctx.input_responses or {}).get("user_name")
    if isinstance(answer, ElicitResult) and answer.content:
        return f"hello {answer.content['name']}"
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    ask = ElicitRequest(params=ElicitRequestFormParams(message="Your name?", requested_schema=schema))
    return InputRequiredResult(input_requests={"user_name": ask}, request_state="asked")


@server.prompt()
async def topic(ctx: Context) -> list[UserMessage] | InputRequiredResult:
    """A prompt about the topic the user names."""
    answer = (ctx.input_responses or {}).get("topic")
    if isinstance(answer, ElicitResult) and answer.content:
        return [
            UserMessage(
                role="user",
                content=TextContent(type="text", text=f"Write about {answer.content.get('name', 'anything')}"),
            )
        ]
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    ask = ElicitRequest(params=ElicitRequestFormParams(message="Which topic?", requested_schema=schema))
    return InputRequiredResult(input_requests={"topic": ask})


@server.tool()
def tally() -> int:
    """Count this tool's calls."""
    TALLY[0] += 1
    return TALLY[0]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `kit`: this runs as a script
        from kit.mcp_script import serve_http

        trio.run(serve_http, server.streamable_http_app(), int(sys.argv[2]))
    else:
        anyio.run(server.run_stdio_async, backend="trio")
