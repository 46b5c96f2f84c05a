"""Metrics (Prometheus) and traces (OpenTelemetry) of a running server; ``docs/deployment.md`` lists them.

Both hang off one process-wide :class:`Telemetry`, installed by :func:`configure` (``open_app`` calls it
with the config's ``[telemetry]`` section) and read through :func:`current`; with none installed every
hook is one ``is None`` test. The hooks:

- :meth:`Telemetry.observe_call` around every incoming ``tools/call`` (the SDK path and the lean paths
  alike): calls by tool and outcome, their duration, calls in flight, and the call's server span, whose
  parent is the W3C ``traceparent`` the request carried in ``_meta``;
- :meth:`Telemetry.observe_steps` on every finished pipeline answer: steps by kind and outcome;
- :meth:`Telemetry.step_span` around a pipeline step's tool call, :meth:`Telemetry.span` around a
  downstream call, and :meth:`Telemetry.trace_meta`, the ``traceparent`` a downstream request carries on.

Metrics are correct with ``--workers``: the supervisor gives every worker one ``PROMETHEUS_MULTIPROC_DIR``
and ``/metrics`` on any worker aggregates them all (prometheus-client's multiprocess mode). Tracing is off
unless ``[telemetry] traces`` names an exporter or the standard variables do (``OTEL_TRACES_EXPORTER``, or
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` for OTLP), or an application
embedding mcpipe installed a global SDK provider.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import Any, cast

from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

__all__ = ["Telemetry", "configure", "current", "install"]

_current: Telemetry | None = None

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def current() -> Telemetry | None:
    """The process's telemetry, or None when it has none."""
    return _current


def install(telemetry: Telemetry | None) -> None:
    """Make ``telemetry`` the process's (None removes it)."""
    global _current
    _current = telemetry


