"""Declared pipeline steps: the step kinds operators write in the config, compiled once and run per call.

Compile a pipeline's steps (the config loader does this once, at load)::

    steps, problems = compile_steps(raw_steps, "pipelines.charge.steps", StepScope(policy=policy, tools=registry))

Run a leaf step (the scheduler does this per call)::

    out = await step.execute(env, ctx)          # a StepOutput; failures are outputs, not exceptions
    result = out.result(step.id, step.kind, ms)  # the contract's step-result object

``parallel`` and ``pipe`` steps compile to :class:`DeclaredParallel` / :class:`DeclaredPipe`, shaped like
:class:`mcpipe.compile.ParallelStep` / :class:`~mcpipe.compile.PipeStep`; :func:`prelude` applies their
``when`` and ``input_transform``. See ``docs/declared-pipelines.md`` for every kind.
"""

from mcpipe.declared._compile import (
    JSONATA_PLUGIN,
    KINDS,
    CompiledStep,
    Kind,
    StepScope,
    compile_step,
    compile_steps,
    tool_sites,
    walk,
)
from mcpipe.declared._expr import ROOTS, CelExpr, ExpressionError, ExpressionSyntaxError, JsonataExpr
from mcpipe.declared._kinds import has_progress_token
from mcpipe.declared._model import KIND_STRUCTS, LOG_LEVELS, StepFields, step_schema
from mcpipe.declared._pipelines import (
    CONTENT_TYPES,
    DeclaredPipelines,
    DeclaredPipelineTool,
    KnownTools,
    OutboundConfig,
    OutboundHttpConfig,
    PipelineConfig,
    content_blocks,
    load_declared,
    load_outbound,
    load_pipelines,
    load_sql,
    validate_declared,
)
from mcpipe.declared._policy import CommandPolicy, ForbiddenError, HttpPolicy, StepPolicy
from mcpipe.declared._serving import config_limits, config_problems, declared_source, known_tools
from mcpipe.declared._step import (
    SKIP,
    DeclaredParallel,
    DeclaredPipe,
    DeclaredStep,
    RunFn,
    StepFailure,
    StepOutput,
    prelude,
)

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
    "DeclaredParallel",
    "DeclaredPipe",
    "DeclaredPipelineTool",
    "DeclaredPipelines",
    "DeclaredStep",
    "ExpressionError",
    "ExpressionSyntaxError",
    "ForbiddenError",
    "HttpPolicy",
    "JsonataExpr",
    "Kind",
    "KnownTools",
    "OutboundConfig",
    "OutboundHttpConfig",
    "PipelineConfig",
    "RunFn",
    "StepFailure",
    "StepFields",
    "StepOutput",
    "StepPolicy",
    "StepScope",
    "compile_step",
    "compile_steps",
    "config_limits",
    "config_problems",
    "content_blocks",
    "declared_source",
    "has_progress_token",
    "known_tools",
    "load_declared",
    "load_outbound",
    "load_pipelines",
    "load_sql",
    "prelude",
    "step_schema",
    "tool_sites",
    "validate_declared",
    "walk",
]
