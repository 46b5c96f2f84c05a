"""Where a ``playbook`` task finds the playbook it runs: NoETL's catalog, as files.

NoETL registers playbooks in its catalog and a ``playbook`` task names one by its catalog path
(``metadata.path``). mcpipe looks, in order: the playbooks the server serves (by ``metadata.path``); a file
at that path (``PATH``, ``PATH.yaml``, ``PATH.yml``) under each of the catalog's roots (the playbook's
directory and its parents, so a repository's own paths resolve); the ``metadata.path`` of the playbooks in
the playbook's own directory, then of every playbook file under the directories given (``--catalog DIR``). Each playbook
is compiled once; a playbook that reaches itself again through its ``playbook`` tasks is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from mcpipe._yaml import load_yaml

__all__ = ["MAX_SCAN", "Catalog", "metadata_path"]

MAX_SCAN = 5000
"""The most files a catalog reads looking for a ``metadata.path``."""

MAX_FILE_BYTES = 4 * 1024 * 1024

Compile = Callable[[str, tuple[str, ...]], tuple[Any, list[Any]]]


class Catalog:
    """The playbooks a playbook's ``playbook`` tasks can run.

    Args:
        compile: ``compile(file, stack) -> (playbook | None, problems)``.
        roots: directories where a catalog path names a file (``roots/PATH.yaml``).
        scan: directories whose playbook files are indexed by their ``metadata.path``.
        known: catalog path -> file, for the playbooks already known (the server's).
    """

    def __init__(
        self, compile: Compile, roots: list[str], scan: list[str] | None = None, known: dict[str, str] | None = None
    ) -> None:
        self._compile = compile
        self.roots = [os.path.abspath(r) for r in roots]
        self._scan = [os.path.abspath(d) for d in scan or []]
        self._siblings: list[str] = []
        self._known = dict(known or {})
        self._index: dict[str, str] | None = None
        self._done: dict[str, tuple[Any, list[Any]]] = {}

    @classmethod
    def around(
        cls, compile: Compile, file: str, scan: list[str] | None = None, known: dict[str, str] | None = None
    ) -> Catalog:
        """The catalog of a playbook file: ``known`` paths, then its directory and every parent as roots."""
        here = Path(file).resolve().parent
        roots = [str(here), *(str(p) for p in here.parents)]
        catalog = cls(compile, roots, scan, known)
        catalog._siblings = [str(here)]
        return catalog

    def register(self, path: str, file: str) -> None:
        self._known.setdefault(path, os.path.abspath(file))

    def find(self, path: str) -> str | None:
        """The file of catalog path ``path``, or None."""
        if path in self._known:
            return self._known[path]
        rel = path.strip("/")
        if not rel or ".." in Path(rel).parts:
            return None
        for root in self.roots:
            for name in (rel, f"{rel}.yaml", f"{rel}.yml"):
                candidate = os.path.join(root, name)
                if os.path.isfile(candidate):
                    return candidate
        return self._indexed().get(path)

    def _indexed(self) -> dict[str, str]:
        if self._index is None:
            self._index = {}
            for here in self._siblings:  # the playbook's own directory (not below it)
                for f in sorted(os.listdir(here)):
                    full = os.path.join(here, f)
                    if f.endswith((".yaml", ".yml")) and os.path.isfile(full):
                        mpath = metadata_path(full)
                        if mpath is not None:
                            self._index.setdefault(mpath, full)
            seen = 0
            for top in self._scan:
                for dirpath, _dirs, files in os.walk(top):
                    for f in sorted(files):
                        if not f.endswith((".yaml", ".yml")):
                            continue
                        seen += 1
                        if seen > MAX_SCAN:
                            return self._index
                        full = os.path.join(dirpath, f)
                        mpath = metadata_path(full)
                        if mpath is not None:
                            self._index.setdefault(mpath, full)
        return self._index

    def child(self, path: str, parent: Any, stack: tuple[str, ...], relative: bool = False) -> tuple[Any, str]:
        """The compiled playbook at catalog path ``path`` run by ``parent``, or None and why not. With
        ``relative`` (a path written in the playbook, not a template), ``./x.yaml`` and ``../x.yaml`` name a
        file from the parent's own directory, as NoETL's local runner reads them."""
        chain = (*stack, parent.path)
        if path in chain or path == parent.path:
            return None, f"playbook `{path}` runs itself again through its `playbook` tasks ({' -> '.join(chain)})"
        file = self.find(path)
        if file is None and relative and bool(getattr(parent, "file", "")) and path.startswith(("./", "../")):
            candidate = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(parent.file)), path))
            if os.path.isfile(candidate):
                file = candidate
        if file is None:
            return None, f"no playbook with the catalog path `{path}` (looked for {path}.yaml under the catalog)"
        key = os.path.abspath(file)
        if key not in self._done:
            self._done[key] = self._compile(file, chain)
        pb, problems = self._done[key]
        if pb is None:
            first = problems[0] if problems else None
            what = f": {first.location}: {first.message}" if first is not None else ""
            where = os.path.relpath(file, os.path.dirname(parent.file)) if parent.file else file
            return None, f"playbook `{path}` ({where}) has problems ({len(problems)}){what}"
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
