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

**2025-11-25 on an established session.** A ``tools/call`` POST carrying ``Mcp-Session-Id`` of a live
session is served the same way once the SDK has served one request of that session (which is when the
handlers learn the client's identity and capabilities, :attr:`ToolHandlers.legacy_clients`): the SDK's
manager and transport checks (the session exists and belongs to this credential, Host/Origin, Accept,
Content-Type, the JSON-RPC shape), then the handler, then the answer as the SDK writes it (the same SSE
event and headers, or JSON in ``json_response`` mode). Calls that could ask the client (``ask_user``,
``sample``, ``list_roots``, declared pipelines, downstream servers' tools, whose questions are relayed, an
``mcp_pipe`` naming any of them) stay on the SDK path:
a 2025-11-25 question travels on the request's own stream, which only the SDK's transport routes.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import mcp_types as types
import orjson
import trio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_NAME_HEADER,
    InboundModernRoute,
    classify_inbound_request,
    decode_header_value,
)
from mcp_types import CLIENT_CAPABILITIES_META_KEY, INTERNAL_ERROR, LOG_LEVEL_META_KEY, SERVER_INFO_META_KEY
from mcp_types import methods as sdk_methods
from mcp_types.jsonrpc import HEADER_MISMATCH, JSONRPCError, JSONRPCNotification, JSONRPCResponse
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from mcpipe._core import json_measure
from mcpipe._json import dumps
from mcpipe.gateway import PIPE_TOOL
from mcpipe.interaction import INTERACTION_TOOL_NAMES
from mcpipe.server._core import PRINCIPAL_SCOPE_KEY, ToolHandlers, scope_request
from mcpipe.server._early import HostCheck, accepts, call_context, replaying
from mcpipe.server._passthrough import level_allows
from mcpipe.server._tasks import declares_tasks
from mcpipe.tools import ToolContext

__all__ = ["PING_INTERVAL_S", "FastToolCall"]


_log = logging.getLogger("mcpipe.http")

PING_INTERVAL_S = 15.0
"""After this long without an answer, the response becomes an SSE stream with keep-alive pings."""
WATCH_AFTER_S = 0.05
"""How long a call that may yield runs before its task watches for the client leaving (then cancelled)."""

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
_LEGACY = "2025-11-25"
_SESSION = MCP_SESSION_ID_HEADER.lower()
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
_ASKING_TOOL_TYPES = frozenset({"DownstreamTool", "WorkflowTool"})
"""Tools that may ask the caller mid-call, which on 2025-11-25 only the SDK's session can carry (the workflow
asks the client's model when it uses ``sampling``); a plan served as a tool says so itself (``may_ask``: declared
pipelines and playbooks)."""
_LEGACY_PING_S = 15.0
"""sse-starlette's ping period, which the SDK's 2025-11-25 streams use."""


