"""piraeus's flows compiled into mcpipe's one plan and served as tools.

A flow (``FlowDB``: numbered ``steps`` ``{step, type, name, inputs}``) becomes a :class:`~mcpipe.plan.Pipeline`
of one :class:`~mcpipe.plan.Leaf` per step, in the order of their numbers, run by the one scheduler
(``run_compiled``): a failed step stops the flow, as piraeus's flow constructor stops at the first exception.

A step's ``inputs`` are resolved as ``FlowConstructorService._resolve_input`` resolves them: a string that is
exactly ``${step_N_output}`` is step N's output (``step_0_output``: the flow's input), ``${step_N_output.key}``
its ``key`` (one key, dots included; a value that is not an object is answered whole), ``${name}`` the flow
input ``name``; objects and arrays are resolved inside; every other value is itself. Then:

- a ``tool`` step calls the named tool (a piraeus tool, or any tool the server has) through the gateway with
  the inputs as arguments; its output is the tool's structured answer (else its text);
- a ``prompt`` step renders the named prompt with the inputs as its variables and asks the model, as
  piraeus's ``PromptService.prompt_normal`` does (its system prompt, ``Instructions: <the prompt>``); its
  output is the answer's text;
- a ``service`` step runs one of piraeus's services (:mod:`mcpipe.formats.piraeus._services`).

The call's arguments are the flow's inputs (``FlowExecuteRequest.inputs``); the answer is piraeus's
``FlowExecuteResponse``: ``{status, flow_name, steps_executed, outputs, error, execution_log}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from mcpipe._describe import did_you_mean, json_type
from mcpipe._template import Template
from mcpipe.declared import PlanCall, PlanTool, ToolDialect
from mcpipe.errors import ErrorCode, Problem
from mcpipe.formats.piraeus._model import Flow, FlowStep, Ref, as_ref
from mcpipe.formats.piraeus._prompt import PromptSurface, PromptTooLarge, article
from mcpipe.formats.piraeus._read import CODE, coerce
from mcpipe.formats.piraeus._services import NORMAL_SYSTEM, Services, canonical, user_prompt
from mcpipe.formats.piraeus._tool import ApiTool
from mcpipe.kinds.tool import call_tool
from mcpipe.plan import CompiledSpec, Leaf, Limits, Pipeline
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["FLOW_OUTPUT_SCHEMA", "FlowDialect", "compile_flow", "flow_tool"]

FLOW_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"enum": ["success", "error"]},
        "flow_name": {"type": "string"},
        "steps_executed": {"type": "integer"},
        "outputs": {"type": ["object", "null"]},
        "error": {"type": ["string", "null"]},
        "execution_log": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["status", "flow_name", "steps_executed", "outputs", "error", "execution_log"],
}
"""piraeus's ``FlowExecuteResponse``."""


def _walk(value: object, path: str, at_ref: Callable[[str, Ref], object]) -> Any:
    """``value`` with each reference in it (objects and arrays walked) replaced by ``at_ref(where, reference)``."""
    if isinstance(value, str):
        return value if (ref := as_ref(value)) is None else at_ref(path, ref)
    if isinstance(value, dict):
        return {k: _walk(v, f"{path}.{k}", at_ref) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, f"{path}[{i}]", at_ref) for i, v in enumerate(value)]
    return value


def _lookup(ref: Ref, env: Mapping[str, Any]) -> Any:
    n = ref.step
    args = env.get("args") or {}
    if n == 0:
        value: Any = args
    elif n is not None:
        r = env["steps"].get(f"step_{n}")
        value = r.get("output") if isinstance(r, dict) and r.get("ok") else None
    elif ref.head in args:
        value = args[ref.head]
    else:
        return None if ref.key is not None else ref.text  # as piraeus: an unknown name stays as written
    if ref.key is None:
        return value
    return value.get(ref.key) if isinstance(value, dict) else value


@dataclass(frozen=True, slots=True)
class _Built:
    """What one step's leaf runs."""

    step: FlowStep
    target: str  # the tool, the prompt, or the canonical service name
    prompt: PromptSurface | None
    services: Services


