"""A downstream ``tools/call`` on an HTTP session the SDK's client set up, sent and read without the client stack.

Through the SDK's client a proxied call is a pydantic request model, a memory-stream hop to the
transport's writer, a task for its POST, the answer's bytes validated into JSON-RPC models and handed
back over two more streams (cProfile, docs/performance.md). :func:`lean_call` sends the same request
on the same session instead: its body built once (the session's own stamp supplies the era's headers and
``_meta``; the transport's supplies the session id and negotiated version), written straight on the lean
wire's connection when the session's httpx client has no auth flow and no hooks but mcpipe's own (:class:`Wire`
decides it once a session), else POSTed through the client (its auth flows and event hooks), and its answer
read in the calling task: ``application/json`` parsed once; ``text/event-stream`` event by event, the call's
progress given to its callback, the final response taken as the result.

Everything else is the SDK's own code: any other message on the call's stream (a log message, a
list change, a server-to-client request such as elicitation) goes to the session's reader as the
transport would send it, so the same handlers answer it; a stream that ends with an event id resumes
through the transport's reconnection; a cancelled or timed-out call sends the dispatcher's courtesy
``notifications/cancelled`` (the transport aborts it into a closed stream at 2026-07-28); a result that
is not plain text content is validated by the session's adapter. A call the lean path cannot send (a
redirect, arguments orjson cannot encode) answers None before anything ran, and is sent the SDK's way.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import orjson
import trio
from httpx2._sse import ServerSentEvent, _SSEParser
from mcp.client.extension import UnexpectedClaimedResult
from mcp.client.session import _clamp_inbound_ttl, _later_revision_fields
from mcp.client.streamable_http import RequestContext, StreamableHTTPTransport
from mcp.shared._compat import resync_tracer
from mcp.shared._context_streams import create_context_streams
from mcp.shared._httpx_utils import redirect_location
from mcp.shared.dispatcher import ProgressFnT, coerce_request_id, run_notify_intercept
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import _ABANDON_WRITE_TIMEOUT
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    CallToolResult,
    ErrorData,
    InputRequiredResult,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from mcp_types import methods as _methods
from pydantic import TypeAdapter, ValidationError

from mcpipe.downstream._wire import LeanBody, LeanResult, LeanTransport

if TYPE_CHECKING:
    from mcpipe.downstream._polling import StreamWatch

_log = logging.getLogger(__name__)

__all__ = ["LeanResult", "Wire", "lean_call", "streamable_http_wire"]

_PLAIN_KEYS = frozenset({"content", "structuredContent", "isError", "_meta", "resultType"})
"""A result of these keys alone may be plain (``_result``): ``_meta`` and a ``complete`` ``resultType`` are not
part of the answer mcpipe makes of it."""


@dataclass(slots=True)
class Wire:
    """What a lean call needs of an HTTP session's transport.

    Whether its calls go straight to the lean wire (``lean``) is decided once, when the session's transport
    opens: when the session's httpx client sends on a :class:`LeanTransport` with no auth flow (none set, no
    credentials in the URL) and no event hooks but ``own_hooks`` (mcpipe's own, whose work the lean call does
    itself), a call's request is written on the transport's connection as bytes (its head built once per
    session state) and its answer read without httpx's ``Request`` and ``Response``. Otherwise, and for a
    call while the client holds cookies, the request goes through the client's ``send``.
    """

    url: str
    http: httpx2.AsyncClient
    transport: StreamableHTTPTransport
    inbound: Any
    """The transport's writer into the session's reader: a server's request on a call's stream goes there."""
    watch: StreamWatch | None = None
    """The client's stream watch (``_polling``), told a watched call's event ids on the direct path."""
    own_hooks: tuple[Any, ...] = ()
    """The client's event hooks the direct path stands in for (mcpipe's own)."""
    session: Any = None
    """The SDK's ``ClientSession`` over this transport (set by :func:`lean_call`)."""
    lean: LeanTransport | None = None
    """The transport calls are written on directly, or None: through the client's ``send``."""
    _target: httpx2.URL = field(init=False)
    _key: tuple[str, int] = field(init=False)
    _timeouts: dict[str, float | None] = field(init=False)
    _heads: dict[tuple[Any, ...], httpx2.Headers] = field(default_factory=dict)
    _lines: dict[tuple[Any, ...], bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        http = self.http
        self._target = target = httpx2.URL(self.url)
        self._key = (target.host, target.port or 80)
        self._timeouts = http.timeout.as_dict()
        hooks = (*http.event_hooks["request"], *http.event_hooks["response"])
        lean = http._transport_for_url(target)
        if (
            isinstance(lean, LeanTransport)
            and http.auth is None
            and not (target.username or target.password)  # httpx would add basic auth from the URL
            and all(hook in self.own_hooks for hook in hooks)
        ):
            self.lean = lean

    def _state(self, extra: dict[str, str] | None) -> tuple[Any, ...]:
        transport = self.transport
        return (transport.session_id, transport._protocol_version_header, *(extra.items() if extra else ()))

    def headers(self, extra: dict[str, str] | None) -> httpx2.Headers:
        """The call's headers as ``http.build_request`` merges them (no cookies), once per session state (the
        session id, the negotiated version, the per-message headers)."""
        key = self._state(extra)
        heads = self._heads.get(key)
        if heads is None:
            if len(self._heads) >= 256:
                self._heads.clear()
            heads = self.http.headers.copy()
            heads.update(self.transport._prepare_headers())
            heads.update(extra or {})
            self._heads[key] = heads
        return heads

    def request(self, body: bytes, extra: dict[str, str] | None) -> httpx2.Request:
        """The call's POST, as ``http.build_request`` makes it, its URL parsed and its headers merged once per
        session state."""
        http = self.http
        if http.cookies:  # a jar to merge: the client's own way
            headers = self.transport._prepare_headers()
            headers.update(extra or {})
            return http.build_request("POST", self.url, content=body, headers=headers)
        return httpx2.Request(
            "POST", self._target, headers=self.headers(extra), content=body, extensions={"timeout": self._timeouts}
        )

    def message(self, body: bytes, extra: dict[str, str] | None) -> bytes:
        """The call's POST as the lean transport writes the :meth:`request` of it: its head up to the
        ``Content-Length`` value built once per session state, then the length and ``body``."""
        key = self._state(extra)
        head = self._lines.get(key)
        if head is None:
            if len(self._lines) >= 256:
                self._lines.clear()
            some = httpx2.Request("POST", self._target, headers=self.headers(extra), content=b"{}")
            *raw, (length, _) = some.headers.raw  # httpx puts a body's Content-Length last
            assert length.lower() == b"content-length"
            lines = [b"POST ", self._target.raw_path, b" HTTP/1.1\r\n"]
            for name, value in raw:
                lines += (name, b": ", value, b"\r\n")
            lines += (length, b": ")
            head = self._lines[key] = b"".join(lines)
        return b"%b%d\r\n\r\n%b" % (head, len(body), body)

    def response(self, body: bytes, extra: dict[str, str] | None, answer: tuple[Any, ...]) -> httpx2.Response:
        """A directly read answer that is not plain, made the ``Response`` the client's ``send`` would have
        answered (its cookies kept, its hooks run by :func:`_answer`'s caller, its redirect noted), so that
        what is rare is read one way."""
        status, reason, headers, stream = answer
        http = self.http
        request = self.request(body, extra)
        response = httpx2.Response(
            status,
            headers=headers,
            stream=stream,
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )
        http.cookies.extract_cookies(response)
        if response.has_redirect_location:
            with suppress(httpx2.RemoteProtocolError):
                response.next_request = http._build_redirect_request(request, response)
        return response

    async def call(
        self,
        session: Any,
        name: str,
        arguments: dict[str, Any] | None,
        meta: Any,
        progress: ProgressFnT,
        read_timeout_s: float | None,
    ) -> CallToolResult | InputRequiredResult | LeanResult | None:
        """:func:`lean_call` on this wire (the downstream server's call path reaches it through its wire, so
        that it imports the SDK only when it has a session)."""
        return await lean_call(self, session, name, arguments, meta, progress, read_timeout_s)


@asynccontextmanager
async def streamable_http_wire(
    url: str,
    http: httpx2.AsyncClient,
    keep: Callable[[Wire | None], None],
    *,
    watch: StreamWatch | None = None,
    own_hooks: tuple[Any, ...] = (),
) -> AsyncIterator[Any]:
    """The SDK's ``streamable_http_client`` over ``http``, its transport and reader kept (``keep``) for
    :func:`lean_call` while the session lives (the same tasks and streams, in the same order); ``watch`` and
    ``own_hooks`` as :class:`Wire` takes them."""
    transport = StreamableHTTPTransport(url)
    read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_reader = create_context_streams[SessionMessage](0)
    async with read_writer, read_stream, write_stream, write_reader, anyio.create_task_group() as tg:

        def start_get_stream() -> None:
            tg.start_soon(transport.handle_get_stream, http, read_writer)

        tg.start_soon(transport.post_writer, http, write_reader, read_writer, write_stream, start_get_stream, tg)
        keep(Wire(url, http, transport, read_writer, watch, own_hooks))
        try:
            yield read_stream, write_stream
        finally:
            keep(None)
            if transport.session_id:
                await transport.terminate_session(http)
            tg.cancel_scope.cancel()
    await resync_tracer()


async def lean_call(
    wire: Wire,
    session: Any,
    name: str,
    arguments: dict[str, Any] | None,
    meta: Any,
    progress: ProgressFnT,
    read_timeout_s: float | None,
) -> CallToolResult | InputRequiredResult | LeanResult | None:
    """One ``tools/call`` of ``name`` on ``session`` (the SDK's ``ClientSession`` whose transport ``wire``
    is), as ``session.call_tool(..., allow_input_required=True)`` would answer it; None when it cannot be
    sent this way (nothing was sent, or the server did not take it: send it the SDK's way).

    Raises:
        MCPError: the server's JSON-RPC error, a timeout, or the stream failing, as the SDK raises them.
    """
    params: dict[str, Any] = {}
    if meta is not None:
        params["_meta"] = dict(meta)
    params["name"] = name
    if arguments is not None:
        params["arguments"] = arguments
    wire.session = session
    data: dict[str, Any] = {"method": "tools/call", "params": params}
    opts: dict[str, Any] = {}
    session._stamp(data, opts)
    dispatcher = session._dispatcher
    rid: int = dispatcher._allocate_id()
    params = data["params"]
    params["_meta"] = {**(params.get("_meta") or {}), "progressToken": rid}
    try:
        body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})
    except TypeError:  # orjson.JSONEncodeError: a value JSON cannot carry as orjson writes it
        return None
    extra = opts.get("headers")
    await trio.lowlevel.checkpoint_if_cancelled()  # cancelled before anything was sent: nothing to cancel
    # From here a cancelled send may still have reached the server: it counts as sent.
    timed_out = False
    try:
        if read_timeout_s is None:
            raw = await _sent(wire, body, extra, rid, progress, params["_meta"])
        else:
            with trio.CancelScope(deadline=trio.current_time() + read_timeout_s) as limit:
                raw = await _sent(wire, body, extra, rid, progress, params["_meta"])
            timed_out = limit.cancelled_caught
    except trio.Cancelled:
        await _cancel(dispatcher, rid, "caller cancelled", shield=True)
        raise
    if timed_out:
        await _cancel(dispatcher, rid, f"timed out after {read_timeout_s}s", shield=False)
        raise MCPError(code=REQUEST_TIMEOUT, message="Request 'tools/call' timed out")
    if raw is None:
        return None
    return _result(session, raw)


