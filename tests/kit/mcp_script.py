"""What the MCP servers the tests start as scripts share (``python SERVER.py --http PORT``): serving over
streamable HTTP on 127.0.0.1 and saying where on stdout, the line the tests wait for.

A script is run by path, so ``kit`` is not on its ``sys.path``: it puts ``tests`` there first
(``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))``), as :mod:`kit.discord` does.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import trio


async def serve_http(app: Any, port: int) -> None:
    """Serve the ASGI ``app`` (an MCP server's ``streamable_http_app()``) on 127.0.0.1:``port`` (0: a free
    one) until cancelled, having printed its MCP URL (``http://127.0.0.1:PORT/mcp``) on stdout."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    cfg = Config()
    cfg.bind = [f"127.0.0.1:{port}"]
    cfg.accesslog = None
    cfg.graceful_timeout = 0.5
    async with trio.open_nursery() as n:
        binds = await n.start(partial(serve, app, cfg))
        print(binds[0] + "/mcp", flush=True)
