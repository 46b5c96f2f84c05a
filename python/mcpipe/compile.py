"""Turn a spec into an executable plan, checking everything of contract section 5 first.

``compile_spec`` decodes the spec (msgspec, see :mod:`mcpipe.spec`), assigns default ids, compiles every
template once through the Rust core, and checks ids, references, tools and limits. It collects every
problem it finds before raising, so a user fixes a spec in one round. Plans are immutable and cached by
spec text, so a client that sends the same spec again pays only for the per-call tool check.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeAlias

import msgspec
import orjson

from mcpipe._bounds import check_spec_size, depth_problem, step_ids_for
from mcpipe._describe import did_you_mean, json_type, split_msgspec_error
from mcpipe._template import Template
from mcpipe.errors import Problem, SpecError, TemplateSyntaxError
from mcpipe.spec import STEP_KINDS, PipelineSpec, SpecBase, field_names

__all__ = [
    "CompiledSpec",
    "Limits",
    "ParallelStep",
    "PipeStep",
    "PipelinePlan",
    "Step",
    "ToolStep",
    "assign_step_ids",
    "compile_spec",
    "reference_root",
    "referenced_step",
    "referenced_var",
    "step_reference_problem",
    "template_parts",
]

PIPE_TOOL = "mcp_pipe"
STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
RESERVED_ID = re.compile(r"step([0-9]+)")
STEPS_REF = re.compile(r"steps\.([A-Za-z_][A-Za-z0-9_-]*)")
VARS_REF = re.compile(r"vars(?:\.([^.\[]+)|\[(\"(?:[^\"\\]|\\.)*\")\])?")
ROOT = re.compile(r"[a-z]+")
CACHE_SIZE = 512
CACHE_BYTES = 64 * 1024 * 1024
"""The most bytes the plan cache holds, counting each entry as twice its spec text (the text is the key, and
the plan's constants are about as large again; see docs/reliability.md)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Server-side limits a spec cannot raise.

    Attributes:
        max_steps: total steps, counting every nested and parallel child.
        max_depth: how deeply ``pipe`` and ``parallel`` steps may nest (top-level steps are depth 0).
        max_concurrency: parallel children running at once within one call.
        timeout_ms: the most a whole pipeline may run; a spec's own ``timeout_ms`` is capped by it.
        max_spec_bytes: the largest spec (its JSON text), refused before anything is compiled.
        max_json_depth: how deeply any JSON value (``args``, ``vars``, ``return``, tool arguments) may nest.
        max_output_bytes: the most one step's output, or one resolved template (its texts and copied values), may
            hold.
        max_answer_bytes: the most all the step outputs of one answer, and its result, may hold together.
        expression_timeout_ms: the deadline of one CEL or JSONata evaluation (declared pipelines).
    """

    max_steps: int = 50
    max_depth: int = 5
    max_concurrency: int = 8
    timeout_ms: float | None = None
    max_spec_bytes: int = 4 * 1024 * 1024
    max_json_depth: int = 64
    max_output_bytes: int = 8 * 1024 * 1024
    max_answer_bytes: int = 32 * 1024 * 1024
    expression_timeout_ms: float = 1000.0


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class ToolStep:
    """Call ``tool`` with ``args`` resolved in the step's environment."""

    id: str
    location: str
    tool: str
    args: Template
    timeout_ms: float | None


@dataclass(frozen=True, slots=True)
class ParallelStep:
    """Run ``children`` concurrently; they see the group's list, not each other."""

    id: str
    location: str
    children: tuple[Step, ...]
    timeout_ms: float | None


@dataclass(frozen=True, slots=True)
class PipeStep:
    """Run the nested ``pipe``; its ``vars`` template is resolved in this step's environment."""

    id: str
    location: str
    pipe: PipelinePlan
    timeout_ms: float | None


Step: TypeAlias = ToolStep | ParallelStep | PipeStep


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """One list of steps with its vars, return template and failure policy."""

    vars: Template
    steps: tuple[Step, ...]
    ret: Template | None
    continue_on_error: bool
    timeout_ms: float | None
    location: str


@dataclass(frozen=True, slots=True)
class CompiledSpec:
    """A validated, compiled spec.

    Attributes:
        plan: the top-level pipeline.
        tool_sites: ``(location, tool)`` of every tool step, for the per-call tool and permission checks.
        leaf_count: how many tool steps there are, nested and parallel children included.
        step_count: how many steps there are in all.
    """

    plan: PipelinePlan
    tool_sites: tuple[tuple[str, str], ...]
    leaf_count: int
    step_count: int


def compile_spec(
    spec: Any,
    *,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
) -> CompiledSpec:
    """Validate and compile a pipeline spec.

    Args:
        spec: the spec as a dict, JSON text or bytes; ``{"spec": <object or JSON text>}`` is unwrapped.
        tools: the tool names that exist (a registry works); None skips the unknown-tool check.
        limits: the server's limits (default: 50 steps, depth 5, concurrency 8, no deadline).

    Returns:
        The compiled spec. The same spec text compiles once; later calls hit a cache.

    Raises:
        SpecError: every problem found, each with its location, code and message.
    """
    limits = limits or DEFAULT_LIMITS
    data, key = _load(spec)
    entry = _CACHE.get((key, limits)) if key is not None else None
    if entry is None:
        # Size and step count first: a spec too large to compile is refused having compiled nothing.
        too_large = check_spec_size(
            data,
            len(key) if key is not None else None,
            max_bytes=limits.max_spec_bytes,
            max_steps=limits.max_steps,
        )
        if too_large:
            raise SpecError(too_large)
        entry = _Compiler(limits).run(data)
        if key is not None and entry[0] is not None:  # invalid specs are not kept
            # An entry holds the spec text (its key) and the plan, whose constants are about as large again.
            _CACHE.put((key, limits), entry, 2 * len(key))
    compiled, problems = entry
    if tools is not None:
        sites = compiled.tool_sites if compiled is not None else problems.tool_sites
        unknown = [
            Problem(f"{loc}.tool", "UNKNOWN_TOOL", f"unknown tool '{name}'{_tool_hint(name, tools)}")
            for loc, name in sites
            if name not in tools
        ]
        if unknown:
            raise SpecError(sorted([*problems, *unknown], key=_problem_order))
    if compiled is None:
        raise SpecError(list(problems))
    return compiled


def assign_step_ids(
    raw: list[Any], loc: str, problem: Callable[[str, str], None], *, check_pattern: bool = True
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


def _tool_hint(name: str, tools: Container[str]) -> str:
    # Only on the failure path: a registry or gateway can list its names; a bare container may not.
    try:
        names = [t if isinstance(t, str) else t.name for t in tools]  # type: ignore[attr-defined]
    except (TypeError, AttributeError):
        return ""
    return did_you_mean(name, names)


def clear_cache() -> None:
    """Forget every cached plan (for tests and for benchmarks of the cold path)."""
    _CACHE.clear()


def configure_cache(*, max_bytes: int) -> None:
    """Bound the plan cache by the bytes of spec text it holds (``pipe.compile_cache_bytes``)."""
    _CACHE.max_bytes = max_bytes
    while _CACHE.data and _CACHE.bytes > max_bytes:
        _, (_, gone) = _CACHE.data.popitem(last=False)
        _CACHE.bytes -= gone


# --- loading ----------------------------------------------------------------------------------------


def _load(spec: Any) -> tuple[Any, bytes | str | None]:
    """Unwrap and parse the spec; return the data and the cache key (its text), if it has one."""
    if isinstance(spec, Mapping) and "spec" in spec and "steps" not in spec:
        extra = sorted(k for k in spec if k != "spec")
        if extra:
            raise SpecError([Problem(extra[0], "INVALID_SPEC", f"unknown field `{extra[0]}` beside `spec`")])
        return _load_inner(spec["spec"], "spec")
    return _load_inner(spec, "")


def _load_inner(spec: Any, loc: str) -> tuple[Any, bytes | str | None]:
    if isinstance(spec, (str, bytes, bytearray, memoryview)):
        raw = bytes(spec) if not isinstance(spec, str) else spec
        try:
            return orjson.loads(raw), raw
        except orjson.JSONDecodeError as e:
            raise SpecError([Problem(loc, "INVALID_SPEC", f"invalid JSON: {_json_error(e)}")]) from None
    try:
        key = orjson.dumps(spec)
    except TypeError:
        key = None  # not JSON-serializable as a whole: still compile, but do not cache
    return spec, key


def _json_error(e: orjson.JSONDecodeError) -> str:
    reason = e.msg
    return f"{reason} at line {e.lineno}, column {e.colno}"


# --- the compiler -----------------------------------------------------------------------------------


class _Problems(list[Problem]):
    """The problems found, plus the tool sites seen (so unknown tools are reported with them)."""

    tool_sites: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class _Scope:
    """What a template at some place may reference."""

    ids: tuple[str, ...]  # the ids of the list, by position (for `{{stepN}}`)
    visible: Container[str]  # ids of steps that finish before this place
    siblings: frozenset[str]  # ids of parallel siblings (never visible)
    has_last: bool
    var_names: frozenset[str] | None  # None: unknown (cannot check)


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


def _join(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


class _Compiler:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.problems = _Problems()
        self.tool_sites: list[tuple[str, str]] = []
        self.steps = 0
        self.leaves = 0

    def problem(self, location: str, message: str, code: str = "INVALID_SPEC") -> None:
        self.problems.append(Problem(location, code, message))

    def run(self, data: Any) -> tuple[CompiledSpec | None, _Problems]:
        outer = _Scope((), frozenset(), frozenset(), False, frozenset())
        plan = self.pipeline(data, "", depth=0, outer=outer)
        if self.steps > self.limits.max_steps:
            self.problem(
                "steps",
                f"the pipeline has {self.steps} steps; the limit is {self.limits.max_steps}",
                "LIMIT_EXCEEDED",
            )
        self.problems.tool_sites = tuple(self.tool_sites)
        if self.problems or plan is None:
            self.problems.sort(key=_problem_order)
            return None, self.problems
        compiled = CompiledSpec(plan, tuple(self.tool_sites), self.leaves, self.steps)
        return compiled, self.problems

    def decode(self, data: Any, struct: type[SpecBase], loc: str, what: str) -> Any:
        """Decode ``data`` into ``struct``, reporting every unknown field and the first type error."""
        if not isinstance(data, Mapping):
            self.problem(loc, f"{what} must be an object, got {json_type(data)}")
            return None
        known = field_names(struct)
        unknown = [k for k in data if k not in known]
        for k in unknown:
            hint = did_you_mean(k, known)
            self.problem(_join(loc, str(k)), f"unknown field `{k}`{hint}")
        clean = {k: v for k, v in data.items() if k in known} if unknown else data
        try:
            return msgspec.convert(clean, struct)
        except msgspec.ValidationError as e:
            self.problem(*split_msgspec_error(str(e), loc))
            return None

    def template(self, value: Any, loc: str, scope: _Scope) -> Template | None:
        too_deep = depth_problem(value, loc, self.limits.max_json_depth, "the template")
        if too_deep is not None:
            self.problems.append(too_deep)
            return None
        try:
            t = Template(
                value,
                step_ids=step_ids_for(value, scope.ids),
                location=loc,
                max_text_bytes=self.limits.max_output_bytes,
            )
        except TemplateSyntaxError:
            parts = template_parts(
                value, loc, step_ids_for(value, scope.ids), max_text_bytes=self.limits.max_output_bytes
            )
            for part in parts:
                if isinstance(part, TemplateSyntaxError):
                    self.problem(part.location, part.reason)
                else:
                    for site, ref in part.reference_sites:
                        self.check_reference(site, ref, scope)
            return None
        for site, ref in t.reference_sites:
            self.check_reference(site, ref, scope)
        return t

    def check_reference(self, site: str, ref: str, scope: _Scope) -> None:
        name = reference_root(ref)
        if name == "steps":
            step = referenced_step(ref)
            if step is None:
                if not (ref == "steps" or ref.startswith("steps.*")):
                    self.problem(site, f"reference `{ref}` does not name a step")
                return
            problem = step_reference_problem(step, scope.visible, scope.siblings, scope.ids)
            if problem is not None:
                self.problem(site, problem)
        elif name == "last":
            if not scope.has_last:
                self.problem(site, f"reference `{ref}`: no step has finished here, so `last` is null")
        elif name == "vars" and scope.var_names is not None:
            key = referenced_var(ref)
            if key is not None and key not in scope.var_names:
                self.problem(site, f"reference `{ref}`: no var named '{key}'")

    def pipeline(self, data: Any, loc: str, *, depth: int, outer: _Scope) -> PipelinePlan | None:
        spec = self.decode(data, PipelineSpec, loc, "a pipeline spec")
        if spec is None:
            # Still look inside the steps, so their problems are reported in the same round.
            if isinstance(data, Mapping) and isinstance(data.get("steps"), list):
                names = data.get("vars")
                self.steps_of(data["steps"], _join(loc, "steps"), depth, _var_names(names))
            return None
        vars_t = self.template(spec.vars, _join(loc, "vars"), outer)
        ret_scope_ids, steps = self.steps_of(spec.steps, _join(loc, "steps"), depth, frozenset(spec.vars))
        ret = None
        if spec.return_ is not msgspec.UNSET:
            scope = _Scope(ret_scope_ids, frozenset(ret_scope_ids), frozenset(), True, frozenset(spec.vars))
            ret = self.template(spec.return_, _join(loc, "return"), scope)
        if vars_t is None or steps is None:
            return None
        timeout = spec.timeout_ms
        return PipelinePlan(vars_t, steps, ret, spec.continue_on_error, timeout, loc)

    def steps_of(
        self, raw: list[Any], loc: str, depth: int, var_names: frozenset[str] | None
    ) -> tuple[tuple[str, ...], tuple[Step, ...] | None]:
        ids = self.assign_ids(raw, loc)
        first: dict[str, int] = {}
        for i, sid in enumerate(ids):
            first.setdefault(sid, i)
        out: list[Step] = []
        ok = True
        for i, (item, sid) in enumerate(zip(raw, ids, strict=True)):
            scope = _Scope(ids, _Before(first, i), frozenset(), i > 0, var_names)
            step = self.step(item, f"{loc}[{i}]", sid, depth, scope, ids)
            ok = ok and step is not None
            if step is not None:
                out.append(step)
        return ids, (tuple(out) if ok else None)

    def assign_ids(self, raw: list[Any], loc: str) -> tuple[str, ...]:
        return assign_step_ids(raw, loc, self.problem)

    def step(self, data: Any, loc: str, sid: str, depth: int, scope: _Scope, ids: tuple[str, ...]) -> Step | None:
        self.steps += 1
        if not isinstance(data, Mapping):
            self.problem(loc, f"a step must be an object, got {json_type(data)}")
            return None
        kinds = [k for k in STEP_KINDS if k in data]
        if len(kinds) != 1:
            which = "none" if not kinds else " and ".join(f"`{k}`" for k in kinds)
            self.problem(loc, f"a step needs exactly one of `tool`, `parallel` or `pipe` (found {which})")
            return None
        kind = kinds[0]
        spec = self.decode(data, STEP_KINDS[kind], loc, "a step")
        if kind == "tool":
            return self.tool_step(spec, data, loc, sid, scope)
        if depth + 1 > self.limits.max_depth:
            self.problem(
                loc,
                f"nesting is {depth + 1} levels deep here; the limit is {self.limits.max_depth}",
                "LIMIT_EXCEEDED",
            )
            return None
        if kind == "parallel":
            children = spec.parallel if spec is not None else data.get("parallel")
            if not isinstance(children, list):
                return None
            return self.parallel_step(spec, children, loc, sid, depth, scope)
        inner = spec.pipe if spec is not None else data.get("pipe")
        plan = self.pipeline(inner, f"{loc}.pipe", depth=depth + 1, outer=scope)
        if spec is None or plan is None:
            return None
        return PipeStep(sid, loc, plan, spec.timeout_ms)

    def tool_step(self, spec: Any, data: Mapping[str, Any], loc: str, sid: str, scope: _Scope) -> Step | None:
        self.leaves += 1
        name = data.get("tool")
        if isinstance(name, str):
            if name == PIPE_TOOL:
                self.problem(f"{loc}.tool", f"`{PIPE_TOOL}` cannot be called as a tool; use a `pipe` step")
            else:
                self.tool_sites.append((loc, name))
        raw_args = data.get("args", {})
        if not isinstance(raw_args, (dict, str)):
            self.problem(f"{loc}.args", f"args must be an object, got {json_type(raw_args)}")
            return None
        args = self.template(raw_args, f"{loc}.args", scope)
        if spec is None or args is None or name == PIPE_TOOL:
            return None
        return ToolStep(sid, loc, spec.tool, args, spec.timeout_ms)

    def parallel_step(
        self, spec: Any, children: list[Any], loc: str, sid: str, depth: int, scope: _Scope
    ) -> Step | None:
        child_loc = f"{loc}.parallel"
        child_ids = self.assign_ids(children, child_loc)
        # A child sees what the group's list sees, never its siblings (unless they share an id with an
        # earlier step of that list, which is the one it means). The same scope for every child.
        siblings = frozenset(c for c in child_ids if c not in scope.visible)
        child_scope = _Scope(scope.ids, scope.visible, siblings, scope.has_last, scope.var_names)
        out: list[Step] = []
        ok = True
        for i, (item, cid) in enumerate(zip(children, child_ids, strict=True)):
            step = self.step(item, f"{child_loc}[{i}]", cid, depth + 1, child_scope, scope.ids)
            ok = ok and step is not None
            if step is not None:
                out.append(step)
        if spec is None or not ok:
            return None
        return ParallelStep(sid, loc, tuple(out), spec.timeout_ms)


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


def _var_names(value: Any) -> frozenset[str] | None:
    return frozenset(value) if isinstance(value, Mapping) else frozenset() if value is None else None


_ORDER = re.compile(r"\[(\d+)\]")


def _problem_order(p: Problem) -> tuple[Any, ...]:
    # Natural order of locations: steps[2] before steps[10]; a stable sort keeps discovery order within.
    return tuple(int(x) if x.isdigit() else x for x in _ORDER.split(p.location))


class _LRU:
    """A small least-recently-used map bounded by entries and by bytes (the spec text each entry was
    compiled from); plans are immutable, so sharing them is safe."""

    def __init__(self, size: int, max_bytes: int = CACHE_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self.data: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: Any) -> Any:
        entry = self.data.get(key)
        if entry is None:
            return None
        self.data.move_to_end(key)
        return entry[0]

    def put(self, key: Any, value: Any, nbytes: int = 0) -> None:
        if nbytes > self.max_bytes:
            return  # larger than the whole cache: keeping it would evict everything else
        old = self.data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self.data[key] = (value, nbytes)
        self.bytes += nbytes
        while len(self.data) > self.size or self.bytes > self.max_bytes:
            _, (_, gone) = self.data.popitem(last=False)
            self.bytes -= gone

    def clear(self) -> None:
        self.data.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.data)


_CACHE = _LRU(CACHE_SIZE)
