"""Compiled expressions: CEL (``when``, ``input_transform``, ``transform``, ``cel_gate``), JSONata
(``plugin_transform``) and the playbooks' Jinja templates (:mod:`mcpipe.expr._jinja`), compiled once and
evaluated per step run, with the references they make.

Importing this package loads the CEL and JSONata libraries; the plan and the scheduler only need
:class:`mcpipe.errors.ExpressionError` and the :class:`mcpipe.plan.Expression` protocol, so ``mcp_pipe``
alone never loads them.
"""

from mcpipe.errors import ExpressionError
from mcpipe.expr._expr import (
    ROOTS,
    CelExpr,
    ExpressionSyntaxError,
    JsonataExpr,
    compile_cel,
    expression_timeout_ms,
    set_expression_timeout,
    to_json_value,
)
from mcpipe.expr._scan import Mention, scan_cel, scan_jsonata

__all__ = [
    "ROOTS",
    "CelExpr",
    "ExpressionError",
    "ExpressionSyntaxError",
    "JsonataExpr",
    "Mention",
    "compile_cel",
    "expression_timeout_ms",
    "scan_cel",
    "scan_jsonata",
    "set_expression_timeout",
    "to_json_value",
]
