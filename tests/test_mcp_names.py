"""``mcpipe._mcp`` copies the SDK's constants so that the server's modules load without the SDK: each copy is the
SDK's value, and ``MCPError`` is the SDK's class."""

from __future__ import annotations

import pytest

from mcpipe import _mcp


@pytest.mark.parametrize("name", [n for n in _mcp.__all__ if n.isupper()])
def test_each_copied_constant_is_the_sdks_own(name: str) -> None:
    import mcp_types
    import mcp_types.version
    from mcp.server import streamable_http
    from mcp.shared import inbound

    homes = (mcp_types, mcp_types.version, streamable_http, inbound)
    values = [getattr(home, name) for home in homes if hasattr(home, name)]
    assert values, f"{name} is not one of the SDK's names"
    assert all(value == getattr(_mcp, name) for value in values)


def test_mcperror_is_the_sdks_class_read_on_first_use() -> None:
    from mcp.shared.exceptions import MCPError

    assert _mcp.MCPError is MCPError
