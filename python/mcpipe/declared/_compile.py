"""Compile declared steps: validate the fields, compile templates and expressions, check references.

Two entry points:

- :func:`compile_steps` compiles a whole list (a pipeline's ``steps``): it assigns default ids, checks ids
  are unique, compiles each step, and rejects references to unknown, later or sibling steps. This is what
  the config loader calls for each pipeline.
- :func:`compile_step` compiles one step given a :class:`StepScope` (what it may see); with
  ``scope.visible`` None it checks nothing about step references and leaves that to the caller, who gets
  every ``(location, reference)`` in ``step.references``.

Both collect every problem (a :class:`mcpipe.Problem` with its full location, e.g.
``pipelines.charge.steps[2].expression``) instead of stopping at the first.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import orjson

from mcpipe._describe import json_type, split_msgspec_error
from mcpipe._template import Template
from mcpipe.compile import (
    PipelinePlan,
    assign_step_ids,
    reference_root,
    referenced_step,
    referenced_var,
    step_reference_problem,
    template_parts,
)
from mcpipe.declared import _command, _http, _kinds, _services, _sql
from mcpipe.declared._expr import CelExpr, ExpressionSyntaxError, JsonataExpr
from mcpipe.declared._model import KIND_STRUCTS, PipeFields, StepFields
from mcpipe.declared._policy import StepPolicy
from mcpipe.declared._step import DeclaredParallel, DeclaredPipe, DeclaredStep, RunFn, run_tool
from mcpipe.errors import Problem, TemplateSyntaxError
from mcpipe.interaction import _kinds as _ask

__all__ = [
    "JSONATA_PLUGIN",
    "KINDS",
    "CompiledStep",
    "Kind",
    "StepScope",
    "compile_step",
    "compile_steps",
    "tool_sites",
    "walk",
]

CompiledStep = DeclaredStep | DeclaredParallel | DeclaredPipe

JSONATA_PLUGIN = "dev.mcpipe.transform.jsonata"
_PLUGIN_ALIASES = {
    "jsonata": JSONATA_PLUGIN,
    JSONATA_PLUGIN: JSONATA_PLUGIN,
    "dev.mcpg.transform.jsonata": JSONATA_PLUGIN,
}

_STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_TOOL_PIPE = "mcp_pipe"
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class StepScope:
    """What a step at some place may see, and what the operator allows.

    Attributes:
        step_ids: the ids of the step's list by position (so ``{{step2}}`` means the second step).
        visible: ids of the steps that finish before this one; None: do not check step references here.
        siblings: ids of parallel siblings (never visible).
        has_last: whether some step has finished before this one (else ``last`` is rejected).
        var_names: the names ``vars`` has here; None: unknown (not checked).
        policy: hosts, commands and plugins the operator allows.
        tools: the tool names that exist (a registry works; with ``.call`` it is also how ``tool`` steps
            call tools unless the executor is given another); None: not checked.
        depth: how deeply this step is nested in ``parallel``/``pipe`` steps.
        max_depth: the deepest nesting allowed.
    """

    step_ids: tuple[str, ...] = ()
    visible: frozenset[str] | None = None
    siblings: frozenset[str] = frozenset()
    has_last: bool = True
    var_names: frozenset[str] | None = None
    policy: StepPolicy = field(default_factory=StepPolicy)
    tools: Container[str] | None = None
    depth: int = 0
    max_depth: int = 5


@dataclass(frozen=True, slots=True)
class Kind:
    """A leaf step kind: its fields, which of them are templates, and its executor.

    Attributes:
        name: the ``kind`` value.
        struct: the msgspec Struct of its fields.
        templates: the fields compiled as templates (resolved into the executor's ``inputs``).
        run: the executor.
    """

    name: str
    struct: type[StepFields]
    templates: tuple[str, ...]
    run: RunFn


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("tool", KIND_STRUCTS["tool"], ("args",), run_tool),
        Kind("http", KIND_STRUCTS["http"], ("url", "headers", "query", "body"), _http.run_http),
        Kind("graphql", KIND_STRUCTS["graphql"], ("url", "variables", "headers"), _http.run_graphql),
        Kind("command", KIND_STRUCTS["command"], ("args", "env", "cwd", "stdin"), _command.run_command),
        Kind("mock", KIND_STRUCTS["mock"], (), _kinds.run_mock),
        Kind("value", KIND_STRUCTS["value"], ("value",), _kinds.run_value),
        Kind("transform", KIND_STRUCTS["transform"], (), _kinds.run_transform),
        Kind("cel_gate", KIND_STRUCTS["cel_gate"], (), _kinds.run_cel_gate),
        Kind("plugin_transform", KIND_STRUCTS["plugin_transform"], (), _kinds.run_plugin_transform),
        Kind("log", KIND_STRUCTS["log"], ("data",), _kinds.run_log),
        Kind("progress", KIND_STRUCTS["progress"], ("progress", "total", "message"), _kinds.run_progress),
        # The kinds that ask the client (mcpipe.interaction): they suspend and resume in 2026-07-28.
        Kind("elicitation", KIND_STRUCTS["elicitation"], ("message", "requested_schema"), _ask.run_elicitation),
        Kind(
            "sampling",
            KIND_STRUCTS["sampling"],
            ("messages", "system_prompt", "max_tokens", "model_preferences", "temperature"),
            _ask.run_sampling,
        ),
        Kind("roots_list", KIND_STRUCTS["roots_list"], (), _ask.run_roots_list),
        Kind("gather", KIND_STRUCTS["gather"], ("inputs",), _ask.run_gather),
        # The SQL kinds (mcpipe.backends.sql): their params templates are compiled into their plans.
        Kind("sql", KIND_STRUCTS["sql"], (), _sql.run_sql),
        Kind("sql_tx", KIND_STRUCTS["sql_tx"], (), _sql.run_sql_tx),
        Kind("sql_await", KIND_STRUCTS["sql_await"], (), _sql.run_sql_await),
        # Messaging and RPC (mcpipe.backends): connections shared per URL, owned by the policy's Connections.
        Kind("nats", KIND_STRUCTS["nats"], ("subject", "headers"), _services.run_nats),
        Kind("grpc", KIND_STRUCTS["grpc"], ("metadata",), _services.run_grpc),
        Kind(
            "kafka",
            KIND_STRUCTS["kafka"],
            ("topic", "request_topic", "response_topic", "key", "headers"),
            _services.run_kafka,
        ),
    )
}
"""The leaf kinds by name (``parallel`` and ``pipe`` are containers, compiled separately)."""

ALL_KINDS = (*KINDS, "parallel", "pipe")


def compile_step(
    raw: Any, location: str, scope: StepScope | None = None, *, default_id: str = "step1"
) -> tuple[CompiledStep | None, list[Problem]]:
    """Compile one declared step.

    Args:
        raw: the step as it appears in the config (a mapping).
        location: where it is (``pipelines.charge.steps[2]``); problems are located under it.
        scope: what it may see and what the operator allows (default: nothing checked, nothing allowed).
        default_id: its id when it has none (``step<N>`` for position N).

    Returns:
        The compiled step (None when there are problems) and every problem found.
    """
    c = _Compiler()
    step = c.step(raw, location, default_id, scope or StepScope())
    return (None if c.problems else step), c.sorted_problems()


def compile_steps(
    raw: Any, location: str, scope: StepScope | None = None
) -> tuple[tuple[CompiledStep, ...] | None, list[Problem]]:
    """Compile a list of declared steps (a pipeline's ``steps``), checking ids and references.

    Args:
        raw: the list.
        location: where it is (``pipelines.charge.steps``); step ``i`` is ``{location}[i]``.
        scope: ``policy``, ``tools``, ``var_names`` and ``max_depth`` are used; the rest is derived.

    Returns:
        The compiled steps (None when there are problems) and every problem found.
    """
    c = _Compiler()
    base = scope or StepScope()
    steps = c.steps_of(raw, location, replace(base, visible=frozenset(), siblings=frozenset(), has_last=False))
    return (None if c.problems else steps), c.sorted_problems()


def walk(steps: Iterable[CompiledStep]) -> Iterator[CompiledStep]:
    """Every compiled step, containers first, then their children (parallel children, nested pipe steps)."""
    for step in steps:
        yield step
        if isinstance(step, DeclaredParallel):
            yield from walk(step.children)
        elif isinstance(step, DeclaredPipe):
            yield from walk(step.pipe.steps)  # type: ignore[arg-type]


def tool_sites(steps: Iterable[CompiledStep]) -> list[tuple[str, str]]:
    """``(location, tool name)`` of every ``tool`` step, nested ones included: for the per-caller
    permission check and for finding cycles between declared pipelines that call each other."""
    return [(s.location, s.spec.tool) for s in walk(steps) if isinstance(s, DeclaredStep) and s.kind == "tool"]  # type: ignore[attr-defined]


class _Compiler:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, location: str, message: str, code: str = "INVALID_SPEC") -> None:
        self.problems.append(Problem(location, code, message))

    def sorted_problems(self) -> list[Problem]:
        # Natural order of locations (steps[2] before steps[10]); the sort is stable within a location.
        return sorted(
            self.problems, key=lambda p: tuple(int(x) if x.isdigit() else x for x in _INDEX.split(p.location))
        )

    # --- lists ---

    def steps_of(self, raw: Any, loc: str, outer: StepScope) -> tuple[CompiledStep, ...] | None:
        if not isinstance(raw, list) or not raw:
            self.problem(loc, f"steps must be a non-empty array, got {json_type(raw)}")
            return None
        ids = self.assign_ids(raw, loc)
        out: list[CompiledStep] = []
        ok = True
        for i, (item, sid) in enumerate(zip(raw, ids, strict=True)):
            scope = replace(outer, step_ids=ids, visible=frozenset(ids[:i]), siblings=frozenset(), has_last=i > 0)
            step = self.step(item, f"{loc}[{i}]", sid, scope)
            ok = ok and step is not None
            if step is not None:
                out.append(step)
        return tuple(out) if ok else None

    def assign_ids(self, raw: list[Any], loc: str) -> tuple[str, ...]:
        # Ids are checked against the pattern by the step models, with their own message.
        return assign_step_ids(raw, loc, self.problem, check_pattern=False)

    # --- one step ---

    def step(self, raw: Any, loc: str, sid: str, scope: StepScope) -> CompiledStep | None:
        if not isinstance(raw, Mapping):
            self.problem(loc, f"a step must be an object, got {json_type(raw)}")
            return None
        kind = raw.get("kind")
        if not isinstance(kind, str) or kind not in ALL_KINDS:
            if kind is None:
                self.problem(f"{loc}.kind", "missing field `kind`")
            else:
                hint = _did_you_mean(kind, ALL_KINDS) if isinstance(kind, str) else ""
                self.problem(
                    f"{loc}.kind",
                    f"unknown kind {orjson.dumps(kind).decode()}{hint} (kinds: {', '.join(ALL_KINDS)})",
                )
            return None
        spec = self.decode(raw, kind, loc)
        # The common fields are compiled even when the kind's fields have problems: all found at once.
        refs: list[tuple[str, str]] = []
        when = self.cel(raw.get("when"), f"{loc}.when", scope, refs)
        transform = self.cel(raw.get("input_transform"), f"{loc}.input_transform", scope, refs)
        sid = spec.id if spec is not None and spec.id is not None else sid
        if kind == "parallel":
            return self.parallel(raw, spec, loc, sid, scope, when, transform, refs)
        if kind == "pipe":
            return self.pipe(raw, spec, loc, sid, scope, when, transform, refs)
        k = KINDS[kind]
        templates: list[tuple[str, Template]] = []
        for name in k.templates:
            if name in raw:
                t = self.template(raw[name], f"{loc}.{name}", scope, refs)
                if t is not None:
                    templates.append((name, t))
        plan = self.plan(kind, raw, spec, loc, scope, refs, dict(templates))
        if spec is None or plan is _BAD:
            return None
        # Fields absent from the step resolve to their defaults, so runners can index `inputs` directly.
        present = {name for name, _ in templates}
        for name in k.templates:
            if name not in present and name not in raw:
                templates.append((name, Template({"$literal": _default(spec, name)})))
        timeout = spec.timeout_ms
        if kind == "sql_await" or kind in _services.OWN_DEADLINE:
            timeout = None  # its own deadline, so that it can say what it waited for
        elif timeout is None:
            # Steps that wait on the outside world get the operator's default deadline.
            if kind in ("http", "graphql"):
                timeout = scope.policy.http.timeout_ms
            elif kind == "command":
                timeout = scope.policy.command.timeout_ms
        return DeclaredStep(
            sid,
            kind,
            loc,
            spec,
            tuple(templates),
            when,
            transform,
            timeout,
            plan,
            tuple(refs),
            k.run,
        )

    def decode(self, raw: Mapping[str, Any], kind: str, loc: str) -> Any:
        struct = KIND_STRUCTS[kind]
        known = frozenset(struct.__struct_encode_fields__) | {"kind"}
        unknown = [k for k in raw if k not in known]
        for name in unknown:
            self.problem(f"{loc}.{name}", f"unknown field `{name}` for kind `{kind}`{_did_you_mean(name, known)}")
        clean = {k: v for k, v in raw.items() if k in known}
        sid = clean.get("id")
        if isinstance(sid, str) and not _STEP_ID.fullmatch(sid):
            self.problem(f"{loc}.id", f"invalid id '{sid}': ids match [A-Za-z_][A-Za-z0-9_-]*")
            del clean["id"]
        if kind == "http" and isinstance(clean.get("method"), str):
            clean["method"] = clean["method"].upper()
        try:
            return msgspec.convert(clean, struct)
        except msgspec.ValidationError as e:
            self.problem(*split_msgspec_error(str(e), loc))
            return None

    def template(self, value: Any, loc: str, scope: StepScope, refs: list[tuple[str, str]]) -> Template | None:
        try:
            t = Template(value, step_ids=scope.step_ids, location=loc)
        except TemplateSyntaxError:
            for part in template_parts(value, loc, scope.step_ids):  # every problem, not the first one
                if isinstance(part, TemplateSyntaxError):
                    self.problem(part.location, part.reason)
                else:
                    for site, ref in part.reference_sites:
                        self.check_reference(site, ref, scope)
            return None
        for site, ref in t.reference_sites:
            refs.append((site, ref))
            self.check_reference(site, ref, scope)
        return t

    def cel(self, source: Any, loc: str, scope: StepScope, refs: list[tuple[str, str]]) -> CelExpr | None:
        if source is None:
            return None
        if not isinstance(source, str):
            return None  # the Struct reports the type
        try:
            expr = CelExpr.compile(source)
        except ExpressionSyntaxError as e:
            self.problem(loc, f"invalid CEL: {e.reason}")
            return None
        for m in expr.mentions:
            ref = m.normalized()
            refs.append((loc, ref))
            self.check_reference(loc, ref, scope)
        return expr

    def check_reference(self, site: str, ref: str, scope: StepScope) -> None:
        name = reference_root(ref)
        if name == "steps":
            if scope.visible is None:
                return
            step = referenced_step(ref)
            if step is None:
                return  # `steps` as a whole, or a dynamic access: nothing to check statically
            problem = step_reference_problem(step, scope.visible, scope.siblings, scope.step_ids)
            if problem is not None:
                self.problem(site, problem)
        elif name == "last":
            if scope.visible is not None and not scope.has_last:
                self.problem(site, f"reference `{ref}`: no step has finished here, so `last` is null")
        elif name == "vars" and scope.var_names is not None:
            key = referenced_var(ref)
            if key is not None and key not in scope.var_names:
                self.problem(site, f"reference `{ref}`: no var named '{key}'")

    # --- what each kind compiles beyond its templates ---

    def plan(
        self,
        kind: str,
        raw: Mapping[str, Any],
        spec: Any,
        loc: str,
        scope: StepScope,
        refs: list[tuple[str, str]],
        templates: dict[str, Template],
    ) -> Any:
        policy = scope.policy
        if kind in _services.SERVICE_KINDS:
            plan = _services.compile_service(self, kind, raw, spec, loc, scope, refs)
            return _BAD if plan is None else plan
        if kind in _sql.SQL_KINDS:
            plan = _sql.compile_sql(self, kind, raw, spec, loc, scope, refs)
            return _BAD if plan is None else plan
        if kind in ("transform", "cel_gate"):
            expr = self.cel(raw.get("expression"), f"{loc}.expression", scope, refs)
            return expr if expr is not None else _BAD
        if kind == "plugin_transform":
            return self.plugin(raw, loc, scope, refs)
        if kind in ("http", "graphql"):
            self.static_url(templates.get("url"), f"{loc}.url", policy)
            return policy.http
        if kind == "command":
            name = raw.get("command")
            if not isinstance(name, str):
                return _BAD
            argv = policy.command.argv(name)
            if argv is None:
                allowed = ", ".join(sorted(policy.command.commands)) or "none are configured"
                self.problem(f"{loc}.command", f"command '{name}' is not allowed (allowed: {allowed})", "FORBIDDEN")
                return _BAD
            if not argv or not argv[0]:
                self.problem(f"{loc}.command", f"command '{name}' has an empty executable in the config")
                return _BAD
            return _command.CommandPlan(argv, policy.command)
        if kind == "mock":
            return Template({"$literal": raw.get("response")})
        if kind == "tool":
            name = raw.get("tool")
            if isinstance(name, str):
                if name == _TOOL_PIPE:
                    self.problem(f"{loc}.tool", f"`{_TOOL_PIPE}` cannot be called as a tool; use a `pipe` step")
                    return _BAD
                if scope.tools is not None and name not in scope.tools:
                    self.problem(f"{loc}.tool", f"unknown tool '{name}'", "UNKNOWN_TOOL")
                    return _BAD
            return scope.tools if hasattr(scope.tools, "call") else None
        return None

    def plugin(self, raw: Mapping[str, Any], loc: str, scope: StepScope, refs: list[tuple[str, str]]) -> Any:
        name = raw.get("plugin")
        if not isinstance(name, str):
            return _BAD
        config = raw.get("config")
        custom = scope.policy.plugins.get(name)
        if custom is not None:
            return self.custom_plugin(custom, name, config, loc)
        if _PLUGIN_ALIASES.get(name) != JSONATA_PLUGIN:
            known = ", ".join(sorted({*_PLUGIN_ALIASES, *scope.policy.plugins}))
            self.problem(f"{loc}.plugin", f"unknown plugin '{name}'{_did_you_mean(name, _PLUGIN_ALIASES)} ({known})")
            return _BAD
        if not isinstance(config, Mapping):
            self.problem(f"{loc}.config", "the JSONata plugin needs `config: {expression: ...}`")
            return _BAD
        extra = [k for k in config if k != "expression"]
        for k in extra:
            self.problem(f"{loc}.config.{k}", f"unknown field `{k}` for the JSONata plugin (it takes `expression`)")
        source = config.get("expression")
        if not isinstance(source, str):
            self.problem(f"{loc}.config.expression", f"expected a JSONata expression string, got {json_type(source)}")
            return _BAD
        try:
            expr = JsonataExpr.compile(source, max_ms=scope.policy.expression_max_ms)
        except ExpressionSyntaxError as e:
            self.problem(f"{loc}.config.expression", f"invalid JSONata: {e.reason}")
            return _BAD
        for m in expr.mentions:
            ref = m.normalized()
            refs.append((f"{loc}.config.expression", ref))
            self.check_reference(f"{loc}.config.expression", ref, scope)
        return _BAD if extra else expr

    def custom_plugin(self, plugin: Any, name: str, config: Any, loc: str) -> Any:
        """An operator's plugin: ``plugin.compile(config)`` answers an object with ``evaluate(env)``."""
        try:
            return plugin.compile(config)
        except (ValueError, TypeError) as e:
            self.problem(f"{loc}.config", f"plugin '{name}': {e}")
            return _BAD

    def static_url(self, url: Template | None, loc: str, policy: StepPolicy) -> None:
        """A URL without placeholders is checked against the allowlist at load, not at the first call."""
        if url is None or url.reference_sites:
            return
        value = url.resolve({})
        if not isinstance(value, str):
            self.problem(loc, f"`url` must be a string, got {json_type(value)}")
            return
        import httpx2

        try:
            parsed = httpx2.URL(value)
        except httpx2.InvalidURL as e:
            self.problem(loc, f"invalid URL: {e}")
            return
        if parsed.scheme not in ("http", "https"):
            self.problem(loc, f"scheme '{parsed.scheme}' is not allowed (only http and https)", "FORBIDDEN")
        elif not policy.http.host_allowed(parsed.host):
            self.problem(loc, f"host '{parsed.host}' is not in the allowed hosts", "FORBIDDEN")

    # --- containers ---

    def parallel(
        self,
        raw: Mapping[str, Any],
        spec: Any,
        loc: str,
        sid: str,
        scope: StepScope,
        when: CelExpr | None,
        transform: CelExpr | None,
        refs: list[tuple[str, str]],
    ) -> DeclaredParallel | None:
        if not self.deep_enough(loc, scope):
            return None
        children = raw.get("steps")
        if not isinstance(children, list) or not children:
            if spec is not None:
                self.problem(f"{loc}.steps", "steps must be a non-empty array")
            return None
        child_loc = f"{loc}.steps"
        child_ids = self.assign_ids(children, child_loc)
        visible = scope.visible
        # A child sees what the group's list sees, never its siblings (unless one shares an id with an
        # earlier step of that list, which is then the one it means).
        siblings = frozenset(child_ids) - (visible or frozenset())
        child_scope = replace(scope, siblings=siblings, depth=scope.depth + 1)
        out: list[CompiledStep] = []
        ok = True
        for i, (item, cid) in enumerate(zip(children, child_ids, strict=True)):
            step = self.step(item, f"{child_loc}[{i}]", cid, child_scope)
            ok = ok and step is not None
            if step is not None:
                out.append(step)
        if spec is None or not ok:
            return None
        return DeclaredParallel(sid, loc, tuple(out), spec.timeout_ms, when, transform, tuple(refs))

    def pipe(
        self,
        raw: Mapping[str, Any],
        spec: PipeFields | None,
        loc: str,
        sid: str,
        scope: StepScope,
        when: CelExpr | None,
        transform: CelExpr | None,
        refs: list[tuple[str, str]],
    ) -> DeclaredPipe | None:
        if not self.deep_enough(loc, scope):
            return None
        # The nested `vars` are resolved in the parent's environment; the rest sees only the nested list.
        raw_vars = raw.get("vars", {})
        vars_t = self.template(raw_vars, f"{loc}.vars", scope, refs) if isinstance(raw_vars, Mapping) else None
        names = frozenset(raw_vars) if isinstance(raw_vars, Mapping) else None
        inner = replace(
            scope,
            step_ids=(),
            visible=frozenset(),
            siblings=frozenset(),
            has_last=False,
            var_names=names,
            depth=scope.depth + 1,
        )
        steps = self.steps_of(raw.get("steps"), f"{loc}.steps", inner) if "steps" in raw else None
        ret = None
        if spec is not None and spec.return_ is not msgspec.UNSET and steps is not None:
            ids = tuple(s.id for s in steps)
            ret_scope = replace(inner, step_ids=ids, visible=frozenset(ids), has_last=True)
            ret = self.template(spec.return_, f"{loc}.return", ret_scope, [])
            if ret is None:
                return None
        if spec is None or steps is None or vars_t is None:
            return None
        plan = PipelinePlan(vars_t, steps, ret, spec.continue_on_error, spec.timeout_ms, f"{loc}")  # type: ignore[arg-type]
        return DeclaredPipe(sid, loc, plan, spec.timeout_ms, when, transform, tuple(refs))

    def deep_enough(self, loc: str, scope: StepScope) -> bool:
        if scope.depth + 1 > scope.max_depth:
            self.problem(
                loc, f"nesting is {scope.depth + 1} levels deep here; the limit is {scope.max_depth}", "LIMIT_EXCEEDED"
            )
            return False
        return True


_BAD: Any = object()


def _problem_order(p: Problem) -> tuple[Any, ...]:
    return tuple(int(x) if x.isdigit() else x for x in _INDEX.split(p.location))


def _default(spec: Any, name: str) -> Any:
    value = getattr(spec, name)
    return None if value is msgspec.UNSET else value


def _did_you_mean(name: str, known: Any) -> str:
    close = difflib.get_close_matches(str(name), sorted(known), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""
