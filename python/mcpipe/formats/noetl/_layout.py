"""NoETL's two playbook layouts read into one model: steps, their tasks, loops, arcs and ``set``.

**The current layout** (``apiVersion: noetl.io/v2``, ``kind: Playbook``, NoETL 4.x): ``metadata``,
``workload``, ``keychain``, ``executor``, ``workbook``, and ``workflow``, a list of steps, each ``step``,
``desc``, ``tool`` (one ``{kind, ...}`` or a pipeline: a list of tasks), ``input``, ``loop``
(``in``/``iterator``/``spec.mode``), ``set``, ``spec`` and ``next`` (``{spec: {mode}, arcs: [{step, when,
set}]}``).

**The older layout** (``noetl.io/v1`` and before, and seed 004's example): ``name``/``path`` at the top
(or ``metadata``), steps typed by ``type:`` (or ``tool: KIND``) with the tool's fields written on the step,
``type: workbook`` + ``name``/``task`` naming a ``workbook`` action, ``type: iterator`` loops, and ``next`` a
step name, a list of names, or a list of ``{step, data|with|args}``, ``{when, then: [...]}`` and ``{else:
[...]}`` entries.

Nothing here is compiled: :mod:`mcpipe.formats.noetl._workflow` compiles the model into the plan. Every
problem is located in the file (``workflow[3].next.arcs[1].step``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcpipe._describe import did_you_mean, json_type
from mcpipe.errors import Problem
from mcpipe.formats.noetl._save import SaveSpec, read_save
from mcpipe.formats.noetl._tmpl import CODE
from mcpipe.formats.noetl._tmpl import Findings as _Reader

__all__ = ["CODE", "ArcSpec", "Doc", "LoopSpec", "Rule", "StepSpec", "TaskSpec", "is_v2", "read_doc"]


V2_VERSIONS = ("noetl.io/v2", "noetl.io/v10")

V2_TOP = ("apiVersion", "kind", "metadata", "workload", "keychain", "executor", "workbook", "workflow", "mcp")
OLD_TOP = (*V2_TOP, "name", "path", "description", "version", "context", "environment")
"""Top-level keys mcpipe reads (``mcp`` is seed 004's extension)."""

REFUSED_TOP = {
    "vars": "root `vars` are refused by NoETL itself (use `workload`)",
}
IGNORED_TOP = {
    "tracing": "NoETL's Playbook model drops top-level `tracing` (no engine reads it): ignored; mcpipe traces "
    "through OpenTelemetry (docs/deployment.md, Traces)",
    "spec": "NoETL's Playbook model drops a top-level `spec` (its executor settings live under `executor.spec`) "
    "and its templates have no `spec`: ignored, as NoETL ignores it",
}
"""Top-level keys of the current layout that NoETL's Playbook model (pydantic, unknown fields dropped) takes
and never reads: a check warning each, and nothing else."""

_STEP = ("step", "desc", "description", "tool", "input", "loop", "set", "next", "result", "save", "sink", "output")
"""Step keys both layouts read; a current step's also ``spec`` and ``case``, an older one's ``type`` and ``vars``."""
V2_STEP = (*_STEP, "spec", "case")
OLD_STEP_CONTROL = (*_STEP, "type", "vars")
REFUSED_STEP = {
    "when": "a step-level `when` was removed from NoETL (use `next.arcs[].when` of the step before)",
    "call": "a `call:` step is NoETL's 2025 draft engine's (read as that engine read it in a noetl.io/v1 playbook of "
    "its steps); here, beside this layout's steps, no NoETL engine reads it (use `tool:` or `type: workbook`)",
    "run": "a `run:` step is NoETL's runtime of May 2025 (read as it read it in a playbook with a top-level "
    "`context`); here no NoETL engine reads it (use `tool:`)",
    "end_loop": "`end_loop` is NoETL's 2025 draft engine's (read as that engine read it in a noetl.io/v1 playbook of "
    "its steps); here no NoETL engine reads it: a `loop` on the step runs its tool per item",
    "case_mode": "`case_mode` was removed from NoETL",
}
IGNORED_STEP = {
    "pass": "`pass` is not read by NoETL's engine of this layout (it runs the step): ignored, as NoETL ignores it",
    "assert": "`assert` is not read by any NoETL engine (nothing checks it): ignored, as NoETL ignores it",
}
"""Step keys NoETL takes and never reads: a check warning each, and nothing else."""

TASK_META = ("kind", "name", "spec", "output", "desc", "description")
"""Keys of a task that are not the tool's own fields."""


@dataclass
class Rule:
    """One rule of a task's ``spec.policy.rules``: ``when`` (None: ``else``) and what it does."""

    when: Any
    do: str
    location: str
    attempts: int = 3
    backoff: str = "none"
    delay: float = 1.0
    to: str | None = None
    set: Mapping[str, Any] | None = None
    legacy: bool = False
    """NoETL 1.x's ``retry:`` block: ``when`` is its ``retry_when`` (None: retry on an error), read in its
    own names (``result``, ``status_code``, ``success``, ``data``, ``error``, ``attempt``)."""
    stop_when: Any = None
    retry_on: tuple[str, ...] = ()
    multiplier: float = 2.0
    max_delay: float = 60.0


@dataclass
class OutputSpec:
    """NoETL's ``output`` block (``noetl/worker/result_handler.py``): a result larger than ``inline_max_bytes``
    (NoETL's default 10 MiB) is kept behind a ``_ref`` (read back with an ``artifact`` ``get``) and only its
    ``output_select`` fields are the step's result; a smaller one is those fields with ``_inline`` (the result).
    mcpipe keeps the stored results in the run (the ``kv``, ``disk``, ``memory`` and ``auto`` tiers)."""

    location: str
    select: tuple[str, ...] = ()
    inline_max_bytes: int = 10 * 1024 * 1024
    store: str = "kv"


_STORES = ("kv", "disk", "memory", "auto", "eventlog")


def read_output(r: _Reader, value: object, where: str) -> OutputSpec | None:
    if not isinstance(value, Mapping):
        r.add(where, f"must be an object (`output_select`, `store`, `inline_max_bytes`), got {json_type(value)}")
        return None
    out = OutputSpec(where)
    known = ("output_select", "select", "store", "inline_max_bytes")
    r.unknown(value, where, known, "an output block (output_select, store, inline_max_bytes)")
    select = value.get("output_select", value.get("select")) or []
    if isinstance(select, Mapping) and select.get("strategy") == "size_threshold":
        # NoETL's earlier form: only a threshold (`threshold_kb`), nothing selected.
        kb = select.get("threshold_kb", 64)
        if isinstance(kb, int | float) and not isinstance(kb, bool) and kb >= 0:
            out.inline_max_bytes = int(kb * 1024)
        select = []
    elif not isinstance(select, list) or not all(isinstance(p, str) for p in select):
        r.add(f"{where}.output_select", "must be a list of paths (`status`, `data.items`)")
        select = []
    out.select = tuple(select)
    store = value.get("store") or {}
    kind = store.get("kind", "kv") if isinstance(store, Mapping) else store
    if kind in ("gcs", "s3"):
        r.add(
            f"{where}.store.kind",
            f"a result stored in `{kind}` (cloud storage) is not supported: mcpipe keeps them in the run",
        )
    elif kind not in _STORES:
        r.add(f"{where}.store.kind", f"must be one of {', '.join(_STORES)}")
    out.store = str(kind)
    size = value.get("inline_max_bytes", out.inline_max_bytes)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        r.add(f"{where}.inline_max_bytes", "must be a number of bytes")
    else:
        out.inline_max_bytes = size
    return out


@dataclass
class PaginateSpec:
    """NoETL's success-side retry (``retry.on_success``: pagination and polling): the task runs again while
    ``while`` holds (at most ``max_attempts`` times), each time with ``next_call``'s fields laid over the
    request, the pages collected (``collect``); ``on_error`` retries a page that fails; ``per_iteration.sink``
    saves each page."""

    location: str
    while_: Any
    max_attempts: int = 100
    next_call: Mapping[str, Any] = field(default_factory=dict)
    strategy: str = "append"
    path: str | None = None
    into: str = "pages"
    sink: SaveSpec | None = None
    error_attempts: int = 1
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0


@dataclass
class TaskSpec:
    """One task of a step: a tool of ``kind`` with its own fields (``config``)."""

    name: str
    kind: str
    location: str
    config: dict[str, Any]
    rules: list[Rule] = field(default_factory=list)
    on_unmatched: str = "continue"
    save: SaveSpec | None = None
    """The task's own ``save`` (NoETL 1.x's iterator body): after the task, for each item."""
    paginate: PaginateSpec | None = None
    output: OutputSpec | None = None


@dataclass
class LoopSpec:
    """A step's loop: over ``items`` (a template or a list), each bound to ``iterator``."""

    items: Any
    iterator: str
    mode: str
    location: str
    max_in_flight: Any = None
    filter: Any = None


@dataclass
class ArcSpec:
    """An arc of ``next``: to ``target`` when ``when`` holds (None: always; ``otherwise``: when no arc
    before it in the list was taken); ``set`` mutates the variables when it is taken, ``data`` (the older
    layout's ``data``/``with``/``args``) gives the target step variables of its own."""

    target: str
    location: str
    when: Any = None
    otherwise: bool = False
    set: Mapping[str, Any] | None = None
    data: Mapping[str, Any] | None = None
    back: bool = False
    """It leads back to a step on the way from the entry (a cycle): taking it runs that step again."""
    case: bool = False
    """From a ``case`` entry (NoETL's v2 engine of 2025-12): its ``when`` is asked at each of the step's
    events (``call.done`` or ``call.error``, then ``step.exit``)."""
    retry: CaseRetry | None = None
    """A case's ``retry`` (an arc back to its own step): taken while the step has run fewer than
    ``max_attempts`` times."""


@dataclass(frozen=True)
class CaseRetry:
    """A case's ``then.retry`` (NoETL's v2 engine, ``_process_then_actions``): the step runs again, up to
    ``max_attempts`` runs in all (default 3), ``delay`` seconds after a failure (``backoff``: ``linear``,
    the default, waits ``delay * n`` before run ``n + 1``; ``exponential`` waits ``delay * 2 ** (n - 1)``)."""

    max_attempts: int = 3
    delay: float = 0.0
    backoff: str = "linear"


@dataclass
class StepSpec:
    """One workflow step, in either layout."""

    name: str
    location: str
    tasks: list[TaskSpec] = field(default_factory=list)
    pipeline: bool = False
    loop: LoopSpec | None = None
    arcs: list[ArcSpec] = field(default_factory=list)
    inclusive: bool = False
    set: Mapping[str, Any] | None = None
    set_location: str = ""
    input: Mapping[str, Any] | None = None
    admit: list[tuple[Any, bool, str]] = field(default_factory=list)
    """``spec.policy.admit.rules``: ``(when, allow, location)`` in order (``when`` None: ``else``)."""
    timeout_s: float | None = None
    save: SaveSpec | None = None
    """The step's ``save``/``sink``: after its tool (a loop step's: after its last item)."""
    result: str | None = None
    """NoETL 1.x: a step without a tool whose ``result`` is a template: that is its result."""
    result_location: str = ""
    output: OutputSpec | None = None
    """NoETL's result storage (``output``): what of the result later steps see (``output_select``), the
    rest behind a ``_ref``."""


@dataclass
class Doc:
    """A playbook read from either layout."""

    layout: str  # "v2" | "v1"
    name: str
    path: str
    description: str
    workload: dict[str, Any]
    steps: list[StepSpec]
    workbook: dict[str, TaskSpec]
    keychain: list[tuple[str, Mapping[str, Any]]]
    entry: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def is_v2(raw: Mapping[str, object]) -> bool:
    """Whether a decoded playbook is written in NoETL's current layout."""
    return raw.get("apiVersion") in V2_VERSIONS and raw.get("kind") == "Playbook"


_ITERATOR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def read_doc(raw: Mapping[str, object]) -> Doc:
    """The model of a decoded playbook (a mapping with a ``workflow`` list), its problems located."""
    r = _Reader()
    v2 = is_v2(raw)
    layout = "v2" if v2 else "v1"
    keys = V2_TOP if v2 else OLD_TOP
    for k in raw:
        if k in REFUSED_TOP:
            r.add(str(k), REFUSED_TOP[k])
        elif v2 and k in IGNORED_TOP:
            r.warnings.append(f"{k}: {IGNORED_TOP[k]}")
        elif k not in keys:
            r.add(str(k), f"unknown key `{k}`{did_you_mean(str(k), keys)}")
    meta = raw.get("metadata")
    name = path = description = ""
    if meta is not None:
        if not isinstance(meta, Mapping):
            r.add("metadata", f"must be an object, got {json_type(meta)}")
        else:
            name = r.name(meta.get("name"), "metadata.name") or ""
            if meta.get("path") is not None:
                path = r.name(meta.get("path"), "metadata.path") or ""
            description = str(meta.get("description") or "")
    elif v2:
        r.add("metadata", "is required")
    else:
        name = r.name(raw.get("name"), "name") or "" if "name" in raw else ""
        path = r.name(raw.get("path"), "path") or "" if "path" in raw else ""
        description = str(raw.get("description") or "")
        if not name:
            r.add("name", "is required (a playbook's `name`, or `metadata.name`)")
    path = path or name
    workload = r.obj(raw.get("workload") or {}, "workload") or {}
    keychain = _keychain(r, raw.get("keychain"))
    workbook = _workbook(r, raw.get("workbook"))
    steps: list[StepSpec] = []
    seen: dict[str, int] = {}
    workflow = raw.get("workflow")
    if not isinstance(workflow, list) or not workflow:
        r.add("workflow", f"must be a non-empty list of steps, got {json_type(workflow)}")
        workflow = []
    for i, s in enumerate(workflow):
        where = f"workflow[{i}]"
        if r.obj(s, where) is None:
            continue
        sname = s.get("step")
        if sname is None and not v2 and "name" in s and (s.get("type") != "workbook" or "task" in s):
            sname = s.get("name")
        sname = r.name(sname, f"{where}.step")
        if sname is None:
            continue
        if sname in seen:
            r.add(f"{where}.step", f"duplicate step `{sname}` (first at workflow[{seen[sname]}])")
            continue
        seen[sname] = i
        step = _v2_step(r, s, sname, where) if v2 else _old_step(r, s, sname, where)
        steps.append(step)
    entry = _entry(r, raw.get("executor"), steps, v2)
    names = {s.name for s in steps}
    for s in steps:
        # An arc to an `end` the workflow does not define ends the branch (NoETL 1.x skips it).
        s.arcs = [a for a in s.arcs if a.target in names or a.target != "end"]
        for a in s.arcs:
            if a.target in names:
                continue
            if not v2:
                # NoETL 1.x's broker enqueues a next step only when the workflow has it: the branch ends there.
                r.warnings.append(
                    f"{a.location}.step: unknown step `{a.target}`{did_you_mean(a.target, names)}: NoETL 1.x runs "
                    "nothing there (the branch ends), and so does mcpipe"
                )
            else:
                r.add(f"{a.location}.step", f"unknown step `{a.target}`{did_you_mean(a.target, names)}")
        if not v2:
            s.arcs = [a for a in s.arcs if a.target in names]
    return Doc(
        layout, name, path, description, dict(workload), steps, workbook, keychain, entry, r.problems, r.warnings
    )


def _entry(r: _Reader, executor: object, steps: list[StepSpec], v2: bool) -> str:
    """The first step: ``executor.spec.entry_step``, else ``start`` (the older layout), else the first."""
    if executor is not None:
        spec = executor.get("spec") if isinstance(executor, Mapping) else None
        entry = spec.get("entry_step") if isinstance(spec, Mapping) else None
        if entry is not None:
            if not any(s.name == entry for s in steps):
                r.add("executor.spec.entry_step", f"unknown step `{entry}`")
            return str(entry)
    if not v2 and any(s.name == "start" for s in steps):
        return "start"
    return steps[0].name if steps else ""


def _keychain(r: _Reader, value: object) -> list[tuple[str, Mapping[str, Any]]]:
    if value is None:
        return []
    if not isinstance(value, list):
        r.add("keychain", f"must be a list of entries, got {json_type(value)}")
        return []
    out = []
    for i, entry in enumerate(value):
        where = f"keychain[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            r.add(where, "an entry needs a `name`")
            continue
        out.append((where, entry))
    return out


def _workbook(r: _Reader, value: object) -> dict[str, TaskSpec]:
    """The workbook's actions by name: each a task (``type``/``tool``/``kind`` and its fields)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        r.add("workbook", f"must be a list of actions, got {json_type(value)}")
        return {}
    out: dict[str, TaskSpec] = {}
    for i, entry in enumerate(value):
        where = f"workbook[{i}]"
        if r.obj(entry, where) is None:
            continue
        key = "name" if "name" in entry or not isinstance(entry.get("task"), str) else "task"
        aname = r.name(entry.get(key), f"{where}.{key}")
        if aname is None:
            continue
        if aname in out:
            r.add(f"{where}.{key}", f"duplicate workbook action `{aname}`")
            continue
        task = _flat_task(r, entry, aname, where, ("name", "desc", "description", key))
        if task is not None:
            out[aname] = task
    return out


def _flat_task(r: _Reader, s: Mapping[str, object], name: str, where: str, control: tuple[str, ...]) -> TaskSpec | None:
    """A task written flat (the older layout, a workbook action): its kind from ``type``, a ``tool`` string
    or ``tool: {kind: ...}``, its fields the other keys."""
    tool = s.get("tool")
    if isinstance(tool, Mapping):
        return _task(r, tool, name, f"{where}.tool")
    kind = tool if isinstance(tool, str) else s.get("type", s.get("kind"))
    if not isinstance(kind, str) or not kind:
        r.add(f"{where}.type", "is required: the tool kind (`python`, `http`, `postgres`, ...)")
        return None
    config = {str(k): v for k, v in s.items() if k not in control and k not in ("type", "tool", "kind")}
    spec = s.get("spec")
    config.pop("spec", None)
    return _task_rest(r, TaskSpec(name, kind, where, config), spec, s.get("retry"))


def _task(r: _Reader, tool: Mapping[str, object], name: str, where: str) -> TaskSpec | None:
    kind = tool.get("kind")
    if not isinstance(kind, str) or not kind:
        r.add(f"{where}.kind", "is required: the tool kind (`python`, `http`, `postgres`, ...)")
        return None
    config = {str(k): v for k, v in tool.items() if k not in TASK_META}
    if kind in ("workbook", "secrets", "nats") and "name" in tool:
        # The workbook action it runs; the secret it reads; the object a `nats` tool stores (NoETL's executor
        # reads `name` from the tool's config, a pipeline task's label included).
        config["name"] = tool["name"]
    t = TaskSpec(name, kind, where, config)
    if "output" in tool:
        t.output = read_output(r, tool["output"], f"{where}.output")
    if "output_select" in config:
        t.output = read_output(r, {"output_select": config.pop("output_select")}, f"{where}.output_select")
    return _task_rest(r, t, tool.get("spec"), tool.get("retry"))


def _task_rest(r: _Reader, t: TaskSpec, spec: object, retry: object) -> TaskSpec:
    """What a task has however it is written: its own ``save``, its ``spec`` (a policy's rules) and NoETL 1.x's
    ``retry``; an ``assert`` is warned of."""
    where, config = t.location, t.config
    if t.kind != "save" and "save" in config:
        t.save = read_save(config.pop("save"), f"{where}.save", r.problems, CODE)
    if "assert" in config:
        config.pop("assert")
        r.warnings.append(f"{where}.assert: {IGNORED_STEP['assert']}")
    if spec is not None:
        _policy(r, t, spec, f"{where}.spec")
    _legacy_retry(r, t, retry, f"{where}.retry")
    return t


_RETRY_DELAYS = ("initial_delay", "backoff_multiplier", "max_delay", "jitter")
"""NoETL 1.x's names for a retry's delays (a case's retry, of NoETL's v2 engine, reads none of them)."""
_RETRY_KEYS = ("max_attempts", "backoff", *_RETRY_DELAYS, "retry_when", "stop_when", "retry_on")


def _legacy_retry(r: _Reader, t: TaskSpec, value: object, where: str) -> None:
    """NoETL 1.x's ``retry:`` (``max_attempts``, ``initial_delay``, ``backoff_multiplier``, ``max_delay``,
    ``retry_when``, ``stop_when``, ``retry_on``; or a number of attempts) as a retry rule."""
    t.config.pop("retry", None)
    if value is None or value is False:
        return
    if value is True:
        value = {}
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"max_attempts": value}
    if not isinstance(value, Mapping):
        r.add(
            where, "NoETL 1.x's retry is `{max_attempts, initial_delay, retry_when, ...}`, or `on_error`/`on_success`"
        )
        return
    if "on_success" in value or "on_error" in value:
        _unified_retry(r, t, value, where)
        return
    r.unknown(value, where, _RETRY_KEYS, "a retry (pagination with `{k}` is not supported)")
    attempts = r.whole(value.get("max_attempts", 3), f"{where}.max_attempts", 1, 100, 3)
    numbers = {}
    for k, default in (("initial_delay", 1.0), ("backoff_multiplier", 2.0), ("max_delay", 60.0)):
        numbers[k] = r.seconds(value.get(k, default), f"{where}.{k}", default)
    backoff = value.get("backoff")
    if isinstance(backoff, int | float) and not isinstance(backoff, bool):
        numbers["initial_delay"], numbers["backoff_multiplier"] = float(backoff), 1.0  # NoETL 1.x: a fixed delay
    elif backoff not in (None, "exponential"):
        r.add(f"{where}.backoff", "must be a number of seconds or `exponential`")
    retry_on = value.get("retry_on") or ()
    if not isinstance(retry_on, list | tuple) or not all(isinstance(x, str) for x in retry_on):
        r.add(f"{where}.retry_on", "must be a list of error kinds (`timeout`, `connection_error`, ...)")
        retry_on = ()
    rule = Rule(
        value.get("retry_when"),
        "retry",
        where,
        attempts,
        "multiplier",
        numbers["initial_delay"],
        legacy=True,
        stop_when=value.get("stop_when"),
        retry_on=tuple(retry_on),
        multiplier=numbers["backoff_multiplier"],
        max_delay=numbers["max_delay"],
    )
    t.rules.insert(0, rule)


def _unified_retry(r: _Reader, t: TaskSpec, value: Mapping[str, object], where: str) -> None:
    """NoETL's unified retry (``noetl/plugin/runtime/retry.py``, 2025-12): ``on_error`` (a page's error retries,
    as the older block) and ``on_success`` (the task runs again while ``while`` holds)."""
    r.unknown(value, where, ("on_error", "on_success"), "a retry with `on_error`/`on_success`")
    on_error = value.get("on_error")
    if on_error is not None:
        on_error = r.obj(on_error, f"{where}.on_error", " (`max_attempts`, `initial_delay`, ...)", got=False)
    if isinstance(on_error, Mapping) and "when" in on_error and "retry_when" not in on_error:
        # NoETL's RetryPolicy reads `retry_when`, never `when`: such a block retries on every error.
        r.warnings.append(
            f"{where}.on_error.when: NoETL's retry reads `retry_when`, not `when`: this block retries on every error"
        )
        on_error = {k: v for k, v in on_error.items() if k != "when"}
    success = value.get("on_success")
    if success is None:
        _legacy_retry(r, t, on_error, f"{where}.on_error")
        return
    at = f"{where}.on_success"
    if not isinstance(success, Mapping) or not isinstance(success.get("while"), str | bool):
        r.add(at, "`on_success` needs `while`: the condition to run the task again")
        return
    known = ("while", "max_attempts", "next_call", "collect", "per_iteration")
    r.unknown(success, at, known, "`on_success` (while, max_attempts, next_call, collect, per_iteration)")
    p = PaginateSpec(at, success["while"])
    p.max_attempts = r.whole(success.get("max_attempts", 100), f"{at}.max_attempts", 1, 10_000, p.max_attempts)
    next_call = success.get("next_call") or {}
    next_call = r.obj(next_call, f"{at}.next_call", " (`params`, `headers`, `url`, ...)", got=False)
    if next_call is not None:
        p.next_call = next_call
    collect = r.obj(success.get("collect") or {}, f"{at}.collect", " (`strategy`, `path`, `into`)", got=False) or {}
    p.strategy = str(collect.get("strategy", "append"))
    if p.strategy not in ("append", "replace", "merge"):
        r.add(f"{at}.collect.strategy", "must be append, replace or merge")
    path = collect.get("path")
    p.path = str(path) if path is not None else None
    p.into = str(collect.get("into", "pages"))
    per = success.get("per_iteration") or {}
    if isinstance(per, Mapping) and per.get("sink") is not None:
        p.sink = read_save(per["sink"], f"{at}.per_iteration.sink", r.problems, CODE)
    if isinstance(on_error, Mapping):
        probe = TaskSpec(t.name, t.kind, t.location, {})
        _legacy_retry(r, probe, on_error, f"{where}.on_error")
        if probe.rules:
            rule = probe.rules[0]
            p.error_attempts, p.initial_delay = rule.attempts, rule.delay
            p.multiplier, p.max_delay = rule.multiplier, rule.max_delay
    t.paginate = p


def _policy(r: _Reader, t: TaskSpec, spec: object, where: str) -> None:
    """A task's ``spec``: ``policy.rules`` (retry, jump, break, fail, continue), ``timeout`` kept."""
    if not isinstance(spec, Mapping):
        r.add(where, f"must be an object, got {json_type(spec)}")
        return
    for k, v in spec.items():
        if k == "policy":
            continue
        t.config.setdefault(str(k), v)  # NoETL's transitional layout wrote the tool's fields under `spec`
        if k != "timeout":
            r.warnings.append(
                f"{where}.{k}: NoETL 4.26 reads only `policy` and `timeout` under a tool's `spec` (its worker "
                f"drops the rest, and the tool fails without it); mcpipe reads it as the tool's `{k}`: move it "
                "up beside `kind`"
            )
    policy = spec.get("policy")
    if policy is None:
        return
    if not isinstance(policy, Mapping) or not isinstance(policy.get("rules"), list):
        r.add(f"{where}.policy", "must be an object with `rules: [...]`")
        return
    t.on_unmatched = str(policy.get("on_unmatched", "continue"))
    for j, rule in enumerate(policy["rules"]):
        at = f"{where}.policy.rules[{j}]"
        if r.obj(rule, at) is None:
            continue
        when: Any = None
        then = rule.get("then")
        if "else" in rule and rule["else"] is None and "then" in rule:
            rule = {"else": {"then": rule["then"]}}  # `- else:` with its `then:` beside it, as YAML reads it
        if "else" in rule:
            other = rule["else"]
            written = isinstance(other, Mapping) and ("then" in other or "do" in other)
            then = other.get("then", other) if written else None
            at = f"{at}.else"
        elif "when" in rule:
            when = rule["when"]
            if not isinstance(when, str | bool):
                r.add(f"{at}.when", f"must be a template string, got {json_type(when)}")
        if not isinstance(then, Mapping) or then.get("do") not in ("continue", "retry", "break", "jump", "fail"):
            r.add(f"{at}.then", "needs `do`: continue, retry, break, jump or fail")
            continue
        rule_set = then.get("set")
        if rule_set is not None:
            rule_set = r.obj(rule_set, f"{at}.then.set", got=False)
        attempts = r.whole(then.get("attempts", 3), f"{at}.then.attempts", 1, 100, 3)
        backoff = str(then.get("backoff", "none"))
        if backoff not in ("none", "linear", "exponential", "fixed"):
            r.add(f"{at}.then.backoff", "must be none, linear, exponential or fixed")
        delay = r.seconds(then.get("delay", 1.0), f"{at}.then.delay", 1.0, "a number of seconds")
        to = then.get("to")
        t.rules.append(Rule(when, str(then["do"]), at, attempts, backoff, delay, to, rule_set))