async def _sent(
    wire: Wire, body: bytes, extra: dict[str, str] | None, rid: int, progress: ProgressFnT, meta: dict[str, Any]
) -> dict[str, Any] | None:
    """The call sent and its result read: straight on the lean wire when it can be, else through the client's
    ``send``."""
    http = wire.http
    try:
        if wire.lean is not None and not http.cookies and not http.is_closed:
            return await _direct(wire, body, extra, rid, progress, meta)
        response = await http.send(wire.request(body, extra), stream=True, follow_redirects=False)
        try:
            return await _answer(response, wire, rid, progress)
        finally:
            await response.aclose()
    except httpx2.RequestError as exc:
        # The connection failed, or an auth flow did: the SDK's transport dies of either, and its
        # session fails the call as a closed connection; so does this path (the same answer).
        raise MCPError(code=CONNECTION_CLOSED, message=f"Connection closed: {exc}") from None


async def _cancel(dispatcher: Any, rid: int, reason: str, *, shield: bool) -> None:
    """The dispatcher's courtesy cancel, as its ``send_raw_request`` sends it (through the transport, which
    posts it on a 2025-11-25 session and swallows it on a 2026-07-28 one, where the closed stream says it)."""
    await dispatcher._final_write(
        partial(dispatcher._cancel_outbound, rid, reason, None),
        shield=shield,
        timeout=_ABANDON_WRITE_TIMEOUT,
        describe=f"courtesy cancel for request {rid!r}",
    )