class FastToolCall:
    """Serves 2026-07-28 ``tools/call`` POSTs directly; returns False (having consumed nothing it does not
    hand back) for every request it leaves to the SDK.

    Args:
        handlers: the tool handlers (the same ones the SDK server calls).
        security: the front's host check (the DNS-rebinding settings the SDK transport uses too).
        server_info: the ``serverInfo`` stamp of 2026-07-28 results.
        json_response: answer JSON only (never switch to SSE), as the SDK's ``json_response``.
        max_body: the body limit (larger bodies go to the SDK, which refuses them).
        manager: the SDK's ``StreamableHTTPSessionManager``, whose established 2025-11-25 sessions this path
            serves too (None: only 2026-07-28).
    """

    def __init__(
        self,
        handlers: ToolHandlers,
        security: HostCheck,
        server_info: Mapping[str, object],
        *,
        json_response: bool = False,
        max_body: int = 4 * 1024 * 1024,
        manager: Any = None,
    ) -> None:
        self.handlers = handlers
        # The SDK session manager whose 2025-11-25 sessions this path may serve (None: leave them all to it).
        self.manager = manager
        self.security = security
        self.meta = {SERVER_INFO_META_KEY: server_info}
        self.json_response = json_response
        self.max_body = max_body
        self._traits_cache: dict[str, tuple[object, bool]] = {}

    def _traits(self, name: str) -> tuple[bool, bool]:
        """(plain, yields) of a tool: plain when its input schema declares no ``x-mcp-header`` (whose
        headers the SDK validates); yields unless it is a synchronous Python function, or a declared pipeline
        whose steps only call those (:meth:`mcpipe.gateway.Gateway.inline_calls`). A call that does not yield
        runs inline, without a checkpoint of the server's own, so that neither a disconnect nor a keep-alive
        ping could act during it (and no task watches for them: a task per call costs a pipeline of 5 such
        steps 0.3 times a call)."""
        if name == PIPE_TOOL:
            return True, True
        gateway = self.handlers.gateway
        tool = gateway.get(name)
        if tool is None:
            return True, False
        cached = self._traits_cache.get(name)
        if cached is None or cached[0] is not tool:
            cached = (tool, b"x-mcp-header" not in orjson.dumps(tool.input_schema))
            self._traits_cache[name] = cached
        return cached[1], gateway.inline_calls(tool) is None

    def _may_ask(self, name: str, args: Any) -> bool:
        """Whether a call could ask a 2025-11-25 client something (then only the SDK path can carry it)."""
        if name in INTERACTION_TOOL_NAMES:
            return True
        if name == PIPE_TOOL:
            return _names_asking_tool(args, self._may_ask)
        tool = self.handlers.gateway.get(name)
        # A declared pipeline may ask; a downstream server's tool may ask too (its questions are relayed).
        return tool is not None and (
            type(tool).__name__ in _ASKING_TOOL_TYPES or getattr(tool, "may_ask", False) is True
        )

    async def _acceptable(self, scope: Scope) -> bool:
        """The SDK's checks of a POST this path may serve, as the front makes them (``_early.HostCheck`` and
        ``accepts``, checked against the SDK's in tests/server/test_early.py): DNS rebinding (Host, Origin),
        Content-Type, and an Accept header that takes the answer this server gives."""
        headers = scope["headers"]
        if self.security.refusal(headers, is_post=True) is not None:
            return False
        accept = next((v.decode("latin-1") for k, v in headers if k == b"accept"), "")
        has_json, has_sse = accepts({"accept": accept})
        return has_json and (self.json_response or has_sse)

    async def _read_body(self, receive: Receive) -> tuple[bytes | None, bool, Receive]:
        """(body, complete, receive-for-the-SDK); body None when the client left before sending it."""
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None, False, receive
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                break
        # The SDK decides what is too large, starts with a byte order mark, or holds integers past 64 bits.
        complete = not more and not body.startswith(_BOM) and _LONG_NUMBER.search(body) is None
        return body, complete, replaying(body, more, receive)

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
        version = headers.get("mcp-protocol-version")
        if version == _LEGACY and _SESSION in headers and self.manager is not None:
            return await self._legacy(scope, receive, send, headers)
        if version not in _MODERN or routing != sum(k in headers for k in _ROUTING):
            return False, receive
        if not await self._acceptable(scope):
            return False, receive

        body, complete, replay = await self._read_body(receive)
        if body is None:
            return True, receive  # the client left before sending its body: nothing to answer
        if not complete:
            return False, replay
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False, replay
        if json_measure(msg, max_depth=_SDK_MAX_DEPTH)[1] > _SDK_MAX_DEPTH:
            return False, replay  # the SDK answers its parse error
        if isinstance(msg, dict) and msg.get("method") in _TASK_METHODS and _name_mismatch(msg, headers):
            # SEP-2663: the tasks methods mirror params.taskId in Mcp-Name, checked like tools/call's name.
            mismatch = MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")
            await self._send_result(msg.get("id"), {_ERROR: mismatch}, False, send)
            return True, receive
        call = _tool_call(msg)
        if call is None or not isinstance(classify_inbound_request(msg, headers=headers), InboundModernRoute):
            return False, replay
        name, args, meta = call
        plain, yields = self._traits(name)
        if not plain:
            return False, replay
        # A call that may become a task (the client declares the extension, or the tool requires it) goes
        # the SDK's way, where the tasks extension answers it.
        support = None if self.handlers.tasks is None else self.handlers.tasks.support(name)
        if support is not None and (support == "required" or declares_tasks(meta.get(CLIENT_CAPABILITIES_META_KEY))):
            return False, replay

        ctx = call_context(self.handlers, scope, msg["id"], meta)
        capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
        if yields:
            await self._answer(msg["id"], name, args, ctx, capabilities, receive, send)
        else:
            await self._send_result(msg["id"], await self._call(name, args, ctx, capabilities), False, send)
        return True, receive

    async def _call(
        self,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        capabilities: types.ClientCapabilities | dict[str, object] | None,
    ) -> dict[str, Any]:
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
        capabilities: types.ClientCapabilities | dict[str, object] | None,
        receive: Receive,
        send: Send,
    ) -> None:
        """Run a call that may yield: cancelled if the client leaves, kept alive past the ping interval."""
        out: dict[str, Any] | None = None
        streaming = False
        done = trio.Event()
        watching = trio.CancelScope()

        async def guard(scope: trio.CancelScope) -> None:
            # One task watches for the client leaving (which cancels the call) and, past the ping
            # interval, turns the answer into an SSE stream and keeps it alive. It starts watching only
            # once the call has run for WATCH_AFTER_S: most calls end before, arm no read, and let the task
            # return as the call's end wakes it (no Cancelled raised through it and the nursery: half its
            # cost).
            nonlocal streaming
            interval = PING_INTERVAL_S if not self.json_response else math.inf
            ping_at = trio.current_time() + interval
            with trio.move_on_after(WATCH_AFTER_S):
                await done.wait()
            if done.is_set():
                return
            with watching:
                while True:
                    with trio.move_on_at(ping_at):
                        if (await receive())["type"] == "http.disconnect":
                            scope.cancel()
                            return
                        continue
                    with trio.CancelScope(shield=True):
                        if not streaming:
                            streaming = True
                            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                        await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
                    ping_at = trio.current_time() + interval

        async with trio.open_nursery() as nursery:
            nursery.start_soon(guard, nursery.cancel_scope)
            out = await self._call(name, args, ctx, capabilities)
            done.set()
            watching.cancel()
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

    async def _legacy(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]
    ) -> tuple[bool, Receive]:
        """A 2025-11-25 ``tools/call`` on an established session (see the module's docstring)."""
        sid = headers[_SESSION]
        transport = self.manager._server_instances.get(sid)
        if transport is None or transport.is_terminated:
            return False, receive
        client = self.handlers.legacy_clients.get(transport)
        if client is None:
            return False, receive  # the SDK has not served this session yet: it learns who the client is
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if requestor != self.manager._session_owners.get(sid):
            return False, receive
        if not await self._acceptable(scope):
            return False, receive
        content_type = headers.get("content-type", "").split(";")[0]
        if not any(part.strip() == "application/json" for part in content_type.split(",")):
            return False, receive
        body, complete, replay = await self._read_body(receive)
        if body is None:
            return True, receive
        if not complete:
            return False, replay
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False, replay
        call = _tool_call(msg, legacy=True)
        if call is None:
            return False, replay
        try:
            sdk_methods.validate_client_request("tools/call", _LEGACY, msg["params"])
        except (ValidationError, KeyError, ValueError):
            return False, replay  # the SDK answers invalid-params its own way
        name, args, meta = call
        plain, yields = self._traits(name)
        if not plain or self._may_ask(name, args):
            return False, replay
        info, capabilities, connection = client
        ctx = ToolContext(
            request_id=str(msg["id"]),
            client=info,
            principal=scope.get(PRINCIPAL_SCOPE_KEY, self.handlers.default_principal),
            request=scope_request(scope),
            traceparent=meta.get("traceparent"),
        )
        rid = msg["id"]
        if self.json_response:
            payload = _legacy_answer(rid, await self._legacy_call(name, args, ctx, capabilities))
            start = [*_JSON_HEADERS, (b"mcp-session-id", sid.encode()), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": start})
            await send({"type": "http.response.body", "body": payload})
            return True, receive
        # The SDK's SSE answer: its headers at once, the priming event of a resumable stream, then the
        # messages, each kept in the session's event store (for a client resuming with Last-Event-ID) as the
        # SDK keeps them; pings while the call runs.
        start = [
            (b"cache-control", b"no-cache, no-transform"),
            (b"connection", b"keep-alive"),
            (b"content-type", b"text/event-stream"),
            (b"mcp-session-id", sid.encode()),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        store = getattr(transport, "_event_store", None)
        stream = str(rid)
        if store is not None:
            primed = b"id: " + str(await store.store_event(stream, None)).encode() + b"\r\ndata: \r\n"
            retry = getattr(transport, "_retry_interval", None)
            if retry is not None:
                primed += b"retry: " + str(retry).encode() + b"\r\n"
            await send({"type": "http.response.body", "body": primed + b"\r\n", "more_body": True})

        async def event(message: bytes, model: Any, more: bool) -> None:
            head = b""
            if store is not None:
                head = b"id: " + str(await store.store_event(stream, model())).encode() + b"\r\n"
            body = head + b"event: message\r\ndata: " + message + b"\r\n\r\n"
            await send({"type": "http.response.body", "body": body, "more_body": more})

        passthrough = self.handlers.passthrough

        async def log(level: str, data: Any, /, logger: str | None = None) -> None:
            if passthrough is not None and not level_allows(passthrough.levels.get(connection), level):
                return
            params: dict[str, Any] = {"level": level, "data": data}
            if logger is not None:
                params["logger"] = logger
            note = {"jsonrpc": "2.0", "method": "notifications/message", "params": params}
            await event(orjson.dumps(note), lambda: JSONRPCNotification.model_validate(note), True)

        ctx.log = log
        answer: dict[str, Any] | None = None
        if yields:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._legacy_guard, nursery.cancel_scope, receive, send)
                answer = await self._legacy_call(name, args, ctx, capabilities)
                nursery.cancel_scope.cancel()
            if answer is None:
                return True, receive  # the client disconnected: the call was cancelled
        else:
            answer = await self._legacy_call(name, args, ctx, capabilities)
        payload = _legacy_answer(rid, answer)
        await event(payload, lambda: _message_model(payload), False)
        return True, receive

    async def _legacy_call(
        self,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        capabilities: types.ClientCapabilities | dict[str, object] | None,
    ) -> dict[str, Any]:
        try:
            return await self.handlers.interactions.call(
                self.handlers.call, name, args, ctx, modern=False, capabilities=capabilities
            )
        except MCPError as exc:
            return {_ERROR: exc}

    @staticmethod
    async def _legacy_guard(scope: trio.CancelScope, receive: Receive, send: Send) -> None:
        """Cancel the call when the client leaves; keep the stream alive with comments meanwhile."""
        while True:
            with trio.move_on_after(_LEGACY_PING_S):
                if (await receive())["type"] == "http.disconnect":
                    scope.cancel()
                    return
                continue
            with trio.CancelScope(shield=True):
                await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})


