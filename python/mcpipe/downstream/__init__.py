"""Downstream MCP servers: connecting to them (stdio, Streamable HTTP), their tools served through the
gateway, what they offer beyond tools (resources, prompts, completions, logs: the catalog), and mcpipe
as their OAuth client (``_oauth``).

Gateway layer: it builds on the gateway's call path (``CallError``), the config's ``McpServerConfig``,
``access``'s credentials and ``interaction``'s relaying of the client's answers.
"""

from mcpipe.downstream._catalog import Catalog, Change, DownstreamError, Feed, feed_of, list_changes
from mcpipe.downstream._lines import LineChunks
from mcpipe.downstream._oauth import OPERATOR, OAuthClients, ServerAuth, SignInError, SignInRequired
from mcpipe.downstream._polling import StreamWatch
from mcpipe.downstream._server import Downstreams, DownstreamServer, DownstreamTool

__all__ = [
    "OPERATOR",
    "Catalog",
    "Change",
    "DownstreamError",
    "DownstreamServer",
    "DownstreamTool",
    "Downstreams",
    "Feed",
    "LineChunks",
    "OAuthClients",
    "ServerAuth",
    "SignInError",
    "SignInRequired",
    "StreamWatch",
    "feed_of",
    "list_changes",
]