def _tool_of(r: _Reader, s: Mapping[str, object], sname: str, where: str, step: StepSpec) -> None:
    """The step's ``tool``: one task, or a pipeline of tasks (a list)."""
    tool = s.get("tool")
    if isinstance(tool, list):
        step.pipeline = True
        if not tool:
            r.add(f"{where}.tool", "a tool pipeline cannot be empty")
        labels: set[str] = set()
        for j, t in enumerate(tool):
            at = f"{where}.tool[{j}]"
            if not isinstance(t, Mapping) or "kind" not in t:
                r.add(at, "a task is `{name: LABEL, kind: KIND, ...}`")
                continue
            label = str(t.get("name") or f"task_{j}")
            if label in labels:
                r.add(f"{at}.name", f"duplicate task label `{label}`")
                continue
            labels.add(label)
            task = _task(r, t, label, at)
            if task is not None:
                step.tasks.append(task)
        for task in step.tasks:
            for rule in task.rules:
                if rule.do == "jump" and rule.to not in labels and str(rule.to).lower() not in _PREVIOUS:
                    r.add(f"{rule.location}.then.to", f"unknown task label `{rule.to}`{did_you_mean(rule.to, labels)}")
    elif isinstance(tool, Mapping):
        task = _task(r, tool, sname, f"{where}.tool")
        if task is not None:
            step.tasks.append(task)
    elif tool is not None and not isinstance(tool, str):
        r.add(f"{where}.tool", f"must be a tool (`{{kind: ...}}`) or a list of tasks, got {json_type(tool)}")


