"""``mcp_pipeline`` served as a tool, over every tool the server has or over one fronted discord-mcp server's."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import trio

from mcpipe._core import json_measure
from mcpipe._util import PIPE_TOOL, RunLimiter
from mcpipe.declared import PlanCall, PlanTool, ToolDialect
from mcpipe.errors import ErrorCode
from mcpipe.formats.discord._answer import (
    RECURSION,
    RECURSION_MESSAGE,
    discord_answer,
    rejected_answer,
    validation_answer,
)
from mcpipe.formats.discord._steps import MAX_STEPS, PIPELINE_TOOL, Rejection, parse_steps, translate
from mcpipe.plan import DEFAULT_LIMITS, Limits
from mcpipe.tools import ToolResult

__all__ = ["DESCRIPTION", "INPUT_SCHEMA", "OUTPUT_SCHEMA", "DiscordDialect", "pipeline_tool"]

TRANSLATE_IN_THREAD_BYTES = 256 * 1024
"""A call whose arguments are larger (as JSON) is checked and translated in a thread."""

_threads = RunLimiter("mcpipe_discord_threads", 2)
"""At most 2 large calls translate at once (CPU work: more would only share the same cores)."""


DESCRIPTION = """\
**Purpose**: Execute a sequence of MCP tool calls in one request. Variables from earlier steps interpolate \
into later steps via `{{step_id.path}}`.

**When to use**: when a workflow needs >=2 sequential calls (e.g., list channels -> find by name -> send \
message). Reduces N round-trips to 1.

