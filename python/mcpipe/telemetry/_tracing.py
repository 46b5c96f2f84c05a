"""Recording mcpipe's spans into an OpenTelemetry SDK tracer for a fraction of the SDK span's cost.

The SDK's span costs about 10-20 us from start to end: a sampler call, parent lookups in the context,
locks, bounded attribute containers, the processors' start and ending hooks, and a second object built at
the end for the processors. A pipeline call makes a span per step, so :mod:`mcpipe.telemetry` records its
spans here when it can: the same ids, sampling decision, trace flags, resource, scope and limits as the
SDK's ``Tracer.start_span``, and at the end the span itself (an SDK ``ReadableSpan``, frozen once ended)
handed to the same processors' ``on_end``. That holds while every processor of the provider ignores span
starts (the SDK's batch and simple processors do: exporters only see ended spans) and the provider keeps
its default synchronous multi-processor; with any other processor, or the tracer disabled, the recorder's
methods answer None (or False) and the SDK makes the spans itself.

A pipeline's function-tool steps, whose spans nothing needs while they run, are only noted (a tuple each)
under their parent span and recorded together when it ends (:meth:`Recorder.step_ended`).

Imported only once an SDK tracer exists (it imports the SDK).
"""

from __future__ import annotations

import functools
import random
import time
import traceback
from collections.abc import Callable, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context, detach, get_current
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor, Tracer, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.propagation import _SPAN_KEY
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from mcpipe._util import is_suspension
from mcpipe.telemetry import STEP_ATTRIBUTE, TOOL_ATTRIBUTE

__all__ = ["Recorder"]

_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)
_INTERNAL = SpanKind.INTERNAL
_NO_STATE = DEFAULT_TRACE_STATE
_SPAN_ID_LIMIT = 2**64
_new_tuple = tuple.__new__
_new_object = object.__new__
# The current context, whose span key holds a Span (the trace API puts nothing else there): with the
# default runtime context, its ContextVar's get, otherwise the API's get_current.
_runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
_var = getattr(_runtime, "_current_context", None) if type(_runtime) is ContextVarsRuntimeContext else None
_current_context = cast(Callable[[], Mapping[str, Span]], _var.get if isinstance(_var, ContextVar) else get_current)
_random_bits64 = functools.partial(random.getrandbits, 64)
_FLAGS = tuple(TraceFlags(f) for f in range(4))  # sampled | random trace id
_PRIVATE = ("_span_limits", "_instrumentation_scope", "_tracer_config")  # the SDK tracer's fields read here
_QUIET = (SpanProcessor, BatchSpanProcessor, SimpleSpanProcessor)


def _ignores_starts(processor: SpanProcessor) -> bool:
    """Whether ``processor``'s ``on_start`` and ``_on_ending`` hooks do nothing (the SDK's base, batch and
    simple processors')."""
    kind = type(processor)
    return any(kind.on_start is q.on_start for q in _QUIET) and any(kind._on_ending is q._on_ending for q in _QUIET)


