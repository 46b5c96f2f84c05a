"""Metrics at ``GET /metrics`` (one process, and aggregated over ``--workers 2``) and OpenTelemetry traces
(the SDK's in-memory exporter): a span per incoming call, children per pipeline step and per downstream
call, the caller's ``traceparent`` read from ``_meta`` and carried on to the downstream server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from kit.servers import http_server, make_config, running
from kit.tools import BLOCKED
from kit.workers import call, pid_of, supervised
from mcpipe import telemetry
from mcpipe.config import ConfigError

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 60
TRACED = str(Path(__file__).with_name("traced_server.py"))
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics: sample name and labels -> value."""
    async with httpx2.AsyncClient() as http:
        r = await http.get(url.rsplit("/", 1)[0] + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def delta(after: dict[Any, float], before: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def test_metrics_count_calls_by_tool_and_outcome_steps_by_kind_and_calls_in_flight() -> None:
    spec = {
        "steps": [
            {"id": "first", "tool": "echo", "args": {"a": 1}},
            {
                "id": "both",
                "parallel": [{"id": "e", "tool": "echo", "args": {}}, {"id": "g", "tool": "echo", "args": {}}],
            },
            {"id": "last", "tool": "fail", "args": {}},
        ]
    }
    BLOCKED["metrics"] = trio.Event()
    with trio.fail_after(WAIT_S):
        async with running() as app, http_server(app) as url, trio.open_nursery() as nursery:
            before = await scrape(url)
            async with Client(url, mode="2026-07-28") as c:
                await c.call_tool("echo", {"x": 1})
                await c.call_tool("fail", {})
                await c.call_tool("mcp_pipe", spec)
                await c.call_tool("no_such_tool", {})

            async def blocked() -> None:
                async with Client(url, mode="2026-07-28") as c:
                    await c.call_tool("block", {"tag": "metrics"})

            nursery.start_soon(blocked)
            await BLOCKED["metrics"].wait()
            during = await scrape(url)
            nursery.cancel_scope.cancel()
    assert delta(during, before, "mcpipe_calls_total", tool="echo", outcome="ok") == 1
    assert delta(during, before, "mcpipe_calls_total", tool="fail", outcome="error") == 1
    assert delta(during, before, "mcpipe_calls_total", tool="mcp_pipe", outcome="error") == 1  # a step failed
    assert delta(during, before, "mcpipe_calls_total", tool="other", outcome="error") == 1  # unknown: no new label
    assert delta(during, before, "mcpipe_call_duration_seconds_count", tool="echo") == 1
    assert delta(during, before, "mcpipe_pipeline_steps_total", kind="tool", outcome="ok") == 3
    assert delta(during, before, "mcpipe_pipeline_steps_total", kind="tool", outcome="failed") == 1
    assert delta(during, before, "mcpipe_pipeline_steps_total", kind="parallel", outcome="ok") == 1
    assert delta(during, before, "mcpipe_calls_in_flight") == 1


async def test_the_downstream_up_gauge_follows_each_server() -> None:
    config = make_config(mcpServers={"traced": {"command": sys.executable, "args": [TRACED]}})
    with trio.fail_after(WAIT_S):
        async with running(config) as app, http_server(app) as url:
            samples = await scrape(url)
    assert samples[("mcpipe_downstream_up", (("server", "traced"),))] == 1


async def test_downstream_calls_are_counted_by_server_and_outcome_and_timed() -> None:
    config = make_config(mcpServers={"traced": {"command": sys.executable, "args": [TRACED]}})
    with trio.fail_after(WAIT_S):
        async with running(config) as app, http_server(app) as url:
            before = await scrape(url)
            tel = telemetry.current()
            assert tel is not None
            for seconds, ok in ((0.002, True), (0.004, True), (0.5, False)):
                tel.observe_downstream("traced", seconds, ok)
            after = await scrape(url)
    assert delta(after, before, "mcpipe_downstream_calls_total", server="traced", outcome="ok") == 2
    assert delta(after, before, "mcpipe_downstream_calls_total", server="traced", outcome="error") == 1
    assert delta(after, before, "mcpipe_downstream_call_duration_seconds_count", server="traced") == 3
    assert delta(after, before, "mcpipe_downstream_call_duration_seconds_sum", server="traced") == pytest.approx(0.506)
    assert delta(after, before, "mcpipe_downstream_call_duration_seconds_bucket", server="traced", le="+Inf") == 3


async def test_metrics_off_answers_404() -> None:
    config = make_config(telemetry={"metrics": False})
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.get(url.rsplit("/", 1)[0] + "/metrics")
    assert r.status_code == 404


async def test_with_two_workers_any_worker_reports_the_calls_of_both(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup:
            workers = sorted(sup.workers())
            served = []
            for pid, n in zip(workers, (3, 2), strict=True):
                with sup.only(pid):
                    for _ in range(n):
                        served.append(pid_of(await call(sup.url, "2026-07-28", "whoami", {})))
            assert sorted(set(served)) == workers
            for pid in workers:
                with sup.only(pid):
                    samples = await scrape(sup.url)
                assert samples[("mcpipe_calls_total", (("outcome", "ok"), ("tool", "whoami")))] == 5


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Where a test's spans go (a test installs its tracer once its app started, replacing the app's)."""
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()
    telemetry.install(None)


def trace_into(exporter: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install(telemetry.Telemetry(tracer_provider=provider))


def by_name(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name.startswith(prefix)]


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_a_call_is_a_span_with_children_per_step_and_per_downstream_call(
    spans: InMemorySpanExporter, mode: str
) -> None:
    config = make_config(mcpServers={"traced": {"command": sys.executable, "args": [TRACED]}})
    spec = {
        "steps": [{"id": "a", "tool": "echo", "args": {"v": 1}}, {"id": "b", "tool": "traced.traceparent", "args": {}}],
        "answer": "full",
    }
    with trio.fail_after(WAIT_S):
        async with running(config) as app, http_server(app) as url:
            trace_into(spans)
            async with Client(url, mode=mode) as c:
                r = await c.session.call_tool("mcp_pipe", spec, meta={"traceparent": PARENT})
    assert not r.is_error and r.structured_content is not None, r.content
    seen_downstream = r.structured_content["steps"]["b"]["text"]
    finished = spans.get_finished_spans()
    [root] = by_name(finished, "tools/call mcp_pipe")
    step_a, step_b = sorted(by_name(finished, "step "), key=lambda s: s.name)
    [down] = by_name(finished, "downstream traced traceparent")
    assert format(root.context.trace_id, "032x") == PARENT_TRACE  # the caller's trace continues
    assert root.parent is not None and format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert step_a.parent is not None and step_a.parent.span_id == root.context.span_id
    assert step_b.parent is not None and step_b.parent.span_id == root.context.span_id
    assert down.parent is not None and down.parent.span_id == step_b.context.span_id
    assert step_a.name == "step a echo" and step_b.name == "step b traced.traceparent"
    # The downstream server received the downstream span's context in its request's _meta.
    assert seen_downstream == f"00-{PARENT_TRACE}-{format(down.context.span_id, '016x')}-01"


async def test_propagate_records_nothing_but_carries_the_callers_traceparent_on_downstream() -> None:
    config = make_config(
        mcpServers={"traced": {"command": sys.executable, "args": [TRACED]}}, telemetry={"traces": "propagate"}
    )
    spec = {"steps": [{"id": "b", "tool": "traced.traceparent", "args": {}}], "answer": "full"}
    with trio.fail_after(WAIT_S):
        async with running(config) as app, http_server(app) as url, Client(url, mode="2026-07-28") as c:
            r = await c.session.call_tool("mcp_pipe", spec, meta={"traceparent": PARENT})
            plain = await c.session.call_tool("mcp_pipe", spec)
    assert r.structured_content is not None and plain.structured_content is not None
    assert r.structured_content["steps"]["b"]["text"] == PARENT  # the caller's own context, unchanged
    assert plain.structured_content["steps"]["b"]["text"] == "none"  # nothing invented without a caller's trace


def test_tracing_is_off_unless_configured_or_the_otel_variables_say_so() -> None:
    section = make_config().telemetry
    assert telemetry.traces_exporter(section, {}) is None
    assert telemetry.traces_exporter(section, {"OTEL_TRACES_EXPORTER": "none"}) is None
    assert telemetry.traces_exporter(section, {"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert telemetry.traces_exporter(section, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "otlp"
    assert telemetry.traces_exporter(make_config(telemetry={"traces": "console"}).telemetry, {}) == "console"
    assert (
        telemetry.traces_exporter(
            make_config(telemetry={"traces": "none"}).telemetry, {"OTEL_TRACES_EXPORTER": "console"}
        )
        is None
    )


def test_a_trace_exporter_of_no_known_kind_is_a_located_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(telemetry={"traces": "zipkin"})
    assert [p.location for p in caught.value.problems] == ["telemetry.traces"]


class WatchesStarts(SimpleSpanProcessor):
    """A processor that looks at spans when they start: the SDK then makes mcpipe's spans itself."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        super().__init__(exporter)
        self.started: list[str] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span.name)


def shape(finished: tuple[ReadableSpan, ...]) -> list[tuple[Any, ...]]:
    """Each span as (name, kind, attributes, status, description, parent's name), in name order."""
    by_id = {s.context.span_id: s.name for s in finished}
    return sorted(
        (
            s.name,
            s.kind.name,
            dict(s.attributes or {}),
            s.status.status_code.name,
            by_id.get(s.parent.span_id) if s.parent is not None else None,
        )
        for s in finished
    )


PIPES = [
    {"steps": [{"id": "a", "tool": "echo", "args": {"v": 1}}, {"id": "b", "tool": "fail", "args": {}}]},
    {"steps": [{"id": "r", "tool": "boom", "args": {}}]},
]


async def pipe_calls(provider: TracerProvider) -> None:
    """Both :data:`PIPES` as ``mcp_pipe`` calls (in memory), traced into ``provider``."""
    with trio.fail_after(WAIT_S):
        async with running() as app, Client(app.server, mode="2026-07-28") as c:
            telemetry.install(telemetry.Telemetry(tracer_provider=provider))
            for spec in PIPES:
                r = await c.session.call_tool("mcp_pipe", spec, meta={"traceparent": PARENT})
                assert r.is_error


async def test_step_spans_keep_the_times_their_steps_ran_within_the_call(spans: InMemorySpanExporter) -> None:
    # Function-tool steps' spans are recorded when the call's span ends: each keeps its own start and end.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    chain = [{"id": f"s{i}", "tool": "slow", "args": {"seconds": 0.001}} for i in range(1, 5)]  # one after another
    with trio.fail_after(WAIT_S):
        async with running() as app, Client(app.server, mode="2026-07-28") as c:
            telemetry.install(telemetry.Telemetry(tracer_provider=provider))
            r = await c.session.call_tool("mcp_pipe", {"steps": chain}, meta={"traceparent": PARENT})
    assert not r.is_error, r.content
    finished = spans.get_finished_spans()
    [root] = by_name(finished, "tools/call mcp_pipe")
    steps = sorted(by_name(finished, "step "), key=lambda s: s.name)
    assert [s.name for s in steps] == [f"step s{i} slow" for i in range(1, 5)]
    times = [t for s in steps for t in (s.start_time, s.end_time)]
    assert root.start_time is not None and root.end_time is not None
    assert root.start_time <= times[0] and times[-1] <= root.end_time
    assert times == sorted(times) and steps[0].end_time != steps[-1].end_time  # one after another
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in steps)