async def _direct(
    wire: Wire, body: bytes, extra: dict[str, str] | None, rid: int, progress: ProgressFnT, meta: dict[str, Any]
) -> dict[str, Any] | None:
    """The call's POST written on the lean wire's connection and its answer read off it: a plain 200 (JSON or
    event stream) here, anything else as the client's ``Response`` through :func:`_answer`."""
    assert wire.lean is not None
    answer = await wire.lean.exchange(wire._key, wire.message(body, extra), wire._timeouts)
    status, stream = answer[0], answer[3]
    try:
        if status == 200 and stream.plain:
            ctype = stream.content_type
            if ctype.startswith(b"application/json"):
                return await _json(await stream.read(), wire, rid, progress)
            if ctype.startswith(b"text/event-stream"):
                seen = wire.watch.reporter(meta) if wire.watch is not None else None
                events = _sse(stream, wire.transport.max_sse_event_size)
                async with aclosing(events):
                    return await _events(events, wire, rid, progress, seen)
        response = wire.response(body, extra, answer)
        for hook in wire.http.event_hooks["response"]:
            await hook(response)
        return await _answer(response, wire, rid, progress)
    finally:
        await stream.aclose()


async def _sse(stream: LeanBody, max_event_size: int | None) -> AsyncGenerator[ServerSentEvent]:
    """The events of a plain event stream (UTF-8, as ``httpx2.EventSource`` reads it through ``aiter_text``)."""
    parser = _SSEParser(max_event_size)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    async for chunk in stream:
        for sse in parser.decode(decoder.decode(chunk)):
            yield sse
    for sse in parser.decode(decoder.decode(b"", final=True)):
        yield sse
    for sse in parser.flush():
        yield sse


