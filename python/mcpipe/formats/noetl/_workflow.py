"""A NoETL playbook compiled into the plan: its ``workflow`` a :class:`~mcpipe.plan.Graph`.

Each step is one node: a leaf that runs the step's tool (or its pipeline of tasks), or, for a step with a
``loop``, a :class:`~mcpipe.plan.ForEach` over that leaf (``sequential``: one item at a time; ``parallel``:
up to ``max_in_flight``, under the call's concurrency limit). The ``next`` arcs are the graph's arcs, with
their ``mode`` (``exclusive``: the first arc whose ``when`` holds; ``inclusive``: every one); a step that
several arcs lead to runs once, when every arc into it is decided. The scheduler runs the graph; this
module only compiles it (and the executors are in :mod:`mcpipe.formats.noetl._steps`).

A task's tool kind decides what runs it:

- ``http``: NoETL's fields (``method``, ``url``/``endpoint``, ``headers``, ``params``, ``payload``/``body``,
  ``data``, ``timeout``, ``verify_ssl``, ``follow_redirects``, ``auth``) on mcpipe's ``http`` kind (the
  operator's outbound policy applies); NoETL's result shape;
- ``playbook``: another playbook of the catalog, run to its end;
- ``python``, ``postgres``, ``duckdb``, ``shell``: :func:`mcpipe.formats.noetl.toolkinds.map_tool`;
- ``noop`` (and a step without a tool), ``workbook`` (an action of the ``workbook``), ``mcp`` with ``turn``
  (a seed 004 turn), and every kind of mcpipe's declared steps (``value``, ``tool``, ``transform``, ...);
- anything else (a cloud warehouse, ``transfer``, ``container``, ...) is refused, located, naming the kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from mcpipe._describe import did_you_mean, json_type
from mcpipe._template import Template
from mcpipe.errors import Problem
from mcpipe.formats.noetl import _nats, toolkinds
from mcpipe.formats.noetl._layout import (
    CODE,
    ArcSpec,
    Doc,
    LoopSpec,
    OutputSpec,
    PaginateSpec,
    Rule,
    StepSpec,
    TaskSpec,
)
from mcpipe.formats.noetl._save import SaveSpec, read_save
from mcpipe.formats.noetl._save import binds as save_binds
from mcpipe.formats.noetl._sqlbind import DIALECTS, SqlTemplate, sql_template
from mcpipe.formats.noetl._tmpl import Findings, Tmpl, compile_tmpl, has_jinja
from mcpipe.formats.noetl._transfer import TransferSpec, read_transfer
from mcpipe.kinds import StepPolicy
from mcpipe.plan import Arc, CompiledSpec, Expression, ForEach, Graph, Leaf, Node, Pipeline, RunFn

if TYPE_CHECKING:
    from mcpipe.formats.noetl._catalog import Catalog
    from mcpipe.formats.noetl._compile import Playbook

__all__ = ["ArcPlan", "NoetlPlaybook", "RulePlan", "StepPlan", "TaskPlan", "compile_workflow"]

REFUSED_KINDS = {
    "snowflake": "a cloud warehouse",
    "snowflake_transfer": "a cloud warehouse transfer",
    "ducklake": "DuckLake catalogs",
    "gcs": "Google Cloud Storage",
    "container": "containers (Kubernetes jobs)",
    "script": "scripts fetched from cloud storage",
    "agent": "NoETL's agent runtimes",
    "gateway": "NoETL's gateway",
    "rhai": "the Rhai scripting engine",
    "task_sequence": "an internal NoETL kind",
    "result_fetch": "NoETL's result store",
    "iterator": "an iterator as a tool (use the step's `loop`)",
    "playbooks": "the `playbooks` kind of NoETL 1.x (use `playbook`)",
    "ibkr": "a broker's API",
}
"""NoETL tool kinds mcpipe does not have: a step using one is refused at check time."""

_NOOP = ("noop", "start", "end", "router")
_STEP_ID = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class RulePlan:
    """A task's policy rule, compiled."""

    rule: Rule
    when: Tmpl | None
    set: Tmpl | None
    stop: Tmpl | None = None


@dataclass
class SavePlan:
    """A ``save``/``sink`` compiled (:mod:`mcpipe.formats.noetl._save`): its data, its SQL (a postgres
    statement, or DuckDB's commands), the connection, and the mcpipe step that writes it."""

    spec: SaveSpec
    data: Tmpl | None = None
    statement: Tmpl | None = None
    sql: SqlTemplate | None = None
    """The statement as :mod:`mcpipe.formats.noetl._sqlbind` rewrote it (its values bound when it renders)."""
    conn: dict[str, Tmpl] = field(default_factory=dict)
    database: Tmpl | None = None
    step: Any = None
    binds: tuple[str, ...] = ()


@dataclass
class PaginatePlan:
    """``retry.on_success`` compiled: its ``while``, its ``next_call`` fields, its page ``sink``."""

    spec: PaginateSpec
    while_: Tmpl
    next_call: Tmpl
    sink: SavePlan | None = None


@dataclass
class TaskPlan:
    """One task of a step, compiled: what runs it (``runner``), its rules.

    ``runner`` is one of the executors of :mod:`mcpipe.formats.noetl._steps` (``http``, ``kind``,
    ``playbook``, ``noop``, ``turn``) with what it needs in ``parts``.
    """

    name: str
    kind: str
    location: str
    runner: str
    parts: dict[str, Any]
    rules: list[RulePlan] = field(default_factory=list)
    on_unmatched: str = "continue"
    save: SavePlan | None = None
    paginate: PaginatePlan | None = None
    output: OutputSpec | None = None


@dataclass
class ArcPlan:
    """What an arc carries to its target: ``set`` (variables it writes when taken) and ``data`` (the older
    layout's values for the target step), both rendered when the target starts; and its source."""

    source: str
    set: Tmpl | None = None
    data: Tmpl | None = None


@dataclass
class StepPlan:
    """One step, compiled: its tasks (a pipeline when ``pipeline``), its ``set``, its loop's iterator."""

    playbook: NoetlPlaybook
    name: str
    location: str
    tasks: list[TaskPlan]
    pipeline: bool
    set: Tmpl | None = None
    iterator: str | None = None
    router: bool = False
    save: SavePlan | None = None
    """The step's ``save``: after its tasks; a loop step's runs once after its last item (its own node)."""
    result: Tmpl | None = None
    """A tool-less step's ``result`` template (NoETL 1.x): its result."""
    output: OutputSpec | None = None
    """NoETL's result storage: what of the result later steps see (``output_select``), the rest kept in the run
    behind a ``_ref``."""

    def describe(self) -> str:
        """What a drawing of the plan says the step does (:mod:`mcpipe.plan._draw`): its tools' kinds."""
        kinds = " + ".join(dict.fromkeys(t.kind for t in self.tasks))
        return kinds or "route"


