"""A downstream MCP server for the gateway tests, run as its own process.

    python downstream_server.py            # stdio
    python downstream_server.py --http 0   # streamable HTTP on 127.0.0.1; prints the URL on stdout

Its tools: ``add``, ``greet`` (reads an env var, to check ``env`` reaches it), ``progress`` (reports
progress), ``wait`` (runs until cancelled and records when it was), ``events`` (what ``wait`` recorded),
``crash`` (the process exits mid-call), ``secret`` (excluded by the tests' config), ``refuse`` (answers a
JSON-RPC error), ``chatter`` (logs at four levels, meeting the other calls in flight halfway), and ``extra``
when the file named by ``DOWNSTREAM_EXTRA`` exists (so a restart can bring another list).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
import trio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

server = MCPServer("downstream")
EVENTS: list[dict[str, float | str]] = []


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def greet(name: str) -> str:
    """Greet someone, in the greeting of the GREETING environment variable."""
    return f"{os.environ.get('GREETING', 'hello')}, {name}"


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Report `steps` progress notifications, then answer."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"tick {i}")
    return f"{steps} ticks"


@server.tool()
async def wait(tag: str, ctx: Context) -> str:
    """Say it started (a progress notification), run until cancelled, record when (time.monotonic is
    system-wide on Linux, so the test process can compare)."""
    EVENTS.append({"event": "started", "tag": tag, "t": time.monotonic()})
    await ctx.report_progress(0, None, "waiting")
    try:
        await anyio.sleep(60)
    except anyio.get_cancelled_exc_class():
        EVENTS.append({"event": "cancelled", "tag": tag, "t": time.monotonic()})
        raise
    return "waited"


@server.tool()
def events() -> list[dict[str, float | str]]:
    """What `wait` recorded."""
    return EVENTS


@server.tool()
def crash() -> str:
    """Exit the process in the middle of the call."""
    os._exit(3)


@server.tool()
def refuse() -> str:
    """Answer a JSON-RPC error (not an isError result)."""
    raise MCPError(-32042, "refused on purpose", {"why": "a test"})


_MET: dict[str, anyio.Event] = {}
_IN: list[str] = []


@server.tool()
async def chatter(tag: str, ctx: Context, together: int = 1) -> str:
    """Log `<tag> <level>` at debug and info, wait until `together` chatter calls are in flight (a
    rendezvous, so concurrent calls overlap for sure), then log at warning and error."""
    for level in ("debug", "info"):
        await ctx.log(level, f"{tag} {level}", logger_name="chatter")  # pyright: ignore[reportDeprecated]
    _IN.append(tag)
    met = _MET.setdefault(str(together), anyio.Event())
    if len(_IN) >= together:
        met.set()
    await met.wait()
    for level in ("warning", "error"):
        await ctx.log(level, f"{tag} {level}", logger_name="chatter")  # pyright: ignore[reportDeprecated]
    _IN.remove(tag)
    if not _IN:
        _MET.pop(str(together), None)
    return tag


@server.tool()
def secret() -> str:
    """A tool the gateway is configured not to serve."""
    return "should not be reachable"


if os.path.exists(os.environ.get("DOWNSTREAM_EXTRA", "/nonexistent")):

    @server.tool()
    def extra() -> str:
        """A tool served only when the file named by DOWNSTREAM_EXTRA exists (a server whose list changed)."""
        return "extra"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `kit`: this runs as a script
        from kit.mcp_script import serve_http

        trio.run(serve_http, server.streamable_http_app(), int(sys.argv[2]))
    else:
        anyio.run(server.run_stdio_async, backend="trio")
