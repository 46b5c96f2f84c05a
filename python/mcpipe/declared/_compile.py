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

from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import msgspec
import orjson

from mcpipe._describe import did_you_mean, json_type
from mcpipe._template import Template
from mcpipe.declared._model import CONTAINERS, PipeFields
from mcpipe.errors import Problem
from mcpipe.expr import CelExpr
from mcpipe.kinds import KINDS, RESERVED_KINDS, Build, BuildFailed, Kind, StepPolicy
from mcpipe.plan import (
    STEP_ID,
    Checker,
    Leaf,
    Node,
    Parallel,
    Pipe,
    Pipeline,
    Scope,
    compile_each,
    decode_fields,
    referenced_step,
)
from mcpipe.plan import tool_sites as plan_tool_sites
from mcpipe.plan import walk as plan_walk

__all__ = [
    "ALL_KINDS",
    "CompiledStep",
    "StepScope",
    "compile_step",
    "compile_steps",
    "tool_sites",
    "walk",
]

CompiledStep = Node


class _AllKinds:
    """Every kind name: the registry's (which may grow at run time) and the containers."""

    def __contains__(self, name: object) -> bool:
        return name in KINDS or name in RESERVED_KINDS

    def __iter__(self) -> Iterator[str]:
        return iter((*KINDS, *RESERVED_KINDS))


ALL_KINDS = _AllKinds()


@dataclass(frozen=True)
class StepScope(Scope):
    """What a step at some place may see (a :class:`mcpipe.plan.Scope`), and what the operator allows.

    Attributes:
        policy: hosts, commands and plugins the operator allows.
        tools: the tool names that exist (a registry works; with ``.call`` it is also how ``tool`` steps
            call tools unless the run gives another); None: not checked.
        max_depth: the deepest nesting allowed.
    """

    policy: StepPolicy = field(default_factory=StepPolicy)
    tools: Container[str] | None = None
    max_depth: int = 5
    max_json_depth: int = 64
    max_text_bytes: int | None = None


