"""The pipeline spec as msgspec Structs (contract sections 1-2).

These types are the documented shape of what ``mcp_pipe`` accepts; :func:`mcpipe.compile_spec` decodes
each part with them so type errors keep msgspec's located messages, and :func:`spec_schema` turns them
into the JSON Schema that ``mcp_pipe`` advertises. Templates (``args``, ``vars``, ``return``) stay
JSON values here; the compiler turns them into :class:`mcpipe.Template` objects.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from mcpipe._struct import Strict

__all__ = [
    "ForEachStepSpec",
    "ParallelStepSpec",
    "PipeStepSpec",
    "PipelineSpec",
    "RetrySpec",
    "ToolStepSpec",
    "spec_schema",
]

StepId = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$",
        description="Unique within its list; defaults to step<N> (N = 1-based position).",
    ),
]
TimeoutMs = Annotated[float, msgspec.Meta(gt=0, description="Deadline in milliseconds.")]


class SpecBase(Strict):
    """The policy every spec type shares: unknown fields are errors, defaults are omitted."""


class StepSpec(SpecBase, kw_only=True):
    """What every step may carry: its id, deadline, condition and failure policy."""

    id: StepId | None = None
    timeout_ms: TimeoutMs | None = None
    when: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    continue_on_error: bool | None = None


class RetrySpec(SpecBase, kw_only=True):
    """``{"attempts": 3, "backoff_ms": 200}``: make a call that failed with a retryable error again."""

    attempts: Annotated[int, msgspec.Meta(ge=1, le=10)]
    backoff_ms: Annotated[float, msgspec.Meta(ge=0, le=60_000)] = 100


class ToolStepSpec(StepSpec, kw_only=True):
    """One tool call: ``{"id", "tool": "<name>", "args": <template>}``."""

    tool: Annotated[str, msgspec.Meta(min_length=1, description="Name of the tool to call.")]
    args: Any = msgspec.field(default_factory=dict)
    retry: RetrySpec | None = None


class ParallelStepSpec(StepSpec, kw_only=True):
    """Children run concurrently: ``{"id", "parallel": [<step>, ...]}``."""

    parallel: Annotated[list[Any], msgspec.Meta(min_length=1)]


class PipeStepSpec(StepSpec, kw_only=True):
    """A nested pipeline: ``{"id", "pipe": <spec>}``."""

    pipe: dict[str, Any]


class ForEachStepSpec(StepSpec, kw_only=True):
    """Run ``step`` once per element of an array: ``{"id", "for_each": "${...}", "as": "item", "step": {}}``."""

    for_each: Any
    step: dict[str, Any]
    as_: str = msgspec.field(default="item", name="as")


class PipelineSpec(SpecBase):
    """A whole pipeline: vars, steps, the return template and the failure policy."""

    steps: Annotated[list[Any], msgspec.Meta(min_length=1)]
    vars: dict[str, Any] = msgspec.field(default_factory=dict)
    return_: Any = msgspec.field(default=msgspec.UNSET, name="return")
    continue_on_error: bool = False
    timeout_ms: TimeoutMs | None = None
    dry_run: bool = False
    answer: Literal["result", "steps", "full"] | None = None


STEP_KINDS: dict[str, type[SpecBase]] = {
    "tool": ToolStepSpec,
    "parallel": ParallelStepSpec,
    "pipe": PipeStepSpec,
    "for_each": ForEachStepSpec,
}


def field_names(struct: type[msgspec.Struct]) -> frozenset[str]:
    """The names a Struct accepts on the wire (``return``, not ``return_``)."""
    return frozenset(struct.__struct_encode_fields__)


def spec_schema() -> dict[str, Any]:
    """A JSON Schema of the spec, for ``mcp_pipe``'s input schema and for editors."""
    step_ref = {"$ref": "#/$defs/Step"}
    pipeline = {
        "type": "object",
        "description": "A pipeline: steps run in order; later steps reference earlier outputs.",
        "properties": {
            "vars": {"type": "object", "description": "Values the templates read as ${vars.name}."},
            "steps": {"type": "array", "minItems": 1, "items": step_ref},
            "return": {"description": "Template for the result; default: the last step's output."},
            "continue_on_error": {"type": "boolean", "default": False},
            "timeout_ms": {"type": "number", "exclusiveMinimum": 0},
            "dry_run": {"type": "boolean", "default": False, "description": "Answer the plan; run nothing."},
            "answer": {
                "enum": ["result", "steps", "full"],
                "description": "What the answer holds: the result (what ran too, on failure), a summary per "
                "step, or every step's full record (default: the server's, `result`).",
            },
        },
        "required": ["steps"],
        "additionalProperties": False,
    }
    common = {
        "id": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_-]*$"},
        "timeout_ms": {"type": "number", "exclusiveMinimum": 0},
        "when": {"type": "string", "description": "Run only when true: CEL, or one reference (${...})."},
        "continue_on_error": {"type": "boolean", "description": "Whether this step's failure stops the rest."},
    }
    retry = {
        "type": "object",
        "description": "Retry a retryable failure (idempotent tools only).",
        "properties": {
            "attempts": {"type": "integer", "minimum": 1, "maximum": 10},
            "backoff_ms": {"type": "number", "minimum": 0, "maximum": 60000},
        },
        "required": ["attempts"],
        "additionalProperties": False,
    }
    step = {
        "oneOf": [
            {
                "type": "object",
                "description": 'Call a tool. args is a template: ${path}, {{stepN.path}}, {"$ref": path}.',
                "properties": {"tool": {"type": "string"}, "args": {"type": "object"}, "retry": retry, **common},
                "required": ["tool"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "description": "Run the child steps concurrently.",
                "properties": {"parallel": {"type": "array", "minItems": 1, "items": step_ref}, **common},
                "required": ["parallel"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "description": "Run a nested pipeline; its vars are resolved in this pipeline.",
                "properties": {"pipe": {"$ref": "#/$defs/Pipeline"}, **common},
                "required": ["pipe"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "description": "Run `step` once per element of an array; ${item} and ${index} inside it.",
                "properties": {
                    "for_each": {"description": "One reference to an array: ${steps.search.structured.items}."},
                    "as": {"type": "string", "description": "Another name for ${item} (default item)."},
                    "step": step_ref,
                    **common,
                },
                "required": ["for_each", "step"],
                "additionalProperties": False,
            },
        ]
    }
    return {**pipeline, "$defs": {"Pipeline": pipeline, "Step": step}}
