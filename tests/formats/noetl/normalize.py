"""NoETL runs reduced to one comparable shape, and the comparison the golden tests make.

:func:`stable` and :data:`VOLATILE_KEYS` are copied from the noetl-oracle kit's ``normalize.py``
(``../shared/noetl-oracle/normalize.py``, which wrote the golden files of ``golden/`` with ``run.py --stable``),
so an mcpipe result goes through the same function as NoETL's did. :func:`comparable` masks more that
changes between runs of the same playbook (HTTP ``date`` and ``server`` headers: the stand-in's Python
version), and :func:`subset_diff` is the comparison: every key of the golden must hold the same value in
mcpipe's result (4.26.0 keeps a reduced result per step, so mcpipe's may hold more).
"""

from __future__ import annotations

import re
from typing import Any

# Keys whose values differ on every run, whatever the playbook does (the kit's list).
VOLATILE_KEYS = {
    "execution_id",
    "command_id",
    "event_id",
    "task_id",
    "worker_id",
    "request_id",
    "database_path",
    "elapsed",
    "metrics",
    "duration_ms",
    "duration_seconds",
    "started_at",
    "completed_at",
    "start_time",
    "end_time",
}
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SNOWFLAKE = re.compile(r"^\d{17,20}$")

# Beyond the kit's list: what differs between two runs against the stand-in (its clock, its Python).
HEADER_KEYS = {"date", "server"}


def stable(x: Any) -> Any:
    """Replace run-specific values with placeholders, recursively (the kit's ``stable``)."""
    if isinstance(x, dict):
        return {k: "<volatile>" if k in VOLATILE_KEYS else stable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [stable(v) for v in x]
    if isinstance(x, str):
        if UUID.match(x):
            return "<uuid>"
        if SNOWFLAKE.match(x):
            return "<id>"
    return x


def comparable(x: Any) -> Any:
    """:func:`stable`, and the stand-in's ``date`` and ``server`` headers masked."""
    x = stable(x)

    def walk(v: Any, parent: str | None) -> Any:
        if isinstance(v, dict):
            return {k: "<volatile>" if parent == "headers" and k in HEADER_KEYS else walk(e, k) for k, e in v.items()}
        if isinstance(v, list):
            return [walk(e, parent) for e in v]
        return v

    return walk(x, None)


def subset_diff(golden: Any, got: Any, path: str = "$") -> list[str]:
    """Where ``got`` differs from ``golden`` read as a subset: each key of a golden object must be in
    ``got`` with a matching value; lists match element by element (the same length); other values are
    equal. Empty: ``got`` holds the golden."""
    if isinstance(golden, dict):
        if not isinstance(got, dict):
            return [f"{path}: expected an object, got {type(got).__name__}"]
        out: list[str] = []
        for k, v in golden.items():
            if k not in got:
                out.append(f"{path}.{k}: missing (expected {v!r})")
            else:
                out.extend(subset_diff(v, got[k], f"{path}.{k}"))
        return out
    if isinstance(golden, list):
        if not isinstance(got, list) or len(got) != len(golden):
            n = len(got) if isinstance(got, list) else type(got).__name__
            return [f"{path}: expected {len(golden)} items, got {n}"]
        return [d for i, (g, v) in enumerate(zip(golden, got, strict=True)) for d in subset_diff(g, v, f"{path}[{i}]")]
    if golden != got:
        return [f"{path}: expected {golden!r}, got {got!r}"]
    return []