@dataclass
class NoetlPlaybook:
    """A NoETL playbook, checked and compiled: its graph, steps and what templates read.

    Attributes:
        name, path, description: from ``metadata`` (or the older layout's top-level ``name``/``path``).
        layout: ``v2`` (``noetl.io/v2``) or ``v1`` (the older layout).
        workload: the baseline variables; a call's arguments are laid over them.
        steps: the compiled steps by name; ``routers`` are the ones with no tool.
        plan: the compiled plan (a pipeline of one graph).
        inputs: the call arguments its templates read (the workload's names, and names no step or
            variable defines).
        mcp: the ``mcp:`` section's turns, tools and models (seed 004), when it has one.
        catalog: where its ``playbook`` tasks find other playbooks.
    """

    name: str
    path: str
    description: str
    layout: str
    workload: dict[str, Any]
    keychain: dict[str, Mapping[str, Any]]
    steps: dict[str, StepPlan] = field(default_factory=dict)
    routers: set[str] = field(default_factory=set)
    loops: set[str] = field(default_factory=set)
    plan: CompiledSpec | None = None
    graph_id: str = "workflow"
    inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    policy: StepPolicy = field(default_factory=StepPolicy)
    registry: Any = None
    mcp: Playbook | None = None
    catalog: Catalog | None = None
    file: str = ""
    limits: Any = None
    root: str = ""
    """The base directory (the one playbook paths are relative to): without a catalog, a ``script`` file is
    looked for under the playbook's directory and its parents up to it (with one, up to the catalog's roots)."""

    @property
    def turns(self) -> dict[str, Any]:
        return self.mcp.turns if self.mcp is not None else {}

    def graph_plan(
        self,
        graph_id: str,
        nodes: list[Node],
        arcs: list[tuple[Arc, ...]],
        entry: int,
        *,
        inclusive: Sequence[bool] = (),
        unnamed: str = "playbook",
    ) -> CompiledSpec:
        """The plan of one graph (``graph_id``, kept as :attr:`graph_id`): ``nodes``, each one's ``arcs``, run from
        ``entry`` (``inclusive``: which nodes' arcs are), every node's failure its own; ``unnamed``: its name
        without the playbook's."""
        inclusive = tuple(inclusive) or tuple(False for _ in nodes)
        graph = Graph(
            graph_id,
            "workflow",
            nodes=tuple(nodes),
            arcs=tuple(arcs),
            inclusive=inclusive,
            entry=entry,
            continue_on_error=True,
        )
        self.graph_id = graph.id
        return CompiledSpec.of(Pipeline(Template({}), (graph,), None, True, None, self.name or unnamed))


class _Problems(Findings):
    def tmpl(self, value: object, location: str, mode: str = "config") -> Tmpl:
        found: list[tuple[str, str]] = []
        t = compile_tmpl(value, location, found, mode)
        for loc, msg in found:
            self.add(loc, msg)
        return t

    def cond(self, value: object, location: str, *, bools: bool = False) -> Tmpl | None:
        """A condition (``engine`` mode) when ``value`` is a template string (``bools``: or a boolean), else None."""
        if bools and isinstance(value, bool):
            value = "{{ true }}" if value else "{{ false }}"
        return self.tmpl(value, location, "engine") if isinstance(value, str) else None


def noetl_leaf(
    name: str,
    location: str,
    built: object,
    run: RunFn[Any, Any],
    *,
    when: Expression | None = None,
    timeout_ms: float | None = None,
) -> Leaf[Any, Any]:
    """A node of a NoETL graph: ``run`` runs the step ``built``, its failure its own (the graph's arcs route it)."""
    return Leaf(
        name,
        location,
        kind="noetl",
        fields=None,
        built=built,
        run=run,
        continue_on_error=True,
        when=when,
        timeout_ms=timeout_ms,
    )


def compiled_step(
    f: Findings,
    raw: Mapping[str, object],
    location: str,
    policy: StepPolicy,
    tools: Container[str] | None = None,
    rename: tuple[str, str] | None = None,
) -> Any:
    """``raw`` compiled as one of mcpipe's declared steps (None: it has problems), its problems added to ``f``
    (``rename``: a field's location written with NoETL's name for it)."""
    from mcpipe.declared import StepScope, compile_step

    step, problems = compile_step(raw, location, StepScope(policy=policy, tools=tools))
    for p in problems:
        at = p.location.replace(f"{location}.{rename[0]}", f"{location}.{rename[1]}") if rename else p.location
        f.add(at, p.message)
    return step


def http_raw(
    method: str, url: object = "${args}", given: tuple[str, ...] = ("headers", "query", "body"), **fields: object
) -> dict[str, Any]:
    """A NoETL request on mcpipe's ``http`` kind: the fields ``given`` (and ``url``, unless a constant) are
    given when it runs, and every status is an answer (NoETL reads it); ``fields`` laid over (None: left out)."""
    return {
        "kind": "http",
        "id": "task",
        "method": method,
        "url": url,
        **dict.fromkeys(given, "${args}"),
        "expected_status_codes": list(range(100, 600)),
        **{k: v for k, v in fields.items() if v is not None},
    }


def _timeout_ms(cfg: Mapping[str, object]) -> float | None:
    """A tool's ``timeout`` (seconds, when positive) as the kind's ``timeout_ms``."""
    timeout = cfg.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout) * 1000
    return None


def _connection(c: _Problems, given: Mapping[str, object], loc: str, raw: dict[str, Any]) -> dict[str, Tmpl] | None:
    """The postgres connection ``given`` names (``auth``, NoETL 1.x's ``with``) laid over the step ``raw`` (a
    constant field as it is, a template given when it runs), and its fields' templates; None: there is none."""
    found: list[Problem] = []
    conn = toolkinds.connection_of(given, loc, found)
    for p in found:
        c.add(p.location, p.message)
    if conn is None:
        return None
    for k, v in conn.items():
        raw[k] = {"$literal": v} if isinstance(v, str) and not has_jinja(v) else "${args}"
    return {k: c.tmpl(v, f"{loc}.auth") for k, v in conn.items()}


