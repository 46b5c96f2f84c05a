"""The plan every front-end compiles to and the scheduler runs, and the one checker they share.

See :mod:`mcpipe.plan._ir` for the nodes and :mod:`mcpipe.plan._check` for the checks.
"""

from typing import TYPE_CHECKING

from mcpipe._lazy import lazy_names
from mcpipe.plan._bounds import check_steps, deepest_location, depth_problem, json_depth, measure_output
from mcpipe.plan._check import (
    STEP_ID,
    WHOLE_REFERENCE,
    Checker,
    Scope,
    assign_step_ids,
    compile_each,
    decode_fields,
    problem_order,
    reference_root,
    referenced_step,
    referenced_var,
    step_reference_problem,
    template_parts,
)
from mcpipe.plan._explain import STATIC_ROOTS, explain
from mcpipe.plan._ir import (
    DEFAULT_LIMITS,
    SKIP,
    Arc,
    CompiledSpec,
    Expression,
    ForEach,
    Graph,
    Leaf,
    Limits,
    Node,
    Parallel,
    Pipe,
    Pipeline,
    Retry,
    RunFn,
    Step,
    evaluate,
    expression_timeout_ms,
    least_calls,
    prelude,
    set_expression_timeout,
    tool_sites,
    walk,
)
from mcpipe.plan._types import ArgumentSite, TypedSite, argument_problems, literal_type, output_path, type_problems

if TYPE_CHECKING:
    from mcpipe.plan._draw import Drawing, drawing

__all__ = [
    "DEFAULT_LIMITS",
    "SKIP",
    "STATIC_ROOTS",
    "STEP_ID",
    "WHOLE_REFERENCE",
    "Arc",
    "ArgumentSite",
    "Checker",
    "CompiledSpec",
    "Drawing",
    "Expression",
    "ForEach",
    "Graph",
    "Leaf",
    "Limits",
    "Node",
    "Parallel",
    "Pipe",
    "Pipeline",
    "Retry",
    "RunFn",
    "Scope",
    "Step",
    "TypedSite",
    "argument_problems",
    "assign_step_ids",
    "check_steps",
    "compile_each",
    "decode_fields",
    "deepest_location",
    "depth_problem",
    "drawing",
    "evaluate",
    "explain",
    "expression_timeout_ms",
    "json_depth",
    "least_calls",
    "literal_type",
    "measure_output",
    "output_path",
    "prelude",
    "problem_order",
    "reference_root",
    "referenced_step",
    "referenced_var",
    "set_expression_timeout",
    "step_reference_problem",
    "template_parts",
    "tool_sites",
    "type_problems",
    "walk",
]


# Drawing a plan (``mcpipe draw``, the console) is loaded on first use: a run never draws.
__getattr__ = lazy_names(__name__, {"Drawing": "mcpipe.plan._draw", "drawing": "mcpipe.plan._draw"})
