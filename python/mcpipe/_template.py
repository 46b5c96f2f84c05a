"""Where the compiler gets ``Template`` from.

TRANSITIONAL: until the Rust core's ``Template`` is built, fall back to the pure-Python oracle in
``tests/oracle.py`` so the runtime can be developed. This fallback is removed when the core lands.
"""

from __future__ import annotations

try:
    from mcpipe._core import Template
except ImportError:  # pragma: no cover - transitional
    import importlib.util
    import pathlib

    _path = pathlib.Path(__file__).resolve().parents[2] / "tests" / "oracle.py"
    _spec = importlib.util.spec_from_file_location("_mcpipe_oracle", _path)
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    import sys

    sys.modules["_mcpipe_oracle"] = _mod
    _spec.loader.exec_module(_mod)
    Template = _mod.Template  # type: ignore[misc,assignment]

__all__ = ["Template"]