def _legacy_answer(rid: Any, out: dict[str, Any]) -> bytes:
    """The JSON-RPC answer to a 2025-11-25 call, shaped by the SDK's own result surface (validated, and
    dumped in its field order) so it is byte for byte what the SDK path writes."""
    error = out.get(_ERROR)
    if error is None:
        try:
            result = sdk_methods.serialize_server_result("tools/call", _LEGACY, out)
        except ValidationError:
            _log.exception("tools/call returned an invalid result")
            error = MCPError(code=INTERNAL_ERROR, message="Handler returned an invalid result")
        else:
            return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})
    wire = error.error.model_dump(by_alias=True, mode="json", exclude_none=True)
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": wire})


def _message_model(payload: bytes) -> Any:
    """The SDK's model of an answer already encoded (what an event store keeps for a replay)."""
    message = orjson.loads(payload)
    return (JSONRPCError if "error" in message else JSONRPCResponse).model_validate(message)


def _names_asking_tool(node: Any, may_ask: Any) -> bool:
    """Whether an ``mcp_pipe`` spec names, anywhere, a tool for which ``may_ask`` holds."""
    if isinstance(node, dict):
        tool = node.get("tool")
        if isinstance(tool, str) and may_ask(tool, None):
            return True
        return any(_names_asking_tool(v, may_ask) for v in node.values() if isinstance(v, dict | list))
    if isinstance(node, list):
        return any(_names_asking_tool(v, may_ask) for v in node if isinstance(v, dict | list))
    return False