def compile_workflow(
    doc: Doc,
    *,
    policy: StepPolicy,
    tools: Container[str] | None,
    catalog: Catalog | None,
    mcp: Playbook | None,
    file: str,
    stack: tuple[str, ...] = (),
) -> tuple[NoetlPlaybook, list[Problem]]:
    """Compile a playbook's model (:func:`~mcpipe.formats.noetl._layout.read_doc`) into its plan; every
    problem found is returned, located (the playbook is usable only when there are none)."""
    c = _Problems()
    c.warnings.extend(doc.warnings)
    keychain = {str(e["name"]): e for _where, e in doc.keychain}
    pb = NoetlPlaybook(doc.name, doc.path, doc.description, doc.layout, doc.workload, keychain)
    pb.policy, pb.catalog, pb.mcp, pb.file = policy, catalog, mcp, file
    names = {s.name for s in doc.steps}
    pb.graph_id = "workflow" if "workflow" not in names else "workflow_"
    incoming: dict[str, list[ArcSpec]] = {s.name: [] for s in doc.steps}
    for s in doc.steps:
        for a in s.arcs:
            if a.target in incoming:
                incoming[a.target].append(a)
    for s in doc.steps:
        sp = _step(c, pb, doc, s, incoming[s.name], tools, stack)
        pb.steps[s.name] = sp
        if sp.router:
            pb.routers.add(s.name)
        if s.loop is not None:
            pb.loops.add(s.name)
            _loop_warnings(c, s, s.loop)
    reachable = _reachable(c, doc)
    for s in doc.steps:
        if s.name not in reachable and doc.entry:
            c.warnings.append(f"{s.location}: step `{s.name}` is not reached from `{doc.entry}`")
    if not c.problems:
        pb.plan = _plan(c, pb, doc, reachable)
    pb.inputs = sorted(pb.workload)  # a call may override each of the workload's names
    pb.warnings = c.warnings
    return pb, c.problems


def _reachable(c: _Problems, doc: Doc) -> list[str]:
    """The steps reached from the entry, in workflow order. An arc back to a step on the way from the entry
    closes a cycle (NoETL's pagination and polling by arcs): it is marked ``back``, and taking it runs that
    step again (bounded by the server's ``pipe.max_step_runs``)."""
    by_name = {s.name: s for s in doc.steps}
    if doc.entry not in by_name:
        return []
    seen, back = depth_first(doc.entry, lambda n: [a.target if a.target in by_name else None for a in by_name[n].arcs])
    for name, i in back:
        by_name[name].arcs[i].back = True
    return [s.name for s in doc.steps if s.name in seen]


N = TypeVar("N")


def depth_first(entry: N, targets: Callable[[N], list[N | None]]) -> tuple[set[N], list[tuple[N, int]]]:
    """The nodes reached from ``entry`` (each one's arcs to ``targets``, None: to no node), and the arcs (the node,
    the arc's index) back to a node on the way from ``entry``: each closes a cycle."""
    state: dict[N, int] = {entry: 1}
    stack: list[tuple[N, int]] = [(entry, 0)]
    back: list[tuple[N, int]] = []
    while stack:
        node, i = stack[-1]
        out = targets(node)
        if i >= len(out):
            stack.pop()
            state[node] = 2
            continue
        stack[-1] = (node, i + 1)
        target = out[i]
        if target is None:
            continue
        if state.get(target) == 1:
            back.append((node, i))
        elif state.get(target) is None:
            state[target] = 1
            stack.append((target, 0))
    return set(state), back


def _step(
    c: _Problems,
    pb: NoetlPlaybook,
    doc: Doc,
    s: StepSpec,
    incoming: list[ArcSpec],
    tools: Container[str] | None,
    stack: tuple[str, ...],
) -> StepPlan:
    data_keys = {k for a in incoming for k in a.data or ()}
    tasks = [t for task in s.tasks if (t := _task(c, pb, doc, s, task, data_keys, tools, stack)) is not None]
    sp = StepPlan(pb, s.name, s.location, tasks, s.pipeline, router=not s.tasks and s.save is None and s.result is None)
    if s.result is not None:
        sp.result = c.tmpl(s.result, s.result_location)
    sp.output = s.output
    if sp.output is None and len(tasks) == 1 and not s.pipeline:
        sp.output = tasks[0].output  # a single tool's `output` is its step's
    if s.save is not None:
        sp.save = _save_plan(c, pb, s.save)
    if s.set is not None:
        sp.set = c.tmpl(dict(s.set), s.set_location, "engine")
    if s.loop is not None:
        sp.iterator = s.loop.iterator
    return sp


def _runs(plan: TaskPlan, runner: str, parts: dict[str, Any] | None) -> TaskPlan | None:
    """The task run by ``runner`` with ``parts`` (None, or empty: it has problems, and no plan)."""
    if not parts:
        return None
    plan.runner, plan.parts = runner, parts
    return plan


def _merged_input(
    task: TaskSpec,
    s: StepSpec,
    data_keys: set[str],
    keys: tuple[str, ...] = ("args", "data", "with", "input"),
    c: _Problems | None = None,
) -> dict[str, Any]:
    """NoETL's task input: the tool's ``args``, its ``input`` (and the older ``data``/``with``: ``keys``), then
    the step's ``input``, then what arcs into the step pass (read by name); ``c``: a key that is not an object is
    a problem there."""
    merged: dict[str, Any] = {}
    for key in keys:
        value = task.config.get(key)
        if isinstance(value, Mapping):
            merged.update({str(k): v for k, v in value.items()})
        elif value is not None and c is not None:
            c.add(f"{task.location}.{key}", f"must be an object, got {json_type(value)}")
    if s.input:
        merged.update(s.input)
    for k in sorted(data_keys):
        merged.setdefault(k, "{{ " + k + " }}")
    return merged


