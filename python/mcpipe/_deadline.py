"""The expression deadline (``pipe.expression_timeout_ms``): how long one CEL, JSONata or Jinja evaluation,
and a schema pattern matched by the fallback engine, may run.

It lives in the core, below both the plan and :mod:`mcpipe.expr`, so a server sets it without loading the
expression libraries and the expression engines read it without importing the plan.
"""

from __future__ import annotations

from mcpipe._pattern import set_pattern_timeout

__all__ = ["expression_timeout_ms", "set_expression_timeout"]

_expression_timeout_ms = 1000.0


def set_expression_timeout(ms: float) -> None:
    """The deadline of every CEL, JSONata and Jinja evaluation, and of a schema pattern matched by the
    fallback engine (``pipe.expression_timeout_ms``)."""
    global _expression_timeout_ms
    _expression_timeout_ms = float(ms)
    set_pattern_timeout(ms)


def expression_timeout_ms() -> float:
    """The deadline of every CEL, JSONata and Jinja evaluation, in milliseconds."""
    return _expression_timeout_ms
