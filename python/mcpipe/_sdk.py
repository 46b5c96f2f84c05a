"""The MCP SDK's packages entered without running their ``__init__`` until one of their own names is read.

A package's ``__init__`` runs whatever submodule is asked for: ``import mcp.server.lowlevel`` runs
``mcp/__init__.py`` (which imports the SDK's client, its stdio transports and, through the client's in-memory
transport, the high-level ``MCPServer`` with its resources and prompts) and ``mcp/server/__init__.py`` (the
same ``MCPServer``). A server built on the low-level ``Server`` needs none of that: about a fifth of the SDK's
import time. :func:`defer_sdk_packages` puts those packages in ``sys.modules`` as they would be found (their
``__path__``, ``__spec__``, ``__file__``), so their submodules import as before, and a module ``__getattr__``
that runs the real ``__init__`` in place the first time a name the package does not hold yet is read:
``from mcp import Client``, ``mcp.ClientSession``, ``from mcp.server import MCPServer`` all work as ever, each
paying for the package's ``__init__`` then. Reading a submodule by name (``from mcp import types``) imports
that submodule only, as the ``__init__`` would have bound it.

``mcpipe/__init__.py`` calls it, so it holds in any process that imports mcpipe before the SDK; a process
that imported the SDK first keeps it as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType

__all__ = ["DEFERRED", "defer_sdk_packages", "still_deferred"]

DEFERRED = ("mcp", "mcp.server", "mcp.client", "mcp_types")
"""The packages whose ``__init__`` waits for the first read of one of its names, parents first. ``mcp_types``'
``__init__`` imports every model of both protocol eras: with it deferred, ``import mcp_types as types`` costs
nothing until a model is read (``types.CallToolResult``), and ``mcp_types.version`` imports alone."""


def defer_sdk_packages() -> None:
    """Enter each package of :data:`DEFERRED` not imported yet, its ``__init__`` deferred (see the module)."""
    for name in DEFERRED:
        if name in sys.modules:
            continue
        parent, _, child = name.rpartition(".")
        if parent and parent not in sys.modules:
            return  # its parent was imported, and failed: leave the SDK to the ordinary import
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return  # no SDK installed (or not as a package): the ordinary import says so when it is asked for
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__getattr__"] = _Deferred(module)
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], child, module)


def still_deferred(module: ModuleType) -> bool:
    """Whether ``module`` is a package of :data:`DEFERRED` whose ``__init__`` has not run yet."""
    return isinstance(module.__dict__.get("__getattr__"), _Deferred)


class _Deferred:
    """The module ``__getattr__`` of a deferred package: a submodule's name imports that submodule; any other
    name runs the package's ``__init__`` (once, in the module itself, its hook removed first so that a name
    it reads before defining it fails as in any import) and is then read from it."""

    _lock = threading.RLock()

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.ran = False

    def __call__(self, attr: str) -> object:
        module = self.module
        if not attr.startswith("__") and importlib.util.find_spec(f"{module.__name__}.{attr}") is not None:
            return importlib.import_module(f"{module.__name__}.{attr}")
        with self._lock:
            if not self.ran:
                self._run_init()
        return getattr(module, attr)

    def _run_init(self) -> None:
        module, spec = self.module, self.module.__spec__
        assert spec is not None and spec.loader is not None
        del module.__dict__["__getattr__"]
        try:
            spec.loader.exec_module(module)
        except BaseException:
            module.__dict__.setdefault("__getattr__", self)  # the next read tries again
            raise
        self.ran = True
