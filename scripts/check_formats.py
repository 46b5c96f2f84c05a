"""The format rule of mcpipe: a foreign format is named only in its own folder (``make lint`` runs this).

Each format of ``python/mcpipe/formats/<name>/`` (mcpg, NoETL, discord-mcp, piraeus) is a dialect over the one
plan: the server, the gateway, the config and the core kinds reach it only through the registry,
``mcpipe.formats.FORMATS`` (see ``python/mcpipe/formats/__init__.py``). So outside ``formats/<name>/``, no code
names it: no import of its package, no identifier holding its name (``McpgAuditLog``, ``discord_source``), no
string that is code rather than prose (``"mcpg"``, ``"mcpipe.formats.noetl"``, ``"mcpg.tool.call.allowed"``: a
string without whitespace). Docstrings, comments and prose in messages may say which system a behaviour comes
from. ``playbook`` counts as NoETL's name (mcpipe's playbooks are NoETL's). What must stay is listed in
:data:`ALLOWED`, each with why.

Usage: ``python scripts/check_formats.py [ROOT] [--count]`` (ROOT: the directory holding the ``mcpipe``
package, default ``python``); exits 1 and prints one located line per mention; ``--count`` prints how many
mentions there are (the allowed ones included) and in how many files, and exits 0.
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

WORDS: dict[str, tuple[str, ...]] = {
    "mcpg": ("mcpg",),
    "noetl": ("noetl", "playbook"),
    "discord": ("discord",),
    "piraeus": ("piraeus",),
}
"""Each format's folder under ``mcpipe/formats/`` -> the words that name it (matched in any case, inside
longer names too)."""

STRINGS = "<strings>"
"""In :data:`ALLOWED`: every string constant of the file (not its identifiers)."""

ALLOWED: dict[str, tuple[str, ...]] = {
    # The registry itself: one line per format (its module, the config keys that turn it on).
    "mcpipe/formats/__init__.py": (STRINGS,),
    # The config's sections of the formats (`playbooks = [...]`, `[piraeus]`) and `[audit] format = "mcpg"`:
    # fields of `Config`, typed by the Structs their formats declare (issue 31, the typed config), which the
    # config names for the type checker only (`if TYPE_CHECKING:`; the formats decode them at load).
    "mcpipe/config.py": (
        "playbooks",
        "piraeus",
        "mcpg",
        "mcpipe.formats.noetl",
        "PlaybookEntry",
        "mcpipe.formats.piraeus",
        "PiraeusConfig",
    ),
    # `mcpipe playbook check|run` and `mcpipe explain` of a playbook file: commands of the server layer (`run`
    # serves the playbook on a whole app, `open_app`, a layer above the formats), whose parsers are built at
    # every start, so they import `mcpipe.formats.noetl` (0.3 s) only when they run.
    "mcpipe/_playbook_cli.py": (
        "playbook",
        "noetl.io/v2",
        "mcpipe.formats.noetl",
        "load_playbook",
        "NoetlPlaybook",
        "playbook_tool",
    ),
    "mcpipe/cli.py": (
        "playbook",
        "mcpipe._playbook_cli",
        "add_playbook_parser",
        "_playbook_plan",
        "mcpipe.formats.noetl",
        "load_playbook",
    ),
    # The console's JSON API answers a `playbooks` list and labels their origin `noetl` (its contract).
    "mcpipe/console/_api.py": ("playbook", "playbooks", "noetl"),
    # Core kinds keep NoETL's and mcpg's names that their users write or see: the duckdb kind's `output:
    # noetl` (documented in docs/declared-pipelines.md), the `__name__` a python step's code sees, and mcpg's
    # plugin id accepted by `plugin_transform`.
    "mcpipe/kinds/duckdb.py": ("noetl",),
    "mcpipe/kinds/_pyexec.py": ("__noetl_step__",),
    "mcpipe/kinds/plugin_transform.py": ("dev.mcpg.transform.jsonata",),
}
"""``path under ROOT`` -> the names that may stay there (exact identifiers or strings, or :data:`STRINGS`)."""

_CODE_STRING = re.compile(r"\S+")


def owner(path: Path, root: Path) -> str | None:
    """The format whose folder holds ``path`` (``noetl`` for ``ROOT/mcpipe/formats/noetl/_steps.py``), or None."""
    parts = path.relative_to(root).parts
    if len(parts) > 3 and parts[:2] == ("mcpipe", "formats") and parts[2] in WORDS:
        return parts[2]
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
        # An attribute's docstring: a string statement right after an assignment.
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for before, after in itertools.pairwise(body):
                assigned = isinstance(before, (ast.Assign, ast.AnnAssign))
                if assigned and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    found.add(id(after.value))
    return found


def names(source: str) -> Iterator[tuple[int, str, bool]]:
    """``(line, name, is_string)`` of every identifier, imported module and code-like string of ``source``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Name):
            found = [node.id]
        elif isinstance(node, ast.Attribute):
            found = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = [node.name]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg is not None):
            found = [node.arg]
        elif isinstance(node, ast.Import):
            found = [n for a in node.names for n in (a.name, a.asname) if n]
        elif isinstance(node, ast.ImportFrom):
            found = [node.module or "", *(n for a in node.names for n in (a.name, a.asname) if n)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if _CODE_STRING.fullmatch(node.value):
                yield node.lineno, node.value, True
            continue
        for name in found:
            yield getattr(node, "lineno", 0), name, False


def check_source(source: str, where: str, own: str | None, allowed: tuple[str, ...] = ()) -> list[str]:
    """Every mention of a format other than ``own`` in one file, as ``where:line: ...`` lines."""
    problems = []
    for line, name, is_string in names(source):
        if name in allowed or (is_string and STRINGS in allowed):
            continue
        lowered = name.lower()
        for fmt, words in WORDS.items():
            if fmt != own and any(w in lowered for w in words):
                what = "string" if is_string else "name"
                problems.append(
                    f"{where}:{line}: the {what} `{name}` names the format `{fmt}` outside"
                    f" mcpipe/formats/{fmt}/: reach it through mcpipe.formats.FORMATS"
                )
                break
    return sorted(set(problems), key=lambda p: (int(p.split(":")[1]), p))


def _files(root: Path) -> Iterator[tuple[Path, str]]:
    for path in sorted((root / "mcpipe").rglob("*.py")):
        yield path, path.relative_to(root).as_posix()


def check(root: Path) -> list[str]:
    """Every mention of a format outside its folder under ``root/mcpipe``, the allowed ones left out."""
    problems = []
    for path, rel in _files(root):
        problems += check_source(path.read_text(), str(path), owner(path, root), ALLOWED.get(rel, ()))
    return problems


def count(root: Path) -> tuple[int, int]:
    """``(mentions, files)`` of formats outside their folders, the allowed ones included."""
    found = [(rel, p) for path, rel in _files(root) for p in check_source(path.read_text(), rel, owner(path, root))]
    return len(found), len({rel for rel, _ in found})


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "--count"]
    root = Path(args[0] if args else "python")
    if "--count" in argv:
        mentions, files = count(root)
        print(f"{mentions} mentions of a format outside its folder, in {files} files")
        return 0
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
