"""Where a ``playbook`` task finds the playbook it runs: NoETL's catalog, as files.

NoETL registers playbooks in its catalog and a ``playbook`` task names one by its catalog path
(``metadata.path``). mcpipe's catalog is the playbooks under its **roots**, the directories the operator
gave (a server: the directory of each ``playbooks`` glob, the part before its first wildcard;
``mcpipe playbook``: the current directory, the file's own and every ``--catalog DIR``), and nothing else.
A path is looked in, in order: the playbooks the server serves (by ``metadata.path``); a file at that path
(``PATH``, ``PATH.yaml``, ``PATH.yml``) from the base directory (the config's, where a repository's own paths
start) and from each root; the ``metadata.path`` of the playbooks in the playbook's own directory, then of every
playbook file under the ``--catalog`` directories. A file counts only when its real path (symlinks resolved)
lies inside a root; a path with ``..`` or outside the roots answers exactly as a path naming no file does, so
what the catalog refuses says nothing of what exists (issue 27: ``etc/passwd`` was opened and parsed, and an
unserved playbook elsewhere on the host ran).

Each playbook is compiled once. A playbook is known by its file's real path, so one that reaches itself again
through its ``playbook`` tasks is refused whatever spelling of its path it used, and sub-playbooks nest at most
:data:`MAX_DEPTH` deep (checked when the playbook loads for the paths it writes, and as it runs for those its
templates give: :mod:`mcpipe.formats.noetl._steps`).
"""

from __future__ import annotations

import glob
import itertools
import os
from collections.abc import Callable
from typing import Any

import yaml

from mcpipe._yaml import load_yaml

__all__ = ["MAX_DEPTH", "MAX_SCAN", "Catalog", "glob_root", "identity", "metadata_path"]

MAX_SCAN = 5000
"""The most files a catalog reads looking for a ``metadata.path``."""

MAX_DEPTH = 16
"""How deeply sub-playbooks may nest (a playbook running a playbook running a playbook...)."""

MAX_FILE_BYTES = 4 * 1024 * 1024

Compile = Callable[[str, tuple[str, ...]], tuple[Any, list[Any]]]


def identity(pb: object) -> str:
    """What a compiled playbook is, whatever path named it: its file's real path (else its catalog path)."""
    file = getattr(pb, "file", "")
    return os.path.realpath(file) if file else f"catalog:{getattr(pb, 'path', '')}"


