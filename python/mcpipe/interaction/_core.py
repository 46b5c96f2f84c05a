"""Asking the client from inside a pipeline, in both protocol eras.

One :class:`Interaction` serves one inbound ``tools/call``; the server puts it in the call's
``ToolContext.interaction``, where steps that ask (``elicitation``, ``sampling``, ``roots_list``,
``gather``, and the ``ask_user``/``sample``/``list_roots`` tools) and the scheduler find it.

- **2025-11-25**: :meth:`Interaction.ask` sends the request over the live session and waits for the answer
  (under the step's deadline; cancelling the call cancels the wait).
- **2026-07-28**: a step whose answer is not yet known registers its question in :attr:`pending` and raises
  :class:`Suspended`. The scheduler lets the other branches of a parallel group finish first (so one round
  can carry the questions of several branches), records every finished leaf step in :attr:`memo`, and the
  server answers an input-required result. On the client's retry the memo and the answers come back, the
  pipeline runs again from the top, finished steps answer from the memo without running, and the asking
  step finds its answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import trio

from mcpipe.tools import ToolContext

__all__ = [
    "CAPABILITY_OF",
    "METHOD_OF",
    "SKIPPED",
    "AskFailed",
    "CapabilityMissing",
    "Interaction",
    "Suspended",
    "fits",
    "interaction_of",
    "only",
]

METHOD_OF = {"elicitation": "elicitation/create", "sampling": "sampling/createMessage", "roots": "roots/list"}
"""The MCP request of each kind of question."""

CAPABILITY_OF = {"elicitation": "elicitation", "sampling": "sampling", "roots": "roots"}
"""The client capability each kind of question needs."""

SKIPPED: dict[str, Any] = {"skipped": True}
"""The answer of a question skipped because the client cannot answer it (``skip_if_unsupported``)."""

SendFn = Callable[[str, dict[str, Any] | None], Awaitable[dict[str, Any]]]


class Suspended(BaseException):
    """The pipeline waits for answers from a 2026-07-28 client (its questions are in ``pending``).

    A ``BaseException`` so that no ``except Exception`` on the way up turns it into a step failure; it is
    not a failure, and the server turns it into an input-required result.
    """

    suspends_pipeline = True


class Escalated(BaseException):
    """A call that asks its client before it becomes a task (a declared pipeline with ``ask_before_task``)
    reached its first step that is neither a question nor a local step: the call becomes an MCP task there,
    resuming after the steps it has finished (:mod:`mcpipe.server._tasks`).

    It suspends the pipeline like :class:`Suspended` (parallel siblings still ask their questions; a round
    with questions asks them first, and the call becomes a task on the round that brings the answers).
    """

    suspends_pipeline = True


SYNC_KINDS = frozenset(
    {"elicitation", "sampling", "roots_list", "gather", "transform", "value", "log", "cel_gate", "progress", "mock"}
)
"""The step kinds an ``ask_before_task`` call runs before it becomes a task: the questions, and the local
steps that only compute or tell the client (any other kind reaches out, and runs in the task)."""


class CapabilityMissing(BaseException):
    """A 2026-07-28 client did not declare the capability a question needs: the whole request fails with
    JSON-RPC -32021 (nothing is asked)."""

    def __init__(self, capability: str, message: str) -> None:
        super().__init__(message)
        self.capability = capability


class AskFailed(Exception):
    """A question could not be asked or was refused (2025-11-25: no capability, the client's error)."""


_E = TypeVar("_E", bound=BaseException)


def only(exc: BaseException, cls: type[_E]) -> _E | None:
    """``exc`` if it is a ``cls``, or the first ``cls`` of a group made only of those (a nursery on the way
    up wraps what its children raise); else None."""
    if isinstance(exc, cls):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(cls)
        if rest is None and matched is not None:
            first: _E | BaseExceptionGroup[_E] = matched
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            return first
    return None


def interaction_of(ctx: ToolContext) -> Interaction | None:
    """The call's Interaction, or None (not served over MCP: nobody to ask)."""
    ix = ctx.interaction
    return ix if isinstance(ix, Interaction) else None


class _Round:
    __slots__ = ("answers", "memo", "pending", "relayed")

    def __init__(self, memo: dict[str, Any], answers: dict[str, Any], relayed: dict[str, Any]) -> None:
        self.memo = memo
        self.answers = answers
        self.pending: dict[str, dict[str, Any]] = {}
        self.relayed = relayed


class Interaction:
    """How one call asks its client.

    Args:
        modern: True for 2026-07-28 (suspend and resume), False for 2025-11-25 (ask over the session).
        capabilities: the client's declared capabilities (wire JSON, or the SDK's ``ClientCapabilities``), or
            None.
        send: 2025-11-25 only: sends ``(method, params)`` to the client and answers its result (wire JSON).
        memo: finished leaf step results by key, from the state of an earlier round.
        answers: the client's answers by question key, from this retry (and earlier partial retries).
        relayed: the questions downstream servers asked in an earlier round, with their ``requestState``, by
            the key of the step that called them (:mod:`mcpipe.interaction._relay`).
        until_work: the call asks its client before it becomes a task: its first step of a kind outside
            :data:`SYNC_KINDS` raises :class:`Escalated` instead of running.
    """

    __slots__ = ("_round", "capabilities", "modern", "ns", "offered", "send", "until_work")

    def __init__(
        self,
        *,
        modern: bool,
        capabilities: object,
        send: SendFn | None = None,
        memo: dict[str, Any] | None = None,
        answers: dict[str, Any] | None = None,
        relayed: dict[str, Any] | None = None,
        ns: str = "",
        until_work: bool = False,
        _round: _Round | None = None,
    ) -> None:
        self.modern = modern
        self.until_work = until_work
        self.capabilities = capabilities or {}
        self.send = send
        self.ns = ns
        # Answers a 2026-07-28 client sent with no requestState: nothing of mcpipe's asked them, so only a
        # downstream tool called directly may take them (see mcpipe.interaction._relay).
        self.offered: dict[str, Any] = {}
        self._round = _round if _round is not None else _Round(memo or {}, answers or {}, relayed or {})

    @property
    def memo(self) -> dict[str, Any]:
        return self._round.memo

    @property
    def answers(self) -> dict[str, Any]:
        return self._round.answers

    @property
    def relayed(self) -> dict[str, Any]:
        """Downstream questions waiting for this client's answers: step key -> ``{"state", "requests"}``."""
        return self._round.relayed

    @property
    def pending(self) -> dict[str, dict[str, Any]]:
        """Questions of this round: wire key -> ``{"key", "kind", "request"}``."""
        return self._round.pending

    # --- the scheduler's side: finished steps ---

    @property
    def resumable(self) -> bool:
        """Whether finished steps are recorded (2026-07-28: a later round must not run them again)."""
        return self.modern

    def nested(self, ctx: ToolContext) -> ToolContext:
        """The context of a pipeline run inside step ``ctx.step`` (a declared pipeline called by a step):
        its steps are keyed under that step, so they never collide with the caller's."""
        inner = Interaction(
            modern=self.modern,
            capabilities=self.capabilities,
            send=self.send,
            ns=f"{self.ns}{ctx.step}/",
            until_work=self.until_work,
            _round=self._round,
        )
        return replace(ctx, request=replace(ctx.request, interaction=inner))

    def get(self, path: str) -> dict[str, Any] | None:
        """The recorded result of the step at ``path``, if it finished in an earlier round."""
        return self._round.memo.get(self.ns + path)

    def put(self, path: str, result: dict[str, Any]) -> None:
        """Record a finished step."""
        self._round.memo[self.ns + path] = result

    @property
    def durable(self) -> bool:
        """A round's record lives in this call (and then in its sealed state), never saved between steps;
        true only to hear of each step before it starts (:attr:`until_work`)."""
        return self.until_work

    async def starting(self, path: str, kind: str, detail: dict[str, Any] | None = None) -> None:
        """Nothing to save; with :attr:`until_work`, a step of a kind outside :data:`SYNC_KINDS` stops the
        call there (:class:`Escalated`: it becomes a task)."""
        await trio.lowlevel.checkpoint()
        if self.until_work and kind not in SYNC_KINDS:
            raise Escalated()

    async def keep(self, path: str, value: dict[str, Any]) -> None:
        """Record a side effect's result with the finished steps (sealed with them in the state)."""
        self._round.memo[self.ns + path] = value
        await trio.lowlevel.checkpoint()

    # --- the asking side ---

    def supports(self, kind: str) -> bool:
        """Whether the client declared the capability ``kind`` needs (capabilities as wire JSON or the SDK's
        model, which is read without dumping it on every call)."""
        caps = self.capabilities
        name = CAPABILITY_OF[kind]
        return (caps.get(name) if isinstance(caps, dict) else getattr(caps, name, None)) is not None

    def key(self, ctx: ToolContext, fallback: str) -> str:
        """The question key of the step (or tool call) ``ctx`` belongs to."""
        return self.ns + (ctx.step or fallback)

    def _unsupported(self, kind: str, skip: bool) -> dict[str, Any]:
        if skip:
            return SKIPPED
        cap = CAPABILITY_OF[kind]
        message = f"the client did not declare the `{cap}` capability, so it cannot be asked ({METHOD_OF[kind]})"
        if self.modern:
            raise CapabilityMissing(cap, message)
        raise AskFailed(message)

    async def ask(self, key: str, kind: str, params: dict[str, Any] | None, *, skip: bool = False) -> dict[str, Any]:
        """Ask one question and answer the client's result (wire JSON), or :data:`SKIPPED`.

        Raises:
            Suspended: 2026-07-28, no answer yet (the question is now pending).
            CapabilityMissing: 2026-07-28, the client lacks the capability and ``skip`` is false.
            AskFailed: 2025-11-25, the client lacks the capability, or refused.
        """
        return (await self.ask_many(key, [(None, kind, params, skip)]))[None]  # type: ignore[index]

    async def ask_many(
        self,
        key: str,
        questions: list[tuple[str | None, str, dict[str, Any] | None, bool]],
        *,
        keyed: bool = False,
    ) -> dict[str | None, dict[str, Any]]:
        """Ask several questions in one round: ``(token, kind, params, skip)`` each; answers by token.

        Capabilities are checked for every question before any is asked. With ``keyed``, a token's wire key
        is always ``key.token`` (the bare token when ``key`` is empty), never shortened.
        """
        answers: dict[str | None, dict[str, Any]] = {}
        asked = []
        for token, kind, params, skip in questions:
            if not self.supports(kind):
                answers[token] = self._unsupported(kind, skip)
            else:
                asked.append((token, kind, params))
        if not asked:
            await trio.lowlevel.checkpoint()
            return answers
        if not self.modern:
            await self._send_all(asked, answers)
            return answers
        r = self._round
        missing = []
        for token, kind, params in asked:
            qkey = key if token is None else f"{key}#{token}"
            answer = r.answers.get(qkey)
            if answer is not None and fits(kind, answer):
                answers[token] = answer
            else:
                missing.append((token, kind, params, qkey))
        if not missing:
            await trio.lowlevel.checkpoint()
            for token, _kind, _params in asked:
                r.answers.pop(key if token is None else f"{key}#{token}", None)
            return answers
        for token, kind, params, qkey in missing:
            wire = (
                (f"{key}.{token}" if key else str(token)) if keyed and token is not None else self._wire_key(key, token)
            )
            request: dict[str, Any] = {"method": METHOD_OF[kind]}
            if params is not None:
                request["params"] = params
            r.pending[wire] = {"key": qkey, "kind": kind, "request": request}
        raise Suspended()

    def _wire_key(self, key: str, token: str | None) -> str:
        # Questions are keyed by step id (a top-level step) and, in a gather, by correlation token; a nested
        # step or a colliding token keeps its full path so keys stay unique within a round.
        if token is None:
            return key
        plain = "/" not in key and "." not in key and token not in self._round.pending
        return token if plain else f"{key}.{token}"

    async def _send_all(
        self, asked: list[tuple[str | None, str, dict[str, Any] | None]], answers: dict[str | None, dict[str, Any]]
    ) -> None:
        send = self.send
        if send is None:
            raise AskFailed("this call has no session to send requests to the client on")

        async def one(token: str | None, kind: str, params: dict[str, Any] | None) -> None:
            try:
                answers[token] = await send(METHOD_OF[kind], params)
            except trio.Cancelled:
                raise
            except Exception as e:
                raise AskFailed(f"the client did not answer {METHOD_OF[kind]}: {e}") from e

        if len(asked) == 1:
            await one(*asked[0])
            return
        try:
            async with trio.open_nursery() as nursery:
                for item in asked:
                    nursery.start_soon(one, *item)
        except BaseExceptionGroup as group:
            failed = only(group, AskFailed)
            if failed is None:
                raise
            raise failed from None


def fits(kind: str, answer: object) -> bool:
    """Whether an answer has the shape of its question's result (else it is asked again)."""
    if not isinstance(answer, dict):
        return False
    if kind == "elicitation":
        return answer.get("action") in ("accept", "decline", "cancel")
    if kind == "sampling":
        return "content" in answer
    return isinstance(answer.get("roots"), list)
