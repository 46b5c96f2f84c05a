"""The layer rule of mcpipe: imports point down, never up (``make lint`` runs this).

Each module of ``python/mcpipe`` belongs to one layer (the longest matching prefix below); a module may
import its own layer and the layers beneath it, never one above. Every import counts: top-level, inside a
function (lazy), under ``TYPE_CHECKING``. See docs/architecture.md, "Layers".

Packages import each other one way only, too: no package-level import cycle, within a layer either (a
package is a top-level module or subpackage of ``mcpipe``, e.g. ``mcpipe.plan`` or ``mcpipe._util``;
``mcpipe`` itself, the public face, is one more). Every import counts here as well.

Usage: ``python scripts/check_layers.py [ROOT]`` (ROOT: the directory holding the ``mcpipe`` package,
default ``python``); exits 1 and prints one located line per wrong-way import and per package cycle.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # What everything shares: the Rust core and templates, errors and codes, step results, tools and the
    # audit log every call path writes (a format may write its own records: ``mcpipe._audit``), the
    # typed request context, small helpers.
    (
        "core",
        (
            "mcpipe._core",
            "mcpipe._template",
            "mcpipe._describe",
            "mcpipe._util",
            "mcpipe._url",
            "mcpipe._redact",
            "mcpipe._json",
            "mcpipe._loader",
            "mcpipe._yaml",
            "mcpipe._pattern",
            "mcpipe._deadline",
            "mcpipe._version",
            "mcpipe._patternexec",
            "mcpipe._sandbox",
            "mcpipe._workerpool",
            "mcpipe._jsonschema",
            "mcpipe._fastschema",
            "mcpipe._lazy",
            "mcpipe._mcp",
            "mcpipe._runscope",
            "mcpipe._struct",
            "mcpipe._audit",
            "mcpipe.errors",
            "mcpipe.results",
            "mcpipe.tools",
            "mcpipe.telemetry",
        ),
    ),
    # The plan IR and its checker, expressions, and the mcp_pipe front-end (spec + compile).
    ("plan", ("mcpipe.plan", "mcpipe.expr", "mcpipe.spec", "mcpipe.compile")),
    # Clients of outside services (SQL, NATS, gRPC, Kafka): the step kinds use them.
    ("backends", ("mcpipe.backends",)),
    # Who is calling, what a call may do, what mcpipe presents upstream: identities, gates, credentials.
    ("access", ("mcpipe.access",)),
    # Storage shared by the instances that resume suspended pipelines.
    ("store", ("mcpipe.store",)),
    # Asking the client (elicitation, sampling, roots) in both protocol eras.
    ("interaction", ("mcpipe.interaction",)),
    # Asking a language model: an OpenAI-compatible endpoint or the client's (sampling).
    ("models", ("mcpipe.models",)),
    # Step kinds: one module each, and their registry.
    ("kinds", ("mcpipe.kinds",)),
    # The scheduler.
    ("runtime", ("mcpipe.runtime",)),
    # Declared pipelines: the config front-end of the plan, served as tools.
    ("declared", ("mcpipe.declared",)),
    # OpenAPI documents served as tools (their operations called through the outbound HTTP policy).
    ("openapi", ("mcpipe.openapi",)),
    # Pipelines with a model inside: the piraeus workflow tool.
    ("llm", ("mcpipe.workflow",)),
    # Other systems' own files (mcpg configs, NoETL playbooks, discord-mcp, piraeus), read as they are:
    # front-ends of the same plan, one subpackage each, registered in ``mcpipe.formats.FORMATS``.
    ("formats", ("mcpipe.formats",)),
    # The operator's view of the tools: reshaped tools, hidden ones, tool search (``[tools]``).
    ("toolset", ("mcpipe.toolset",)),
    # The server's configuration.
    ("config", ("mcpipe.config",)),
    # The one call path (auth, audit, cost) and the downstream servers behind it.
    ("gateway", ("mcpipe.gateway", "mcpipe.trust", "mcpipe.downstream")),
    # Runs that outlive a request: the workers executing queued runs, and the tools watching them.
    ("runs", ("mcpipe.runs",)),
    # The web console and its JSON API: pages over the run queue, the gateway and the metrics (the HTTP front
    # routes /console and /api/ to it).
    ("console", ("mcpipe.console",)),
    # The MCP server, the command line, and the package's public face.
    ("server", ("mcpipe.server", "mcpipe.cli", "mcpipe.__main__", "mcpipe")),
]

_RANK = {prefix: (i, name) for i, (name, prefixes) in enumerate(LAYERS) for prefix in prefixes}


def layer_of(module: str) -> tuple[int, str] | None:
    """``(rank, name)`` of the layer ``module`` belongs to (longest prefix), or None (not mcpipe)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        hit = _RANK.get(".".join(parts[:n]))
        if hit is not None:
            return hit
    return None


