"""Shared fixtures of the benchmarks: the resolver workloads of ``../shared/bench`` and the oracle."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT.parent / "shared" / "bench" / "workloads.py"


def load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def workloads() -> dict:
    """{name: (template, env)} from ``../shared/bench/workloads.py`` (skipped when that file is absent)."""
    if not WORKLOADS.is_file():
        pytest.skip(f"the shared resolver workloads are not there ({WORKLOADS})")
    return load("mcpipe_bench_workloads", WORKLOADS).workloads()


@pytest.fixture(scope="session")
def oracle() -> ModuleType:
    """The pure-Python template oracle of ``tests/oracle.py``."""
    return load("oracle", ROOT / "tests" / "oracle.py")
