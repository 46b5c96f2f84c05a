"""The executors of a playbook's steps: ``resource``/``action`` (an action: a step kind's executor with its
Jinja fields rendered) and ``model_turn`` (one turn: its message rendered, the model asked, its tool calls
run, serially or a round at once).

They have the declared executor signature ``run(step, inputs, env, ctx) -> StepOutput``; their plan holds
the playbook. Templates see ``input`` (the call's arguments), ``workload`` (the playbook's, overridden by
arguments of the same names), ``secrets`` (``MCPIPE_SECRET_<NAME>`` variables), ``resources`` and ``turns``
(results so far), ``prompts`` (their sources), ``context`` (the request's facts plus ``input``) and ``mcp``
(the playbook's declarations).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

import orjson
import trio

from mcpipe.errors import ExpressionError
from mcpipe.expr._jinja import PromptSource, RenderError, render_async
from mcpipe.formats.noetl._compile import Action, Playbook, Turn
from mcpipe.formats.noetl._scope import Environ
from mcpipe.formats.noetl._sqlbind import binding
from mcpipe.formats.noetl._steps import EVENTS
from mcpipe.models import Message, ModelError, converse, once, schema_errors_async
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["EVENTS", "ActionPlan", "TurnPlan", "run_action", "run_turn"]

MAX_TOOL_RESULT_CHARS = 100_000
"""A tool result longer than this goes back to the model truncated (with a note saying so)."""


@dataclass(frozen=True)
class ActionPlan:
    """What a ``resource``/``action`` step runs: the action, and the resource steps run before it."""

    playbook: Playbook
    action: Action
    resources: dict[str, str]


@dataclass(frozen=True)
class TurnPlan:
    """What a ``model_turn`` step runs: the turn, and the resource steps run before it."""

    playbook: Playbook
    turn: Turn
    resources: dict[str, str]  # resource name -> step id, for those run before this turn


class _Secrets(Environ):
    """``secrets.NAME`` reads ``MCPIPE_SECRET_NAME`` when a template asks for it, and only then (never listed,
    as ``env``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __getitem__(self, name: str) -> str:
        value = os.environ.get(self.prefix + name.upper())
        if value is None:
            raise KeyError(name)
        return value


def roots(pb: Playbook, env: Mapping[str, Any], resources: Mapping[str, str]) -> dict[str, Any]:
    """The names a template sees, from the run's environment."""
    args = env.get("args") or {}
    steps = env.get("steps") or {}
    workload = {**pb.workload, **{k: v for k, v in args.items() if k in pb.workload}}
    facts = {**(env.get("context") or {}), "input": args}
    return {
        "input": args,
        "workload": workload,
        "secrets": _Secrets(pb.secrets_prefix),
        "resources": {n: steps[sid]["output"] for n, sid in resources.items() if sid in steps},
        "turns": {n: steps[sid]["output"] for n, sid in pb.turn_steps.items() if sid in steps and steps[sid]["ok"]},
        "prompts": {n: {"template": PromptSource(src)} for n, (src, _c) in pb.prompts.items()},
        "context": facts,
        "mcp": pb.declared,
    }


async def perform(
    pb: Playbook, action: Action, values: Mapping[str, Any], env: Mapping[str, object], ctx: ToolContext
) -> Any:
    """Run one action through its step kind's executor; answers its output (an ``http`` action: the
    response body). Raises StepFailure."""
    step = action.step
    assert step is not None

    async def work() -> StepOutput:
        # Rendering is part of the step: its timeout_ms interrupts a template that runs long.
        if action.sql is None:
            rendered = await render_async(action.spec, values, f"{action.location}.spec")
        else:
            with binding(action.sql) as params:  # a postgres or duckdb action's values: bound, never SQL
                rendered = await render_async(action.spec, values, f"{action.location}.spec")
            rendered = {**rendered, "params": params}
        inputs = {name: t.resolve({}) for name, t in step.templates if name not in action.given}
        inputs.update(rendered)
        if step.kind == "tool" and "args" not in action.given:
            inputs["args"] = dict(values.get("args") or {})  # the model's arguments, passed through
        assert step.run is not None
        return await step.run(step, inputs, env, step_ctx)

    step_ctx = replace(ctx, tools=pb.registry) if step.kind == "tool" and pb.registry is not None else ctx
    out: StepOutput | None = None
    try:
        with trio.move_on_after(float("inf") if step.timeout_ms is None else step.timeout_ms / 1000):
            out = await work()
    except RenderError as e:  # names the field already
        raise StepFailure(str(e), e.code) from None
    except ExpressionError as e:
        raise StepFailure(f"{action.location}: {e}", e.code) from None
    except StepFailure as e:  # a ForbiddenError too (its code FORBIDDEN, no output)
        raise StepFailure(f"{action.location}: {e}", e.code, e.output) from None
    if out is None:
        raise StepFailure(f"{action.location}: timed out after {step.timeout_ms:g} ms", "TIMEOUT")
    if not out.ok:
        raise StepFailure(out.error, out.error_code or "TOOL_FAILED", out.output)
    if step.kind == "http" and isinstance(out.output, dict) and "body" in out.output:
        return out.output["body"]
    return out.output


async def run_action(
    step: Leaf[None, ActionPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """A resource (a hidden step before its first use) or a workbook action: its output is the action's."""
    plan: ActionPlan = step.built
    return StepOutput.of(await perform(plan.playbook, plan.action, roots(plan.playbook, env, plan.resources), env, ctx))


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


async def user_text(plan: TurnPlan, values: dict[str, Any]) -> str:
    """The turn's user message: its parts rendered, one paragraph each."""
    pb = plan.playbook
    out = []
    for p in plan.turn.parts:
        if p.kind == "text" and p.text is not None:
            out.append(_as_text(await render_async(p.text, values, f"{p.location}.text")))
        elif p.kind == "resource":
            out.append(f"Resource {p.name}:\n{_as_text(values['resources'][p.name])}")
        elif p.kind == "turn":
            t = values["turns"].get(p.name)
            if t is None:
                raise RenderError(f"{p.location}: turn `{p.name}` has no result")
            out.append(_as_text(t["data"] if t.get("data") is not None else t["text"]))
        elif p.kind == "prompt":
            inputs = await render_async(p.inputs, values, f"{p.location}.inputs") if p.inputs is not None else {}
            scoped = {**values, "input": {**values["input"], **inputs}}
            prompt = await render_async(pb.prompts[p.name][1], scoped, f"mcp.prompts.{p.name}.template")
            out.append(_as_text(prompt))
    return "\n\n".join(out)


async def run_turn(step: Any, inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext) -> StepOutput:
    """One turn; its output is ``{text, data, model, tool_calls}`` (``data``: the parsed JSON when the turn
    has an ``output_schema``)."""
    plan: TurnPlan = step.built
    pb, turn = plan.playbook, plan.turn
    values = roots(pb, env, plan.resources)
    try:
        messages = []
        if turn.system is not None:
            system = await render_async(turn.system, values, f"{turn.location}.system")
            messages.append(Message.system(_as_text(system)))
        messages.append(Message.user(await user_text(plan, values)))
    except RenderError as e:
        raise StepFailure(str(e), e.code) from None
    emit = EVENTS.get()

    async def run_tool(call: Any, n: int) -> tuple[str, bool]:
        action = pb.tools[call.name]
        if action.input_schema is not None:
            problems = await schema_errors_async(call.arguments, action.input_schema)
            if problems is not None:  # told to the model, which may call again; nothing runs
                return f"not called: the arguments do not match the tool's input schema ({problems})", True
        tool_values = {**values, "input": {**values["input"], **call.arguments}, "args": call.arguments}

        async def work() -> dict[str, Any]:
            # The events are the call's: a call answered from the record (a resumed turn) did not run again.
            which = {"id": step.id, "tool": call.name, "n": n}
            if emit is not None:
                emit({"type": "tool_call_started", **which, "arguments": call.arguments})
            t0 = perf_counter()
            try:
                out = {"ok": True, "output": await perform(pb, action, tool_values, env, ctx)}
            except StepFailure as e:
                out = {"ok": False, "output": str(e)}
            if emit is not None:
                ms = round((perf_counter() - t0) * 1000, 3)
                emit({"type": "tool_call_finished", **which, "ok": out["ok"], "duration_ms": ms})
            return out

        done = await once(ctx, f"tool{n}", work)
        result = _as_text(done["output"])
        if len(result) > MAX_TOOL_RESULT_CHARS:
            result = result[:MAX_TOOL_RESULT_CHARS] + f" [truncated: {len(result)} characters in all]"
        return result, not done["ok"]

    if turn.model is None:
        raise StepFailure(f"{turn.location}.model: no model", "TOOL_FAILED")
    try:
        out = await converse(
            turn.model,
            messages,
            ctx,
            key=step.id,
            tools=pb.tool_specs(turn.tools),
            run_tool=run_tool,
            json_schema=turn.output_schema,
            json_retries=turn.json_retries,
            max_tool_rounds=turn.max_tool_rounds,
            parallel_tools=turn.parallel_tools,
        )
    except ModelError as e:
        raise StepFailure(f"{turn.location}: {e}", "MODEL_FAILED") from None
    result = {
        "text": out.text,
        "data": out.data,
        "model": out.reply.model,
        "tool_calls": out.tool_calls,
        "usage": out.usage,
    }
    if turn.save is not None and emit is not None:
        emit({"type": "turn_saved", "id": step.id, "turn": turn.name, "storage": turn.save, "result": result})
    return StepOutput.of(result)