def module_name(path: Path, root: Path) -> str:
    """``mcpipe.kinds.http`` for ``ROOT/mcpipe/kinds/http.py`` (``mcpipe.kinds`` for its ``__init__``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` of every import in ``source`` (relative ones resolved), nested ones
    included; ``from pkg import name`` yields ``pkg.name`` (the submodule, if it is one: the layer table
    decides by prefix)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if alias.name != "*" else base


def check_source(source: str, module: str, where: str, *, is_package: bool = False) -> list[str]:
    """Every wrong-way import of one module, as ``where:line: ...`` lines."""
    own = layer_of(module)
    if own is None:
        return []
    problems = []
    for line, target in imports(source, module, is_package=is_package):
        theirs = layer_of(target)
        if theirs is not None and theirs[0] > own[0]:
            problems.append(
                f"{where}:{line}: {module} (layer {own[1]}) imports {target} (layer {theirs[1]}, above it):"
                " imports point down only"
            )
    return problems


def check(root: Path) -> list[str]:
    """Every wrong-way import under ``root/mcpipe``."""
    problems = []
    for path in sorted((root / "mcpipe").rglob("*.py")):
        module = module_name(path, root)
        problems += check_source(path.read_text(), module, str(path), is_package=path.name == "__init__.py")
    return problems


def package_graph(root: Path) -> dict[str, dict[str, str]]:
    """Which package imports which: ``{importer: {imported: "path:line" of its first such import}}``.

    A package is a top-level module or subpackage of ``mcpipe`` (``plan``, ``_util``, ``_core``); an
    import of a name of ``mcpipe`` itself (``from mcpipe import __version__``) points at the package
    ``mcpipe``, the public face. Imports within a package are not edges."""
    top = root / "mcpipe"
    names = {
        p.name.split(".")[0]
        for p in top.iterdir()
        if p.suffix in (".py", ".pyi", ".so") or (p / "__init__.py").is_file()
    }
    names.discard("__init__")
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(top.rglob("*.py")):
        module = module_name(path, root)
        parts = module.split(".")
        own = parts[1] if len(parts) > 1 else "mcpipe"
        edges = graph.setdefault(own, {})
        for line, target in imports(path.read_text(), module, is_package=path.name == "__init__.py"):
            tparts = target.split(".")
            if tparts[0] != "mcpipe":
                continue
            theirs = tparts[1] if len(tparts) > 1 and tparts[1] in names else "mcpipe"
            if theirs != own:
                edges.setdefault(theirs, f"{path}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The package cycles of ``graph``, each as ``[a, b, ..., a]`` from its least package: every pair of
    packages that import each other, and for a group of packages that reach each other with no such pair
    in it, its shortest cycle. None iff the package graph has no cycle at all."""
    rings = []
    for group in _groups(graph):
        pairs = [[a, b, a] for a in group for b in group if a < b and b in graph[a] and a in graph.get(b, {})]
        if pairs:
            rings += pairs
            continue
        ways = [way for a in group for b in sorted(graph[a]) if b in group and (way := _shortest(graph, b, a))]
        ring = [*min(ways, key=lambda w: (len(w), w))]
        least = ring.index(min(ring))
        ring = ring[least:] + ring[:least]
        rings.append([*ring, ring[0]])
    return sorted(rings)


def _groups(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one package, each sorted."""
    nodes = sorted(set(graph) | {b for edges in graph.values() for b in edges})
    reach = {n: set(_reachable(graph, n)) for n in nodes}
    groups = {tuple(sorted(m for m in reach[n] if n in reach[m])) for n in nodes}
    return sorted(list(g) for g in groups if len(g) > 1)


def _reachable(graph: dict[str, dict[str, str]], start: str) -> Iterator[str]:
    """Every package reachable from ``start`` (itself included)."""
    seen = {start}
    todo = [start]
    while todo:
        n = todo.pop()
        yield n
        for m in graph.get(n, {}):
            if m not in seen:
                seen.add(m)
                todo.append(m)


def _shortest(graph: dict[str, dict[str, str]], start: str, goal: str) -> list[str] | None:
    """The shortest path of packages from ``start`` to ``goal`` (both included), or None."""
    came: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier and goal not in came:
        reached = []
        for n in frontier:
            for m in sorted(graph.get(n, {})):
                if m not in came:
                    came[m] = n
                    reached.append(m)
        frontier = reached
    if goal not in came:
        return None
    way = [goal]
    while (prev := came[way[-1]]) is not None:
        way.append(prev)
    return way[::-1]


def check_cycles(root: Path) -> list[str]:
    """Every package cycle under ``root/mcpipe``, one located line each (at its first import)."""
    graph = package_graph(root)
    problems = []
    for ring in cycles(graph):
        hops = [f"{a} imports {b} ({graph[a][b]})" for a, b in itertools.pairwise(ring)]
        problems.append(
            f"{graph[ring[0]][ring[1]]}: package cycle {' -> '.join(ring)}: {', '.join(hops)};"
            " a package may not import one that imports it back"
        )
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "python"
    problems = check(root) + check_cycles(root)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
