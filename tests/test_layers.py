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
