"""Answers while the SDK loads: what ``mcpipe serve`` serves in its first second, before the MCP SDK is imported.

``mcpipe serve`` binds and answers at once, and imports the SDK in a thread (``server/_http.py``,
``_serve_sdk``): the SDK's types alone cost more CPU than the rest of a server's start-up. Until the SDK server
is up, :class:`EarlyAnswers` answers the 2026-07-28 requests a client makes first, built with orjson from the
same handlers the SDK calls (no SDK module is imported here):

- ``tools/list``: the caller's tools, with the result fields the SDK path gives them;
- ``tools/call`` of a synchronous Python tool (the built-ins): the handlers' call, answered as ``_fast`` does.

Everything else waits until the SDK server is ready and is then served as ever (never an error for waiting):
other methods, 2025-11-25 sessions, a request this module does not fully understand (an envelope or header the
SDK's ladder would reject, a progress token or log level, ``Mcp-Param-*`` headers, a tool that may yield or ask,
a body the SDK would refuse). So an early answer is one the SDK path would give too; ``tests/server/
test_early.py`` checks each against the SDK's.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from mcpipe import _mcp
from mcpipe._core import json_measure
from mcpipe._json import dumps
from mcpipe.server._core import IDENTITY_SCOPE_KEY, PRINCIPAL_SCOPE_KEY, ToolHandlers, scope_request
from mcpipe.tools import FunctionTool, ToolContext

__all__ = ["EarlyAnswers", "HostCheck", "accepts", "allowed", "call_context", "replaying"]

_MODERN = frozenset(_mcp.MODERN_PROTOCOL_VERSIONS)
_METHODS = frozenset({"tools/list", "tools/call"})
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SDK_MAX_DEPTH = 201
_PARAMS = frozenset({"name", "arguments", "_meta"})
_ERROR = "mcpipe.error"
# orjson reads integers of 2^64 and more as floats, where the SDK's parser keeps them (as ``_fast`` says).
_LONG_NUMBER = re.compile(rb"[0-9]{20}")


@dataclass(frozen=True)
class HostCheck:
    """DNS-rebinding protection as the SDK's ``TransportSecuritySettings`` and ``TransportSecurityMiddleware``
    check it (the same fields, the same answers), without importing the SDK (its settings are a pydantic model):
    the HTTP front checks every route with it from the first request; the SDK's transport gets :meth:`sdk`."""

    enable_dns_rebinding_protection: bool = True
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)

    def sdk(self) -> Any:
        """The SDK's settings of this check (imports the SDK's transport security)."""
        from mcp.server.transport_security import TransportSecuritySettings

        return TransportSecuritySettings(
            enable_dns_rebinding_protection=self.enable_dns_rebinding_protection,
            allowed_hosts=list(self.allowed_hosts),
            allowed_origins=list(self.allowed_origins),
        )

    def refusal(self, headers: Any, *, is_post: bool) -> tuple[int, bytes] | None:
        """(status, body) of the SDK's refusal of a request with these (ASGI) headers, or None."""
        host = origin = content_type = None
        for name, value in headers:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
        if is_post and (content_type is None or not content_type.lower().startswith("application/json")):
            return 400, b"Invalid Content-Type header"
        if not self.enable_dns_rebinding_protection:
            return None
        if not host or not allowed(host, self.allowed_hosts):
            return 421, b"Invalid Host header"
        if origin and not allowed(origin, self.allowed_origins):
            return 403, b"Invalid Origin header"
        return None


def allowed(value: str, names: list[str]) -> bool:
    """``value`` is one of ``names``, or ``NAME:PORT`` of a ``NAME:*`` among them (the SDK's matching)."""
    return value in names or any(a.endswith(":*") and value.startswith(a[:-2] + ":") for a in names)


def accepts(headers: Mapping[str, str]) -> tuple[bool, bool]:
    """(json, sse): what the Accept header takes, with the SDK's wildcard handling (``check_accept_headers``)."""
    types = [t.strip().split(";")[0].strip().lower() for t in headers.get("accept", "").split(",")]
    wildcard = "*/*" in types
    return (
        wildcard or any(t in ("application/json", "application/*") for t in types),
        wildcard or any(t in ("text/event-stream", "text/*") for t in types),
    )


