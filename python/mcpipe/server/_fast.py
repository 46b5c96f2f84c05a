"""The lean path for the one request that matters most: a 2026-07-28 ``tools/call`` POST.

The SDK serves it correctly but at a cost (about 2.6 ms of CPU per call on hypercorn's trio worker,
which itself costs about 1 ms): a dozen pydantic validations and dumps of the request, the params, the
envelope, the connection identity and the result, a task group and a memory stream per request. This path
runs the same checks the SDK runs for this request (the DNS-rebinding Host/Origin check, Content-Type and
Accept, the JSON-RPC shape, the SDK's own ``classify_inbound_request`` envelope and header ladder), then
calls the tool handler directly and encodes the answer once with orjson.

Anything it does not fully understand is handed to the SDK untouched (the body replayed): other methods,
a progress token or log-level opt-in (those need the SDK's notification stream), ``Mcp-Param-*`` headers or
a tool whose schema declares them, ``inputResponses``/``requestState``, a malformed or rejected request
(so the SDK writes the error, exactly as it would have). Tests check both paths answer the same.

Like the SDK's SSE mode, an answer that takes longer than :data:`PING_INTERVAL_S` switches to
``text/event-stream`` and pings so a proxy's idle timeout cannot cut it; a client that disconnects
cancels the call.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import orjson
import trio
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, InboundModernRoute, classify_inbound_request
from mcp_types import CLIENT_CAPABILITIES_META_KEY, LOG_LEVEL_META_KEY, SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from mcpipe._core import json_measure
from mcpipe._json import dumps
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server._core import PRINCIPAL_SCOPE_KEY, ToolHandlers
from mcpipe.tools import FunctionTool, ToolContext

__all__ = ["PING_INTERVAL_S", "FastToolCall"]


PING_INTERVAL_S = 15.0
"""After this long without an answer, the response becomes an SSE stream with keep-alive pings."""

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
_ROUTING = frozenset({"mcp-protocol-version", "mcp-method", "mcp-name"})
_PARAMS = frozenset({"name", "arguments", "_meta"})
_JSON_HEADERS = [(b"content-type", b"application/json")]
_ERROR = "mcpipe.error"
# orjson reads integers of 2^64 and more as floats, where the SDK's parser keeps them: a body holding a run
# of 20 digits goes to the SDK (2^64 has 20 digits; a run that long elsewhere only costs the fast path).
_LONG_NUMBER = re.compile(rb"[0-9]{20}")
_BOM = b"\xef\xbb\xbf"
# Bodies nested deeper than this go to the SDK, whose parsers stop somewhere past it (jiter at 201 levels,
# Python's json at its recursion limit), so both paths give the SDK's answer; orjson reads up to 1024.
_SDK_MAX_DEPTH = 201
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


class FastToolCall:
    """Serves 2026-07-28 ``tools/call`` POSTs directly; returns False (having consumed nothing it does not
    hand back) for every request it leaves to the SDK.

    Args:
        handlers: the tool handlers (the same ones the SDK server calls).
        security: the DNS-rebinding settings the SDK transport uses.
        server_info: the ``serverInfo`` stamp of 2026-07-28 results.
        json_response: answer JSON only (never switch to SSE), as the SDK's ``json_response``.
        max_body: the body limit (larger bodies go to the SDK, which refuses them).
    """

    def __init__(
        self,
        handlers: ToolHandlers,
        security: TransportSecuritySettings,
        server_info: dict[str, Any],
        *,
        json_response: bool = False,
        max_body: int = 4 * 1024 * 1024,
    ) -> None:
        self.handlers = handlers
        self.security = TransportSecurityMiddleware(security)
        self.meta = {SERVER_INFO_META_KEY: server_info}
        self.json_response = json_response
        self.max_body = max_body
        self._traits_cache: dict[str, tuple[object, bool, bool]] = {}

    def _traits(self, name: str) -> tuple[bool, bool]:
        """(plain, yields) of a tool: plain when its input schema declares no ``x-mcp-header`` (whose
        headers the SDK validates); yields unless it is a synchronous Python function, which runs inline
        without a checkpoint, so that neither a disconnect nor a keep-alive ping could act during it."""
        if name == PIPE_TOOL:
            return True, True
        tool = self.handlers.gateway.get(name)
        if tool is None:
            return True, False
        cached = self._traits_cache.get(name)
        if cached is None or cached[0] is not tool:
            plain = b"x-mcp-header" not in orjson.dumps(tool.input_schema)
            sync = isinstance(tool, FunctionTool) and not inspect.iscoroutinefunction(tool.fn)
            cached = (tool, plain, not sync)
            self._traits_cache[name] = cached
        return cached[1], cached[2]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> tuple[bool, Receive]:
        """Serve the request if it is ours. Returns (served, receive): when not served, ``receive``
        replays whatever body was read, for the SDK."""
        if scope["method"] != "POST":
            return False, receive
        headers: dict[str, str] = {}
        routing = 0
        for k, v in scope["headers"]:
            key = k.decode("latin-1")
            if key in _ROUTING:
                routing += 1
            elif key.startswith("mcp-param-"):
                return False, receive
            headers[key] = v.decode("latin-1")
        if headers.get("mcp-protocol-version") not in _MODERN or routing != sum(k in headers for k in _ROUTING):
            return False, receive
        request = Request(scope)
        if await self.security.validate_request(request, is_post=True) is not None:
            return False, receive
        has_json, has_sse = check_accept_headers(request)
        if not has_json or not (self.json_response or has_sse):
            return False, receive

        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return True, receive  # the client left before sending its body: nothing to answer
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                break
        replay = _replaying(body, more, receive)
        if more or body.startswith(_BOM) or _LONG_NUMBER.search(body) is not None:
            return False, replay  # the SDK decides: too large, a byte order mark, integers past 64 bits
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False, replay
        if json_measure(msg, max_depth=_SDK_MAX_DEPTH)[1] > _SDK_MAX_DEPTH:
            return False, replay  # the SDK answers its parse error
        call = _tool_call(msg)
        if call is None or not isinstance(classify_inbound_request(msg, headers=headers), InboundModernRoute):
            return False, replay
        name, args, meta = call
        plain, yields = self._traits(name)
        if not plain:
            return False, replay

        info = meta.get("io.modelcontextprotocol/clientInfo")
        ctx = ToolContext(
            request_id=str(msg["id"]),
            client={"name": info.get("name"), "version": info.get("version")} if isinstance(info, dict) else {},
            principal=scope.get(PRINCIPAL_SCOPE_KEY, self.handlers.default_principal),
        )
        capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
        if yields:
            await self._answer(msg["id"], name, args, ctx, capabilities, receive, send)
        else:
            await self._send_result(msg["id"], await self._call(name, args, ctx, capabilities), False, send)
        return True, receive

    async def _call(self, name: str, args: dict[str, Any], ctx: ToolContext, capabilities: Any) -> dict[str, Any]:
        """The handlers' call, able to ask the client (a pipeline that suspends answers input-required); a
        protocol error (a missing client capability) comes back as ``{_ERROR: exc}``."""
        try:
            return await self.handlers.interactions.call(
                self.handlers.call, name, args, ctx, modern=True, capabilities=capabilities
            )
        except MCPError as exc:
            return {_ERROR: exc}

    async def _answer(
        self,
        rid: Any,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        capabilities: Any,
        receive: Receive,
        send: Send,
    ) -> None:
        """Run a call that may yield: cancelled if the client leaves, kept alive past the ping interval."""
        out: dict[str, Any] | None = None
        streaming = False

        async def guard(scope: trio.CancelScope) -> None:
            # One task watches for the client leaving (which cancels the call) and, past the ping
            # interval, turns the answer into an SSE stream and keeps it alive.
            nonlocal streaming
            while True:
                with trio.move_on_after(PING_INTERVAL_S if not self.json_response else math.inf):
                    if (await receive())["type"] == "http.disconnect":
                        scope.cancel()
                        return
                    continue
                with trio.CancelScope(shield=True):
                    if not streaming:
                        streaming = True
                        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                    await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(guard, nursery.cancel_scope)
            out = await self._call(name, args, ctx, capabilities)
            nursery.cancel_scope.cancel()
        if out is None:
            return  # the client disconnected: the call was cancelled, nobody is left to answer
        await self._send_result(rid, out, streaming, send)

    async def _send_result(self, rid: Any, out: dict[str, Any], streaming: bool, send: Send) -> None:
        status = 200
        error = out.get(_ERROR)
        if error is not None:
            wire = error.error.model_dump(by_alias=True, mode="json", exclude_none=True)
            payload = orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": wire})
            status = ERROR_CODE_HTTP_STATUS.get(error.code, 200)
        else:
            out.setdefault("resultType", "complete")  # or "input_required": a pipeline asks the client
            out["_meta"] = self.meta
            payload = dumps({"jsonrpc": "2.0", "id": rid, "result": out})
        if streaming:
            event = b"event: message\r\ndata: " + payload + b"\r\n\r\n"
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _tool_call(msg: Any) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(name, arguments, _meta) of a plain ``tools/call`` request, or None for anything else."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or msg.get("method") != "tools/call":
        return None
    rid = msg.get("id")
    if isinstance(rid, bool) or not isinstance(rid, int | str):
        return None
    params = msg.get("params")
    if not isinstance(params, dict) or not params.keys() <= _PARAMS:
        return None
    name, args, meta = params.get("name"), params.get("arguments"), params.get("_meta")
    if not isinstance(name, str) or not isinstance(meta, dict):
        return None
    if args is None:
        args = {}
    elif not isinstance(args, dict):
        return None
    if "progressToken" in meta or LOG_LEVEL_META_KEY in meta:
        return None  # notifications for this request: the SDK's stream handles them
    return name, args, meta


def replaying(body: bytes, more: bool, receive: Receive) -> Receive:
    """A ``receive`` that first answers ``body`` (one message, ``more_body`` as given), then ``receive``."""
    return _replaying(body, more, receive)


def _replaying(body: bytes, more: bool, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay
