"""``mcp_pipe``'s front-end: turn a spec into a plan (:mod:`mcpipe.plan`), checking everything of contract
section 5 first.

``compile_spec`` decodes the spec (msgspec, see :mod:`mcpipe.spec`), assigns default ids, compiles every
template once through the Rust core, and checks ids, references, tools and limits (with the shared
:class:`mcpipe.plan.Checker`). It collects every
problem it finds before raising, so a user fixes a spec in one round. Plans are immutable and cached by
spec text, so a client that sends the same spec again pays only for the per-call tool check.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import msgspec
import orjson
import trio

from mcpipe._describe import did_you_mean, json_type
from mcpipe._json import DuplicateKeyError, check_unique_keys
from mcpipe._util import PIPE_TOOL, RunLimiter
from mcpipe.errors import ErrorCode, Problem, SpecError
from mcpipe.plan import (
    DEFAULT_LIMITS,
    STEP_ID,
    WHOLE_REFERENCE,
    ArgumentSite,
    Checker,
    CompiledSpec,
    ForEach,
    Leaf,
    Limits,
    Node,
    Parallel,
    Pipe,
    Pipeline,
    Retry,
    Scope,
    TypedSite,
    argument_problems,
    compile_each,
    decode_fields,
    least_calls,
    literal_type,
    output_path,
    problem_order,
    template_parts,
    type_problems,
)
from mcpipe.spec import STEP_KINDS, PipelineSpec, SpecBase

__all__ = [
    "CACHE_BYTES",
    "CACHE_SIZE",
    "CompiledSpec",
    "Limits",
    "clear_cache",
    "compile_spec",
    "compile_spec_async",
    "configure_cache",
    "template_parts",
]

CACHE_SIZE = 512
CACHE_BYTES = 64 * 1024 * 1024
"""The most bytes the plan cache holds, each entry charged what its plan holds (see :func:`plan_bytes`)."""

PLAN_BYTES_PER_TEXT_BYTE = 64
PLAN_BYTES_PER_REFERENCE = 256
"""What a compiled plan holds, bounded from above by its spec text and its references (issue 20): every
constant is a copy the plan owns and every reference a compiled path with its location, so the plan is tens
of times its text (measured from 7x for long strings to 60x for dense interpolations, on the resident size;
``tests/hostile/test_hostile_cache.py`` checks the bound on each shape)."""

COMPILE_IN_THREAD_BYTES = 256 * 1024
"""A spec text longer than this is compiled in a thread by :func:`compile_spec_async` (the event loop keeps
its turns of the interpreter; a 4 MiB spec of references takes about a second to compile)."""


def plan_bytes(text_bytes: int, references: int) -> int:
    """What the plan cache charges for a plan compiled from ``text_bytes`` of spec making ``references``
    references: an upper bound of the memory the plan holds, the key included."""
    return PLAN_BYTES_PER_TEXT_BYTE * text_bytes + PLAN_BYTES_PER_REFERENCE * references


_AS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TAKEN_ROOTS = frozenset({"vars", "steps", "last", "args", "context", "index"})


def compile_spec(
    spec: object,
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
    data, key, text_at = _load(spec)
    entry: _Entry | None = _CACHE.get((key, limits)) if key is not None else None
    if entry is None:
        entry, charge = _compile(data, key, limits, text_at)
        _keep(key, limits, entry, charge)
    return _checked(entry, tools)


async def compile_spec_async(
    spec: object,
    *,
    tools: Container[str] | None = None,
    limits: Limits | None = None,
) -> CompiledSpec:
    """:func:`compile_spec` without holding the event loop: a spec text longer than
    :data:`COMPILE_IN_THREAD_BYTES` is compiled in a thread (the cache is read and written on the loop).

    Raises:
        SpecError: as :func:`compile_spec`.
    """
    limits = limits or DEFAULT_LIMITS
    data, key, text_at = _load(spec)
    entry: _Entry | None = _CACHE.get((key, limits)) if key is not None else None
    if entry is not None:
        return _checked(entry, tools)
    if key is not None and len(key) > COMPILE_IN_THREAD_BYTES:
        compiled, charge = await trio.to_thread.run_sync(
            _compile, data, key, limits, text_at, limiter=_compile_threads()
        )
    else:
        compiled, charge = _compile(data, key, limits, text_at)
    _keep(key, limits, compiled, charge)
    return _checked(compiled, tools)


_compile_threads = RunLimiter("mcpipe_compile_threads", 2)
"""At most 2 large specs compile at once (each is CPU work: more would only share the same cores)."""


def _compile(data: object, key: bytes | str | None, limits: Limits, text_at: str | None = None) -> tuple[_Entry, int]:
    """Compile (size and step count first: a spec too large is refused having compiled nothing); the entry
    and what keeping it costs (:func:`plan_bytes`). A spec given as JSON text (``text_at``: where) that repeats
    a key is refused: its parse kept only the last one. Only here, on a miss: a cached text has none."""
    if text_at is not None and key is not None:
        try:
            check_unique_keys(key)
        except DuplicateKeyError as e:
            where = f"line {e.lineno}, column {e.colno} of the JSON text"
            raise SpecError([Problem(text_at, ErrorCode.INVALID_SPEC, f"{where}: {e.msg}")]) from None
    size = Checker()
    if not size.size(
        data, len(key) if key is not None else None, max_bytes=limits.max_spec_bytes, max_steps=limits.max_steps
    ):
        raise SpecError(size.problems)
    compiler = _Compiler(limits)
    entry = compiler.run(data)
    return entry, plan_bytes(len(key) if key is not None else 0, compiler.check.references)


def _keep(key: bytes | str | None, limits: Limits, entry: _Entry, charge: int) -> None:
    if key is not None and entry[0] is not None:  # invalid specs are not kept
        _CACHE.put((key, limits), entry, charge)


def _checked(entry: _Entry, tools: Container[str] | None) -> CompiledSpec:
    """The cached plan, after the checks that depend on the caller's tools."""
    compiled, problems = entry
    if tools is not None:
        sites = compiled.tool_sites if compiled is not None else problems.tool_sites
        unknown = [
            Problem(f"{loc}.tool", ErrorCode.UNKNOWN_TOOL, f"unknown tool '{name}'{_tool_hint(name, tools)}")
            for loc, name in sites
            if name not in tools
        ]
        # the arguments of the known tools are checked with the rest, so one answer lists every mistake
        arguments = compiled.argument_sites if compiled is not None else problems.argument_sites
        unknown += argument_problems([a for a in arguments if a.tool in tools], tools)
        if unknown:
            raise SpecError(sorted([*problems, *unknown], key=problem_order))
        if compiled is not None and compiled.typed_sites:
            mismatched = type_problems(compiled.typed_sites, tools)
            if mismatched:
                raise SpecError(sorted(mismatched, key=problem_order))
    if compiled is None:
        raise SpecError(list(problems))
    return compiled


_Entry = tuple["CompiledSpec | None", "_Problems"]


def _tool_hint(name: str, tools: Container[str]) -> str:
    # Only on the failure path: a registry or gateway lists its tools, a set its names; a bare container may
    # not list anything.
    if not isinstance(tools, Iterable):
        return ""
    try:
        names = [t if isinstance(t, str) else t.name for t in tools]
    except (TypeError, AttributeError):
        return ""
    return did_you_mean(name, names)


def clear_cache() -> None:
    """Forget every cached plan (for tests and for benchmarks of the cold path)."""
    _CACHE.clear()


def configure_cache(*, max_bytes: int) -> None:
    """Bound the plan cache by what its plans hold (``pipe.compile_cache_bytes``; see :func:`plan_bytes`)."""
    _CACHE.max_bytes = max_bytes
    while _CACHE.data and _CACHE.bytes > max_bytes:
        _, (_, gone) = _CACHE.data.popitem(last=False)
        _CACHE.bytes -= gone


# --- loading ----------------------------------------------------------------------------------------


def _load(spec: object) -> tuple[Any, bytes | str | None, str | None]:
    """Unwrap and parse the spec; return the data, the cache key (its text), if it has one, and where the
    spec was given as JSON text (None: as an object)."""
    if isinstance(spec, Mapping) and "spec" in spec and "steps" not in spec:
        extra = sorted(k for k in spec if k != "spec")
        if extra:
            raise SpecError([Problem(extra[0], ErrorCode.INVALID_SPEC, f"unknown field `{extra[0]}` beside `spec`")])
        return _load_inner(spec["spec"], "spec")
    return _load_inner(spec, "")


def _load_inner(spec: object, loc: str) -> tuple[Any, bytes | str | None, str | None]:
    if isinstance(spec, (str, bytes, bytearray, memoryview)):
        raw = bytes(spec) if not isinstance(spec, str) else spec
        try:
            return orjson.loads(raw), raw, loc
        except orjson.JSONDecodeError as e:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            if text.lstrip()[:1] not in ("{", "["):  # not meant as JSON text: a string where the spec goes
                message = "a pipeline spec must be an object with `steps` (or its JSON text), got a string"
            else:
                message = f"invalid JSON: {_json_error(e)}"
            raise SpecError([Problem(loc, ErrorCode.INVALID_SPEC, message)]) from None
    try:
        key = orjson.dumps(spec)
    except TypeError:
        key = None  # not JSON-serializable as a whole: still compile, but do not cache
    return spec, key, None


def _json_error(e: orjson.JSONDecodeError) -> str:
    reason = e.msg
    return f"{reason} at line {e.lineno}, column {e.colno}"


# --- the front-end ------------------------------------------------------------------------------------


class _Problems(list[Problem]):
    """The problems found, plus the tool sites and argument sites seen (so unknown tools and arguments that
    do not fit are reported with them)."""

    tool_sites: tuple[tuple[str, str], ...] = ()
    argument_sites: tuple[ArgumentSite, ...] = ()


