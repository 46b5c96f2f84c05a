"""Check every vendored NoETL playbook (``tests/formats/noetl/upstream``) and write the table of the ones mcpipe
refuses into docs/playbooks.md.

Usage: python scripts/noetl_corpus.py [--check]

Each file is checked as ``mcpipe playbook check`` checks it, under an operator's config that fits NoETL's
corpus: outbound HTTP to any public host (the hosts are each deployment's; TLS verification may be off for
``localhost``, the Interactive Brokers gateway's self-signed certificate), ``sh`` for ``shell`` steps (NoETL
runs them with ``sh -c``), and a ``[sql.NAME]`` PostgreSQL backend for each database credential the corpus
names (NoETL's credentials, registered on its server; mcpipe's are the config's backends), and a catalog of
every vendored playbook by its ``metadata.path`` (NoETL's server registers them all; a ``playbook`` step names
one by that path). Nothing connects.
``--check`` exits 1 when the docs' table is not what the check finds (``tests/formats/noetl`` runs it).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "tests" / "formats" / "noetl" / "upstream"
DOC = ROOT / "docs" / "playbooks.md"
BEGIN = "<!-- noetl-corpus:begin (scripts/noetl_corpus.py writes this table) -->"
END = "<!-- noetl-corpus:end -->"

CREDENTIALS = ("pg_local", "pg_k8s", "test_postgres", "pg_test", "noetl_connection", "my_db")
"""The database credentials NoETL's playbooks name (its demo and cluster ones), as ``[sql.NAME]`` backends."""


def policy() -> Any:
    from dataclasses import replace

    from mcpipe.declared import load_sql
    from mcpipe.kinds import CommandPolicy, HttpPolicy, StepPolicy

    backends, problems = load_sql({name: {"url": f"postgresql://localhost/{name}"} for name in CREDENTIALS})
    assert problems == [], problems
    return replace(
        StepPolicy(
            http=HttpPolicy(allowed_hosts=("*",), insecure_hosts=("localhost",)),
            command=CommandPolicy(commands={"sh": "/bin/sh"}),
        ),
        sql=backends,
    )


def check_corpus() -> list[tuple[str, list[str]]]:
    """``(upstream path, problems)`` of every vendored playbook, in path order (no problems: it passes)."""
    from mcpipe.formats.noetl import load_playbook

    index = json.loads((UPSTREAM / "INDEX.json").read_text())["files"]
    pol = policy()
    known = catalog()
    out = []
    WARNED.clear()
    for rel in sorted(index):
        pb, problems = load_playbook(rel, base_dir=str(UPSTREAM), policy=pol, known=known)
        out.append((rel, [str(p) for p in problems]))
        if pb is not None and not problems and getattr(pb, "warnings", None):
            WARNED[rel] = list(pb.warnings)
    return out


WARNED: dict[str, list[str]] = {}
"""The passing playbooks checked with warnings (what NoETL takes and ignores, or fails only when it runs)."""

REASONS = (
    ("not a NoETL playbook: it has no", "a prototype of NoETL's earlier formats (no `workflow` list)"),
    ("2018 Go prototype", "a prototype no engine ran (NoETL's 2018 Go prototype, f567ecd4: stub modules)"),
    (
        "2023 NATS prototype",
        "a prototype no engine ran (NoETL's 2023 NATS prototype, edbc1064: the dispatcher only logs)",
    ),
    (
        "2024 plugin prototype",
        "a prototype no engine ran (NoETL's 2024 plugin prototype, e0073283: no plugins in the repository)",
    ),
    ("job runtime of April-May 2025", "NoETL's job runtime of April-May 2025 (noetl/dsl), not read by mcpipe"),
    ("duplicate key", "a key given twice (NoETL's YAML reader keeps the last one given; mcpipe refuses it)"),
    ("not valid YAML", "not valid YAML"),
    ("snowflake", "a cloud warehouse (Snowflake)"),
    ("secret manager", "cloud credentials or a cloud secret manager"),
    ("NATS", "NoETL's NATS K/V store"),
    ("2025 drafts", "NoETL's 2025 draft engine (`call:`/`run:` steps, loops over `next` steps)"),
    ("2025 loop drafts", "NoETL's 2025 draft engine (`call:`/`run:` steps, loops over `next` steps)"),
    ("remote store", "code fetched from cloud storage or a URL"),
    ("cloud storage", "cloud storage (GCS, S3)"),
    ("cloud credentials injected", "cloud credentials"),
    ("has problems", "a sub-playbook it runs is refused"),
    ("in the catalog", "a sub-playbook that is not in the repository"),
    ("code from a template", "code from a template (a caller's value would become code)"),
)


