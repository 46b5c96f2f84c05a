"""mcp_pipe on your own SDK server, in one line: ``attach(app)``.

    python examples/attach_weather.py            # serves over stdio
    python examples/attach_weather.py --http     # serves streamable HTTP on http://127.0.0.1:8000/mcp

Then one call runs a pipeline of this server's own tools:

    {"steps": [
       {"id": "f", "tool": "forecast", "args": {"city": "Lyon"}},
       {"id": "s", "tool": "shout", "args": {"text": "${steps.f.structured.city}: ${steps.f.structured.high}C"}}],
     "return": "{{s.result}}"}
    ->  "LYON: 21C"

It runs on either event loop: ``app.run()`` serves stdio on asyncio (the SDK's default), ``--http`` serves on
Trio; ``mcp_pipe``'s steps run in parallel and are cancelled the same way on both.
"""

from __future__ import annotations

import sys

import anyio
from mcp.server.mcpserver import MCPServer

from mcpipe.server import attach

app = MCPServer("weather")

HIGHS = {"Lyon": 21, "Oslo": 9, "Lima": 24}
ALERTS = {"Oslo": ["snow"]}


@app.tool()
def forecast(city: str) -> dict[str, str | int]:
    """Tomorrow's high temperature for a city, in degrees Celsius."""
    return {"city": city, "high": HIGHS.get(city, 15)}


@app.tool()
async def alerts(city: str, wait_s: float = 0) -> list[str]:
    """Weather alerts for a city; with wait_s, waits up to that many seconds for a new one (long polling)."""
    if wait_s > 0:
        await anyio.sleep(wait_s)  # no new alert comes in this example: the wait runs out (or is cancelled)
    return ALERTS.get(city, [])


@app.tool()
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


attach(app)  # tools/list now shows mcp_pipe beside forecast and shout


async def _serve_http() -> None:
    from functools import partial

    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = ["127.0.0.1:8000"]
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, app.streamable_http_app(), config))


if __name__ == "__main__":
    if "--http" in sys.argv:
        import trio

        trio.run(_serve_http)
    else:
        app.run()