class RecordedSpan(Span, ReadableSpan):
    """A span of a :class:`Recorder`: the OpenTelemetry ``Span`` interface over the SDK's ``ReadableSpan``
    fields, handed as is to the processors when it ends (nothing changes it after). Attributes other code
    sets on it go through the SDK's ``BoundedAttributes`` (its checks and limits); mcpipe's own, known
    good, are kept in the dict they came in. Each recorder makes a subclass holding its tracer's constant
    fields (resource, scope, processor), so a span sets only its own."""

    _rec: Recorder
    _context: SpanContext  # (optional in a ReadableSpan; a span's is always set)
    _events: Any = ()
    _links: Any = ()
    _status: Status = _UNSET
    _end_time: int | None = None
    _ended: Callable[[], None] | None = None  # the SDK's own span metrics, when they are on
    _token: Token[Context] | None = None  # the context token to detach when the span's ``with`` block exits
    # Its children's step spans to record when it ends (:meth:`Recorder.step_ended`): (step id, tool, start, end,
    # failed) each, failed being False, True (a tool error) or the name of the type of what the step raised.
    _steps: list[tuple[str, str, int, int, bool | str]] | None = None

    def __init__(
        self, name: str, context: SpanContext, parent: SpanContext | None, kind: SpanKind, attributes: Any, start: int
    ) -> None:
        self._name, self._context, self._parent, self._kind = name, context, parent, kind
        self._attributes, self._start_time = attributes, start

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def _bounded(self) -> BoundedAttributes:
        attrs = self._attributes
        if type(attrs) is not BoundedAttributes:
            limits = self._rec.limits
            attrs = self._attributes = BoundedAttributes(
                limits.max_span_attributes, attrs, immutable=False, max_value_len=limits.max_span_attribute_length
            )
        return attrs

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end_time is None:
            self._bounded()[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end_time is None:
            attrs = self._bounded()
            for key, value in attributes.items():
                attrs[key] = value

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        if self._end_time is None:
            if not isinstance(self._events, list):
                self._events = []
            limit = self._rec.limits.max_events
            if limit is None or len(self._events) < limit:
                self._events.append(Event(name, attributes, timestamp))

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        if self._end_time is None and context.is_valid:
            self._links = [*self._links, Link(context, attributes)]

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end_time is not None:
            return
        if not isinstance(status, Status):
            status = Status(status, description)
        if status.status_code is StatusCode.UNSET or self._status.status_code is StatusCode.OK:
            return  # the SDK's rules: UNSET changes nothing, OK is final
        self._status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: Any = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        event = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        self.add_event("exception", {**event, **(attributes or {})}, timestamp)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """The end of the span's ``with`` block: failed if it raised (like the SDK's span; a 2026-07-28
        suspension is no failure), the context it was made current in detached, ended."""
        if exc is not None and self._end_time is None and not is_suspension(exc):
            self.set_status(_ERROR)
            self.set_attribute("error.type", type(exc).__qualname__)
        if self._token is not None:
            detach(self._token)
        self.end()

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            return
        self._end_time = end_time if end_time is not None else time.time_ns()
        if self._steps is not None:
            self._rec.record_steps(self)
        if type(self._attributes) is BoundedAttributes:  # (not isinstance: an ABC's check is a Python call)
            self._attributes._immutable = True
        if self._ended is not None:
            self._ended()
        for processor in self._rec.processor._span_processors:  # what the synchronous multi-processor does
            processor.on_end(self)


class Recorder:
    """Starts :class:`RecordedSpan` spans for one SDK ``Tracer``.

    Args:
        tracer: the SDK tracer.
        otherwise: how a step's span is recorded when :meth:`step_ended` cannot note it.
    """

    def __init__(self, tracer: Tracer, otherwise: Callable[[str, str, int, bool | BaseException], None]) -> None:
        self.tracer = tracer
        self.otherwise = otherwise
        self.processor = tracer.span_processor
        self.limits = tracer._span_limits
        self.new_trace_id = tracer.id_generator.generate_trace_id
        ids = tracer.id_generator
        # The SDK's random ids, without its generator's Python-level call (a zero span id comes out invalid).
        self.new_span_id = _random_bits64 if type(ids) is RandomIdGenerator else ids.generate_span_id
        self.random_ids = tracer.id_generator.is_trace_id_random()
        metrics = getattr(tracer, "_tracer_metrics", None)  # the SDK's own span metrics (SDK 1.39 and later)
        self.span_metrics = None if metrics is None or type(metrics).__name__ == "NoOpTracerMetrics" else metrics
        sampler = tracer.sampler
        # The default sampler (parent-based, always on) and always-on decide without being called.
        self.sampler = None if sampler is sampling.DEFAULT_ON or sampler is sampling.ALWAYS_ON else sampler
        self.always = sampler is sampling.ALWAYS_ON
        # Spans nothing needs to see as they start: the default samplers decide by the parent's flags.
        self.plain = self.sampler is None and self.span_metrics is None
        fields = {
            "_rec": self,
            "_resource": tracer.resource,
            "_instrumentation_scope": tracer._instrumentation_scope,
            "_instrumentation_info": tracer.instrumentation_info,
        }
        self.span_type: type[RecordedSpan] = type("RecordedSpan", (RecordedSpan,), fields)
        self._seen: Any = None
        self._quiet = False

    @classmethod
    def of(cls, tracer: object, otherwise: Callable[[str, str, int, bool | BaseException], None]) -> Recorder | None:
        """A recorder for ``tracer`` if it is the OpenTelemetry SDK's, else None."""
        if type(tracer) is not Tracer or not all(hasattr(tracer, f) for f in _PRIVATE):
            return None
        # The provider's default processor, whose on_end calls each processor's in turn (as a span here does).
        if type(tracer.span_processor) is not SynchronousMultiSpanProcessor:
            return None
        return cls(tracer, otherwise)

    def _look(self) -> None:
        """Whether no processor looks at spans before they end, for the provider's processors now."""
        self._seen = processors = self.processor._span_processors
        self._quiet = all(_ignores_starts(p) for p in processors)

    def child(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Span | None:
        """A started span, child of the current one (what the SDK's ``start_span`` does with no context);
        None when the recorder cannot stand in for the SDK now (a processor that looks at starts was added,
        or the tracer was disabled): then the SDK must make it."""
        if self.processor._span_processors is not self._seen:
            self._look()
        if not (self._quiet and self.tracer._tracer_config.is_enabled):
            return None
        current = _current_context().get(_SPAN_KEY)  # the API's get_current_span, minus two calls
        return self._start(name, None if current is None else current.get_span_context(), kind, attributes)

    def start(self, name: str, parent: SpanContext | None, kind: SpanKind, attributes: dict[str, Any]) -> Span | None:
        """A started span, child of ``parent`` (None or invalid: a root); None as for :meth:`child`."""
        if self.processor._span_processors is not self._seen:
            self._look()
        if not (self._quiet and self.tracer._tracer_config.is_enabled):
            return None
        return self._start(name, parent, kind, attributes)

    def ended(self, name: str, attributes: dict[str, Any], start: int, failed: bool | BaseException) -> bool:
        """Record a span that started at ``start`` and ends now, a child of the current one, failed as
        ``failed`` says (a tool error, or what it raised); False when the recorder cannot (see :meth:`child`).
        One call for a span nothing needed while it ran (a function tool's step)."""
        if self.processor._span_processors is not self._seen:
            self._look()
        if not (self._quiet and self.tracer._tracer_config.is_enabled):
            return False
        current = _current_context().get(_SPAN_KEY)
        parent = None if current is None else current.get_span_context()
        if parent is None or not parent[5] or self.sampler is not None or self.span_metrics is not None:
            span = self._start(name, parent, SpanKind.INTERNAL, attributes, start)
        else:  # the usual case, inline: a child of a valid span, the default sampler deciding by its flags
            flags = parent[3]
            if not (flags & 1 or self.always):
                return True  # dropped with its parent: a non-recording span, which nobody would see
            span_id = self.new_span_id()
            context = (parent[0], span_id, False, _FLAGS[1 | (flags & 2)], parent[4], 0 < span_id < _SPAN_ID_LIMIT)
            span = self.span_type(name, _new_tuple(SpanContext, context), parent, SpanKind.INTERNAL, attributes, start)
        if failed is True:
            span.set_status(_ERROR)
        elif failed is not False and not is_suspension(failed):
            span.set_status(_ERROR)
            span.set_attribute("error.type", type(failed).__qualname__)
        span.end()
        return True

    def step_ended(self, step: str, name: str, start: int, failed: bool | BaseException) -> None:
        """The span ``step <step> <name>`` of a step that started at ``start`` and ends now, a child of the
        current span (what :meth:`mcpipe.telemetry.Telemetry.step_ended` does): noted under that span, to
        record when it ends (:meth:`record_steps`). When the current span is none of this recorder's
        recording ones, or the recorder cannot stand in for the SDK now, or its sampler or span metrics must
        see each span as it starts: recorded now by :attr:`otherwise` (:meth:`ended`, or the SDK).

        Why later: a pipeline's function-tool steps each make a span nothing needs while it runs, one after
        another under one parent. Noted here, a step costs a tuple; the checks :meth:`ended` makes per span
        (processors, sampler, parent) and the span objects are made once per parent, in one loop. Exporters
        see ended spans only, in batches: the steps' spans reach them with their parent's, a little later,
        with the times they had."""
        parent = _current_context().get(_SPAN_KEY)
        if (
            type(parent) is not self.span_type
            or parent._end_time is not None
            or self.processor._span_processors is not self._seen
            or not (self._quiet and self.plain and self.tracer._tracer_config.is_enabled)
        ):
            self.otherwise(step, name, start, failed)
            return
        # What it raised is kept as its type's name, not with its traceback.
        outcome = failed if isinstance(failed, bool) else False if is_suspension(failed) else type(failed).__qualname__
        steps = parent._steps
        if steps is None:
            steps = parent._steps = []
        steps.append((step, name, start, time.time_ns(), outcome))

    def record_steps(self, parent: RecordedSpan) -> None:
        """Record the step spans :meth:`step_ended` noted under ``parent`` (ending now): what :meth:`ended`
        records for each, the default sampler's decision being the parent's (sampled: it records)."""
        steps, parent._steps = parent._steps or (), None
        context = parent._context
        trace_id, flags, state = context[0], _FLAGS[1 | (context[3] & 2)], context[4]
        new_span_id, make, processors = self.new_span_id, self.span_type, self.processor._span_processors
        for step, name, start, end, failed in steps:
            span_id = new_span_id()
            own = _new_tuple(SpanContext, (trace_id, span_id, False, flags, state, 0 < span_id < _SPAN_ID_LIMIT))
            # What ``make(name, own, context, INTERNAL, attributes, start)`` does, minus its ``__init__`` call.
            span = _new_object(make)
            span._name, span._context, span._parent, span._kind = f"step {step} {name}", own, context, _INTERNAL
            span._attributes, span._start_time = {STEP_ATTRIBUTE: step, TOOL_ATTRIBUTE: name}, start
            if failed is False:  # what ``end`` does, for a span with neither span metrics nor bounded attributes
                span._end_time = end
                for processor in processors:
                    processor.on_end(span)
                continue
            span.set_status(_ERROR)
            if failed is not True:
                span.set_attribute("error.type", failed)
            span.end(end)

    def _start(
        self,
        name: str,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        start: int | None = None,
    ) -> Span:
        """A started span, or a non-recording one when the sampler drops it. A ``SpanContext`` is a tuple
        (trace id, span id, remote, flags, trace state, valid): read and made here as such, since its
        properties and its ``__new__`` are Python-level calls, several per span."""
        if parent is None or not parent[5]:
            parent = None
            trace_id = self.new_trace_id()
            random_id = self.random_ids
        else:
            trace_id = parent[0]
            random_id = bool(parent[3] & 2)
        sampler = self.sampler
        if sampler is None:
            sampled = recording = self.always or parent is None or bool(parent[3] & 1)
            trace_state = _NO_STATE if parent is None else parent[4]
        else:
            ctx = Context() if parent is None else set_span_in_context(NonRecordingSpan(parent))
            result = sampler.should_sample(ctx, trace_id, name, kind, attributes, ())
            sampled, recording = result.decision.is_sampled(), result.decision.is_recording()
            trace_state = _NO_STATE if result.trace_state is None else result.trace_state
            attributes = dict(result.attributes)
        span_id = self.new_span_id()
        flags = _FLAGS[(1 if sampled else 0) | (2 if random_id else 0)]
        # The trace id is valid here; a custom id generator's span id is checked.
        context = _new_tuple(SpanContext, (trace_id, span_id, False, flags, trace_state, 0 < span_id < _SPAN_ID_LIMIT))
        ended = None
        if self.span_metrics is not None:
            decision = sampling.Decision
            chosen = decision.RECORD_AND_SAMPLE if sampled else decision.RECORD_ONLY if recording else decision.DROP
            ended = self.span_metrics.start_span(parent, chosen)
        if not recording:
            return NonRecordingSpan(context)
        span = self.span_type(name, context, parent, kind, attributes, time.time_ns() if start is None else start)
        if ended is not None:
            span._ended = ended
        return span
