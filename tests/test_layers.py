"""The layer rule (scripts/check_layers.py, run by ``make lint``): imports point down, never up."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts" / "check_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module
    spec.loader.exec_module(module)
    return module


def test_every_import_of_the_package_points_down(layers):
    assert layers.check(ROOT / "python") == []


def test_every_module_of_the_package_has_a_layer(layers):
    root = ROOT / "python"
    assert [
        name for p in (root / "mcpipe").rglob("*.py") if layers.layer_of(name := layers.module_name(p, root)) is None
    ] == []


def test_an_import_from_a_higher_layer_is_reported_where_it_is(layers):
    fake = "from mcpipe.errors import ErrorCode\nfrom mcpipe.runtime import run_pipeline\n"
    assert layers.check_source(fake, "mcpipe.plan._fake", "plan/_fake.py") == [
        "plan/_fake.py:2: mcpipe.plan._fake (layer plan) imports mcpipe.runtime.run_pipeline (layer runtime,"
        " above it): imports point down only"
    ]


def test_lazy_relative_and_type_checking_imports_count_too(layers):
    fake = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from mcpipe.server import App\n"
        "def f():\n"
        "    from ..gateway import Gateway\n"
        "    import mcpipe.declared\n"
    )
    found = layers.check_source(fake, "mcpipe.kinds.fake", "kinds/fake.py")
    assert [line.split(": ", 1)[0] for line in found] == ["kinds/fake.py:3", "kinds/fake.py:5", "kinds/fake.py:6"]
    assert "imports mcpipe.gateway.Gateway (layer gateway" in found[1]


def test_imports_of_the_same_or_a_lower_layer_pass(layers):
    fine = "from mcpipe.plan import Leaf\nfrom mcpipe.interaction import AskFailed\nfrom . import _base\nimport trio\n"
    assert layers.check_source(fine, "mcpipe.kinds.fine", "kinds/fine.py") == []


def test_the_command_fails_on_a_package_with_a_wrong_way_import(layers, tmp_path, capsys):
    (tmp_path / "mcpipe" / "store").mkdir(parents=True)
    (tmp_path / "mcpipe" / "__init__.py").write_text("")
    (tmp_path / "mcpipe" / "store" / "__init__.py").write_text("from mcpipe.kinds import KINDS\n")
    assert layers.main(["check_layers", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "store/__init__.py:1: mcpipe.store (layer store) imports mcpipe.kinds.KINDS (layer kinds" in err
    assert layers.main(["check_layers", str(ROOT / "python")]) == 0


def test_the_package_has_no_package_level_import_cycle(layers):
    assert layers.check_cycles(ROOT / "python") == []


def _tree(tmp_path, files):
    for name, text in {"mcpipe/__init__.py": "", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_two_packages_importing_each_other_fail_the_command_located_at_both_imports(layers, tmp_path, capsys):
    # same layer (plan), so only the cycle check can catch it; the way back is lazy
    root = _tree(
        tmp_path,
        {
            "mcpipe/plan/__init__.py": "import trio\nfrom mcpipe.expr._expr import CelExpr\n",
            "mcpipe/expr/__init__.py": "",
            "mcpipe/expr/_expr.py": "def f():\n    from mcpipe.plan import Leaf\n",
        },
    )
    assert layers.check(root) == []
    assert layers.main(["check_layers", str(root)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"{root}/mcpipe/expr/_expr.py:2: package cycle expr -> plan -> expr: expr imports plan"
        f" ({root}/mcpipe/expr/_expr.py:2), plan imports expr ({root}/mcpipe/plan/__init__.py:2);"
        " a package may not import one that imports it back"
    ]


def test_a_longer_cycle_under_type_checking_is_reported_as_its_shortest_ring(layers, tmp_path):
    root = _tree(
        tmp_path,
        {
            "mcpipe/a.py": "from mcpipe import b\n",
            "mcpipe/b.py": "from mcpipe.c import X\n",
            "mcpipe/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mcpipe.a import Y\n",
            "mcpipe/d.py": "import mcpipe.a\n",
        },
    )
    assert layers.cycles(layers.package_graph(root)) == [["a", "b", "c", "a"]]
    (root / "mcpipe" / "c.py").write_text("X = 1\n")
    assert layers.check_cycles(root) == []


def test_an_import_of_the_public_face_from_inside_is_a_cycle_with_it(layers, tmp_path):
    root = _tree(
        tmp_path,
        {
            "mcpipe/__init__.py": "from mcpipe.server import serve\n",
            "mcpipe/server/__init__.py": "def serve():\n    from mcpipe import __version__\n",
        },
    )
    assert layers.cycles(layers.package_graph(root)) == [["mcpipe", "server", "mcpipe"]]
