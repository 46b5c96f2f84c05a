"""NoETL's workflow engine of April 2023 (``workflow_engine/main.py`` and ``components.py``, commit 7ec55a92),
compiled into the plan.

Its files are ``workflow: {name, variables, jobs: [{name, tasks: [{name, kind, command | method + url,
conditions}]}]}``. What that engine does, and so what this compiles:

- **Jobs in order, each job's tasks in order** (a job's own ``conditions``, ``runtime`` and ``schedule`` are not
  read; nor are a task's ``loop`` and ``timeout``: check warnings).
- **A task's ``conditions``**: each has its ``{{ path }}`` references replaced by the values the engine keeps
  (``WORKFLOW.variables``, ``WORKFLOW.jobs.JOB.status`` (``ready``), ``WORKFLOW.jobs.JOB.tasks.TASK.status`` and
  ``.output``), then evaluated as Python; a false one skips the task. The engine ``eval``s the text; mcpipe
  evaluates only values and comparisons of them (``'success' == 'success'``), and never runs anything else: a
  condition that is not one is an error, as a reference with no value is (the engine's substitution fails there
  and the run stops).
- **``kind: shell``**: ``command`` run by a shell (``sh -c``, the operator's ``outbound.commands.sh``); the
  task's ``output`` is its stdout (stripped), its ``status`` ``success`` when it exits 0, else ``failure``.
- **``kind: rest_api``**: ``method`` to ``url`` (constants: the engine renders neither), under the outbound
  policy; ``output`` the response's text, ``status`` ``success`` for a 200, else ``failure``. A request that
  cannot be made stops the run.
- A task of any other kind does nothing (the engine logs "Unknown kind").
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode, Problem
from mcpipe.kinds import StepPolicy
from mcpipe.plan import Arc, Leaf, Node
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["compile_workflow2023"]

CODE = "INVALID_PLAYBOOK"
FACT = "noetl_2023"
_REF = re.compile(r"{{\s*(.*?)\s*}}")
_TASK_KEYS = ("name", "kind", "command", "method", "url", "conditions")
_IGNORED_TASK = ("loop", "timeout", "variables")
_IGNORED_JOB = ("conditions", "runtime", "schedule")


def _ignored(where: str, what: str) -> str:
    """The warning for a key the engine takes and never reads."""
    return f"{where}: {what} is not read by NoETL's engine of 2023-04: ignored, as it ignores it"


@dataclass
class Task2023:
    job: str
    name: str
    kind: str
    location: str
    conditions: list[str] = field(default_factory=list)
    command: str = ""
    step: Any = None


def compile_workflow2023(
    raw: Mapping[str, Any], *, policy: StepPolicy, tools: Container[str] | None, file: str, **_: object
) -> tuple[Any, list[Problem]]:
    """A workflow of the April 2023 engine compiled into the plan; every problem located."""
    from mcpipe.declared import StepScope, compile_step
    from mcpipe.formats.noetl._workflow import NoetlPlaybook, StepPlan, http_raw, noetl_leaf

    problems: list[Problem] = []
    warnings: list[str] = []
    wf = raw["workflow"]
    name = wf.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem("workflow.name", CODE, "is required: the workflow's name"))
        name = ""
    variables = wf.get("variables") or {}
    if not isinstance(variables, Mapping):
        problems.append(Problem("workflow.variables", CODE, f"must be an object, got {json_type(variables)}"))
        variables = {}
    for k in wf:
        if k not in ("name", "variables", "jobs"):
            warnings.append(_ignored(f"workflow.{k}", f"`{k}`"))
    tasks: list[Task2023] = []
    jobs: list[str] = []
    for i, job in enumerate(wf["jobs"]):
        where = f"workflow.jobs[{i}]"
        if not isinstance(job, Mapping) or not isinstance(job.get("name"), str):
            problems.append(Problem(where, CODE, "a job is `{name, tasks: [...]}`"))
            continue
        jobs.append(job["name"])
        for k in job:
            if k in _IGNORED_JOB:
                warnings.append(_ignored(f"{where}.{k}", f"a job's `{k}`"))
        for j, t in enumerate(job.get("tasks") or []):
            at = f"{where}.tasks[{j}]"
            if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
                problems.append(Problem(at, CODE, "a task is `{name, kind, ...}`"))
                continue
            task = Task2023(job["name"], t["name"], str(t.get("kind", "shell")), at)
            for k in t:
                if k in _IGNORED_TASK or k not in _TASK_KEYS:
                    warnings.append(_ignored(f"{at}.{k}", f"a task's `{k}`" if k in _IGNORED_TASK else f"`{k}`"))
            conds = t.get("conditions") or []
            task.conditions = [str(c) for c in conds] if isinstance(conds, list) else [str(conds)]
            raw_step: dict[str, Any] | None = None
            if task.kind == "shell":
                task.command = str(t.get("command") or "")
                raw_step = {"kind": "shell", "id": "task", "cmds": [task.command]}
            elif task.kind == "rest_api":
                raw_step = http_raw(str(t.get("method") or "GET").upper(), t.get("url"), given=())
            else:
                warnings.append(
                    f'{at}.kind: `{task.kind}`: NoETL\'s engine of 2023-04 runs nothing for it ("Unknown kind"), '
                    "and so does mcpipe"
                )
            if raw_step is not None:
                step, found = compile_step(raw_step, at, StepScope(policy=policy, tools=tools))
                problems += found
                task.step = step
            tasks.append(task)
    ids = [f"{t.job}.{t.name}" for t in tasks]
    if len(set(ids)) != len(ids):
        problems.append(Problem("workflow.jobs", CODE, "two tasks of a job share a name"))
    pb = NoetlPlaybook(name, name, "", "2023", {}, {})
    pb.policy, pb.file = policy, file
    pb.warnings = warnings
    for t, sid in zip(tasks, ids, strict=True):
        pb.steps[sid] = StepPlan(pb, sid, t.location, [], False)
    if not problems and tasks:
        nodes: list[Node] = []
        arcs: list[tuple[Arc, ...]] = []
        for k, (t, sid) in enumerate(zip(tasks, ids, strict=True)):
            built = (str(name), dict(variables), jobs, t)
            nodes.append(noetl_leaf(sid, t.location, built, run_task))
            arcs.append((Arc(k + 1, Went(), t.location),) if k + 1 < len(tasks) else ())
        pb.plan = pb.graph_plan("workflow_", nodes, arcs, 0, unnamed="workflow")
    elif not tasks and not problems:
        problems.append(Problem("workflow.jobs", CODE, "has no task"))
    return pb, problems


@dataclass(frozen=True, slots=True)
class Went:
    """The run goes on to the next task unless this one stopped it (an error the engine raises)."""

    @property
    def source(self) -> str | None:
        return None

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        return bool((env.get("last") or {}).get("ok"))


def automata(name: str, variables: Mapping[str, object], jobs: list[str], env: Mapping[str, Any]) -> dict[str, Any]:
    """What the engine keeps (its ``automata``): the variables, each job's status, each task's status and output."""
    tree: dict[str, Any] = {
        "variables": dict(variables),
        "status": "ready",
        "jobs": {j: {"status": "ready", "tasks": {}} for j in jobs},
    }
    for r in (env.get("steps") or {}).values():
        fact = r.get(FACT) if isinstance(r, Mapping) else None
        if fact:
            job = tree["jobs"].setdefault(fact["job"], {"status": "ready", "tasks": {}})
            job["tasks"][fact["task"]] = {"status": fact["status"], "output": fact["output"]}
    return {name: tree}


def _lookup(tree: Mapping[str, object], path: str) -> Any:
    value: Any = tree
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
        if value is None:
            return None
    return value


def holds(condition: str, tree: Mapping[str, object], location: str) -> bool:
    """A condition, its references replaced, evaluated as values and comparisons (see the module).

    Raises:
        StepFailure: a reference has no value, or the text is not a comparison of values.
    """

    def value(m: re.Match[str]) -> str:
        found = _lookup(tree, m.group(1))
        if found is None:
            raise StepFailure(
                f"{location}: `{{{{ {m.group(1)} }}}}` has no value (the engine's substitution fails: expected str "
                "instance, NoneType found)",
                ErrorCode.TOOL_FAILED,
            )
        return str(found)

    text = _REF.sub(value, condition)
    try:
        return bool(_evaluate(ast.parse(text.strip(), mode="eval").body))
    except (SyntaxError, ValueError) as e:
        raise StepFailure(
            f"{location}: the condition {text!r} is not a comparison of values, which is all mcpipe evaluates ({e})",
            ErrorCode.TOOL_FAILED,
        ) from None


_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_evaluate(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _evaluate(node.operand)
    if isinstance(node, ast.BoolOp):
        values = [_evaluate(v) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(right_node)
            fn = _COMPARE.get(type(op))
            if fn is None:
                raise ValueError(f"the operator {type(op).__name__}")
            try:
                if not fn(left, right):
                    return False
            except TypeError as e:
                raise ValueError(str(e)) from None
            left = right
        return True
    raise ValueError(f"a {type(node).__name__}")


async def run_task(
    step: Leaf[None, tuple[str, dict[str, object], list[str], Task2023]],
    inputs: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> StepOutput:
    """A task: its conditions, then its command or request; its ``{status, output}`` (``skipped`` when a
    condition is false)."""
    from mcpipe.formats.noetl._steps import _call_kind

    name, variables, jobs, task = step.built
    tree = automata(name, variables, jobs, env)
    for cond in task.conditions:
        # Off the event loop: a reference may bring a long output (a command's stdout, a response's text).
        if not await trio.to_thread.run_sync(holds, cond, tree, f"{task.location}.conditions"):
            return StepOutput.of({"status": "skipped"})
    if task.step is None:
        return StepOutput.of({"status": "skipped"})
    given = {n: t.resolve({}) for n, t in task.step.templates}  # its fields are constants: the engine renders none
    if task.kind == "shell":
        try:
            out = await _call_kind(task.step, given, env, ctx, f"{task.location}.command")
        except StepFailure as e:
            if not isinstance(e.output, Mapping) or "returncode" not in e.output:
                raise
            out = e.output
        result = {
            "status": "success" if out.get("returncode") == 0 else "failure",
            "output": str(out.get("stdout") or "").strip(),
        }
    else:
        out = await _call_kind(task.step, given, env, ctx, f"{task.location}.url")
        body = out.get("body")
        text = body if isinstance(body, str) else ("" if body is None else json.dumps(body))
        result = {"status": "success" if out.get("status") == 200 else "failure", "output": text}
    reply = StepOutput.of(result)
    reply.facts = {FACT: {"job": task.job, "task": task.name, **result}}
    return reply