async def _answer(response: httpx2.Response, wire: Wire, rid: int, progress: ProgressFnT) -> dict[str, Any] | None:
    """The result of the call's response (the transport's ``_handle_post_request``, read in place)."""
    status = response.status_code
    if 300 <= status < 400 and redirect_location(response) is not None:
        return None  # the SDK's client follows it within the origin, or says why not
    if status == 202:
        raise MCPError(code=INVALID_REQUEST, message="server answered a request with 202 Accepted")
    ctype = response.headers.get("content-type", "").lower()
    if status >= 400:
        if ctype.startswith("application/json"):
            try:
                parsed = jsonrpc_message_adapter.validate_json(await response.aread(), by_name=False)
            except (httpx2.StreamError, ValidationError):
                parsed = None
            if isinstance(parsed, JSONRPCError):
                raise _error(parsed.error)
        if status == 404:
            if wire.transport.session_id is None:
                raise MCPError(code=METHOD_NOT_FOUND, message="Not Found")
            raise MCPError(code=INVALID_REQUEST, message="Session terminated")
        raise MCPError(code=INTERNAL_ERROR, message="Server returned an error response")
    if ctype.startswith("application/json"):
        return await _json(await response.aread(), wire, rid, progress)
    if ctype.startswith("text/event-stream"):
        source = httpx2.EventSource(response, max_event_size=wire.transport.max_sse_event_size)
        return await _events(aiter(source), wire, rid, progress)
    raise MCPError(code=INVALID_REQUEST, message=f"Unexpected content type: {ctype}")