def _task(
    c: _Problems,
    pb: NoetlPlaybook,
    doc: Doc,
    s: StepSpec,
    task: TaskSpec,
    data_keys: set[str],
    tools: Container[str] | None,
    stack: tuple[str, ...],
) -> TaskPlan | None:
    kind = task.kind
    if kind == "workbook":
        ref = task.config.get("name")
        action = doc.workbook.get(str(ref)) if isinstance(ref, str) else None
        if action is None:
            c.add(f"{task.location}.name", f"unknown workbook action `{ref}`{did_you_mean(str(ref), doc.workbook)}")
            return None
        merged = {**action.config, **{k: v for k, v in task.config.items() if k != "name"}}
        task = TaskSpec(task.name, action.kind, task.location, merged, task.rules or action.rules, task.on_unmatched)
        kind = task.kind
        if kind == "workbook":
            c.add(f"{action.location}.type", "a workbook action cannot be another `workbook` reference")
            return None
    plan = TaskPlan(task.name, kind, task.location, "noop", {}, on_unmatched=task.on_unmatched)
    if task.save is not None:
        plan.save = _save_plan(c, pb, task.save)
    plan.output = task.output
    if task.paginate is not None:
        pg = task.paginate
        if kind != "http":
            c.add(
                f"{pg.location}",
                f"success-side retry (pagination) of a `{kind}` tool is not supported: mcpipe pages `http` tools",
            )
        else:
            cond = pg.while_ if isinstance(pg.while_, str) else ("{{ true }}" if pg.while_ else "{{ false }}")
            plan.paginate = PaginatePlan(
                pg,
                c.tmpl(cond, f"{pg.location}.while", "engine"),
                c.tmpl(dict(pg.next_call), f"{pg.location}.next_call"),
                _save_plan(c, pb, pg.sink) if pg.sink is not None else None,
            )
    for rule in task.rules:
        when = c.cond(rule.when, f"{rule.location}.when")
        rset = c.tmpl(dict(rule.set), f"{rule.location}.then.set", "text") if rule.set else None
        plan.rules.append(RulePlan(rule, when, rset, c.cond(rule.stop_when, f"{rule.location}.stop_when")))
    if kind in _NOOP:
        c.unknown(task.config, task.location, ("input", "args", "desc"), f"a `{kind}` tool", "field")
        return plan
    if kind == "artifact":
        what = str(task.config.get("action", "get"))
        if what != "get":
            c.add(
                f"{task.location}.action",
                f"an artifact `{what}` (storing outside the run) is not supported: `get` reads a result stored by "
                "an `output` block",
            )
            return None
        given_a = {k: v for k, v in task.config.items() if k in ("result_ref", "uri")}
        for key in ("input", "args", "with", "data"):
            if isinstance(task.config.get(key), Mapping):
                given_a.update(task.config[key])
        return _runs(plan, "artifact", {"input": c.tmpl(given_a, f"{task.location}.input")})
    if kind == "transfer":
        before = len(c.problems)
        spec_t = read_transfer(task.config, task.location, c.problems, CODE)
        parts_t = _transfer_plan(c, pb, spec_t) if spec_t is not None and len(c.problems) == before else None
        return _runs(plan, "transfer", parts_t)
    if kind == "save":
        before = len(c.problems)
        spec = read_save(task.config, task.location, c.problems, CODE)
        if spec is None or len(c.problems) > before:
            return None
        return _runs(plan, "save", {"save": _save_plan(c, pb, spec)})
    if kind == "nats":
        spec_n = _nats.read_nats(task.config, task.location, c.problems, CODE, c.warnings)
        if spec_n is None:
            return None
        return _runs(
            plan,
            "nats",
            {
                "operation": c.tmpl(spec_n["operation"], f"{task.location}.operation"),
                "fields": c.tmpl(spec_n["fields"], task.location),
                "auth": c.tmpl(spec_n["auth"], f"{task.location}.auth") if spec_n["auth"] is not None else None,
                "constant": spec_n["constant"],
            },
        )
    if kind in REFUSED_KINDS:
        c.add(f"{task.location}.kind", f"NoETL tool kind `{kind}` ({REFUSED_KINDS[kind]}) has no mcpipe step kind")
        return None
    if kind == "secrets":
        provider = task.config.get("provider", "env")
        name = task.config.get("name", task.config.get("secret_name"))
        if provider == "google":
            return _runs(plan, "gcp_secret", _gcp_secret(c, pb, task))
        if provider != "env":
            c.add(
                f"{task.location}.provider",
                f"secrets from `{provider}` (a cloud secret manager) are not supported (mcpipe reads `env` and "
                "`google`); NoETL 4 refuses them too",
            )
            return None
        if not isinstance(name, str) or not name:
            c.add(f"{task.location}.name", "is required: the environment variable to read")
            return None
        return _runs(plan, "secrets", {"name": name})
    if kind == "http":
        return _runs(plan, "http", _http(c, task, pb.policy))
    if kind == "playbook":
        return _runs(plan, "playbook", _playbook(c, pb, task, s, data_keys, stack))
    if kind == "mcp":
        turn = task.config.get("turn")
        if not isinstance(turn, str):
            c.add(
                f"{task.location}.kind",
                "NoETL tool kind `mcp` (a bridge to MCP servers) has no mcpipe step kind: call the server's tool "
                "through the gateway with `kind: tool`, or name a seed 004 turn with `turn: NAME`",
            )
            return None
        if turn not in pb.turns:
            c.add(f"{task.location}.turn", f"unknown turn `{turn}`{did_you_mean(turn, pb.turns)}")
            return None
        return _runs(plan, "turn", {"turn": turn})
    if kind in toolkinds.KINDS:
        config = dict(task.config)
        script: dict[str, Any] | None = None
        if "script" in config and kind in ("python", "postgres", "duckdb"):
            script = _script(c, config, kind, task.location, pb.workload)
            if script is None:
                return None
        given: dict[str, Any] = {}
        if kind == "python":
            config["input"] = _merged_input(task, s, data_keys)
            for key in ("args", "data", "with"):
                config.pop(key, None)
        elif kind in ("postgres", "duckdb"):
            # NoETL 1.x's `with` parameters (`with`, `data`, `args`, `input` and what arcs pass): names the
            # SQL's templates read, and a postgres connection's `db_*` fields.
            given = _merged_input(task, s, data_keys)
            config["with"] = given
        found: list[Problem] = []
        step = toolkinds.map_tool(kind, config, task.location, found)
        if found and all(p.code == toolkinds.NO_CONNECTION_CODE for p in found):
            # No connection at all: NoETL takes the playbook and the step fails when it runs (NoETL 4 requires
            # `auth`; 1.x misses its `db_*` fields). mcpipe does the same, and says so at check time.
            c.warnings.append(
                f"{found[0].location}: {found[0].message}: NoETL fails this step when it runs, so does mcpipe"
            )
            return _runs(plan, "fails", {"error": _NOETL_NO_CONNECTION[doc.layout]})
        for p in found:
            c.problems.append(p)
        if step is None:
            if not found:
                c.add(f"{task.location}.kind", f"NoETL tool kind `{kind}` could not be mapped")
            return None
        if step.pop(toolkinds.JINJA_IN_CODE, False):
            c.warnings.append(
                f"{task.location}.code: the code holds Jinja (`{{{{ ... }}}}`), which mcpipe never renders into code "
                "(a value would become code): it runs as written, as NoETL 4.26 runs it; pass values in `input`"
            )
        if kind == "python":
            broken = _syntax_error(str(step["code"]))
            if broken is not None:
                # NoETL execs the code as it is (noetl/tools/python/executor.py: `exec(code, ...)`): it takes
                # the playbook and the step fails when it runs. mcpipe does the same, and says so at check time.
                message, line = broken
                c.warnings.append(
                    f"{task.location}.code: the code does not compile ({message}, line {line} of the code): "
                    "NoETL takes the playbook and fails this step when it runs, and so does mcpipe"
                )
                return _runs(plan, "fails", {"error": f"{message} (<string>, line {line})"})
        sql: tuple[str, SqlTemplate] | None = None
        if kind in DIALECTS:
            sql_field = "command" if kind == "postgres" else "commands"
            sql = (sql_field, _sql(c, str(step[sql_field]), kind, pb, f"{task.location}.{sql_field}"))
            step[sql_field] = sql[1].source
        out = _kind(c, plan, dict(step), task.location, pb.policy, tools, toolkinds.TEMPLATE_FIELDS.get(kind))
        if out is None:
            return None
        if sql is not None:
            out.parts["sql_text"] = sql  # rendered with its values bound (_sqlbind.rendered_sql)
        if given:
            out.parts["with"] = c.tmpl(given, f"{task.location}.with")
        if "secrets" in step:
            out.parts["sql"] = pb.policy.sql  # a postgres secret's credential: the config's [sql.NAME]
        if script and "guard" in script:
            out.parts["code_from"] = (script["guard"], f"{task.location}.script.source.code")
        elif script:
            # The code (or SQL) is the file's, read when the step runs: the step is compiled again with it.
            uri = c.tmpl(script["uri"], f"{task.location}.script.uri")
            out.parts["script"] = {**script, "uri": uri, "raw": dict(step), "playbook": pb, "policy": pb.policy}
        if kind == "python" and "context" not in step:
            out.parts["context"] = True  # NoETL's `context` global: the step's scope, as data
        return out
    from mcpipe.formats.noetl._compile import action_types

    if kind in action_types():
        return _kind(c, plan, {**task.config, "kind": kind}, task.location, pb.policy, tools)
    known = (*sorted(toolkinds.KINDS), "http", "playbook", "noop", "workbook", *action_types())
    c.add(f"{task.location}.kind", f"unknown tool kind `{kind}`{did_you_mean(kind, known)}")
    return None


