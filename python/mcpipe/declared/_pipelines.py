"""Declared pipelines as tools: the config's ``pipelines:`` entries and its ``outbound:`` policy.

Everything is checked and compiled once, at load: the entry's fields, its ``input_schema`` (a JSON Schema,
compiled into a validator), its steps (:func:`mcpipe.declared.compile_steps`), its ``output`` and
``content`` templates, the tools its steps call, and cycles between declared pipelines that call each
other. Every problem is reported at once, located like ``pipelines.charge.steps[2].expression``.

Each entry becomes a :class:`DeclaredPipelineTool`: an ordinary tool (``name``, ``description``,
``input_schema``, ``output_schema``, ``call``) whose call validates the arguments, runs the steps through
the scheduler (:func:`mcpipe.runtime.run_compiled`) and answers its ``output``/``content``. Its ``tool``
steps call through the registry the tools are bound to (the server's gateway), the same path as any call.

The server wires it in a few lines (see ``docs/declared-pipelines.md``, "Serving")::

    declared, problems = load_declared(raw["pipelines"], raw.get("outbound"), tools=known, limits=limits)
    gateway = Gateway([*sources, declared], ...)
    declared.bind(gateway)
"""

from __future__ import annotations

import binascii
import difflib
import re
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Annotated, Any

import msgspec
import orjson
import trio
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from mcpipe._describe import json_type, split_msgspec_error
from mcpipe._template import Template
from mcpipe.compile import DEFAULT_LIMITS, CompiledSpec, Limits, PipelinePlan
from mcpipe.declared._compile import ALL_KINDS, StepScope, _Compiler, compile_steps, walk
from mcpipe.declared._fastschema import compile_fast
from mcpipe.declared._mcpg import normalize_entry, relocate
from mcpipe.declared._policy import CommandPolicy, HttpPolicy, StepPolicy
from mcpipe.declared._step import DeclaredStep
from mcpipe.errors import Problem
from mcpipe.tools._base import ToolContext, ToolResult

__all__ = [
    "CONTENT_TYPES",
    "DeclaredPipelineTool",
    "DeclaredPipelines",
    "KnownTools",
    "OutboundConfig",
    "OutboundHttpConfig",
    "PipelineConfig",
    "load_declared",
    "load_outbound",
    "load_pipelines",
    "load_sql",
    "validate_declared",
]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_PIPE_TOOL = "mcp_pipe"
_INDEX = re.compile(r"\[(\d+)\]")
_MiB = 1024 * 1024

CONTENT_TYPES = ("text", "image", "audio", "resource", "resource_link")
"""The MCP content block types a ``content`` template may produce."""


