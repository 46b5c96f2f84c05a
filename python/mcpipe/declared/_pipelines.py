"""Loading declared pipelines: the config's ``pipelines:`` entries and its ``outbound:`` policy.

Everything is checked and compiled once, at load: the entry's fields, its ``input_schema`` (a JSON Schema,
compiled into a validator), its steps (:func:`mcpipe.declared.compile_steps`), its ``output`` and
``content`` templates, the tools its steps call, and cycles between declared pipelines that call each
other. Every problem is reported at once, located like ``pipelines.charge.steps[2].expression``.

Each entry becomes a :class:`PlanTool` in the declared dialect: an ordinary tool (``name``, ``description``,
``input_schema``, ``output_schema``, ``call``) whose call validates the arguments, runs the steps through
the scheduler (:func:`mcpipe.runtime.run_compiled`) and answers its ``output``/``content``. Its ``tool``
steps call through the registry the tools are bound to (the server's gateway), the same path as any call.

The server wires it in a few lines (see ``docs/declared-pipelines.md``, "Serving")::

    declared, problems = load_declared(raw["pipelines"], raw.get("outbound"), tools=known, limits=limits)
    gateway = Gateway([*sources, declared], ...)   # its tool steps call through the gateway (ctx.tools)

The pieces: the entries' Structs (``_config``), the tool and the tool source (``_tool``), content blocks
(``_content``); this module checks and compiles.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe._util import PIPE_TOOL
from mcpipe.access import Credentials
from mcpipe.declared._answers import ANSWERS
from mcpipe.declared._compile import StepScope, _Compiler, compile_steps
from mcpipe.declared._config import (
    OutboundConfig,
    OutboundDuckdbConfig,
    OutboundHttpConfig,
    OutboundPythonConfig,
    PipelineConfig,
)
from mcpipe.declared._content import CONTENT_TYPES, check_static_content
from mcpipe.declared._model import CONTAINERS
from mcpipe.declared._plantool import PlanTool
from mcpipe.declared._tool import DeclaredPipelines, KnownTools, _json, _path, declared_tool
from mcpipe.errors import ErrorCode, Problem
from mcpipe.kinds import StepPolicy
from mcpipe.plan import DEFAULT_LIMITS, CompiledSpec, Limits, Pipeline, check_steps, decode_fields, problem_order

if TYPE_CHECKING:  # imported where a config has an `sql` section (sqlite3, the drivers)
    from mcpipe.access import CredentialConfig
    from mcpipe.backends.sql import SqlBackend, SqlBackendConfig
    from mcpipe.store.content import ContentStores

__all__ = [
    "CONTENT_TYPES",
    "DeclaredPipelines",
    "DeclaredSections",
    "KnownTools",
    "OutboundConfig",
    "OutboundHttpConfig",
    "PipelineConfig",
    "compile_declared",
    "load_declared",
    "load_outbound",
    "load_pipelines",
    "load_sql",
    "tool_problems",
    "validate_declared",
]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


# --- loading ------------------------------------------------------------------------------------------


def load_outbound(raw: object, location: str = "outbound") -> tuple[StepPolicy, list[Problem]]:
    """Decode the ``outbound:`` section into a :class:`StepPolicy` (None or absent: nothing allowed).

    Args:
        raw: the section as written, or decoded already (a config built in code).

    Returns:
        The policy (the default, allowing nothing, when there are problems) and every problem found.
    """
    problems: list[Problem] = []
    section = _outbound(raw, location, problems)
    return (section.policy() if section is not None and not problems else StepPolicy()), problems


def _outbound(raw: object, location: str, problems: list[Problem]) -> OutboundConfig | None:
    """The ``outbound:`` section decoded (None: absent, or it does not decode), its problems added to
    ``problems``: each unknown key and each value of the wrong type where it is, then what its types do not say
    (a command without an executable, an empty host pattern)."""
    if raw is None:
        return None
    if isinstance(raw, OutboundConfig):
        section: OutboundConfig | None = raw
    else:
        if isinstance(raw, Mapping) and isinstance(raw.get("http"), Mapping):
            # Decoded on its own first, so each of its unknown fields is reported where it is.
            http = _decode(raw["http"], OutboundHttpConfig, f"{location}.http", "outbound.http", problems)
            raw = {**raw, "http": msgspec.to_builtins(http) if http is not None else {}}
        for name, struct in (("python", OutboundPythonConfig), ("duckdb", OutboundDuckdbConfig)):
            if isinstance(raw, Mapping) and isinstance(raw.get(name), Mapping):
                sub = _decode(raw[name], struct, f"{location}.{name}", f"outbound.{name}", problems)
                raw = {**raw, name: msgspec.to_builtins(sub) if sub is not None else {}}
        section = _decode(raw, OutboundConfig, location, "the outbound section", problems)
    if section is None:
        return None
    for name, target in section.commands.items():
        where = f"{location}.commands.{name}"
        argv = [target] if isinstance(target, str) else target
        if not argv or not argv[0]:
            problems.append(
                Problem(where, ErrorCode.INVALID_SPEC, "a command needs an executable (a path, or an argv list)")
            )
    for i, host in enumerate(section.http.allowed_hosts):
        if not host.strip():
            problems.append(
                Problem(f"{location}.http.allowed_hosts[{i}]", ErrorCode.INVALID_SPEC, "an empty host pattern")
            )
    return section


def load_sql(
    raw: object, location: str = "sql", base_dir: str = "."
) -> tuple[dict[str, SqlBackend | None], list[Problem]]:
    """Decode the ``sql:`` section (``[sql.NAME] url = ...``) into :class:`mcpipe.backends.sql.SqlBackend`s.

    Nothing connects here: each backend opens its connections on first use.

    Args:
        raw: the section as written, or its entries decoded already (a config built in code).

    Returns:
        The backends by name (None for one whose entry has problems) and every problem found.
    """
    from mcpipe.backends.sql import SqlBackend, SqlBackendConfig

    if raw is None:
        return {}, []
    problems: list[Problem] = []
    if not isinstance(raw, Mapping):
        return {}, [Problem(location, "INVALID_SPEC", f"expected a table of named backends, got {json_type(raw)}")]
    backends: dict[str, SqlBackend | None] = {}  # None when its entry has problems
    for name, entry in raw.items():
        where = f"{location}.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(Problem(where, "INVALID_SPEC", "a backend name is letters, digits, `_`, `-`, `.`"))
            continue
        # A backend with problems is kept as None, so steps naming it are not also told it does not exist.
        backends[name] = None
        before = len(problems)
        config = (
            entry
            if isinstance(entry, SqlBackendConfig)
            else _decode(entry, SqlBackendConfig, where, "a sql backend", problems)
        )
        if config is None:
            continue
        try:
            backend = SqlBackend(name, config, base_dir)
        except ValueError as e:
            problems.append(Problem(f"{where}.url", "INVALID_SPEC", str(e)))
            continue
        if len(problems) > before:
            continue
        backends[name] = backend
        if backend.kind == "postgresql":
            try:
                import psycopg  # noqa: F401
            except ImportError:
                problems.append(
                    Problem(f"{where}.url", "INVALID_SPEC", "PostgreSQL needs psycopg: pip install 'mcpipe[postgres]'")
                )
    # The good ones are kept so the steps are checked against them too (the problems refuse the config).
    return backends, problems


def load_pipelines(
    raw_entries: object,
    location_prefix: str = "pipelines",
    *,
    tools: Container[str] | None = None,
    policy: StepPolicy | None = None,
    limits: Limits | None = None,
) -> tuple[list[PlanTool], list[Problem]]:
    """Check and compile the ``pipelines:`` entries into tools.

    Args:
        raw_entries: the list of entries, as decoded from the config file (or decoded :class:`PipelineConfig` entries: a
            config built in code).
        location_prefix: how locations start (entries are named by their ``name``:
            ``pipelines.charge.steps[2].expression``).
        tools: the other tools that exist (a registry, gateway or :class:`KnownTools`); names of the
            pipelines themselves are always known. None: tool names are not checked.
        policy: what steps may reach (hosts, commands); default: nothing.
        limits: the server's limits (steps per pipeline, nesting depth, concurrency, deadline).

    Returns:
        The tools (empty when there is any problem: a config is used whole or not at all) and every
        problem found, in the order of the file.
    """
    out, _, problems = _pipelines(raw_entries, location_prefix, tools, policy, limits)
    return out, problems


def _pipelines(
    raw_entries: object,
    location_prefix: str,
    tools: Container[str] | None,
    policy: StepPolicy | None,
    limits: Limits | None,
) -> tuple[list[PlanTool], list[PipelineConfig], list[Problem]]:
    """:func:`load_pipelines`, and the entries that decoded (whatever their steps' problems)."""
    policy = policy or StepPolicy()
    limits = limits or DEFAULT_LIMITS
    problems: list[Problem] = []
    if raw_entries is None:
        return [], [], []
    if not isinstance(raw_entries, list):
        problems.append(
            Problem(
                location_prefix, ErrorCode.INVALID_SPEC, f"expected a list of pipelines, got {json_type(raw_entries)}"
            )
        )
        return [], [], problems
    # An entry decoded already is compiled from what it holds, as written (its steps are kept as written).
    written: list[Any] = [msgspec.to_builtins(e) if isinstance(e, PipelineConfig) else e for e in raw_entries]
    # Names first: every entry's location uses its name, and tool steps may call any pipeline.
    locations: list[str] = []
    names: dict[str, int] = {}
    for i, entry in enumerate(written):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        loc = f"{location_prefix}[{i}]"
        if isinstance(name, str) and _NAME.fullmatch(name):
            if name in names:
                problems.append(
                    Problem(
                        f"{loc}.name",
                        ErrorCode.INVALID_SPEC,
                        f"duplicate pipeline name '{name}' (also {location_prefix}.{name})",
                    )
                )
            else:
                names[name] = i
                loc = f"{location_prefix}.{name}"
        elif isinstance(entry, Mapping):
            if name is None:
                problems.append(Problem(f"{loc}.name", ErrorCode.INVALID_SPEC, "missing field `name`"))
            else:
                problems.append(
                    Problem(
                        f"{loc}.name",
                        ErrorCode.INVALID_SPEC,
                        f"invalid tool name {_json(name)} (letters, digits, `_`, `-`, `.`; 1-128)",
                    )
                )
        locations.append(loc)
    known = _Known(tools, frozenset(names)) if tools is not None else None
    out: list[PlanTool] = []
    entries: list[PipelineConfig] = []
    for i, raw in enumerate(written):
        entry, tool = _load_entry(raw, locations[i], known, tools, policy, limits, problems)
        if entry is not None:
            entries.append(entry)
        if tool is not None and names.get(tool.name) == i:
            out.append(tool)
    problems.extend(_cycles(written, locations, names))
    _check_references(written, locations, problems)
    problems = _sorted(problems, locations, written)
    return ([] if problems else out), entries, problems


@dataclass(frozen=True, slots=True)
class DeclaredSections:
    """The config's ``pipelines``, ``outbound`` and ``sql`` sections, decoded by :func:`compile_declared` (the
    :class:`mcpipe.config.Config` of a load holds them): every entry, section and backend that decoded.

    Attributes:
        pipelines: the ``pipelines:`` entries (their steps as written: the plan compiled from them is the
            tools').
        outbound: the ``outbound:`` section (None: the config has none, and steps may reach nothing).
        sql: the ``[sql.NAME]`` backends' settings, by name.
    """

    pipelines: list[PipelineConfig] = field(default_factory=list)
    outbound: OutboundConfig | None = None
    sql: dict[str, SqlBackendConfig] = field(default_factory=dict)


def load_declared(
    pipelines_raw: object,
    outbound_raw: object = None,
    *,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
    sql: object = None,
    base_dir: str = ".",
    credentials: Mapping[str, CredentialConfig] | None = None,
    content: ContentStores | None = None,
) -> tuple[DeclaredPipelines, list[Problem]]:
    """The ``pipelines:``, ``outbound:`` and ``sql:`` sections of a config, as a tool source ready to serve
    (:func:`compile_declared`'s; the arguments are its).

    Returns:
        The pipelines (unbound: call :meth:`DeclaredPipelines.bind` with the gateway) and every problem;
        when there are problems the source is empty and the server must refuse to start. Close it
        (:meth:`DeclaredPipelines.aclose`) when done: it closes the connections its steps opened.
    """
    declared, _, problems = compile_declared(
        pipelines_raw,
        outbound_raw,
        tools=tools,
        limits=limits,
        sql=sql,
        base_dir=base_dir,
        credentials=credentials,
        content=content,
    )
    return declared, problems


def compile_declared(
    pipelines_raw: object,
    outbound_raw: object = None,
    *,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
    sql: object = None,
    base_dir: str = ".",
    credentials: Mapping[str, CredentialConfig] | None = None,
    content: ContentStores | None = None,
) -> tuple[DeclaredPipelines, DeclaredSections, list[Problem]]:
    """The ``pipelines:``, ``outbound:`` and ``sql:`` sections of a config decoded (each problem located, as
    ``outbound.http.allowed_hosts[1]``) and compiled once: the tool source, the sections as decoded, and every
    problem.

    Args:
        pipelines_raw: the ``pipelines:`` entries, as written (or decoded already: a config built in code).
        outbound_raw: the ``outbound:`` section, the same way (None: steps may reach nothing).
        tools: the other tools that exist (None: tool names are not checked).
        limits: the server's limits.
        sql: the ``sql:`` section (named SQL backends), if any.
        base_dir: what relative SQLite paths are relative to (the config file's directory).
        credentials: the ``[credentials]`` section (decoded), whose tokens ``http`` steps may present.
        content: the content stores ``store_content`` steps write to.

    Returns:
        The pipelines (empty when there are problems), the sections decoded, and every problem.
    """
    problems: list[Problem] = []
    outbound = _outbound(outbound_raw, "outbound", problems)
    policy = outbound.policy() if outbound is not None and not problems else StepPolicy()
    backends, sql_problems = load_sql(sql, base_dir=base_dir)
    problems.extend(sql_problems)
    policy = replace(
        policy, sql=backends, base_dir=base_dir, credentials=Credentials(credentials or {}), content=content
    )
    pipelines, entries, more = _pipelines(pipelines_raw, "pipelines", tools, policy, limits)
    problems = [*problems, *more]
    sections = DeclaredSections(entries, outbound, {n: b.config for n, b in backends.items() if b is not None})
    return DeclaredPipelines([] if problems else pipelines, policy), sections, problems


def validate_declared(
    pipelines_raw: object,
    outbound_raw: object = None,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
    sql: object = None,
) -> list[Problem]:
    """Every problem of the ``pipelines:``, ``outbound:`` and ``sql:`` sections, located (for ``mcpipe
    check --config`` and for the server's start-up, which refuses to start when there is any)."""
    return load_declared(pipelines_raw, outbound_raw, tools=tools, limits=limits, sql=sql)[1]


def tool_problems(declared: DeclaredPipelines, tools: Container[str]) -> list[Problem]:
    """What compiling ``declared`` against ``tools`` (the tool sources loaded since they were compiled) would add
    to the problems: a ``tool`` step naming a tool neither ``tools`` nor the pipelines have, a pipeline named like
    one of ``tools``; in the order of the file. The pipelines are not compiled again.
    """
    pipelines = declared.pipelines
    known = _Known(tools, frozenset(t.name for t in pipelines))
    problems: list[Problem] = []
    for t in pipelines:
        if t.name in tools:
            problems.append(
                Problem(f"{t.location}.name", ErrorCode.INVALID_SPEC, f"a tool named '{t.name}' already exists")
            )
        unknown = [
            Problem(f"{site}.tool", ErrorCode.UNKNOWN_TOOL, f"unknown tool '{name}'")
            for site, name in (t.compiled.tool_sites if t.compiled is not None else ())
            if name not in known
        ]
        problems += sorted(unknown, key=problem_order)
    return problems


class _Known:
    """Tool names for the compiler: the declared pipelines' own names, then the other tools."""

    __slots__ = ("declared", "tools")

    def __init__(self, tools: Container[str], declared: frozenset[str]) -> None:
        self.tools = tools
        self.declared = declared

    def __contains__(self, name: object) -> bool:
        return name in self.declared or name in self.tools


def _load_entry(
    raw: object,
    loc: str,
    known: Container[str] | None,
    others: Container[str] | None,
    policy: StepPolicy,
    limits: Limits,
    problems: list[Problem],
) -> tuple[PipelineConfig | None, PlanTool | None]:
    """One entry decoded (None: it does not decode) and compiled (None: it has problems), its problems added."""
    if not isinstance(raw, Mapping):
        problems.append(Problem(loc, ErrorCode.INVALID_SPEC, f"a pipeline must be an object, got {json_type(raw)}"))
        return None, None
    entry = _decode(raw, PipelineConfig, loc, "a pipeline", problems, skip=("steps", "name"))
    name = raw.get("name")
    if isinstance(name, str) and _NAME.fullmatch(name):
        if name == PIPE_TOOL:
            problems.append(Problem(f"{loc}.name", ErrorCode.INVALID_SPEC, f"`{PIPE_TOOL}` is the server's own tool"))
        elif others is not None and name in others:
            problems.append(Problem(f"{loc}.name", ErrorCode.INVALID_SPEC, f"a tool named '{name}' already exists"))
    schema_ok = _check_schema(raw.get("input_schema"), f"{loc}.input_schema", problems, need_object=True)
    if raw.get("output_schema") is not None:
        schema_ok = _check_schema(raw.get("output_schema"), f"{loc}.output_schema", problems) and schema_ok
    scope = StepScope(
        policy=policy,
        tools=known,
        max_depth=limits.max_depth,
        max_json_depth=limits.max_json_depth,
        max_text_bytes=limits.max_output_bytes,
    )
    if "steps" not in raw:
        problems.append(Problem(f"{loc}.steps", ErrorCode.INVALID_SPEC, "missing field `steps`"))
        return entry, None
    # Too many steps or too deep a nesting is found by a walk that stops at the limits, before compiling
    # (compiling costs per step, and the rest of such a pipeline is not worth reporting on).
    too_large = check_steps(
        raw["steps"], f"{loc}.steps", max_steps=limits.max_steps, max_depth=limits.max_depth, nested=_nested_steps
    )
    if too_large:
        problems.extend(too_large)
        return entry, None
    steps, step_problems = compile_steps(raw["steps"], f"{loc}.steps", scope)
    problems.extend(step_problems)
    ret = _answer_template(raw, loc, _raw_ids(raw["steps"]), problems)
    if steps is None:
        return entry, None
    if entry is not None and entry.ask_before_task and entry.task_support == "forbidden":
        problems.append(
            Problem(
                f"{loc}.ask_before_task",
                ErrorCode.INVALID_SPEC,
                'a pipeline with task_support = "forbidden" never becomes a task: drop ask_before_task',
            )
        )
        return entry, None
    if entry is not None and not _check_surface(entry, loc, problems):
        return entry, None
    if entry is None or ret is None or not schema_ok:
        return entry, None
    plan = Pipeline(Template({}), steps, ret, False, entry.timeout_ms, loc)
    return entry, declared_tool(entry, CompiledSpec.of(plan), loc, limits)


WATCH_ROOTS = frozenset({"subscriber", "event"})
"""What a watch's ``notify_if`` reads: the subscriber (its identity) and the event (``uri``)."""


def _check_surface(entry: PipelineConfig, loc: str, problems: list[Problem]) -> bool:
    """The entry's answer shape exists, and what it serves has what it needs (a resource its ``uri``, a
    resource template its ``uri_template``)."""
    ok = True
    if entry.answer is not None and entry.answer not in ANSWERS:
        known = ", ".join(sorted(ANSWERS))
        problems.append(Problem(f"{loc}.answer", ErrorCode.INVALID_SPEC, f"no answer shape '{entry.answer}' ({known})"))
        ok = False
    need = {"resource": "uri", "resource_template": "uri_template"}.get(entry.surface)
    if need is not None and not getattr(entry, need):
        problems.append(Problem(f"{loc}.{need}", ErrorCode.INVALID_SPEC, f"a {entry.surface} needs `{need}`"))
        ok = False
    for key, wanted in (("uri", "resource"), ("uri_template", "resource_template")):
        if getattr(entry, key) is not None and entry.surface != wanted:
            problems.append(
                Problem(f"{loc}.{key}", ErrorCode.INVALID_SPEC, f"`{key}` is for `surface: {wanted}` pipelines")
            )
            ok = False
    if entry.completions and entry.surface not in ("prompt", "resource_template"):
        problems.append(
            Problem(f"{loc}.completions", ErrorCode.INVALID_SPEC, "completions are a prompt's or a template's")
        )
        ok = False
    if entry.arguments and entry.surface != "prompt":
        problems.append(Problem(f"{loc}.arguments", ErrorCode.INVALID_SPEC, "`arguments` are a prompt's"))
        ok = False
    if entry.listing is not None and entry.surface not in ("resource", "resource_template"):
        problems.append(
            Problem(f"{loc}.listing", ErrorCode.INVALID_SPEC, "a listing is a resource's or a resource template's")
        )
        ok = False
    if entry.watch is not None:
        if entry.surface != "resource":
            problems.append(
                Problem(f"{loc}.watch", ErrorCode.INVALID_SPEC, "only a resource (one `uri`) can be watched")
            )
            ok = False
        elif entry.watch.poll_ms is None and not entry.watch.webhook_tokens:
            problems.append(
                Problem(f"{loc}.watch", ErrorCode.INVALID_SPEC, "a watch needs `poll_ms` or `webhook_tokens`")
            )
            ok = False
        elif entry.watch.notify_if is not None:
            from mcpipe.expr import CelExpr, ExpressionSyntaxError

            try:
                CelExpr.compile(entry.watch.notify_if, extra_roots=WATCH_ROOTS)
            except ExpressionSyntaxError as e:
                problems.append(Problem(f"{loc}.watch.notify_if", ErrorCode.INVALID_SPEC, e.reason))
                ok = False
    return ok


def _check_references(raw_entries: Sequence[object], locations: list[str], problems: list[Problem]) -> None:
    """Completion sources and listings name a ``hidden`` pipeline of the config."""
    hidden = {
        e.get("name")
        for e in raw_entries
        if isinstance(e, Mapping) and e.get("surface") == "hidden" and isinstance(e.get("name"), str)
    }
    for entry, loc in zip(raw_entries, locations, strict=True):
        if not isinstance(entry, Mapping):
            continue
        refs: list[tuple[str, Any]] = [(f"{loc}.listing", entry.get("listing"))]
        completions = entry.get("completions")
        if isinstance(completions, Mapping):
            refs += [
                (f"{loc}.completions.{k}.pipeline", v.get("pipeline"))
                for k, v in completions.items()
                if isinstance(v, Mapping)
            ]
        for where, name in refs:
            if isinstance(name, str) and name not in hidden:
                problems.append(
                    Problem(where, ErrorCode.INVALID_SPEC, f"no pipeline '{name}' with `surface: hidden` in the config")
                )


def _nested_steps(raw: object) -> tuple[str, list[Any]] | None:
    """A declared container's own steps (``kind: parallel`` or ``kind: pipe``, both under ``steps``)."""
    if isinstance(raw, Mapping) and raw.get("kind") in CONTAINERS and isinstance(raw.get("steps"), list):
        return ".steps", raw["steps"]
    return None


def _raw_ids(raw: object) -> tuple[str, ...]:
    """The ids of a list of raw steps (given, else ``step<N>``), even when the steps do not compile."""
    if not isinstance(raw, list):
        return ()
    ids = []
    for i, step in enumerate(raw):
        given = step.get("id") if isinstance(step, Mapping) else None
        ids.append(given if isinstance(given, str) and given else f"step{i + 1}")
    return tuple(ids)


def _answer_template(
    raw: Mapping[str, object], loc: str, ids: tuple[str, ...], problems: list[Problem]
) -> Template | None:
    """One template for the answer: ``{"output": <output or last.output>, "content": <content>}``, compiled
    where every step has finished (so any step, ``last``, ``args`` and ``context`` may be read)."""
    scope = StepScope(step_ids=ids, visible=frozenset(ids), has_last=True, var_names=frozenset())
    c = _Compiler(scope)
    output = raw.get("output", {"$ref": "last.output"})
    out_t = c.template(output, f"{loc}.output", scope, [])
    content_t = None
    if "content" in raw:
        content_t = c.template(raw["content"], f"{loc}.content", scope, [])
        check_static_content(raw["content"], f"{loc}.content", c.problem)
    problems.extend(c.problems)
    if c.problems or out_t is None:
        return None
    # The parts are compiled on their own for their locations; the answer is one template resolved once.
    body: dict[str, Any] = {"output": output}
    if content_t is not None:
        body["content"] = raw["content"]
    return Template(body, step_ids=ids, location=loc)


# --- checks -------------------------------------------------------------------------------------------


def _check_schema(schema: object, loc: str, problems: list[Problem], *, need_object: bool = False) -> bool:
    """Is ``schema`` a valid JSON Schema (of an object, for an input schema)? Reports every problem."""
    if schema is None and need_object:
        return True  # the default, {"type": "object"}
    if not isinstance(schema, Mapping):
        return False  # the Struct reports the type
    from jsonschema import Draft202012Validator  # on first use: jsonschema is slow to import
    from jsonschema.validators import validator_for

    cls = validator_for(schema, default=Draft202012Validator)
    ok = True
    for e in sorted(cls(cls.META_SCHEMA).iter_errors(schema), key=lambda e: list(map(str, e.absolute_path))):
        problems.append(
            Problem(_path(loc, e.absolute_path), ErrorCode.INVALID_SPEC, f"not a valid JSON Schema: {e.message}")
        )
        ok = False
    if ok and need_object and schema.get("type") != "object":
        problems.append(
            Problem(
                f"{loc}.type", ErrorCode.INVALID_SPEC, "an input schema describes the arguments object: `type: object`"
            )
        )
        ok = False
    return ok


def _raw_tool_sites(raw: object, loc: str) -> Iterator[tuple[str, str]]:
    """``(location, tool)`` of every ``tool`` step in raw steps (compiled or not), nested ones included."""
    if not isinstance(raw, list):
        return
    for i, step in enumerate(raw):
        if not isinstance(step, Mapping):
            continue
        where = f"{loc}[{i}]"
        kind = step.get("kind")
        if kind == "tool" and isinstance(step.get("tool"), str):
            yield where, step["tool"]
        elif kind in ("parallel", "pipe"):
            yield from _raw_tool_sites(step.get("steps"), f"{where}.steps")


def _cycles(raw_entries: Sequence[object], locations: list[str], names: dict[str, int]) -> list[Problem]:
    """A problem at every ``tool`` step whose call leads back to its own pipeline."""
    calls: dict[str, list[tuple[str, str]]] = {}
    for name, i in names.items():
        entry = raw_entries[i]
        found = _raw_tool_sites(entry.get("steps") if isinstance(entry, Mapping) else None, f"{locations[i]}.steps")
        calls[name] = [(where, tool) for where, tool in found if tool in names]
    problems = []
    for name, sites in calls.items():
        for where, callee in sites:
            path = _path_between(calls, callee, name)
            if path is not None:
                cycle = " -> ".join([name, *path])
                problems.append(
                    Problem(
                        f"{where}.tool",
                        ErrorCode.INVALID_SPEC,
                        f"calling '{callee}' makes a cycle ({cycle}): declared pipelines cannot call themselves",
                    )
                )
    return problems


def _path_between(calls: dict[str, list[tuple[str, str]]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of calls from ``start`` to ``goal`` (both included), or None."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if node == goal:
            chain = []
            at: str | None = node
            while at is not None:
                chain.append(at)
                at = previous[at]
            return chain[::-1]
        for _, callee in calls.get(node, ()):
            if callee not in previous:
                previous[callee] = node
                queue.append(callee)
    return None


# --- helpers ------------------------------------------------------------------------------------------


def _decode(
    raw: object,
    struct: type[msgspec.Struct],
    loc: str,
    what: str,
    problems: list[Problem],
    *,
    skip: tuple[str, ...] = (),
) -> Any:
    """Decode ``raw`` into ``struct``, reporting every unknown field and every field of the wrong type."""

    def problem(where: str, message: str) -> None:
        problems.append(Problem(where, ErrorCode.INVALID_SPEC, message))

    return decode_fields(raw, struct, loc, what, problem, every_error=True, skip=skip)


def _sorted(problems: list[Problem], locations: list[str], raw_entries: Sequence[object]) -> list[Problem]:
    """File order: entries as written (whatever their names), their fields as written, then natural order."""
    rank = {loc: i for i, loc in enumerate(locations)}
    fields = [list(e) if isinstance(e, Mapping) else [] for e in raw_entries]
    # Longest first: `pipelines.billing.charge` is not inside `pipelines.billing`.
    by_length = sorted(rank.items(), key=lambda item: -len(item[0]))

    def key(p: Problem) -> tuple[Any, ...]:
        where = p.location
        for loc, entry in by_length:
            if where == loc or where.startswith((f"{loc}.", f"{loc}[")):
                tail = where[len(loc) :].lstrip(".")
                name = re.split(r"[.\[]", tail, maxsplit=1)[0]
                order = fields[entry].index(name) if name in fields[entry] else -1
                return (entry, order, problem_order(Problem(tail, "", "")))
        return (-1, -1, (where,))

    return sorted(problems, key=key)
