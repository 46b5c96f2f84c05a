"""Downstream MCP servers: connecting to them (stdio, Streamable HTTP), their tools served through the
gateway, what they offer beyond tools (resources, prompts, completions, logs: the catalog), and mcpipe
as their OAuth client (``_oauth``).

Gateway layer: it builds on the gateway's call path (``CallError``), the config's ``McpServerConfig``,
``access``'s credentials and ``interaction``'s relaying of the client's answers.

Beyond tools
------------

(`python/mcpipe/downstream/_catalog.py`, `python/mcpipe/server/_passthrough.py`). Each actor also keeps its
server's resources, templates and prompts (a `Catalog`, listed at connect and again on a change) and a `Feed` for
what the server sends outside answers: log messages go to the one call in flight, list changes and resource
updates go through a channel to a task of the session (a notification handler runs in the session's reader and
must not wait on the session), which lists again and hands the change to the `Passthrough`. On a 2026-07-28
server that task also keeps a `subscriptions/listen` stream open, reopened when the set of subscribed URIs
changes. The `Passthrough` registers the SDK handlers for resources, prompts, completion, subscriptions,
`subscriptions/listen` (the SDK's `ListenHandler` over an in-memory bus) and `logging/setLevel`, routes each
request to the server that listed the URI or prompt, and fans changes out: to 2025-11-25 sessions as
notifications, to 2026-07-28 listen streams through the bus. A downstream's JSON-RPC error travels as a
`DownstreamError` (a `CallError` keeping code, message and data), which a direct call re-raises as the same JSON-
RPC error and a pipeline step reports as its failure.

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