_PREVIOUS = {"previous", "prev", "_previous", "@previous"}


def _new_step(r: _Reader, s: Mapping[str, object], sname: str, where: str, v2: bool) -> StepSpec:
    """The step, its refused keys refused, its ignored ones warned of (``v2``: and its unknown ones refused)."""
    for k in s:
        if k in REFUSED_STEP:
            r.add(f"{where}.{k}", REFUSED_STEP[k])
        elif k in IGNORED_STEP:
            r.warnings.append(f"{where}.{k}: {IGNORED_STEP[k]}")
        elif v2 and k not in V2_STEP and k not in ("vars", "args", "type"):
            r.add(f"{where}.{k}", f"unknown key `{k}` of a step{did_you_mean(str(k), V2_STEP)}")
    return StepSpec(sname, where)


def _v2_step(r: _Reader, s: Mapping[str, object], sname: str, where: str) -> StepSpec:
    step = _new_step(r, s, sname, where, True)
    if "type" in s:
        r.add(f"{where}.type", "a `type:` step in a noetl.io/v2 playbook: NoETL itself refuses it (use `tool: {kind}`)")
    _tool_of(r, s, sname, where, step)
    if "args" in s:  # NoETL's v2 engine of 2025-12 (`Step.args`): the step's input arguments
        _input(r, s, "args", where, step)
    _after(r, s, where, step)
    if "tool" not in s:
        r.add(
            f"{where}.tool",
            "is required in a noetl.io/v2 step (`kind: noop` for a step that only routes); NoETL's own Step model "
            "requires it too",
        )
    _input(r, s, "input", where, step)
    _set(r, s, where, step)
    if "vars" in s:  # NoETL's older name for what `set` does after the step
        _set(r, s, where, step, key="vars")
    if s.get("spec") is not None:
        _step_spec(r, s["spec"], f"{where}.spec", step)
    if s.get("loop") is not None:
        step.loop = _loop(r, s["loop"], f"{where}.loop")
    if s.get("case") is not None:
        _case(r, s["case"], f"{where}.case", step)
    nxt = s.get("next")
    if nxt is not None:
        if isinstance(nxt, Mapping) and "arcs" in nxt:
            spec = r.obj(nxt.get("spec") or {}, f"{where}.next.spec", got=False) or {}
            mode = spec.get("mode", "exclusive")
            if mode not in ("exclusive", "inclusive"):
                r.add(f"{where}.next.spec.mode", f"must be exclusive or inclusive, got {mode!r}")
            step.inclusive = mode == "inclusive"
            on_no_match = spec.get("on_no_match", "complete")
            if on_no_match not in ("complete", "quiet"):
                r.add(f"{where}.next.spec.on_no_match", "must be complete or quiet")
            arcs = nxt.get("arcs")
            if not isinstance(arcs, list):
                r.add(f"{where}.next.arcs", f"must be a list of arcs, got {json_type(arcs)}")
                arcs = []
            for j, a in enumerate(arcs):
                at = f"{where}.next.arcs[{j}]"
                if not isinstance(a, Mapping) or not isinstance(a.get("step"), str):
                    r.add(at, "an arc is `{step: NAME, when: ...}`")
                    continue
                if "cond" in a:
                    # NoETL's Arc model (pydantic) drops an unknown field: the arc has no condition there.
                    r.warnings.append(
                        f"{at}.cond: NoETL's arcs read `when`, not `cond`: ignored, as NoETL ignores it (the arc "
                        "always holds)"
                    )
                known = ("step", "when", "set", "spec", "desc", "description", "cond")
                r.unknown(a, at, known, "an arc (step, when, set)")
                arc_set = a.get("set")
                if arc_set is not None:
                    arc_set = r.obj(arc_set, f"{at}.set", got=False)
                when = a.get("when")
                if when is not None and not isinstance(when, str | bool):
                    r.add(f"{at}.when", f"must be a template string, got {json_type(when)}")
                step.arcs.append(ArcSpec(a["step"], at, when, set=arc_set))
        else:  # the older list form, which NoETL 4 refuses; read as the older layout reads it
            step.arcs = [*step.arcs, *_old_next(r, nxt, f"{where}.next")]
            step.inclusive = True
    if any(a.case for a in step.arcs):
        # NoETL's engine: the first case whose `when` holds routes the step; its structural `next` only when
        # none did.
        for a in step.arcs:
            if not a.case:
                a.otherwise = True
        step.inclusive = False
    return step