class _Base(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


PositiveMs = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class PipelineConfig(_Base, kw_only=True):
    """One ``pipelines:`` entry: a tool built from steps.

    Attributes:
        name: the tool's name (letters, digits, ``_``, ``-``, ``.``; unique among every tool).
        description: what the tool does, as ``tools/list`` shows it.
        title: an optional display name.
        input_schema: a JSON Schema of the arguments (``type: object``); calls are validated against it
            before any step runs. Top-level ``default`` values fill absent arguments.
        output_schema: an optional JSON Schema of the ``output`` object (listed as ``outputSchema``, and
            each answer's structured output is checked against it).
        timeout_ms: the whole pipeline's deadline (capped by the server's ``pipe.timeout_ms``).
        steps: the steps (see the step reference).
        output: a template over ``args``, ``steps``, ``last``, ``context``; default: the last step's output.
            An object is answered as ``structuredContent`` plus its JSON as text; a string as text.
        content: a template giving the MCP content blocks of the answer directly (text, image, audio,
            resource, resource_link); with it, ``output`` (if given and an object) is the structured part.
    """

    name: str
    description: str = ""
    title: str | None = None
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    timeout_ms: PositiveMs | None = None
    steps: list[Any]
    output: Any = msgspec.UNSET
    content: Any = msgspec.UNSET


class OutboundHttpConfig(_Base, kw_only=True):
    """``outbound.http``: where ``http`` and ``graphql`` steps may connect (see :class:`HttpPolicy`)."""

    allowed_hosts: list[str] = []
    allow_private: bool = False
    max_response_bytes: PositiveInt = 10 * _MiB
    verify: bool | str = True
    timeout_ms: PositiveMs | None = 30_000


class OutboundConfig(_Base, kw_only=True):
    """The ``outbound:`` section: what declared steps may reach.

    Attributes:
        http: outbound HTTP for ``http``/``graphql`` steps.
        commands: name -> executable path, or name -> argv prefix; the only commands ``command`` steps run.
        command_env: the environment commands start from (default: the server's PATH, LANG, LC_ALL, TZ,
            HOME only).
        command_timeout_ms: the deadline of a ``command`` step that sets none.
        command_max_output_bytes: stdout or stderr past this fails the step.
        command_kill_grace_ms: SIGTERM, then SIGKILL after this, on timeout or cancellation.
        expression_max_ms: how long one JSONata evaluation may run.
    """

    http: OutboundHttpConfig = msgspec.field(default_factory=OutboundHttpConfig)
    commands: dict[str, str | list[str]] = {}
    command_env: dict[str, str] | None = None
    command_timeout_ms: PositiveMs | None = 60_000
    command_max_output_bytes: PositiveInt = 10 * _MiB
    command_kill_grace_ms: Annotated[float, msgspec.Meta(ge=0)] = 1000
    expression_max_ms: PositiveInt = 1000

    def policy(self) -> StepPolicy:
        """The :class:`StepPolicy` this section describes."""
        h = self.http
        return StepPolicy(
            http=HttpPolicy(
                allowed_hosts=tuple(h.allowed_hosts),
                allow_private=h.allow_private,
                max_response_bytes=h.max_response_bytes,
                verify=h.verify,
                timeout_ms=h.timeout_ms,
            ),
            command=CommandPolicy(
                commands=dict(self.commands),
                env=self.command_env,
                max_output_bytes=self.command_max_output_bytes,
                kill_grace_ms=self.command_kill_grace_ms,
                timeout_ms=self.command_timeout_ms,
            ),
            expression_max_ms=self.expression_max_ms,
        )


class KnownTools:
    """The tool names a config can call, for ``mcpipe check --config`` (where downstream servers are not
    connected): ``names`` exactly, plus any ``<prefix>.<tool>`` of a downstream server's prefix, which
    cannot be checked until that server is up.

    Args:
        names: the tools known now (built-ins, ``python_tools``; a registry or gateway works).
        prefixes: the downstream servers' prefixes.
    """

    def __init__(self, names: Container[str], prefixes: Iterable[str] = ()) -> None:
        self.names = names
        self.prefixes = tuple(f"{p}." for p in prefixes if p)

    @classmethod
    def of(cls, sources: Iterable[Any], prefixes: Iterable[str] = ()) -> KnownTools:
        """The names any of ``sources`` (tool sources: anything with ``get``) knows, plus ``prefixes``."""
        return cls(_InSources(tuple(sources)), tuple(prefixes))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.names or name.startswith(self.prefixes))


class _InSources:
    __slots__ = ("sources",)

    def __init__(self, sources: tuple[Any, ...]) -> None:
        self.sources = sources

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(s.get(name) is not None for s in self.sources)