def _join(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


class _Compiler:
    """``mcp_pipe``'s front-end: its syntax (``tool``/``parallel``/``pipe`` keys) into a plan, checked by
    the shared :class:`~mcpipe.plan.Checker`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.check = Checker(
            max_depth=limits.max_depth,
            max_json_depth=limits.max_json_depth,
            max_text_bytes=limits.max_output_bytes,
        )
        self.problem = self.check.problem
        self.tool_sites: list[tuple[str, str]] = []
        self.dry_run = False
        self.answer: str | None = None
        self.typed_sites: list[TypedSite] = []
        self.argument_sites: list[ArgumentSite] = []
        # The tool of each tool step of the lists being compiled, innermost last (what `steps.<id>` reads).
        self.producers: list[dict[str, str]] = []
        self.steps = 0
        self.leaves = 0

    def run(self, data: object) -> tuple[CompiledSpec | None, _Problems]:
        plan = self.pipeline(data, "", outer=Scope(visible=frozenset(), has_last=False, var_names=frozenset()))
        self.check.count("steps", self.steps, self.limits.max_steps)
        problems = _Problems(self.check.problems)
        problems.tool_sites = tuple(self.tool_sites)
        problems.argument_sites = tuple(self.argument_sites)
        if plan is not None and not problems:
            calls, where = least_calls(plan)
            if where and calls > self.limits.max_calls:
                message = (
                    f"the pipeline would make at least {calls} step executions (nested for_each multiplies); "
                    f"the limit is {self.limits.max_calls}"
                )
                problems.append(Problem(f"{where}.for_each", ErrorCode.LIMIT_EXCEEDED, message))
        if problems or plan is None:
            problems.sort(key=problem_order)
            return None, problems
        compiled = CompiledSpec.of(
            plan,
            dry_run=self.dry_run,
            typed_sites=tuple(self.typed_sites),
            answer=self.answer,
            argument_sites=tuple(self.argument_sites),
        )
        return compiled, problems

    def decode(self, data: object, struct: type[SpecBase], loc: str, what: str) -> Any:
        """Decode ``data`` into ``struct``, reporting every unknown field and the first type error."""
        return decode_fields(data, struct, loc, what, self.problem)

    def pipeline(self, data: object, loc: str, *, outer: Scope) -> Pipeline | None:
        spec = self.decode(data, PipelineSpec, loc, "a pipeline spec")
        if spec is None:
            # Still look inside the steps, so their problems are reported in the same round.
            if isinstance(data, Mapping) and isinstance(data.get("steps"), list):
                names = data.get("vars")
                self.steps_of(data["steps"], _join(loc, "steps"), outer.depth, _var_names(names))
            return None
        if spec.dry_run:
            if loc:
                self.problem(_join(loc, "dry_run"), "`dry_run` applies to the whole call: set it at the top level")
            else:
                self.dry_run = True
        if spec.answer is not None:
            if loc:
                self.problem(_join(loc, "answer"), "`answer` applies to the whole call: set it at the top level")
            else:
                self.answer = spec.answer
        vars_t = self.check.template(spec.vars, _join(loc, "vars"), outer)
        ids, steps = self.steps_of(spec.steps, _join(loc, "steps"), outer.depth, frozenset(spec.vars))
        ret = None
        if spec.return_ is not msgspec.UNSET:
            scope = Scope(ids, frozenset(ids), frozenset(), True, frozenset(spec.vars), outer.depth)
            ret = self.check.template(spec.return_, _join(loc, "return"), scope)
        if vars_t is None or steps is None:
            return None
        return Pipeline(vars_t, steps, ret, spec.continue_on_error, spec.timeout_ms, loc)

    def steps_of(
        self, raw: Sequence[object], loc: str, depth: int, var_names: frozenset[str] | None
    ) -> tuple[tuple[str, ...], tuple[Node, ...] | None]:
        ids = self.check.assign_ids(raw, loc)
        out: list[Node] = []
        ok = True
        producers: dict[str, str] = {}
        self.producers.append(producers)
        for i, (item, sid, scope) in enumerate(zip(raw, ids, Checker.list_scopes(ids, var_names, depth), strict=True)):
            step = self.step(item, f"{loc}[{i}]", sid, scope)
            ok = ok and step is not None
            if step is not None:
                out.append(step)
                if isinstance(step, Leaf) and step.tool is not None:
                    producers[sid] = step.tool
        self.producers.pop()
        return ids, (tuple(out) if ok else None)

    def step(self, data: object, loc: str, sid: str, scope: Scope) -> Node | None:
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
        given = data.get("id")
        if self.check.check_ids and isinstance(given, str) and given and not STEP_ID.fullmatch(given):
            data = {k: v for k, v in data.items() if k != "id"}  # its problem is reported once, by `assign_ids`
        spec = self.decode(data, STEP_KINDS[kind], loc, "a step")
        # The fields every step shares, compiled even when the step's own fields have problems.
        refs: list[tuple[str, str]] = []
        when = self.check.condition(data.get("when"), f"{loc}.when", scope, refs) if "when" in data else None
        if "when" in data and when is None:
            spec = None
        common: dict[str, Any] = {}
        if spec is not None:
            common = {"when": when, "continue_on_error": spec.continue_on_error, "references": tuple(refs)}
        if kind == "tool":
            return self.tool_step(spec, data, loc, sid, scope, common)
        if not self.check.deep_enough(loc, scope.depth):
            return None
        if kind == "parallel":
            children = spec.parallel if spec is not None else data.get("parallel")
            if not isinstance(children, list):
                return None
            return self.parallel_step(spec, children, loc, sid, scope, common)
        if kind == "for_each":
            return self.for_each_step(spec, data, loc, sid, scope, common)
        inner = spec.pipe if spec is not None else data.get("pipe")
        outer = replace(scope, depth=scope.depth + 1)
        plan = self.pipeline(inner, f"{loc}.pipe", outer=outer)
        if spec is None or plan is None:
            return None
        return Pipe(sid, loc, plan, timeout_ms=spec.timeout_ms, **common)

    def tool_step(
        self, spec: Any, data: Mapping[str, object], loc: str, sid: str, scope: Scope, common: dict[str, Any]
    ) -> Node | None:
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
        args = self.check.template(raw_args, f"{loc}.args", scope)
        if spec is None or args is None or name == PIPE_TOOL:
            return None
        if isinstance(raw_args, dict):
            self.argument_sites.append(self.argument_site(raw_args, args.reference_sites, loc, spec.tool))
        if isinstance(raw_args, dict) and self.producers:
            self.typed_arguments(raw_args, args.reference_sites, loc, spec.tool)
        retry = Retry(spec.retry.attempts, spec.retry.backoff_ms) if spec.retry is not None else None
        return Leaf(
            sid, loc, "tool", None, None, timeout_ms=spec.timeout_ms, tool=spec.tool, args=args, retry=retry, **common
        )

    @staticmethod
    def argument_site(
        raw_args: Mapping[str, object], sites: list[tuple[str, str]], loc: str, tool: str
    ) -> ArgumentSite:
        """The step's argument names, and the JSON type of each argument that holds no reference."""
        referenced = set()
        prefix = f"{loc}.args."
        for site, _ in sites:
            if site.startswith(prefix):
                rest = site[len(prefix) :]
                referenced.add(rest.split(".", 1)[0].split("[", 1)[0])
        literals = tuple(
            (k, literal_type(v))
            for k, v in raw_args.items()
            if k not in referenced and not (isinstance(v, str) and ("$" in v or "{{" in v or "<<" in v))
        )
        return ArgumentSite(loc, tool, tuple(raw_args), literals)

    def typed_arguments(
        self, raw_args: Mapping[str, object], sites: list[tuple[str, str]], loc: str, tool: str
    ) -> None:
        """Record the arguments that are exactly one reference to an earlier tool step's output (no
        default), for the per-call type check."""
        producers = self.producers[-1]
        # The references made at each argument, found once (scanning every site per key cost keys x sites:
        # an args object of 50 000 references took minutes to compile).
        at: dict[str, list[str]] = {}
        for site, ref in sites:
            at.setdefault(site, []).append(ref)
        for key, value in raw_args.items():
            if isinstance(value, str):
                whole = WHOLE_REFERENCE.fullmatch(value) is not None and "??" not in value
            else:
                whole = isinstance(value, Mapping) and list(value) == ["$ref"]
            where = f"{loc}.args.{key}"
            refs = at.get(where, [])
            if not whole or len(refs) != 1:
                continue
            path = output_path(refs[0])
            if path is not None and path[0] in producers:
                self.typed_sites.append(TypedSite(where, tool, key, refs[0], producers[path[0]]))

    def for_each_step(
        self, spec: Any, data: Mapping[str, object], loc: str, sid: str, scope: Scope, common: dict[str, Any]
    ) -> Node | None:
        source = data.get("for_each")
        items = None
        if isinstance(source, str) or (isinstance(source, Mapping) and "$ref" in source):
            items = self.check.template(source, f"{loc}.for_each", scope)
            if items is not None and len(items.references) != 1:
                self.problem(
                    f"{loc}.for_each", "for_each takes one reference to an array (`${steps.a.structured.items}`)"
                )
                items = None
        else:
            self.problem(f"{loc}.for_each", f"for_each takes one reference to an array, got {json_type(source)}")
        name = data.get("as", "item")
        if not isinstance(name, str):
            items, name = None, "item"  # the decoder reports the type
        elif not _AS_NAME.fullmatch(name) or name in _TAKEN_ROOTS:
            self.problem(
                f"{loc}.as",
                "`as` names the element: an identifier other than vars, steps, last, args, context or index, "
                f"got {orjson.dumps(name).decode()}",
            )
            items, name = None, "item"
        raw = data.get("step")
        if not isinstance(raw, Mapping):
            return None  # the decoder reports it
        given = raw.get("id")
        inner_id = given if isinstance(given, str) and given else "step1"
        inner_scope = replace(scope, siblings=frozenset(), depth=scope.depth + 1, loop=True, item_name=name)
        step = self.step(raw, f"{loc}.step", inner_id, inner_scope)
        if spec is None or items is None or step is None:
            return None
        return ForEach(sid, loc, items, step, as_name=name, timeout_ms=spec.timeout_ms, **common)

    def parallel_step(
        self, spec: Any, children: Sequence[object], loc: str, sid: str, scope: Scope, common: dict[str, Any]
    ) -> Node | None:
        child_loc = f"{loc}.parallel"
        child_ids = self.check.assign_ids(children, child_loc)
        child_scope = Checker.sibling_scope(scope, child_ids)
        out: list[Node] | None = compile_each(children, child_loc, child_ids, partial(self.step, scope=child_scope))
        if spec is None or out is None:
            return None
        return Parallel(sid, loc, tuple(out), timeout_ms=spec.timeout_ms, **common)


def _var_names(value: object) -> frozenset[str] | None:
    return frozenset(value) if isinstance(value, Mapping) else frozenset() if value is None else None


class _LRU:
    """A small least-recently-used map bounded by entries and by bytes (what each entry is charged, see
    :func:`plan_bytes`); plans are immutable, so sharing them is safe."""

    def __init__(self, size: int, max_bytes: int = CACHE_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self.data: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: object) -> Any:
        entry = self.data.get(key)
        if entry is None:
            return None
        self.data.move_to_end(key)
        return entry[0]

    def put(self, key: object, value: object, nbytes: int = 0) -> None:
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