def _case(r: _Reader, value: object, where: str, step: StepSpec) -> None:
    """NoETL's ``case`` (the v2 engine of 2025-12, ``CaseEntry``): ``[{when, then: {next: [...]}}]``, the
    first entry whose ``when`` holds at one of the step's events routes it to its ``next`` steps."""
    if not isinstance(value, list):
        r.add(where, "must be a list of `{when, then}` entries")
        return
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("when"), str):
            r.add(at, "a case entry is `{when: TEMPLATE, then: {next: [...]}}`")
            continue
        then = entry.get("then")
        actions = then if isinstance(then, list) else [then]
        for j, action in enumerate(actions):
            aat = f"{at}.then" if not isinstance(then, list) else f"{at}.then[{j}]"
            if not isinstance(action, Mapping):
                r.add(aat, "an action is `{next: [...]}`")
                continue
            for k in action:
                if k == "retry":
                    spec = _case_retry(r, action[k], f"{aat}.retry", step)
                    if spec is not None:
                        step.arcs.append(ArcSpec(step.name, f"{aat}.retry", entry["when"], case=True, retry=spec))
                elif k != "next":
                    r.add(f"{aat}.{k}", f"a case's `{k}` is not supported: mcpipe routes by `next` and `retry`")
            targets = action.get("next") or []
            for k, target in enumerate(targets if isinstance(targets, list) else [targets]):
                arc = _old_arc(r, target, f"{aat}.next[{k}]")
                if arc is not None:
                    arc.when, arc.case = entry["when"], True
                    step.arcs.append(arc)


