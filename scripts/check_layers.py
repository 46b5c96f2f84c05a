"""The layer rule of mcpipe: imports point down, never up (``make lint`` runs this).

Each module of ``python/mcpipe`` belongs to one layer (the longest matching prefix below); a module may
import its own layer and the layers beneath it, never one above. Every import counts: top-level, inside a
function (lazy), under ``TYPE_CHECKING``. See docs/architecture.md, "Layers".

Usage: ``python scripts/check_layers.py [ROOT]`` (ROOT: the directory holding the ``mcpipe`` package,
default ``python``); exits 1 and prints one located line per wrong-way import.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # What everything shares: the Rust core and templates, errors and codes, step results, tools and the
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
            "mcpipe._patternexec",
            "mcpipe._sandbox",
            "mcpipe._jsonschema",
            "mcpipe.errors",
            "mcpipe.results",
            "mcpipe.tools",
            "mcpipe.telemetry",
            "mcpipe._tracing",
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
    # front-ends of the same plan, one subpackage each; ``mcpipe.playbooks`` is the NoETL format's old name
    # (and holds its Jinja environment).
    ("formats", ("mcpipe.formats", "mcpipe.playbooks")),
    # The operator's view of the tools: reshaped tools, hidden ones, tool search (``[tools]``).
    ("toolset", ("mcpipe.toolset",)),
    # The server's configuration.
    ("config", ("mcpipe.config",)),
    # The one call path (auth, audit, cost) and the downstream servers behind it.
    (
        "gateway",
        ("mcpipe.gateway", "mcpipe.trust", "mcpipe.tools.downstream", "mcpipe.tools._catalog", "mcpipe.tools._oauth"),
    ),
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


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "python"
    problems = check(root)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