_GCP_FIELDS = ("provider", "project_id", "secret_name", "version", "api_endpoint", "timeout", "name")


def _gcp_secret(c: _Problems, pb: NoetlPlaybook, task: TaskSpec) -> dict[str, Any]:
    """A ``secrets`` task of ``provider: google`` (:mod:`mcpipe.formats.noetl._gcp`): its fields, and the two
    requests it makes (the token, the secret) on mcpipe's ``http`` kind under the operator's outbound policy."""
    cfg = task.config
    for k in cfg:
        if k not in _GCP_FIELDS:
            c.warnings.append(
                f"{task.location}.{k}: `{k}` is not read by NoETL's Google Secret Manager provider: ignored, as NoETL "
                "ignores it"
            )
    if not cfg.get("secret_name"):
        c.add(f"{task.location}.secret_name", "is required: the secret to read")
        return {}
    steps: dict[str, Any] = {}
    for label, given in (("token", ("headers", "query", "body")), ("access", ("headers", "query"))):
        raw = http_raw("POST" if label == "token" else "GET", given=given, id=label, timeout_ms=_timeout_ms(cfg))
        step = compiled_step(c, raw, task.location, pb.policy)
        if step is None:
            return {}
        steps[label] = step
    fields = {k: cfg[k] for k in ("project_id", "secret_name", "version", "api_endpoint") if k in cfg}
    return {"fields": c.tmpl(fields, task.location), **steps}


_SCRIPT_PLACEHOLDER = {
    "python": ("code", "pass"),
    "postgres": ("command", "SELECT 1"),
    "duckdb": ("commands", "SELECT 1"),
}


_WORKLOAD_REF = re.compile(r"^\s*\{\{\s*(?:workload\.)?([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*$")


def _script(
    c: _Problems, config: dict[str, Any], kind: str, location: str, workload: Mapping[str, object]
) -> dict[str, Any] | None:
    """NoETL's ``script`` (code or SQL fetched from a source): a file (``source.type: file``) is read when the
    step runs, at its ``uri`` under the playbook's own directory; inline code written in the playbook is its
    code, and so is a template that names a workload value the playbook writes (``{{ workload.code }}``), read
    from the file when it loads (a call that passes that name is refused: NoETL would run the caller's text);
    any other template for code, and remote sources (GCS, S3, HTTP), are refused. ``config`` gets a placeholder
    for the code so the rest of the tool compiles now."""
    script = config.pop("script")
    where = f"{location}.script"
    source = script.get("source") if isinstance(script, Mapping) else None
    kind_of = source.get("type") if isinstance(source, Mapping) else None
    field_name, placeholder = _SCRIPT_PLACEHOLDER[kind]
    if kind_of == "inline" and isinstance(source, Mapping):
        code = source.get("code")
        ref = _WORKLOAD_REF.match(code) if isinstance(code, str) else None
        if ref is not None and isinstance(workload.get(ref.group(1)), str) and not has_jinja(workload[ref.group(1)]):
            # The code is the playbook's own text (its workload's value): read now, never a caller's value.
            config[field_name] = workload[ref.group(1)]
            return {"guard": ref.group(1)}
        if not isinstance(code, str) or has_jinja(code):
            c.add(
                f"{where}.source.code",
                "code from a template is refused: a caller's values would become code (write the code inline)",
            )
            return None
        config[field_name] = code
        return {}
    if kind_of != "file":
        c.add(
            f"{where}.source.type",
            f"{kind} tool: code or SQL fetched from `{kind_of}` (a remote store) is not supported: a local file "
            "(`source.type: file`, under the playbook's directory) is",
        )
        return None
    uri = script.get("uri") if isinstance(script, Mapping) else None
    if not isinstance(uri, str) or not uri:
        c.add(f"{where}.uri", "is required: the script's path (under the playbook's directory)")
        return None
    config[field_name] = placeholder
    return {"uri": uri, "field": field_name, "kind": kind}


