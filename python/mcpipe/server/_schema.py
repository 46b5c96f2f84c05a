"""The ``mcp_pipe`` tool's description and JSON Schemas: what a client (usually an LLM) reads to write a spec.

The input schema documents the whole spec of ``docs/pipelines.md`` (steps of three kinds, templates,
limits); validation proper is the compiler's, with located errors in the answer, so the schema stays
permissive where a stricter one would only move errors to a less helpful place.
"""

from __future__ import annotations

from typing import Any

from mcpipe._util import PIPE_TOOL

__all__ = ["PIPE_DESCRIPTION", "PIPE_INPUT_SCHEMA", "PIPE_OUTPUT_SCHEMA"]

PIPE_DESCRIPTION = """\
Run a whole pipeline of tool calls in one request: steps run in order, `parallel` groups run \
concurrently, `pipe` steps run nested pipelines, and later steps use earlier outputs through references. \
`for_each` runs one step per element of an array; any step may have `when` (skipped unless true) and \
`continue_on_error`; a tool step may `retry` (idempotent tools only); `"dry_run": true` answers the plan \
without running anything.

References inside any string: `${vars.q}`, `${steps.search.structured.results.0.url}`, `{{step1}}` \
(the output of step 1), `{{fetch.content}}` (output of the step with id `fetch`). A string that is exactly \
one reference keeps the value's type. `{"$ref": "steps.x.output"}` is a typed reference; \
`{"$literal": ...}` passes a value untouched; `${path ?? "default"}` or `{"$ref": path, "default": v}` \
gives a default for a missing or null value. Roots: vars, steps, last, args, context (and item, index \
inside a for_each step). A step result has \
ok, error, error_code, structured, text, content, output (structured if present, else text), duration_ms.

Everything is validated before any step runs (unknown tools, forward references, limits); problems come \
back located, e.g. `steps[2].args.url: reference to unknown step 'fetch'`. The answer is \
{ok, error, error_code, result, steps, summary, duration_ms}; `result` is the `return` template resolved, \
else the output of the last step. By default a successful answer has no `steps`, and a failed one \
summarizes what ran (without outputs; the failed step keeps its own); `"answer": "steps"` always \
summarizes every step, `"answer": "full"` returns every step's full record.

Example: {"vars": {"q": "mcp"}, "steps": [{"id": "s", "tool": "search", "args": {"query": "${vars.q}"}}, \
{"id": "f", "tool": "fetch", "args": {"url": {"$ref": "steps.s.structured.results.0.url"}}}], \
"return": "{{f.content}}"}"""

_ID = {
    "type": "string",
    "pattern": "^[A-Za-z_][A-Za-z0-9_-]*$",
    "description": "Unique within its list; defaults to step<N> (its 1-based position). "
    "step<N> is reserved for position N.",
}
_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "description": "This step's deadline in milliseconds."}
_TEMPLATE = {
    "description": "Any JSON value; strings may hold references (`${path}`, `{{id.path}}`), "
    'objects may be `{"$ref": path}` or `{"$literal": value}`.'
}

_SPEC_PROPS: dict[str, Any] = {
    "vars": {"type": "object", "description": "Named values the steps refer to as `vars.<name>`."},
    "steps": {
        "type": "array",
        "minItems": 1,
        "items": {"$ref": "#/$defs/step"},
        "description": "The steps, run in order; each step starts when the previous one has finished.",
    },
    "return": {
        **_TEMPLATE,
        "description": "What the pipeline answers as `result` (a template); default: the output of the last step.",
    },
    "continue_on_error": {
        "type": "boolean",
        "default": False,
        "description": "Run every step even after a failure (the answer's ok is still false).",
    },
    "timeout_ms": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "Deadline for the whole pipeline (capped by the server).",
    },
    "dry_run": {
        "type": "boolean",
        "default": False,
        "description": "Check everything and answer the plan (`plan`) without running any step (top level only).",
    },
    "answer": {
        "enum": ["result", "steps", "full"],
        "description": "What the answer holds (top level only): `result` (the result, and a summary of what ran "
        "when the run failed: the server's default), `steps` (the result and a summary of every step, without "
        "outputs) or `full` (every step's full record, outputs included).",
    },
}

