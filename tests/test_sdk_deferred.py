"""The MCP SDK's package ``__init__`` files run on the first read of one of their names (``mcpipe._sdk``).

Each case runs in a fresh interpreter: which packages are deferred is a property of the process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> None:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_submodule_imports_without_running_the_packages_init():
    run(
        """
        import sys, mcpipe
        from mcpipe._sdk import still_deferred
        import mcp.server.lowlevel.server
        from mcp.shared.exceptions import MCPError
        assert still_deferred(sys.modules["mcp"]) and still_deferred(sys.modules["mcp.server"])
        assert "mcp.client.client" not in sys.modules and "mcp.server.mcpserver" not in sys.modules
        """
    )


def test_a_name_of_the_package_runs_its_init_and_is_the_same_object():
    run(
        """
        import sys, mcpipe
        from mcpipe._sdk import still_deferred
        from mcp import Client, MCPError
        from mcp.client.client import Client as client_class
        from mcp.shared.exceptions import MCPError as error_class
        assert Client is client_class and MCPError is error_class
        assert not still_deferred(sys.modules["mcp"])
        from mcp.server import MCPServer, Server
        from mcp.server.lowlevel.server import Server as low
        assert Server is low and not still_deferred(sys.modules["mcp.server"])
        import mcp
        assert mcp.ClientSession.__name__ == "ClientSession" and "Client" in mcp.__all__
        """
    )


def test_a_submodule_read_by_name_is_that_submodule():
    run(
        """
        import sys, mcpipe
        from mcpipe._sdk import still_deferred
        from mcp import types
        import mcp
        assert types is sys.modules["mcp.types"] and mcp.types is types and mcp.server is sys.modules["mcp.server"]
        assert still_deferred(sys.modules["mcp"])
        """
    )


def test_a_star_import_gives_the_packages_public_names():
    run(
        """
        import mcpipe
        from mcp import *
        assert Client.__name__ == "Client" and ClientSession.__name__ == "ClientSession"
        """
    )


def test_an_unknown_name_is_an_attribute_error_after_the_init_ran():
    run(
        """
        import sys, mcpipe
        from mcpipe._sdk import still_deferred
        import mcp
        try:
            mcp.no_such_name
        except AttributeError:
            pass
        else:
            raise AssertionError("no AttributeError")
        assert not still_deferred(sys.modules["mcp"])
        """
    )


def test_an_sdk_imported_before_mcpipe_is_left_as_it_is():
    run(
        """
        import sys
        import mcp
        import mcpipe
        from mcpipe._sdk import still_deferred
        assert not still_deferred(sys.modules["mcp"]) and "mcp.client.client" in sys.modules
        """
    )
