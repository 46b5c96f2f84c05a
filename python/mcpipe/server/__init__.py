"""Serving mcpipe over MCP: the SDK server, HTTP (hypercorn's trio worker) and stdio, and ``attach``."""

from mcpipe.server._app import App, open_app
from mcpipe.server._attach import attach
from mcpipe.server._core import PipeRunner, ToolHandlers, build_server
from mcpipe.server._http import serve_http
from mcpipe.server._stdio import serve_stdio

__all__ = ["App", "PipeRunner", "ToolHandlers", "attach", "build_server", "open_app", "serve_http", "serve_stdio"]
