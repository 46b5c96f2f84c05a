"""The server's side of asking: one ``tools/call`` in either era, suspended and resumed in 2026-07-28.

:meth:`Interactions.call` wraps the server's plain call: it gives the call an :class:`Interaction`, and in
2026-07-28 it turns a :class:`Suspended` pipeline into an input-required result (``resultType:
"input_required"``, the questions in ``inputRequests``, the sealed state in ``requestState``), verifies the
state of a retry, and resumes. Protocol misuse is a JSON-RPC error: a bad state is invalid-params
(-32602), a missing client capability is -32021 (HTTP 400).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcpipe import _mcp
from mcpipe._mcp import INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcpipe._util import is_suspension
from mcpipe.interaction._core import (
    CapabilityMissing,
    Escalated,
    Interaction,
    fits,
    only,
)
from mcpipe.interaction._state import (
    DEFAULT_INLINE_MAX_BYTES,
    DEFAULT_STATE_TTL_S,
    STATE_KEY_ENV,
    StateError,
    StateSealer,
    args_digest,
)
from mcpipe.store import InMemoryPipelineStore, PipelineStore, StateTooLarge, StoreUnavailable
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcp.shared.exceptions import MCPError

__all__ = ["Interactions", "sdk_call"]

_log = logging.getLogger("mcpipe.interaction")

CallFn = Callable[[str, dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]
EscalateFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""Makes a call that asked its client first a task: takes ``{"memo", "answers"}`` (the steps it finished,
the answers it has not used yet) and answers the ``CreateTaskResult``."""


