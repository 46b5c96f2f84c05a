"""Questions a downstream server asks during a call, relayed to the client whose call caused them.

A downstream tool may ask the client (elicitation, sampling, roots) while mcpipe calls it. mcpipe asks its
own caller through the call's :class:`~mcpipe.interaction.Interaction`, the machinery its own asking steps
use, so the two eras of the caller work as they do for those steps:

- **a 2026-07-28 downstream** answers an input-required result. :func:`call_relaying` asks the caller the
  same questions and retries the downstream with the answers and its ``requestState``. A 2025-11-25 caller
  is asked over its session at once. A 2026-07-28 caller is answered an input-required result of mcpipe's
  own: the downstream's questions and ``requestState`` ride in :attr:`Interaction.relayed`, sealed inside
  mcpipe's ``requestState``, and the caller's retry takes the answers back to the downstream.
- **a 2025-11-25 downstream** sends its questions as requests in the middle of the call. Those reach the
  callbacks of mcpipe's client session (:class:`Askers`), which route them to the call in flight that
  caused them and ask its caller over its session.

Questions are keyed as they are for mcpipe's own asking steps: a direct call's keep the downstream's keys;
a pipeline step's are ``<step>.<downstream key>`` (nested steps by their path).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import mcp_types
import trio
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    INVALID_REQUEST,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolResult,
    ErrorData,
    InputRequiredResult,
    InputResponses,
)
from pydantic import TypeAdapter, ValidationError

from mcpipe.interaction._core import METHOD_OF, AskFailed, Interaction, Suspended, interaction_of
from mcpipe.interaction._serve import session_sender
from mcpipe.tools import Request, ToolContext

__all__ = [
    "MAX_ROUNDS",
    "Askers",
    "call_relaying",
    "caller_capabilities",
    "keep_caller_capabilities",
    "request_asking",
]

MAX_ROUNDS = 10
"""The most input-required rounds one downstream call may take within one request (the SDK's default)."""

KIND_OF = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""The kind of question of each request a downstream may ask."""

_RESULT_OF: dict[str, type[Any]] = {
    "elicitation": mcp_types.ElicitResult,
    "sampling": mcp_types.CreateMessageResult,
    "roots": mcp_types.ListRootsResult,
}

SendFn = Callable[[InputResponses | None, str | None], Awaitable[CallToolResult | InputRequiredResult]]
"""One ``tools/call`` to the downstream: ``(inputResponses, requestState)`` -> its result."""


def _wire(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


def _requests(result: InputRequiredResult) -> dict[str, dict[str, Any]]:
    """The downstream's questions as wire JSON, without their ``_meta`` (the downstream's own)."""
    out = {}
    for token, request in (result.input_requests or {}).items():
        wire = _wire(request)
        params = wire.get("params")
        if isinstance(params, dict):
            params.pop("_meta", None)
        out[token] = wire
    return out


def _result(kind: str, answer: Mapping[str, object]) -> Any:
    try:
        return _RESULT_OF[kind].model_validate(answer)
    except ValidationError as e:
        raise AskFailed(f"the client's answer to {kind} is not a valid result: {e.errors()[0]['msg']}") from None


async def call_relaying(send: SendFn, ctx: ToolContext, *, max_rounds: int = MAX_ROUNDS) -> CallToolResult:
    """Call a 2026-07-28 downstream tool (``send``), relaying its questions to the caller of ``ctx``.

    Raises:
        Suspended: a 2026-07-28 caller must answer first (the questions are pending in its Interaction).
        CapabilityMissing: a 2026-07-28 caller lacks a capability a question needs.
        AskFailed: the questions could not be relayed (no client, a 2025-11-25 caller without the
            capability or refusing, too many rounds).
    """
    ix = interaction_of(ctx)
    send = _capability_errors(send, ix)
    key = ix.key(ctx, "") if ix is not None else ""
    carried = ix.relayed.pop(key, None) if ix is not None else None
    if carried is not None:  # the caller's retry: its answers go back with the downstream's state
        requests, state = carried["requests"], carried.get("state")
    else:
        first = await send(_offered(ix) if key == "" else None, None)
        if not isinstance(first, InputRequiredResult):
            return first
        requests, state = _requests(first), first.request_state
    delay = 0.05
    for _ in range(max_rounds):
        responses: InputResponses | None = None
        if requests:
            responses = await _answers(ix, key, requests, state)
            delay = 0.05
        else:  # only a state: the downstream is still working; back off as the SDK's client does
            await trio.sleep(delay)
            delay = min(delay * 2, 0.25)
        result = await send(responses, state)
        if not isinstance(result, InputRequiredResult):
            return result
        requests, state = _requests(result), result.request_state
    raise AskFailed(f"it asked for input more than {max_rounds} times in one call")


_RESPONSE: TypeAdapter[Any] = TypeAdapter(mcp_types.InputResponse)


def _offered(ix: Interaction | None) -> InputResponses | None:
    """The answers a 2026-07-28 client sent with no requestState, for a downstream tool it called directly
    (which may accept answers without a state of its own); those that are no answer at all are dropped."""
    if ix is None or not ix.offered:
        return None
    out: InputResponses = {}
    for key, answer in ix.offered.items():
        try:
            out[key] = _RESPONSE.validate_python(answer)
        except ValidationError:
            continue
    return out or None


def _capability_errors(send: SendFn, ix: Interaction | None) -> SendFn:
    """``send``, with the downstream's missing-capability error (-32021: it was told the caller's
    capabilities) made a tool error naming the capability for a 2025-11-25 caller, whose era has no such
    error. A 2026-07-28 caller gets the downstream's error as it is (a direct call's JSON-RPC error, a
    step's failure with its code)."""
    if ix is not None and ix.modern:
        return send

    async def checked(responses: InputResponses | None, state: str | None) -> CallToolResult | InputRequiredResult:
        try:
            return await send(responses, state)
        except MCPError as e:
            if e.code != MISSING_REQUIRED_CLIENT_CAPABILITY:
                raise
            data = e.error.data
            needed = data.get("requiredCapabilities") if isinstance(data, dict) else None
            cap = next(iter(needed), "") if isinstance(needed, dict) and needed else ""
            if not cap:
                raise
            method = f" ({METHOD_OF[cap]})" if cap in METHOD_OF else ""
            raise AskFailed(
                f"the client did not declare the `{cap}` capability, so it cannot be asked{method}"
            ) from None

    return checked