_DEFS: dict[str, Any] = {
    "spec": {"type": "object", "required": ["steps"], "properties": _SPEC_PROPS, "additionalProperties": False},
    "step": {
        "type": "object",
        "description": "Exactly one of `tool`, `parallel`, `pipe` or `for_each`.",
        "properties": {
            "id": _ID,
            "tool": {
                "type": "string",
                "description": f"A tool step: the tool to call (not {PIPE_TOOL} itself; use `pipe`).",
            },
            "args": {**_TEMPLATE, "type": "object", "description": "A tool step's arguments (a template)."},
            "parallel": {
                "type": "array",
                "minItems": 1,
                "items": {"$ref": "#/$defs/step"},
                "description": "A parallel group: children run concurrently and cannot see each other; "
                "afterwards they are `steps.<group>.children.<child>`.",
            },
            "pipe": {
                "$ref": "#/$defs/spec",
                "description": "A nested pipeline; it sees only its own vars (templates there see the parent) "
                "and its own steps.",
            },
            "for_each": {
                "description": "A for_each step: one reference to an array (`${steps.search.structured.items}`); "
                "`step` runs once per element, concurrently, with `${item}` and `${index}`; its output is "
                "the outputs in order, `children` each element's result.",
            },
            "as": {
                "type": "string",
                "description": "A for_each step's name for the element, beside `item` (e.g. `page`: `${page.url}`).",
            },
            "step": {"$ref": "#/$defs/step", "description": "A for_each step's step, run per element."},
            "when": {
                "type": "string",
                "description": "Run the step only when true: a CEL expression (`steps.check.structured.n > 0`) or "
                "one reference (`${vars.enabled}`); false: the step is skipped (no output; a reference to it "
                "needs a default: `${steps.x.output ?? null}`).",
            },
            "continue_on_error": {
                "type": "boolean",
                "description": "Overrides the pipeline's for this step: whether its failure stops the rest.",
            },
            "retry": {
                "type": "object",
                "properties": {
                    "attempts": {"type": "integer", "minimum": 1, "maximum": 10},
                    "backoff_ms": {"type": "number", "minimum": 0, "maximum": 60000},
                },
                "required": ["attempts"],
                "additionalProperties": False,
                "description": "A tool step's retries after a retryable failure (transport, server down, "
                "timeout); idempotent tools only.",
            },
            "timeout_ms": _TIMEOUT,
        },
        "additionalProperties": False,
    },
}

PIPE_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": 'The pipeline spec, either as these arguments or wrapped as {"spec": <object or JSON text>}.',
    "properties": {
        **_SPEC_PROPS,
        "background": {
            "type": "boolean",
            "default": False,
            "description": "Answer at once with a run id and run on the run queue; watch it with pipe_status, "
            "pipe_events and pipe_result, stop it with pipe_cancel.",
        },
        "spec": {
            "description": "The whole spec as an object or as JSON text (instead of top-level fields).",
            "anyOf": [{"$ref": "#/$defs/spec"}, {"type": "string"}],
        },
    },
    "$defs": _DEFS,
}

_STEP_RESULT = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "kind": {"enum": ["tool", "parallel", "pipe", "for_each"]},
        "ok": {"type": "boolean"},
        "error": {"type": "string"},
        "error_code": {"type": ["string", "null"]},
        "structured": {},
        "text": {"type": "string"},
        "content": {"type": "array"},
        "output": {},
        "children": {"type": ["object", "array"]},
        "skipped": {"type": "boolean"},
        "attempts": {"type": "integer"},
        "result": {},
        "steps": {"type": "object"},
        "duration_ms": {"type": "number"},
        "dry_run": {"type": "boolean"},
        "plan": {"type": "object", "description": "A dry run's plan: the steps in order, as they would run."},
    },
}

PIPE_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["ok", "error", "error_code", "result", "summary", "duration_ms"],
    "properties": {
        "ok": {"type": "boolean"},
        "error": {"type": "string", "description": "The first failure's message; empty on success."},
        "error_code": {
            "type": ["string", "null"],
            "description": "INVALID_SPEC, INTERPOLATION_FAILED, UNKNOWN_TOOL, FORBIDDEN, LIMIT_EXCEEDED, TOOL_ERROR, "
            "TOOL_FAILED, TIMEOUT, CANCELLED or GATE_REJECTED; null on success.",
        },
        "result": {"description": "The resolved `return` template (or the last step's output)."},
        "steps": {
            "type": "object",
            "additionalProperties": _STEP_RESULT,
            "description": "Step id -> step result: a summary without the output (`answer: steps`, and a failed "
            "`answer: result`), or the full record (`answer: full`); absent from a successful `answer: result` "
            "(the default).",
        },
        "summary": {
            "type": "object",
            "properties": {k: {"type": "integer"} for k in ("total", "succeeded", "failed", "skipped", "cancelled")},
        },
        "duration_ms": {"type": "number"},
        "dry_run": {"type": "boolean"},
        "plan": {"type": "object", "description": "A dry run's plan: the steps in order, as they would run."},
    },
}