def _transfer_plan(c: _Problems, pb: NoetlPlaybook, spec: TransferSpec) -> dict[str, Any] | None:
    """A ``transfer`` compiled (:mod:`mcpipe.formats.noetl._transfer`): its source (an ``http`` request, or a
    postgres query) and its target, each on mcpipe's kind, their credentials the config's."""
    loc = spec.location
    parts: dict[str, Any] = {"spec": spec}
    if spec.source_type == "http":
        source = TaskSpec(
            "source", "http", f"{loc}.source", {"url": spec.url, "method": spec.method, "headers": spec.headers}
        )
        http = _http(c, source, pb.policy)
        if not http:
            return None
        parts["http"] = TaskPlan("source", "http", f"{loc}.source", "http", http)
    else:
        parts["source"] = _pg_step(c, pb, spec.source_auth, f"{loc}.source")
        parts["query_sql"] = _sql(c, str(spec.query), "postgres", pb, f"{loc}.source.query")
        parts["query"] = c.tmpl(parts["query_sql"].source, f"{loc}.source.query", "text")
        if parts["source"] is None:
            return None
    parts["target"] = _pg_step(c, pb, spec.target_auth, f"{loc}.target")
    if spec.target_query is not None:
        parts["target_sql"] = _sql(c, str(spec.target_query), "postgres", pb, f"{loc}.target.query")
        parts["target_query"] = c.tmpl(parts["target_sql"].source, f"{loc}.target.query", "text")
    return parts if parts["target"] is not None else None


def _pg_step(c: _Problems, pb: NoetlPlaybook, auth: object, loc: str) -> tuple[Any, dict[str, Tmpl]] | None:
    """A postgres step on the connection ``auth`` names (its command and params given when it runs), and the
    connection's templates."""
    raw: dict[str, Any] = {"kind": "postgres", "id": "transfer", "command": "${args}", "params": "${args}"}
    templates = _connection(c, {"auth": auth}, loc, raw)
    if templates is None:
        return None
    step = compiled_step(c, raw, loc, pb.policy, rename=("backend", "auth"))
    return (step, templates) if step is not None else None


def _sql(c: _Problems, text: str, dialect: str, pb: NoetlPlaybook, where: str) -> SqlTemplate:
    """NoETL SQL text rewritten so that its values are bound or checked (:mod:`mcpipe.formats.noetl._sqlbind`);
    a text that cannot be is a problem at ``where``."""
    tpl, why = sql_template(text, dialect, pb.workload)
    if why is not None:
        c.add(where, why)
    return tpl


def _save_plan(c: _Problems, pb: NoetlPlaybook, spec: SaveSpec) -> SavePlan:
    """A save compiled: its data and SQL templates, its connection, and the mcpipe step that writes it."""
    loc = spec.location
    plan = SavePlan(spec)
    if spec.data is not None:
        plan.data = c.tmpl(spec.data, f"{loc}.data")
    if spec.kind == "postgres":
        raw: dict[str, Any] = {"kind": "postgres", "id": "save", "command": "${args}", "params": "${args}"}
        conn = _connection(c, {"auth": spec.auth, "with": dict(spec.given)}, loc, raw)
        if conn is None:
            return plan
        plan.conn = conn
        if spec.statement is not None:
            text = spec.statement
            if "{{" in text or "{%" in text:
                text = text.replace("params.", "data.")  # NoETL's migration of `params.*` to `data.*`
                plan.sql = _sql(c, text, "postgres", pb, f"{loc}.statement")
                plan.statement = c.tmpl(plan.sql.source, f"{loc}.statement", "text")
            else:
                plan.statement = c.tmpl(text, f"{loc}.statement", "text")
                plan.binds = tuple(dict.fromkeys(save_binds(text)))
    elif spec.kind == "duckdb":
        raw = {"kind": "duckdb", "id": "save", "commands": "${args}", "database": "${args}", "output": "noetl"}
        commands = spec.commands if spec.commands is not None else spec.statement
        if commands is not None:
            plan.sql = _sql(c, str(commands), "duckdb", pb, f"{loc}.commands")
            plan.statement = c.tmpl(plan.sql.source, f"{loc}.commands", "text")
        elif not isinstance(spec.data, Mapping):
            c.add(loc, "a duckdb save needs `commands` (or `sql`, `statement`), or `data`: a mapping")
            return plan
        database = spec.database
        if database is None:
            database = str(toolkinds.NOETL_DUCKDB_DIR / "duckdb_{{ execution_id }}.duckdb")
        plan.database = c.tmpl(database, f"{loc}.database")
    else:
        return plan
    plan.step = compiled_step(c, raw, loc, pb.policy, rename=("backend", "auth"))
    return plan


_NOETL_NO_CONNECTION = {
    "v2": "Postgres connection requires `auth` (reference to credential/keychain). Direct db_* connection fields "
    "are not supported for postgres tool execution.",
    "v1": "Postgres connection is not configured. Missing: db_host, db_port, db_user, db_password, db_name. Use "
    "`auth: <credential_key>` or `auth: {type: postgres, host: ..., user: ..., password: ..., database: ...}` on the "
    "step, or provide explicit db_* fields in `with:`.",
}
"""NoETL's error for a postgres tool without a connection (4.x: noetl/tools/postgres/auth.py; 1.x:
noetl/plugin/postgres.py)."""


def _syntax_error(code: str) -> tuple[str, int] | None:
    """``(message, line)`` when python ``code`` does not compile (a ``SyntaxError``), else None."""
    try:
        compile(code, "<string>", "exec", dont_inherit=True)
    except SyntaxError as e:
        return str(e.msg), int(e.lineno or 0)
    except (ValueError, RecursionError, MemoryError):
        return None  # the kind reports these, located
    return None


def _kind(
    c: _Problems,
    plan: TaskPlan,
    raw: Mapping[str, object],
    location: str,
    policy: StepPolicy,
    tools: Container[str] | None,
    templates: frozenset[str] | None = None,
) -> TaskPlan | None:
    """A task on one of mcpipe's step kinds: the kind's template fields are NoETL templates (rendered per
    run, handed to the kind's executor); its other fields are fixed at load, so they cannot hold templates."""
    from mcpipe.declared import KINDS

    kind = str(raw.get("kind"))
    if kind not in KINDS:
        c.add(f"{location}.kind", f"the step kind `{kind}` is not available in this mcpipe")
        return None
    template_names = tuple(templates) if templates is not None else KINDS[kind].templates
    fields = {k: v for k, v in raw.items() if k not in ("kind", "id")}
    jinja = {k: v for k, v in fields.items() if k in template_names}
    fixed = {k: v for k, v in fields.items() if k not in template_names}
    for k, v in fixed.items():
        if has_jinja(v) and not (kind == "python" and k == "code"):  # code is text, never a template
            c.add(
                f"{location}.{k}",
                f"`{k}` of a `{kind}` step is fixed when the playbook loads, not a template: pass the values it "
                "needs as data (`input`)",
            )
    found: list[tuple[str, str]] = []
    compiled = {k: compile_tmpl(v, f"{location}.{k}", found) for k, v in jinja.items()}
    if found:
        # Text NoETL's Jinja cannot parse either (a shell program's `{{.ID}}` of Go templates, say): NoETL takes
        # the playbook and the step fails when it renders it; mcpipe does the same, and says so at check time.
        where, why = found[0]
        c.warnings.append(f"{where}: {why}: NoETL fails this step when it renders it, and so does mcpipe")
        return _runs(plan, "fails", {"error": f"{where}: {why}"})
    placeholders = {k: {"$literal": v} if not has_jinja(v) else "${args}" for k, v in jinja.items()}
    step_raw = {**fixed, **placeholders, "kind": kind, "id": "task"}
    step = compiled_step(c, step_raw, location, policy, tools)
    if step is None or not isinstance(step, Leaf):
        return None
    return _runs(plan, "kind", {"step": step, "fields": compiled, "raw": step_raw})