def reason_of(message: str) -> str:
    """A refusal's reason, grouped (the docs' table of reasons)."""
    for needle, label in REASONS:
        if needle in message:
            return label
    text = message.split(": ", 1)[1] if ": " in message else message
    return re.sub(r"`[^`]*`", lambda m: m.group(0), text)


def catalog() -> dict[str, str]:
    """NoETL's catalog of the vendored playbooks: each ``metadata.path`` (the older top-level ``path``) to its
    file, as NoETL's server registers them (the first file of a path in path order, when several share one)."""
    from mcpipe.formats.noetl._catalog import metadata_path

    index = json.loads((UPSTREAM / "INDEX.json").read_text())["files"]
    known: dict[str, str] = {}
    for rel in sorted(index):
        path = metadata_path(str(UPSTREAM / rel))
        if path is not None:
            known.setdefault(path, str(UPSTREAM / rel))
            known.setdefault(path.strip("/"), str(UPSTREAM / rel))
    return known


def _cell(text: str) -> str:
    """A reason in a table cell: its quoted names as <code> (not backticks, which the docs' path check reads
    as files of the repository), pipes escaped."""
    parts = text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def table(results: list[tuple[str, list[str]]]) -> str:
    """The docs' section: the counts, then one row per refused file with its first (located) reason."""
    passed = sum(1 for _, p in results if not p)
    warned = sum(1 for rel, p in results if not p and rel in WARNED)
    reasons: dict[str, int] = {}
    for rel, problems in results:
        if problems:
            first = problems[0][len(rel) + 1 :] if problems[0].startswith(rel + ":") else problems[0]
            label = reason_of(first.split(": ", 1)[1] if ": " in first else first)
            reasons[label] = reasons.get(label, 0) + 1
    lines = [
        BEGIN,
        "",
        f"Of the {len(results)} vendored playbooks, **{passed} pass `mcpipe playbook check`** "
        f"({100 * passed / len(results):.0f}%; {warned} of them with warnings: what NoETL takes and ignores, or "
        f"fails only when it runs); the {len(results) - passed} below are refused, each with its first reason, "
        "located in the file (`mcpipe playbook check FILE` lists them all).",
        "",
        "| refused because | files |",
        "|---|---|",
        *(f"| {_cell(label)} | {n} |" for label, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "",
        "| file | first reason |",
        "|---|---|",
    ]
    for rel, problems in results:
        if problems:
            first = problems[0]
            reason = first[len(rel) + 1 :] if first.startswith(rel + ":") else first
            lines.append(f"| `tests/formats/noetl/upstream/{rel}` | {_cell(reason)} |")
    lines += ["", END]
    return "\n".join(lines)


def current() -> str:
    text = DOC.read_text()
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return m.group(0) if m else ""


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "python"))
    os.chdir(ROOT)
    fresh = table(check_corpus())
    if "--check" in argv:
        if current() != fresh:
            print("docs/playbooks.md: the table of refused NoETL playbooks is stale: python scripts/noetl_corpus.py")
            return 1
        return 0
    text = DOC.read_text()
    old = current()
    DOC.write_text(text.replace(old, fresh) if old else text.rstrip("\n") + "\n\n" + fresh + "\n")
    print(fresh.splitlines()[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
