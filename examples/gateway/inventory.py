"""A downstream MCP server for the gateway example: a warehouse's stock, by SKU.

python examples/gateway/inventory.py                 # stdio (as examples/gateway/mcpipe.yaml starts it)
python examples/gateway/inventory.py --http 0.0.0.0:9001   # streamable HTTP at /mcp (deploy/compose)
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("inventory")

STOCK = {"SKU-1": {"name": "kettle", "on_hand": 12}, "SKU-2": {"name": "teapot", "on_hand": 0}}


@server.tool()
def stock(sku: str) -> dict[str, str | int]:
    """How many of an item the warehouse holds (0 for an unknown SKU)."""
    item = STOCK.get(sku, {"name": "unknown", "on_hand": 0})
    return {"sku": sku, "name": item["name"], "on_hand": item["on_hand"]}


def serve_http(where: str) -> None:
    """Streamable HTTP at ``where`` (HOST:PORT), every Host header accepted (it sits behind mcpipe)."""
    from functools import partial

    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from mcp.server.transport_security import TransportSecuritySettings

    config = Config()
    config.bind = [where]
    config.accesslog = None
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(transport_security=security)
    trio.run(partial(serve, app, config))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(sys.argv[2])
    else:
        server.run()
