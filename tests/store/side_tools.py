"""Tools for the server processes of the shared-store tests: ``charge`` records every call in the file
``$MCPIPE_TEST_CHARGES`` names, so a test can count side effects across processes."""

from __future__ import annotations

import os

from mcpipe.tools import ToolRegistry

tools = ToolRegistry()


@tools.tool
def charge(amount: int) -> dict[str, int]:
    """Charge an amount (a side effect: one line per call)."""
    with open(os.environ["MCPIPE_TEST_CHARGES"], "a") as f:
        f.write(f"{amount}\n")
    return {"charged": amount}