_HTTP_FIELDS = (
    "method",
    "url",
    "endpoint",
    "headers",
    "params",
    "payload",
    "body",
    "data",
    "timeout",
    "verify_ssl",
    "verify",
    "follow_redirects",
    "auth",
    "input",
    "args",
    "with",
)


def _http(c: _Problems, task: TaskSpec, policy: StepPolicy) -> dict[str, Any]:
    """NoETL's ``http`` tool on mcpipe's ``http`` kind: the request is rendered per run (NoETL's rules for
    ``data``, ``params`` and ``payload``), the kind sends it under the outbound policy."""
    cfg = task.config
    if cfg.get("authentication") == "genericCredentialType":
        # NoETL 1.x (noetl/action.py): `genericAuthType: httpBearerAuth` with `credentials.httpBearerAuth.name`,
        # a bearer token from the credential of that name.
        cfg = dict(cfg)
        cfg.pop("authentication")
        kind_a = str(cfg.pop("genericAuthType", "")).lower()
        creds = cfg.pop("credentials", None)
        entry = creds.get("httpBearerAuth", creds) if isinstance(creds, Mapping) else None
        name = entry.get("name") or entry.get("id") if isinstance(entry, Mapping) else None
        if kind_a not in ("httpbearerauth", "httpbearer", "bearer") or not isinstance(name, str):
            c.add(
                f"{task.location}.genericAuthType",
                "NoETL's generic credentials: `httpBearerAuth` with `credentials.httpBearerAuth.name`",
            )
            return {}
        cfg["auth"] = {"type": "bearer", "credential": name}
    unknown = [k for k in cfg if k not in _HTTP_FIELDS]
    for k in unknown:
        c.add(f"{task.location}.{k}", f"unknown field `{k}` of an `http` tool{did_you_mean(k, _HTTP_FIELDS)}")
    ok = not unknown
    url = cfg.get("endpoint", cfg.get("url"))
    if url is None:
        c.add(f"{task.location}.url", "is required: the request's URL (`url` or `endpoint`)")
        return {}
    method = cfg.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"):
        c.add(f"{task.location}.method", f"unknown HTTP method {method!r}")
        return {}
    auth = cfg.get("auth")
    if auth is not None and not _http_auth_supported(auth):
        c.add(
            f"{task.location}.auth",
            "this `auth` (cloud credentials, a secret manager) is not supported: give `{type: bearer, token: ...}`, "
            "`{source: env, name: VAR}`, or write the header",
        )
        ok = False
    follow = cfg.get("follow_redirects", False)
    verify = cfg.get("verify_ssl", cfg.get("verify", True))
    if verify is False:
        # NoETL's `verify_ssl: false`: allowed to the hosts the operator lists (outbound.http.insecure_hosts),
        # and then the step reaches only those.
        if not policy.http.insecure_hosts:
            c.add(
                f"{task.location}.verify_ssl",
                "turning TLS verification off needs the operator's `outbound.http.insecure_hosts` (the hosts it may "
                "be off for)",
            )
            ok = False
        else:
            policy = replace(policy, http=policy.http.insecure())
    url_field = "endpoint" if "endpoint" in cfg else "url"
    fixed_url = {"$literal": url} if isinstance(url, str) and not has_jinja(url) else "${args}"
    raw = http_raw(method.upper(), fixed_url, follow_redirects=bool(follow), timeout_ms=_timeout_ms(cfg))
    step = compiled_step(c, raw, task.location, policy, rename=("url", url_field))
    if step is None or not ok:
        return {}
    parts: dict[str, Tmpl | None] = {
        k: c.tmpl(cfg.get(k), f"{task.location}.{k}") for k in ("headers", "params", "payload", "body", "data")
    }
    parts["url"] = c.tmpl(url, f"{task.location}.{url_field}")
    parts["with"] = c.tmpl(cfg["with"], f"{task.location}.with") if "with" in cfg else None
    parts["auth"] = c.tmpl(auth, f"{task.location}.auth") if auth is not None else None
    return {"step": step, "method": method.upper(), "tmpl": parts}


_HTTP_AUTH_TYPES = ("bearer", "basic", "header", "api_key")


def _http_auth_supported(auth: object) -> bool:
    """NoETL's http ``auth`` mcpipe can honour: a credential by name (``auth: api_token``, or a template),
    ``{source: env, name}``, ``{type: bearer|basic|header|api_key, ...}`` with its token or credential, or a
    map of aliases to those (each one's headers laid over the others'). Cloud providers, secret managers and
    OAuth flows are not."""
    if isinstance(auth, str):
        return True
    if not isinstance(auth, Mapping):
        return False
    if auth.get("provider") not in (None, "env"):
        return False
    if auth.get("source") == "env" or auth.get("type") in _HTTP_AUTH_TYPES:
        return True
    if not toolkinds.single_auth(auth):
        return bool(auth) and all(
            isinstance(e, Mapping) and e.get("type") in _HTTP_AUTH_TYPES and e.get("provider") in (None, "env")
            for e in auth.values()
        )
    return False


