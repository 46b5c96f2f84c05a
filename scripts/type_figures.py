"""Figures of how typed ``python/mcpipe`` is (issue 31): print them, one per line.

- ``any_params``: the share of annotated function parameters whose annotation is ``Any`` (bare, or
  ``typing.Any``; ``*args: Any`` and ``**kwargs: Any`` count too), and the share of those whose
  annotation merely contains ``Any`` (``dict[str, Any]``);
- ``type_ignores``: ``# type: ignore`` comments, all and of the ``attr-defined`` kind;
- ``private_imports``: imports of another package's private module (``from mcpipe.tools._base import
  Tool`` in ``mcpipe.server``; a module ``_x`` is private to the package holding it, and to its
  subpackages), one per import statement and module;
- ``package_cycles``: package-level import cycles (``scripts/check_layers.py``'s count);
- ``strict_structs``: classes that declare msgspec's strict policy themselves (a direct subclass of
  ``msgspec.Struct`` passing ``forbid_unknown_fields``), rather than inheriting it from the one base;
- ``config_any``: parameters and fields named ``config``/``cfg``/``*_config`` typed bare ``Any``, and
  ``getattr(config, ...)`` calls (a config read by attribute name, untyped).

Usage: ``python scripts/type_figures.py [ROOT]`` (ROOT: the directory holding ``mcpipe``, default
``python``).
"""

from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tokenize
from pathlib import Path
from types import ModuleType


def _layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", Path(__file__).with_name("check_layers.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_layers", module)
    spec.loader.exec_module(module)
    return module


def _is_any(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def any_params(tree: ast.AST) -> tuple[int, int, int]:
    """``(annotated, bare Any, containing Any)`` over every parameter of every function in ``tree``."""
    annotated = bare = contains = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
        for p in params:
            if p.annotation is None:
                continue
            note = p.annotation
            if isinstance(note, ast.Constant) and isinstance(note.value, str):  # a quoted annotation
                try:
                    note = ast.parse(note.value, mode="eval").body
                except SyntaxError:
                    pass
            annotated += 1
            bare += _is_any(note)
            contains += any(isinstance(n, ast.expr) and _is_any(n) for n in ast.walk(note))
    return annotated, bare, contains


def type_ignores(source: str) -> tuple[int, int]:
    """``(all, attr-defined)`` ``# type: ignore`` comments of ``source``."""
    every = attr = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and "type: ignore" in tok.string:
            every += 1
            attr += "attr-defined" in tok.string
    return every, attr


def _is_struct_base(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "Struct") or (
        isinstance(node, ast.Name) and node.id == "Struct"
    )


def strict_structs(tree: ast.AST) -> list[str]:
    """Names of the classes of ``tree`` declaring the strict policy themselves (see the module's doc)."""
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(_is_struct_base(b) for b in node.bases)
        and any(k.arg == "forbid_unknown_fields" for k in node.keywords)
    ]


def _config_name(name: str) -> bool:
    return name in ("config", "cfg") or name.endswith("_config")


def config_any(tree: ast.AST) -> tuple[int, int]:
    """``(parameters and fields named like a config typed bare Any, getattr(config, ...) calls)``."""
    typed = reads = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            typed += _config_name(node.arg) and _is_any(node.annotation)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            typed += _config_name(node.target.id) and _is_any(node.annotation)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            first = node.args[0] if node.args else None
            reads += isinstance(first, ast.Name) and _config_name(first.id)
    return typed, reads


def _modules(root: Path) -> set[str]:
    """Every module of ``root/mcpipe`` (``.py``, ``.pyi`` and extension modules), by dotted name."""
    found = set()
    for p in (root / "mcpipe").rglob("*"):
        if p.suffix in (".py", ".pyi", ".so"):
            stem = p.name.split(".")[0]
            parts = [*p.relative_to(root).parent.parts, *([] if stem == "__init__" else [stem])]
            found.add(".".join(parts))
    return found


def private_imports(root: Path) -> list[str]:
    """``path:line: module`` of every import of another package's private module."""
    layers = _layers()
    modules = _modules(root)
    found = []
    for path in sorted((root / "mcpipe").rglob("*.py")):
        module = layers.module_name(path, root)
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        seen = set()
        for line, target in layers.imports(path.read_text(), module, is_package=is_package):
            parts = target.split(".")
            hit = next((m for k in range(len(parts), 0, -1) if (m := ".".join(parts[:k])) in modules), None)
            if hit is None:
                continue
            owner, _, name = hit.rpartition(".")
            if not name.startswith("_") or name.startswith("__"):
                continue
            if package == owner or package.startswith(owner + "."):
                continue
            if (line, hit) not in seen:
                seen.add((line, hit))
                found.append(f"{path}:{line}: {hit}")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "python"
    annotated = bare = contains = ignores = attr = typed = reads = 0
    strict: list[str] = []
    for path in sorted((root / "mcpipe").rglob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        a, b, c = any_params(tree)
        strict += strict_structs(tree)
        t, r = config_any(tree)
        typed, reads = typed + t, reads + r
        annotated, bare, contains = annotated + a, bare + b, contains + c
        i, d = type_ignores(source)
        ignores, attr = ignores + i, attr + d
    layers = _layers()
    print(
        f"any_params: {contains}/{annotated} = {contains / annotated:.1%} containing Any"
        f" ({bare}/{annotated} = {bare / annotated:.1%} bare Any)"
    )
    print(f"type_ignores: {ignores} ({attr} attr-defined)")
    print(f"private_imports: {len(private_imports(root))}")
    print(f"package_cycles: {len(layers.cycles(layers.package_graph(root)))}")
    print(f"strict_structs: {len(strict)} ({', '.join(sorted(strict))})")
    print(f"config_any: {typed} typed Any, {reads} getattr(config, ...)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
