"""What the console shows of the metrics: read from the Prometheus registry ``/metrics`` serves (every worker's,
in multiprocess mode), never counted a second time.

A :class:`Sampler` keeps a few recent readings so rates (calls per second) can be told; it reads only when a
metrics page or stream asks, so nobody looking costs nothing.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Reading", "Sampler", "quantile", "read_metrics"]


@dataclass(slots=True)
class Reading:
    """The counters at one moment (``at``: Unix seconds)."""

    at: float
    calls: dict[tuple[str, str], float] = field(default_factory=dict)
    """Calls by (tool, outcome)."""
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Each tool's duration histogram: (upper bound, cumulative count), ascending."""
    principals: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[tuple[str, str], float] = field(default_factory=dict)
    """Error results by (tool, code)."""
    downstream: dict[tuple[str, str], float] = field(default_factory=dict)
    downstream_buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    runs: dict[str, float] = field(default_factory=dict)
    in_flight: float = 0.0
    up: dict[str, float] = field(default_factory=dict)

    def total_calls(self) -> float:
        return sum(self.calls.values())


def _registry_families() -> Iterable[Any]:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from mcpipe.telemetry import MULTIPROC_ENV

    path = os.environ.get(MULTIPROC_ENV)
    if path:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)
        return registry.collect()
    return REGISTRY.collect()


def read_metrics() -> Reading:
    """The metrics as they are now."""
    r = Reading(time.time())
    hist: dict[str, dict[str, dict[float, float]]] = {"tool": {}, "server": {}}
    for family in _registry_families():
        name = family.name
        for s in family.samples:
            labels = s.labels
            if name == "mcpipe_calls" and s.name == "mcpipe_calls_total":
                r.calls[(labels.get("tool", ""), labels.get("outcome", ""))] = s.value
            elif name == "mcpipe_call_duration_seconds" and s.name.endswith("_bucket"):
                hist["tool"].setdefault(labels.get("tool", ""), {})[_le(labels.get("le"))] = s.value
            elif name == "mcpipe_principal_calls" and s.name.endswith("_total"):
                r.principals[(labels.get("principal", ""), labels.get("outcome", ""))] = s.value
            elif name == "mcpipe_call_errors" and s.name.endswith("_total"):
                r.errors[(labels.get("tool", ""), labels.get("code", ""))] = s.value
            elif name == "mcpipe_downstream_calls" and s.name.endswith("_total"):
                r.downstream[(labels.get("server", ""), labels.get("outcome", ""))] = s.value
            elif name == "mcpipe_downstream_call_duration_seconds" and s.name.endswith("_bucket"):
                hist["server"].setdefault(labels.get("server", ""), {})[_le(labels.get("le"))] = s.value
            elif name == "mcpipe_runs":
                r.runs[labels.get("status", "")] = s.value
            elif name == "mcpipe_calls_in_flight":
                r.in_flight += s.value
            elif name == "mcpipe_downstream_up":
                r.up[labels.get("server", "")] = s.value
    r.buckets = {k: sorted(v.items()) for k, v in hist["tool"].items()}
    r.downstream_buckets = {k: sorted(v.items()) for k, v in hist["server"].items()}
    return r


def _le(value: str | None) -> float:
    try:
        return float(value) if value is not None else float("inf")
    except ValueError:
        return float("inf")


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a cumulative histogram, interpolated within its bucket as Prometheus's
    ``histogram_quantile`` does; None without observations."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 0.0)
        lower, below = upper, count
    return lower


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]] | None) -> list[tuple[float, float]]:
    if not b:
        return a
    before = dict(b)
    return [(le, c - before.get(le, 0.0)) for le, c in a]