def _case_retry(r: _Reader, value: object, where: str, step: StepSpec) -> CaseRetry | None:
    """A case's ``retry: {max_attempts, delay, backoff}``, as NoETL's v2 engine reads it (the 1.x names
    ``initial_delay``, ``backoff_multiplier`` are not read there: a warning says so)."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        r.add(where, f"a case's retry is `{{max_attempts, delay, backoff}}`, got {json_type(value)}")
        return None
    if step.loop is not None:
        r.add(where, "a case's retry of a loop step is not supported")
        return None
    attempts = value.get("max_attempts", 3)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        r.add(f"{where}.max_attempts", f"must be a whole number of at least 1, got {attempts!r}")
        return None
    delay = duration_s(value.get("delay", 0))
    if delay is None or delay > 3600:
        r.add(f"{where}.delay", f"a duration of at most an hour (`2`, `500ms`), got {value.get('delay')!r}")
        return None
    backoff = value.get("backoff", "linear")
    if backoff not in ("linear", "exponential"):
        r.add(f"{where}.backoff", f"`linear` or `exponential`, got {backoff!r}")
        return None
    for k in value:
        if k in _RETRY_DELAYS:
            r.warnings.append(f"{where}.{k}: NoETL's engine does not read it (a case's retry reads `delay`, `backoff`)")
        elif k not in ("max_attempts", "delay", "backoff"):
            r.add(f"{where}.{k}", f"unknown key `{k}` of a case's retry (max_attempts, delay, backoff)")
    return CaseRetry(attempts, delay, backoff)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def duration_s(value: object) -> float | None:
    """NoETL's durations (``30``, ``"30s"``, ``"5m"``, ``"250ms"``) in seconds, or None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(value) if isinstance(value, str) else None
    if m is None:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2) or "s"]
    return float(m.group(1)) * scale