async def _answers(
    ix: Interaction | None, key: str, requests: dict[str, dict[str, Any]], state: str | None
) -> InputResponses:
    questions: list[tuple[str | None, str, dict[str, Any] | None, bool]] = []
    kinds = {}
    for token, request in requests.items():
        kind = KIND_OF.get(request.get("method", ""))
        if kind is None:
            raise AskFailed(f"it asked the client for {request.get('method')!r}, which mcpipe does not relay")
        kinds[token] = kind
        questions.append((token, kind, request.get("params"), False))
    if ix is None:
        raise AskFailed("it asks the client, and there is no MCP client to ask (this call was not made over MCP)")
    try:
        answers = await ix.ask_many(key, questions, keyed=True)
    except Suspended:
        ix.relayed[key] = {"requests": requests, "state": state}
        raise
    return {token: _result(kinds[token], answers[token]) for token in requests}


def caller_capabilities(ctx: ToolContext) -> dict[str, Any]:
    """What a 2026-07-28 downstream is told the client can answer: the caller's ``sampling``, ``elicitation``
    and ``roots`` (the questions mcpipe relays), nothing when there is no client to ask."""
    ix = interaction_of(ctx)
    caps = ix.capabilities if ix is not None else {}
    out = {}
    for name in KIND_OF.values():
        value = caps.get(name) if isinstance(caps, dict) else getattr(caps, name, None)
        if value is not None:
            out[name] = value if isinstance(value, dict) else _wire(value)
    return out


def keep_caller_capabilities(session: Any) -> None:
    """Let a request's own ``_meta`` capabilities through the SDK session's 2026-07-28 stamp.

    The session stamps its client's capabilities into every request's ``_meta``; mcpipe's are the union of
    what it relays, so a downstream would ask questions the caller cannot answer instead of adapting to the
    caller as it would directly. The stamp is wrapped once per session so a capabilities entry the request
    carries (:func:`caller_capabilities`) wins.
    """
    if not isinstance(session._stamp, _KeepingCapabilities):
        session._stamp = _KeepingCapabilities(session._stamp)


class _KeepingCapabilities:
    """An SDK session's stamp after which a request's own ``_meta`` capabilities entry is put back."""

    __slots__ = ("stamp",)

    def __init__(self, stamp: Callable[[dict[str, Any], Any], None]) -> None:
        self.stamp = stamp

    def __call__(self, data: dict[str, Any], opts: object) -> None:
        params = data.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        theirs = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
        self.stamp(data, opts)
        if theirs is not None:
            data["params"]["_meta"][CLIENT_CAPABILITIES_META_KEY] = theirs


class _Call:
    """One call in flight on a downstream session, and the questions being relayed for it."""

    __slots__ = ("_calls", "asking", "ix", "key", "refused")

    def __init__(self, ix: Interaction | None, key: str, calls: dict[int, _Call]) -> None:
        self.ix = ix
        self.key = key
        self.asking: set[trio.CancelScope] = set()
        self.refused: str | None = None
        """Why a question of this call was not relayed (the call's failure is then told that way)."""
        self._calls = calls

    # Registered in its askers' calls while entered (a class, not a generator: it is entered on every call).
    def __enter__(self) -> _Call:
        self._calls[id(self)] = self
        return self

    def __exit__(self, *exc: object) -> None:
        del self._calls[id(self)]
        for scope in self.asking:
            scope.cancel()

    def refuse(self, why: str) -> ErrorData:
        self.refused = why
        return _refused(why)

    @property
    def origin(self) -> object:
        """The inbound call this call belongs to (the steps of one pipeline share it)."""
        return self if self.ix is None else self.ix.memo  # one per inbound call, shared by its nested steps


