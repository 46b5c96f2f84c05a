"""The compiled template type, from the Rust core (one import site for the Python modules)."""

from mcpipe._core import Template

__all__ = ["Template"]