def _step_spec(r: _Reader, spec: object, where: str, step: StepSpec) -> None:
    """A step's ``spec``: ``timeout`` and ``policy.admit.rules`` (whether the step runs when reached);
    ``policy.lifecycle``/``failure``/``emit`` are hints mcpipe has no use for."""
    if not isinstance(spec, Mapping):
        r.add(where, f"must be an object, got {json_type(spec)}")
        return
    for k, v in spec.items():
        if k == "timeout":
            step.timeout_s = duration_s(v)
            if step.timeout_s is None:
                r.add(f"{where}.timeout", f"a duration (`30s`, `5m`), got {v!r}")
        elif k == "policy" and isinstance(v, Mapping):
            for pk, pv in v.items():
                if pk == "admit":
                    _admit(r, pv, f"{where}.policy.admit", step)
                elif pk not in ("lifecycle", "failure", "emit"):
                    r.add(f"{where}.policy.{pk}", f"unknown key `{pk}` of a step's policy (admit)")
        elif k == "next_mode":
            # NoETL's parser of canonical v10 (noetl/core/dsl/v2/parser.py, 2026-03) raises on it too.
            r.add(f"{where}.{k}", "a step's `spec.next_mode` is refused by NoETL itself (use `next.spec.mode`)")
        else:
            r.add(f"{where}.{k}", f"a step's `spec.{k}` is not supported (timeout, policy.admit)")


