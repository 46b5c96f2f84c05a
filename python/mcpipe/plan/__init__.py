"""The plan every front-end compiles to and the scheduler runs, and the one checker they share.

See :mod:`mcpipe.plan._ir` for the nodes and :mod:`mcpipe.plan._check` for the checks.
"""

from mcpipe.plan._check import (
    STEP_ID,
    WHOLE_REFERENCE,
    Checker,
    Scope,
    assign_step_ids,
    decode_fields,
    problem_order,
    reference_root,
    referenced_step,
    referenced_var,
    step_reference_problem,
)
from mcpipe.plan._explain import STATIC_ROOTS, explain
from mcpipe.plan._ir import (
    DEFAULT_LIMITS,
    SKIP,
    CompiledSpec,
    Expression,
    ForEach,
    Leaf,
    Limits,
    Node,
    Parallel,
    Pipe,
    Pipeline,
    Retry,
    RunFn,
    prelude,
    tool_sites,
    walk,
)
from mcpipe.plan._types import TypedSite, output_path, type_problems

__all__ = [
    "DEFAULT_LIMITS",
    "SKIP",
    "STATIC_ROOTS",
    "STEP_ID",
    "WHOLE_REFERENCE",
    "Checker",
    "CompiledSpec",
    "Expression",
    "ForEach",
    "Leaf",
    "Limits",
    "Node",
    "Parallel",
    "Pipe",
    "Pipeline",
    "Retry",
    "RunFn",
    "Scope",
    "TypedSite",
    "assign_step_ids",
    "decode_fields",
    "explain",
    "output_path",
    "prelude",
    "problem_order",
    "reference_root",
    "referenced_step",
    "referenced_var",
    "step_reference_problem",
    "tool_sites",
    "type_problems",
    "walk",
]
