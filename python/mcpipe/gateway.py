"""The one call path: every tool call, direct or from a pipeline step, goes through :class:`Gateway`.

The gateway is what the scheduler sees as its registry (``get``, ``allows``, ``call``, ``in``), so a
pipeline step is authorized, audited and costed exactly like a direct ``tools/call`` (contract section 8):

- **auth**: a principal may call a tool when one of its patterns matches the tool's name (``*`` matches
  every tool, ``github.*`` every tool of one server). No principal (stdio, or HTTP without ``auth``)
  means a trusted local caller: everything is allowed.
- **audit**: one JSON Lines record per call: time, principal, tool, ok, error code, duration, cost, the
  pipeline (and step) it belonged to, the request id.
- **cost**: the configured cost of a tool is charged when the tool ran to completion (an ``isError``
  result included); calls refused, cancelled or failed before answering cost nothing. ``mcp_pipe`` itself
  costs 0; its steps are charged as the calls they are.
"""

from __future__ import annotations

import inspect
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from mcpipe import telemetry
from mcpipe._audit import MAX_AUDITED_NAME, AuditLog
from mcpipe._describe import did_you_mean
from mcpipe._util import PIPE_TOOL, glob_matcher, is_cancellation, is_suspension
from mcpipe.access import GateDenied, GateRefusal, Gates, Scopes, missing_scopes, scope_message
from mcpipe.errors import ErrorCode, MCPipeError
from mcpipe.tools import FunctionTool, Tool, ToolContext, ToolResult
from mcpipe.toolset import ToolsConfig, Toolset
from mcpipe.trust import Trust, TrustDenied

__all__ = [
    "PIPE_TOOL",
    "AuditLog",
    "CallError",
    "Gateway",
    "Policy",
    "ToolSource",
    "is_cancellation",
    "is_suspension",
]


_log = logging.getLogger("mcpipe.gateway")


class CallError(MCPipeError):
    """A call that failed before or instead of answering (the server of the tool is down, for instance).

    The scheduler reports it as ``TOOL_FAILED`` with this message; a direct call answers it as an
    ``isError`` result.
    """

    code: str = ErrorCode.TOOL_FAILED


class ToolSource(Protocol):
    """Where tools come from: a ToolRegistry, or the downstream servers. Lookup and listing are all it takes."""

    def get(self, name: str) -> Tool | None: ...

    def __iter__(self) -> Iterator[Tool]: ...


class Policy:
    """Which principal may call which tools.

    Args:
        grants: principal -> tool-name patterns (``*`` globs).
        others: the patterns of principals ``grants`` does not name (callers identified by an OIDC issuer or
            a client certificate, ``[auth] tools``); None: such a principal may call nothing.
    """

    def __init__(self, grants: dict[str, list[str]] | None = None, others: list[str] | None = None) -> None:
        self._matchers = {p: glob_matcher(pats) for p, pats in (grants or {}).items()}
        self._others = glob_matcher(others) if others is not None else None

    def allows(self, principal: str | None, tool: str) -> bool:
        if principal is None:
            return True
        m = self._matchers.get(principal, self._others)
        return m is not None and m(tool)


_INLINE_DEPTH = 4
"""How deeply declared pipelines calling declared pipelines are followed to find that a call never yields."""

_second: tuple[int, str] = (-1, "")
"""The last second an audit time was written in, and its text up to the milliseconds."""
_milli: tuple[int, str] = (-1, "")
"""The last millisecond an audit time was written in, and its text."""


def _now() -> str:
    """The audit time, ``2026-12-04T19:02:39.123Z``: made once a millisecond (a pipeline writes a record per
    step, several within one), its date and time once a second."""
    global _second, _milli
    ms = time.time_ns() // 1_000_000
    if ms == _milli[0]:
        return _milli[1]
    whole = ms // 1000
    if whole != _second[0]:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    _milli = (ms, f"{_second[1]}.{ms % 1000:03d}Z")
    return _milli[1]


@dataclass(slots=True)
class _Tally:
    calls: int = 0
    cost: float = 0.0