class DeclaredPipelineTool:
    """One declared pipeline, served as a tool.

    Attributes:
        name, title, description, input_schema, output_schema: as ``tools/list`` shows them.
        location: where it was declared (``pipelines.charge``).
        compiled: the plan, compiled once, with its tool sites and leaf count.
        limits: the server's limits it runs under.
        registry: what its ``tool`` steps call through (set by :meth:`DeclaredPipelines.bind`).
    """

    __slots__ = (
        "_defaults",
        "_fast",
        "_has_content",
        "_has_output",
        "_output_validator",
        "_validator",
        "compiled",
        "description",
        "input_schema",
        "limits",
        "location",
        "name",
        "output_schema",
        "registry",
        "title",
    )

    def __init__(
        self,
        entry: PipelineConfig,
        compiled: CompiledSpec,
        location: str,
        limits: Limits,
        *,
        registry: Any = None,
    ) -> None:
        self.name = entry.name
        self.title = entry.title
        self.description = entry.description
        self.input_schema = entry.input_schema
        self.output_schema = entry.output_schema
        self.location = location
        self.compiled = compiled
        self.limits = limits
        self.registry = registry
        self._has_output = entry.output is not msgspec.UNSET
        self._has_content = entry.content is not msgspec.UNSET
        self._validator = _validator(entry.input_schema)
        self._fast = compile_fast(entry.input_schema)
        self._output_validator = _validator(entry.output_schema) if entry.output_schema is not None else None
        props = entry.input_schema.get("properties")
        self._defaults = (
            {k: v["default"] for k, v in props.items() if isinstance(v, Mapping) and "default" in v}
            if isinstance(props, Mapping)
            else {}
        )

    def __repr__(self) -> str:
        return f"<DeclaredPipelineTool {self.name}>"

    def check_args(self, args: Any) -> tuple[dict[str, Any], list[str]]:
        """The arguments with top-level defaults filled in, and every validation error, located
        (``args.amount: -1 is less than the minimum of 0``)."""
        if not isinstance(args, dict):
            return {}, [f"args: {_json(args)} is not of type 'object'"]
        missing = [k for k in self._defaults if k not in args]
        if missing:
            args = {**args, **{k: self._defaults[k] for k in missing}}
        fast = self._fast
        if fast is not None and fast(args):
            return args, []
        errors = sorted(self._validator.iter_errors(args), key=lambda e: (list(map(str, e.absolute_path)), e.message))
        return args, [f"{_path('args', e.absolute_path)}: {e.message}" for e in errors]

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate ``args``, run the steps, and answer the ``output``/``content`` (or the failure)."""
        args, errors = self.check_args(args)
        if errors:
            return ToolResult.error(f"invalid arguments for tool '{self.name}': " + "; ".join(errors))
        registry = self.registry
        if registry is None:
            return ToolResult.error(f"TOOL_FAILED: declared pipeline '{self.name}' is not bound to a tool registry")
        from mcpipe.runtime import run_compiled

        # A run of its own (a fresh pipeline id), on behalf of the same caller and request; the calling step
        # (if a step called it) stays known, so a run that asks the client keys its steps under it.
        run_ctx = ctx.for_step(None, ctx.step)
        answer = await run_compiled(self.compiled, registry, context=run_ctx, limits=self.limits, args=args)
        if not answer["ok"]:
            return ToolResult.error(f"{answer['error_code']}: {answer['error']}")
        return self.shape(answer["result"])

    def shape(self, result: dict[str, Any]) -> ToolResult:
        """The tool's answer from the resolved ``{"output": ..., "content": ...}``."""
        output = result["output"]
        if self._has_content:
            blocks, problem = content_blocks(result["content"])
            if problem is not None:
                return ToolResult.error(f"INVALID_OUTPUT: {self.location}.content: {problem}")
            structured = output if self._has_output and isinstance(output, dict) else None
            if structured is not None and (bad := self._check_output(structured)) is not None:
                return bad
            return ToolResult(blocks, structured)
        if isinstance(output, str):
            if self.output_schema is not None:
                return ToolResult.error(
                    f"INVALID_OUTPUT: {self.location}.output: a string, but the tool declares an output_schema"
                )
            return ToolResult.text(output)
        if isinstance(output, dict):
            if (bad := self._check_output(output)) is not None:
                return bad
            return ToolResult([{"type": "text", "text": orjson.dumps(output).decode()}], output)
        if self.output_schema is not None:
            return ToolResult.error(
                f"INVALID_OUTPUT: {self.location}.output: {json_type(output)}, but the output_schema needs an object"
            )
        return ToolResult.text(orjson.dumps(output).decode())

    def _check_output(self, structured: dict[str, Any]) -> ToolResult | None:
        if self._output_validator is None:
            return None
        errors = sorted(self._output_validator.iter_errors(structured), key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return None
        where = "; ".join(f"{_path('output', e.absolute_path)}: {e.message}" for e in errors)
        return ToolResult.error(f"INVALID_OUTPUT: the output does not match the output_schema: {where}")


class DeclaredPipelines:
    """The declared pipelines of a config, as a tool source (``get``, iteration, ``in``, ``names``).

    Put it among the gateway's sources, then :meth:`bind` the gateway, so the pipelines' ``tool`` steps
    call through it (auth, audit, cost) and can reach every tool: Python, downstream, another pipeline.
    """

    def __init__(self, tools: list[DeclaredPipelineTool] | None = None, policy: StepPolicy | None = None) -> None:
        self._tools = {t.name: t for t in tools or ()}
        self.policy = policy or StepPolicy()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the shared connections of ``nats``, ``grpc`` and ``kafka`` steps until cancelled (then close
        them): ``await nursery.start(declared.run)``, as the server does beside its other services."""
        await self.policy.connections.run(task_status=task_status)

    async def aclose(self) -> None:
        """Close the connections the steps opened (SQL pools, ...); the server calls this when it stops."""
        await self.policy.aclose()

    def bind(self, registry: Any) -> None:
        """Make every pipeline's ``tool`` steps call through ``registry`` (``get``/``allows``/``call``)."""
        for t in self._tools.values():
            t.registry = registry

    def get(self, name: str) -> DeclaredPipelineTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[DeclaredPipelineTool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"<DeclaredPipelines {self.names()}>"


# --- loading ------------------------------------------------------------------------------------------


def load_outbound(raw: Any, location: str = "outbound") -> tuple[StepPolicy, list[Problem]]:
    """Decode the ``outbound:`` section into a :class:`StepPolicy` (None or absent: nothing allowed).

    Returns:
        The policy (the default, allowing nothing, when there are problems) and every problem found.
    """
    if raw is None:
        return StepPolicy(), []
    problems: list[Problem] = []
    if isinstance(raw, Mapping) and isinstance(raw.get("http"), Mapping):
        # Decoded on its own first, so each of its unknown fields is reported where it is.
        http = _decode(raw["http"], OutboundHttpConfig, f"{location}.http", "outbound.http", problems)
        raw = {**raw, "http": msgspec.to_builtins(http) if http is not None else {}}
    section = _decode(raw, OutboundConfig, location, "the outbound section", problems)
    if section is None:
        return StepPolicy(), problems
    for name, target in section.commands.items():
        where = f"{location}.commands.{name}"
        argv = [target] if isinstance(target, str) else target
        if not argv or not argv[0]:
            problems.append(Problem(where, "INVALID_SPEC", "a command needs an executable (a path, or an argv list)"))
    for i, host in enumerate(section.http.allowed_hosts):
        if not host.strip():
            problems.append(Problem(f"{location}.http.allowed_hosts[{i}]", "INVALID_SPEC", "an empty host pattern"))
    return (section.policy() if not problems else StepPolicy()), problems


def load_sql(raw: Any, location: str = "sql", base_dir: str = ".") -> tuple[dict[str, Any], list[Problem]]:
    """Decode the ``sql:`` section (``[sql.NAME] url = ...``) into :class:`mcpipe.backends.sql.SqlBackend`s.

    Nothing connects here: each backend opens its connections on first use.

    Returns:
        The backends by name (None for one whose entry has problems) and every problem found.
    """
    from mcpipe.backends.sql import SqlBackend, SqlBackendConfig

    if raw is None:
        return {}, []
    problems: list[Problem] = []
    if not isinstance(raw, Mapping):
        return {}, [Problem(location, "INVALID_SPEC", f"expected a table of named backends, got {json_type(raw)}")]
    backends: dict[str, Any] = {}  # name -> SqlBackend, or None when its entry has problems
    for name, entry in raw.items():
        where = f"{location}.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(Problem(where, "INVALID_SPEC", "a backend name is letters, digits, `_`, `-`, `.`"))
            continue
        # A backend with problems is kept as None, so steps naming it are not also told it does not exist.
        backends[name] = None
        before = len(problems)
        config = _decode(entry, SqlBackendConfig, where, "a sql backend", problems)  # type: ignore[arg-type]
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
        if backends[name].kind == "postgresql":  # type: ignore[union-attr]
            try:
                import psycopg  # noqa: F401
            except ImportError:
                problems.append(
                    Problem(f"{where}.url", "INVALID_SPEC", "PostgreSQL needs psycopg: pip install 'mcpipe[postgres]'")
                )
    # The good ones are kept so the steps are checked against them too (the problems refuse the config).
    return backends, problems


def load_pipelines(
    raw_entries: Any,
    location_prefix: str = "pipelines",
    *,
    tools: Container[str] | None = None,
    policy: StepPolicy | None = None,
    limits: Limits | None = None,
) -> tuple[list[DeclaredPipelineTool], list[Problem]]:
    """Check and compile the ``pipelines:`` entries into tools.

    Args:
        raw_entries: the list of entries, as decoded from the config file.
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
    policy = policy or StepPolicy()
    limits = limits or DEFAULT_LIMITS
    problems: list[Problem] = []
    if raw_entries is None:
        return [], []
    if not isinstance(raw_entries, list):
        problems.append(
            Problem(location_prefix, "INVALID_SPEC", f"expected a list of pipelines, got {json_type(raw_entries)}")
        )
        return [], problems
    # Names first: every entry's location uses its name, and tool steps may call any pipeline.
    locations: list[str] = []
    names: dict[str, int] = {}
    for i, entry in enumerate(raw_entries):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        loc = f"{location_prefix}[{i}]"
        if isinstance(name, str) and _NAME.fullmatch(name):
            if name in names:
                problems.append(
                    Problem(
                        f"{loc}.name",
                        "INVALID_SPEC",
                        f"duplicate pipeline name '{name}' (also {location_prefix}.{name})",
                    )
                )
            else:
                names[name] = i
                loc = f"{location_prefix}.{name}"
        elif isinstance(entry, Mapping):
            if name is None:
                problems.append(Problem(f"{loc}.name", "INVALID_SPEC", "missing field `name`"))
            else:
                problems.append(
                    Problem(
                        f"{loc}.name",
                        "INVALID_SPEC",
                        f"invalid tool name {_json(name)} (letters, digits, `_`, `-`, `.`; 1-128)",
                    )
                )
        locations.append(loc)
    # mcpg's names (seed 003) are rewritten into mcpipe's first; later problems are located in the file.
    normalized: list[Any] = []
    moves: list[dict[str, str]] = []
    for i, entry in enumerate(raw_entries):
        entry, more, moved = normalize_entry(entry, locations[i], frozenset(ALL_KINDS))
        normalized.append(entry)
        problems.extend(more)
        moves.append(moved)
    raw_entries = normalized
    known = _Known(tools, frozenset(names)) if tools is not None else None
    out: list[DeclaredPipelineTool] = []
    for i, entry in enumerate(raw_entries):
        if entry is None:
            continue  # its mcpg `backend` was refused (reported)
        found: list[Problem] = []
        tool = _load_entry(entry, locations[i], known, tools, policy, limits, found)
        problems.extend(Problem(relocate(p.location, moves[i]), p.code, p.message) for p in found)
        if tool is not None and names.get(tool.name) == i:
            out.append(tool)
    for p in _cycles(raw_entries, locations, names):
        i = next((k for k, loc in enumerate(locations) if p.location.startswith(f"{loc}.")), -1)
        problems.append(Problem(relocate(p.location, moves[i]), p.code, p.message) if i >= 0 else p)
    problems = _sorted(problems, locations, raw_entries)
    return ([] if problems else out), problems


def load_declared(
    pipelines_raw: Any,
    outbound_raw: Any = None,
    *,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
    sql: Any = None,
    base_dir: str = ".",
) -> tuple[DeclaredPipelines, list[Problem]]:
    """The ``pipelines:``, ``outbound:`` and ``sql:`` sections of a config, as a tool source ready to serve.

    Args:
        sql: the ``sql:`` section (named SQL backends), if any.
        base_dir: what relative SQLite paths are relative to (the config file's directory).

    Returns:
        The pipelines (unbound: call :meth:`DeclaredPipelines.bind` with the gateway) and every problem;
        when there are problems the source is empty and the server must refuse to start. Close it
        (:meth:`DeclaredPipelines.aclose`) when done: it closes the connections its steps opened.
    """
    policy, problems = load_outbound(outbound_raw)
    backends, sql_problems = load_sql(sql, base_dir=base_dir)
    problems.extend(sql_problems)
    policy = replace(policy, sql=backends, base_dir=base_dir)
    pipelines, more = load_pipelines(pipelines_raw, tools=tools, policy=policy, limits=limits)
    problems = [*problems, *more]
    return DeclaredPipelines([] if problems else pipelines, policy), problems


def validate_declared(
    pipelines_raw: Any,
    outbound_raw: Any = None,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
    sql: Any = None,
) -> list[Problem]:
    """Every problem of the ``pipelines:``, ``outbound:`` and ``sql:`` sections, located (for ``mcpipe
    check --config`` and for the server's start-up, which refuses to start when there is any)."""
    return load_declared(pipelines_raw, outbound_raw, tools=tools, limits=limits, sql=sql)[1]


class _Known:
    """Tool names for the compiler: the declared pipelines' own names, then the other tools."""

    __slots__ = ("declared", "tools")

    def __init__(self, tools: Container[str], declared: frozenset[str]) -> None:
        self.tools = tools
        self.declared = declared

    def __contains__(self, name: object) -> bool:
        return name in self.declared or name in self.tools


def _load_entry(
    raw: Any,
    loc: str,
    known: Container[str] | None,
    others: Container[str] | None,
    policy: StepPolicy,
    limits: Limits,
    problems: list[Problem],
) -> DeclaredPipelineTool | None:
    if not isinstance(raw, Mapping):
        problems.append(Problem(loc, "INVALID_SPEC", f"a pipeline must be an object, got {json_type(raw)}"))
        return None
    entry = _decode(raw, PipelineConfig, loc, "a pipeline", problems, skip=("steps", "name"))
    name = raw.get("name")
    if isinstance(name, str) and _NAME.fullmatch(name):
        if name == _PIPE_TOOL:
            problems.append(Problem(f"{loc}.name", "INVALID_SPEC", f"`{_PIPE_TOOL}` is the server's own tool"))
        elif others is not None and name in others:
            problems.append(Problem(f"{loc}.name", "INVALID_SPEC", f"a tool named '{name}' already exists"))
    schema_ok = _check_schema(raw.get("input_schema"), f"{loc}.input_schema", problems, need_object=True)
    if raw.get("output_schema") is not None:
        schema_ok = _check_schema(raw.get("output_schema"), f"{loc}.output_schema", problems) and schema_ok
    scope = StepScope(policy=policy, tools=known, max_depth=limits.max_depth)
    if "steps" not in raw:
        problems.append(Problem(f"{loc}.steps", "INVALID_SPEC", "missing field `steps`"))
        return None
    steps, step_problems = compile_steps(raw["steps"], f"{loc}.steps", scope)
    problems.extend(step_problems)
    ret = _answer_template(raw, loc, _raw_ids(raw["steps"]), problems)
    if steps is None:
        return None
    count = sum(1 for _ in walk(steps))
    if count > limits.max_steps:
        problems.append(
            Problem(
                f"{loc}.steps", "LIMIT_EXCEEDED", f"the pipeline has {count} steps; the limit is {limits.max_steps}"
            )
        )
    if entry is None or ret is None or not schema_ok:
        return None
    plan = PipelinePlan(Template({}), steps, ret, False, entry.timeout_ms, loc)  # type: ignore[arg-type]
    sites = tuple((s.location, s.spec.tool) for s in walk(steps) if isinstance(s, DeclaredStep) and s.kind == "tool")  # type: ignore[attr-defined]
    leaves = sum(1 for s in walk(steps) if isinstance(s, DeclaredStep))
    return DeclaredPipelineTool(entry, CompiledSpec(plan, sites, leaves, count), loc, limits)


def _raw_ids(raw: Any) -> tuple[str, ...]:
    """The ids of a list of raw steps (given, else ``step<N>``), even when the steps do not compile."""
    if not isinstance(raw, list):
        return ()
    ids = []
    for i, step in enumerate(raw):
        given = step.get("id") if isinstance(step, Mapping) else None
        ids.append(given if isinstance(given, str) and given else f"step{i + 1}")
    return tuple(ids)


def _answer_template(
    raw: Mapping[str, Any], loc: str, ids: tuple[str, ...], problems: list[Problem]
) -> Template | None:
    """One template for the answer: ``{"output": <output or last.output>, "content": <content>}``, compiled
    where every step has finished (so any step, ``last``, ``args`` and ``context`` may be read)."""
    scope = StepScope(step_ids=ids, visible=frozenset(ids), has_last=True, var_names=frozenset())
    c = _Compiler()
    output = raw.get("output", {"$ref": "last.output"})
    out_t = c.template(output, f"{loc}.output", scope, [])
    content_t = None
    if "content" in raw:
        content_t = c.template(raw["content"], f"{loc}.content", scope, [])
        _check_static_content(raw["content"], f"{loc}.content", c)
    problems.extend(c.problems)
    if c.problems or out_t is None:
        return None
    # The parts are compiled on their own for their locations; the answer is one template resolved once.
    body: dict[str, Any] = {"output": output}
    if content_t is not None:
        body["content"] = raw["content"]
    return Template(body, step_ids=ids, location=loc)


_BLOCK_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # type: (required fields, optional fields); `type`, `annotations` and `_meta` are always allowed.
    "text": (("text",), ()),
    "image": (("data", "mimeType"), ()),
    "audio": (("data", "mimeType"), ()),
    "resource": (("resource",), ()),
    "resource_link": (("uri", "name"), ("title", "description", "mimeType", "size", "icons")),
}
_ALWAYS = ("type", "annotations", "_meta")


def _check_static_content(value: Any, loc: str, c: _Compiler) -> None:
    """Check what can be checked before a run: literal block types and field names."""
    items = [value] if isinstance(value, Mapping) and "type" in value else value if isinstance(value, list) else []
    for i, block in enumerate(items):
        where = f"{loc}[{i}]" if isinstance(value, list) else loc
        if not isinstance(block, Mapping) or "$ref" in block or "$literal" in block:
            continue
        kind = block.get("type")
        if not isinstance(kind, str) or "${" in kind or "{{" in kind:
            if "type" not in block:
                c.problem(f"{where}.type", f"a content block needs a `type` ({', '.join(CONTENT_TYPES)})")
            continue
        if kind not in _BLOCK_FIELDS:
            c.problem(
                f"{where}.type",
                f"unknown content type '{kind}'{_did_you_mean(kind, CONTENT_TYPES)} ({', '.join(CONTENT_TYPES)})",
            )
            continue
        required, optional = _BLOCK_FIELDS[kind]
        for f in required:
            if f not in block:
                c.problem(where, f"a `{kind}` block needs `{f}`")
        for f in block:
            if f not in required and f not in optional and f not in _ALWAYS:
                c.problem(f"{where}.{f}", f"unknown field `{f}` for a `{kind}` block")


def content_blocks(value: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Check a resolved ``content`` value: one block or a list of MCP content blocks.

    Returns:
        The blocks, and None; or ``[]`` and what is wrong (``[1].data: not base64``).
    """
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        return [], f"expected a list of content blocks, got {json_type(value)}"
    for i, block in enumerate(items):
        problem = _block_problem(block)
        if problem is not None:
            return [], f"[{i}]{problem}"
    return items, None


def _block_problem(block: Any) -> str | None:
    if not isinstance(block, dict):
        return f": a content block must be an object, got {json_type(block)}"
    kind = block.get("type")
    if kind not in _BLOCK_FIELDS:
        return f".type: unknown content type {_json(kind)} ({', '.join(CONTENT_TYPES)})"
    required, optional = _BLOCK_FIELDS[kind]
    for f in required:
        if f not in block:
            return f": a `{kind}` block needs `{f}`"
    for f in block:
        if f not in required and f not in optional and f not in _ALWAYS:
            return f".{f}: unknown field for a `{kind}` block"
    if kind == "text":
        return None if isinstance(block["text"], str) else f".text: expected a string, got {json_type(block['text'])}"
    if kind in ("image", "audio"):
        if not isinstance(block["mimeType"], str):
            return f".mimeType: expected a string, got {json_type(block['mimeType'])}"
        return _base64_problem(block["data"], ".data")
    if kind == "resource_link":
        for f in ("uri", "name"):
            if not isinstance(block[f], str):
                return f".{f}: expected a string, got {json_type(block[f])}"
        return None
    resource = block["resource"]
    if not isinstance(resource, dict):
        return f".resource: expected an object, got {json_type(resource)}"
    if not isinstance(resource.get("uri"), str):
        return ".resource.uri: an embedded resource needs a `uri` string"
    has_text, has_blob = "text" in resource, "blob" in resource
    if has_text == has_blob:
        return ".resource: an embedded resource has exactly one of `text` or `blob`"
    for f in resource:
        if f not in ("uri", "mimeType", "text", "blob", "annotations", "_meta"):
            return f".resource.{f}: unknown field for an embedded resource"
    if has_text:
        t = resource["text"]
        return None if isinstance(t, str) else f".resource.text: expected a string, got {json_type(t)}"
    return _base64_problem(resource["blob"], ".resource.blob")


def _base64_problem(value: Any, where: str) -> str | None:
    if not isinstance(value, str):
        return f"{where}: expected base64 text, got {json_type(value)}"
    try:
        binascii.a2b_base64(value.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        return f"{where}: not valid base64"
    return None


# --- checks -------------------------------------------------------------------------------------------


def _validator(schema: Mapping[str, Any]) -> Any:
    cls = validator_for(schema, default=Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _check_schema(schema: Any, loc: str, problems: list[Problem], *, need_object: bool = False) -> bool:
    """Is ``schema`` a valid JSON Schema (of an object, for an input schema)? Reports every problem."""
    if schema is None and need_object:
        return True  # the default, {"type": "object"}
    if not isinstance(schema, Mapping):
        return False  # the Struct reports the type
    cls = validator_for(schema, default=Draft202012Validator)
    ok = True
    for e in sorted(cls(cls.META_SCHEMA).iter_errors(schema), key=lambda e: list(map(str, e.absolute_path))):
        problems.append(Problem(_path(loc, e.absolute_path), "INVALID_SPEC", f"not a valid JSON Schema: {e.message}"))
        ok = False
    if ok and need_object and schema.get("type") != "object":
        problems.append(
            Problem(f"{loc}.type", "INVALID_SPEC", "an input schema describes the arguments object: `type: object`")
        )
        ok = False
    return ok


def _raw_tool_sites(raw: Any, loc: str) -> Iterator[tuple[str, str]]:
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


def _cycles(raw_entries: list[Any], locations: list[str], names: dict[str, int]) -> list[Problem]:
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
                        "INVALID_SPEC",
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
    raw: Any,
    struct: type[_Base],
    loc: str,
    what: str,
    problems: list[Problem],
    *,
    skip: tuple[str, ...] = (),
) -> Any:
    """Decode ``raw`` into ``struct``, reporting every unknown field and every field of the wrong type.

    Returns:
        The Struct decoded from the fields that are right (None when a required one is wrong); the
        problems tell whether anything was dropped.
    """
    if not isinstance(raw, Mapping):
        problems.append(Problem(loc, "INVALID_SPEC", f"{what} must be an object, got {json_type(raw)}"))
        return None
    known = frozenset(struct.__struct_encode_fields__)
    clean: dict[str, Any] = {}
    for k, v in raw.items():
        if k in known:
            clean[k] = v
        else:
            problems.append(Problem(f"{loc}.{k}", "INVALID_SPEC", f"unknown field `{k}`{_did_you_mean(str(k), known)}"))
    # msgspec stops at the first error: drop the field it names and go on, so every field is reported.
    while True:
        try:
            value = msgspec.convert(clean, struct)
        except msgspec.ValidationError as e:
            where, message = split_msgspec_error(str(e), loc)
            field = where[len(loc) + 1 :].split(".", 1)[0].split("[", 1)[0] if where.startswith(f"{loc}.") else ""
            if field not in skip and not (where == loc and any(f"`{s}`" in message for s in skip)):
                problems.append(Problem(where, "INVALID_SPEC", message))
            if not field or field not in clean:
                return None
            del clean[field]
            continue
        return value


def _sorted(problems: list[Problem], locations: list[str], raw_entries: list[Any]) -> list[Problem]:
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
                return (entry, order, tuple(int(x) if x.isdigit() else x for x in _INDEX.split(tail)))
        return (-1, -1, (where,))

    return sorted(problems, key=key)


def _path(base: str, path: Any) -> str:
    out = base
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _json(v: Any) -> str:
    try:
        return orjson.dumps(v).decode()
    except TypeError:
        return repr(v)


def _did_you_mean(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""
