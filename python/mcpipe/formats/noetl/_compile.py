"""Parse, check and compile a playbook (seed 004) into a mcpipe pipeline plan.

Playbooks are the third front-end of the one plan (:mod:`mcpipe.plan`), beside ``mcp_pipe`` specs and
declared pipelines: the plan is a :class:`~mcpipe.plan.Pipeline` of :class:`~mcpipe.plan.Leaf` steps run by
the same scheduler: each resource a hidden ``resource`` step before its first use, each turn a
``model_turn`` step, each workflow ``type: workbook`` step an ``action`` step. An action is a step of a
declared kind (:mod:`mcpipe.kinds`), compiled and checked by the declared front-end's ``compile_step``; at run
time its Jinja fields are rendered and handed to the kind's own executor. Every problem is collected and
located (``mcp.turns[2].model: unknown model `gpt5` (did you mean `gpt-5`?)``).
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from mcpipe._describe import did_you_mean, json_type
from mcpipe._template import Template
from mcpipe.errors import Problem
from mcpipe.expr._jinja import GLOBALS, ROOTS, Compiled, compile_value, references
from mcpipe.formats.noetl._sqlbind import DIALECTS, SqlTemplate, sql_template
from mcpipe.formats.noetl._tmpl import CODE, Findings, has_jinja, problem_order
from mcpipe.kinds import StepPolicy
from mcpipe.models import Model, ModelConfig, Models, ToolSpec, params_problems
from mcpipe.plan import CompiledSpec, Leaf, Pipeline, RunFn

__all__ = ["CODE", "Action", "Part", "Playbook", "Turn", "action_types", "compile_playbook"]

_ALIASES = {"http": {"params": "query", "data": "body", "payload": "body", "endpoint": "url"}}
"""NoETL's names for some fields of a kind (``params`` for the query of an ``http`` action)."""


def action_types() -> tuple[str, ...]:
    """The types an action may have: every leaf step kind of declared pipelines (``http``, ``tool``,
    ``graphql``, ``command``, ``value``, ``transform``...); NoETL's tool kinds (``python``, ``postgres``,
    ``duckdb``, ``shell``) take NoETL's fields, mapped by :mod:`.toolkinds` (seed 004: "map to existing plugin
    types")."""
    from mcpipe.declared import KINDS

    return tuple(k for k in KINDS if k not in _UNWIRED)


_UNWIRED = frozenset({"sql", "sql_tx", "sql_await", "nats", "kafka", "grpc"})
"""Kinds that use connections the server owns (``[sql.NAME]`` backends, NATS, Kafka, gRPC channels), which
playbooks are not given yet: a declared pipeline using them can be called as a ``tool``."""


_TOP = ("apiVersion", "kind", "metadata", "workload", "workbook", "workflow", "mcp")
_META = ("path", "name", "description", "version", "labels")
_MCP = ("models", "tools", "resources", "prompts", "turns")
_TURN = ("name", "model", "system", "user", "tools_allowed", "parallel_tool_calls", "output_schema", "save", "params")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_STEP_ID = re.compile(r"[^A-Za-z0-9_-]")
_STORAGES = ("event_log",)


@dataclass
class Action:
    """A tool, resource or workbook action: a step kind (``type``), the kind's compiled step, and the
    Jinja templates of the kind's template fields it sets (``spec``)."""

    name: str
    type: str
    spec: Compiled
    location: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    step: Leaf[Any, Any] | None = None
    given: frozenset[str] = frozenset()
    """The kind's template fields the action sets (the others take their defaults)."""
    sql: SqlTemplate | None = None
    """A postgres or duckdb action's SQL as :mod:`mcpipe.formats.noetl._sqlbind` rewrote it (its values bound
    when it renders)."""


@dataclass
class Part:
    """One part of a turn's user message: ``text``, a resource, a prompt (with inputs) or an earlier turn."""

    kind: str  # text | resource | prompt | turn
    location: str
    text: Compiled | None = None
    name: str = ""
    inputs: Compiled | None = None
    given: frozenset[str] = frozenset()
    """A prompt part's ``inputs`` keys (the ``input.NAME`` it gives the prompt)."""