class Askers:
    """The calls in flight on one downstream session, and the session's sampling, elicitation and roots
    callbacks, which route a 2025-11-25 downstream's mid-call questions to the caller.

    Those questions carry nothing naming the call that caused them (over stdio nothing at all), so a
    question goes to the one inbound call with calls in flight on the session. When calls of several
    inbound requests are in flight, it is refused (the downstream sees an error) rather than risk asking
    somebody else's client.

    Args:
        server: the downstream server's name, for messages.
    """

    def __init__(self, server: str) -> None:
        self.server = server
        self._calls: dict[int, _Call] = {}

    def calling(self, ctx: ToolContext) -> _Call:
        """Register a call for its duration (a context manager); questions still being asked for it are
        cancelled at its end."""
        ix = interaction_of(ctx)
        return _Call(ix, ix.key(ctx, "") if ix is not None else "", self._calls)

    def callbacks(self) -> dict[str, Any]:
        """The SDK ``Client``'s keyword arguments: the three callbacks (declaring the three capabilities)."""

        async def sampling(context: object, params: object) -> Any:
            return await self._ask("sampling", _wire(params))

        async def elicitation(context: object, params: object) -> Any:
            return await self._ask("elicitation", _wire(params))

        async def list_roots(context: object) -> Any:
            return await self._ask("roots", None)

        return {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": list_roots}

    def _caller(self) -> _Call | str:
        calls = list(self._calls.values())
        if not calls:
            return "no call is in flight on this connection"
        if len({id(c.origin) for c in calls}) > 1:
            return "calls of several requests are in flight on this connection, so the caller is ambiguous"
        return calls[0]

    async def _ask(self, kind: str, params: dict[str, Any] | None) -> Any:
        if params is not None:
            params.pop("_meta", None)
        call = self._caller()
        if isinstance(call, str):
            return _refused(f"mcpipe cannot relay it: {call}")
        ix = call.ix
        if ix is None:
            return call.refuse("mcpipe cannot relay it: there is no MCP client to ask")
        if ix.modern:
            return call.refuse(
                "mcpipe cannot relay it: the caller speaks 2026-07-28, which cannot be asked in the middle of "
                "a call (connect this server with protocol 2026-07-28 to relay its questions)",
            )
        with trio.CancelScope() as scope:
            call.asking.add(scope)
            try:
                return _result(kind, await ix.ask(call.key, kind, params))
            except AskFailed as e:
                return call.refuse(str(e))
            finally:
                call.asking.discard(scope)
        return _refused("the call that asked has ended")


def _refused(message: str) -> ErrorData:
    return ErrorData(code=INVALID_REQUEST, message=message)


async def request_asking(
    rctx: Any, server: Any, params: Any, request: Callable[..., Awaitable[Any]], *, modern: bool
) -> Any:
    """A ``prompts/get`` or ``resources/read`` forwarded to ``server``, whose answer may be input-required.

    A 2026-07-28 caller gets the downstream's input-required result as it is and retries with the
    downstream's own ``requestState`` (there is no pipeline of mcpipe's to resume: the request goes on to
    one server): ``request(client, input_responses=..., request_state=..., allow_input_required=True)``
    on the session. A 2025-11-25 caller is asked over its session: ``request(client)`` is the SDK client's
    method, which answers the downstream's questions through the session callbacks, routed here to it.

    Args:
        rctx: the inbound request's SDK context.
        server: the downstream server (its live client, its :class:`Askers`).
        params: the inbound request's params (``input_responses``, ``request_state``).
        request: sends the request on a client, as above.
        modern: whether the caller speaks 2026-07-28.
    """
    client = server.client()
    if modern:
        return await request(
            client.session,
            input_responses=getattr(params, "input_responses", None),
            request_state=getattr(params, "request_state", None),
            allow_input_required=True,
        )
    session = rctx.session
    ix = Interaction(
        modern=False, capabilities=session.client_capabilities, send=session_sender(session, rctx.request_id)
    )
    with server.askers.calling(ToolContext(request=Request(interaction=ix))) as asking:
        try:
            return await request(client)
        except MCPError:
            if asking.refused is not None:
                raise MCPError(
                    INVALID_REQUEST, f"the server asked a question mcpipe could not relay: {asking.refused}"
                ) from None
            raise