def compile_step(
    raw: object, location: str, scope: StepScope | None = None, *, default_id: str = "step1"
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
    scope = scope or StepScope()
    c = _Compiler(scope)
    step = c.step(raw, location, default_id, scope)
    return (None if c.check.problems else step), c.check.sorted_problems()


def compile_steps(
    raw: object, location: str, scope: StepScope | None = None
) -> tuple[tuple[CompiledStep, ...] | None, list[Problem]]:
    """Compile a list of declared steps (a pipeline's ``steps``), checking ids and references.

    Args:
        raw: the list.
        location: where it is (``pipelines.charge.steps``); step ``i`` is ``{location}[i]``.
        scope: ``policy``, ``tools``, ``var_names`` and ``max_depth`` are used; the rest is derived.

    Returns:
        The compiled steps (None when there are problems) and every problem found.
    """
    base = scope or StepScope()
    c = _Compiler(base)
    steps = c.steps_of(raw, location, replace(base, visible=frozenset(), siblings=frozenset(), has_last=False))
    return (None if c.check.problems else steps), c.check.sorted_problems()


def walk(steps: Iterable[CompiledStep]) -> Iterator[CompiledStep]:
    """Every compiled step, containers first, then their children (parallel children, nested pipe steps)."""
    return plan_walk(steps)


def tool_sites(steps: Iterable[CompiledStep]) -> list[tuple[str, str]]:
    """``(location, tool name)`` of every ``tool`` step, nested ones included: for the per-caller
    permission check and for finding cycles between declared pipelines that call each other."""
    return list(plan_tool_sites(steps))


_KIND = frozenset({"kind"})


@dataclass(frozen=True, slots=True)
class _Either:
    """Two containers as one (a scope's visible steps and a kind's own names), without building a set."""

    first: Container[str]
    second: Container[str]

    def __contains__(self, name: object) -> bool:
        return name in self.first or name in self.second


class _Compiler:
    """The declared front-end: steps written ``{kind: ..., <fields>}`` into plan nodes, checked by the
    shared :class:`~mcpipe.plan.Checker`; every leaf kind comes from the registry."""

    def __init__(self, scope: StepScope) -> None:
        # Ids are checked against the pattern by the step models, with their own message; expressions
        # may index `steps` dynamically, so a `steps` reference that names no step is not an error.
        self.check = Checker(
            max_depth=scope.max_depth,
            strict_steps=False,
            check_ids=False,
            max_json_depth=scope.max_json_depth,
            max_text_bytes=scope.max_text_bytes,
        )
        self.problem = self.check.problem

    @property
    def problems(self) -> list[Problem]:
        return self.check.problems

    # --- lists ---

    def steps_of(self, raw: object, loc: str, outer: StepScope) -> tuple[CompiledStep, ...] | None:
        if not isinstance(raw, list) or not raw:
            self.problem(loc, f"steps must be a non-empty array, got {json_type(raw)}")
            return None
        ids = self.check.assign_ids(raw, loc)
        out: list[CompiledStep] = []
        ok = True
        # The shared checker's scopes: linear in the list (no set of earlier ids built per step).
        scopes = Checker.list_scopes(ids, outer.var_names, outer.depth)
        for i, (item, sid, base) in enumerate(zip(raw, ids, scopes, strict=True)):
            scope = replace(outer, step_ids=ids, visible=base.visible, siblings=frozenset(), has_last=i > 0)
            step = self.step(item, f"{loc}[{i}]", sid, scope)
            ok = ok and step is not None
            if step is not None:
                out.append(step)
        return tuple(out) if ok else None

    # --- one step ---

    def step(self, raw: object, loc: str, sid: str, scope: StepScope) -> CompiledStep | None:
        if not isinstance(raw, Mapping):
            self.problem(loc, f"a step must be an object, got {json_type(raw)}")
            return None
        kind = raw.get("kind")
        names = (*KINDS, *RESERVED_KINDS)
        if not isinstance(kind, str) or kind not in names:
            if kind is None:
                self.problem(f"{loc}.kind", "missing field `kind`")
            else:
                hint = did_you_mean(kind, names) if isinstance(kind, str) else ""
                # a config format's own kinds (`mcpg.http`) are namespaced, and not listed here
                listed = ", ".join(n for n in names if "." not in n)
                self.problem(f"{loc}.kind", f"unknown kind {orjson.dumps(kind).decode()}{hint} (kinds: {listed})")
            return None
        k = KINDS.get(kind)
        spec = self.decode(raw, kind, k, loc)
        # The common fields are compiled even when the kind's fields have problems: all found at once.
        refs: list[tuple[str, str]] = []
        when = self.cel(raw.get("when"), f"{loc}.when", scope, refs)
        transform = self.cel(raw.get("input_transform"), f"{loc}.input_transform", scope, refs)
        sid = spec.id if spec is not None and spec.id is not None else sid
        if k is None:
            if kind == "parallel":
                return self.parallel(raw, spec, loc, sid, scope, when, transform, refs)
            return self.pipe(raw, spec, loc, sid, scope, when, transform, refs)
        return self.leaf(k, raw, spec, loc, sid, scope, when, transform, refs)

    def leaf(
        self,
        k: Kind[Any, Any],
        raw: Mapping[str, object],
        spec: Any,
        loc: str,
        sid: str,
        scope: StepScope,
        when: CelExpr | None,
        transform: CelExpr | None,
        refs: list[tuple[str, str]],
    ) -> Leaf[Any, Any] | None:
        templates: list[tuple[str, Template]] = []
        for name in k.templates:
            if name in raw:
                t = self.check.template(raw[name], f"{loc}.{name}", scope, refs, url=name in k.url_templates)
                if t is not None:
                    templates.append((name, t))

        def mentions(expr: Any, where: str) -> None:
            for m in expr.mentions:
                ref = m.normalized()
                refs.append((where, ref))
                self.check.check_reference(where, ref, scope)

        def template(value: object, where: str, also_visible: frozenset[str]) -> Template | None:
            if not also_visible:
                return self.check.template(value, where, scope, refs)
            inner = replace(scope, visible=None if scope.visible is None else _Either(scope.visible, also_visible))
            own: list[tuple[str, str]] = []
            t = self.check.template(value, where, inner, own)
            refs.extend((site, ref) for site, ref in own if referenced_step(ref) not in also_visible)
            return t

        b = Build(
            raw, spec, loc, scope.policy, scope.tools, dict(templates), self.problem, mentions, template, scope.visible
        )
        built = None
        try:
            if k.build is not None:
                built = k.build(b)
        except BuildFailed:
            pass
        if spec is None or b.failed:
            return None
        # Fields absent from the step resolve to their defaults, so runners can index `inputs` directly.
        present = {name for name, _ in templates}
        for name in k.templates:
            if name not in present and name not in raw:
                templates.append((name, Template({"$literal": _default(spec, name)})))
        timeout = spec.timeout_ms
        if k.own_deadline:
            timeout = None  # the kind applies timeout_ms itself, so that TIMEOUT says what it waited for
        elif timeout is None and k.default_timeout is not None:
            timeout = k.default_timeout(scope.policy)
        return Leaf(
            sid,
            loc,
            k.name,
            spec,
            built,
            tuple(templates),
            k.run,
            timeout_ms=timeout,
            tool=k.tool_name(spec) if k.tool_name is not None else None,
            **_shared(when, transform, refs),
        )

    def decode(self, raw: Mapping[str, object], kind: str, k: Kind[Any, Any] | None, loc: str) -> Any:
        def prepare(clean: dict[str, Any]) -> None:
            sid = clean.get("id")
            if isinstance(sid, str) and not STEP_ID.fullmatch(sid):
                self.problem(f"{loc}.id", f"invalid id '{sid}': ids match [A-Za-z_][A-Za-z0-9_-]*")
                del clean["id"]
            if k is not None and k.prepare is not None:
                k.prepare(clean)

        struct = k.fields if k is not None else CONTAINERS[kind]
        return decode_fields(
            raw,
            struct,
            loc,
            "a step",
            self.problem,
            also_known=_KIND,
            unknown_note=f" for kind `{kind}`",
            prepare=prepare,
        )

    def template(self, value: object, loc: str, scope: StepScope, refs: list[tuple[str, str]]) -> Template | None:
        return self.check.template(value, loc, scope, refs)

    def cel(self, source: object, loc: str, scope: StepScope, refs: list[tuple[str, str]]) -> CelExpr | None:
        expr: CelExpr | None = self.check.cel(source, loc, scope, refs)
        return expr

    # --- containers ---

    def parallel(
        self,
        raw: Mapping[str, object],
        spec: Any,
        loc: str,
        sid: str,
        scope: StepScope,
        when: CelExpr | None,
        transform: CelExpr | None,
        refs: list[tuple[str, str]],
    ) -> Parallel | None:
        if not self.check.deep_enough(loc, scope.depth):
            return None
        children = raw.get("steps")
        if not isinstance(children, list) or not children:
            if spec is not None:
                self.problem(f"{loc}.steps", "steps must be a non-empty array")
            return None
        child_loc = f"{loc}.steps"
        child_ids = self.check.assign_ids(children, child_loc)
        # A child sees what the group's list sees, never its siblings (unless one shares an id with an
        # earlier step of that list, which is then the one it means): the shared checker's sibling scope.
        shared = Checker.sibling_scope(scope, child_ids)
        child_scope = replace(scope, siblings=shared.siblings, depth=shared.depth)
        out: list[CompiledStep] | None = compile_each(
            children, child_loc, child_ids, partial(self.step, scope=child_scope)
        )
        if spec is None or out is None:
            return None
        return Parallel(sid, loc, tuple(out), timeout_ms=spec.timeout_ms, **_shared(when, transform, refs))

    def pipe(
        self,
        raw: Mapping[str, object],
        spec: PipeFields | None,
        loc: str,
        sid: str,
        scope: StepScope,
        when: CelExpr | None,
        transform: CelExpr | None,
        refs: list[tuple[str, str]],
    ) -> Pipe | None:
        if not self.check.deep_enough(loc, scope.depth):
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
        plan = Pipeline(vars_t, steps, ret, spec.continue_on_error, spec.timeout_ms, loc)
        return Pipe(sid, loc, plan, timeout_ms=spec.timeout_ms, **_shared(when, transform, refs))


def _shared(when: CelExpr | None, transform: CelExpr | None, refs: list[tuple[str, str]]) -> dict[str, Any]:
    """The :class:`mcpipe.plan.Step` fields every declared node sets alike (its results carry ``skipped``)."""
    return {"when": when, "input_transform": transform, "references": tuple(refs), "skippable": True}


def _default(spec: object, name: str) -> Any:
    value = getattr(spec, name)
    return None if value is msgspec.UNSET else value
