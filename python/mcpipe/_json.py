"""JSON text of any JSON value: orjson, and Python's ``json`` for what orjson refuses (integers past 64 bits).

Both HTTP paths must answer integers of 2^64 and more as the SDK does (exactly), so every place that
writes a client's values back uses this, never ``orjson.dumps`` alone.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps"]


def dumps(value: Any) -> bytes:
    """Compact JSON text of ``value`` (UTF-8)."""
    try:
        return orjson.dumps(value)
    except TypeError as e:
        if "64-bit" not in str(e):
            raise
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
