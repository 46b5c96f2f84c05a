"""NoETL's playbook runtime of May 2025 (``noetl/runtime/playbook.py``, ``PlaybookExecutor``, 2025-05-27 to
2025-06-13), compiled into the plan.

Its playbooks (``noetl.io/v1``) have a top-level ``context`` (the run's variables), a ``workbook`` of tasks by
``task`` name, and steps that ``run:`` tasks by name (a task may also be written in the step's ``run`` list).
What that runtime does, and so what this compiles:

- **One step at a time**, from ``start`` until ``end``; a step reached a second time stops the run ("Circular
  dependency detected"). After a step's tasks, its ``next`` entries in order: a ``{when, then}`` entry whose
  ``when`` holds goes to its first ``then`` step; an ``{else: [...]}`` entry goes to its first step; an entry
  with neither is passed over; none left: ``end``. A step with no ``next`` ends the run.
- **Errors go to ``error_handler``**: a task that raises (not found, an unknown type, an HTTP response that is
  not JSON), a condition that cannot render, or a step that is not there sets ``context.state`` to ``error`` and
  ``context.error`` to the message, and the run goes on at the ``error_handler`` step (if that fails too, or
  there is none, the run ends).
- **Templates** see ``context``, ``results`` (each task's result by its name) and ``now``; Jinja with undefined
  names an error; a rendering that starts with ``{`` or ``[`` is read as JSON. A condition is Python: the engine
  ``eval``s its rendering; mcpipe reads it as a Python literal and never runs it (``True``, ``False``, numbers,
  quoted strings, lists...); a rendering that is not a literal (a bare name) is the error the engine's ``eval``
  raises.
- **Tasks**: ``http`` (``method``, ``endpoint``, ``params``, ``payload`` as the JSON body; ``{status: success |
  error, status_code, data}``), ``python`` (its code with every ``return`` replaced by ``result =``, as the
  engine rewrites it, run with ``context``, ``results`` and ``result`` as variables; the ``result`` it leaves,
  its ``status`` set to ``success`` when it is an object, else ``{status: success, data}``; an exception is
  ``{status: error, error}``). A ``runner`` task is refused.
- **The call's arguments** are laid over ``context`` (the runtime read none: it had no payload).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jinja2
import trio

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode, Problem
from mcpipe.expr._jinja import Compiled, RenderError, environment, render_async
from mcpipe.formats.noetl._literal import py_literal
from mcpipe.formats.noetl._tmpl import CODE, MAX_LITERAL, fill, leaves, now, walk
from mcpipe.kinds import StepPolicy
from mcpipe.plan import Arc, CompiledSpec, Leaf, Node
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcpipe.formats.noetl._workflow import NoetlPlaybook

__all__ = ["compile_runtime"]

FACT = "noetl_runtime"
"""The field of a step's result holding what it changed: ``context`` keys, ``results`` by task, its ``route``."""

TOP_KEYS = ("apiVersion", "kind", "name", "path", "description", "version", "context", "workbook", "workflow")
STEP_KEYS = ("step", "desc", "description", "run", "next")


# --- templates ---


@dataclass(frozen=True, slots=True)
class Tmpl:
    """A value whose strings are the runtime's templates (a string holding ``{{`` and ``}}``), compiled once."""

    shape: Any
    location: str

    async def render(self, roots: Mapping[str, object]) -> Any:
        """Rendered (see the module) off the event loop, within the templates' budgets.

        Raises:
            StepFailure: a template failed, as the runtime's ``render_template`` raises.
        """
        sources = tuple(text for text, _ in leaves(self.shape, tuple))
        if not sources:
            return self.shape
        compiled = Compiled(lambda r: _render(self.shape, r), sources)
        try:
            return await render_async(compiled, roots, self.location)
        except RenderError as e:
            raise StepFailure(str(e), e.code) from None


def _tmpl(value: object, location: str, problems: list[Problem]) -> Tmpl:
    """``value`` with its templates compiled (a syntax error is a problem at its place)."""

    def leaf(text: str, where: str) -> Any:
        if "{{" not in text or "}}" not in text:
            return text
        try:
            return (text, environment().from_string(text))
        except jinja2.TemplateSyntaxError as e:
            problems.append(Problem(where, CODE, f"template syntax error: {e.message} (line {e.lineno})"))
            return text

    return Tmpl(walk(value, location, leaf), location)


def _render(shape: object, roots: Mapping[str, object]) -> Any:
    def leaf(pair: tuple[str, jinja2.Template]) -> Any:
        rendered = pair[1].render(roots)  # an undefined name raises, as the runtime's StrictUndefined does
        if rendered.strip().startswith(("{", "[")):
            try:
                return json.loads(rendered)
            except ValueError:
                pass
        return rendered

    return fill(shape, tuple, leaf)


def condition(text: object) -> bool:
    """The runtime's ``eval(str(condition))``, read as a Python literal (never run).

    Raises:
        ValueError: the text is not a literal (``eval`` would raise for it: a bare name, an expression).
    """
    stripped = str(text).strip()
    try:
        if len(stripped) > MAX_LITERAL:
            raise ValueError("too long")
        return bool(py_literal(stripped))  # bounded, interruptible: never ast.literal_eval (see _literal)
    except (ValueError, TypeError, ArithmeticError, MemoryError):
        raise ValueError(f"name '{str(text).strip()}' is not defined") from None


# --- the model ---


@dataclass
class Task:
    """A task (by its ``task`` name): its type and what runs it."""

    name: str
    type: str
    location: str
    fields: dict[str, Tmpl] = field(default_factory=dict)
    step: Any = None
    method: str = "GET"
    fails: str | None = None
    """The runtime's exception text when it cannot run the task (an unknown type, code that does not compile)."""


@dataclass
class Entry:
    """An entry of ``next``: ``then`` (its first step, when ``when`` holds) or ``else`` (its first step)."""

    target: str
    location: str
    when: Tmpl | None = None


@dataclass
class RStep:
    name: str
    location: str
    run: list[Tmpl] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    ends: bool = False
    """No ``next``: the run ends after it."""


@dataclass
class Runtime:
    context: dict[str, Any]
    steps: dict[str, RStep]
    tasks: dict[str, Task]


def _ignored(where: str, key: object) -> str:
    """The warning for a key the runtime takes and never reads."""
    return f"{where}: `{key}` is not read by NoETL's runtime of 2025-05: ignored, as it ignores it"


def _read(raw: Mapping[str, Any], problems: list[Problem], warnings: list[str]) -> Runtime:
    for k in raw:
        if k not in TOP_KEYS:
            warnings.append(_ignored(str(k), k))
    context = dict(raw.get("context") or {})
    tasks: dict[str, Task] = {}

    def task_of(t: object, where: str) -> None:
        if not isinstance(t, Mapping) or not isinstance(t.get("task"), str):
            return
        if t["task"] in tasks or not any(k in t for k in ("type", "code", "endpoint", "run")):
            return  # a reference to a task (`run: [{task: NAME}]`), or one found earlier (`find_task`'s first)
        tasks[t["task"]] = _task(t, where, problems, warnings)

    for i, t in enumerate(raw.get("workbook") or []):
        task_of(t, f"workbook[{i}]")
        for j, nested in enumerate((t.get("run") or []) if isinstance(t, Mapping) else []):
            task_of(nested, f"workbook[{i}].run[{j}]")
    steps: dict[str, RStep] = {}
    for i, s in enumerate(raw.get("workflow") or []):
        where = f"workflow[{i}]"
        if not isinstance(s, Mapping) or not isinstance(s.get("step"), str):
            problems.append(Problem(where, CODE, "a step is `{step: NAME, ...}`"))
            continue
        for k in s:
            if k not in STEP_KEYS:
                warnings.append(_ignored(f"{where}.{k}", k))
        st = RStep(s["step"], where)
        for j, t in enumerate(s.get("run") or []):
            if not isinstance(t, Mapping) or "task" not in t:
                problems.append(Problem(f"{where}.run[{j}]", CODE, "a task of `run` is `{task: NAME, ...}`"))
                continue
            st.run.append(_tmpl(t["task"], f"{where}.run[{j}].task", problems))
            task_of(t, f"{where}.run[{j}]")
        nxt = s.get("next")
        st.ends = not nxt
        for j, e in enumerate(nxt if isinstance(nxt, list) else []):
            at = f"{where}.next[{j}]"
            if not isinstance(e, Mapping):
                continue  # the runtime asks each entry for `when`/`else`: a name is passed over
            key = "then" if e.get("when") else "else" if e.get("else") else None
            branch = (e.get(key) or ["end"]) if key is not None else None
            first = branch[0] if isinstance(branch, list) else branch
            if isinstance(first, str):
                when = _tmpl(e["when"], f"{at}.when", problems) if key == "then" else None
                st.entries.append(Entry(first, f"{at}.{key}", when))
        if s["step"] not in steps:
            steps[s["step"]] = st
    if "start" not in steps:
        problems.append(Problem("workflow", CODE, "has no `start` step: NoETL's runtime of 2025-05 runs from `start`"))
    return Runtime(context, steps, tasks)


def _task(t: Mapping[str, object], where: str, problems: list[Problem], warnings: list[str]) -> Task:
    kind = str(t.get("type", "unknown"))
    task = Task(str(t["task"]), kind, where)
    if kind == "python":
        code = t.get("code", "")
        if not isinstance(code, str):
            problems.append(Problem(f"{where}.code", CODE, f"must be text, got {json_type(code)}"))
            return task
        # The runtime's rewrite: every `return` becomes `result =` (its code then runs at the top level).
        lines = [
            line.replace("return", "result =") if "return" in line else line
            for line in textwrap.dedent(code).split("\n")
        ]
        rewritten = "\n".join(lines)
        try:
            compile(rewritten, "<string>", "exec", dont_inherit=True)
        except SyntaxError as e:
            task.fails = f"{e.msg} (<string>, line {e.lineno})"
            warnings.append(
                f"{where}.code: does not compile once its `return`s are rewritten ({task.fails}): the runtime's task "
                "answers an error, and so does mcpipe's"
            )
            return task
        task.fields["code"] = Tmpl(rewritten, f"{where}.code")
    elif kind == "http":
        task.method = str(t.get("method", "GET")).upper()
        for k in ("endpoint", "params", "payload"):
            task.fields[k] = _tmpl(t.get(k), f"{where}.{k}", problems)
    elif kind == "runner":
        problems.append(
            Problem(f"{where}.type", CODE, "a `runner` task of NoETL's runtime of 2025-05 is not supported")
        )
    elif kind == "unknown":
        task.fails = f"Task type is unknown for task: {task.name}"
    else:
        task.fails = f"Unsupported task type: {kind}"
    for k in t:
        if k not in ("task", "type", "desc", "description", "code", "method", "endpoint", "params", "payload"):
            warnings.append(_ignored(f"{where}.{k}", k))
    return task


# --- compiling ---


def compile_runtime(
    raw: Mapping[str, object], *, policy: StepPolicy, tools: Container[str] | None, file: str, **_: object
) -> tuple[Any, list[Problem]]:
    """A playbook of the May 2025 runtime compiled into the plan; every problem located."""
    from mcpipe.declared import StepScope, compile_step
    from mcpipe.formats.noetl._workflow import NoetlPlaybook, StepPlan, http_raw

    problems: list[Problem] = []
    warnings: list[str] = []
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem("name", CODE, "is required (a playbook's `name`)"))
        name = ""
    rt = _read(raw, problems, warnings)
    for t in rt.tasks.values():
        if t.fails is not None or t.type not in ("http", "python"):
            continue
        if t.type == "python":
            step_raw: dict[str, Any] = {
                "kind": "python",
                "id": "task",
                "code": "result = None\n" + t.fields["code"].shape,
                "input": "${args}",
                "context": "${args}",
            }
        else:
            method = t.method if t.method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD") else "GET"
            step_raw = http_raw(method, given=("query", "body"), timeout_ms=10_000)
        step, found = compile_step(step_raw, t.location, StepScope(policy=policy, tools=tools))
        problems += found
        t.step = step
    pb = NoetlPlaybook(
        name, str(raw.get("path") or name), str(raw.get("description") or ""), "runtime", dict(rt.context), {}
    )
    pb.policy, pb.file = policy, file
    for st in rt.steps.values():
        pb.steps[st.name] = StepPlan(pb, st.name, st.location, [], False)
    if not problems:
        pb.plan = _plan(pb, rt)
    pb.inputs = sorted(rt.context)
    pb.warnings = warnings
    return pb, problems


def _routes(rt: Runtime, st: RStep) -> list[str]:
    """Where the run may go after ``st``: its entries' steps, then ``error_handler`` (when there is one)."""
    out = [e.target for e in st.entries if e.target != "end"]
    if "error_handler" in rt.steps:
        out.append("error_handler")
    return list(dict.fromkeys(t for t in out if t in rt.steps))


def _plan(pb: NoetlPlaybook, rt: Runtime) -> CompiledSpec:
    from mcpipe.formats.noetl._workflow import depth_first, noetl_leaf

    reached, _ = depth_first("start", lambda n: [t if t != "end" else None for t in _routes(rt, rt.steps[n])])
    order = [n for n in rt.steps if n in reached]
    index = {n: i for i, n in enumerate(order)}
    # A step reached a second time stops the run: an arc back to a step on the way from `start` is dropped.
    ahead: dict[str, set[str]] = {}

    def below(n: str, seen: frozenset[str]) -> None:
        ahead.setdefault(n, set()).update(seen)
        for t in _routes(rt, rt.steps[n]):
            if t not in seen and t != n:
                below(t, seen | {n})

    below("start", frozenset())
    nodes: list[Node] = []
    arcs: list[tuple[Arc, ...]] = []
    for n in order:
        st = rt.steps[n]
        nodes.append(noetl_leaf(n, st.location, (rt, st), run_step))
        out = []
        for t in _routes(rt, st):
            if t == n or t in ahead.get(n, set()):
                continue
            out.append(Arc(index[t], RouteIs(t), f"{st.location}.next"))
        arcs.append(tuple(out))
    return pb.graph_plan("workflow", nodes, arcs, index.get("start", 0))


