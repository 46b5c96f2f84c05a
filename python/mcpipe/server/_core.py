"""The MCP face of a :class:`~mcpipe.gateway.Gateway`: ``tools/list`` and ``tools/call`` on the SDK's
low-level ``Server``, with ``mcp_pipe`` beside every tool the gateway knows. The handlers import no SDK module
at load (``mcpipe serve`` answers before the SDK loads); the SDK server over them is built by
``server/_sdkserver.py``.

Results are built as wire dicts (never SDK models): a tool's :class:`ToolResult` already holds MCP-shaped
content blocks, so the per-call path is a dict literal and one orjson encode for ``mcp_pipe``'s text block.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import trio

from mcpipe import _mcp, telemetry
from mcpipe._json import dumps
from mcpipe.access import GateDenied
from mcpipe.compile import compile_spec_async
from mcpipe.downstream import DownstreamError, Downstreams, DownstreamTool, SignInRequired
from mcpipe.errors import ErrorCode, Problem, SpecError
from mcpipe.gateway import PIPE_TOOL, CallError, Gateway, is_suspension, new_pipeline_id
from mcpipe.interaction import Interactions, sdk_call
from mcpipe.plan import Limits, Pipeline, depth_problem, measure_output, plan_of
from mcpipe.results import AnswerMode, invalid_answer, pipe_envelope
from mcpipe.runs import RUN_TOOL_NAMES, Runs
from mcpipe.runtime import check_pipeline, run_pipeline
from mcpipe.server._context import RequestContext
from mcpipe.server._guide import Guide
from mcpipe.server._passthrough import Passthrough, ScopeCheck, log_allowed
from mcpipe.server._schema import PIPE_DESCRIPTION, PIPE_INPUT_SCHEMA, PIPE_OUTPUT_SCHEMA
from mcpipe.server._tasks import Tasks, declares_tasks, required_error, store_unavailable
from mcpipe.store import RunRefused, StoreUnavailable
from mcpipe.tools import Identity, ProgressFn, Request, Tool, ToolCaller, ToolContext, ToolResult
from mcpipe.trust import TrustDenied

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.lowlevel.server import Server
    from mcp_types import CallToolRequestParams, PaginatedRequestParams

__all__ = [
    "PipeRunner",
    "ToolHandlers",
    "build_server",
    "input_schema",
    "principal_of",
    "tool_context",
    "wire_result",
]

_log = logging.getLogger("mcpipe.server")

PRINCIPAL_SCOPE_KEY = "mcpipe.principal"
"""Where the HTTP auth layer leaves the caller's principal in the ASGI scope."""
IDENTITY_SCOPE_KEY = "mcpipe.identity"
"""Where it leaves the caller's :class:`~mcpipe.tools.Identity`."""
ADDRESSES_SCOPE_KEY = "mcpipe.client_addresses"
"""Where it leaves the caller's address as each ``ip_allowlist`` gate reads it."""


def scope_request(scope: Any, **fields: Any) -> Request:
    """The :class:`~mcpipe.tools.Request` of an HTTP request: what the front found (identity, addresses)."""
    if not isinstance(scope, dict):
        return Request(**fields)
    session = next((v for k, v in scope.get("headers") or () if k == b"mcp-session-id"), None)
    return Request(
        identity=scope.get(IDENTITY_SCOPE_KEY),
        client_addresses=scope.get(ADDRESSES_SCOPE_KEY) or {},
        session_id=session.decode("latin-1") if session else None,
        transport="http",
        **fields,
    )


IDENTITY_SCOPE_KEY = "mcpipe.identity"
"""Where the HTTP front leaves the caller's identity (``ToolContext.identity``)."""

_MODERN = frozenset(_mcp.MODERN_PROTOCOL_VERSIONS)

UNAVAILABLE_META_KEY = "io.github.mcpipe/unavailable"
"""Where a ``tools/list`` result names the downstream servers that are not up, each with why."""


def wire_result(result: ToolResult, era: str | None = None) -> dict[str, Any]:
    """A ToolResult as a ``CallToolResult`` wire dict (non-object structured values wrapped as ``result``,
    but on 2026-07-28, whose ``structuredContent`` may be any JSON value, for a result that says so)."""
    return result.wire(any_json=era == "2026-07-28")


def _error_result(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}


def _refused(name: str, exc: RunRefused, location: str) -> dict[str, Any]:
    """The answer of a call the run queue did not take (the run is too large, or the queue full)."""
    if name == PIPE_TOOL:
        problem = Problem(location, ErrorCode.LIMIT_EXCEEDED, str(exc))
        return pipe_envelope(invalid_answer([problem], time.perf_counter()))
    return _error_result(f"{ErrorCode.LIMIT_EXCEEDED}: {exc}")


