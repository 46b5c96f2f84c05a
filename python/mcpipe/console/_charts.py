"""The console's charts, drawn on the server as SVG (so a page shows them with JavaScript off, and the page's CSP
needs no inline style: SVG's geometry is attributes). Every text in them is escaped here."""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["bars", "line", "timeline"]

ROW_H = 22
LABEL_W = 170
CHART_W = 560


def _ms(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1000:.1f} s"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    return f"{v:.1f} ms"


def timeline(t: dict[str, Any], title: str) -> str:
    """A run's timeline: one bar per step run (its start and length), the waits in the queue and on the
    client as bands behind them, a scale in seconds."""
    steps = t["steps"]
    total = max(float(t["total_ms"]), 1.0)
    rows = max(len(steps), 1)
    h = 30 + rows * ROW_H + 20
    w = LABEL_W + CHART_W + 60
    scale = CHART_W / total

    def x(ms: float) -> float:
        return LABEL_W + ms * scale

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" class="timeline" '
        f'role="img" '
        f'aria-labelledby="timeline-title"><title id="timeline-title">{escape(title)}</title>'
    ]
    for band, cls, what in [(b, "queued", "waiting in the queue") for b in t["queued"]] + [
        (b, "wait", "waiting for the client") for b in t["waits"]
    ]:
        end = band["end_ms"] if band["end_ms"] is not None else total
        x0, x1 = x(band["start_ms"]), x(end)
        out.append(
            f'<g class="band {cls}"><title>{escape(what)}: {escape(_ms(end - band["start_ms"]))}</title>'
            f'<rect x="{x0:.1f}" y="20" width="{max(x1 - x0, 1):.1f}" height="{rows * ROW_H + 4}" fill="#eef1f4"/>'
            f"</g>"
        )
    for i in range(5):
        ms = total * i / 4
        out.append(
            f'<g class="tick"><line x1="{x(ms):.1f}" y1="18" x2="{x(ms):.1f}" y2="{24 + rows * ROW_H}" '
            f'stroke="#d5dae0"/><text x="{x(ms):.1f}" y="12" text-anchor="middle">{escape(_ms(ms))}</text></g>'
        )
    for i, bar in enumerate(steps):
        y = 24 + i * ROW_H
        x0 = x(bar["start_ms"])
        width = max(bar["length_ms"] * scale, 2.0)
        label = bar["path"] if len(bar["path"]) <= 26 else "…" + bar["path"][-25:]
        retried = f", {bar['attempts']} attempts" if bar.get("attempts") and bar["attempts"] > 1 else ""
        said = f"{bar['path']}: {bar['state']}, from {_ms(bar['start_ms'])} for {_ms(bar['length_ms'])}{retried}"
        out.append(
            f'<a href="#{escape(bar["anchor"])}"><g class="bar state-{escape(bar["state"])}">'
            f"<title>{escape(said)}</title>"
            f'<text x="{LABEL_W - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{width:.1f}" height="{ROW_H - 7}" rx="3" fill="#7a8793"/>'
            f"</g></a>"
        )
        if retried:
            out.append(f'<text class="note" x="{x0 + width + 4:.1f}" y="{y + 15}">{escape(retried[2:])}</text>')
    out.append("</svg>")
    return "".join(out)


def bars(rows: list[dict[str, Any]], label: str, value: str, title: str, unit: str = "") -> str:
    """A horizontal bar chart of ``rows`` (their ``label`` and ``value`` keys)."""
    rows = [r for r in rows if isinstance(r.get(value), (int, float))][:20]
    top = max((float(r[value]) for r in rows), default=0.0) or 1.0
    h = 10 + max(len(rows), 1) * ROW_H
    w = LABEL_W + CHART_W + 90
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" class="bars" '
        f'role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    if not rows:
        out.append(f'<text x="10" y="20">{escape("nothing counted yet")}</text>')
    for i, r in enumerate(rows):
        y = 5 + i * ROW_H
        v = float(r[value])
        name = str(r.get(label) if r.get(label) not in (None, "") else "(anonymous)")
        shown = name if len(name) <= 26 else name[:25] + "…"
        out.append(
            f'<g class="bar"><title>{escape(name)}: {v:g}{escape(unit)}</title>'
            f'<text x="{LABEL_W - 6}" y="{y + 15}" text-anchor="end">{escape(shown)}</text>'
            f'<rect x="{LABEL_W}" y="{y + 3}" width="{max(CHART_W * v / top, 1.0):.1f}" height="{ROW_H - 7}" '
            f'rx="3" fill="#3f6fb5"/>'
            f'<text x="{LABEL_W + CHART_W * v / top + 6:.1f}" y="{y + 15}">{v:g}{escape(unit)}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


def line(series: list[list[float]], title: str) -> str:
    """Calls per second over time (``[unix seconds, value]`` pairs): a line, its peak and its latest value."""
    w, h, pad = 620, 160, 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" class="line" '
        f'role="img" '
        f'aria-label="{escape(title)}" id="rate-chart"><title>{escape(title)}</title>'
    ]
    if len(series) < 2:
        out.append(
            f'<text x="{pad}" y="{h / 2}">{escape("a second reading is needed: it comes in a few seconds")}</text>'
        )
        out.append("</svg>")
        return "".join(out)
    t0, t1 = series[0][0], series[-1][0]
    top = max(v for _, v in series) or 1.0
    span = max(t1 - t0, 1e-6)
    pts = " ".join(
        f"{pad + (t - t0) / span * (w - 2 * pad):.1f},{h - pad - v / top * (h - 2 * pad):.1f}" for t, v in series
    )
    out.append(f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#9aa5b1"/>')
    out.append(f'<polyline points="{pts}" fill="none" stroke="#3f6fb5" stroke-width="2"/>')
    out.append(f'<text x="{pad}" y="{pad - 10}">peak {top:g}/s</text>')
    out.append(f'<text x="{w - pad}" y="{pad - 10}" text-anchor="end">now {series[-1][1]:g}/s</text>')
    out.append(f'<text x="{pad}" y="{h - 8}">{span:.0f} s</text>')
    out.append("</svg>")
    return "".join(out)