class Interactions:
    """The server-wide part: the pipeline store and the state sealer.

    Args:
        store: the pipeline store (default: in memory).
        keys: the state key ring (default: the variable ``key_env`` names, else a random key of this
            process).
        ttl_s: how long a suspended pipeline can be resumed.
        inline_max_bytes: larger states stay in the store behind a handle.
        audience: the server's name, sealed into every state and checked on the way back.
        key_env: the environment variable holding the key ring (default :data:`STATE_KEY_ENV`).
    """

    def __init__(
        self,
        store: PipelineStore | None = None,
        *,
        keys: list[str | bytes] | None = None,
        ttl_s: float = DEFAULT_STATE_TTL_S,
        inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
        audience: str | None = None,
        clock: Any = None,
        key_env: str = STATE_KEY_ENV,
    ) -> None:
        self.store: PipelineStore = store if store is not None else InMemoryPipelineStore()
        self._key_env = key_env
        self._told_ephemeral = False
        extra = {} if clock is None else {"clock": clock}
        self.sealer = StateSealer(
            self.store,
            keys=keys,
            ttl_s=ttl_s,
            inline_max_bytes=inline_max_bytes,
            audience=audience,
            key_env=key_env,
            **extra,
        )

    @classmethod
    def from_config(
        cls, section: Any, store: PipelineStore | None = None, *, audience: str | None = None
    ) -> Interactions:
        """From the config's ``interaction`` section (``state_key_env``, ``state_ttl_s``,
        ``inline_max_bytes``); ``audience`` is the server's name."""
        return cls(
            store,
            key_env=getattr(section, "state_key_env", STATE_KEY_ENV),
            ttl_s=getattr(section, "state_ttl_s", DEFAULT_STATE_TTL_S),
            inline_max_bytes=getattr(section, "inline_max_bytes", DEFAULT_INLINE_MAX_BYTES),
            audience=audience,
        )

    async def call(
        self,
        call: CallFn,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        *,
        modern: bool,
        capabilities: Any,
        send: Any = None,
        state: Any = None,
        responses: dict[str, Any] | None = None,
        escalate: EscalateFn | None = None,
    ) -> dict[str, Any]:
        """Run ``call(name, args, ctx)`` able to ask the client; answers the wire result (an input-required
        one when a 2026-07-28 pipeline suspends).

        With ``escalate`` (2026-07-28), the call asks its client synchronously until its first step that
        does work (:data:`~mcpipe.interaction._core.SYNC_KINDS`); there it becomes a task: ``escalate``
        answers.

        Raises:
            MCPError: invalid-params for a bad ``requestState``; -32021 when the client lacks a capability
                a question needs (2026-07-28).
        """
        if not modern:
            ctx.era = "2025-11-25"
            ctx.interaction = Interaction(modern=False, capabilities=capabilities, send=send)
            return await call(name, args, ctx)
        saved: dict[str, Any] = {"memo": {}, "answers": {}, "relayed": {}}
        if state is not None:
            saved, missing = await self._resume(name, args, ctx, state, responses or {})
            if missing:
                return await self._suspend(name, args, ctx, {**saved, "pending": missing})
        # Answers without a state, or to keys nobody asked, are ignored: only pending questions take answers
        # (a downstream tool called directly is offered those sent without a state, as it would be directly).
        ix = Interaction(modern=True, capabilities=capabilities, until_work=escalate is not None, **saved)
        if state is None and responses:
            ix.offered = responses
        ctx.era = "2026-07-28"
        ctx.interaction = ix
        try:
            return await call(name, args, ctx)
        except BaseException as e:
            if is_suspension(e) and ix.pending:  # questions first (with a step that would escalate, too)
                state = {"memo": ix.memo, "answers": ix.answers, "relayed": ix.relayed, "pending": ix.pending}
                return await self._suspend(name, args, ctx, state)
            if escalate is not None and only(e, Escalated) is not None:
                return await escalate({"memo": dict(ix.memo), "answers": dict(ix.answers)})
            lacking = only(e, CapabilityMissing)
            if lacking is not None:
                cap = lacking.capability
                raise _mcp.MCPError(
                    code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                    message=f"Missing required client capability: {lacking}",
                    data={"requiredCapabilities": {cap: {}}},
                ) from None
            raise

    async def _resume(
        self, name: str, args: Mapping[str, object], ctx: ToolContext, state: Any, responses: Mapping[str, object]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The saved ``memo``, ``answers`` (this retry's included) and ``relayed``, and the questions still
        unanswered."""
        try:
            saved = await self.sealer.unseal(state, tool=name, digest=args_digest(name, args), principal=ctx.principal)
        except StoreUnavailable as e:
            raise _unavailable(e) from None
        except StateError as e:
            _log.warning("requestState refused for %s (%s): %s", name, e.reason, e)
            raise _mcp.MCPError(
                code=INVALID_PARAMS, message=f"Invalid requestState: {e}", data={"reason": e.reason}
            ) from None
        memo, answers, pending = saved.get("memo"), saved.get("answers"), saved.get("pending")
        relayed = saved.get("relayed", {})
        if not (
            isinstance(memo, dict)
            and isinstance(answers, dict)
            and isinstance(pending, dict)
            and isinstance(relayed, dict)
        ):
            raise _mcp.MCPError(
                code=INVALID_PARAMS, message="Invalid requestState: not a pipeline state", data={"reason": "malformed"}
            )
        missing: dict[str, Any] = {}
        for wire, q in pending.items():
            answer = responses.get(wire)
            if answer is not None and fits(q["kind"], answer):
                answers[q["key"]] = answer
            else:
                missing[wire] = q
        return {"memo": memo, "answers": answers, "relayed": relayed}, missing

    async def _suspend(
        self,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        state: dict[str, Any],
    ) -> dict[str, Any]:
        if self.sealer.ephemeral and not self._told_ephemeral:
            # Said once, when it matters: most servers never suspend a pipeline.
            self._told_ephemeral = True
            _log.warning("a pipeline is suspended, and no %s is set: only this process can resume it", self._key_env)
        try:
            token = await self.sealer.seal(state, tool=name, digest=args_digest(name, args), principal=ctx.principal)
        except StoreUnavailable as e:
            raise _unavailable(e) from None
        except StateTooLarge as e:
            _log.warning("suspension of %s refused: %s", name, e)
            return {"content": [{"type": "text", "text": f"{e.code}: {e}"}], "isError": True}
        return {
            "resultType": "input_required",
            "inputRequests": {wire: q["request"] for wire, q in state["pending"].items()},
            "requestState": token,
        }


def _unavailable(exc: StoreUnavailable) -> MCPError:
    """A store that cannot answer is the server's trouble, not the caller's: an internal error naming it;
    the client can send the same request again once the store is back."""
    return _mcp.MCPError(code=INTERNAL_ERROR, message=f"{exc}; try again", data={"reason": "store_unavailable"})


def _dump(model: Any) -> Any:
    dump = getattr(model, "model_dump", None)
    return dump(by_alias=True, mode="json", exclude_none=True) if dump is not None else model


_TYPES: dict[str, tuple[str, str]] = {
    "elicitation/create": ("ElicitRequest", "ElicitResult"),
    "sampling/createMessage": ("CreateMessageRequest", "CreateMessageResult"),
    "roots/list": ("ListRootsRequest", "ListRootsResult"),
}


def session_sender(session: Any, request_id: Any) -> Callable[[str, dict[str, Any] | None], Awaitable[dict[str, Any]]]:
    """A 2025-11-25 ``send``: a request to the client on the inbound request's stream; its result as JSON."""
    import mcp_types
    from mcp.shared.message import ServerMessageMetadata

    async def send(method: str, params: Mapping[str, object] | None) -> dict[str, Any]:
        req_name, res_name = _TYPES[method]
        if method == "sampling/createMessage" and params is not None and params.get("tools"):
            res_name = "CreateMessageResultWithTools"  # a sampling with tools may answer tool_use blocks
        body: dict[str, Any] = {"method": method}
        if params is not None:
            body["params"] = params
        request = getattr(mcp_types, req_name).model_validate(body, by_name=False)
        result = await session.send_request(
            request, getattr(mcp_types, res_name), metadata=ServerMessageMetadata(related_request_id=request_id)
        )
        return _dump(result)  # type: ignore[no-any-return]

    return send


async def sdk_call(
    handlers: Any, ctx: Any, params: Any, tctx: ToolContext, *, escalate: EscalateFn | None = None
) -> dict[str, Any]:
    """A ``tools/call`` that came through the SDK (``ctx`` its request context, ``params`` the typed
    params), answered through ``handlers.call`` with asking wired in (``escalate``: see
    :meth:`Interactions.call`)."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    session = ctx.session
    responses = params.input_responses
    return await handlers.interactions.call(
        handlers.call,
        params.name,
        params.arguments or {},
        tctx,
        modern=modern,
        capabilities=session.client_capabilities,
        send=None if modern else session_sender(session, ctx.request_id),
        state=params.request_state,
        responses={k: _dump(v) for k, v in responses.items()} if responses else None,
        escalate=escalate if modern else None,
    )