def _playbook(
    c: _Problems, pb: NoetlPlaybook, task: TaskSpec, s: StepSpec, data_keys: set[str], stack: tuple[str, ...]
) -> dict[str, Any]:
    """A sub-playbook: ``path`` (a catalog path), its input (``input``/``args``/``payload``/``data``), and
    ``return_step`` (whose result is the task's, else the sub-playbook's final result)."""
    cfg = task.config
    known = ("path", "input", "args", "payload", "data", "with", "return_step", "timeout", "retry", "task")
    c.unknown(cfg, task.location, known, "a `playbook` tool", "field")
    if "retry" in cfg:
        c.add(f"{task.location}.retry", "a `playbook` tool's `retry` (NoETL 1.x) is not supported: use spec.policy")
    path = cfg.get("path")
    if not isinstance(path, str) or not path:
        c.add(f"{task.location}.path", "is required: the catalog path of the playbook to run")
        return {}
    given = _merged_input(task, s, data_keys, ("args", "data", "with", "payload", "input"), c)
    ret = cfg.get("return_step")
    if ret is not None and not isinstance(ret, str):
        c.add(f"{task.location}.return_step", "must be a step name")
        ret = None
    child = None
    if not has_jinja(path):
        if pb.catalog is None:
            c.add(f"{task.location}.path", f"no catalog to find playbook `{path}` in")
            return {}
        child, why = pb.catalog.child(path, pb, stack, relative=True)
        if child is None:
            c.add(f"{task.location}.path", why)
            return {}
        if ret is not None and ret not in child.steps:
            c.add(f"{task.location}.return_step", f"playbook `{path}` has no step `{ret}`")
            return {}
    return {
        "path": c.tmpl(path, f"{task.location}.path"),
        "child": child,
        "input": c.tmpl(given, f"{task.location}.input"),
        "return_step": ret,
    }


def _plan(c: _Problems, pb: NoetlPlaybook, doc: Doc, reachable: list[str]) -> CompiledSpec:
    from mcpipe.formats.noetl import _steps

    by_name = {s.name: s for s in doc.steps}
    # Each step is a node; a loop step with a `save` is two: the loop, then its save (after the last item),
    # which the step's arcs leave from.
    entry: dict[str, int] = {}
    exit_: dict[str, int] = {}
    n = 0
    for name in reachable:
        entry[name] = n
        n += 2 if by_name[name].loop is not None and pb.steps[name].save is not None else 1
        exit_[name] = n - 1
    nodes: list[Node] = []
    arcs: list[tuple[Arc, ...]] = []
    inclusive: list[bool] = []
    for name in reachable:
        s = by_name[name]
        sp = pb.steps[name]
        admit = _admission(c, sp, s)
        timeout_ms = s.timeout_s * 1000 if s.timeout_s is not None else None
        leaf = noetl_leaf(
            name, s.location, sp, _steps.run_step, when=admit if s.loop is None else None, timeout_ms=timeout_ms
        )
        node: Node = leaf
        if s.loop is not None:
            node = _loop(c, sp, s.loop, leaf, admit)
        nodes.append(node)
        if entry[name] != exit_[name]:
            assert sp.save is not None
            arcs.append((Arc(exit_[name], None, sp.save.spec.location),))
            inclusive.append(False)
            nodes.append(noetl_leaf(f"{name}.save", sp.save.spec.location, sp, _steps.run_loop_save))
        out: list[Arc] = []
        earlier: list[tuple[ArcSpec, Tmpl | None]] = []
        for a in s.arcs:
            if a.target not in entry:
                continue
            when = c.cond(a.when, f"{a.location}.when", bools=True)
            data = ArcPlan(
                name,
                c.tmpl(dict(a.set), f"{a.location}.set", "engine") if a.set else None,
                c.tmpl(dict(a.data), a.location) if a.data else None,
            )
            cond = _steps.ArcWhen(sp, a, when, s.loop is not None, tuple(earlier))
            earlier.append((a, when))
            out.append(Arc(entry[a.target], cond, a.location, data, back=a.back, retry=a.retry is not None))
        arcs.append(tuple(out))
        inclusive.append(s.inclusive)
    return pb.graph_plan(pb.graph_id, nodes, arcs, entry.get(doc.entry, 0), inclusive=inclusive)


def _admission(c: _Problems, sp: StepPlan, s: StepSpec) -> Any:
    """A step's ``spec.policy.admit.rules`` as the node's ``when`` (None: always admitted)."""
    from mcpipe.formats.noetl import _steps

    if not s.admit:
        return None
    return _steps.Admit(sp, tuple((c.cond(when, f"{at}.when"), when, allow) for when, allow, at in s.admit))


def _loop(c: _Problems, sp: StepPlan, loop: LoopSpec, leaf: Leaf[None, StepPlan], admit: Any = None) -> ForEach:
    from mcpipe.formats.noetl import _steps

    items = c.tmpl(loop.items, f"{loop.location}.in", "engine")
    filt = c.cond(loop.filter, f"{loop.location}.filter")
    width: int | None = 1 if loop.mode == "sequential" else None
    mif = loop.max_in_flight
    if loop.mode == "parallel" and isinstance(mif, int) and not isinstance(mif, bool):
        if mif < 1:
            c.add(f"{loop.location}.spec.max_in_flight", "must be at least 1")
        width = max(1, mif)
    # A failed item of a sequential loop ends the run, as NoETL 4.26 ends it (its engine answers the item's
    # `command.failed` with `workflow.failed` when no other command is pending: the next item is not issued
    # and the loop's arcs are not taken). A parallel loop's items run on, and its arcs route the failure.
    sequential = width == 1
    return ForEach(
        sp.name,
        loop.location,
        items=_steps.LoopItems(sp, items, filt, loop.iterator),
        step=replace(leaf, continue_on_error=False) if sequential else leaf,
        as_name=loop.iterator,
        max_concurrency=width,
        continue_on_error=not sequential,
        when=admit,
    )


def _loop_warnings(c: _Problems, s: StepSpec, loop: LoopSpec) -> None:
    """Where a sequential loop runs otherwise than NoETL 4.26 runs it, or than its arcs suggest: its items'
    writes reach the next item (NoETL renders each item in the loop's start), and a failed item ends the run
    (so an arc written for a failure never routes one)."""
    if not (loop.mode == "sequential" or loop.max_in_flight == 1):
        return
    writes = sorted(
        {str(k).partition(".")[2] or str(k) for k in (s.set or {})}
        | {str(k).partition(".")[2] or str(k) for t in s.tasks for r in t.rules for k in (r.set or {})}
    )
    if writes:
        names = ", ".join(f"`{w}`" for w in writes)
        c.warnings.append(
            f"{loop.location}: the items of this sequential loop write {names}: each item sees what the items "
            "before it wrote (NoETL 4.26 renders every item in the variables of the loop's start)"
        )
    for a in s.arcs:
        if isinstance(a.when, str) and "error" in a.when:
            c.warnings.append(
                f"{a.location}.when: a failed item of a sequential loop ends the run (as NoETL 4.26 ends it): "
                "this arc is decided only once every item succeeded"
            )