class EarlyAnswers:
    """Serves the 2026-07-28 ``tools/list`` and plain ``tools/call`` requests it fully understands before the
    SDK server is up (see the module); answers False, having sent nothing, for every other request.

    Args:
        handlers: the tool handlers (the ones the SDK server will call).
        security: the front's host check.
        server_info: the ``serverInfo`` stamp of 2026-07-28 results (the SDK server's: name and version).
        json_response: answer JSON only, as the SDK's ``json_response``.
        max_body: the body limit (a larger body waits for the SDK, which refuses it).
    """

    def __init__(
        self,
        handlers: ToolHandlers,
        security: HostCheck,
        server_info: Mapping[str, object],
        *,
        json_response: bool = False,
        max_body: int = 4 * 1024 * 1024,
    ) -> None:
        self.handlers = handlers
        self.max_body = max_body
        self.security = security
        self.meta = {_mcp.SERVER_INFO_META_KEY: dict(server_info)}
        self.json_response = json_response

    async def __call__(self, scope: Mapping[str, Any], body: bytes, send: Any) -> bool:
        """Answer the POST of ``body`` if it is one this path serves."""
        msg = self._understood(scope, body)
        if msg is None:
            return False
        status = 200
        if msg["method"] == "tools/list":
            out = await self._list(scope)
        elif self._plain(msg["params"]["name"]):
            out = await self._call(scope, msg)
        else:
            return False
        error = out.get(_ERROR)
        if error is not None:
            from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS  # a refused call: the SDK is loaded by now

            wire = error.error.model_dump(by_alias=True, mode="json", exclude_none=True)
            payload = orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": wire})
            status = ERROR_CODE_HTTP_STATUS.get(error.code, 200)
        else:
            out["_meta"] = self.meta
            payload = dumps({"jsonrpc": "2.0", "id": msg["id"], "result": out})
        headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        return True

    def _understood(self, scope: Mapping[str, Any], body: bytes) -> dict[str, Any] | None:
        """The request, when every check the SDK would make passes and it is one of ours; else None."""
        if scope.get("method") != "POST" or self.security.refusal(scope["headers"], is_post=True) is not None:
            return None
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            key = k.decode("latin-1")
            if key.startswith("mcp-param-") or key in headers:
                return None
            headers[key] = v.decode("latin-1")
        version = headers.get("mcp-protocol-version")
        has_json, has_sse = accepts(headers)
        if version not in _MODERN or not has_json or not (self.json_response or has_sse):
            return None
        if _LONG_NUMBER.search(body) is not None or len(body) > self.max_body:
            return None
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or msg.get("method") not in _METHODS:
            return None
        if json_measure(msg, max_depth=_SDK_MAX_DEPTH)[1] > _SDK_MAX_DEPTH or not msg.keys() <= {
            "jsonrpc",
            "id",
            "method",
            "params",
        }:
            return None
        rid = msg.get("id")
        params = msg.get("params")
        if isinstance(rid, bool) or not isinstance(rid, int | str) or not isinstance(params, dict):
            return None
        meta = params.get("_meta")
        if (
            not isinstance(meta, dict)
            or meta.get(_mcp.PROTOCOL_VERSION_META_KEY) != version
            or not isinstance(meta.get(_mcp.CLIENT_CAPABILITIES_META_KEY), dict)
            or headers.get("mcp-method") != msg["method"]
            or "progressToken" in meta
            or _mcp.LOG_LEVEL_META_KEY in meta
        ):
            return None
        if msg["method"] == "tools/list":
            return msg if params.keys() <= {"_meta"} and "mcp-name" not in headers else None
        name, args = params.get("name"), params.get("arguments", {})
        if not params.keys() <= _PARAMS or not isinstance(name, str) or not isinstance(args, dict):
            return None
        if headers.get(_mcp.MCP_NAME_HEADER) != name or not name.isascii() or not name.isprintable():
            return None
        return msg

    async def _list(self, scope: Mapping[str, Any]) -> dict[str, Any]:
        handlers = self.handlers
        await handlers.gateway.ready()
        principal = scope.get(PRINCIPAL_SCOPE_KEY, handlers.default_principal)
        return handlers.tools_result(principal, scope.get(IDENTITY_SCOPE_KEY), modern=True)

    def _plain(self, name: str) -> bool:
        """Whether a call of ``name`` is one this path serves: a synchronous Python tool (which cannot yield, ask
        or take long), whose schema declares no ``x-mcp-header`` and which is no task."""
        handlers = self.handlers
        tool = handlers.gateway.get(name)
        if not isinstance(tool, FunctionTool) or inspect.iscoroutinefunction(tool.fn):
            return False
        if b"x-mcp-header" in orjson.dumps(tool.input_schema):
            return False
        return handlers.tasks is None or handlers.tasks.support(name) is None

    async def _call(self, scope: Mapping[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
        """The call, as ``_fast`` makes it; a protocol error comes back as ``{_ERROR: exc}``."""
        handlers = self.handlers
        params = msg["params"]
        name, args, meta = params["name"], params.get("arguments", {}), params["_meta"]
        ctx = call_context(handlers, scope, msg["id"], meta)
        capabilities = meta.get(_mcp.CLIENT_CAPABILITIES_META_KEY)
        try:
            out = await handlers.interactions.call(
                handlers.call, name, args, ctx, modern=True, capabilities=capabilities
            )
        except _mcp.MCPError as exc:  # evaluated only when a call raised: the SDK is loaded then
            return {_ERROR: exc}
        out.setdefault("resultType", "complete")
        return out


def call_context(handlers: ToolHandlers, scope: Mapping[str, Any], rid: object, meta: Mapping[str, Any]) -> ToolContext:
    """The tool context of a 2026-07-28 ``tools/call`` answered on the front (here, and by ``_fast``): the
    client its ``_meta`` names, the principal the front put in ``scope``, the request's facts."""
    info = meta.get(_mcp.CLIENT_INFO_META_KEY)
    return ToolContext(
        request_id=str(rid),
        client={"name": info.get("name"), "version": info.get("version")} if isinstance(info, dict) else {},
        principal=scope.get(PRINCIPAL_SCOPE_KEY, handlers.default_principal),
        request=scope_request(scope),
        tools=handlers.gateway,
        traceparent=meta.get("traceparent"),
    )


def replaying(body: bytes, more: bool, receive: Any) -> Any:
    """A ``receive`` that first answers ``body`` (one message, ``more_body`` as given), then ``receive``."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay
