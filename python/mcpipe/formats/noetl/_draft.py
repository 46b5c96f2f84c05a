"""NoETL's 2025 draft engine: the sequential interpreter of ``noetl/agent.py`` (2025-06-27, run as ``noetl agent``),
kept by ``noetl/broker.py`` (2025-07, NoETL 1.0's first broker), compiled into the plan.

Its playbooks (``noetl.io/v1``, June-July 2025) have ``call:`` steps (a ``workbook`` task by ``name``/``task``,
with ``with``), loop steps whose body is their ``next`` steps, ``end_loop`` steps, and (the broker) steps that name
their task with ``type``/``name``. What that engine does, and so what this compiles:

- **One step at a time**, from ``start`` until ``end``: after a step, the first of its ``next`` candidates
  (``get_next_steps(...)[0]``): a ``{when, then}`` entry whose ``when`` holds gives its first ``then`` step, one
  whose ``when`` does not its own ``else``; ``{step, with}`` and a name give that step; a separate ``{else:
  [...]}`` entry gives no step, which ends the run. A failed step ends the run. The ``with`` of the candidate
  taken is rendered when the next step starts and written into the run's context.
- **The context** is one mapping for the whole run: the workload's keys and ``workload`` (the call's
  arguments replace workload keys, as ``noetl agent --payload`` does), every ``with`` written so far, and each
  step's result (``STEP``, ``STEP.result`` and ``result``: the task result's ``data``; ``STEP.status``).
- **Templates** render as its ``render_template`` does: ``{{ a.b }}`` (a plain path, no operator) is the value
  found by walking the context's mappings; anything else renders to text (``{{ x == 1 }}`` is the text
  ``"True"`` or ``"False"``, and a condition holds when its rendering is not empty), read as JSON when it looks
  like a list or an object; a template that fails to render (an undefined name) is ``None``, so a condition
  that reads an undefined name does not hold; ``{{}}`` is ``""``.
- **A ``call:`` step** runs its ``workbook`` task (``type``: ``http`` by default, or ``python``) with the call's
  ``with`` over the context; the task's own ``with`` renders over that. ``python``: ``main(**with)``;
  ``http``: ``{data, status_code, headers}`` of the response; a task's ``return`` transforms its result.
- **A loop step** renders ``in`` (a list; a string is read as JSON), each item (an object as it is, anything
  else as ``{"value": item}``), skips the items its ``filter`` renders falsy for, and for each runs the steps
  its ``next`` names (each alone, with its ``with`` rendered over the item; their own ``next`` is not
  followed). ``LOOP_results`` is the list of each item's ``{STEP: data}``. The run goes on at the
  ``end_loop: LOOP`` step if there is one (with that step's ``with``), else at the loop's first ``next``
  candidate.
- **An ``end_loop`` step** writes ``LOOP_results`` and renders its ``result`` mapping into the context.

Things that engine takes and never reads are check warnings; what it fails when it runs (an unsupported task
type, python code without ``main``) fails here when it runs too, with its error text.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jinja2
import trio

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode, ExpressionError, Problem
from mcpipe.expr._jinja import Compiled, RenderError, environment, render_async
from mcpipe.formats.noetl._tmpl import Findings, fill, leaves, now, walk
from mcpipe.kinds import StepPolicy
from mcpipe.plan import Arc, CompiledSpec, ForEach, Leaf, Node
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcpipe.formats.noetl._workflow import NoetlPlaybook

__all__ = ["compile_draft"]

FACT = "noetl_draft"
"""The field of a step's result (in mcpipe's answer) holding what it wrote into the run's context, in order."""

TASK_REF = ("type", "name", "task", "with")
"""The keys a broker step names its task by (``type``, ``name``/``task``) and gives it values with."""
STEP_KEYS = ("step", "desc", "description", "next", "call", "loop", "end_loop", "result", *TASK_REF)
TOP_KEYS = ("apiVersion", "kind", "name", "path", "description", "version", "workload", "workbook", "workflow")
TASK_TYPES = ("http", "python")
HTTP_FIELDS = ("method", "endpoint", "params", "payload", "headers", "timeout")
_OPERATORS = ("==", "!=", "<", ">", "+", "-", "*", "/", "|", " if ", " else ")


# --- templates, as the draft engine's render_template renders them ---


@dataclass(frozen=True, slots=True)
class _Str:
    """A template string: its shortcut path (a plain ``{{ a.b }}``), its compiled Jinja, or a constant."""

    text: str
    path: tuple[str, ...] | None
    template: jinja2.Template | None
    broken: bool = False


def _compile_str(text: str, location: str, warnings: list[str]) -> Any:
    if "{{" not in text or "}}" not in text:
        return text
    expr = text.strip()
    if expr == "{{}}":
        return ""
    path: tuple[str, ...] | None = None
    if expr.startswith("{{") and expr.endswith("}}"):
        var = expr[2:-2].strip()
        if not any(op in var for op in _OPERATORS):
            path = tuple(p.strip() for p in var.split("."))
    try:
        template = environment().from_string(text)
    except jinja2.TemplateSyntaxError as e:
        warnings.append(
            f"{location}: template syntax error ({e.message}): NoETL's 2025 engine renders it as an empty string, "
            "and so does mcpipe"
        )
        return _Str(text, path, None, True)
    return _Str(text, path, template)


def _render_str(shape: _Str, ctx: Mapping[str, object]) -> Any:
    """The draft engine's ``render_template`` (see the module) of one string, over ``ctx``, in this thread."""
    if shape.path is not None:
        if len(shape.path) == 1 and shape.path[0] in ctx:
            return ctx[shape.path[0]]
        if len(shape.path) > 1:
            value: Any = ctx
            for part in shape.path:
                if isinstance(value, Mapping) and part in value:
                    value = value[part]
                else:
                    break
            else:
                return value
    if shape.template is None:
        return ""
    try:
        rendered = shape.template.render(ctx)
    except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError, RenderError):
        return None  # "Template rendering error": the engine logs it and answers None
    if (rendered.startswith("[") and rendered.endswith("]")) or (rendered.startswith("{") and rendered.endswith("}")):
        try:
            return json.loads(rendered)
        except ValueError:
            pass
    if rendered.strip() == "":
        return ""
    return rendered


@dataclass(frozen=True, slots=True)
class DraftTmpl:
    """A value whose strings are the draft engine's templates, compiled once."""

    shape: Any
    location: str

    async def render(self, ctx: Mapping[str, object], extra: Mapping[str, object] | None = None) -> Any:
        """Rendered over the context (and ``extra``, the engine's ``rules``), off the event loop within the
        templates' budgets (time, size)."""
        sources = tuple(t.text for t in leaves(self.shape, _Str))
        if not sources:
            return self.shape
        roots = {**ctx, **(extra or {}), "now": now}
        compiled = Compiled(lambda r: fill(self.shape, _Str, lambda s: _render_str(s, r)), sources)
        try:
            return await render_async(compiled, roots, self.location)
        except RenderError as e:
            raise StepFailure(str(e), e.code) from None


# --- the model ---


@dataclass
class Candidate:
    """A ``next`` candidate: to ``target`` (None: the run ends there), when ``when`` holds (or, ``negate``, does
    not); ``with`` written into the context when the target starts."""

    target: str | None
    location: str
    when: DraftTmpl | None = None
    negate: bool = False
    with_: DraftTmpl | None = None


@dataclass
class Task:
    """A workbook task (``name`` or ``task``), compiled: its type, its fields, what runs it."""

    name: str
    type: str
    location: str
    with_: DraftTmpl | None = None
    returns: DraftTmpl | None = None
    fields: dict[str, DraftTmpl] = field(default_factory=dict)
    step: Any = None
    method: str = "GET"
    fails: str | None = None
    """The engine's error text when it cannot run the task (an unsupported type, code without ``main``)."""


@dataclass
class DraftStep:
    """One workflow step of the draft engine."""

    name: str
    location: str
    kind: str  # "call" | "loop" | "end_loop" | "plain" | "routing"
    task: str | None = None
    call_type: str = "workbook"
    call_with: DraftTmpl | None = None
    step_with: DraftTmpl | None = None
    """The broker's step-level ``with`` (a ``type``/``name`` step): laid over its task's ``with``."""
    candidates: list[Candidate] = field(default_factory=list)
    loop_in: DraftTmpl | None = None
    iterator: str = "item"
    filter: DraftTmpl | None = None
    body: list[Candidate] = field(default_factory=list)
    end_loop: str | None = None
    result: dict[str, DraftTmpl] = field(default_factory=dict)
    own_with: DraftTmpl | None = None
    """An ``end_loop`` step's own ``with``: what the loop passes it."""


@dataclass
class DraftPlaybook:
    """What the draft steps' executors need: the steps, the tasks, the workload."""

    workload: dict[str, Any]
    steps: dict[str, DraftStep]
    tasks: dict[str, Task]
    loops: set[str] = field(default_factory=set)
    ends: dict[str, str] = field(default_factory=dict)
    """``end_loop`` steps by the loop they end."""


# --- reading ---


class _Reader(Findings):
    def ignored(self, location: str, what: str) -> None:
        self.warnings.append(f"{location}: {what} is not read by NoETL's 2025 draft engine: ignored, as it ignores it")

    def beside(self, s: Mapping[str, object], where: str, keys: tuple[str, ...], what: str) -> None:
        """Each of ``keys`` the step ``s`` has, ignored (``what``: how the warning names it, ``{k}`` the key)."""
        for k in keys:
            if k in s:
                self.ignored(f"{where}.{k}", what.format(k=k))

    def tmpl(self, value: object, location: str) -> DraftTmpl:
        return DraftTmpl(walk(value, location, lambda text, where: _compile_str(text, where, self.warnings)), location)


def _read_candidates(r: _Reader, nxt: object, where: str) -> list[Candidate]:
    """``get_next_steps`` (see the module): the candidates in order, up to the first that always holds."""
    if nxt is None:
        return []
    entries = nxt if isinstance(nxt, list) else [nxt]
    out: list[Candidate] = []

    def target(entry: object, at: str) -> tuple[str | None, Any]:
        if isinstance(entry, Mapping):
            name = entry.get("step")
            if name is not None and not isinstance(name, str):
                r.add(f"{at}.step", f"must be a step name, got {json_type(name)}")
                return None, None
            return name, entry.get("with")
        if isinstance(entry, str):
            return entry, None
        r.add(at, f"an entry of `next` is a step name or `{{step, with}}`, got {json_type(entry)}")
        return None, None

    for j, entry in enumerate(entries):
        at = f"{where}[{j}]" if isinstance(nxt, list) else where
        if isinstance(entry, Mapping) and "when" in entry:
            cond = r.tmpl(entry["when"], f"{at}.when")
            for key, negate in (("then", False), ("else", True)):
                branch = entry.get(key)
                if branch is None or (isinstance(branch, list) and not branch):
                    continue
                first = branch[0] if isinstance(branch, list) else branch
                name, given = target(first, f"{at}.{key}[0]" if isinstance(branch, list) else f"{at}.{key}")
                out.append(
                    Candidate(name, f"{at}.{key}", cond, negate, r.tmpl(given, f"{at}.{key}") if given else None)
                )
            continue
        name, given = target(entry, at)
        out.append(Candidate(name, at, None, False, r.tmpl(given, f"{at}.with") if given else None))
        break  # it always holds: nothing after it is ever chosen
    return out


def _read_task(r: _Reader, raw: Mapping[str, object], where: str, name: str) -> Task:
    kind = raw.get("type", "http")
    task = Task(name, str(kind), where)
    if raw.get("with") is not None:
        task.with_ = r.tmpl(raw["with"], f"{where}.with")
    if raw.get("return") is not None:
        task.returns = r.tmpl(raw["return"], f"{where}.return")
    read = {"name", "task", "type", "with", "return", "desc", "description"}
    if kind == "http":
        read |= set(HTTP_FIELDS)
        method = str(raw.get("method", "GET")).upper()
        task.method = method
        if method not in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            task.fails = f"Unsupported HTTP method: {method}"
        for k in ("endpoint", "params", "payload", "headers"):
            task.fields[k] = r.tmpl(raw.get(k, "" if k == "endpoint" else {}), f"{where}.{k}")
    elif kind == "python":
        read |= {"code"}
        code = raw.get("code", "")
        if not isinstance(code, str):
            r.add(f"{where}.code", f"must be text, got {json_type(code)}")
            code = ""
        why = _no_main(code)
        if why is not None:
            task.fails = why
            r.warnings.append(
                f"{where}.code: {why}: NoETL's 2025 draft engine fails this task when it runs, so does mcpipe"
            )
        else:
            task.fields["code"] = DraftTmpl(code, f"{where}.code")  # code is text, never a template
    elif kind in ("duckdb", "postgres", "secrets", "playbook", "workbook"):
        # The engine runs these (installing DuckDB extensions and attaching databases from `with`, its own
        # credentials, ...); mcpipe does not read them as it does: refused, not pretended.
        r.add(
            f"{where}.type",
            f"a `{kind}` task of NoETL's 2025 draft engine is not supported (mcpipe reads its `http` and `python` "
            "tasks)",
        )
    else:
        nested = "Nested loop task execution not supported. Use step-level loops only."
        task.fails = nested if kind == "loop" else f"Unsupported task type: {kind}"
        r.warnings.append(
            f"{where}.type: {task.fails} (NoETL's 2025 draft engine fails this task when it runs, so does mcpipe)"
        )
        read |= set(raw)
    for k in raw:
        if k not in read:
            r.ignored(f"{where}.{k}", f"`{k}`")
    return task


def _no_main(code: str) -> str | None:
    """The engine's error for code it cannot run (``exec`` then ``main(**with)``), or None."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return f"{e.msg} (<string>, line {e.lineno})"
    if not any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "main" for n in tree.body):
        return "No main function defined in Python task"
    return None


def _read_step(r: _Reader, s: Mapping[str, object], name: str, where: str) -> DraftStep:
    step = DraftStep(name, where, "plain")
    for k in s:
        if k not in STEP_KEYS:
            r.ignored(f"{where}.{k}", f"`{k}`")
    if "end_loop" in s:
        step.kind = "end_loop"
        loop = s["end_loop"]
        if not isinstance(loop, str) or not loop:
            r.add(f"{where}.end_loop", "names the loop step it ends")
        else:
            step.end_loop = loop
        result = s.get("result") or {}
        if not isinstance(result, Mapping):
            r.add(f"{where}.result", f"must map names to templates, got {json_type(result)}")
            result = {}
        step.result = {str(k): r.tmpl(v, f"{where}.result.{k}") for k, v in result.items()}
        if s.get("with") is not None:
            step.own_with = r.tmpl(s["with"], f"{where}.with")
        r.beside(s, where, ("loop", "call"), "`{k}` beside `end_loop`")
    elif "loop" in s:
        step.kind = "loop"
        loop = r.obj(s["loop"], f"{where}.loop", " (`in`, `iterator`, `filter`)") or {}
        for k in loop:
            if k not in ("in", "iterator", "filter"):
                r.ignored(f"{where}.loop.{k}", f"`loop.{k}`")
        step.loop_in = r.tmpl(loop.get("in", []), f"{where}.loop.in")
        iterator = loop.get("iterator", "item")
        step.iterator = iterator if isinstance(iterator, str) else "item"
        if loop.get("filter"):
            step.filter = r.tmpl(loop["filter"], f"{where}.loop.filter")
        # Its body: each entry of `next` naming a step, run per item in order (`{when, then}` entries name none).
        entries = s.get("next") or []
        for j, entry in enumerate(entries if isinstance(entries, list) else [entries]):
            at = f"{where}.next[{j}]" if isinstance(entries, list) else f"{where}.next"
            if isinstance(entry, str):
                step.body.append(Candidate(entry, at))
            elif isinstance(entry, Mapping) and isinstance(entry.get("step"), str):
                given = entry.get("with")
                step.body.append(Candidate(entry["step"], at, with_=r.tmpl(given, f"{at}.with") if given else None))
        r.beside(
            s,
            where,
            ("call", "type", "name", "task", "with"),
            "`{k}` beside `loop` (the loop runs, its `{k}` does not)",
        )
    elif "call" in s:
        step.kind = "call"
        call = s["call"]
        if not isinstance(call, Mapping):
            # `call: [...]`: the engine reads `call` as a mapping and fails the step.
            r.warnings.append(
                f"{where}.call: a list, which NoETL's 2025 draft engine cannot read (`call` is one task): the step "
                "fails when it runs, and so does it in mcpipe"
            )
            step.kind = "broken"
            call = {}
        name_ = call.get("name") or call.get("task")
        step.task = str(name_) if name_ is not None else None
        step.call_type = str(call.get("type", "workbook"))
        if call.get("with") is not None:
            step.call_with = r.tmpl(call["with"], f"{where}.call.with")
        for k in call:
            if k not in ("name", "task", "type", "with"):
                r.ignored(f"{where}.call.{k}", f"`call.{k}`")
        r.beside(s, where, ("with", "type", "name", "task"), "`{k}` beside `call`")
    elif s.get("name") or s.get("task"):
        # The broker of 2025-07: a step naming its task with `type` (default `workbook`) and `name`.
        step.kind = "call"
        step.task = str(s.get("name") or s.get("task"))
        step.call_type = str(s.get("type", "workbook"))
        if s.get("with") is not None:
            step.step_with = r.tmpl(s["with"], f"{where}.with")
    else:
        step.kind = "routing" if "type" in s else "plain"
        r.beside(s, where, ("with", "result"), "`{k}` of a step that runs no task")
    step.candidates = _read_candidates(r, s.get("next"), f"{where}.next")
    if step.kind == "call" and step.call_type != "workbook":
        r.add(
            f"{where}.{'call.' if 'call' in s else ''}type",
            f"a `{step.call_type}` call is not supported: the 2025 draft engine's steps call `workbook` tasks",
        )
    return step


def read_draft(raw: Mapping[str, Any]) -> tuple[DraftPlaybook, str, str, str, _Reader]:
    r = _Reader()
    for k in raw:
        if k not in TOP_KEYS:
            r.ignored(str(k), f"`{k}`")
    name = raw.get("name") if isinstance(raw.get("name"), str) else None
    meta = raw.get("metadata")
    if name is None and isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
        name = meta["name"]
    if not name:
        r.add("name", "is required (a playbook's `name`)")
        name = ""
    path = str(raw.get("path") or name)
    workload = r.obj(raw.get("workload") or {}, "workload") or {}
    tasks: dict[str, Task] = {}
    workbook = raw.get("workbook") or []
    if not isinstance(workbook, list):
        r.add("workbook", f"must be a list of tasks, got {json_type(workbook)}")
        workbook = []
    for i, t in enumerate(workbook):
        where = f"workbook[{i}]"
        if r.obj(t, where) is None:
            continue
        tname = t.get("name") or t.get("task")
        if not isinstance(tname, str) or not tname:
            r.add(f"{where}.name", "a task needs a `name` (or `task`)")
            continue
        if tname not in tasks:  # `find_task` takes the first of a name
            tasks[tname] = _read_task(r, t, where, tname)
    steps: dict[str, DraftStep] = {}
    for i, s in enumerate(raw.get("workflow") or []):
        where = f"workflow[{i}]"
        if not isinstance(s, Mapping) or not isinstance(s.get("step"), str):
            r.add(where, "a step is `{step: NAME, ...}`")
            continue
        if s["step"] in steps:
            continue  # `find_step` takes the first of a name
        steps[s["step"]] = _read_step(r, s, s["step"], where)
    dp = DraftPlaybook(dict(workload), steps, tasks)
    for st in steps.values():
        if st.kind == "loop":
            dp.loops.add(st.name)
        if st.kind == "end_loop" and st.end_loop is not None:
            dp.ends.setdefault(st.end_loop, st.name)
            if st.end_loop not in steps:
                r.warnings.append(
                    f"{st.location}.end_loop: no loop step `{st.end_loop}`: NoETL's 2025 draft engine fails this step "
                    "when it runs (`Loop context not found`), and so does mcpipe"
                )
        if st.kind == "call" and st.task is not None and st.task not in tasks:
            r.warnings.append(
                f"{st.location}: unknown workbook task `{st.task}`: NoETL's 2025 draft engine fails this step when it "
                "runs (`Task not found`), and so does mcpipe"
            )
        for c in [*st.candidates, *st.body]:
            if c.target is not None and c.target != "end" and c.target not in steps:
                r.warnings.append(
                    f"{c.location}: unknown step `{c.target}`: NoETL's 2025 draft engine ends the run there "
                    "(`Step not found`), and so does mcpipe"
                )
    if "start" not in steps:
        r.add("workflow", "has no `start` step: NoETL's 2025 draft engine runs from `start`")
    return dp, str(name), path, str(raw.get("description") or ""), r


# --- compiling ---


def compile_draft(
    raw: Mapping[str, object], *, policy: StepPolicy, tools: Container[str] | None, file: str, **_: object
) -> tuple[Any, list[Problem]]:
    """A playbook of the draft engine compiled into the plan (a :class:`~mcpipe.formats.noetl._workflow.NoetlPlaybook`
    whose graph runs it as the engine did); every problem located."""
    from mcpipe.formats.noetl._workflow import NoetlPlaybook, StepPlan

    dp, name, path, description, r = read_draft(raw)
    pb = NoetlPlaybook(name, path, description, "draft", dp.workload, {})
    pb.policy, pb.file = policy, file
    for t in dp.tasks.values():
        if t.fails is None and t.type in TASK_TYPES:
            _compile_task(r, t, policy, tools)
    for st in dp.steps.values():
        pb.steps[st.name] = StepPlan(pb, st.name, st.location, [], False)
        if st.kind == "loop":
            pb.loops.add(st.name)
    if not r.problems:
        pb.plan = _plan(r, pb, dp)
    pb.inputs = sorted(dp.workload)
    pb.warnings = r.warnings
    return pb, r.problems


def _compile_task(r: _Reader, t: Task, policy: StepPolicy, tools: Container[str] | None) -> None:
    from mcpipe.formats.noetl._workflow import compiled_step, http_raw

    if t.type == "python":
        raw: dict[str, Any] = {"kind": "python", "id": "task", "code": t.fields["code"].shape, "input": "${args}"}
    else:
        endpoint = t.fields["endpoint"].shape  # its method is one the engine sends: else the task `fails`
        raw = http_raw(t.method, {"$literal": endpoint} if isinstance(endpoint, str) and endpoint else "${args}")
    t.step = compiled_step(r, raw, t.location, policy, tools, rename=("url", "endpoint"))


def _plan(r: _Reader, pb: NoetlPlaybook, dp: DraftPlaybook) -> CompiledSpec:
    from mcpipe.formats.noetl._workflow import depth_first, noetl_leaf

    # The steps the run can go to from `start` (a loop's body steps run inside the loop: they are nodes only
    # when the run can also go to them).
    reached, _ = depth_first(
        "start",
        lambda n: [c.target if c.target in dp.steps and c.target != "end" else None for c in _after(dp, dp.steps[n])],
    )
    order = [n for n in dp.steps if n in reached]
    index = {n: i for i, n in enumerate(order)}
    nodes: list[Node] = []
    arcs: list[tuple[Arc, ...]] = []
    for n in order:
        st = dp.steps[n]
        sp = pb.steps[n]
        node: Node = noetl_leaf(n, st.location, _Built(sp, dp, st), run_step)
        if st.kind == "loop":
            node = ForEach(
                n,
                st.location,
                items=LoopItems(dp, st),
                step=noetl_leaf(n, st.location, _Built(sp, dp, st), run_body),
                as_name=st.iterator if st.iterator.isidentifier() else "item",
                max_concurrency=1,
                continue_on_error=True,
            )
        nodes.append(node)
        out: list[Arc] = []
        for c in _after(dp, st):
            if c.target is None or c.target not in index:
                break  # the run ends there (no step, `end`, or a step the workflow lacks)
            out.append(Arc(index[c.target], CandidateWhen(dp, c, st.name), c.location, c))
        arcs.append(tuple(out))
    # An arc to a step on the way from `start` closes a cycle: it runs that step again.
    _mark_back(order, index, arcs)
    return pb.graph_plan("workflow" if "workflow" not in index else "workflow_", nodes, arcs, index.get("start", 0))


def _after(dp: DraftPlaybook, st: DraftStep) -> list[Candidate]:
    """Where the run goes after a step: a loop to its ``end_loop`` step (with that step's ``with``); any other
    step, and a loop without one, by its ``next`` candidates (a loop's first is its first body step, run again)."""
    if st.kind == "loop":
        end = dp.ends.get(st.name)
        if end is not None:
            return [Candidate(end, f"{dp.steps[end].location}.end_loop", with_=dp.steps[end].own_with)]
    return st.candidates


def _mark_back(order: list[str], index: dict[str, int], arcs: list[tuple[Arc, ...]]) -> None:
    from mcpipe.formats.noetl._workflow import depth_first

    if not order:
        return
    _, back = depth_first(index.get("start", 0), lambda node: [a.to for a in arcs[node]])
    for node, i in back:
        arc = arcs[node][i]
        arcs[node] = (*arcs[node][:i], Arc(arc.to, arc.when, arc.location, arc.data, back=True), *arcs[node][i + 1 :])


# --- running ---


@dataclass(frozen=True, slots=True)
class _Built:
    plan: Any  # the step's StepPlan (what the answer names it by)
    dp: DraftPlaybook
    step: DraftStep


def context_of(dp: DraftPlaybook, env: Mapping[str, Any]) -> dict[str, Any]:
    """The run's context (see the module) from the run so far: the workload (the call's arguments replacing its
    keys) flat and as ``workload``, then what each finished step wrote, in the order they finished."""
    from mcpipe.formats.noetl._steps import EXECUTION_ID, step_of

    workload = dict(dp.workload)
    for k, v in (env.get("args") or {}).items():
        if k != EXECUTION_ID:
            workload[k] = v
    ctx: dict[str, Any] = dict(workload)
    ctx["workload"] = workload
    for key, r in (env.get("steps") or {}).items():
        if not isinstance(r, Mapping) or step_of(key) not in dp.steps:
            continue
        if r.get("kind") == "for_each":
            children = [ch for ch in r.get("children") or [] if ch is not None]
            for ch in children:
                ctx.update(ch.get(FACT) or {})
            ctx[f"{step_of(key)}_results"] = [ch.get("output") for ch in children]
        else:
            ctx.update(r.get(FACT) or {})
    return ctx


@dataclass(frozen=True, slots=True)
class CandidateWhen:
    """Whether the run goes on to a candidate once its step is done: the step succeeded, and the candidate's
    ``when`` renders truthy (``else``: falsy) over the context; the graph takes the first that holds."""

    dp: DraftPlaybook
    candidate: Candidate
    step: str

    @property
    def source(self) -> str | None:
        when = self.candidate.when
        return when.location if when is not None else None

    def evaluate(self, env: Mapping[str, object]) -> bool:
        raise ExpressionError("the draft engine's arcs are evaluated off the event loop")  # the graph awaits

    async def evaluate_async(self, env: Mapping[str, Any]) -> bool:
        last = env.get("last") or {}
        if not last.get("ok"):
            return False  # a failed step ends the run
        when = self.candidate.when
        if when is None:
            return True
        try:
            value = await when.render(context_of(self.dp, env))
        except StepFailure as e:
            raise ExpressionError(str(e)) from None
        return bool(value) != self.candidate.negate  # Python's truth, as the engine's `if condition:` (`"False"` holds)


@dataclass(frozen=True, slots=True)
class LoopItems:
    """A loop step's items: ``in`` rendered over the context (a string read as JSON, else one item; anything but
    a list fails the loop), each an object (``{"value": item}`` for anything else), those its ``filter`` renders
    falsy for skipped (an empty rendering keeps the item)."""

    dp: DraftPlaybook
    step: DraftStep

    @property
    def source(self) -> str | None:
        return self.step.loop_in.location if self.step.loop_in is not None else None

    def evaluate(self, env: Mapping[str, object]) -> list[Any]:
        raise ExpressionError("a draft loop's items are evaluated off the event loop")

    async def evaluate_async(self, env: Mapping[str, object]) -> list[Any]:
        run = _Run(self.dp, context_of(self.dp, env), env, ToolContext())
        try:
            await _arrive(run, env)
            return await _items(run, self.step)
        except StepFailure as e:
            raise ExpressionError(str(e)) from None


def _as_dict(item: object) -> dict[str, Any]:
    """The engine's ``validate_dict``: an object as it is, a string holding a JSON object that object, anything
    else ``{"value": item}``."""
    if isinstance(item, dict):
        return item
    if isinstance(item, str):
        try:
            parsed = json.loads(item)
        except ValueError:
            return {"value": item}
        return parsed if isinstance(parsed, dict) else {"value": parsed}
    return {"value": item}


@dataclass
class _Run:
    """One step's run: the context as it was when it started, and what it writes, in order."""

    dp: DraftPlaybook
    ctx: dict[str, Any]
    env: Mapping[str, object]
    tool_ctx: ToolContext
    writes: dict[str, Any] = field(default_factory=dict)

    def write(self, key: str, value: object) -> None:
        self.ctx[key] = value
        self.writes[key] = value


async def run_step(
    step: Leaf[None, _Built], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """A step of the draft engine (not a loop's: :func:`run_body`), reached by a candidate whose ``with`` it
    writes into the context first."""
    built: _Built = step.built
    run = _Run(built.dp, context_of(built.dp, env), env, ctx)
    await _arrive(run, env)
    result = await _execute(run, built.step, None)
    return _output(result, run)


async def _arrive(run: _Run, env: Mapping[str, Any]) -> None:
    """The ``with`` of the candidate the step was reached by, rendered over the context and written into it."""
    for arc in env.get("via") or ():
        if isinstance(arc.data, Candidate) and arc.data.with_ is not None:
            values = await arc.data.with_.render(run.ctx)
            if isinstance(values, Mapping):
                for k, v in values.items():
                    run.write(str(k), v)


async def run_body(
    step: Leaf[None, _Built], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """One item of a loop step: each step its ``next`` names, alone, its ``with`` rendered over the item; their
    results (``{STEP: data}``, None for one that failed) are the item's."""
    built: _Built = step.built
    st = built.step
    run = _Run(built.dp, context_of(built.dp, env), env, ctx)
    await _arrive(run, env)
    out = StepOutput.of(await _body(run, st, env.get("item"), missing=True))
    if run.writes:
        out.facts = {FACT: dict(run.writes)}
    return out


def _output(result: Mapping[str, object], run: _Run) -> StepOutput:
    facts = {FACT: dict(run.writes)} if run.writes else {}
    if result.get("status") != "success":
        raise StepFailure(str(result.get("error") or "failed"), ErrorCode.TOOL_ERROR, dict(result), facts)
    out = StepOutput.of(result.get("data"))
    if facts:
        out.facts = facts
    return out


async def _execute(run: _Run, st: DraftStep, given: Any, *, rendered: bool = False) -> dict[str, Any]:
    """The engine's ``execute_step``: the ``with`` it was reached with written into the context, then what the
    step does; its result ``{status, data, error}`` (a ``call`` step's also written into the context)."""
    if given is not None:
        # What a loop passes its body step, rendered over the item (never rendered again: they are values now).
        values = given if rendered else await given.render(run.ctx)
        if isinstance(values, Mapping):
            for k, v in values.items():
                run.write(str(k), v)
    if st.kind == "end_loop":
        return await _end_loop(run, st)
    if st.kind == "loop":
        return await _loop_inline(run, st)
    if st.kind == "broken":
        return _error("'list' object has no attribute 'get'")
    if st.kind in ("plain", "routing"):
        data: Any = {} if st.kind == "plain" else {"message": f"Routing step {st.name} completed"}
        if st.kind == "routing":
            _written(run, st.name, data, "success")
        return _ok(data)
    task_ctx = dict(run.ctx)
    if st.call_with is not None:
        given_with = await st.call_with.render(run.ctx)
        if isinstance(given_with, Mapping):
            task_ctx.update(given_with)
    result = await _task(run, st, task_ctx)
    _written(run, st.name, result.get("data"), str(result.get("status")))
    return result


def _written(run: _Run, name: str, data: object, status: str) -> None:
    run.write(name, data)
    run.write(f"{name}.result", data)
    run.write(f"{name}.status", status)
    run.write("result", data)


def _ok(data: object) -> dict[str, Any]:
    """A result of the engine's (``{id, status, data}``), a success."""
    return {"id": str(uuid.uuid4()), "status": "success", "data": data}


def _error(text: str) -> dict[str, Any]:
    """A result of the engine's, an error."""
    return {"id": str(uuid.uuid4()), "status": "error", "error": text}


async def _end_loop(run: _Run, st: DraftStep) -> dict[str, Any]:
    loop = st.end_loop or ""
    key = f"{loop}_results"
    if loop not in run.dp.loops or key not in run.ctx:
        return _error(f"Loop context not found: {loop}")
    run.write(key, run.ctx[key])
    aggregated: dict[str, Any] = {}
    for k, t in st.result.items():
        value = await t.render(run.ctx)
        aggregated[k] = value
        run.write(k, value)
    return _ok(aggregated)


async def _loop_inline(run: _Run, st: DraftStep) -> dict[str, Any]:
    """A loop step run as another loop's body step: its items, each running its own body, in this step."""
    try:
        kept = await _items(run, st)
    except ExpressionError as e:
        return _error(str(e))
    all_results = [await _body(run, st, item, missing=False) for item in kept]
    run.write(f"{st.name}_results", all_results)
    return _ok(all_results)


async def _body(run: _Run, st: DraftStep, item: object, *, missing: bool) -> dict[str, Any]:
    """One item of a loop: each step its ``next`` names, alone, its ``with`` rendered over the item; their results
    (``{STEP: data}``, None for one that failed; ``missing``: and for a step the workflow lacks)."""
    results: dict[str, Any] = {}
    for c in st.body:
        if c.target is None or (c.target not in run.dp.steps and not missing):
            continue
        rendered = await c.with_.render(run.ctx, {st.iterator: item}) if c.with_ is not None else None
        target = run.dp.steps.get(c.target)
        if target is None:
            results[c.target] = None  # "Step not found": an error result, nothing else
            continue
        r = await _execute(run, target, rendered, rendered=True)
        results[c.target] = r.get("data") if r.get("status") == "success" else None
    return results


async def _items(run: _Run, st: DraftStep) -> list[Any]:
    assert st.loop_in is not None
    items = await st.loop_in.render(run.ctx)
    if isinstance(items, str):
        try:
            items = await trio.to_thread.run_sync(json.loads, items)  # a long text: off the event loop
        except ValueError:
            items = [items]
    if not isinstance(items, list):
        raise ExpressionError(f"Loop items must be a list, got: {type(items)}")
    kept = []
    for item in items:
        value = _as_dict(item)
        if st.filter is not None:
            verdict = await st.filter.render({**run.ctx, st.iterator: value})
            if not (isinstance(verdict, str) and verdict.strip() == "") and not verdict:
                continue
        kept.append(value)
    return kept


async def _task(run: _Run, st: DraftStep, context: dict[str, Any]) -> dict[str, Any]:
    """The engine's ``execute_task``: the workbook task by name, its ``with`` rendered into the context, run by its
    type, its ``return`` laid over its result."""
    task = run.dp.tasks.get(st.task or "")
    if task is None:
        return _error(f"Task not found: {st.task}")
    if task.fails is not None:
        return _error(task.fails)
    with_values: dict[str, Any] = {}
    if task.with_ is not None or st.step_with is not None:
        shape = task.with_.shape if task.with_ is not None else {}
        if st.step_with is not None and isinstance(st.step_with.shape, dict):
            shape = {**(shape if isinstance(shape, dict) else {}), **st.step_with.shape}
        with_values = await DraftTmpl(shape, task.location).render(context) or {}
        if isinstance(with_values, Mapping):
            context.update(with_values)
    if task.type == "python":
        result = await _python(run, task, context, with_values)
    else:
        result = await _http(run, task, context)
    if task.returns is not None and result.get("status") == "success":
        result["data"] = await task.returns.render({**context, "result": result.get("data"), "status": "success"})
    return result


async def _python(run: _Run, task: Task, context: Mapping[str, object], with_values: object) -> dict[str, Any]:
    from mcpipe.formats.noetl._steps import _call_kind

    # `main(**with)`: the task's `with` rendered over the context (again, as the engine renders it twice).
    args = await task.with_.render(context) if task.with_ is not None else {}
    if not isinstance(args, Mapping):
        args = {}
    inputs = {name: t.resolve({}) for name, t in task.step.templates if name != "input"}
    inputs["input"] = dict(args)
    inputs["context"] = {}
    try:
        data = await _call_kind(task.step, inputs, run.env, run.tool_ctx, f"{task.location}.code")
    except StepFailure as e:
        out = e.output
        return _error(
            out["error_text"] if isinstance(out, Mapping) and isinstance(out.get("error_text"), str) else str(e)
        )
    return _ok(data)


async def _http(run: _Run, task: Task, context: Mapping[str, object]) -> dict[str, Any]:
    from mcpipe.formats.noetl._steps import _call_kind, _query

    endpoint = await task.fields["endpoint"].render(context)
    params = await task.fields["params"].render(context) or {}
    payload = await task.fields["payload"].render(context)
    headers = await task.fields["headers"].render(context) or {}
    if not isinstance(endpoint, str) or not endpoint:
        return _error(f"Request error: no URL (rendered {endpoint!r})")
    if not isinstance(headers, Mapping):
        headers = {}
    body = payload if task.method in ("POST", "PUT", "PATCH") else None
    inputs = {
        "url": endpoint,
        "headers": {str(k): str(v) for k, v in headers.items() if v is not None},
        "query": _query(params if isinstance(params, Mapping) and params else None),
        "body": body,
    }
    try:
        out = await _call_kind(task.step, inputs, run.env, run.tool_ctx, f"{task.location}.endpoint")
    except StepFailure as e:
        return _error(f"Request error: {e}")
    status = out.get("status")
    response = out.get("body")
    if not (isinstance(status, int) and 200 <= status < 400):
        text = response if isinstance(response, str) else json.dumps(response)
        return _error(f"HTTP error: {status} - {text}")
    if isinstance(response, str):
        response = {"text": response}
    return _ok({"data": response, "status_code": status, "headers": out.get("headers", {})})