@dataclass
class Turn:
    """One model call: its model, messages (system and user parts), tools, output schema and save."""

    name: str
    location: str
    model_name: str
    model: Model | None
    system: Compiled | None
    parts: list[Part]
    tools: list[str]
    output_schema: dict[str, Any] | None
    save: str | None
    json_retries: int = 2
    max_tool_rounds: int = 8
    resources: list[str] = field(default_factory=list)
    parallel_tools: bool = False


@dataclass
class Playbook:
    """A checked playbook, ready to run.

    Attributes:
        name, path, description: from ``metadata``.
        workload: baseline variables (a call's arguments of the same names override them).
        tools, resources, workbook: actions by name.
        prompts: prompt templates by name (their source, and compiled).
        turns: by name, in order.
        plan: the compiled pipeline.
        inputs: the ``input.NAME`` names its templates read (the served tool's input properties).
        warnings: things worth saying that are not errors (a resource never used).
        policy: what ``http`` actions may reach.
    """

    name: str
    path: str
    description: str
    workload: dict[str, Any]
    tools: dict[str, Action]
    resources: dict[str, Action]
    workbook: dict[str, Action]
    prompts: dict[str, tuple[str, Compiled]]
    turns: dict[str, Turn]
    plan: CompiledSpec | None = None
    inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    policy: StepPolicy = field(default_factory=StepPolicy)
    registry: Any = None
    secrets_prefix: str = "MCPIPE_SECRET_"
    turn_steps: dict[str, str] = field(default_factory=dict)
    declared: dict[str, Any] = field(default_factory=dict)
    """The ``mcp`` root: ``mcp.models.NAME`` (``name``, ``provider``, ``params``) and ``mcp.turns.NAME``
    (``model``, ``tools_allowed``), as seed 004's generated steps read them."""

    def actions(self) -> tuple[Action, ...]:
        """Every action: the tools', the resources' and the workbook's."""
        return (*self.tools.values(), *self.resources.values(), *self.workbook.values())

    def tool_specs(self, names: list[str]) -> list[ToolSpec]:
        tools = [(n, self.tools[n]) for n in names]
        return [ToolSpec(n, a.description or f"{a.type} tool {n}", _input_schema(a)) for n, a in tools]


def _input_schema(a: Action) -> dict[str, Any]:
    """A tool's input schema: its own, else one derived from the ``input``/``args`` names its spec reads."""
    if a.input_schema:
        return a.input_schema
    names = sorted({name for root, name in references(a.spec.sources) if root in ("input", "args") and name})
    return {"type": "object", "properties": {n: {"type": "string"} for n in names}}