async def test_spans_carry_their_kind_attributes_and_error_status(spans: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    await pipe_calls(provider)
    finished = spans.get_finished_spans()
    assert shape(finished) == [
        (
            "step a echo",
            "INTERNAL",
            {"mcpipe.step.id": "a", "gen_ai.tool.name": "echo"},
            "UNSET",
            "tools/call mcp_pipe",
        ),
        (
            "step b fail",
            "INTERNAL",
            {"mcpipe.step.id": "b", "gen_ai.tool.name": "fail"},
            "ERROR",
            "tools/call mcp_pipe",
        ),
        (
            "step r boom",
            "INTERNAL",
            {"mcpipe.step.id": "r", "gen_ai.tool.name": "boom", "error.type": "RuntimeError"},
            "ERROR",
            "tools/call mcp_pipe",
        ),
        (
            "tools/call mcp_pipe",
            "SERVER",
            {"mcp.method.name": "tools/call", "gen_ai.tool.name": "mcp_pipe"},
            "ERROR",
            None,
        ),
        (
            "tools/call mcp_pipe",
            "SERVER",
            {"mcp.method.name": "tools/call", "gen_ai.tool.name": "mcp_pipe"},
            "ERROR",
            None,
        ),
    ]
    for s in finished:
        assert format(s.context.trace_id, "032x") == PARENT_TRACE and s.context.trace_flags.sampled
        assert s.instrumentation_scope is not None and s.instrumentation_scope.name == "mcpipe"
        assert s.resource is provider.resource and s.start_time is not None and s.end_time is not None
        assert s.start_time <= s.end_time
    assert len({s.context.span_id for s in finished}) == len(finished)


@pytest.mark.parametrize(
    "sampler",
    [
        sampling.DEFAULT_ON,
        sampling.ALWAYS_OFF,
        sampling.TraceIdRatioBased(1.0),
        sampling.ParentBased(sampling.ALWAYS_OFF),
    ],
    ids=["default", "always-off", "ratio", "parent-based-off"],
)
async def test_the_spans_recorded_without_the_sdk_span_are_the_ones_the_sdk_makes(sampler: sampling.Sampler) -> None:
    recorded, made = InMemorySpanExporter(), InMemorySpanExporter()
    plain = TracerProvider(sampler=sampler)
    plain.add_span_processor(SimpleSpanProcessor(recorded))
    watched = TracerProvider(sampler=sampler)
    watcher = WatchesStarts(made)
    watched.add_span_processor(watcher)
    try:
        await pipe_calls(plain)
        await pipe_calls(watched)
    finally:
        telemetry.install(None)
    # The processor that looks at starts saw every span start: the SDK made those.
    assert sorted(watcher.started) == sorted(s.name for s in made.get_finished_spans())
    assert shape(recorded.get_finished_spans()) == shape(made.get_finished_spans())
    if sampler is not sampling.ALWAYS_OFF:  # the caller's trace is sampled: every span is
        assert len(made.get_finished_spans()) == 5
        assert {type(s).__name__ for s in made.get_finished_spans()} == {"ReadableSpan"}
        assert {type(s).__name__ for s in recorded.get_finished_spans()} == {"RecordedSpan"}
    else:
        assert made.get_finished_spans() == recorded.get_finished_spans() == ()


async def test_a_caller_trace_not_sampled_records_no_spans_and_goes_on_unsampled(
    spans: InMemorySpanExporter,
) -> None:
    config = make_config(mcpServers={"traced": {"command": sys.executable, "args": [TRACED]}})
    spec = {"steps": [{"id": "b", "tool": "traced.traceparent", "args": {}}], "answer": "full"}
    unsampled = f"00-{PARENT_TRACE}-00f067aa0ba902b7-00"
    with trio.fail_after(WAIT_S):
        async with running(config) as app, Client(app.server, mode="2026-07-28") as c:
            trace_into(spans)
            r = await c.session.call_tool("mcp_pipe", spec, meta={"traceparent": unsampled})
    assert r.structured_content is not None, r.content
    seen = r.structured_content["steps"]["b"]["text"]
    assert spans.get_finished_spans() == ()
    version, trace_id, span_id, flags = seen.split("-")
    assert (version, trace_id, flags) == ("00", PARENT_TRACE, "00") and span_id != "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (PARENT, (int(PARENT_TRACE, 16), 0x00F067AA0BA902B7, 1)),
        (f"00-{PARENT_TRACE}-00f067aa0ba902b7-00", (int(PARENT_TRACE, 16), 0x00F067AA0BA902B7, 0)),
        (f" 00-{PARENT_TRACE}-00f067aa0ba902b7-01 ", (int(PARENT_TRACE, 16), 0x00F067AA0BA902B7, 1)),
        (f"01-{PARENT_TRACE}-00f067aa0ba902b7-01-future", (int(PARENT_TRACE, 16), 0x00F067AA0BA902B7, 1)),
        (f"00-{PARENT_TRACE}-00f067aa0ba902b7-01-extra", None),  # version 00 ends at the flags
        (f"ff-{PARENT_TRACE}-00f067aa0ba902b7-01", None),  # version ff is forbidden
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),  # an all-zero trace id
        (f"00-{PARENT_TRACE}-{'0' * 16}-01", None),  # an all-zero span id
        (PARENT.upper(), None),  # hex digits are lowercase
        (f"00-{'g' * 32}-00f067aa0ba902b7-01", None),
        ("00-abc-def-01", None),
        ("", None),
    ],
)
def test_a_traceparent_is_read_as_the_w3c_propagator_reads_it(
    value: str, expected: tuple[int, int, int] | None
) -> None:
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parsed = telemetry.parse_traceparent(value)
    got = None if parsed is None else (parsed.trace_id, parsed.span_id, parsed.trace_flags)
    assert got == expected
    theirs = get_current_span(TraceContextTextMapPropagator().extract({"traceparent": value})).get_span_context()
    assert (theirs.trace_id, theirs.span_id, theirs.trace_flags) == (got if got is not None else (0, 0, 0))
    if parsed is not None:
        assert parsed.is_remote and parsed.is_valid