def glob_root(pattern: str) -> str:
    """The directory a glob names files under: its components before the first wildcard (``flows/*.yaml`` ->
    ``flows``, ``*.yaml`` -> ``.``, ``a/b.yaml`` -> ``a``)."""
    head = list(itertools.takewhile(lambda part: not glob.has_magic(part), pattern.split(os.sep)[:-1]))
    if not head:
        return os.sep if pattern.startswith(os.sep) else "."
    return os.sep.join(head) or os.sep


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class Catalog:
    """The playbooks a playbook's ``playbook`` tasks can run.

    Args:
        compile: ``compile(file, stack) -> (playbook | None, problems)``; ``stack`` the identities
            (:func:`identity`) of the playbooks running it.
        roots: the directories whose playbooks the catalog holds (nothing outside them).
        scan: directories whose playbook files are indexed by their ``metadata.path`` (roots too).
        known: catalog path -> file, for the playbooks the server serves.
        base: the directory a path is looked up from first (a repository's root), besides the roots.
    """

    def __init__(
        self,
        compile: Compile,
        roots: list[str],
        scan: list[str] | None = None,
        known: dict[str, str] | None = None,
        base: str | None = None,
    ) -> None:
        self._compile = compile
        self._scan = [os.path.realpath(d) for d in scan or []]
        self.roots = list(dict.fromkeys([*(os.path.realpath(r) for r in roots), *self._scan]))
        self._lookup = list(dict.fromkeys([*([os.path.abspath(base)] if base else []), *self.roots]))
        self._siblings: list[str] = []
        self._known = dict(known or {})
        self._index: dict[str, str] | None = None
        self._done: dict[str, tuple[Any, list[Any]]] = {}

    @classmethod
    def around(
        cls,
        compile: Compile,
        file: str,
        scan: list[str] | None = None,
        known: dict[str, str] | None = None,
        roots: list[str] | None = None,
        base: str | None = None,
    ) -> Catalog:
        """The catalog of a playbook file: ``known`` paths, the ``roots`` (default: ``base`` and the file's own
        directory), and the file's siblings by ``metadata.path`` when they lie in a root."""
        here = os.path.dirname(os.path.realpath(file))
        if roots is None:
            roots = [*([base] if base else []), here]
        catalog = cls(compile, roots, scan, known, base)
        if _inside(here, catalog.roots):
            catalog._siblings = [here]
        return catalog

    def _file(self, candidate: str) -> str | None:
        """``candidate``'s real path when it is a file inside a root (nothing outside them is opened)."""
        real = os.path.realpath(candidate)
        return real if _inside(real, self.roots) and os.path.isfile(real) else None

    def find(self, path: str) -> str | None:
        """The file of catalog path ``path``, or None (for a path outside the catalog too)."""
        if path in self._known:
            return self._known[path]
        rel = path.strip("/")
        if not rel or "\x00" in rel or ".." in rel.split("/"):
            return None
        names = (rel, f"{rel}.yaml", f"{rel}.yml")
        found = next((f for d in self._lookup for n in names if (f := self._file(os.path.join(d, n)))), None)
        indexed = self._indexed().get(path) if found is None else None
        return self._file(indexed) if indexed is not None else found

    def _indexed(self) -> dict[str, str]:
        if self._index is None:
            self._index = {}
            # The playbook's own directory (not below it), then every directory under the scanned ones.
            here = [os.path.join(d, f) for d in self._siblings for f in sorted(os.listdir(d))]
            scanned = (os.path.join(d, f) for top in self._scan for d, _dirs, fs in os.walk(top) for f in sorted(fs))
            here += itertools.islice((f for f in scanned if f.endswith((".yaml", ".yml"))), MAX_SCAN)
            for full in here:
                mpath = metadata_path(full) if full.endswith((".yaml", ".yml")) and os.path.isfile(full) else None
                if mpath is not None:
                    self._index.setdefault(mpath, full)
        return self._index

    def child(self, path: str, parent: Any, stack: tuple[str, ...], relative: bool = False) -> tuple[Any, str]:
        """The compiled playbook at catalog path ``path`` run by ``parent`` (run by the playbooks ``stack``
        names, :func:`identity`), or None and why not. With ``relative`` (a path written in the playbook, not a
        template), ``./x.yaml`` and ``../x.yaml`` name a file from the parent's own directory, as NoETL's local
        runner reads them (inside the roots too)."""
        chain = (*stack, identity(parent))
        if len(chain) > MAX_DEPTH:
            return None, f"sub-playbooks nest deeper than {MAX_DEPTH} (playbook `{path}`)"
        file = self.find(path)
        if file is None and relative and bool(getattr(parent, "file", "")) and path.startswith(("./", "../")):
            file = self._file(os.path.join(os.path.dirname(os.path.abspath(parent.file)), path))
        if file is None:
            return None, f"no playbook `{path}` in the catalog"
        key = os.path.realpath(file)
        if key in chain:
            names = " -> ".join(os.path.basename(k) for k in (*chain, key))
            return None, f"playbook `{path}` runs itself again through its `playbook` tasks ({names})"
        if key not in self._done:
            self._done[key] = self._compile(key, chain)
        pb, problems = self._done[key]
        if pb is None:
            first = problems[0] if problems else None
            what = f": {first.location}: {first.message}" if first is not None else ""
            return None, f"playbook `{path}` has problems ({len(problems)}){what}"
        return pb, ""


def metadata_path(file: str) -> str | None:
    """The catalog path (``metadata.path``, or the older top-level ``path``) of a playbook file, or None."""
    try:
        if os.path.getsize(file) > MAX_FILE_BYTES:
            return None
        with open(file, encoding="utf-8") as fh:
            raw = load_yaml(fh.read())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(raw, dict):
        return None
    meta = raw.get("metadata")
    value = meta.get("path") if isinstance(meta, dict) else raw.get("path")
    return value if isinstance(value, str) else None
