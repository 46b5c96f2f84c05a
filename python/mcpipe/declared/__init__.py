"""Declared pipelines: the config's ``pipelines:`` as tools, and the front-end that compiles their steps.

Compile a pipeline's steps (the config loader does this once, at load)::

    steps, problems = compile_steps(raw_steps, "pipelines.charge.steps", StepScope(policy=policy, tools=registry))

The steps are plan nodes (:mod:`mcpipe.plan`): a leaf of some kind (:mod:`mcpipe.kinds`) is a
:class:`~mcpipe.plan.Leaf`, ``parallel`` and ``pipe`` are :class:`~mcpipe.plan.Parallel` and
:class:`~mcpipe.plan.Pipe` with their ``when`` and ``input_transform``. Run a leaf alone with
``await step.execute(env, ctx)`` (a :class:`~mcpipe.results.StepOutput`; failures are outputs); the
scheduler runs whole plans. See ``docs/declared-pipelines.md`` for every kind.
"""

from typing import TYPE_CHECKING, Any

from mcpipe._lazy import lazy_names
from mcpipe.declared._answers import SurfaceError, register_answer
from mcpipe.declared._compile import (
    CompiledStep,
    StepScope,
    compile_step,
    compile_steps,
    tool_sites,
    walk,
)
from mcpipe.declared._config import OutboundConfig, OutboundHttpConfig, PipelineConfig
from mcpipe.declared._content import CONTENT_TYPES, content_blocks
from mcpipe.declared._model import StepFields, kind_structs, step_schema
from mcpipe.declared._pipelines import (
    DeclaredSections,
    compile_declared,
    load_declared,
    load_outbound,
    load_pipelines,
    load_sql,
    tool_problems,
    validate_declared,
)
from mcpipe.declared._plantool import PlanCall, PlanTool, ToolDialect
from mcpipe.declared._tool import DeclaredDialect, DeclaredPipelines, KnownTools, declared_tool, is_declared
from mcpipe.expr import ROOTS, CelExpr, ExpressionError, ExpressionSyntaxError, JsonataExpr
from mcpipe.kinds import KINDS, CommandPolicy, ForbiddenError, HttpPolicy, Kind, StepPolicy
from mcpipe.plan import SKIP, Leaf, Parallel, Pipe, prelude
from mcpipe.results import StepFailure, StepOutput

if TYPE_CHECKING:
    from mcpipe.kinds.log import LOG_LEVELS
    from mcpipe.kinds.plugin_transform import JSONATA_PLUGIN
    from mcpipe.kinds.progress import has_progress_token

__all__ = [
    "CONTENT_TYPES",
    "JSONATA_PLUGIN",
    "KINDS",
    "KIND_STRUCTS",
    "LOG_LEVELS",
    "ROOTS",
    "SKIP",
    "CelExpr",
    "CommandPolicy",
    "CompiledStep",
    "DeclaredDialect",
    "DeclaredPipelines",
    "DeclaredSections",
    "ExpressionError",
    "ExpressionSyntaxError",
    "ForbiddenError",
    "HttpPolicy",
    "JsonataExpr",
    "Kind",
    "KnownTools",
    "Leaf",
    "OutboundConfig",
    "OutboundHttpConfig",
    "Parallel",
    "Pipe",
    "PipelineConfig",
    "PlanCall",
    "PlanTool",
    "StepFailure",
    "StepFields",
    "StepOutput",
    "StepPolicy",
    "StepScope",
    "SurfaceError",
    "ToolDialect",
    "compile_declared",
    "compile_step",
    "compile_steps",
    "content_blocks",
    "declared_tool",
    "has_progress_token",
    "is_declared",
    "load_declared",
    "load_outbound",
    "load_pipelines",
    "load_sql",
    "prelude",
    "register_answer",
    "step_schema",
    "tool_problems",
    "tool_sites",
    "validate_declared",
    "walk",
]


# Names of kind modules, loaded on first use: importing the front-end imports no kind (mcpipe.kinds.KINDS).
_kind_names = lazy_names(
    __name__,
    {
        "LOG_LEVELS": "mcpipe.kinds.log",
        "JSONATA_PLUGIN": "mcpipe.kinds.plugin_transform",
        "has_progress_token": "mcpipe.kinds.progress",
    },
)


def __getattr__(name: str) -> Any:
    # Read from the registry when asked, so a kind registered later is there too.
    if name == "KIND_STRUCTS":
        return kind_structs()
    return _kind_names(name)