async def _json(content: bytes, wire: Wire, rid: int, progress: ProgressFnT) -> dict[str, Any]:
    """The result of a JSON answer to the call."""
    try:
        message = orjson.loads(content)
    except orjson.JSONDecodeError:
        message = None
    if isinstance(message, dict) and type(message.get("result")) is dict and "method" not in message:
        return message["result"]
    try:
        parsed = jsonrpc_message_adapter.validate_json(content, by_name=False)
    except ValidationError as exc:
        raise MCPError(code=PARSE_ERROR, message=f"Failed to parse JSON response: {exc}") from None
    outcome = await _route(parsed, wire, rid, progress)
    if outcome is None:  # the SDK's client would wait for an answer that never comes
        raise MCPError(code=CONNECTION_CLOSED, message="the server answered the call with no response")
    return outcome


async def _events(
    events: AsyncIterator[ServerSentEvent],
    wire: Wire,
    rid: int,
    progress: ProgressFnT,
    seen: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The final response of the call's event stream; what comes before it delivered on the way (``seen`` told
    each event's id, when the call is watched and no hook scans its stream)."""
    last_id: str | None = None
    retry: int | None = None
    try:
        async for sse in events:
            if sse.id:
                last_id = sse.id
                if seen is not None:
                    seen(sse.id)
            if sse.retry is not None:
                retry = sse.retry
            if sse.event != "message" or not sse.data:
                continue  # a priming event (resumability), or one the SDK's client ignores too
            outcome = await _event(sse.data, wire, rid, progress)
            if outcome is not None:
                return outcome
    except httpx2.SSEError as exc:
        raise MCPError(code=CONNECTION_CLOSED, message=f"SSE stream failed: {exc}") from None
    except httpx2.TransportError:
        pass  # the stream ended: resumed below when it can be, as the SDK's client does
    if last_id is not None:
        return await _resumed(wire, rid, last_id, retry, progress)
    raise MCPError(code=CONNECTION_CLOSED, message="SSE stream ended without a response")


async def _event(data: str, wire: Wire, rid: int, progress: ProgressFnT) -> dict[str, Any] | None:
    """One event's message: the call's result, its progress given to ``progress``, anything else to the
    session's reader. None until the result."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        message = None
    if isinstance(message, dict):
        method = message.get("method")
        if method is None:
            if type(message.get("result")) is dict and "id" in message:
                return message["result"]  # the SDK's client answers the call's id whatever id it carries
        elif method == "notifications/progress" and "id" not in message and _progressed(message, rid, progress):
            await _give_progress(message["params"], progress)
            return None
    try:
        parsed = jsonrpc_message_adapter.validate_json(data, by_name=False)
    except ValidationError as exc:
        raise MCPError(code=PARSE_ERROR, message=f"Failed to parse SSE message: {exc}") from None
    return await _route(parsed, wire, rid, progress)


async def _give_progress(params: dict[str, Any], progress: ProgressFnT) -> None:
    """The call's progress to ``progress``, contained as the SDK's dispatcher contains it
    (``_shielded_progress``): a callback that raises, or a value that is not a number, is logged and the call
    goes on."""
    try:
        total, text = params.get("total"), params.get("message")
        await progress(
            float(params["progress"]),
            float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
            text if isinstance(text, str) else None,
        )
    except Exception:
        _log.exception("progress callback raised")


def _progressed(message: dict[str, Any], rid: int, progress: ProgressFnT) -> bool:
    """Whether a progress notification is the call's (the dispatcher's match, ``_dispatch_notification``)."""
    params = message.get("params")
    if not isinstance(params, dict):
        return False
    token, done = params.get("progressToken"), params.get("progress")
    if not isinstance(token, str | int) or isinstance(token, bool):
        return False
    if not isinstance(done, int | float) or isinstance(done, bool):
        return False
    return bool(coerce_request_id(token) == rid)


async def _route(message: Any, wire: Wire, rid: int, progress: ProgressFnT) -> dict[str, Any] | None:
    """A validated message of the call's stream: its response (an error raised), or None after handing a
    notification or request to the session's reader (where the SDK's transport would put it)."""
    if isinstance(message, JSONRPCResponse):
        return message.result
    if isinstance(message, JSONRPCError):
        raise _error(message.error)
    if isinstance(message, JSONRPCNotification) and message.method == "notifications/progress":
        as_dict = {"params": message.params}
        if _progressed(as_dict, rid, progress):
            params = message.params or {}
            total, text = params.get("total"), params.get("message")
            await progress(
                float(params["progress"]),
                float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
                text if isinstance(text, str) else None,
            )
            return None
    if isinstance(message, JSONRPCNotification) and message.method != "notifications/cancelled":
        # The dispatcher's routing of a notification (its intercept, then the session's handler), awaited here
        # rather than in a task of its own: a log message is forwarded before the call answers.
        session = wire.session
        if not run_notify_intercept(session._dispatcher._on_notify_intercept, message.method, message.params):
            await session._on_notify(None, message.method, message.params)
        return None
    await wire.inbound.send(SessionMessage(message))  # a request of the server's: the session answers it
    return None


async def _resumed(wire: Wire, rid: int, last_id: str, retry: int | None, progress: ProgressFnT) -> dict[str, Any]:
    """The call's stream resumed from ``last_id`` by the transport's own reconnection (GET with
    ``Last-Event-ID``, its retries and give-up), its messages read here."""
    send, receive = create_context_streams[SessionMessage | Exception](0)
    ctx = RequestContext(
        client=wire.http,
        session_id=wire.transport.session_id,
        session_message=SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=rid, method="tools/call")),
        metadata=None,
        read_stream_writer=send,
    )

    async def reconnect() -> None:
        async with send:
            await wire.transport._handle_reconnection(ctx, last_id, retry)

    async with trio.open_nursery() as nursery, receive:
        nursery.start_soon(reconnect)
        async for item in receive:
            if isinstance(item, Exception):
                continue
            outcome = await _route(item.message, wire, rid, progress)
            if outcome is not None:
                nursery.cancel_scope.cancel()
                return outcome
    raise MCPError(code=CONNECTION_CLOSED, message="SSE stream ended and reconnection attempts were exhausted")


def _error(error: ErrorData) -> MCPError:
    return MCPError(code=error.code, message=error.message, data=error.data)


def _result(session: Any, raw: dict[str, Any]) -> CallToolResult | InputRequiredResult | LeanResult:
    """The call's result: plain text content as it came; anything else as the session's ``send_request``
    and ``call_tool`` make it (version checks, later fields dropped, the session's adapter)."""
    if raw.keys() <= _PLAIN_KEYS:
        content = raw.get("content")
        structured = raw.get("structuredContent")
        is_error = raw.get("isError", False)
        if (
            type(content) is list
            and all(type(b) is dict and b.get("type") == "text" and b.keys() == {"type", "text"} for b in content)
            and all(type(b["text"]) is str for b in content)
            and (structured is None or type(structured) is dict)
            and type(is_error) is bool
            and raw.get("resultType", "complete") == "complete"
            and type(raw.get("_meta", {})) is dict
        ):
            return LeanResult(content, structured, is_error, "structuredContent" in raw)
    _clamp_inbound_ttl(raw)
    version = session._negotiated_version or "2025-11-25"
    try:
        _methods.validate_server_result("tools/call", version, raw)
    except KeyError:
        pass
    if not (foreign := _later_revision_fields("tools/call", version)).isdisjoint(raw):
        raw = {k: v for k, v in raw.items() if k not in foreign}
    adapter = session._call_tool_adapter
    result = adapter.validate_python(raw, by_name=False) if isinstance(adapter, TypeAdapter) else None
    if result is None:
        result = adapter.model_validate(raw, by_name=False)
    if not isinstance(result, CallToolResult | InputRequiredResult):
        raise UnexpectedClaimedResult(result)
    return result
