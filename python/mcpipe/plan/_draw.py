"""A plan drawn: its steps as boxes, ``parallel`` groups, ``pipe``\\ s, ``for_each`` and graphs as clusters, the
order they run in as arrows, a graph's arcs labelled with their conditions (arcs back dashed).

:func:`drawing` reads a plan into a :class:`Drawing` once; the drawing writes itself as Mermaid, Graphviz DOT or
SVG (laid out here in layers, no Graphviz needed), the SVG marked with what a run did (each step's state, the
arcs taken). ``mcpipe explain --format``, the console and the server's guide (a declared pipeline's resource) draw
with it, so all show the same picture.

A drawn step's ``key`` is its path in the run's events with every ``for_each`` element index written ``*``
(``pages.*.fetch``): :meth:`Drawing.key_of` maps an event's path onto it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from html import escape

from mcpipe.plan._check import ReferenceCondition
from mcpipe.plan._ir import ForEach, Graph, Leaf, Node, Parallel, Pipe, Pipeline

__all__ = ["STATES", "Cluster", "Drawing", "Edge", "Shape", "drawing", "drawn"]

STATES = ("pending", "running", "ok", "failed", "skipped", "cancelled")
"""The states a drawn step can be marked with."""


@dataclass(slots=True)
class Shape:
    """One step drawn: ``key`` (its path pattern), ``label`` (its id), ``detail`` (its kind, or the tool it
    calls), ``location`` (where it was written), ``cluster`` (the index of the innermost cluster it is in)."""

    key: str
    label: str
    detail: str
    location: str
    cluster: int | None = None


@dataclass(slots=True)
class Edge:
    """An arrow from shape ``src`` to shape ``dst`` (indices): ``kind`` ``next`` (the order of a list),
    ``arc`` (a graph's arc: ``label`` its condition, ``location`` the arc's) or ``back`` (an arc closing a
    cycle)."""

    src: int
    dst: int
    kind: str = "next"
    label: str = ""
    location: str = ""


@dataclass(slots=True)
class Cluster:
    """A container drawn around its steps: ``kind`` (``parallel``, ``pipe``, ``for_each``, ``graph``),
    ``label``, its ``parent`` cluster."""

    key: str
    kind: str
    label: str
    location: str
    parent: int | None = None


@dataclass(slots=True)
class Block:
    """A part of the picture laid out as one: ``kind`` ``leaf`` (shape ``index``), ``list`` (``parts`` one
    under the other), ``row`` (``parts`` side by side, in cluster ``index``: a parallel group), ``box`` (one
    part in cluster ``index``: a pipe, a for_each) or ``graph`` (``parts`` in layers by ``arcs``, forward
    ``(from, to)`` pairs of parts, from ``entry``; in cluster ``index``)."""

    kind: str
    index: int = -1
    parts: list[Block] = field(default_factory=list)
    arcs: list[tuple[int, int]] = field(default_factory=list)
    entry: int = 0
    w: float = 0.0
    h: float = 0.0


@dataclass(slots=True)
class Drawing:
    """A plan as shapes, edges and clusters (see the module)."""

    shapes: list[Shape] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    each: frozenset[str] = frozenset()
    """The keys of the ``for_each`` steps (the next part of a path below them is an element's index)."""
    root: Block | None = None
    """How the shapes nest, for the layout: the plan's tree of lists, groups and graphs."""

    def key_of(self, path: str) -> str:
        """The drawn key of a run event's step path: ``pages.3.fetch`` is ``pages.*.fetch`` below a
        ``for_each`` ``pages``; ``poll#2/poll`` (the second run of a graph's node) is ``poll``; a path below a
        step that runs a pipeline of its own (``call/inner``) is that step's."""
        path = path.split("/", 1)[0].split("#", 1)[0]
        if not self.each:
            return path
        out: list[str] = []
        below_each = False
        for part in path.split("."):
            if below_each and part.isdigit():
                out.append("*")
                below_each = False
                continue
            out.append(part)
            below_each = ".".join(out) in self.each
        return ".".join(out)

    # --- Mermaid ---

    def mermaid(self) -> str:
        """The drawing as a Mermaid ``flowchart`` (top to bottom)."""
        lines = ["flowchart TB"]
        inside: dict[int | None, list[int]] = {}
        for i, s in enumerate(self.shapes):
            inside.setdefault(s.cluster, []).append(i)
        children: dict[int | None, list[int]] = {}
        for c, cl in enumerate(self.clusters):
            children.setdefault(cl.parent, []).append(c)

        def emit(cluster: int | None, depth: int) -> None:
            pad = "    " * depth
            for i in inside.get(cluster, []):
                s = self.shapes[i]
                text = _mermaid_text(s.label, s.detail)
                lines.append(f'{pad}s{i}["{text}"]')
            for c in children.get(cluster, []):
                cl = self.clusters[c]
                lines.append(f'{pad}subgraph c{c}["{_mermaid_text(cl.label)}"]')
                emit(c, depth + 1)
                lines.append(f"{pad}end")

        emit(None, 1)
        for e in self.edges:
            if e.kind == "back":
                arrow = f"-. {_mermaid_label(e.label or 'again')} .->"
            elif e.label:
                arrow = f"-- {_mermaid_label(e.label)} -->"
            else:
                arrow = "-->"
            lines.append(f"    s{e.src} {arrow} s{e.dst}")
        return "\n".join(lines) + "\n"

    # --- Graphviz ---

    def dot(self, name: str = "pipeline") -> str:
        """The drawing as Graphviz DOT text (``dot -Tsvg`` draws it)."""
        lines = [
            f"digraph {_dot_id(name)} {{",
            "    rankdir=TB;",
            '    node [shape=box, style="rounded", fontname="sans-serif", fontsize=11];',
            '    edge [fontname="sans-serif", fontsize=9];',
        ]
        inside: dict[int | None, list[int]] = {}
        for i, s in enumerate(self.shapes):
            inside.setdefault(s.cluster, []).append(i)
        children: dict[int | None, list[int]] = {}
        for c, cl in enumerate(self.clusters):
            children.setdefault(cl.parent, []).append(c)

        def emit(cluster: int | None, depth: int) -> None:
            pad = "    " * depth
            for i in inside.get(cluster, []):
                s = self.shapes[i]
                label = s.label if not s.detail else f"{s.label}\n{s.detail}"
                lines.append(f"{pad}s{i} [label={_dot_str(label)}, tooltip={_dot_str(s.location)}];")
            for c in children.get(cluster, []):
                cl = self.clusters[c]
                lines.append(f"{pad}subgraph cluster_{c} {{")
                lines.append(f"{pad}    label={_dot_str(cl.label)}; style=dashed;")
                emit(c, depth + 1)
                lines.append(f"{pad}}}")

        emit(None, 1)
        for e in self.edges:
            attrs = []
            if e.label:
                attrs.append(f"label={_dot_str(_short(e.label))}")
            if e.kind == "back":
                attrs += ["style=dashed", "constraint=false"]
            suffix = f" [{', '.join(attrs)}]" if attrs else ""
            lines.append(f"    s{e.src} -> s{e.dst}{suffix};")
        lines.append("}")
        return "\n".join(lines) + "\n"

    # --- SVG ---

    def svg(
        self,
        *,
        states: Mapping[str, str] | None = None,
        taken: Iterable[str] = (),
        standalone: bool = True,
        title: str = "pipeline",
        link: str | None = None,
    ) -> str:
        """The drawing as SVG, laid out in layers (see :func:`layout`).

        Args:
            states: each step's state by key (one of :data:`STATES`): its box is classed ``state-<state>``.
            taken: the locations of the arcs a run took: they are classed ``taken``.
            standalone: a file of its own (an XML declaration and a ``<style>``); else for inlining in a page
                whose stylesheet styles the classes (a page's CSP allows no inline style).
            title: the picture's accessible name.
            link: a URL prefix: each box links to ``link + key`` (the console's step rows).
        """
        return _svg(self, layout(self), states or {}, frozenset(taken), standalone, title, link)


# --- reading a plan ---------------------------------------------------------------------------------------------


def drawing(plan: Pipeline) -> Drawing:
    """Draw ``plan``: every step, container and arc."""
    d = Drawing()
    each: set[str] = set()
    _, _, d.root = _list(d, plan.steps, "", None, each)
    d.each = frozenset(each)
    return d


_DRAWN: OrderedDict[int, tuple[Pipeline, Drawing]] = OrderedDict()
_KEEP = 256


def drawn(plan: Pipeline) -> Drawing:
    """``drawing(plan)``, kept for the last 256 plans drawn (by identity: a served pipeline's plan is drawn
    once, however often the console or a client looks at it). The drawing is read, never changed."""
    key = id(plan)
    hit = _DRAWN.get(key)
    if hit is not None and hit[0] is plan:
        _DRAWN.move_to_end(key)
        return hit[1]
    d = drawing(plan)
    _DRAWN[key] = (plan, d)
    while len(_DRAWN) > _KEEP:
        _DRAWN.popitem(last=False)
    return d


Span = tuple[list[int], list[int], Block]
"""What drawing a step answers: the shapes arrows into it go to, the shapes arrows out of it leave, its block."""


def _list(d: Drawing, steps: Iterable[Node], prefix: str, cluster: int | None, each: set[str]) -> Span:
    """Draw a list of steps run one after the other."""
    first: list[int] | None = None
    exits: list[int] = []
    block = Block("list")
    for step in steps:
        ins, outs, part = _node(d, step, prefix, cluster, each)
        block.parts.append(part)
        if not ins:
            continue
        for a in exits:
            for b in ins:
                d.edges.append(Edge(a, b))
        if first is None:
            first = ins
        exits = outs
    return first or [], exits, block


def _node(d: Drawing, step: Node, prefix: str, cluster: int | None, each: set[str]) -> Span:
    key = prefix + step.id
    when = _when_text(step.when)
    if isinstance(step, Leaf):
        detail = f"tool {step.tool}" if step.tool is not None and step.kind == "tool" else step.kind
        if step.tool is not None and step.kind != "tool":
            detail = f"{step.kind}: {step.tool}"
        describe = getattr(step.built, "describe", None)  # a front-end's own words for its leaf (NoETL's tasks)
        if callable(describe):
            detail = str(describe())
        if when:
            detail = f"{detail} · when {_short(when, 24)}"
        d.shapes.append(Shape(key, step.id, detail, step.location, cluster))
        i = len(d.shapes) - 1
        return [i], [i], Block("leaf", i)
    c = len(d.clusters)
    if isinstance(step, Parallel):
        d.clusters.append(Cluster(key, "parallel", f"{step.id} (parallel)", step.location, cluster))
        block = Block("row", c)
        ins: list[int] = []
        outs: list[int] = []
        for child in step.children:
            a, b, part = _node(d, child, key + ".", c, each)
            ins += a
            outs += b
            block.parts.append(part)
        return ins, outs, block
    if isinstance(step, Pipe):
        d.clusters.append(Cluster(key, "pipe", f"{step.id} (pipe)", step.location, cluster))
        ins, outs, inner = _list(d, step.pipe.steps, key + ".", c, each)
        if not ins:  # an empty pipe: a box of its own, so the arrows have somewhere to go
            d.shapes.append(Shape(key, step.id, "pipe (empty)", step.location, c))
            ins = outs = [len(d.shapes) - 1]
            inner = Block("leaf", ins[0])
        return ins, outs, Block("box", c, [inner])
    if isinstance(step, ForEach):
        items = _when_text(step.items)
        label = f"{step.id} (for each {_short(items, 32)})" if items else f"{step.id} (for each)"
        d.clusters.append(Cluster(key, "for_each", label, step.location, cluster))
        each.add(key)
        ins, outs, inner = _node(d, step.step, key + ".*.", c, each)
        return ins, outs, Block("box", c, [inner])
    if isinstance(step, Graph):
        # A graph's nodes record at the graph's own level (its list's results), not below its id.
        d.clusters.append(Cluster(key, "graph", f"{step.id} (graph)", step.location, cluster))
        spans = [_node(d, n, prefix, c, each) for n in step.nodes]
        block = Block("graph", c, [sp[2] for sp in spans], entry=step.entry)
        for i, arcs in enumerate(step.arcs):
            for arc in arcs:
                kind = "back" if arc.back else "arc"
                if not arc.back and arc.to != i:
                    block.arcs.append((i, arc.to))
                label = _bare(_when_text(arc.when))
                for src in spans[i][1]:
                    for dst in spans[arc.to][0]:
                        d.edges.append(Edge(src, dst, "back" if arc.to == i else kind, label, arc.location))
        entry = spans[step.entry][0] if spans else []
        ends = [x for i, sp in enumerate(spans) if not any(not a.back for a in step.arcs[i]) for x in sp[1]]
        return entry, ends, block
    return [], [], Block("list")


def _when_text(expr: object) -> str:
    """The source of a condition or expression, as written (empty when it has none)."""
    if expr is None:
        return ""
    if isinstance(expr, ReferenceCondition):
        refs = expr.template.references
        return f"${{{refs[0]}}}" if refs else ""
    source = getattr(expr, "source", None)
    if isinstance(source, str):
        return source
    arc = getattr(expr, "arc", None)
    if getattr(arc, "otherwise", False):
        return "else"
    found = getattr(expr, "references", None)
    if isinstance(found, (tuple, list)) and found and isinstance(found[0], str):
        return f"${{{found[0]}}}"
    return ""


def _bare(text: str) -> str:
    """A condition without the ``{{ }}`` of a template around it."""
    t = text.strip()
    if t.startswith("{{") and t.endswith("}}"):
        return t[2:-2].strip()
    return t


def _short(text: str, n: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


_MERMAID_UNSAFE = re.compile(r'["<>&#`|{}\[\]]')


def _mermaid_text(label: str, detail: str = "") -> str:
    def one(t: str) -> str:
        return _MERMAID_UNSAFE.sub(lambda m: f"#{ord(m.group(0))};", t)

    return one(label) + (f"<br/><small>{one(detail)}</small>" if detail else "")


def _mermaid_label(text: str) -> str:
    return '"' + _MERMAID_UNSAFE.sub(lambda m: f"#{ord(m.group(0))};", _short(text)) + '"'


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_id(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else _dot_str(name)


# --- layout ---------------------------------------------------------------------------------------------------

NODE_H = 44
GAP_Y = 30
GAP_ARCS = 50
"""Between a graph's layers: room for the arcs' conditions."""
GAP_X = 18
PAD = 12
LABEL_H = 18
CHAR_W = 7.0
MIN_W = 96
MAX_W = 260


@dataclass(slots=True)
class Layout:
    """Where everything goes: each shape's box ``(x, y, w, h)``, each cluster's, and the picture's size."""

    boxes: list[tuple[float, float, float, float]]
    clusters: list[tuple[float, float, float, float] | None]
    width: float
    height: float


def layout(d: Drawing) -> Layout:
    """Lay the plan's tree out as nested blocks: a list's steps one under the other, a parallel group's side by
    side, a container's steps boxed inside its cluster, a graph's nodes in layers (each after its longest chain
    of predecessors by forward arcs, ordered by their predecessors' mean position). Clusters never overlap."""
    boxes: list[tuple[float, float, float, float]] = [(0.0, 0.0, 0.0, 0.0)] * len(d.shapes)
    clusters: list[tuple[float, float, float, float] | None] = [None] * len(d.clusters)
    root = d.root or Block("list")
    _measure(d, root)
    _place(d, root, PAD, PAD, boxes, clusters)
    return Layout(boxes, clusters, root.w + 2 * PAD + 40, root.h + 2 * PAD)


def _measure(d: Drawing, b: Block) -> None:
    for part in b.parts:
        _measure(d, part)
    if b.kind == "leaf":
        s = d.shapes[b.index]
        b.w, b.h = min(MAX_W, max(MIN_W, CHAR_W * max(len(s.label), len(s.detail)) + 2 * PAD)), NODE_H
        return
    parts = [p for p in b.parts if p.w > 0]
    if b.kind == "list":
        b.w = max((p.w for p in parts), default=0.0)
        b.h = sum(p.h for p in parts) + GAP_Y * max(0, len(parts) - 1)
        return
    if b.kind == "row":
        w = sum(p.w for p in parts) + GAP_X * max(0, len(parts) - 1)
        h = max((p.h for p in parts), default=0.0)
    elif b.kind == "graph":
        rows = _graph_rows(b)
        w = max((sum(b.parts[i].w for i in r) + GAP_X * (len(r) - 1) for r in rows), default=0.0)
        h = sum(max(b.parts[i].h for i in r) for r in rows) + GAP_ARCS * max(0, len(rows) - 1)
    else:  # box
        w = max((p.w for p in parts), default=0.0)
        h = max((p.h for p in parts), default=0.0)
    label = CHAR_W * len(d.clusters[b.index].label) + 2 * PAD if b.index >= 0 else 0.0
    b.w, b.h = max(w + 2 * PAD, label), h + 2 * PAD + LABEL_H


def _graph_rows(b: Block) -> list[list[int]]:
    """A graph's parts in layers: each after its longest chain of predecessors (by forward arcs) from the
    entry; parts no arc reaches after the others."""
    n = len(b.parts)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for a, z in b.arcs:
        preds[z].append(a)
        succs[a].append(z)
    layer = [0] * n
    indeg = [len(p) for p in preds]
    order = [i for i in range(n) if indeg[i] == 0]
    order.sort(key=lambda i: (i != b.entry, i))
    k = 0
    while k < len(order):
        i = order[k]
        k += 1
        for j in succs[i]:
            layer[j] = max(layer[j], layer[i] + 1)
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
    for i in range(n):  # on a cycle of forward arcs (none in a checked plan): after what reaches it
        if indeg[i] > 0:
            layer[i] = max((layer[p] + 1 for p in preds[i] if indeg[p] == 0), default=0)
    rows: dict[int, list[int]] = {}
    for i in range(n):
        rows.setdefault(layer[i], []).append(i)
    # Within a layer: by the mean place of each part's predecessors in the layer before (barycentre).
    place: dict[int, float] = {}
    out = []
    for lv in sorted(rows):
        row = rows[lv]
        row.sort(key=lambda i: (sum(place.get(p, 0.0) for p in preds[i]) / len(preds[i]) if preds[i] else i, i))
        for x, i in enumerate(row):
            place[i] = float(x)
        out.append(row)
    return out


def _place(
    d: Drawing,
    b: Block,
    x: float,
    y: float,
    boxes: list[tuple[float, float, float, float]],
    clusters: list[tuple[float, float, float, float] | None],
) -> None:
    """Put block ``b`` with its top-left corner at ``(x, y)``, its parts centred in it."""
    if b.kind == "leaf":
        boxes[b.index] = (x, y, b.w, b.h)
        return
    if b.kind == "list":
        for p in b.parts:
            if p.w > 0:
                _place(d, p, x + (b.w - p.w) / 2, y, boxes, clusters)
                y += p.h + GAP_Y
        return
    clusters[b.index] = (x, y, b.w, b.h)
    top = y + PAD + LABEL_H
    inner_w = b.w - 2 * PAD
    if b.kind == "row":
        parts = [p for p in b.parts if p.w > 0]
        used = sum(p.w for p in parts) + GAP_X * max(0, len(parts) - 1)
        cx = x + PAD + (inner_w - used) / 2
        for p in parts:
            _place(d, p, cx, top, boxes, clusters)
            cx += p.w + GAP_X
    elif b.kind == "graph":
        for row in _graph_rows(b):
            used = sum(b.parts[i].w for i in row) + GAP_X * (len(row) - 1)
            cx = x + PAD + (inner_w - used) / 2
            for i in row:
                _place(d, b.parts[i], cx, top, boxes, clusters)
                cx += b.parts[i].w + GAP_X
            top += max(b.parts[i].h for i in row) + GAP_ARCS
    else:
        for p in b.parts:
            _place(d, p, x + PAD + (inner_w - p.w) / 2, top, boxes, clusters)


# --- SVG ----------------------------------------------------------------------------------------------------------

_STYLE = """
.shape rect { fill: #ffffff; stroke: #44505c; stroke-width: 1.2; }
.shape text, .cluster text, .edge text { font: 12px sans-serif; fill: #1b1f24; }
.shape .detail { font-size: 10px; fill: #4b5560; }
.cluster rect { fill: none; stroke: #8a96a3; stroke-dasharray: 4 3; }
.edge path { fill: none; stroke: #5f6b77; stroke-width: 1.2; }
.edge.back path { stroke-dasharray: 5 4; }
.edge.taken path { stroke: #1560bd; stroke-width: 2.4; }
.state-ok rect { fill: #e3f4e6; stroke: #237a36; }
.state-failed rect { fill: #fde7e7; stroke: #b3261e; stroke-width: 2.4; }
.state-running rect { fill: #fff5d6; stroke: #8a6100; stroke-width: 2; }
.state-skipped rect, .state-cancelled rect { fill: #f1f3f5; stroke: #8a96a3; stroke-dasharray: 3 2; }
"""


def _svg(
    d: Drawing,
    lay: Layout,
    states: Mapping[str, str],
    taken: frozenset[str],
    standalone: bool,
    title: str,
    link: str | None,
) -> str:
    w, h = round(lay.width), round(lay.height)
    out: list[str] = []
    if standalone:
        out.append('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        f'role="img" aria-labelledby="pipeline-title" class="pipeline-graph">'
    )
    out.append(f'<title id="pipeline-title">{escape(title)}</title>')
    if standalone:
        out.append(f"<style>{_STYLE}</style>")
    out.append(
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#5f6b77"/></marker></defs>'
    )
    for c, box in enumerate(lay.clusters):
        if box is None:
            continue
        x, y, bw, bh = box
        cl = d.clusters[c]
        out.append(
            f'<g class="cluster {escape(cl.kind)}"><title>{escape(cl.label)} at {escape(cl.location)}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" fill="none" stroke="#8a96a3"/>'
            f'<text x="{x + 8:.1f}" y="{y + 14:.1f}">{escape(_short(cl.label, 48))}</text></g>'
        )
    for e in d.edges:
        sx, sy, sw, sh = lay.boxes[e.src]
        tx, ty, tw, th = lay.boxes[e.dst]
        classes = ["edge", e.kind]
        if e.location and e.location in taken:
            classes.append("taken")
        if e.kind == "back" or ty <= sy:
            # Around the side: out of the source's right, into the target's right.
            x0, y0 = sx + sw, sy + sh / 2
            x1, y1 = tx + tw, ty + th / 2
            bend = max(x0, x1) + 40
            path = f"M {x0:.1f} {y0:.1f} C {bend:.1f} {y0:.1f}, {bend:.1f} {y1:.1f}, {x1 + 2:.1f} {y1:.1f}"
            lx, ly = bend - 4, (y0 + y1) / 2
            anchor = "start"
        else:
            x0, y0 = sx + sw / 2, sy + sh
            x1, y1 = tx + tw / 2, ty - 2
            mid = (y0 + y1) / 2
            path = f"M {x0:.1f} {y0:.1f} C {x0:.1f} {mid:.1f}, {x1:.1f} {mid:.1f}, {x1:.1f} {y1:.1f}"
            # The label near the target end (targets of one source lie apart, so their labels do too).
            t = 0.72
            a, b_, c_, d_ = (1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t**3
            lx = (a + b_) * x0 + (c_ + d_) * x1
            ly = a * y0 + (b_ + c_) * mid + d_ * y1
            anchor = "end" if x1 < x0 - 8 else "start"
            lx += -4 if anchor == "end" else 4
        described = f"{d.shapes[e.src].label} to {d.shapes[e.dst].label}"
        if e.label:
            described += f" when {e.label}"
        if "taken" in classes:
            described += " (taken)"
        out.append(
            f'<g class="{" ".join(classes)}"><title>{escape(described)}</title>'
            f'<path d="{path}" fill="none" stroke="#5f6b77" marker-end="url(#arrow)"/>'
        )
        if e.label:
            text = _short(e.label, 26)
            span = 6.5 * len(text)  # keep the label inside the picture
            lx = max(lx, span + 2) if anchor == "end" else min(lx, lay.width - span - 2)
            out.append(
                f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}" stroke="#ffffff" stroke-width="3" '
                f'paint-order="stroke">{escape(text)}</text>'
            )
        out.append("</g>")
    for i, s in enumerate(d.shapes):
        x, y, bw, bh = lay.boxes[i]
        state = states.get(s.key, "pending")
        if state not in STATES:
            state = "pending"
        label = f"{s.label}: {s.detail}, {state}" if s.detail else f"{s.label}, {state}"
        open_, close = "", ""
        if link is not None:
            open_ = f'<a href="{escape(link + s.key)}" aria-label="{escape(label)}">'
            close = "</a>"
        out.append(
            f'{open_}<g class="shape state-{state}" data-key="{escape(s.key)}"><title>{escape(label)} '
            f"({escape(s.location)})</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="8" fill="#ffffff" '
            f'stroke="#44505c"/>'
            f'<text x="{x + bw / 2:.1f}" y="{y + 18:.1f}" text-anchor="middle">{escape(_short(s.label, 34))}</text>'
            f'<text class="detail" x="{x + bw / 2:.1f}" y="{y + 33:.1f}" text-anchor="middle">'
            f"{escape(_short(s.detail, 36))}</text></g>{close}"
        )
    out.append("</svg>\n")
    return "".join(out)