_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


def _name_mismatch(msg: Mapping[str, object], headers: dict[str, str]) -> bool:
    """A tasks request whose ``Mcp-Name`` header is there but names another task than ``params.taskId``."""
    params = msg.get("params")
    task_id = params.get("taskId") if isinstance(params, dict) else None
    header = headers.get(MCP_NAME_HEADER)
    return isinstance(task_id, str) and header is not None and decode_header_value(header) != task_id


def _tool_call(msg: Any, *, legacy: bool = False) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(name, arguments, _meta) of a plain ``tools/call`` request, or None for anything else (a 2026-07-28
    request must carry ``_meta``; a ``legacy`` 2025-11-25 one may leave it out)."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or msg.get("method") != "tools/call":
        return None
    rid = msg.get("id")
    if isinstance(rid, bool) or not isinstance(rid, int | str):
        return None
    params = msg.get("params")
    if not isinstance(params, dict) or not params.keys() <= _PARAMS:
        return None
    name, args, meta = params.get("name"), params.get("arguments"), params.get("_meta")
    if legacy and meta is None:
        meta = {}
    if not isinstance(name, str) or not isinstance(meta, dict):
        return None
    if args is None:
        args = {}
    elif not isinstance(args, dict):
        return None
    if "progressToken" in meta or LOG_LEVEL_META_KEY in meta:
        return None  # notifications for this request: the SDK's stream handles them
    return name, args, meta