class Sampler:
    """Recent readings, taken when asked (at most one a second), kept for ``keep_s``.

    Args:
        keep_s: how far back the rates and the chart look.
        started: when the server started (Unix s): the rate of a first reading is since then.
    """

    def __init__(self, keep_s: float = 300.0, started: float | None = None) -> None:
        self.keep_s = keep_s
        self.started = time.time() if started is None else started
        self.readings: deque[Reading] = deque()

    def sample(self) -> Reading:
        """A reading now (the last one, when it is under a second old)."""
        now = time.time()
        if self.readings and now - self.readings[-1].at < 1.0:
            return self.readings[-1]
        r = read_metrics()
        self.readings.append(r)
        while self.readings and now - self.readings[0].at > self.keep_s:
            self.readings.popleft()
        return r

    def summary(self, window_s: float = 60.0) -> dict[str, Any]:
        """The metrics at a glance: calls/s over the last ``window_s`` (since the server started, until there are
        two readings), p50/p99 per tool over that window, errors by code, the queue's depth, per tool and per
        principal, each downstream server's calls, error rate and latency, and the calls/s series for the
        chart."""
        now = self.sample()
        base = None
        for r in self.readings:
            if now.at - r.at <= window_s and r is not now:
                base = r
                break
        span = (now.at - base.at) if base is not None else max(1.0, now.at - self.started)
        window = "since the server started" if base is None else f"over the last {span:.0f} s"

        def delta(a: Mapping[Any, float], b: Mapping[Any, float] | None) -> dict[Any, float]:
            return {k: v - (b or {}).get(k, 0.0) for k, v in a.items()}

        calls = delta(now.calls, base.calls if base else None)
        tools = _by(calls, "tool")
        for tool, row in tools.items():
            row.update(_latency(now.buckets.get(tool, []), base.buckets.get(tool) if base else None))
            row["calls_per_s"] = round(row["calls"] / span, 3)
        principals = _by(delta(now.principals, base.principals if base else None), "principal")
        for who, row in principals.items():
            row["principal"] = who or None
            row["calls_per_s"] = round(row["calls"] / span, 3)
        codes: dict[str, float] = {}
        for (_, code), n in delta(now.errors, base.errors if base else None).items():
            codes[code] = codes.get(code, 0.0) + n
        servers = _by(delta(now.downstream, base.downstream if base else None), "server")
        for server, row in servers.items():
            was = base.downstream_buckets.get(server) if base else None
            row.update(_latency(now.downstream_buckets.get(server, []), was))
            row["error_rate"] = round(row["errors"] / row["calls"], 4) if row["calls"] else None
        total = sum(calls.values())
        all_buckets: dict[float, float] = {}
        for tool in tools:
            for le, c in _minus(now.buckets.get(tool, []), base.buckets.get(tool) if base else None):
                all_buckets[le] = all_buckets.get(le, 0.0) + c
        merged = sorted(all_buckets.items())
        series = []
        prev: Reading | None = None
        for r in self.readings:
            if prev is not None and r.at > prev.at:
                series.append([round(r.at, 3), round((r.total_calls() - prev.total_calls()) / (r.at - prev.at), 3)])
            prev = r
        return {
            "at": now.at,
            "window": window,
            "window_s": round(span, 3),
            "calls": total,
            "calls_per_s": round(total / span, 3),
            "p50_ms": _ms(quantile(merged, 0.5)),
            "p99_ms": _ms(quantile(merged, 0.99)),
            "in_flight": now.in_flight,
            "errors_by_code": dict(sorted(codes.items(), key=lambda kv: -kv[1])),
            "queue": {k: int(v) for k, v in now.runs.items()},
            "tools": sorted(tools.values(), key=lambda r: -r["calls"]),
            "principals": sorted(principals.values(), key=lambda r: -r["calls"]),
            "downstream": sorted(servers.values(), key=lambda r: r["server"]),
            "series": series,
        }


def _by(counts: Mapping[tuple[str, str], float], name: str) -> dict[str, dict[str, Any]]:
    """Counts by (key, outcome) as a row a key: ``{name: key, "calls": n, "errors": those not ok}``."""
    rows: dict[str, dict[str, Any]] = {}
    for (key, outcome), n in counts.items():
        row = rows.setdefault(key, {name: key, "calls": 0.0, "errors": 0.0})
        row["calls"] += n
        if outcome != "ok":
            row["errors"] += n
    return rows


def _latency(now: list[tuple[float, float]], base: list[tuple[float, float]] | None) -> dict[str, float | None]:
    """p50 and p99 (ms) of a histogram's buckets over the window (``now`` less ``base``)."""
    b = _minus(now, base)
    return {"p50_ms": _ms(quantile(b, 0.5)), "p99_ms": _ms(quantile(b, 0.99))}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
