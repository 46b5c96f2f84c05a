"""A second downstream MCP server for the gateway example: the price list.

python examples/gateway/pricing.py     # stdio (as examples/gateway/mcpipe.yaml starts it)
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("pricing")

PRICES = {"SKU-1": 24.5, "SKU-2": 31.0}


@server.tool()
def price(sku: str, quantity: int = 1) -> dict[str, str | float]:
    """The price of ``quantity`` of an item, in euros."""
    return {"sku": sku, "total_eur": round(PRICES.get(sku, 0.0) * quantity, 2)}


if __name__ == "__main__":
    server.run()