class Gateway:
    """Auth, audit and cost accounting around a set of tool sources.

    Looks like a registry to the scheduler: ``get``, ``in``, iteration, ``allows`` and ``call``.

    Args:
        sources: tool sources, looked up in order (the first one that knows a name wins).
        policy: who may call what.
        costs: tool name or ``*``-pattern -> cost per completed call.
        audit: where records go.
        ready: awaited with the name before a call that names an unknown tool, and with None before listing
            (lazy downstream servers connect in it); None when nothing is lazy.
        trust: trust levels and per-tool rules (:mod:`mcpipe.trust`), or None.
        gates: what every call passes after the permission check (``[access]``: Cedar policies, rate limits,
            client-address allowlists); a refusal is audited and answered like a forbidden call.
        scopes: the OAuth scopes tools need (``[[auth.scopes]]``): a call needs the scopes of its tool and of
            every tool that tool reaches (a declared pipeline's steps), checked before anything runs.
        tools: the operator's view of the tools (``[tools]``: reshaped tools, hidden ones, search mode); what it
            makes of a tool is what every caller lists, calls, is granted and is audited as.
    """

    def __init__(
        self,
        sources: list[ToolSource],
        *,
        policy: Policy | None = None,
        costs: dict[str, float] | None = None,
        audit: AuditLog | None = None,
        ready: Callable[[str | None], Awaitable[None]] | None = None,
        trust: Trust | None = None,
        gates: Gates | None = None,
        refusals: str = "result",
        scopes: Scopes | None = None,
        tools: ToolsConfig | None = None,
    ) -> None:
        self.sources = sources
        shaping = tools is not None and (tools.reshape or tools.hide or tools.discovery != "list")
        self.view: Toolset | None = Toolset(tools, self._find) if tools is not None and shaping else None
        self.trust = trust
        self.scopes = scopes if scopes else None
        self._needs: dict[str, tuple[object, tuple[str, ...]]] = {}
        self.policy = policy or Policy()
        self.gates = gates if gates else None
        self.refusals_as_errors = refusals == "error"
        self.audit = audit or AuditLog(None)
        costs = dict(costs or {})
        costs.pop(PIPE_TOOL, None)
        self._exact_costs = {k: v for k, v in costs.items() if "*" not in k}
        self._pattern_costs = [(glob_matcher([k]), v) for k, v in costs.items() if "*" in k]
        self._cost_cache: dict[str, float] = {}
        self.totals: defaultdict[str | None, _Tally] = defaultdict(_Tally)
        self._ready = ready
        self._inline: dict[str, tuple[Tool, tuple[tuple[str, Tool], ...] | None]] = {}

    # -- the registry surface the scheduler uses ---------------------------------------------------

    def get(self, name: str) -> Tool | None:
        view = self.view
        if view is not None:
            shaped = view.shaped.get(name)
            if shaped is not None:
                shaped.sync()
                return shaped
            if view.hides(name):
                return None
        return self._find(name)

    def _find(self, name: str) -> Tool | None:
        """The sources' own tool of that name (a reshaped tool's original, hidden or not)."""
        for source in self.sources:
            tool = source.get(name)
            if tool is not None:
                return tool
        return None

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is a tool: one a source serves, or one of a server that is not up yet (a call
        of it says the server is unavailable, not that the tool is unknown)."""
        return isinstance(name, str) and (self.get(name) is not None or self._unavailable(name) is not None)

    def _unavailable(self, name: str) -> str | None:
        for source in self.sources:
            why = getattr(source, "why_unknown", None)
            reason = why(name) if why is not None else None
            if reason is not None:
                return reason
        return None

    def __iter__(self) -> Iterator[Tool]:
        seen: set[str] = set()
        view = self.view
        if view is not None:
            for shaped in view.shaped.values():
                if shaped.sync() is not None:
                    seen.add(shaped.name)
                    yield shaped
        for source in self.sources:
            for tool in source:
                if tool.name not in seen:
                    seen.add(tool.name)
                    if view is None or not view.hides(tool.name):
                        yield tool

    def allows(self, name: str, ctx: ToolContext) -> bool:
        if not self.policy.allows(ctx.principal, name):
            return False
        if self.trust is not None and not self.trust.visible(name, ctx):
            return False
        return not self.missing_scopes(name, ctx)

    def denial(self, name: str, ctx: ToolContext) -> str | None:
        """Why the caller may not call ``name`` (None: it may), naming the scopes its token lacks."""
        if not self.policy.allows(ctx.principal, name):
            return f"tool '{name}' is not allowed for this caller"
        if self.trust is not None:
            try:
                self.trust.check(name, ctx)
            except TrustDenied as exc:
                return str(exc)
        missing = self.missing_scopes(name, ctx)
        if missing:
            return _scope_message(name, missing)
        return None

    # -- scopes -------------------------------------------------------------------------------------

    def needed_scopes(self, name: str) -> tuple[str, ...]:
        """The OAuth scopes a call of ``name`` needs: the ``[[auth.scopes]]`` rules' and the trust rule's
        ``required_scopes`` of it and of every tool it reaches (a declared pipeline's or a playbook's
        steps, transitively)."""
        if self.scopes is None and self.trust is None:
            return ()
        tool = self.get(name)
        hit = self._needs.get(name)
        if hit is not None and hit[0] is tool:
            return hit[1]
        found: dict[str, None] = {}
        seen: set[str] = set()
        todo = [name]
        while todo and len(seen) < 10_000:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            found.update(dict.fromkeys(self._own_scopes(current)))
            reached = self.get(current)
            todo.extend(n for n in _reaches(reached) if n not in seen)
        needed = tuple(found)
        if len(self._needs) >= 65_536:
            self._needs.clear()
        self._needs[name] = (tool, needed)
        return needed

    def _own_scopes(self, name: str) -> tuple[str, ...]:
        own = self.scopes.needed("tool", name) if self.scopes is not None else ()
        rule = self.trust.rule(name) if self.trust is not None else None
        if rule is not None and rule.required_scopes:
            own = tuple(dict.fromkeys((*own, *rule.required_scopes)))
        return own

    def scoped(self, ctx: ToolContext) -> bool:
        """Whether scope rules apply to the caller: an identified one (HTTP with auth), or anyone once trust
        levels are configured. A local caller (stdio, in memory, HTTP without auth) is trusted."""
        return ctx.identity is not None or self.trust is not None

    def missing_scopes(self, name: str, ctx: ToolContext) -> tuple[str, ...]:
        """The scopes a call of ``name`` needs that the caller's token lacks."""
        if (self.scopes is None and self.trust is None) or not self.scoped(ctx):
            return ()
        needed = self.needed_scopes(name)
        if not needed:
            return ()
        identity = ctx.identity
        return missing_scopes(needed, identity.scopes if identity is not None else ())

    def surface_scopes(self, kind: str, name: str, ctx: ToolContext) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(needed, missing)``: the OAuth scopes a ``prompt`` (by its listed name) or a ``resource`` (by URI; a
        resource template by its URI template) needs by the ``[[auth.scopes]]`` rules, and those the caller's
        token lacks; ``((), ())`` for a caller scope rules do not apply to (:meth:`scoped`)."""
        if self.scopes is None or not self.scoped(ctx):
            return (), ()
        needed = self.scopes.needed(kind, name)
        if not needed:
            return (), ()
        identity = ctx.identity
        return needed, missing_scopes(needed, identity.scopes if identity is not None else ())

    def cost_of(self, name: str) -> float:
        cost = self._cost_cache.get(name)
        if cost is None:
            cost = self._exact_costs.get(name)
            if cost is None:
                cost = next((v for m, v in self._pattern_costs if m(name)), 0.0)
            self._cost_cache[name] = cost
        return cost

    def inline_calls(self, tool: Tool) -> tuple[tuple[str, Tool], ...] | None:
        """The tools (name, tool) a call of ``tool`` calls when none of them yields, so that the call yields only
        at its runs' checkpoints: () for a synchronous Python function; for a declared pipeline whose steps only
        call tools (``inline_tools``), its steps' tools and theirs, 4 deep. None when it may yield.

        Known once per tool, and found again whenever one of these names resolves to another tool. What the
        lean HTTP front runs inline (``mcpipe.server._fast``), and a call whose steps' audit records are
        written together (:meth:`invoke`)."""
        hit = self._inline.get(tool.name)
        if hit is not None and hit[0] is tool:
            calls = hit[1]
            if calls is None:
                return None
            for name, known in calls:
                if self.get(name) is not known:
                    break
            else:
                return calls
        calls = self._inline_calls(tool, 0)
        self._inline[tool.name] = (tool, calls)
        return calls

    def _inline_calls(self, tool: Tool, depth: int) -> tuple[tuple[str, Tool], ...] | None:
        if isinstance(tool, FunctionTool):
            return None if inspect.iscoroutinefunction(tool.fn) else ()
        inline = getattr(tool, "inline_tools", None)
        names = inline() if inline is not None and depth < _INLINE_DEPTH else None
        if names is None:
            return None
        calls: list[tuple[str, Tool]] = []
        for step_tool in dict.fromkeys(names):
            found = self.get(step_tool)
            if found is None:
                return None
            below = self._inline_calls(found, depth + 1)
            if below is None:
                return None
            calls += [(step_tool, found), *below]
        return tuple(calls)

    async def ready(self) -> None:
        """Wait until lazily connected downstream servers have had their first chance to connect."""
        if self._ready is not None:
            await self._ready(None)

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Call a tool through the one path: check, run, audit, charge.

        Raises:
            CallError: the tool is unknown or not allowed (a direct caller turns this into an error result;
                the scheduler checks both before any step runs), or its server is down.
            Exception: whatever the tool raised (audited as ``TOOL_FAILED`` first).
        """
        t0 = time.perf_counter()
        tool = self.get(name)
        if tool is None and self._ready is not None:
            await self._ready(name)
            tool = self.get(name)
        if tool is None:
            reason = self._unavailable(name)
            if reason is not None:
                self._record(ctx, name, False, ErrorCode.TOOL_FAILED, t0, 0.0)
                raise CallError(reason)
            # The name is the caller's, as long as a request: the audit keeps its start (a 3 MB name wrote a
            # 3 MB audit line per call).
            self._record(ctx, name[:MAX_AUDITED_NAME], False, ErrorCode.UNKNOWN_TOOL, t0, 0.0)
            hint = did_you_mean(name, (t.name for t in self if self.allows(t.name, ctx)))  # only what it may call
            raise _Refused(ErrorCode.UNKNOWN_TOOL, f"unknown tool '{name}'{hint}")
        return await self.invoke(tool, args, ctx, t0)

    async def invoke(self, tool: Tool, args: dict[str, Any], ctx: ToolContext, t0: float | None = None) -> ToolResult:
        """Call ``tool`` (found by :meth:`call`, or a pipeline served as a prompt or resource) through the same
        checks, audit and charge.

        Raises:
            CallError: the principal may not call it.
            mcpipe.trust.TrustDenied: the trust rules refuse the caller.
        """
        t0 = time.perf_counter() if t0 is None else t0
        name = tool.name
        if not self.policy.allows(ctx.principal, name):
            self._record(ctx, name, False, ErrorCode.FORBIDDEN, t0, 0.0)
            raise _Refused(ErrorCode.FORBIDDEN, f"principal '{ctx.principal}' may not call '{name}'")
        if self.trust is not None:
            try:
                self.trust.check(name, ctx)
            except TrustDenied:
                self._record(ctx, name, False, ErrorCode.FORBIDDEN, t0, 0.0)
                raise
        if self.scopes is not None or self.trust is not None:
            missing = self.missing_scopes(name, ctx)
            if missing:
                self._record(ctx, name, False, ErrorCode.FORBIDDEN, t0, 0.0)
                raise _Refused(ErrorCode.FORBIDDEN, _scope_message(name, missing))
        audit = self.audit
        if self.gates is not None or type(audit).allowed is not AuditLog.allowed:  # else both do nothing
            audit.allowed(ctx, name, self._admit(name, args, ctx, t0))
        if ctx.tools is None:
            # What a tool that runs a pipeline (a declared pipeline) calls its steps' tools through.
            ctx = replace(ctx, tools=self)
        tel = telemetry.current()
        # A call that does not yield and calls other tools (a declared pipeline of synchronous tools) writes
        # its steps' records with its own, in one write: nothing else can write between them.
        held = None if type(tool) is FunctionTool or not self.inline_calls(tool) else audit.hold()
        try:
            try:
                if tel is None or tel.tracer is None or ctx.step is None:
                    result = await tool.call(args, ctx)
                elif isinstance(tool, FunctionTool):  # no traced calls of its own: its span is recorded once it ends
                    started = time.time_ns()
                    try:
                        result = await tool.call(args, ctx)
                    except BaseException as exc:
                        tel.step_ended(ctx.step, name, started, exc)
                        raise
                    tel.step_ended(ctx.step, name, started, result.is_error)
                else:  # its span is the current one while it runs: the parent of its downstream calls' spans
                    with tel.step_span(ctx.step, name, current=True) as span:
                        result = await tool.call(args, ctx)
                        if result.is_error:
                            span.set_status(tel.error)
            except BaseException as exc:
                self._record(ctx, name, False, _failure_code(exc), t0, 0.0)
                raise
            cost = self.cost_of(name)
            self._record(ctx, name, not result.is_error, ErrorCode.TOOL_ERROR if result.is_error else None, t0, cost)
        finally:
            if held is not None:
                audit.release(held)
        return result

    def admit(self, name: str, args: Mapping[str, object], ctx: ToolContext) -> None:
        """Run the gates for a call the gateway does not make itself (``mcp_pipe``, whose steps are calls).

        Raises:
            CallError: a gate refused it (audited; ``code`` is ``FORBIDDEN`` or ``LIMIT_EXCEEDED``).
        """
        self._admit(name, args, ctx, time.perf_counter())

    def _admit(self, name: str, args: Mapping[str, object], ctx: ToolContext, t0: float) -> list[Any]:
        if self.gates is None:
            return []
        try:
            return self.gates.admit(name, args, ctx)
        except GateRefusal as refusal:
            self._record(ctx, name, False, refusal.code, t0, 0.0, gate=refusal.gate)
            if self.refusals_as_errors:
                raise GateDenied(refusal) from None
            raise _Refused(refusal.code, str(refusal)) from None

    def record_pipe(self, ctx: ToolContext, pipeline: str, answer: dict[str, Any], t0: float) -> None:
        """Audit one ``mcp_pipe`` call (cost 0) with the answer's outcome."""
        self._record(ctx, PIPE_TOOL, bool(answer.get("ok")), answer.get("error_code"), t0, 0.0, pipeline=pipeline)

    def _record(
        self,
        ctx: ToolContext,
        tool: str,
        ok: bool,
        code: str | None,
        t0: float,
        cost: float,
        *,
        pipeline: str | None = None,
        gate: str | None = None,
    ) -> None:
        if cost:
            tally = self.totals[ctx.principal]
            tally.calls += 1
            tally.cost += cost
        record = {
            "ts": _now(),
            "principal": ctx.principal,
            "tool": tool,
            "ok": ok,
            "error_code": code,
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
            "cost": cost,
            "pipeline": pipeline if pipeline is not None else ctx.pipeline,
            "step": ctx.step,
            "request_id": ctx.request_id,
        }
        if gate is not None:
            record["gate"] = gate
        self.audit.write(record, ctx)


def _scope_message(name: str, missing: tuple[str, ...]) -> str:
    return scope_message("tool", name, missing)


def _reaches(tool: object) -> tuple[str, ...]:
    """The names of the tools a tool calls when it runs (a plan's tool steps: ``PlanTool.reaches``)."""
    if tool is None:
        return ()
    reaches = getattr(tool, "reaches", None)
    if reaches is not None:
        return tuple(reaches)
    sites = getattr(getattr(tool, "compiled", None), "tool_sites", None)
    return tuple(name for _, name in sites) if sites else ()


def _failure_code(exc: BaseException) -> str:
    if is_cancellation(exc):
        return ErrorCode.CANCELLED
    if is_suspension(exc):
        return ErrorCode.SUSPENDED
    code = getattr(exc, "code", None) if isinstance(exc, MCPipeError) else None
    return code if code and code != ErrorCode.INTERNAL else ErrorCode.TOOL_FAILED


class _Refused(CallError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def new_pipeline_id() -> str:
    """A short unique id for one pipeline run (it links the step records to the ``mcp_pipe`` record)."""
    return uuid.uuid4().hex[:16]
