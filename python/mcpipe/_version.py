"""The installed distribution's version (``mcpipe --version`` prints it; ``mcpipe.__version__``).

Kept in the core so the server and the command line read it without importing the package's public face
(which imports them).
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__: str = version("mcpipe")
except PackageNotFoundError:  # a source checkout on sys.path, not installed
    __version__ = "0+unknown"