**Step shape**: `{id?, tool, args, save_as?, if?, continue_on_error?}`. `args` may contain \
`{{step_id.path}}` placeholders (dotted paths, `[0]` indexes; a string that is exactly one placeholder keeps \
the value's type); `{{stepN.path}}` reads the N-th step (1-based) when no step or `save_as` has that name. \
Unnamed steps are `step_0`, `step_1`, ... `save_as` also saves a result under another name. `if` is a path \
check; the step skips when the path resolves to falsy. A reference that cannot resolve fails its step with \
INTERPOLATION_FAILED (before anything runs when it names no earlier step).

**Example**:
```
{steps:[
  {id:"channels", tool:"channels_list", args:{guild_id:"123456789012345678"}},
  {id:"send",     tool:"messages_send", args:{channel_id:"{{channels.channels[0].id}}", content:"hi"}}
]}
```

**Returns**: `{steps:[{id, tool, status, result?, error?, duration_ms}], variables, total_duration_ms, \
aborted}`. Each step status is `success | error | skipped`; a step that fails stops the pipeline \
(`aborted: true`) unless it has `continue_on_error: true`.

**Limits**: max 20 steps per pipeline. Nested `mcp_pipeline` rejected (no recursion)."""

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_STEPS,
            "description": "Ordered steps. Max 20 per pipeline.",
            "items": {
                "type": "object",
                "properties": {
                    "id": {
                        "type": "string",
                        "pattern": "^[a-zA-Z][a-zA-Z0-9_]{0,63}$",
                        "description": "Reference name for interpolation. Defaults to step_<index>.",
                    },
                    "tool": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Tool name to call. Must exist; not mcp_pipeline (no recursion).",
                    },
                    "args": {
                        "type": "object",
                        "additionalProperties": {},
                        "description": "Tool arguments. String fields support {{step_id.path}} interpolation.",
                    },
                    "save_as": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Save result under this variable name in addition to step ID.",
                    },
                    "if": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Path to truthy check. Step skipped if path resolves falsy. "
                        'Example: "{{step1.count}}".',
                    },
                    "continue_on_error": {
                        "type": "boolean",
                        "default": False,
                        "description": "If true, pipeline continues after this step fails. Default aborts.",
                    },
                },
                "required": ["tool", "args"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["steps"],
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "tool": {"type": "string"},
                    "status": {"enum": ["success", "error", "skipped"]},
                    "result": {},
                    "error": {
                        "type": "object",
                        "properties": {
                            "code": {"type": "string"},
                            "message": {"type": "string"},
                            "retriable": {"type": "boolean"},
                        },
                        "required": ["code", "message", "retriable"],
                    },
                    "duration_ms": {"type": "number"},
                },
                "required": ["id", "tool", "status", "duration_ms"],
            },
        },
        "variables": {"type": "object", "additionalProperties": {}},
        "total_duration_ms": {"type": "number"},
        "aborted": {"type": "boolean"},
    },
    "required": ["steps", "variables", "total_duration_ms", "aborted"],
}

_STEP_INDEX = re.compile(r"steps\[(\d+)\]")


def _index(location: str) -> int:
    """The step a problem of the plan is located at (``steps[2].tool``)."""
    m = _STEP_INDEX.match(location)
    return int(m.group(1)) if m else 0


# discord-mcp's own annotations of the tool.
ANNOTATIONS = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": True}


class DiscordDialect(ToolDialect):
    """discord-mcp's ``mcp_pipeline`` as a :class:`~mcpipe.declared.PlanTool` dialect: a call's steps are its
    plan, checked and translated from its arguments (:mod:`mcpipe.formats.discord._steps`), run by the
    scheduler through the registry the call came in by (the gateway: each step authorized, audited and costed
    like a direct call), and answered in discord's shape (:mod:`mcpipe.formats.discord._answer`).

    Args:
        prefix: the fronted server's prefix: a step's ``tool`` names one of that server's tools
            (``messages_send`` is ``<prefix>.messages_send``); ``""`` for bare names.
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def target(self, tool: str) -> str:
        """The registry's name of the tool a step names."""
        return tool if not self.prefix or tool.startswith(self.prefix + ".") else f"{self.prefix}.{tool}"

    async def check(self, tool: PlanTool, args: object) -> PlanCall | ToolResult:
        """The steps checked (discord's validation answer when they break its schema) and translated into the
        call's plan; what the translation refused is answered after the unknown tools (:meth:`refuse`)."""
        limits = tool.limits
        steps, issues = parse_steps(args, max_steps=min(MAX_STEPS, limits.max_steps))
        if issues:
            return validation_answer(issues)
        targets = [self.target(st.tool) for st in steps]
        work = partial(translate, steps, targets, max_text_bytes=limits.max_output_bytes)
        if json_measure(args, max_bytes=TRANSLATE_IN_THREAD_BYTES)[0] > TRANSLATE_IN_THREAD_BYTES:
            # Linear, but a few MB of text to scan: off the event loop (as mcp_pipe compiles a large spec).
            translated = await trio.to_thread.run_sync(work, limiter=_threads())
        else:
            translated = work()
        plan = None if isinstance(translated, list) else translated.compiled
        return PlanCall({}, plan, (steps, targets, translated))

    def refuse(self, tool: PlanTool, call: PlanCall, registry: Any) -> ToolResult | None:
        """A nested pipeline, then the unknown tools and what the translation refused, in step order."""
        steps, targets, translated = call.state
        recursion = [
            Rejection(i, RECURSION, RECURSION_MESSAGE) for i, t in enumerate(targets) if _is_pipeline(t, registry)
        ]
        if recursion:
            return rejected_answer(steps, recursion)
        unknown = [
            Rejection(i, ErrorCode.UNKNOWN_TOOL, f"Tool '{st.tool}' not found.")
            for i, (st, t) in enumerate(zip(steps, targets, strict=True))
            if t not in registry
        ]
        refused = unknown + (translated if isinstance(translated, list) else [])
        return rejected_answer(steps, sorted(refused, key=lambda r: r.index)) if refused else None

    async def answer(self, tool: PlanTool, call: PlanCall, answer: dict[str, Any]) -> ToolResult:
        steps, _, translated = call.state
        problems = answer.get("problems")
        if problems:  # refused for this caller (FORBIDDEN): the per-call checks found it, nothing ran
            refused = [Rejection(_index(p["location"]), p["code"], p["message"]) for p in problems]
            return rejected_answer(steps, refused)
        return discord_answer(answer, steps, translated.ids)


def pipeline_tool(name: str = PIPELINE_TOOL, *, prefix: str = "", limits: Limits | None = None) -> PlanTool:
    """discord-mcp's ``mcp_pipeline``, run by mcpipe: a :class:`~mcpipe.declared.PlanTool` in the
    :class:`DiscordDialect` (whose plan is each call's steps).

    Args:
        name: the tool's name (``mcp_pipeline``, or ``<prefix>.mcp_pipeline`` for a fronted server).
        prefix: the fronted server's prefix (``""`` for bare names).
        limits: the server's limits (``pipe``): the run's deadline, output sizes; the step cap is the smaller of
            discord's 20 and ``max_steps``.
    """
    return PlanTool(
        DiscordDialect(prefix),
        name=name,
        title="Run a pipeline of tool calls (discord-mcp)",
        description=DESCRIPTION,
        input_schema=INPUT_SCHEMA,
        output_schema=OUTPUT_SCHEMA,
        annotations=ANNOTATIONS,
        compiled=None,
        limits=limits or DEFAULT_LIMITS,
    )


def _is_pipeline(name: str, registry: object) -> bool:
    """Whether calling ``name`` would nest a pipeline: ``mcp_pipe``, or an ``mcp_pipeline`` mcpipe serves."""
    if name in (PIPE_TOOL, PIPELINE_TOOL) or name.endswith("." + PIPELINE_TOOL):
        return True
    get = getattr(registry, "get", None)
    found = get(name) if get is not None else None
    return isinstance(found, PlanTool) and isinstance(found.dialect, DiscordDialect)