class _Metrics:
    """The Prometheus collectors; created once per process (the registry refuses a name twice), on first use:
    ``prometheus_client`` costs a server's start-up about 150 ms of CPU, so the collectors are made by the first
    read of one of them, or by :meth:`build` (which ``/metrics`` and a server's warm-up call)."""

    _made: _Metrics | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[tuple[str, str], tuple[Callable[[float], None], Callable[[float], None]]] = {}
        self._step_children: dict[tuple[str, str], Callable[[float], None]] = {}
        self._principal_children: dict[tuple[str, str], Callable[[float], None]] = {}
        self._downstream_children: dict[tuple[str, str], tuple[Callable[[float], None], Callable[[float], None]]] = {}

    def __getattr__(self, name: str) -> object:
        # Only while the collectors are not made yet (afterwards they are attributes, found without this).
        if name.startswith("_"):
            raise AttributeError(name)
        self.build()
        return object.__getattribute__(self, name)

    def build(self) -> None:
        """Create the collectors now (once; a server's worker thread does it as soon as the server answers)."""
        with self._lock:
            if "calls" not in self.__dict__:
                self._make()

    def _make(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.calls = Counter("mcpipe_calls", "Incoming tools/call requests, by tool and outcome.", ["tool", "outcome"])
        self.duration = Histogram(
            "mcpipe_call_duration_seconds", "Time to answer a tools/call, by tool.", ["tool"], buckets=_BUCKETS
        )
        self.in_flight = Gauge(
            "mcpipe_calls_in_flight", "tools/call requests being served now.", multiprocess_mode="livesum"
        )
        self.steps = Counter(
            "mcpipe_pipeline_steps", "Finished pipeline steps, by kind and outcome.", ["kind", "outcome"]
        )
        self.suspended = Counter(
            "mcpipe_pipelines_suspended", "Pipelines suspended to ask their 2026-07-28 client (input-required)."
        )
        self.principal_calls = Counter(
            "mcpipe_principal_calls",
            "Incoming tools/call requests, by principal (the caller's; '' when anonymous) and outcome.",
            ["principal", "outcome"],
        )
        self.errors = Counter(
            "mcpipe_call_errors",
            "tools/call requests answered with an error result, by tool and error code (UNKNOWN: none said).",
            ["tool", "code"],
        )
        self.downstream_calls = Counter(
            "mcpipe_downstream_calls",
            "Calls to downstream MCP servers' tools, by server and outcome.",
            ["server", "outcome"],
        )
        self.downstream_duration = Histogram(
            "mcpipe_downstream_call_duration_seconds",
            "Time a downstream MCP server took to answer a tool call, by server.",
            ["server"],
            buckets=_BUCKETS,
        )
        self.runs = Gauge(
            "mcpipe_runs", "Runs the run queue holds, by status (its depth).", ["status"], multiprocess_mode="livemax"
        )
        self.downstream_up = Gauge(
            "mcpipe_downstream_up",
            "Whether a downstream MCP server is connected (1) or not (0).",
            ["server"],
            multiprocess_mode="livemin",
        )
        self.in_flight_add = _adder(self.in_flight)

    @classmethod
    def get(cls) -> _Metrics:
        if cls._made is None:
            cls._made = cls()
        return cls._made

    def call_children(self, tool: str, outcome: str) -> tuple[Callable[[float], None], Callable[[float], None]]:
        """How to count a call of ``tool`` with ``outcome`` and to observe its duration."""
        key = (tool, outcome)
        pair = self._children.get(key)
        if pair is None:
            pair = (_adder(self.calls.labels(tool, outcome)), _observer(self.duration.labels(tool)))
            self._children[key] = pair
        return pair

    def downstream_children(self, server: str, outcome: str) -> tuple[Callable[[float], None], Callable[[float], None]]:
        """How to count a downstream call of ``server`` with ``outcome`` and to observe its duration."""
        key = (server, outcome)
        pair = self._downstream_children.get(key)
        if pair is None:
            pair = (
                _adder(self.downstream_calls.labels(server, outcome)),
                _observer(self.downstream_duration.labels(server)),
            )
            self._downstream_children[key] = pair
        return pair

    def principal(self, principal: str, outcome: str) -> Callable[[float], None]:
        """How to count a call of ``principal`` with ``outcome``."""
        key = (principal, outcome)
        add = self._principal_children.get(key)
        if add is None:
            add = self._principal_children[key] = _adder(self.principal_calls.labels(principal, outcome))
        return add

    def step(self, kind: str, outcome: str) -> Callable[[float], None]:
        """How to count finished steps of ``kind`` with ``outcome``."""
        key = (kind, outcome)
        add = self._step_children.get(key)
        if add is None:
            add = self._step_children[key] = _adder(self.steps.labels(kind, outcome))
        return add


def _adder(metric: Any) -> Callable[[float], None]:
    """What adds to a labelled (or unlabelled) counter or gauge: its value's own ``inc``, when it has one
    (prometheus-client's ``inc`` checks the labels and the amount's sign first, on every call: mcpipe's are
    checked once, here), else the public ``inc``."""
    value = getattr(metric, "_value", None)
    inc = getattr(value, "inc", None)
    return cast(Callable[[float], None], inc if callable(inc) else metric.inc)


def _observer(histogram: Any) -> Callable[[float], None]:
    """What observes a value in a labelled histogram: its sum and the one bucket the value falls in (what
    prometheus-client's ``observe`` does, with a binary search for its loop over the buckets)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        return cast(Callable[[float], None], histogram.observe)
    add, incs, upper = total.inc, [b.inc for b in buckets], list(bounds)

    def observe(amount: float) -> None:
        add(amount)
        incs[bisect_left(upper, amount)](1)

    return observe


class Telemetry:
    """Metrics and (optionally) a tracer.

    Args:
        metrics: keep Prometheus metrics.
        tracer_provider: an OpenTelemetry ``TracerProvider`` to trace with, shut down with the app.
        tracer: a tracer to trace with instead (e.g. the OpenTelemetry API's, for an application that set
            its own global provider); neither: no traces.
        known: which tool names may become label values (others count as ``other``, so a client sending
            random names cannot grow the metrics without bound).
    """

    def __init__(
        self,
        *,
        metrics: bool = True,
        tracer_provider: Any = None,
        tracer: Any = None,
        known: Any = None,
        max_principals: int = 200,
    ) -> None:
        self.metrics = _Metrics.get() if metrics else None
        self.max_principals = max_principals
        self._principals: dict[str | None, str] = {}
        self.tracer = tracer_provider.get_tracer("mcpipe") if tracer_provider is not None else tracer
        self.provider = tracer_provider
        self.known = known
        self.step_ended: Callable[[str, str, int, bool | BaseException], None] = self._step_ended
        """Record the span ``step <id> <tool>`` of a pipeline step's tool call that started at ``start``
        (``time.time_ns()``) and ended now, a child of the current one (there must be a tracer): for a tool
        that makes no traced calls of its own (a function tool), whose span nothing needs while it runs.
        ``failed``: the call answered a tool error (True) or raised this. With a recorder, its
        :meth:`mcpipe.telemetry._tracing.Recorder.step_ended`, which records the span when its parent ends."""
        if self.tracer is not None:
            from opentelemetry import context, trace

            self._in_context, self._current_span = trace.set_span_in_context, trace.get_current_span
            self._enter, self._exit = _span_entry(context)
            self._server_kind, self._client_kind, self._internal_kind = (
                trace.SpanKind.SERVER,
                trace.SpanKind.CLIENT,
                trace.SpanKind.INTERNAL,
            )
            self.error = Status(StatusCode.ERROR)
            self._recorder = _recorder_of(self.tracer, self._step_ended)
            if self._recorder is not None:
                # Called once per function-tool step: the recorder's own, bound once here (no call between).
                self.step_ended = self._recorder.step_ended

    def _start(self, name: str, parent: Any, kind: Any, attributes: Mapping[str, object]) -> Any:
        """A started span named ``name``, child of ``parent`` (a ``SpanContext``; None: the current span's).

        Spans of an SDK tracer whose span processors only look at ended spans (the SDK's batch and simple
        processors, the exporters' path) are recorded by :class:`mcpipe.telemetry._tracing.Recorder`, for a fraction
        of the SDK span's cost; any other tracer makes its own span, the parent passed explicitly.
        """
        rec = self._recorder
        if rec is not None:
            span = rec.child(name, kind, attributes) if parent is None else rec.start(name, parent, kind, attributes)
            if span is not None:
                return span
        ctx = None if parent is None else self._in_context(NonRecordingSpan(parent))
        return self.tracer.start_span(name, context=ctx, kind=kind, attributes=attributes)

    # --- incoming calls ---

    async def observe_call(
        self, name: str, traceparent: Any, call: Awaitable[dict[str, Any]], principal: str | None = None
    ) -> dict[str, Any]:
        """Await ``call`` (one incoming ``tools/call`` of ``name`` by ``principal``) counted, timed and traced."""
        m = self.metrics
        label = name if self.known is None or self.known(name) else "other"
        t0 = time.perf_counter()
        outcome = "failed"
        out: dict[str, Any] | None = None
        if m is not None:
            m.in_flight_add(1)
        try:
            if self.tracer is None:
                out = await call
            else:
                parent = parse_traceparent(traceparent) if isinstance(traceparent, str) else None
                attributes = {_METHOD: "tools/call", TOOL_ATTRIBUTE: name}
                span = self._start(f"tools/call {name}", parent, self._server_kind, attributes)
                token = self._enter(span)
                try:
                    out = await call
                    if out.get("isError"):
                        span.set_status(self.error)
                except BaseException as exc:
                    _failed(span, exc, self.error)
                    raise
                finally:
                    self._exit(token)
                    span.end()
            outcome = "error" if out.get("isError") else "ok"
            return out
        except BaseException as exc:
            from mcpipe._util import is_cancellation, is_suspension

            outcome = "input_required" if is_suspension(exc) else "cancelled" if is_cancellation(exc) else "failed"
            raise
        finally:
            if m is not None:
                m.in_flight_add(-1)
                count, observe = m.call_children(label, outcome)
                count(1)
                observe(time.perf_counter() - t0)
                if self.max_principals:
                    who = self._principals.get(principal)
                    if who is None:
                        who = self._principal_label(principal)
                    m.principal(who, outcome)(1)
                if outcome == "error" and out is not None:
                    m.errors.labels(label, error_code(out)).inc()

    def _principal_label(self, principal: str | None) -> str:
        """The label of ``principal``: itself while fewer than ``max_principals`` are labelled, else ``other``."""
        if len(self._principals) >= self.max_principals:
            return "other"
        label = self._principals[principal] = principal or ""
        return label

    def observe_downstream(self, server: str, seconds: float, ok: bool) -> None:
        """Count a downstream server's tool call that answered in ``seconds`` (``ok``: not an error result, not
        a failure to call)."""
        m = self.metrics
        if m is not None:
            count, observe = m.downstream_children(server, "ok" if ok else "error")
            count(1)
            observe(seconds)

    def queue_depth(self, counts: Mapping[str, int]) -> None:
        """The run queue's runs by status, as :meth:`mcpipe.store.RunQueue.counts` answers them."""
        m = self.metrics
        if m is not None:
            for status in ("queued", "running", "input_required"):
                m.runs.labels(status).set(counts.get(status, 0))
            m.runs.labels("finished").set(sum(n for k, n in counts.items() if k not in _LIVE))

    # --- pipelines ---

    def observe_steps(self, answer: Mapping[str, object]) -> None:
        """Count the steps of a finished pipeline answer (nested ones too) by kind and outcome."""
        if self.metrics is not None:
            steps = answer.get("steps")
            if isinstance(steps, dict):
                self._count(steps)

    def _count(self, steps: Mapping[str, object]) -> None:
        counts: dict[tuple[str, str], int] = {}
        self._tally(steps, counts)
        m = self.metrics
        assert m is not None
        for (kind, outcome), n in counts.items():  # one increment per kind and outcome, not one per step
            m.step(kind, outcome)(n)

    def _tally(self, steps: Mapping[str, object], counts: dict[tuple[str, str], int]) -> None:
        for step in steps.values():
            if not isinstance(step, dict):
                continue
            # (the kind is a label value: prometheus-client makes it a string)
            key = (step.get("kind", "tool"), "ok" if step.get("ok") else _outcome(step))
            counts[key] = counts.get(key, 0) + 1
            if "children" in step or "steps" in step:  # (a test, not two lookups, for the usual leaf step)
                children = step.get("children") or step.get("steps")
                if isinstance(children, dict):
                    self._tally(children, counts)

    def suspended(self) -> None:
        """A pipeline suspended to ask its client."""
        if self.metrics is not None:
            self.metrics.suspended.inc()

    # --- spans ---

    def span(
        self, name: str, attributes: Mapping[str, object], *, client: bool = False, current: bool = True
    ) -> AbstractContextManager[Any]:
        """A child span of the current one for a ``with`` block, made the current one inside when
        ``current``; it ends with the block, failed if the block raised (nothing without a tracer)."""
        if self.tracer is None:
            return nullcontext()
        return self._scoped(
            self._start(name, None, self._client_kind if client else self._internal_kind, attributes), current
        )

    def step_span(self, step: str, name: str, *, current: bool) -> Any:
        """The span ``step <id> <tool>`` of a pipeline step's tool call for a ``with`` block, a child of the
        current one (there must be a tracer); the block's value is the span (a tool error: set its status
        to :attr:`error`). Made the current one only when ``current`` (a tool that may make traced calls of
        its own, like a downstream one): a pipeline makes one per step, so it costs the least it can."""
        attributes = {STEP_ATTRIBUTE: step, TOOL_ATTRIBUTE: name}
        rec = self._recorder
        span = None if rec is None else rec.child(f"step {step} {name}", self._internal_kind, attributes)
        if span is None:
            span = self.tracer.start_span(f"step {step} {name}", kind=self._internal_kind, attributes=attributes)
        elif rec is not None and type(span) is rec.span_type:  # (``_scoped``, inline: once per step)
            if current:
                span._token = self._enter(span)
            return span
        return self._scoped(span, current)

    def _step_ended(self, step: str, name: str, start: int, failed: bool | BaseException) -> None:
        """:attr:`step_ended` recorded now: by the recorder's :meth:`~mcpipe.telemetry._tracing.Recorder.ended`, or the
        tracer's own span."""
        rec = self._recorder
        attributes = {STEP_ATTRIBUTE: step, TOOL_ATTRIBUTE: name}
        if rec is not None and rec.ended(f"step {step} {name}", attributes, start, failed):
            return
        span = self.tracer.start_span(
            f"step {step} {name}", kind=self._internal_kind, attributes=attributes, start_time=start
        )
        if failed is True:
            span.set_status(self.error)
        elif failed is not False:
            _failed(span, failed, self.error)
        span.end()

    def _scoped(self, span: Any, current: bool) -> Any:
        """``span`` as the context manager of its ``with`` block (a recorded span is its own)."""
        token = self._enter(span) if current else None
        rec = self._recorder
        if rec is not None and type(span) is rec.span_type:
            if token is not None:
                span._token = token
            return span
        return SpanScope(self, span, token)

    def trace_meta(self) -> dict[str, str] | None:
        """The ``_meta`` carrying the current span's W3C ``traceparent`` (and ``tracestate``) on to a
        downstream request; None without a tracer or a valid current span."""
        if self.tracer is None:
            return None
        sc = self._current_span().get_span_context()
        if not sc.is_valid:
            return None
        meta = {"traceparent": f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"}
        if sc.trace_state:
            meta["tracestate"] = sc.trace_state.to_header()
        return meta

    # --- downstream servers ---

    def downstream_status(self, status: Mapping[str, str]) -> None:
        if self.metrics is not None:
            for server, state in status.items():
                self.metrics.downstream_up.labels(server).set(1 if state == "up" else 0)


class SpanScope:
    """A started span of a tracer other than the recorder's as the context manager of its ``with`` block
    (:meth:`Telemetry.span`, :meth:`Telemetry.step_span`): the block's value is the span; it ends when the
    block exits, failed (status ``ERROR``, ``error.type``) if the block raised, unless with a 2026-07-28
    suspension. A plain class, not a generator: it runs once per step."""

    __slots__ = ("_tel", "_token", "span")

    def __init__(self, tel: Telemetry, span: Span, token: Any) -> None:
        self._tel, self.span, self._token = tel, span, token

    def __enter__(self) -> Any:
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            _failed(self.span, exc, self._tel.error)
        if self._token is not None:
            self._tel._exit(self._token)
        self.span.end()


# Span attribute keys (OpenTelemetry's semantic conventions for MCP and GenAI tools, and mcpipe's own).
_METHOD = "mcp.method.name"
TOOL_ATTRIBUTE = "gen_ai.tool.name"
STEP_ATTRIBUTE = "mcpipe.step.id"
SERVER_ATTRIBUTE = "mcp.server"


def _span_entry(context: Any) -> tuple[Callable[[Any], Any], Callable[[Any], None]]:
    """How to make a span the current one (answering a token) and how to undo that with the token: with
    the default runtime context, its ContextVar set and reset directly (what the API's ``attach`` and
    ``set_span_in_context`` come down to, minus six calls); otherwise through the API."""
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation import _SPAN_KEY

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None) if type(runtime) is ContextVarsRuntimeContext else None
    if not isinstance(var, ContextVar):
        attach: Callable[[Any], Any] = lambda span: context.attach(set_span_in_context(span))  # noqa: E731
        return attach, context.detach
    make = context.Context

    def enter(span: Span) -> Any:
        return var.set(make({**var.get(), _SPAN_KEY: span}))

    return enter, var.reset


def _recorder_of(tracer: Any, otherwise: Callable[[str, str, int, bool | BaseException], None]) -> Any:
    """A :class:`mcpipe.telemetry._tracing.Recorder` for ``tracer`` if it is the OpenTelemetry SDK's, else None."""
    if "opentelemetry.sdk.trace" not in sys.modules:  # an SDK tracer exists only once the SDK is imported
        return None
    from mcpipe.telemetry._tracing import Recorder

    return Recorder.of(tracer, otherwise)


def _outcome(step: Mapping[str, object]) -> str:
    """The outcome label of a pipeline step's answer that is not ok."""
    if step.get("skipped"):
        return "skipped"
    return "cancelled" if step.get("error_code") == "CANCELLED" else "failed"


def _failed(span: Span, exc: BaseException, error: Any) -> None:
    """Mark ``span`` failed by ``exc``, unless ``exc`` is a 2026-07-28 suspension (the call asks its client
    and resumes on the retry: not an error)."""
    from mcpipe._util import is_suspension

    if not is_suspension(exc):
        span.set_status(error)
        span.set_attribute("error.type", type(exc).__qualname__)


_TRACEPARENT = re.compile(r"\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*")
_USUAL_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


_LIVE = frozenset({"queued", "running", "input_required"})
_CODE = re.compile(r"([A-Z][A-Z0-9_]{1,40}):")


def error_code(answer: Mapping[str, object]) -> str:
    """The error code an error result says: a pipeline's ``error_code``, else the ``CODE:`` its text starts
    with (mcpipe's tool errors), else ``UNKNOWN``."""
    structured = answer.get("structuredContent")
    if isinstance(structured, dict):
        code = structured.get("error_code")
        if isinstance(code, str) and code:
            return code[:48]
    content = answer.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        m = _CODE.match(str(content[0].get("text", ""))[:48])
        if m is not None:
            return m.group(1)
    return "UNKNOWN"


def parse_traceparent(value: str) -> Any:
    """The remote ``SpanContext`` a W3C ``traceparent`` names, or None for a malformed or invalid one (what
    the W3C propagator accepts: version ``ff`` never, version ``00`` with nothing after the flags)."""
    m = _USUAL_TRACEPARENT.fullmatch(value)  # the usual form: version 00, nothing around it
    if m is not None:
        trace_id, span_id, flags = m.groups()
    else:
        m = _TRACEPARENT.fullmatch(value)
        if m is None:
            return None
        version, trace_id, span_id, flags, rest = m.groups()
        if version == "ff" or (version == "00" and rest):
            return None
    tid, sid = int(trace_id, 16), int(span_id, 16)
    if not tid or not sid:
        return None
    # What ``SpanContext(tid, sid, is_remote=True, trace_flags=...)`` makes, minus its Python-level
    # ``__new__`` and ``TraceFlags`` calls (a SpanContext is a tuple; ids of these lengths, not zero, are valid).
    return _new_tuple(SpanContext, (tid, sid, True, _TRACE_FLAGS[int(flags, 16)], DEFAULT_TRACE_STATE, True))


_new_tuple = tuple.__new__
_TRACE_FLAGS = tuple(TraceFlags(f) for f in range(256))


def traces_exporter(section: Any, environ: Mapping[str, str]) -> str | None:
    """Which exporter traces go to: the config's ``traces``, else the OTEL_* variables; None: no tracing."""
    chosen = getattr(section, "traces", None)
    if chosen:
        return None if chosen == "none" else str(chosen)
    env = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if env:
        return None if env == "none" else env.split(",")[0].strip()
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return "otlp"
    return None


def tracer_provider(
    exporter: str,
    service: str,
    *,
    endpoint: str | None = None,
    protocol: str = "http/protobuf",
    attributes: Mapping[str, str] | None = None,
) -> Any:
    """An OpenTelemetry SDK ``TracerProvider`` exporting to ``exporter`` (``console`` or ``otlp``).

    Args:
        endpoint: the OTLP collector (``http://collector:4317`` for gRPC; for HTTP, its base URL, to which
            ``/v1/traces`` is added unless the URL has a path); None: the ``OTEL_EXPORTER_OTLP_*`` variables.
        protocol: ``grpc`` or ``http/protobuf``.
        attributes: more resource attributes (``service.name`` is ``service``).

    Raises:
        ValueError: an exporter of no known kind, or ``otlp`` without its exporter package.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({**(attributes or {}), "service.name": service}))
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(endpoint, protocol)))
    else:
        raise ValueError(f"no trace exporter `{exporter}` (console, otlp or none)")
    return provider


def _otlp_exporter(endpoint: str | None, protocol: str) -> Any:
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise ValueError("OTLP over gRPC needs `pip install opentelemetry-exporter-otlp-proto-grpc`") from None
        if endpoint is None:
            return GrpcExporter()
        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    except ImportError:
        raise ValueError("the otlp exporter needs `pip install opentelemetry-exporter-otlp-proto-http`") from None
    if endpoint is None:
        return HttpExporter()
    rest = endpoint.partition("://")[2]
    has_path = "/" in rest.strip("/")
    return HttpExporter(endpoint=endpoint if has_path else endpoint.rstrip("/") + "/v1/traces")


def configure(section: Any, *, service: str, known: Any = None, environ: Mapping[str, str] | None = None) -> Telemetry:
    """Install the telemetry the config's ``[telemetry]`` section (and the OTEL_* variables) ask for.

    With an exporter named, mcpipe runs its own SDK provider. ``propagate`` uses the OpenTelemetry API's
    tracer, which without an SDK records nothing but carries the caller's trace context on. Otherwise an
    application embedding mcpipe that installed a global SDK provider gets mcpipe's spans there; and without
    one there is no tracer at all, and the hooks cost one test each.
    """
    env = os.environ if environ is None else environ
    exporter = traces_exporter(section, env)
    provider = None
    if exporter not in (None, "propagate"):
        provider = tracer_provider(
            exporter,
            getattr(section, "service_name", None) or service,
            endpoint=getattr(section, "otlp_endpoint", None),
            protocol=getattr(section, "otlp_protocol", "http/protobuf"),
            attributes=getattr(section, "resource_attributes", None),
        )
    tracer = None
    if exporter == "propagate":  # the API's tracer: non-recording spans unless an application set a provider
        from opentelemetry import trace

        tracer = trace.get_tracer("mcpipe")
    elif provider is None and getattr(section, "traces", None) != "none" and "opentelemetry.sdk.trace" in sys.modules:
        # An application's SDK provider: one exists only once the SDK is imported (not imported for nothing).
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        if isinstance(trace.get_tracer_provider(), TracerProvider):
            tracer = trace.get_tracer("mcpipe")
    telemetry = Telemetry(
        metrics=getattr(section, "metrics", True),
        tracer_provider=provider,
        tracer=tracer,
        known=known,
        max_principals=getattr(section, "max_principal_labels", 200),
    )
    install(telemetry)
    return telemetry


def metrics_text() -> tuple[bytes, str]:
    """The Prometheus exposition of this process's metrics, or of every worker's (multiprocess mode)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    if _current is not None and _current.metrics is not None:
        _current.metrics.build()  # listed (at zero) before anything counted
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
