"""Serving mcpipe over MCP: the SDK server, HTTP (hypercorn's trio worker) and stdio, and ``attach``."""

from mcpipe.server._app import App, open_app
from mcpipe.server._core import PipeRunner, ToolHandlers, build_server

__all__ = ["App", "PipeRunner", "ToolHandlers", "build_server", "open_app"]