def _searching(gateway: Gateway) -> bool:
    """Whether the gateway is in search mode (``[tools] discovery = "search"``)."""
    return gateway.view is not None and gateway.view.search


def tool_wire(tool: Tool) -> dict[str, Any]:
    """A tool's ``tools/list`` entry."""
    entry: dict[str, Any] = {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema}
    title = getattr(tool, "title", None)
    if title:
        entry["title"] = title
    if tool.output_schema is not None:
        entry["outputSchema"] = tool.output_schema
    annotations = getattr(tool, "annotations", None)
    if annotations:
        entry["annotations"] = annotations
    icons = getattr(tool, "icons", None)
    if icons:
        entry["icons"] = icons
    meta = getattr(tool, "meta", None)
    if meta:  # a declared pipeline's `meta`, a downstream tool's `_meta` (MCP Apps' `_meta.ui.resourceUri`, ...)
        entry["_meta"] = meta
    return entry


def pipe_annotations(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """``mcp_pipe``'s annotations from those of the tools its steps may call: read-only (idempotent) when
    they all are, destructive or open-world when any may be (a hint left out means what MCP says:
    not read-only, destructive, not idempotent, open world). The run tools (``pipe_status``, ``pipe_cancel``,
    ...) are left out: they act only on the caller's own background runs, mcpipe's bookkeeping, not on the
    world the hints describe."""
    read_only = idempotent = True
    destructive = open_world = False
    for entry in tools:
        if entry["name"] in RUN_TOOL_NAMES:
            continue
        hints = entry.get("annotations") or {}
        tool_read_only = bool(hints.get("readOnlyHint", False))
        read_only &= tool_read_only
        idempotent &= bool(hints.get("idempotentHint", False))
        destructive |= not tool_read_only and bool(hints.get("destructiveHint", True))
        open_world |= bool(hints.get("openWorldHint", True))
    return {
        "readOnlyHint": read_only,
        "destructiveHint": destructive,
        "idempotentHint": idempotent,
        "openWorldHint": open_world,
    }


PIPE_TOOL_WIRE: dict[str, Any] = {
    "name": PIPE_TOOL,
    "title": "Run a pipeline of tool calls",
    "description": PIPE_DESCRIPTION,
    "inputSchema": PIPE_INPUT_SCHEMA,
    "outputSchema": PIPE_OUTPUT_SCHEMA,
}


def principal_of(ctx: RequestContext, default: str | None) -> str | None:
    request = ctx.request
    if request is None:
        return default
    try:
        return request.scope.get(PRINCIPAL_SCOPE_KEY, default)
    except AttributeError:
        return default


def identity_of(ctx: RequestContext) -> Any:
    """The caller's identity the HTTP front resolved (None: none, e.g. in memory or over stdio)."""
    request = ctx.request
    if request is None:
        return None
    try:
        return request.scope.get(IDENTITY_SCOPE_KEY)
    except AttributeError:
        return None


def _scope_of(ctx: RequestContext) -> Any:
    request = ctx.request
    return getattr(request, "scope", None) if request is not None else None


def _traceparent(ctx: Any) -> str | None:
    """The caller's W3C trace context, from the request's ``_meta``."""
    value = ctx.meta.get("traceparent") if ctx.meta else None
    return value if isinstance(value, str) else None


def tool_context(
    ctx: RequestContext,
    *,
    default_principal: str | None = None,
    log_levels: weakref.WeakKeyDictionary[Any, str] | None = None,
    tools: ToolCaller | None = None,
) -> ToolContext:
    """The ToolContext of one inbound request: who calls, sinks for progress and logs back to them (log
    messages below the level a 2025-11-25 client set in ``log_levels`` are not sent), and the registry its
    pipelines call tools through (``tools``, the gateway)."""
    session = ctx.session
    cp = session.client_params
    info = cp.client_info if cp is not None else None
    client = {"name": info.name, "version": info.version} if info is not None else {}

    async def log(level: str, data: Any, /, logger: str | None = None) -> None:
        if log_levels is not None and not log_allowed(log_levels, ctx, level):
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # logging is deprecated at 2026-07-28, still useful before
            await session.send_log_message(level, data, logger, related_request_id=ctx.request_id)  # type: ignore[arg-type]

    return ToolContext(
        request_id=None if ctx.request_id is None else str(ctx.request_id),
        client=client,
        principal=principal_of(ctx, default_principal),
        progress=session.report_progress,
        log=log,
        progress_token=_progress_token(ctx),
        request=scope_request(_scope_of(ctx), wants_progress=_wants_progress(ctx), sdk_context=ctx),
        tools=tools,
        traceparent=_traceparent(ctx),
    )


def _progress_token(ctx: RequestContext) -> Any:
    meta = ctx.meta
    if not meta:
        return None
    token = meta.get("progressToken")
    return meta.get("progress_token") if token is None else token


def _wants_progress(ctx: RequestContext) -> bool:
    """Whether the caller asked for progress: a token on the wire, or (in memory, through the SDK's
    direct dispatcher) a callback on the request's channel."""
    if _progress_token(ctx) is not None:
        return True
    outbound = getattr(ctx.session, "_request_outbound", None)
    outbound = getattr(outbound, "_inner", outbound)  # the SDK wraps it to refuse server requests at 2026
    return getattr(outbound, "progress_token", None) is not None or getattr(outbound, "_on_progress", None) is not None


class _PipeProgress:
    """Turns scheduler events into strictly increasing progress notifications.

    The value is the number of finished leaf steps; progress a running step forwards from its own tool
    (a downstream server's notifications) moves the value within that step by the share of its total it
    reached (by thousandths when it gives none), never reaching the next integer; values that would not
    increase are not sent, so the sequence stays strictly increasing whatever the interleaving.
    """

    __slots__ = ("_done", "_last", "_sink", "_total")

    def __init__(self, sink: ProgressFn) -> None:
        self._sink = sink
        self._done = 0
        self._last = -1.0
        self._total: float | None = None

    async def _emit(self, value: float, message: str) -> None:
        if value <= self._last:
            return
        self._last = value
        await self._sink(value, self._total, message)

    async def on_event(self, event: dict[str, Any]) -> None:
        total = event.get("total")
        if total is not None:
            self._total = total
        if event.get("type") != "step_finished" or event.get("kind") != "tool":
            return
        self._done = max(self._done, int(event["completed"]))
        status = "ok" if event.get("ok") else event.get("error_code") or "failed"
        await self._emit(float(self._done), f"step {event.get('path')} finished ({status})")

    async def step_progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Progress a running step's tool reported (already prefixed with the step id by the tool): the share of
        its own total it reached moves the value within the step (1/3 of a step after 1 step done: 1.333);
        without a total, by thousandths."""
        if total and total > 0:
            value = self._done + min(max(progress / total, 0.0), 0.999)
        else:
            value = min(max(self._last, self._done) + 0.001, self._done + 0.999)
        text = message or (f"{progress:g}/{total:g}" if total else f"{progress:g}")
        await self._emit(round(value, 3), text)


class PipeRunner:
    """Runs ``mcp_pipe`` calls against a gateway: audit (cost 0), limits, progress.

    Args:
        gateway: the call path every step goes through.
        limits: the server's maxima (a spec cannot raise them).
        runs: where background calls are queued (None: not served).
        answer: what an answer holds when its spec does not say (``pipe.answer``; default ``result``).
    """

    def __init__(
        self, gateway: Gateway, limits: Limits | None = None, *, runs: Runs | None = None, answer: AnswerMode = "result"
    ) -> None:
        self.gateway = gateway
        self.limits = limits or Limits()
        self.runs = runs
        self.answer: AnswerMode = answer

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run one ``mcp_pipe`` call and answer the contract's section-7 object (a background one: its run
        id, at once)."""
        await self.gateway.ready()
        if self.gateway.gates is not None:  # mcp_pipe passes the gates too (its steps do, each as a call)
            try:
                self.gateway.admit(PIPE_TOOL, args if isinstance(args, dict) else {}, ctx)
            except (CallError, GateDenied) as exc:
                return invalid_answer([Problem("", exc.code, str(exc))], time.perf_counter())
        if isinstance(args, dict) and "background" in args:
            return await self.submit(args, ctx)
        pid = new_pipeline_id()
        ctx.pipeline = pid
        t0 = time.perf_counter()
        answer = None
        code: str = ErrorCode.CANCELLED  # no answer means the call was cancelled (the scheduler answers every failure)
        try:
            if ctx.wants_progress:
                answer = await self._run_with_progress(args, ctx)
            else:
                answer = await run_pipeline(args, self.gateway, context=ctx, limits=self.limits, answer=self.answer)
        except BaseException as exc:
            if is_suspension(exc):
                code = ErrorCode.SUSPENDED  # it waits for its client's answers (2026-07-28) and resumes on the retry
                tel = telemetry.current()
                if tel is not None:
                    tel.suspended()
            raise
        finally:
            self.gateway.record_pipe(ctx, pid, answer or {"ok": False, "error_code": code}, t0)
        return answer

    async def submit(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """A ``"background": true`` spec: checked now (a bad one is answered at once, located), then queued;
        answers ``result: {"run_id", "status"}``."""
        t0 = time.perf_counter()
        spec = {k: v for k, v in args.items() if k != "background"}
        background = args["background"]
        if not isinstance(background, bool):
            return invalid_answer(
                [Problem("background", ErrorCode.INVALID_SPEC, f"expected a boolean, got {type(background).__name__}")],
                t0,
            )
        if not background:
            return await self.run(spec, ctx)
        if self.runs is None:
            return invalid_answer(
                [Problem("background", ErrorCode.INVALID_SPEC, "background runs are not served here")], t0
            )
        problems = await self.check(spec, ctx)
        if problems is not None:
            return problems
        try:
            info = await self.runs.submit(PIPE_TOOL, spec, ctx)
        except RunRefused as exc:
            return invalid_answer([Problem("background", ErrorCode.LIMIT_EXCEEDED, str(exc))], t0)
        return {
            "ok": True,
            "error": "",
            "error_code": None,
            "result": {"run_id": info.id, "status": info.status},
            "steps": {},
            "summary": {"total": 0, "succeeded": 0, "failed": 0, "skipped": 0, "cancelled": 0},
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
        }

    async def check(self, spec: Any, ctx: ToolContext) -> dict[str, Any] | None:
        """The answer of a spec with problems (unknown tools, arguments, references, limits, tools ``ctx``'s
        caller may not call, retries of tools not idempotent), or None: it may run. Every check a run makes
        before its first step (:func:`mcpipe.runtime.check_pipeline`), so a queued run is not refused later."""
        t0 = time.perf_counter()
        try:
            await check_pipeline(spec, self.gateway, context=ctx, limits=self.limits)
        except SpecError as e:
            return invalid_answer(e.problems, t0)
        return None

    async def needed_scopes(self, spec: Any) -> tuple[str, ...] | None:
        """The OAuth scopes a spec's run needs (every tool it reaches), or None when it does not compile (its
        call answers the problems)."""
        if isinstance(spec, dict) and isinstance(spec.get("background"), bool):
            spec = {k: v for k, v in spec.items() if k != "background"}
        try:
            compiled = await compile_spec_async(spec, tools=self.gateway, limits=self.limits)
        except SpecError:
            return None
        found: dict[str, None] = {}
        for _, name in compiled.tool_sites:
            found.update(dict.fromkeys(self.gateway.needed_scopes(name)))
        return tuple(found)

    async def _run_with_progress(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        # The scheduler's events arrive synchronously and must not block, and steps' own progress comes
        # from their tasks: both go through one channel to one sender task, so notifications leave in order.
        progress = _PipeProgress(ctx.progress)
        send, recv = trio.open_memory_channel[Any](math.inf)

        async def step_sink(p: float, total: float | None, message: str | None) -> None:
            try:
                send.send_nowait((p, total, message))
            except trio.ClosedResourceError:
                pass  # a straggler from a step that was cancelled as the pipeline ended

        async def pump() -> None:
            async for item in recv:
                if isinstance(item, dict):
                    await progress.on_event(item)
                else:
                    await progress.step_progress(*item)

        outer = ctx.progress
        ctx.progress = step_sink
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
                try:
                    return await run_pipeline(
                        args,
                        self.gateway,
                        context=ctx,
                        limits=self.limits,
                        on_event=send.send_nowait,
                        answer=self.answer,
                    )
                finally:
                    send.close()
        finally:
            ctx.progress = outer


class ToolHandlers:
    """``tools/list`` and ``tools/call`` handlers over a gateway (shared by ``mcpipe serve`` and ``attach``).

    Args:
        gateway: the one call path.
        pipe: the ``mcp_pipe`` runner, or None to serve without ``mcp_pipe``.
        default_principal: the principal of calls that carry none (stdio, in-memory).
        interactions: asking the client (elicitation, sampling, roots): the pipeline store and the
            requestState sealer (default: an in-memory store and a key of this process).
        runs: the run queue's front (background runs), or None.
        tasks: the MCP tasks extension on that queue, or None (not offered).
        downstreams: the downstream servers whose resources, prompts, completion, logging and list changes
            pass through (None: none do).
    """

    def __init__(
        self,
        gateway: Gateway,
        pipe: PipeRunner | None,
        *,
        default_principal: str | None = None,
        interactions: Interactions | None = None,
        runs: Runs | None = None,
        tasks: Tasks | None = None,
        downstreams: Downstreams | None = None,
        limits: Limits | None = None,
        surfaces: list[Any] | None = None,
        caching: Any = None,
        unknown_tool: str = "result",
        apps: Any = None,
        content: Any = None,
    ) -> None:
        self.gateway = gateway
        self.unknown_tool_error = unknown_tool == "error"
        """A call naming no tool is the JSON-RPC error -32602 (``unknown tool: x``), not an error result."""
        self.apps = apps
        """MCP Apps' policy (:class:`mcpipe.server._apps.AppsPolicy`), or None when apps are off."""
        self._strict_left_out: set[str] = set()
        """Downstream tools ``apps.strict`` left out of a listing (each logged once)."""
        self.caching = caching
        """The config's ``caching`` hints (None: mcpipe's own, below)."""
        self.runs = runs
        self.tasks = tasks
        self.pipe = pipe
        # Direct calls obey the pipelines' bounds on nesting and size (docs/reliability.md).
        self.limits = limits if limits is not None else pipe.limits if pipe is not None else Limits()
        self.default_principal = default_principal
        self.interactions = interactions if interactions is not None else Interactions()
        self.passthrough: Passthrough | None = None
        if downstreams is not None:
            # The principal is read per request: `default_principal` may be set after construction.
            self.passthrough = Passthrough(
                downstreams,
                gateway.policy,
                lambda ctx: principal_of(ctx, self.default_principal),
                surfaces=surfaces,
                run_surface=self.run_surface,
                guide=None
                if pipe is None
                else Guide(self._tools_of, self.limits, search=_searching(gateway), pipelines_of=self._pipelines_of),
                caching=caching,
                check_surface=self.check_surface,
                run_hidden=self.run_hidden,
                identity=identity_of,
                apps=apps,
                content=content,
                scopes=self.scopes_of,
            )
        self._in_flight: set[trio.CancelScope] = set()
        self._idle = trio.Event()
        self._idle.set()
        self.shutting_down = False
        # 2025-11-25 sessions the SDK has served, by transport: the client's info and capabilities, which the
        # lean path needs (the entry goes when the SDK drops the session's transport).
        self.legacy_clients: weakref.WeakKeyDictionary[Any, tuple[dict[str, Any], Any, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self.session_transport: Any = None  # session id -> its transport (the HTTP session manager's), or None

    def _remember_client(self, ctx: RequestContext) -> None:
        if self.session_transport is None or ctx.protocol_version in _MODERN or ctx.request is None:
            return
        try:
            sid = ctx.request.headers.get("mcp-session-id")
        except AttributeError:
            return
        transport = self.session_transport(sid) if sid else None
        if transport is not None and transport not in self.legacy_clients:
            session = ctx.session
            cp = session.client_params
            info = cp.client_info if cp is not None else None
            client = {"name": info.name, "version": info.version} if info is not None else {}
            # The connection keys the log level the client set (logging/setLevel), which its calls honour.
            connection = getattr(session, "_connection", session)
            self.legacy_clients[transport] = (client, session.client_capabilities, connection)

    def _tools_of(self, ctx: RequestContext) -> list[dict[str, Any]]:
        """The tools a request's caller may call (the guide's prompt lists them)."""
        return self.visible_tools(principal_of(ctx, self.default_principal), identity_of(ctx))

    def _pipelines_of(self, ctx: RequestContext) -> list[tuple[dict[str, Any], Pipeline]]:
        """The declared pipelines and playbooks a request's caller may call (found by a search too), each with
        its plan: the guide has a resource for each."""
        out = []
        for tool, entry in self._callable(principal_of(ctx, self.default_principal), identity_of(ctx)):
            plan = plan_of(tool)
            if plan is not None:
                out.append((entry, plan))
        return out

    def visible_tools(self, principal: str | None, identity: Identity | None = None) -> list[dict[str, Any]]:
        """The ``tools/list`` entries ``principal`` may see (a downstream tool's ``_meta`` held to MCP Apps'
        policy when apps are on)."""
        return self._listed_tools(principal, identity)

    def _listed_tools(self, principal: str | None, identity: Identity | None = None) -> list[dict[str, Any]]:
        """The visible entries. Under ``apps.strict`` a downstream tool whose ``_meta`` went beyond the policy is
        left out (one log line per tool): one server's tool never takes the others' listing down."""
        tools = [entry for _, entry in self._callable(principal, identity)]
        view = self.gateway.view
        shown = tools if view is None or not view.search else [e for e in tools if view.listed(e["name"])]
        if self.pipe is None:
            return shown
        # mcp_pipe's hints are those of every tool its steps may call, listed or found by a search.
        return [{**PIPE_TOOL_WIRE, "annotations": pipe_annotations(tools)}, *shown]

    def _callable(self, principal: str | None, identity: Identity | None = None) -> list[tuple[Tool, dict[str, Any]]]:
        """The tools ``principal`` may call (but ``mcp_pipe``), listed or found by a search, with their
        ``tools/list`` entries."""
        policy = self.gateway.policy
        trust = self.gateway.trust
        probe = ToolContext(principal=principal, request=Request(identity=identity))
        tools: list[tuple[Tool, dict[str, Any]]] = []
        for t in self.gateway:
            if t.name == PIPE_TOOL or not policy.allows(principal, t.name):
                continue
            if trust is not None and not trust.visible(t.name, probe):
                continue
            if self.gateway.missing_scopes(t.name, probe):
                continue
            entry = tool_wire(t)
            if self.apps is not None and isinstance(t, DownstreamTool):
                refused = self.apps.apply_tool(entry)
                if refused is not None:
                    if t.name not in self._strict_left_out:
                        self._strict_left_out.add(t.name)
                        _log.warning("%s: the tool is left out of tools/list", refused)
                    continue
            tools.append((t, entry))
        return tools

    async def list_tools(self, ctx: RequestContext, params: PaginatedRequestParams | None) -> dict[str, Any]:
        await self.gateway.ready()
        self._remember_client(ctx)
        out = self.tools_result(
            principal_of(ctx, self.default_principal), identity_of(ctx), modern=ctx.protocol_version in _MODERN
        )
        if self.passthrough is not None:
            self.passthrough.seen(ctx)  # told when the list changes
        return out

    def tools_result(self, principal: str | None, identity: Identity | None, *, modern: bool) -> dict[str, Any]:
        """The ``tools/list`` result ``principal`` sees (its 2026-07-28 fields when ``modern``): the SDK path's
        and the early path's (``server/_early.py``) alike."""
        out: dict[str, Any] = {"tools": self._listed_tools(principal, identity)}
        if self.passthrough is not None:
            down = self.passthrough.downstreams.unavailable()
            if down:  # their tools come when they are up (the client is told); say why they are missing
                out["_meta"] = {UNAVAILABLE_META_KEY: down}
        if modern:
            # The list depends on the caller (auth) and on downstream servers coming and going.
            out.update(resultType="complete", ttlMs=0, cacheScope="private")
        if self.caching is not None:
            out.update(ttlMs=self.caching.list_ttl_ms, cacheScope=self.caching.scope)
        return out

    async def call_tool(self, ctx: RequestContext, params: CallToolRequestParams) -> dict[str, Any]:
        self._remember_client(ctx)
        levels = self.passthrough.levels if self.passthrough is not None else None
        tctx = tool_context(ctx, default_principal=self.default_principal, log_levels=levels, tools=self.gateway)
        if self.tasks is not None and (support := self.tasks.support(params.name)) is not None:
            capabilities = ctx.session.client_capabilities
            if declares_tasks(capabilities):
                try:
                    if ctx.protocol_version in _MODERN and getattr(
                        self.gateway.get(params.name), "ask_before_task", False
                    ):
                        return await self.ask_then_task(ctx, params, tctx, capabilities)
                    return await self.create_task(params.name, params.arguments or {}, tctx, capabilities)
                except StoreUnavailable as exc:
                    raise store_unavailable(exc) from None
            if support == "required":
                raise required_error()
        out = await sdk_call(self, ctx, params, tctx)
        if out.get("resultType") == "input_required":
            return out  # a pipeline waits for the client's answers (2026-07-28): never cached
        if ctx.protocol_version in _MODERN:
            # The list depends on the caller (auth) and on downstream servers coming and going.
            out.update(resultType="complete", ttlMs=0, cacheScope="private")
        return out

    async def call(self, name: str, args: dict[str, Any], tctx: ToolContext) -> dict[str, Any]:
        """One direct call: ``mcp_pipe`` or any gateway tool, answered as a wire result (``CANCELLED`` when
        the server shuts down under it; counted and traced when the process has telemetry)."""
        if not self.shutting_down:
            with trio.CancelScope() as scope:
                self._in_flight.add(scope)
                self._idle = trio.Event() if self._idle.is_set() else self._idle
                try:
                    tel = telemetry.current()
                    if tel is None:
                        return await self._call(name, args, tctx)
                    return await tel.observe_call(name, tctx.traceparent, self._call(name, args, tctx), tctx.principal)
                except StoreUnavailable as exc:  # the run queue (a background run, the pipe_* tools)
                    raise store_unavailable(exc) from None
                finally:
                    self._in_flight.discard(scope)
                    if not self._in_flight:
                        self._idle.set()
        return _shutdown_answer(name == PIPE_TOOL and self.pipe is not None)

    async def run_surface(self, ctx: RequestContext, tool: Tool, args: dict[str, Any]) -> ToolResult:
        """Run a pipeline served as a prompt or resource for one request, through the gateway (the caller's
        rights, the audit); a refusal is the JSON-RPC error it carries."""
        levels = self.passthrough.levels if self.passthrough is not None else None
        tctx = tool_context(ctx, default_principal=self.default_principal, log_levels=levels, tools=self.gateway)
        try:
            return await self.gateway.invoke(tool, args, tctx)
        except TrustDenied as exc:
            raise _mcp.MCPError(exc.rpc_code, str(exc)) from None
        except GateDenied as exc:
            raise _mcp.MCPError(exc.rpc_code, str(exc), exc.data) from None
        except CallError as exc:
            raise _mcp.MCPError(_mcp.INTERNAL_ERROR, f"{exc.code}: {exc}") from None

    def scopes_of(self, ctx: RequestContext) -> ScopeCheck | None:
        """What the ``[[auth.scopes]]`` rules ask of a request's caller for prompts and resources, the rule tools
        are held to (:meth:`Gateway.scoped`): None when none applies (no rule names a prompt or resource, or a
        local caller without trust levels, which is the operator's and holds every scope)."""
        gateway = self.gateway
        rules = gateway.scopes
        if rules is None or not (rules.prompts or rules.resources):
            return None
        principal = principal_of(ctx, self.default_principal)
        probe = ToolContext(principal=principal, request=Request(identity=identity_of(ctx)))
        if not gateway.scoped(probe):
            return None
        return lambda kind, name: gateway.surface_scopes(kind, name, probe)

    def check_surface(self, ctx: RequestContext, tool: Tool) -> None:
        """Refuse a caller who may not read a resource (subscribing to it is reading it as it changes): the
        trust rules' JSON-RPC error."""
        trust = self.gateway.trust
        if trust is None:
            return
        tctx = tool_context(ctx, default_principal=self.default_principal, tools=self.gateway)
        try:
            trust.check(tool.name, tctx)
        except TrustDenied as exc:
            raise _mcp.MCPError(exc.rpc_code, str(exc)) from None

    async def run_hidden(self, ctx: RequestContext | None, tool: Tool, args: dict[str, Any]) -> ToolResult:
        """Run a pipeline as the server itself (a completion source, a listing, a watch's read): no caller's
        rights are checked, its steps' tool calls go through the gateway; ``ctx`` gives the caller's identity to
        its steps when there is a request (None: the server's own, anonymous)."""
        if ctx is None:
            tctx = ToolContext(tools=self.gateway)
        else:
            tctx = tool_context(ctx, default_principal=self.default_principal, tools=self.gateway)
        return await tool.call(args, tctx)

    def shut_down(self) -> None:
        """Cancel every call in flight, which then answers ``CANCELLED``; later calls answer so at once."""
        self.shutting_down = True
        for scope in list(self._in_flight):
            scope.cancel()

    async def idle(self) -> None:
        """Wait until no call is in flight."""
        await self._idle.wait()

    async def _call(self, name: str, args: dict[str, Any], tctx: ToolContext) -> dict[str, Any]:
        if name == PIPE_TOOL and self.pipe is not None:
            return pipe_envelope(await self.pipe.run(args, tctx))
        limits = self.limits
        too_deep = depth_problem(args, "arguments", limits.max_json_depth, "the arguments")
        if too_deep is not None:
            return _error_result(f"{too_deep.code}: {too_deep}")
        if self.runs is not None and getattr(self.gateway.get(name), "background", False):
            return await self.submit(name, args, tctx)
        try:
            result = await self.gateway.call(name, args, tctx)
            too_large = measure_output(
                (result.structured, result.content),
                max_bytes=limits.max_answer_bytes,
                max_depth=limits.max_json_depth,
                wrapping=2,  # the pair, and a content block
                location="",
                what=f"the result of '{name}'",
            )
            if too_large is not None:
                return _error_result(f"{too_large.code}: {too_large}")
            return wire_result(result, tctx.era)
        except DownstreamError as exc:
            # The downstream server's own JSON-RPC error reaches the caller as it was (code, message, data).
            raise _mcp.MCPError(exc.error.code, exc.error.message, exc.error.data) from None
        except SignInRequired as exc:
            # The caller must sign in to a downstream server and cannot be asked mid-call: the spec's
            # URLElicitationRequiredError, which a client shows and then retries the call after.
            raise _mcp.MCPError(
                _mcp.URL_ELICITATION_REQUIRED, str(exc), {"elicitations": [exc.elicitation()]}
            ) from None
        except TrustDenied as exc:
            raise _mcp.MCPError(exc.rpc_code, str(exc)) from None
        except GateDenied as exc:
            raise _mcp.MCPError(exc.rpc_code, str(exc), exc.data) from None
        except CallError as exc:
            if exc.code == ErrorCode.UNKNOWN_TOOL and self.unknown_tool_error:
                raise _mcp.MCPError(_mcp.INVALID_PARAMS, f"unknown tool: {name}") from None
            return _error_result(f"{exc.code}: {exc}")
        except (trio.Cancelled, StoreUnavailable):
            raise
        except Exception as exc:
            _log.exception("tool %r raised", name)
            return _error_result(f"{ErrorCode.TOOL_FAILED}: {type(exc).__name__}: {exc}")

    async def create_task(
        self,
        name: str,
        args: dict[str, Any],
        tctx: ToolContext,
        capabilities: types.ClientCapabilities | dict[str, object] | None = None,
    ) -> dict[str, Any]:
        """A call run as a task: checked now (a spec with problems, arguments that do not fit, a tool this
        caller may not call are answered at once, synchronously), then queued: a ``CreateTaskResult``."""
        assert self.tasks is not None
        if name == PIPE_TOOL and self.pipe is not None:
            spec = {k: v for k, v in args.items() if k != "background"}
            problems = await self.pipe.check(spec, tctx)
            if problems is not None:
                return {**pipe_envelope(problems), "resultType": "complete"}
            try:
                return await self.tasks.create(name, spec, tctx, capabilities)
            except RunRefused as exc:
                return {**_refused(name, exc, "task"), "resultType": "complete"}
        why = self.gateway.denial(name, tctx)
        if why is not None:  # answered at once: a complete result, never a task (2026-07-28 needs the type)
            return {**_error_result(f"{ErrorCode.FORBIDDEN}: {why}"), "resultType": "complete"}
        check = getattr(self.gateway.get(name), "check_args_async", None)
        if check is not None:
            args, errors = await check(args)
            if errors:
                message = f"invalid arguments for tool '{name}': " + "; ".join(errors)
                return {**_error_result(message), "resultType": "complete"}
        try:
            return await self.tasks.create(name, args, tctx, capabilities)
        except RunRefused as exc:
            return {**_refused(name, exc, "task"), "resultType": "complete"}

    async def ask_then_task(
        self,
        ctx: RequestContext,
        params: CallToolRequestParams,
        tctx: ToolContext,
        capabilities: types.ClientCapabilities | dict[str, object] | None,
    ) -> dict[str, Any]:
        """A call of an ``ask_before_task`` pipeline by a client that declares tasks (2026-07-28): it runs
        synchronously while it only asks its client (input-required rounds, no task yet); the round whose
        answers let it reach its first step that does work becomes a task there, handed the steps finished
        so far (the task runs none of them again). A call that ends before any such step answers as usual."""
        assert self.tasks is not None
        tasks = self.tasks
        args = params.arguments or {}

        async def escalate(state: dict[str, Any]) -> dict[str, Any]:
            try:
                return await tasks.create(
                    params.name, args, tctx, capabilities, recorded=state["memo"], answers=state["answers"]
                )
            except RunRefused as exc:
                return _refused(params.name, exc, "task")

        out = await sdk_call(self, ctx, params, tctx, escalate=escalate)
        if out.get("resultType") not in ("input_required", "task"):
            out.update(resultType="complete", ttlMs=0, cacheScope="private")
        return out

    async def submit(self, name: str, args: dict[str, Any], tctx: ToolContext) -> dict[str, Any]:
        """A call of a ``background: true`` declared pipeline: its arguments checked now, then queued;
        answers the run id (structured ``{"run_id", "status"}``)."""
        tool = self.gateway.get(name)
        assert tool is not None and self.runs is not None
        why = self.gateway.denial(name, tctx)
        if why is not None:
            return _error_result(f"{ErrorCode.FORBIDDEN}: {why}")
        check = getattr(tool, "check_args_async", None)
        if check is not None:
            args, errors = await check(args)
            if errors:
                return _error_result(f"invalid arguments for tool '{name}': " + "; ".join(errors))
        try:
            info = await self.runs.submit(name, args, tctx)
        except RunRefused as exc:
            return _refused(name, exc, "background")
        return ToolResult.text(dumps({"run_id": info.id, "status": info.status}).decode()).wire() | {
            "structuredContent": {"run_id": info.id, "status": info.status}
        }


_SHUTDOWN = "the server is shutting down"


def _shutdown_answer(pipe: bool) -> dict[str, Any]:
    if not pipe:
        return _error_result(f"CANCELLED: {_SHUTDOWN}")
    summary = {"total": 0, "succeeded": 0, "failed": 0, "skipped": 0, "cancelled": 0}
    answer = {"ok": False, "error": _SHUTDOWN, "error_code": "CANCELLED", "result": None, "steps": {}}
    return pipe_envelope({**answer, "summary": summary, "duration_ms": 0.0})


def build_server(
    handlers: ToolHandlers, *, name: str = "mcpipe", version: str = "", instructions: str | None = None
) -> Server[Any]:
    """A low-level SDK ``Server`` serving the handlers' tools (:func:`mcpipe.server._sdkserver.build_server`,
    which imports the SDK)."""
    from mcpipe.server._sdkserver import build_server as build

    return build(handlers, name=name, version=version, instructions=instructions)


def input_schema(handlers: ToolHandlers, name: str) -> dict[str, Any] | None:
    if name == PIPE_TOOL:
        return PIPE_INPUT_SCHEMA
    tool = handlers.gateway.get(name)
    return None if tool is None else tool.input_schema