def _admit(r: _Reader, admit: object, where: str, step: StepSpec) -> None:
    rules = admit.get("rules") if isinstance(admit, Mapping) else None
    if not isinstance(rules, list):
        r.add(where, "must be `{rules: [{when, then: {allow}}, ...]}`")
        return
    for j, rule in enumerate(rules):
        at = f"{where}.rules[{j}]"
        other = isinstance(rule, Mapping) and "else" in rule
        body = rule.get("else") if other else rule
        then = body.get("then") if isinstance(body, Mapping) else None
        if not isinstance(then, Mapping) or not isinstance(then.get("allow"), bool):
            r.add(at, "an admission rule is `{when: ..., then: {allow: true|false}}` (or `else`)")
            continue
        step.admit.append((None if other else rule.get("when"), then["allow"], at))


def _after(r: _Reader, s: Mapping[str, object], where: str, step: StepSpec) -> None:
    """The older step keys that act after the step: ``result`` (NoETL 1.x: values taken from the step's
    ``result``/``output`` into variables, as ``set`` does) and ``save``/``sink`` (the result persisted:
    :mod:`mcpipe.formats.noetl._save`)."""
    if "result" in s:
        if isinstance(s["result"], Mapping):
            _set(r, s, where, step, key="result")
        elif isinstance(s["result"], str) and not step.tasks:
            step.result = s["result"]  # NoETL 1.x's `end` step: the workflow's result, a template
            step.result_location = f"{where}.result"
        else:
            r.add(
                f"{where}.result",
                "a step's `result` (NoETL 1.x) maps names to templates (or, on a step without a tool, is its result)",
            )
    for key in ("save", "sink"):
        if s.get(key) is not None:
            step.save = read_save(s[key], f"{where}.{key}", r.problems, CODE)
    if s.get("output") is not None:
        step.output = read_output(r, s["output"], f"{where}.output")


def _mapping(r: _Reader, s: Mapping[str, object], key: str, where: str) -> Mapping[Any, Any] | None:
    """The step's ``key`` when it is an object (None: absent, or not an object: a problem)."""
    value = s.get(key)
    return r.obj(value, f"{where}.{key}") if value is not None else None


def _input(r: _Reader, s: Mapping[str, object], key: str, where: str, step: StepSpec) -> None:
    value = _mapping(r, s, key, where)
    if value is not None:
        step.input = {**(step.input or {}), **value}


def _set(r: _Reader, s: Mapping[str, object], where: str, step: StepSpec, key: str = "set") -> None:
    value = _mapping(r, s, key, where)
    if value is not None:
        step.set = {**(step.set or {}), **{str(k): v for k, v in value.items()}}
        step.set_location = f"{where}.{key}"


def _loop(r: _Reader, loop: object, where: str) -> LoopSpec | None:
    if not isinstance(loop, Mapping):
        r.add(where, f"must be an object, got {json_type(loop)}")
        return None
    if "cursor" in loop:
        r.add(f"{where}.cursor", "cursor loops (workers claiming rows from a database) are not supported")
        return None
    known = ("in", "iterator", "spec", "collection", "element", "mode", "filter")
    r.unknown(loop, where, known, "a loop (in, iterator, spec)")
    items = loop.get("in", loop.get("collection"))
    iterator = _iterator_name(r, items, loop.get("iterator", loop.get("element", "item")), where, ("in", "iterator"))
    spec = r.obj(loop.get("spec") or {}, f"{where}.spec", got=False) or {}
    r.unknown(spec, f"{where}.spec", ("mode", "max_in_flight", "policy"), "a loop's spec (mode, max_in_flight)")
    mode = _mode(r, spec.get("mode", loop.get("mode", "sequential")), f"{where}.spec.mode", "parallel")
    return LoopSpec(items, iterator, mode, where, spec.get("max_in_flight"), loop.get("filter"))


def _iterator_name(r: _Reader, items: object, name: object, where: str, keys: tuple[str, str]) -> str:
    """A loop's iterator ``name`` (``item`` when it is not a name); its ``items`` are required (``keys``: the
    loop's names for the two)."""
    if items is None:
        r.add(f"{where}.{keys[0]}", "is required: the list to loop over")
    if not isinstance(name, str) or not _ITERATOR.match(name):
        r.add(f"{where}.{keys[1]}", "must be a name (letters, digits, `_`)")
        return "item"
    return name


def _mode(r: _Reader, mode: object, where: str, named: str) -> str:
    """A loop's mode: ``sequential``, else ``parallel`` (``async`` too; ``named``: how its message names it)."""
    if mode == "async":
        mode = "parallel"
    if mode not in ("sequential", "parallel"):
        r.add(where, f"must be sequential or {named}, got {mode!r}")
        return "sequential"
    return str(mode)


_OLD_NEXT_DATA = ("data", "with", "args", "input")


