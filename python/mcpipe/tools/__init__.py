"""Tools: what pipelines call: Python functions and declared backends (downstream servers: ``mcpipe.downstream``).

The typed request context
-------------------------

`ToolContext` carries what a call knows, typed: `request_id`, `client`, `principal`, `pipeline`, `step`, the
`progress`/`log` sinks, `progress_token` and `wants_progress` (`has_progress` reads them, and the SDK request's
`meta`), `era` (the protocol era), `interaction` (asking the client), `sdk_context` (the SDK's request context),
and `tools`: the registry this call's pipelines call tools through (the gateway; the scheduler sets it for a run,
so a declared pipeline needs no binding). `extras` is left to tools and their hosts; mcpipe keeps nothing there.
What the HTTP front found about the request is on its `Request`, shared by every call the request makes:
`identity` (an `Identity`: subject, trust, provider, issuer, roles, groups, scopes, attributes, claims, and the
bearer a token exchange sends on; pipelines see it, without the token, as `context.identity`) and
`client_addresses` (the caller's address as each `ip_allowlist` gate reads it). A queued run keeps both (never
the bearer) in its `meta.caller`, and its worker puts them back.

"""

from mcpipe.tools._base import PURE, Era, LogFn, ProgressFn, Request, Tool, ToolCaller, ToolContext, ToolResult
from mcpipe.tools._identity import Identity, TrustLevel
from mcpipe.tools._registry import FunctionTool, ToolRegistry, UnknownToolError

__all__ = [
    "PURE",
    "Era",
    "FunctionTool",
    "Identity",
    "LogFn",
    "ProgressFn",
    "Request",
    "Tool",
    "ToolCaller",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "TrustLevel",
    "UnknownToolError",
]
