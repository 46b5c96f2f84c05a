"""Vendor NoETL's playbooks: every playbook path in noetl/noetl's history, at its last version.

Usage: python scripts/vendor_noetl.py GIT_DIR [DEST]

``GIT_DIR`` is a clone of https://github.com/noetl/noetl (a bare one will do); ``DEST`` defaults to
``tests/formats/noetl/upstream``. A path is a playbook when its YAML has a top-level ``kind: Playbook``,
``type: Playbook`` or ``workflow:``. Its last version is taken along the default branch's history (the
last commit that changed it; for a path deleted there, the commit before the deletion); a path that only
ever lived on other branches is taken from the newest commit of any branch that had it. Each file keeps its
upstream path; ``INDEX.json`` records each file's commit, whether it is at HEAD, and its licence (the
repository's LICENSE at that commit). Run again to refresh; files not in the index are removed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

_PLAYBOOK = re.compile(r"^(kind:\s*Playbook\b|type:\s*Playbook\b|workflow:)", re.M)
_YAML = re.compile(r"\.ya?ml$")
_KEEP = {"SOURCE.md", "INDEX.json", "LICENSE", "LICENSE-APACHE", "LICENSE-MIT", "NOTICE", "LICENSE.until-2026-03-01"}


def git(gd: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gd, *args], check=True, capture_output=True).stdout


def has(gd: str, commit: str, path: str) -> bool:
    r = subprocess.run(["git", "--git-dir", gd, "cat-file", "-e", f"{commit}:{path}"], capture_output=True)
    return r.returncode == 0


def last_versions(gd: str, refs: list[str]) -> dict[str, str]:
    """``path -> commit`` of the last version of every YAML path in the history of ``refs``."""
    log = git(gd, "log", *refs, "--format=C %H %ct", "--name-status", "--no-renames").decode()
    last: dict[str, tuple[int, str, str]] = {}
    commit, when = "", 0
    for line in log.splitlines():
        if line.startswith("C "):
            _, commit, t = line.split()
            when = int(t)
            continue
        if "\t" not in line:
            continue
        status, path = line.split("\t", 1)
        if _YAML.search(path) and (path not in last or when > last[path][0]):
            last[path] = (when, commit, status)
    out: dict[str, str] = {}
    for path, (_when, c, status) in last.items():
        if status == "D":
            parents = git(gd, "rev-list", "--parents", "-n1", c).decode().split()[1:]
            found = [p for p in parents if has(gd, p, path)]
            if not found:
                continue
            c = found[0]
        out[path] = c
    return out


def licence(gd: str, commit: str, cache: dict[str, str]) -> str:
    if commit not in cache:
        try:
            text = git(gd, "show", f"{commit}:LICENSE").decode(errors="replace")
        except subprocess.CalledProcessError:
            text = ""
        if "dual-licensed" in text:
            cache[commit] = "Apache-2.0 OR MIT"
        elif "MIT License" in text:
            cache[commit] = "MIT"
        elif "Apache License" in text:
            cache[commit] = "Apache-2.0"
        else:
            cache[commit] = "unknown"
    return cache[commit]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    gd = argv[0]
    dest = Path(argv[1] if len(argv) > 1 else "tests/formats/noetl/upstream")
    head = git(gd, "rev-parse", "HEAD").decode().strip()
    at_head = set(git(gd, "ls-tree", "-r", "--name-only", "HEAD").decode().splitlines())
    main_line = last_versions(gd, ["HEAD"])
    every = last_versions(gd, ["--all"])
    chosen = {**{p: c for p, c in every.items() if p not in main_line}, **main_line}
    index: dict[str, dict[str, object]] = {}
    cache: dict[str, str] = {}
    for path in sorted(chosen):
        c = chosen[path]
        data = git(gd, "show", f"{c}:{path}")
        if not _PLAYBOOK.search(data.decode("utf-8", "replace")):
            continue
        date = git(gd, "show", "-s", "--format=%cs", c).decode().strip()
        index[path] = {
            "commit": c,
            "date": date,
            "at_head": path in at_head,
            "branch_only": path not in main_line,
            "licence": licence(gd, c, cache),
        }
    if dest.exists():
        for f in dest.rglob("*"):
            if f.is_file() and f.name not in _KEEP:
                rel = f.relative_to(dest).as_posix()
                if rel not in index:
                    f.unlink()
    for path, entry in index.items():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(git(gd, "show", f"{entry['commit']}:{path}"))
    for name in ("LICENSE", "LICENSE-APACHE", "LICENSE-MIT", "NOTICE"):
        (dest / name).write_bytes(git(gd, "show", f"{head}:{name}"))
    # The MIT licence the repository had from 2016 until it became dual-licensed (2026-03-01).
    (dest / "LICENSE.until-2026-03-01").write_bytes(git(gd, "show", "9e4d1959^:LICENSE"))
    doc = {"repository": "https://github.com/noetl/noetl", "head": head, "files": index}
    (dest / "INDEX.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for d in sorted((p for p in dest.rglob("*") if p.is_dir()), reverse=True):
        if not any(d.iterdir()):
            shutil.rmtree(d)
    print(f"{len(index)} playbooks in {dest} (HEAD {head[:8]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
