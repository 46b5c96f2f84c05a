"""Every file the docs name exists: repo paths in backticks (`tests/kit/kafkabroker.py`, `backends/grpc.py`,
`python/mcpipe/kinds/`) and the targets of relative Markdown links, so a move or a rename cannot leave a
page pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
"""The shared reference material beside the repo (`spec/pipeline.md`, `shared/bench/workloads.py`)."""
DOCS = [*sorted(ROOT.glob("docs/*.md")), ROOT / "README.md"]

_FENCED = re.compile(r"```.*?```", re.S)
_BACKTICKED = re.compile(r"`([A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.-]+)+/?)`")
_FILE_SUFFIXES = (".py", ".md", ".rs", ".toml", ".yaml", ".yml", ".json", ".jsonl", ".sh", ".txt")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path is named from the repo root, from python/ (`mcpipe/telemetry.py`) or from the package
# (`backends/grpc.py`, as docs/architecture.md names modules).
_BASES = (ROOT, ROOT / "python", ROOT / "python" / "mcpipe")


def _prose(doc: Path) -> str:
    return _FENCED.sub("", doc.read_text())


def _named_paths(doc: Path) -> list[str]:
    """Backticked words that are file paths: a slash, and a file suffix or a trailing slash (a folder); the
    other slashed words (`tools/list`, `application/json`, `10/8`) name no file."""
    return [p for p in _BACKTICKED.findall(_prose(doc)) if p.endswith("/") or p.endswith(_FILE_SUFFIXES)]


def _exists(path: str) -> bool:
    if path.split("/", 1)[0] in ("spec", "shared"):  # the shared material: ../shared/spec/..., ../shared/...
        return not SHARED.is_dir() or (SHARED / path).exists() or (ROOT.parent / path).exists()
    return any((base / path).exists() for base in _BASES)


def test_the_docs_name_files_in_backticks() -> None:
    """The pattern finds the paths the docs name (so the checks below check something)."""
    named = {p for doc in DOCS for p in _named_paths(doc)}
    assert {"tests/kit/kafkabroker.py", "backends/grpc.py", "scripts/check_layers.py"} <= named
    assert "tools/list" not in named and "application/json" not in named


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_path_a_doc_names_in_backticks_exists(doc: Path) -> None:
    missing = [p for p in _named_paths(doc) if not _exists(p)]
    assert missing == [], f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_relative_link_of_a_doc_reaches_a_file(doc: Path) -> None:
    targets = [t for t in _LINK.findall(_prose(doc)) if not re.match(r"[a-z]+:|#", t)]
    missing = [t for t in targets if not (doc.parent / t.split("#", 1)[0]).exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} links to files that do not exist: {missing}"


_COMMAND = re.compile(r"^\$ (?:mcpipe|python -m mcpipe) (.*)$", re.M)
_PATH_WORD = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+$")


def _command_paths(doc: Path) -> list[str]:
    """The file arguments of the ``$ mcpipe ...`` commands the docs show: a word with a slash and a file
    suffix (a bare ``p.json`` is the reader's own file; a URL is no file)."""
    words = [w.strip("'\"") for m in _COMMAND.finditer(doc.read_text()) for w in m.group(1).split()]
    return [w for w in words if _PATH_WORD.match(w) and w.endswith(_FILE_SUFFIXES)]


_ALL_DOCS = [*DOCS, *sorted(ROOT.glob("docs/formats/*.md"))]


def test_the_docs_commands_name_files_so_the_check_below_checks_something() -> None:
    named = {p for doc in _ALL_DOCS for p in _command_paths(doc)}
    assert "tests/formats/noetl/upstream/tests/fixtures/playbooks/hello_world/hello_world.yaml" in named


@pytest.mark.parametrize("doc", _ALL_DOCS, ids=lambda d: d.name)
def test_every_file_a_command_of_the_docs_runs_on_exists(doc: Path) -> None:
    """A reader who copies `$ mcpipe playbook check tests/.../hello_world.yaml` finds the file."""
    missing = [p for p in _command_paths(doc) if not _exists(p)]
    assert missing == [], f"{doc.relative_to(ROOT)} runs commands on files that do not exist: {missing}"