@dataclass(frozen=True, slots=True)
class RouteIs:
    """Whether the step just done chose ``target`` (its route, decided as it ran)."""

    target: str

    @property
    def source(self) -> str | None:
        return f"route == {self.target}"

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        last = env.get("last") or {}
        return bool((last.get(FACT) or {}).get("route") == self.target)


# --- running ---


def _state(rt: Runtime, env: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(context, results)`` of the run so far: the playbook's ``context`` (the call's arguments over it), then
    what each step changed, in the order they finished."""
    from mcpipe.formats.noetl._steps import EXECUTION_ID

    context = dict(rt.context)
    for k, v in (env.get("args") or {}).items():
        if k != EXECUTION_ID:
            context[k] = v
    if "{{ job.uuid }}" in str(rt.context):
        from mcpipe.formats.noetl._steps import execution_id

        context["job"] = {"uuid": execution_id(env)}
    results: dict[str, Any] = {}
    for r in (env.get("steps") or {}).values():
        fact = r.get(FACT) if isinstance(r, Mapping) else None
        if fact:
            context.update(fact.get("context") or {})
            results.update(fact.get("results") or {})
    return context, results


async def run_step(
    step: Leaf[None, tuple[Runtime, RStep]], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """A step: its tasks, then its route (see the module). The run goes on whatever a task answered; an error
    the runtime would raise sends it to ``error_handler``."""
    rt, st = step.built
    context, results = _state(rt, env)
    changed: dict[str, Any] = {}
    done: dict[str, Any] = {}
    route = "end"
    try:
        for t in st.run:
            name = await t.render({"context": context, "results": results, "now": now})
            task = rt.tasks.get(str(name))
            if task is None:
                raise _Raised(f"Task not found: {name}")
            result = await _task_run(task, context, results, env, ctx)
            results[task.name] = done[task.name] = result
        if not st.ends:
            route = "end"
            for e in st.entries:
                if e.when is None:
                    route = e.target
                    break
                try:
                    rendered = await e.when.render({"context": context, "results": results, "now": now})
                    holds = await trio.to_thread.run_sync(condition, rendered)
                except (StepFailure, ValueError) as err:
                    raise _Raised(str(err)) from None
                if holds:
                    route = e.target
                    break
        if route != "end" and route not in rt.steps:
            raise _Raised(f"Step not found: {route}")
    except _Raised as e:
        changed = {"state": "error", "error": str(e)}
        route = "error_handler" if st.name != "error_handler" and "error_handler" in rt.steps else "end"
    out = StepOutput.of(done)
    out.facts = {FACT: {"context": changed, "results": done, "route": route}}
    return out


class _Raised(Exception):
    """What the runtime raises out of a step (its ``execute`` then goes to ``error_handler``)."""


async def _task_run(
    task: Task,
    context: Mapping[str, object],
    results: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> Any:
    from mcpipe.formats.noetl._steps import _call_kind, _query

    if task.fails is not None and task.type != "python":
        raise _Raised(task.fails)
    if task.type == "python":
        if task.fails is not None:
            return {"status": "error", "error": task.fails}
        given = {"input": {"results": results}, "context": context}
        try:
            value = await _call_kind(task.step, given, env, ctx, f"{task.location}.code")
        except StepFailure as e:
            out = e.output
            text = out["error_text"] if isinstance(out, Mapping) and isinstance(out.get("error_text"), str) else str(e)
            return {"status": "error", "error": text}
        if value is None:
            return {"status": "success", "data": None}
        if isinstance(value, dict):
            return {**value, "status": "success"}
        return {"status": "success", "data": value}
    roots = {"context": context, "results": results, "now": now}
    endpoint = await task.fields["endpoint"].render(roots)
    params = await task.fields["params"].render(roots) or {}
    payload = await task.fields["payload"].render(roots) or None
    if not isinstance(endpoint, str) or not endpoint:
        return {"status": "error", "error": f"Invalid URL {endpoint!r}: No scheme supplied."}
    inputs: dict[str, Any] = {
        "url": endpoint,
        "query": _query(params if isinstance(params, Mapping) and params else None),
        "body": payload,
    }
    try:
        out = await _call_kind(task.step, inputs, env, ctx, f"{task.location}.endpoint")
    except StepFailure as e:
        if e.code == ErrorCode.FORBIDDEN:
            raise
        return {"status": "error", "error": str(e)}
    status = out.get("status")
    ok = isinstance(status, int) and status < 400
    body = out.get("body")
    if ok and isinstance(body, str):
        raise _Raised("Expecting value: line 1 column 1 (char 0)")  # `response.json()` of a body that is not JSON
    return {"status": "success" if ok else "error", "status_code": status, "data": body if ok else None}