def _old_step(r: _Reader, s: Mapping[str, object], sname: str, where: str) -> StepSpec:
    step = _new_step(r, s, sname, where, False)
    kind = s.get("type")
    tool = s.get("tool")
    _input(r, s, "input", where, step)
    if isinstance(tool, list | Mapping):
        _tool_of(r, s, sname, where, step)
    elif kind == "iterator" or tool == "iterator":
        _iterator(r, s, sname, where, step)
    elif kind is not None or isinstance(tool, str):
        if kind in ("start", "end", "noop", "router"):
            r.unknown(s, where, (*OLD_STEP_CONTROL, *IGNORED_STEP, *REFUSED_STEP, "name"), f"a `{kind}` step")
        else:
            control = (*OLD_STEP_CONTROL, *REFUSED_STEP, *IGNORED_STEP)
            task = _flat_task(r, s, sname, where, control)
            if task is not None:
                if task.kind == "workbook":
                    task = _workbook_ref(r, s, task, where)
                if task is not None:
                    step.tasks.append(task)
    else:
        known = (*OLD_STEP_CONTROL, "with", "data", *IGNORED_STEP, *REFUSED_STEP)
        r.unknown(s, where, known, "a step without a `type`")
    _set(r, s, where, step)
    _set(r, s, where, step, key="vars")
    _after(r, s, where, step)
    if not step.tasks and step.loop is None:
        for key in ("with", "data"):  # a router's values, for the steps after it
            if isinstance(s.get(key), Mapping):
                _set(r, s, where, step, key=key)
    if s.get("loop") is not None and step.loop is None:
        step.loop = _loop(r, s["loop"], f"{where}.loop")
        if step.loop is not None and not step.tasks:
            r.add(
                f"{where}.loop",
                "a loop whose body is its `next` steps is NoETL's 2025 draft engine's (read as it read it in its "
                "playbooks); beside `run:` steps no NoETL engine reads it",
            )
    step.arcs = _old_next(r, s.get("next"), f"{where}.next")
    step.inclusive = True  # every entry whose condition holds is taken (`else` when none before it was)
    return step


def _workbook_ref(r: _Reader, s: Mapping[str, object], task: TaskSpec, where: str) -> TaskSpec | None:
    """``type: workbook`` + ``name``/``task``: a workbook action by name (seed 004 also writes the action
    inline as ``task: {name, type, ...}``)."""
    ref = task.config.pop("task", None) or task.config.pop("name", None)
    if isinstance(ref, Mapping):
        inline = _flat_task(r, ref, str(ref.get("name") or task.name), f"{where}.task", ("name",))
        if inline is None:
            return None
        inline.name = task.name
        for k, v in task.config.items():
            inline.config.setdefault(k, v)
        return inline
    if not isinstance(ref, str) or not ref:
        r.add(f"{where}.name", "a `workbook` step names its action (`name:` or `task:`)")
        return None
    return TaskSpec(task.name, "workbook", where, {"name": ref, **task.config}, task.rules, task.on_unmatched)


def _iterator(r: _Reader, s: Mapping[str, object], sname: str, where: str, step: StepSpec) -> None:
    """``type: iterator`` (NoETL 1.x): ``collection``, ``element``, ``mode``, and the body ``task``."""
    items = s.get("collection")
    element = _iterator_name(r, items, s.get("element", "item"), where, ("collection", "element"))
    step.loop = LoopSpec(items, element, _mode(r, s.get("mode", "sequential"), f"{where}.mode", "async"), where)
    body = s.get("task")
    if isinstance(body, Mapping):
        task = _flat_task(r, body, sname, f"{where}.task", ("name", "desc", "description"))
        if task is not None and task.kind == "workbook":
            task = _workbook_ref(r, body, task, f"{where}.task")
        if task is not None:
            step.tasks.append(task)
    elif isinstance(body, str):
        step.tasks.append(TaskSpec(sname, "workbook", f"{where}.task", {"name": body}))
    else:
        r.add(f"{where}.task", "an iterator needs its body: `task: {type: ..., ...}`")
    # NoETL's broker of 2025-10 names a step by `step`, else `name` (`st.get("step") or st.get("name")`)
    named = ("name",) if "step" not in s else ()
    known = (*OLD_STEP_CONTROL, "collection", "element", "mode", "task", *named, *REFUSED_STEP, *IGNORED_STEP)
    r.unknown(s, where, known, "an iterator")


def _old_next(r: _Reader, nxt: object, where: str) -> list[ArcSpec]:
    """The older ``next``: a name, a list of names, ``{step, data|with|args}``, ``{when, then}``, ``{else}``."""
    if nxt is None:
        return []
    if isinstance(nxt, str):
        return [ArcSpec(nxt, where)]
    if isinstance(nxt, Mapping):
        nxt = [nxt]
    if not isinstance(nxt, list):
        r.add(where, f"must be a step name or a list, got {json_type(nxt)}")
        return []
    arcs: list[ArcSpec] = []
    for j, entry in enumerate(nxt):
        at = f"{where}[{j}]"
        if isinstance(entry, Mapping) and ("then" in entry or "else" in entry):
            otherwise = "else" in entry
            when = entry.get("when")  # `{then: [...]}` alone: always
            branch = entry.get("else" if otherwise else "then")
            if isinstance(branch, Mapping | str):
                branch = [branch]
            if not isinstance(branch, list):
                r.add(at, "`then`/`else` hold a list of steps")
                continue
            for k, b in enumerate(branch):
                bat = f"{at}.{'else' if otherwise else 'then'}[{k}]"
                arc = _old_arc(r, b, bat)
                if arc is not None:
                    arc.when, arc.otherwise = when, otherwise
                    arcs.append(arc)
        else:  # a name, or `{step, data|with|args}`
            arc = _old_arc(r, entry, at)
            if arc is not None:
                arcs.append(arc)
    return arcs


def _old_arc(r: _Reader, entry: object, at: str) -> ArcSpec | None:
    if isinstance(entry, str):
        return ArcSpec(entry, at)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("step"), str):
        r.add(at, "an entry of `next` is a step name or `{step: NAME, ...}`")
        return None
    data: dict[str, Any] = {}
    for k, v in entry.items():
        if k in ("step", "desc", "description"):
            continue
        if k in _OLD_NEXT_DATA:
            if r.obj(v, f"{at}.{k}") is None:
                continue
            data.update({str(kk): vv for kk, vv in v.items()})
        elif k in ("when", "condition"):
            continue
        else:
            data[str(k)] = v  # `{step: x, city: "{{ city }}"}`: a value passed to the step
    return ArcSpec(entry["step"], at, entry.get("when", entry.get("condition")), data=data or None)
