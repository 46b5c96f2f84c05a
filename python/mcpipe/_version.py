"""The installed distribution's version (``mcpipe --version`` prints it; ``mcpipe.__version__``).

Kept in the core so the server and the command line read it without importing the package's public face
(which imports them). Read on first use (module ``__getattr__``): ``importlib.metadata`` costs a command
tens of milliseconds it rarely needs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

__all__ = ["__version__"]

if TYPE_CHECKING:
    __version__: str


@functools.cache
def _read() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcpipe")
    except PackageNotFoundError:  # a source checkout on sys.path, not installed
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _read()
    raise AttributeError(f"module 'mcpipe._version' has no attribute {name!r}")