async def _run_step(
    step: Leaf[None, _Built], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    await trio.lowlevel.checkpoint_if_cancelled()
    b = step.built
    values = _walk(b.step.inputs, "", lambda _, ref: _lookup(ref, env))
    if b.step.type == "tool":
        return await call_tool(ctx.tools, b.target, values, ctx)
    if b.step.type == "prompt":
        assert b.prompt is not None
        given, problems = b.prompt.values(values, from_text=False)
        if problems:
            raise StepFailure(f"prompt `{b.target}`: " + "; ".join(problems), ErrorCode.INVALID_SPEC)
        try:
            text = b.prompt.render(given)
        except PromptTooLarge as e:
            raise StepFailure(str(e), e.code) from None
        answer = await b.services.ask(NORMAL_SYSTEM, user_prompt(text), ctx, f"piraeus.{step.id}")
        return StepOutput.of(answer.text)
    return StepOutput.of(await b.services.run(b.target, values, ctx, f"piraeus.{step.id}"))


def compile_flow(
    flow: Flow,
    *,
    tools: Mapping[str, ApiTool],
    prompts: Mapping[str, PromptSurface],
    services: Services,
    disabled: frozenset[str] = frozenset(),
) -> tuple[CompiledSpec | None, list[str], list[Problem]]:
    """The plan of ``flow`` and the names of its inputs, or its problems (located in its file).

    Args:
        tools: the piraeus tools (a tool step may name any tool; those are checked here).
        prompts: the piraeus prompts (a prompt step must name one).
        services: what service and prompt steps run on.
        disabled: the piraeus tools loaded with ``enabled: false`` (a step naming one is refused).
    """
    problems: list[Problem] = []
    inputs: list[str] = []
    leaves: list[Leaf[None, _Built]] = []

    def problem(where: str, message: str) -> None:
        problems.append(Problem(f"{flow.at.split(': ', 1)[0]}: {where}", CODE, message))

    refs: list[tuple[str, Ref]] = []
    for st in flow.steps:
        at = st.at  # the step's JSON path in its file
        refs.clear()
        _walk(st.inputs, f"{at}.inputs", lambda where, ref: refs.append((where, ref)))
        for where, ref in refs:
            n = ref.step
            if n is None:
                if ref.head not in inputs:
                    inputs.append(ref.head)
            elif n >= st.step:  # read_flow numbers the steps 1 to N: every n below st.step is one before it
                problem(where, f"`{ref.text}` reads step {n}, which does not run before step {st.step}")
        target = st.name
        prompt = None
        if st.type == "prompt":
            prompt = prompts.get(st.name)
            if prompt is None:
                problem(f"{at}.name", f"no prompt `{st.name}`{did_you_mean(st.name, prompts)}")
            else:
                _check_prompt_inputs(prompt, st.inputs, f"{at}.inputs", problem)
        elif st.type == "service":
            name = canonical(st.name)
            if name is None or name not in services.known():
                known = ", ".join(services.known())
                hint = did_you_mean(st.name, services.known())
                why = ""
                if name == "workflow":
                    why = " (the workflow is not served: [piraeus] workflow = false and no [workflow])"
                problem(f"{at}.name", f"no service `{st.name}`{hint}{why} (known: {known})")
            else:
                target = name
        else:
            if st.name == flow.name:
                problem(f"{at}.name", f"flow `{flow.name}` calls itself")
            elif st.name in disabled:
                problem(f"{at}.name", f"tool `{st.name}` is disabled (`enabled: false`)")
            tool = tools.get(st.name)  # a piraeus tool: every field its input schema requires given
            schema = tool.config.input_schema if tool is not None else {}
            if isinstance(schema.get("properties"), dict):
                for need in schema.get("required") or []:
                    if need not in st.inputs:
                        problem(f"{at}.inputs", f"tool `{st.name}` needs `{need}`")
        built = _Built(st, target, prompt, services)
        calls = st.name if st.type == "tool" else None
        leaves.append(Leaf(f"step_{st.step}", at, f"piraeus.{st.type}", None, built, run=_run_step, tool=calls))
    if problems:
        return None, inputs, problems
    plan = Pipeline(Template({}), tuple(leaves), None, False, None, flow.at)
    return CompiledSpec.of(plan, answer="full"), inputs, []


def _check_prompt_inputs(
    prompt: PromptSurface, inputs: Mapping[str, object], where: str, problem: Callable[[str, str], None]
) -> None:
    """The step's inputs against the prompt's variables: no unknown one, every required one given, every
    value that is not a reference of the variable's type."""
    variables = {v.name: v for v in prompt.prompt.variables}
    for k, v in inputs.items():
        var = variables.get(k)
        if var is None:
            problem(f"{where}.{k}", f"prompt `{prompt.name}` has no variable `{k}`{did_you_mean(k, variables)}")
        elif not (isinstance(v, str) and as_ref(v) is not None):
            _, why = coerce(v, var.type)
            if why is not None:
                problem(f"{where}.{k}", why)
    for name, var in variables.items():
        if var.required and var.default is None and name not in inputs:
            problem(where, f"prompt `{prompt.name}` needs `{name}` ({article(var.type)})")


class FlowDialect(ToolDialect):
    """piraeus's flows as a :class:`~mcpipe.declared.PlanTool` dialect: the arguments are the flow's inputs
    (every ``${name}`` it reads is required), a step naming a tool the gateway does not have is refused before
    anything runs, and the answer is piraeus's ``FlowExecuteResponse`` (``isError`` when its status is
    ``error``).

    Args:
        flow: the flow, as read from its file.
        inputs: the names of its inputs.
    """

    def __init__(self, flow: Flow, inputs: list[str]) -> None:
        self.flow = flow
        self.inputs = inputs

    def _answer(
        self,
        status: str,
        *,
        executed: int = 0,
        outputs: object = None,
        error: str | None = None,
        log: Iterable[object] = (),
    ) -> ToolResult:
        data = {
            "status": status,
            "flow_name": self.flow.name,
            "steps_executed": executed,
            "outputs": outputs,
            "error": error,
            "execution_log": list(log),
        }
        return ToolResult([{"type": "text", "text": orjson.dumps(data).decode()}], data, status == "error")

    def check_args(self, tool: PlanTool, args: object) -> tuple[dict[str, Any], list[str]]:
        if not isinstance(args, dict):
            return {}, [f"inputs: expected an object, got {json_type(args)}"]
        missing = [n for n in self.inputs if n not in args]
        if missing:
            return args, ["inputs: " + "; ".join(f"{n}: is required (read as ${{{n}}})" for n in missing)]
        return args, []

    def invalid(self, tool: PlanTool, errors: list[str], args: object) -> ToolResult:
        return self._answer("error", error="; ".join(errors))

    def unbound(self, tool: PlanTool) -> ToolResult:
        return self._answer("error", error=f"flow `{tool.name}` is not bound to a tool registry")

    def refuse(self, tool: PlanTool, call: PlanCall, registry: Any) -> ToolResult | None:
        unknown = [
            f"step {st.step}: no tool `{st.name}`"
            for st in self.flow.steps
            if st.type == "tool" and st.name not in registry
        ]
        return self._answer("error", error="; ".join(unknown)) if unknown else None

    async def answer(self, tool: PlanTool, call: PlanCall, answer: dict[str, Any]) -> ToolResult:
        if answer.get("problems"):
            return self._answer("error", error="; ".join(p["message"] for p in answer["problems"]))
        results = answer.get("steps") or {}
        log: list[dict[str, Any]] = []
        outputs: dict[str, Any] = {}
        failed: str | None = None
        for st in self.flow.steps:
            r = results.get(f"step_{st.step}")
            if r is None:
                break
            entry: dict[str, Any] = {
                "step": st.step,
                "type": st.type,
                "name": st.name,
                "status": "success" if r["ok"] else "error",
                "duration_ms": r["duration_ms"],
            }
            if r["ok"]:
                outputs[f"step_{st.step}_output"] = r.get("output")
            else:
                entry["error"] = r["error"]
                entry["error_code"] = r["error_code"]
                failed = failed or f"step {st.step} ({st.type} `{st.name}`) failed: {r['error']}"
            log.append(entry)
        executed = len(outputs)
        if answer.get("ok") and failed is None:
            return self._answer("success", executed=executed, outputs=outputs, log=log)
        error = failed or f"{answer.get('error_code')}: {answer.get('error')}"
        return self._answer("error", executed=executed, error=error, log=log)


def flow_tool(flow: Flow, compiled: CompiledSpec, inputs: list[str], limits: Limits) -> PlanTool:
    """One flow (its plan compiled by :func:`compile_flow`, the names of its inputs) served as a tool: a
    :class:`~mcpipe.declared.PlanTool` in the :class:`FlowDialect`, under the server's ``limits``."""
    return PlanTool(
        FlowDialect(flow, inputs),
        name=flow.name,
        description=flow.description or f"piraeus flow `{flow.name}` ({len(flow.steps)} steps)",
        input_schema={
            "type": "object",
            "properties": {n: {"description": f"flow input `{n}` (read as ${{{n}}})"} for n in inputs},
            "required": list(inputs),
        },
        output_schema=FLOW_OUTPUT_SCHEMA,
        compiled=compiled,
        limits=limits,
    )
