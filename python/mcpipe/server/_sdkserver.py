"""The SDK's low-level ``Server`` over mcpipe's :class:`~mcpipe.server._core.ToolHandlers`.

Apart from the handlers so that building them imports no SDK module: ``mcpipe serve`` binds and answers (the
handlers serve its early requests, ``server/_early.py``) while a thread imports the SDK, and builds this server
once it has (:attr:`mcpipe.server._app.App.server`).
"""

from __future__ import annotations

from typing import Any

from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions

from mcpipe.server._context import RequestContext
from mcpipe.server._core import _MODERN, ToolHandlers, input_schema

__all__ = ["build_server"]


def build_server(
    handlers: ToolHandlers,
    *,
    name: str = "mcpipe",
    version: str = "",
    instructions: str | None = None,
) -> Server[Any]:
    """A low-level SDK ``Server`` serving the handlers' tools (and nothing else).

    The SDK's default OpenTelemetry middleware is left out: it costs a span per message and is a no-op
    without an exporter; add it back to ``server.middleware`` if you export traces.
    """
    # The handlers answer wire dicts, which the SDK accepts as results (``HandlerResult``); its
    # constructor's annotations name only the models.
    server: Server[Any] = _Server(
        name,
        version=version,
        instructions=instructions,
        on_list_tools=handlers.list_tools,  # type: ignore[arg-type]
        on_call_tool=handlers.call_tool,  # type: ignore[arg-type]
        get_tool_input_schema=lambda tool: input_schema(handlers, tool),
    )
    server.middleware.clear()
    caching = handlers.caching
    if caching is not None and getattr(caching, "every_era", False):
        server.middleware.append(_CacheHintsEveryEra(caching))
    if handlers.apps is not None:  # MCP Apps: the extension advertised in both eras' capabilities
        from mcpipe.server._apps import EXTENSION_ID

        server.extensions[EXTENSION_ID] = handlers.apps.capability()
    if handlers.tasks is not None:
        handlers.tasks.install(server)
    if handlers.passthrough is not None:
        handlers.passthrough.register(server)
    return server


_LIST_METHODS = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list"})


class _CacheHintsEveryEra:
    """The config's cache hints on list and read results of the protocol versions before 2026-07-28 too
    (``caching.every_era``): the SDK's result surface of those versions has no such fields and leaves them
    out, so they are put back once the result is shaped for the wire."""

    def __init__(self, caching: Any) -> None:
        self.caching = caching

    async def __call__(self, ctx: RequestContext, call_next: Any) -> Any:
        result = await call_next(ctx)
        if ctx.protocol_version in _MODERN or not isinstance(result, dict):
            return result
        if ctx.method in _LIST_METHODS:
            ttl = self.caching.list_ttl_ms
        elif ctx.method == "resources/read":
            ttl = self.caching.read_ttl_ms
        else:
            return result
        result.setdefault("ttlMs", ttl)
        result.setdefault("cacheScope", self.caching.scope)
        return result


class _Server(Server[Any]):
    """The SDK server, declaring at 2025-11-25 that its lists change (downstream servers come, go and change
    theirs, and mcpipe tells its clients)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        changes = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
        return super().create_initialization_options(
            notification_options or changes, experimental_capabilities, extensions
        )
