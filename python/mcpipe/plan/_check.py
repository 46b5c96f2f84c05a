"""The one checker every front-end uses: ids, scopes, references, depth, step counts, problem order.

A front-end walks its own syntax (``mcp_pipe``'s ``tool``/``parallel``/``pipe`` keys, a declared step's
``kind``) and asks a :class:`Checker` to number ids, compile templates against a :class:`Scope`, check
the references they make, and enforce the limits. Every problem is collected (with its full location),
so a user fixes a spec in one round; :func:`problem_order` sorts them the same way everywhere.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import msgspec
import orjson

from mcpipe._describe import did_you_mean, json_type, split_msgspec_error
from mcpipe._template import Template
from mcpipe.errors import ErrorCode, ExpressionError, InterpolationError, Problem, TemplateSyntaxError
from mcpipe.plan._bounds import check_spec_size, depth_problem, step_ids_for

__all__ = [
    "STEP_ID",
    "Checker",
    "ReferenceCondition",
    "Scope",
    "assign_step_ids",
    "compile_each",
    "decode_fields",
    "problem_order",
    "reference_root",
    "referenced_step",
    "referenced_var",
    "step_reference_problem",
    "template_parts",
]

N = TypeVar("N")

STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
RESERVED_ID = re.compile(r"step([0-9]+)")
STEPS_REF = re.compile(r"steps\.([A-Za-z_][A-Za-z0-9_-]*)")
VARS_REF = re.compile(r"vars(?:\.([^.\[]+)|\[(\"(?:[^\"\\]|\\.)*\")\])?")
ROOT = re.compile(r"[a-z]+")
WHOLE_REFERENCE = re.compile(r"\s*(?:\$\{[^{}]*\}|\{\{[^{}]*\}\})\s*")
_ORDER = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class Scope:
    """What a template or expression at some place may reference.

    Attributes:
        step_ids: the ids of the place's list by position (so ``{{step2}}`` means the second step).
        visible: ids of the steps that finish before this place; None: step references are not checked.
        siblings: ids of parallel siblings (never visible).
        has_last: whether some step has finished before this place (else ``last`` is rejected).
        var_names: the names ``vars`` has here; None: unknown (not checked).
        depth: how deeply this place is nested in ``parallel``/``pipe`` steps.
        loop: whether this place is inside a ``for_each`` step (so ``item`` and ``index`` are defined).
        item_name: the ``for_each``'s ``as``: another name of ``item`` here.
    """

    step_ids: tuple[str, ...] = ()
    visible: Container[str] | None = None
    siblings: frozenset[str] = frozenset()
    has_last: bool = True
    var_names: frozenset[str] | None = None
    depth: int = 0
    loop: bool = False
    item_name: str = "item"


class _Before:
    """The ids of a list's steps before position ``i``, without building that set for every step (which
    would make compiling a list of n steps cost n²)."""

    __slots__ = ("first", "i")

    def __init__(self, first: dict[str, int], i: int) -> None:
        self.first = first
        self.i = i

    def __contains__(self, sid: object) -> bool:
        at = self.first.get(sid) if isinstance(sid, str) else None
        return at is not None and at < self.i


def template_parts(value: Any, loc: str, step_ids: Any, **options: Any) -> list[Template | TemplateSyntaxError]:
    """A template value with a syntax error somewhere, compiled part by part, so that one bad string does
    not hide the other problems of the same value: the syntax error of each bad string, and the template of
    each good part (whose references can still be checked). Each part is compiled inside copies of its
    parents holding only it, so the core names its location exactly as in the whole."""
    out: list[Template | TemplateSyntaxError] = []

    def visit(part: Any, wrap: Callable[[Any], Any]) -> None:
        try:
            out.append(Template(wrap(part), step_ids=step_ids, location=loc, **options))
        except TemplateSyntaxError as e:
            children = _template_children(part)
            if not children:
                out.append(e)
            for key, child in children:
                visit(child, partial(_wrapped, wrap, key))

    visit(value, _as_is)
    return out


def _as_is(value: Any) -> Any:
    return value


def _wrapped(wrap: Callable[[Any], Any], key: Any, value: Any) -> Any:
    """``value`` at ``key`` of an otherwise empty copy of its parent, inside ``wrap``."""
    return wrap([None] * key + [value] if isinstance(key, int) else {key: value})


def _template_children(value: Any) -> list[tuple[Any, Any]]:
    """The parts of a template value compiled on their own: an object's entries, a list's items (a
    ``$ref``/``$literal`` object is one part)."""
    if isinstance(value, dict) and not (len(value) == 1 and ("$ref" in value or "$literal" in value)):
        return list(value.items())
    if isinstance(value, list):
        return list(enumerate(value))
    return []


def compile_each(
    items: Sequence[Any], location: str, ids: Sequence[str], compile_one: Callable[[Any, str, str], N | None]
) -> list[N] | None:
    """Compile every item of a list with ``compile_one(item, f"{location}[i]", id)``, going on past a failure
    so that one round reports every problem; the compiled items, or None when any failed."""
    out: list[N] = []
    ok = True
    for i, (item, sid) in enumerate(zip(items, ids, strict=True)):
        step = compile_one(item, f"{location}[{i}]", sid)
        if step is None:
            ok = False
        else:
            out.append(step)
    return out if ok else None


def problem_order(p: Problem) -> tuple[Any, ...]:
    """Natural order of locations (``steps[2]`` before ``steps[10]``); sort stably to keep discovery order
    within a location."""
    # Each part is (is a number, its value, its text), so that a name and a number compare (an unknown
    # key "0" beside "steps" at the same level).
    return tuple((1, int(x), "") if x.isdigit() else (0, 0, x) for x in _ORDER.split(p.location))


def assign_step_ids(
    raw: Sequence[object], loc: str, problem: Callable[[str, str], None], *, check_pattern: bool = True
) -> tuple[str, ...]:
    """The ids of a list of raw steps by position: an explicit id, else ``step<N>``.

    Reports through ``problem(location, message)`` ids that do not match the id pattern (when
    ``check_pattern``), ``step<N>`` ids used at another position, and duplicates.
    """
    ids: list[str] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        given = item.get("id") if isinstance(item, Mapping) else None
        sid = given if isinstance(given, str) and given else f"step{i + 1}"
        if isinstance(given, str) and given:
            if check_pattern and not STEP_ID.fullmatch(given):
                problem(f"{loc}[{i}].id", f"invalid id '{given}': ids match [A-Za-z_][A-Za-z0-9_-]*")
            reserved = RESERVED_ID.fullmatch(given)
            if reserved and reserved.group(1) != str(i + 1):
                problem(f"{loc}[{i}].id", f"id '{given}' is reserved for the step at position {reserved.group(1)}")
        if sid in seen:
            problem(f"{loc}[{i}].id", f"duplicate id '{sid}' (also {loc}[{seen[sid]}])")
        else:
            seen[sid] = i
        ids.append(sid)
    return tuple(ids)


def decode_fields(
    raw: Any,
    struct: type[msgspec.Struct],
    loc: str,
    what: str,
    problem: Callable[[str, str], None],
    *,
    also_known: frozenset[str] = frozenset(),
    unknown_note: str = "",
    prepare: Callable[[dict[str, Any]], None] | None = None,
    every_error: bool = False,
    skip: tuple[str, ...] = (),
) -> Any:
    """Decode ``raw`` into ``struct`` (the one decoder of the front-ends), reporting every unknown field.

    Args:
        raw: the value as written.
        struct: the Struct to decode into.
        loc: where ``raw`` is; problems are located under it.
        what: what ``raw`` is, for the message when it is not an object (``a step``).
        problem: reports ``(location, message)``.
        also_known: more field names that are not unknown (``kind``, the tag).
        unknown_note: added to an unknown field's message (`` for kind `http` ``).
        prepare: adjusts the known fields before decoding (it may report and drop some).
        every_error: report every field of the wrong type (drop each and decode again), not only the first.
        skip: fields whose type problems someone else reports (``every_error`` only).

    Returns:
        The Struct, or None when the fields that are right do not make one.
    """
    if not isinstance(raw, Mapping):
        problem(loc, f"{what} must be an object, got {json_type(raw)}")
        return None
    known = frozenset(struct.__struct_encode_fields__) | also_known
    unknown = [k for k in raw if k not in known]
    for k in unknown:
        problem(f"{loc}.{k}" if loc else str(k), f"unknown field `{k}`{unknown_note}{did_you_mean(k, known)}")
    clean: Any = raw
    if unknown or prepare is not None or every_error:
        clean = {k: v for k, v in raw.items() if k in known}
        if prepare is not None:
            prepare(clean)
    while True:
        try:
            return msgspec.convert(clean, struct)
        except msgspec.ValidationError as e:
            where, message = split_msgspec_error(str(e), loc)
            if message.startswith("Invalid enum value") and where.startswith(f"{loc}." if loc else ""):
                message += _choices(struct, where[len(loc) + 1 :] if loc else where)
            if not every_error:
                problem(where, message)
                return None
            # msgspec stops at the first error: drop the field it names and go on, so every field is reported.
            field = where[len(loc) + 1 :].split(".", 1)[0].split("[", 1)[0] if where.startswith(f"{loc}.") else ""
            if field not in skip and not (where == loc and any(f"`{s}`" in message for s in skip)):
                problem(where, message)
            if not field or field not in clean:
                return None
            del clean[field]


def _choices(struct: type[msgspec.Struct], field: str) -> str:
    """`` (expected one of `a`, `b`)`` for a field typed with a ``Literal`` of strings, else ``""``."""
    try:
        hint = typing.get_type_hints(struct).get(field)
    except (NameError, TypeError):
        return ""

    def strings(t: Any) -> list[str]:
        if typing.get_origin(t) is typing.Literal:
            return [v for v in typing.get_args(t) if isinstance(v, str)]
        return [v for option in typing.get_args(t) for v in strings(option)]

    values = strings(hint)
    return f" (expected one of {', '.join(f'`{v}`' for v in values)})" if values else ""


def reference_root(ref: str) -> str:
    """The root of a normalized reference (``steps`` of ``steps.fetch.output``)."""
    m = ROOT.match(ref)
    return m.group() if m else ref


def referenced_step(ref: str) -> str | None:
    """The step id a ``steps.<id>...`` reference names, or None (``steps`` whole, ``steps.*``, ...)."""
    m = STEPS_REF.match(ref)
    return m.group(1) if m else None


def referenced_var(ref: str) -> str | None:
    """The var a ``vars.<name>...`` or ``vars["name"]...`` reference reads first, or None."""
    m = VARS_REF.match(ref)
    if m is None:
        return None
    if m.group(1) is not None:
        return m.group(1)
    return orjson.loads(m.group(2)) if m.group(2) else None


def step_reference_problem(
    step: str, visible: Container[str], siblings: Container[str], ids: Container[str]
) -> str | None:
    """What is wrong with a reference to step ``step`` from a place that sees ``visible`` (None if nothing).

    ``siblings`` are the ids of the place's parallel siblings, ``ids`` the ids of its whole list.
    """
    if step in visible:
        return None
    if step in siblings:
        return f"reference to step '{step}', a sibling in the same parallel group"
    if step in ids:
        return f"reference to step '{step}', which does not run before this step"
    return f"reference to unknown step '{step}'"


@dataclass(frozen=True, slots=True)
class ReferenceCondition:
    """A ``when`` written as one reference: its value, which the scheduler requires to be a boolean."""

    template: Template

    def evaluate(self, env: Mapping[str, object]) -> Any:
        """The referenced value; a reference that cannot resolve is an :class:`ExpressionError`."""
        try:
            return self.template.resolve(env)
        except InterpolationError as e:
            message = str(e)
            if e.location and message.startswith(f"{e.location}: "):
                message = message[len(e.location) + 2 :]  # the scheduler says where the `when` is
            raise ExpressionError(message, missing=True) from None


class Checker:
    """Collects the problems of one compile and performs the checks every front-end shares.

    Args:
        max_depth: the deepest nesting allowed.
        strict_steps: report a ``steps`` reference that names no step (``steps[0]``); front-ends whose
            expressions may index ``steps`` dynamically turn it off.
        check_ids: check explicit ids against the id pattern (front-ends whose models check it turn it off).
        max_json_depth: how deeply a template value may nest (deeper: a located ``LIMIT_EXCEEDED``).
        max_text_bytes: the most bytes an interpolated text may take (the core refuses it before building it).
    """

    def __init__(
        self,
        *,
        max_depth: int = 5,
        strict_steps: bool = True,
        check_ids: bool = True,
        max_json_depth: int = 64,
        max_text_bytes: int | None = None,
    ) -> None:
        self.problems: list[Problem] = []
        self.references = 0
        """How many references the templates compiled so far make (what a cached plan holds grows with it)."""
        self.max_depth = max_depth
        self.strict_steps = strict_steps
        self.check_ids = check_ids
        self.max_json_depth = max_json_depth
        self.template_options: dict[str, Any] = {} if max_text_bytes is None else {"max_text_bytes": max_text_bytes}

    def size(self, data: Any, text_bytes: int | None, *, max_bytes: int, max_steps: int) -> bool:
        """Check a whole spec's size and step count before anything is compiled (an iterative walk that
        stops past ``max_steps``); reports and answers False when it is too large to compile."""
        too_large = check_spec_size(data, text_bytes, max_bytes=max_bytes, max_steps=max_steps)
        self.problems.extend(too_large)
        return not too_large

    def problem(self, location: str, message: str, code: str = ErrorCode.INVALID_SPEC) -> None:
        """Report one problem."""
        self.problems.append(Problem(location, code, message))

    def sorted_problems(self) -> list[Problem]:
        """The problems in :func:`problem_order`."""
        return sorted(self.problems, key=problem_order)

    def assign_ids(self, raw: Sequence[object], loc: str) -> tuple[str, ...]:
        """The ids of a list of raw steps (see :func:`assign_step_ids`)."""
        return assign_step_ids(raw, loc, self.problem, check_pattern=self.check_ids)

    def template(
        self, value: Any, loc: str, scope: Scope, refs: list[tuple[str, str]] | None = None, *, url: bool = False
    ) -> Template | None:
        """Compile ``value`` as a template at ``loc`` and check its references (None on a syntax error or a
        value nesting past ``max_json_depth``). Every bad string of a value is reported, and the references
        of its good parts are still checked. ``url``: a URL template (its values percent-encoded)."""
        too_deep = depth_problem(value, loc, self.max_json_depth, "the template")
        if too_deep is not None:
            self.problems.append(too_deep)
            return None
        step_ids = step_ids_for(value, scope.step_ids)
        alias = scope.item_name if scope.loop and scope.item_name != "item" else None
        options = self.template_options if alias is None else {**self.template_options, "item": alias}
        if url:
            options = {**options, "url": True}
        try:
            t = Template(value, step_ids=step_ids, location=loc, **options)
        except TemplateSyntaxError:
            for part in template_parts(value, loc, step_ids, **options):
                if isinstance(part, TemplateSyntaxError):
                    self.problem(part.location, part.reason)
                else:
                    for site, ref in part.reference_sites:
                        if refs is not None:
                            refs.append((site, ref))
                        self.check_reference(site, ref, scope)
            return None
        sites = t.reference_sites
        self.references += len(sites)
        for site, ref in sites:
            if refs is not None:
                refs.append((site, ref))
            self.check_reference(site, ref, scope)
        return t

    def check_reference(self, site: str, ref: str, scope: Scope) -> None:
        """Check one normalized reference made at ``site`` against what ``scope`` sees."""
        name = reference_root(ref)
        if name == "steps":
            if scope.visible is None:
                return
            step = referenced_step(ref)
            if step is None:
                if self.strict_steps and not (ref == "steps" or ref.startswith("steps.*")):
                    self.problem(site, f"reference `{ref}` does not name a step")
                return
            problem = step_reference_problem(step, scope.visible, scope.siblings, scope.step_ids)
            if problem is not None:
                self.problem(site, problem)
        elif name == "last":
            if scope.visible is not None and not scope.has_last:
                self.problem(site, f"reference `{ref}`: no step has finished here, so `last` is null")
        elif name in ("item", "index"):
            if not scope.loop:
                self.problem(site, f"reference `{ref}`: `{name}` is defined only inside a `for_each` step")
        elif name == "vars" and scope.var_names is not None:
            key = referenced_var(ref)
            if key is not None and key not in scope.var_names:
                self.problem(site, f"reference `{ref}`: no var named '{key}'")

    def cel(self, source: Any, loc: str, scope: Scope, refs: list[tuple[str, str]] | None = None) -> Any:
        """Compile ``source`` as CEL at ``loc`` and check the references it makes (None on a problem, or
        when ``source`` is not a string: the front-end's decoder reports its type)."""
        if not isinstance(source, str):
            return None
        from mcpipe.expr import CelExpr, ExpressionSyntaxError  # loads CEL: only for specs that use it

        alias = frozenset({scope.item_name}) if scope.loop and scope.item_name != "item" else frozenset()
        try:
            expr = CelExpr.compile(source, alias)
        except ExpressionSyntaxError as e:
            self.problem(loc, f"invalid CEL: {e.reason}")
            return None
        for m in expr.mentions:
            ref = m.normalized()
            if m.root in alias:
                ref = "item" + ref[len(m.root) :]
            if refs is not None:
                refs.append((loc, ref))
            self.check_reference(loc, ref, scope)
        return expr

    def condition(self, source: Any, loc: str, scope: Scope, refs: list[tuple[str, str]] | None = None) -> Any:
        """A ``when``: a string that is exactly one placeholder (``${steps.check.structured.ok}``) is a
        reference taken as a boolean; anything else is CEL. None on a problem."""
        if isinstance(source, str) and WHOLE_REFERENCE.fullmatch(source):
            t = self.template(source, loc, scope, refs)
            return None if t is None else ReferenceCondition(t)
        return self.cel(source, loc, scope, refs)

    def deep_enough(self, loc: str, depth: int) -> bool:
        """Whether a container at ``depth`` may nest one level more (reports it when not)."""
        if depth + 1 > self.max_depth:
            self.problem(
                loc,
                f"nesting is {depth + 1} levels deep here; the limit is {self.max_depth}",
                ErrorCode.LIMIT_EXCEEDED,
            )
            return False
        return True

    def count(self, loc: str, steps: int, max_steps: int) -> None:
        """Report a pipeline of more than ``max_steps`` steps."""
        if steps > max_steps:
            self.problem(loc, f"the pipeline has {steps} steps; the limit is {max_steps}", ErrorCode.LIMIT_EXCEEDED)

    @staticmethod
    def sibling_scope(scope: Scope, child_ids: tuple[str, ...]) -> Scope:
        """The scope of a parallel group's children: what the group's list sees, never each other (unless
        one shares an id with an earlier step of that list, which is then the one it means)."""
        visible: Container[str] = scope.visible if scope.visible is not None else frozenset()
        return replace(scope, siblings=frozenset(c for c in child_ids if c not in visible), depth=scope.depth + 1)

    @staticmethod
    def list_scopes(ids: tuple[str, ...], var_names: frozenset[str] | None, depth: int) -> list[Scope]:
        """The scope of each step of a list with ``ids``: the steps before it have finished. Linear in the
        list (no set of earlier ids is built per step)."""
        first: dict[str, int] = {}
        for i, sid in enumerate(ids):
            first.setdefault(sid, i)
        return [Scope(ids, _Before(first, i), frozenset(), i > 0, var_names, depth) for i in range(len(ids))]