class _Problems(Findings):
    """The playbook's own structure checked (its YAML sections, names, references between them): every
    problem collected, located. Actions are checked by their step kinds (:func:`mcpipe.declared.compile_step`)."""

    def mapping(self, value: object, location: str, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> bool:
        if not isinstance(value, Mapping):
            self.add(location, f"must be an object, got {json_type(value)}")
            return False
        for k in value:
            if k not in keys:
                self.add(f"{location}.{k}", f"unknown key `{k}`{did_you_mean(k, keys)}")
        for k in required:
            if k not in value:
                self.add(f"{location}.{k}", "is required")
        return True

    def compile(self, value: object, location: str) -> Compiled:
        found: list[tuple[str, str]] = []
        c = compile_value(value, location, found)
        for loc, msg in found:
            self.add(loc, msg)
        return c

    def named_list(self, value: object, location: str, what: str) -> list[tuple[int, str, Mapping[str, Any]]]:
        """The entries of a named list (``mcp.tools``...), duplicates and nameless entries reported."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(location, f"must be a list, got {json_type(value)}")
            return []
        out = []
        first: dict[str, int] = {}
        for i, entry in enumerate(value):
            where = f"{location}[{i}]"
            if not isinstance(entry, Mapping):
                self.add(where, f"must be an object, got {json_type(entry)}")
                continue
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                self.add(f"{where}.name", f"every {what} needs a `name` (a non-empty string)")
                continue
            if name in first:
                self.add(f"{where}.name", f"duplicate {what} `{name}` (first at {location}[{first[name]}])")
                continue
            first[name] = i
            out.append((i, name, entry))
        return out


def compile_playbook(
    raw: Any,
    *,
    models: Models | None = None,
    policy: StepPolicy | None = None,
    tools: Container[str] | None = None,
) -> tuple[Playbook | None, list[Problem]]:
    """Check and compile a playbook document (already decoded from YAML).

    Args:
        raw: the document.
        models: the config's model presets (a playbook model without a preset is an ``openai`` one read
            from the standard environment variables, or ``provider: sampling``).
        policy: what ``http`` actions may reach (the config's ``outbound``).
        tools: the tool names ``tool`` actions may call (anything with ``in``), or None (not checked).

    Returns:
        The playbook (None when there are problems) and every problem, located.
    """
    c = _Problems()
    models = models or Models()
    if not c.mapping(raw, "", _TOP, ("metadata",)):
        return None, c.problems
    meta = raw.get("metadata")
    name = path = description = ""
    if c.mapping(meta, "metadata", _META, ("path", "name")):
        name = c.name(meta.get("name"), "metadata.name") or "" if "name" in meta else ""
        path = c.name(meta.get("path"), "metadata.path") or "" if "path" in meta else ""
        description = meta.get("description") or ""
        if name and not _SERVED_NAME.match(name):
            c.add("metadata.name", "a playbook's name is its tool name: letters, digits, `_`, `-`, `.` (at most 64)")
    workload = raw.get("workload") or {}
    if not isinstance(workload, Mapping):
        c.add("workload", f"must be an object, got {json_type(workload)}")
        workload = {}
    mcp = raw.get("mcp") or {}
    if not c.mapping(mcp, "mcp", _MCP):
        mcp = {}

    # --- models ---
    model_entries: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for i, mname, entry in c.named_list(mcp.get("models"), "mcp.models", "model"):
        where = f"mcp.models[{i}]"
        c.mapping(entry, where, ("name", "provider", "model", "params"))
        provider = entry.get("provider")
        if provider is not None and provider not in ("openai", "sampling"):
            c.add(f"{where}.provider", f"unknown provider `{provider}` (openai, sampling)")
        params = entry.get("params") or {}
        if not isinstance(params, Mapping):
            c.add(f"{where}.params", f"must be an object, got {json_type(params)}")
        else:
            c.problems += params_problems(params, f"{where}.params", CODE)
        model_entries[mname] = (where, entry)

    # --- tools, resources, workbook ---
    def actions(value: object, location: str, what: str, model_facing: bool) -> dict[str, Action]:
        out = {}
        taken: set[str] = set()
        for i, aname, entry in c.named_list(value, location, what):
            where = f"{location}[{i}]"
            keys = ("name", "type", "spec", "description", "input_schema")
            flat = what == "workbook action" and "spec" not in entry
            if not flat:
                c.mapping(entry, where, keys, ("type", "spec"))
            atype = entry.get("type")
            # An action with problems keeps its name, so what uses it is not reported as well.
            out[aname] = Action(aname, str(atype), c.compile(None, where), where)
            if atype not in action_types():
                if atype is not None:
                    c.add(f"{where}.type", _unsupported(atype))
                elif flat:
                    c.add(f"{where}.type", "is required")
                continue
            spec = entry.get("spec") if not flat else {k: v for k, v in entry.items() if k not in keys}
            spec_at = f"{where}.spec" if not flat else where
            if model_facing and not _TOOL_NAME.match(aname):
                c.add(f"{where}.name", "a tool name the model sees uses letters, digits, `_` and `-` (at most 64)")
            schema = entry.get("input_schema")
            if schema is not None and not (isinstance(schema, Mapping) and schema.get("type") == "object"):
                c.add(f"{where}.input_schema", "must be a JSON Schema with `type: object`")
                schema = None
            if not isinstance(spec, Mapping):
                c.add(spec_at, f"must be an object, got {json_type(spec)}")
                continue
            action = _action(
                c, aname, str(atype), spec, where, spec_at, _sid("action", aname, taken), policy, tools, workload
            )
            if action is None:
                continue
            action.description = str(entry.get("description") or "")
            action.input_schema = dict(schema) if schema is not None else None
            out[aname] = action
        return out

    tool_actions = actions(mcp.get("tools"), "mcp.tools", "tool", True)
    resource_actions = actions(mcp.get("resources"), "mcp.resources", "resource", False)
    workbook_actions = actions(raw.get("workbook"), "workbook", "workbook action", False)

    # --- prompts ---
    prompts: dict[str, tuple[str, Compiled]] = {}
    for i, pname, entry in c.named_list(mcp.get("prompts"), "mcp.prompts", "prompt"):
        where = f"mcp.prompts[{i}]"
        c.mapping(entry, where, ("name", "template", "description"), ("template",))
        template = entry.get("template")
        if isinstance(template, Mapping | list | str):  # a structured template: its strings are templates
            source = template if isinstance(template, str) else orjson.dumps(template).decode()
            prompts[pname] = (source, c.compile(template, f"{where}.template"))
        elif "template" in entry:
            c.add(f"{where}.template", f"must be a string or a structured template, got {json_type(template)}")

    # --- turns ---
    turns: dict[str, Turn] = {}
    turn_entries = c.named_list(mcp.get("turns"), "mcp.turns", "turn")
    if not turn_entries and "turns" not in mcp and raw.get("workflow") is None:
        c.add("mcp.turns", "a playbook needs at least one turn (or a `workflow`)")
    for i, tname, entry in turn_entries:
        where = f"mcp.turns[{i}]"
        c.mapping(entry, where, _TURN, ("model", "user"))
        mref = entry.get("model")
        model: Model | None = None
        json_retries, rounds = 2, 8
        if isinstance(mref, str):
            if mref in model_entries:
                _, m_entry = model_entries[mref]
                params = {**(m_entry.get("params") or {}), **(entry.get("params") or {})}
                preset = models.presets.get(mref)
                model = models.get(mref, provider=m_entry.get("provider"), model=m_entry.get("model"), params=params)
                cfg: ModelConfig = getattr(model, "config", preset or ModelConfig())
                json_retries, rounds = cfg.json_retries, cfg.max_tool_rounds
            else:
                c.add(f"{where}.model", f"unknown model `{mref}`{did_you_mean(mref, model_entries)}")
        elif "model" in entry:
            c.add(f"{where}.model", f"must be a model name, got {json_type(mref)}")
        system = c.compile(entry["system"], f"{where}.system") if entry.get("system") is not None else None
        parts = _parts(c, entry.get("user"), f"{where}.user", resource_actions, prompts, turns)
        allowed: list[str] = []
        ta = entry.get("tools_allowed")
        if ta is not None and not isinstance(ta, list):
            c.add(f"{where}.tools_allowed", f"must be a list of tool names, got {json_type(ta)}")
        for j, tool in enumerate(ta if isinstance(ta, list) else []):
            if not isinstance(tool, str) or tool not in tool_actions:
                c.add(f"{where}.tools_allowed[{j}]", f"unknown tool `{tool}`{did_you_mean(tool, tool_actions)}")
            elif tool in allowed:
                c.add(f"{where}.tools_allowed[{j}]", f"duplicate tool `{tool}`")
            else:
                allowed.append(tool)
        schema = entry.get("output_schema")
        if schema is not None and not isinstance(schema, Mapping):
            c.add(f"{where}.output_schema", "must be a JSON Schema object")
            schema = None
        save = entry.get("save")
        storage = save.get("storage") if isinstance(save, Mapping) else None
        if save is not None and storage not in _STORAGES:
            c.add(f"{where}.save", f"`save` takes `storage: event_log` (the run's events), got {save!r}")
        named, output = mref if isinstance(mref, str) else "", dict(schema) if schema is not None else None
        turn = Turn(tname, where, named, model, system, parts, allowed, output, storage, json_retries, rounds)
        parallel = entry.get("parallel_tool_calls", False)
        if not isinstance(parallel, bool):
            c.add(f"{where}.parallel_tool_calls", f"must be a boolean, got {json_type(parallel)}")
        turn.parallel_tools = parallel is True
        turn.resources = _used_resources(c, turn, prompts, resource_actions, turns, where)
        turns[tname] = turn

    pb = Playbook(
        name, path, description, dict(workload), tool_actions, resource_actions, workbook_actions, prompts, turns
    )
    pb.policy = policy or StepPolicy()
    _check_roots(c, pb)
    order = _order(c, raw.get("workflow"), pb)
    used = {r for t in turns.values() for r in t.resources}
    for rname, a in resource_actions.items():
        if rname not in used:
            c.warnings.append(f"{a.location}: resource `{rname}` is never used")
    if c.problems:
        return None, sorted(c.problems, key=problem_order)
    pb.warnings = c.warnings
    pb.declared = {
        "models": {
            n: {"name": n, "provider": e.get("provider"), "params": e.get("params") or {}}
            for n, (_w, e) in model_entries.items()
        },
        "turns": {n: {"name": n, "model": t.model_name, "tools_allowed": list(t.tools)} for n, t in turns.items()},
    }
    pb.plan = _plan(pb, order)
    pb.inputs = _inputs(pb)
    return pb, []


def _unsupported(atype: object) -> str:
    if atype in _UNWIRED:
        return (
            f"`{atype}` actions are not wired to the server's connections in playbooks yet: "
            "call a declared pipeline that uses it as a `tool`"
        )
    if atype in ("snowflake", "secrets", "playbook", "iterator"):
        return f"NoETL's `{atype}` type has no mcpipe step kind here: wrap the work in a `tool`"
    hint = did_you_mean(atype, action_types()) if isinstance(atype, str) else ""
    return f"unknown type `{atype}`{hint} (the types are the declared step kinds, see docs/playbooks.md)"


def _action(
    c: _Problems,
    name: str,
    kind: str,
    spec: Mapping[str, object],
    where: str,
    spec_at: str,
    sid: str,
    policy: StepPolicy | None,
    tools: Container[str] | None,
    workload: Mapping[str, object] | None = None,
) -> Action | None:
    """Compile an action onto the declared step kind ``kind``: its fields are checked by the kind, its
    template fields (``url``, ``args``, ``body``...) are Jinja templates here, rendered at run time and handed
    to the kind's executor as its inputs; the other fields are taken as written."""
    from mcpipe.declared import KINDS, StepScope, compile_step
    from mcpipe.formats.noetl import toolkinds

    if kind in toolkinds.KINDS:  # NoETL's own tool fields (seed 004: "mapped to existing plugin types")
        found: list[Problem] = []
        mapped = toolkinds.map_tool(kind, spec, spec_at, found)
        for p in found:
            c.add(p.location, p.message)
        if mapped is None:
            return None
        kind = str(mapped.get("kind", kind))
        spec = {k: v for k, v in mapped.items() if k not in ("kind", "id")}
    sql: SqlTemplate | None = None
    if kind in DIALECTS and kind in toolkinds.KINDS:
        field_name = "command" if kind == "postgres" else "commands"
        sql, why = sql_template(str(spec[field_name]), kind, workload)
        if why is not None:
            c.add(f"{spec_at}.{field_name}", why)
        spec = {**spec, field_name: sql.source}
    aliases = _ALIASES.get(kind, {})
    fields = {aliases.get(str(k), str(k)): v for k, v in spec.items()}
    template_names = KINDS[kind].templates
    jinja = {k: v for k, v in fields.items() if k in template_names}
    compiled = c.compile(jinja, spec_at)
    # The kind sees a constant field as it is (so a constant URL is checked against the allowlist at load)
    # and a Jinja one as a reference it cannot check statically; the Jinja renders at run time.
    placeholders = {k: {"$literal": v} if not has_jinja(v) else "${args}" for k, v in jinja.items()}
    raw = {**{k: v for k, v in fields.items() if k not in template_names}, **placeholders}
    raw.update(kind=kind, id=sid)
    step, problems = compile_step(raw, spec_at, StepScope(policy=policy or StepPolicy(), tools=tools))
    for p in problems:
        loc = p.location
        for alias, field_name in aliases.items():  # say it as it was written
            if f"{spec_at}.{field_name}" == loc and alias in spec:
                loc = f"{spec_at}.{alias}"
        c.add(loc, p.message)
    if step is None or not isinstance(step, Leaf):
        return None
    return Action(name, kind, compiled, where, step=step, given=frozenset(jinja), sql=sql)


def _parts(
    c: _Problems,
    value: object,
    where: str,
    resources: dict[str, Action],
    prompts: Mapping[str, object],
    turns: dict[str, Turn],
) -> list[Part]:
    if isinstance(value, str):
        value = [{"text": value}]
    if not isinstance(value, list) or not value:
        c.add(where, "must be a non-empty list of parts (`text: ...`, `use: resource:NAME`, `use: prompt:NAME`)")
        return []
    parts = []
    for j, p in enumerate(value):
        loc = f"{where}[{j}]"
        if isinstance(p, str):
            p = {"text": p}
        if not c.mapping(p, loc, ("text", "use", "prompt", "inputs", "with")):
            continue
        if "text" in p:
            parts.append(Part("text", loc, c.compile(p["text"], f"{loc}.text")))
            continue
        ref = p.get("use")
        if ref is None and isinstance(p.get("prompt"), str):
            ref = f"prompt:{p['prompt']}"
        if not isinstance(ref, str) or ":" not in ref:
            c.add(loc, "a part is `text: ...`, `use: resource:NAME`, `use: prompt:NAME` or `use: turn:NAME`")
            continue
        kind, _, name = ref.partition(":")
        name = name.strip()
        inputs = p.get("inputs", p.get("with"))
        at = f"{loc}.use" if "use" in p else f"{loc}.prompt"
        if kind == "resource":
            if name not in resources:
                c.add(at, f"unknown resource `{name}`{did_you_mean(name, resources)}")
            parts.append(Part("resource", loc, name=name))
        elif kind == "prompt":
            if name not in prompts:
                c.add(at, f"unknown prompt `{name}`{did_you_mean(name, prompts)}")
            compiled = c.compile(inputs, f"{loc}.inputs") if inputs is not None else None
            if inputs is not None and not isinstance(inputs, Mapping):
                c.add(f"{loc}.inputs", "must be an object")
            keys = frozenset(str(k) for k in inputs) if isinstance(inputs, Mapping) else frozenset()
            parts.append(Part("prompt", loc, name=name, inputs=compiled, given=keys))
        elif kind == "turn":
            if name not in turns:
                c.add(at, f"unknown turn `{name}` (a part can use an earlier turn){did_you_mean(name, turns)}")
            parts.append(Part("turn", loc, name=name))
        else:
            c.add(at, f"unknown reference `{ref}` (resource:NAME, prompt:NAME or turn:NAME)")
    return parts


def _sources_of(turn: Turn) -> tuple[str, ...]:
    compiled = (turn.system, *(c for p in turn.parts for c in (p.text, p.inputs)))
    return tuple(s for c in compiled if c is not None for s in c.sources)


def _used_resources(
    c: _Problems,
    turn: Turn,
    prompts: dict[str, tuple[str, Compiled]],
    resources: dict[str, Action],
    turns: dict[str, Turn],
    where: str,
) -> list[str]:
    used: list[str] = []
    sources = list(_sources_of(turn))
    for p in turn.parts:
        if p.kind == "resource" and p.name in resources:
            used.append(p.name)
        if p.kind == "prompt" and p.name in prompts:
            sources += prompts[p.name][1].sources
    for root, name in references(tuple(sources)):
        if root == "prompts" and name is not None and name in prompts:
            sources += prompts[name][1].sources
    for root, name in references(tuple(sources)):
        if root == "resources" and name is not None:
            if name in resources:
                used.append(name)
            else:
                c.add(where, f"a template reads `resources.{name}`, an unknown resource{did_you_mean(name, resources)}")
        elif root == "prompts" and name is not None and name not in prompts:
            c.add(where, f"a template reads `prompts.{name}`, an unknown prompt{did_you_mean(name, prompts)}")
        elif root == "turns" and name is not None and name not in turns:
            c.add(where, f"a template reads `turns.{name}`, not an earlier turn{did_you_mean(name, turns)}")
    return list(dict.fromkeys(used))


def _inputs(pb: Playbook) -> list[str]:
    """The ``input.NAME`` a call may give: every one the templates read, but those a prompt reads that each
    part using the prompt gives in its ``inputs`` (a prompt ``render``ed in a template counts as reading
    all of its own)."""

    def read(sources: tuple[str, ...]) -> set[str]:
        return {n for root, n in references(sources) if root == "input" and n}

    names = {n for _, srcs in _places(pb, prompts=False) for n in read(srcs)}
    rendered = {n for _, srcs in _places(pb) for root, n in references(srcs) if root == "prompts" and n}
    for pname, (_src, compiled) in pb.prompts.items():
        uses = [p for t in pb.turns.values() for p in t.parts if p.kind == "prompt" and p.name == pname]
        wanted = read(compiled.sources)
        names |= wanted if pname in rendered or not uses else set().union(*(wanted - p.given for p in uses))
    return sorted(names)


def _places(pb: Playbook, prompts: bool = True) -> list[tuple[str, tuple[str, ...]]]:
    """Where each of the playbook's templates is, with what it reads: its turns', actions' and (``prompts``)
    prompts'."""
    places = [(t.location, _sources_of(t)) for t in pb.turns.values()]
    places += [(a.location, a.spec.sources) for a in pb.actions()]
    return places + [(f"mcp.prompts.{n}", p[1].sources) for n, p in pb.prompts.items() if prompts]


def _check_roots(c: _Problems, pb: Playbook) -> None:
    """Every name a template starts with must be a root (``input``, ``workload``, ``secrets``...)."""
    for where, sources in _places(pb):
        for root, _name in references(sources):
            if root not in ROOTS and root not in GLOBALS:
                c.add(where, f"a template reads `{root}`, which is not defined (roots: {', '.join(ROOTS)})")
    for _rname, a in pb.resources.items():
        for root, name in references(a.spec.sources):
            if root in ("resources", "turns"):
                c.add(a.location, f"a resource's spec cannot read `{root}.{name}` (resources run before turns)")


def _order(c: _Problems, workflow: object, pb: Playbook) -> list[tuple[str, str, str]]:
    """What runs, in order: ``(kind, name, location)`` with kind ``turn`` or ``action``.

    Without ``workflow`` the turns run in order. With one, the chain from ``start`` following ``next``
    decides (``type: workbook`` + ``task`` runs a workbook action, ``type: mcp`` + ``turn`` a turn).
    """
    if workflow is None:
        return [("turn", n, t.location) for n, t in pb.turns.items()]
    if not isinstance(workflow, list):
        c.add("workflow", f"must be a list of steps, got {json_type(workflow)}")
        return []
    steps: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for i, s in enumerate(workflow):
        where = f"workflow[{i}]"
        if not c.mapping(s, where, ("step", "desc", "description", "next", "type", "task", "turn"), ("step",)):
            continue
        sname = s.get("step")
        if not isinstance(sname, str) or not sname:
            continue
        if sname in steps:
            c.add(f"{where}.step", f"duplicate step `{sname}` (first at workflow[{steps[sname][0]}])")
            continue
        steps[sname] = (i, s)
    if "start" not in steps:
        c.add("workflow", "needs a step named `start`")
        return []
    order: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    current: str | None = "start"
    while current is not None:
        if current in seen:
            c.add(f"workflow[{steps[current][0]}]", f"the chain of `next` comes back to `{current}` (a cycle)")
            break
        seen.add(current)
        i, s = steps[current]
        where = f"workflow[{i}]"
        kind = s.get("type")
        if kind == "workbook" or kind == "mcp" or "turn" in s:
            field, what, table = (
                ("task", "workbook action", pb.workbook) if kind == "workbook" else ("turn", "turn", pb.turns)
            )
            ref = s.get(field)
            if ref not in table:
                c.add(f"{where}.{field}", f"unknown {what} `{ref}`{did_you_mean(ref, table)}")
            else:
                order.append(("action" if field == "task" else "turn", str(ref), where))
        elif kind not in (None, "start", "end"):
            c.add(f"{where}.type", f"unknown step type `{kind}` (workbook, mcp, start, end)")
        nxt = s.get("next")
        if isinstance(nxt, list):
            if len(nxt) > 1:
                c.add(f"{where}.next", "more than one `next` (a fan-out) is not supported yet: chain the steps")
            nxt = nxt[0] if nxt else None
        if isinstance(nxt, Mapping):
            nxt = nxt.get("step")
        if nxt is not None and nxt not in steps:
            c.add(f"{where}.next", f"unknown step `{nxt}`{did_you_mean(nxt, steps)}")
            break
        current = nxt if isinstance(nxt, str) else None
    ordered = [n for k, n, _ in order if k == "turn"]
    for n, t in pb.turns.items():
        if n not in ordered:
            c.warnings.append(f"{t.location}: turn `{n}` is not reached by the workflow")
    for pos, n in enumerate(ordered):
        for p in pb.turns[n].parts:
            if p.kind == "turn" and p.name not in ordered[:pos]:
                c.add(p.location, f"turn `{p.name}` has not run before turn `{n}`")
    return order


def _sid(prefix: str, name: str, taken: set[str]) -> str:
    base = f"{prefix}_{_STEP_ID.sub('_', name)}"
    sid, n = base, 2
    while sid in taken:
        sid, n = f"{base}_{n}", n + 1
    taken.add(sid)
    return sid


def _plan(pb: Playbook, order: list[tuple[str, str, str]]) -> CompiledSpec:
    from mcpipe.formats.noetl import _run

    steps: list[Any] = []  # declared steps, which the scheduler runs beside mcp_pipe's own
    taken: set[str] = set()
    done: dict[str, str] = {}  # resource name -> step id
    for kind, name, where in order:
        if kind == "action":
            built = _run.ActionPlan(pb, pb.workbook[name], done.copy())
            steps.append(_step(_sid("task", name, taken), "action", where, built, _run.run_action))
            continue
        turn = pb.turns[name]
        for r in turn.resources:
            if r not in done:
                sid = _sid("resource", r, taken)
                done[r] = sid
                res = pb.resources[r]
                steps.append(_step(sid, "resource", res.location, _run.ActionPlan(pb, res, {}), _run.run_action))
        sid = _sid("turn", name, taken)
        pb.turn_steps[name] = sid
        steps.append(_step(sid, "model_turn", turn.location, _run.TurnPlan(pb, turn, done.copy()), _run.run_turn))
    plan = Pipeline(Template({}), tuple(steps), None, False, None, pb.name or "playbook")
    return CompiledSpec.of(plan)


_B = TypeVar("_B")
"""What a step's runner is given as ``built`` (an action's or a turn's plan)."""


def _step(sid: str, kind: str, location: str, plan: _B, runner: RunFn[None, _B]) -> Leaf[None, _B]:
    return Leaf(sid, location, kind=kind, fields=None, built=plan, run=runner)
