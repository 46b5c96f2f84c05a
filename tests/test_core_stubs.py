"""The hand-written stub ``mcpipe/_core.pyi`` matches the compiled module (checked by ``mypy.stubtest``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_core_stub_matches_the_compiled_module():
    pytest.importorskip("mypy.stubtest")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "mcpipe._core"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
