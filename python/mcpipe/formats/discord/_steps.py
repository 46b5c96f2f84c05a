"""discord-mcp's ``mcp_pipeline`` steps, checked and translated into mcpipe's plan.

What is discord's (read in its ``tools/meta/pipeline.ts``, ``pipeline/executor.ts`` and
``pipeline/interpolate.ts``) is kept: the step shape ``{id?, tool, args, save_as?, if?,
continue_on_error?}`` checked as its zod schema checks it, the 20-step cap, default ids ``step_<index>``
(0-based), one flat namespace of variables (every step's id, and its ``save_as``), ``{{name.path}}`` with
dotted and bracket-index paths whose whole-string form keeps the value's type, and ``if`` as a truthiness
check of one path (JavaScript's truthiness). What seed 001 documents beside the code is added:
``{{stepN.path}}`` names the N-th step (1-based) when no variable has that name, and a reference that cannot
resolve is ``INTERPOLATION_FAILED`` (before anything runs when it names no earlier step; at its step, before
the tool is called, when the path is missing). ``docs/formats/discord.md`` lists every difference left.

Each step becomes one :class:`~mcpipe.plan.Leaf` of the one plan; its arguments are a compiled
:class:`~mcpipe.Template` (the Rust core) and its ``if`` a condition object; the scheduler runs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.errors import ErrorCode, InterpolationError, TemplateSyntaxError
from mcpipe.kinds.tool import call_tool
from mcpipe.plan import CompiledSpec, Leaf, Pipeline
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = [
    "MAX_STEPS",
    "PIPELINE_TOOL",
    "DiscordStep",
    "Issue",
    "Rejection",
    "Translation",
    "js_truthy",
    "parse_steps",
    "translate",
]

PIPELINE_TOOL = "mcp_pipeline"
MAX_STEPS = 20
"""discord-mcp's cap on the steps of one pipeline."""
MAX_REFERENCES = 1000
"""The most ``{{...}}`` placeholders one call's arguments may hold, all steps together (discord-mcp sets
none; 400 000 of them, a 2 MB request, held the event loop 5 s and 120 MB)."""

_ID = re.compile(r"[a-z][a-z0-9_]{0,63}", re.IGNORECASE)
_ID_SOURCE = "/^[a-z][a-z0-9_]{0,63}$/i"  # as zod writes the pattern in its message
_PLACEHOLDER = re.compile(r"\{\{([^}]+)\}\}")  # interpolate.ts's TEMPLATE_RE (a whole `if` only: see _placeholders)
_STEP_N = re.compile(r"step([1-9][0-9]*)")
_INDEX = re.compile(r"\[(\d+)\]")
_PLAIN_INDEX = re.compile(r"0|[1-9][0-9]*")
_OPENERS = re.compile(r"\$\{|\{\{|\$<|<<")  # what mcpipe's templates read as a placeholder's opener


@dataclass(frozen=True, slots=True)
class _Placeholder:
    start: int
    end: int
    inner: str


def _placeholders(text: str, most: int | None = None) -> list[_Placeholder]:
    """What ``TEMPLATE_RE`` (``/\\{\\{([^}]+)\\}\\}/g``) finds in ``text`` (at most ``most + 1`` of them), in
    one pass: at a ``{{`` the placeholder runs to the first ``}`` after it, which must be doubled and not come
    at once; when it is not, no ``{{`` before that ``}`` starts one either.

    The regex backtracks: from every ``{{`` it scans to the next ``}``, so a text of ``{{`` without one costs
    its length squared (40 KB of it held the event loop 6.4 s; a 4 MB request, hours)."""
    found: list[_Placeholder] = []
    i = text.find("{{")
    while i >= 0:
        close = text.find("}", i + 2)
        if close < 0:
            break
        if close > i + 2 and text.startswith("}}", close):
            found.append(_Placeholder(i, close + 2, text[i + 2 : close]))
            if most is not None and len(found) > most:
                break
            i = text.find("{{", close + 2)
        else:
            i = text.find("{{", close + 1)
    return found


_STEP_FIELDS: dict[str, tuple[str, type, bool]] = {
    "id": ("string", str, False),
    "tool": ("string", str, True),
    "args": ("record", Mapping, True),
    "save_as": ("string", str, False),
    "if": ("string", str, False),
    "continue_on_error": ("boolean", bool, False),
}
"""A step's keys in the order zod checks them: the type each holds (as zod names it), whether it is required."""
_BACKSLASH_VAR = "bs"  # a pipeline var holding one backslash: see _text


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem with the call's shape, as discord's zod validation reports it (``VALIDATION_FAILED``).

    Attributes:
        path: where, zod's way (``steps.2.id``).
        message: what is wrong.
        code: zod's issue code (``invalid_type``, ``too_big``, ...), or mcpipe's (``unrecognized_keys``).
    """

    path: str
    message: str
    code: str


@dataclass(frozen=True, slots=True)
class Rejection:
    """A step refused before anything runs: the pipeline answers ``aborted``, this step in error.

    Attributes:
        index: the step's position (0-based).
        code: ``PIPELINE_RECURSION``, ``INTERPOLATION_FAILED``, ``UNKNOWN_TOOL`` or ``FORBIDDEN``.
        message: why.
    """

    index: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class DiscordStep:
    """One step as discord sees it.

    Attributes:
        id: its id (written, or ``step_<index>``).
        tool: the tool as written.
        args: its arguments as written.
        save_as: the alias its result is also saved under, or None.
        condition: its ``if``, or None.
        continue_on_error: whether the pipeline goes on after it fails.
    """

    id: str
    tool: str
    args: dict[str, Any]
    save_as: str | None = None
    condition: str | None = None
    continue_on_error: bool = False


@dataclass(frozen=True, slots=True)
class Translation:
    """A call translated: the plan, and what shaping its answer back needs.

    Attributes:
        compiled: the plan (one tool leaf per step).
        ids: each step's id in the plan (the discord id, or ``_<index>`` for a repeated one).
    """

    compiled: CompiledSpec
    ids: tuple[str, ...]


def parse_steps(args: object, *, max_steps: int = MAX_STEPS) -> tuple[list[DiscordStep], list[Issue]]:
    """Check the call's arguments as discord's input schema does, and read its steps.

    Unknown keys are refused (``unrecognized_keys``) where zod would drop them: a typo such as
    ``contine_on_error`` must not silently change what runs.

    Args:
        args: the ``tools/call`` arguments.
        max_steps: the cap (discord's 20, lower when the server's ``pipe.max_steps`` is).

    Returns:
        The steps (default ids filled in) and every issue found; the steps mean nothing when there are issues.
    """
    issues: list[Issue] = []
    if not isinstance(args, Mapping):
        return [], [_type_issue("", "object", json_type(args))]
    extra = [k for k in args if k != "steps"]
    if extra:
        issues.append(_unrecognized("", extra))
    raw = args.get("steps")
    if not isinstance(raw, list):
        issues.append(_type_issue("steps", "array", "undefined" if "steps" not in args else json_type(raw)))
        return [], issues
    if not raw:
        issues.append(Issue("steps", "Too small: expected array to have >=1 items", "too_small"))
    if len(raw) > max_steps:
        issues.append(Issue("steps", f"Too big: expected array to have <={max_steps} items", "too_big"))
    steps = [st for i, item in enumerate(raw) if (st := _parse_step(item, f"steps.{i}", i, issues)) is not None]
    return steps, issues


def _type_issue(path: str, expected: str, received: str) -> Issue:
    return Issue(path, f"Invalid input: expected {expected}, received {received}", "invalid_type")


def _unrecognized(path: str, keys: list[str]) -> Issue:
    shown = ", ".join(f'"{k}"' for k in keys)
    return Issue(path, f"Unrecognized key{'s' if len(keys) > 1 else ''}: {shown}", "unrecognized_keys")


_MISSING: Any = object()


def _parse_step(item: object, path: str, index: int, issues: list[Issue]) -> DiscordStep | None:
    if not isinstance(item, Mapping):
        issues.append(_type_issue(path, "object", json_type(item)))
        return None
    before = len(issues)
    extra = [k for k in item if k not in _STEP_FIELDS]
    if extra:
        issues.append(_unrecognized(path, extra))
    for key, (kind, tp, required) in _STEP_FIELDS.items():
        at = f"{path}.{key}"
        value = item.get(key, _MISSING)
        if value is _MISSING:
            if required:
                issues.append(_type_issue(at, kind, "undefined"))
        elif not isinstance(value, tp):
            issues.append(_type_issue(at, kind, json_type(value)))
        elif key == "id" and isinstance(value, str) and _ID.fullmatch(value) is None:
            issues.append(Issue(at, f"Invalid string: must match pattern {_ID_SOURCE}", "invalid_format"))
        elif value == "":
            issues.append(Issue(at, "Too small: expected string to have >=1 characters", "too_small"))
    if len(issues) > before:
        return None
    return DiscordStep(
        item.get("id", f"step_{index}"),
        item["tool"],
        dict(item["args"]),
        item.get("save_as"),
        item.get("if"),
        item.get("continue_on_error", False),
    )


# --- references ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ref:
    """A reference bound to the step it reads: its plan id and its path into that step's output."""

    step: int
    path: str  # mcpipe's path: steps.<id>.output...
    shown: str  # as written between the braces
    where: str  # the argument it is in (steps.1.args.message_id)


def _segments(text: str) -> list[str]:
    """interpolate.ts's ``resolvePath`` split: ``[N]`` is ``.N``, split on dots, trimmed, empties dropped."""
    return [s.strip() for s in _INDEX.sub(r".\1", text).split(".") if s.strip()]


def _segment(seg: str) -> str:
    """One discord path segment in mcpipe's path syntax, with JavaScript's meaning: digits (no leading zero)
    index an array or name an object's key, as ``obj[seg]`` does; anything else is a quoted key (never an
    index, never ``*``)."""
    if _PLAIN_INDEX.fullmatch(seg):
        return f".{seg}"
    return '["' + seg.replace("\\", "\\\\").replace('"', '\\"') + '"]'


@dataclass(frozen=True, slots=True)
class _Binder:
    """Binds ``{{name.path}}`` to the step that set ``name`` last before the referencing step (its id or its
    ``save_as``, as discord's variables are), else ``{{stepN...}}`` to the N-th step (1-based)."""

    steps: list[DiscordStep]
    ids: list[str]

    def bind(self, inner: str, before: int, where: str) -> _Ref | str:
        """The reference, or why it cannot be bound."""
        shown = inner.strip()
        segs = _segments(inner)
        if not segs:
            return f"`{{{{{inner}}}}}` is not a reference"
        name = segs[0]
        at = next(
            (j for j in range(before - 1, -1, -1) if self.steps[j].id == name or self.steps[j].save_as == name),
            None,
        )
        if at is None and (m := _STEP_N.fullmatch(name)) is not None and int(m.group(1)) <= before:
            at = int(m.group(1)) - 1
        if at is None:
            known = f"an id, a save_as, or step1..step{before}" if before else "this is the first step"
            return f"`{{{{{shown}}}}}` names no earlier step ({known})"
        path = f"steps.{self.ids[at]}.output" + "".join(_segment(s) for s in segs[1:])
        return _Ref(at, path, shown, where)


def _text(parts: list[str | _Ref]) -> str:
    """A mixed string as mcpipe's template text: each opener in the literal text escaped, each reference a
    ``${...}``. A literal backslash right before a reference cannot be written in mcpipe's syntax (it would
    escape the opener), so it is written as ``${vars.bs}`` (a var holding one backslash)."""
    out: list[str] = []
    for k, part in enumerate(parts):
        if isinstance(part, _Ref):
            out.append("${" + part.path + "}")
            continue
        text = _OPENERS.sub(lambda m: "\\" + m.group(0), part)
        if k + 1 < len(parts) and isinstance(parts[k + 1], _Ref):
            stripped = text.rstrip("\\")
            text = stripped + f"${{vars.{_BACKSLASH_VAR}}}" * (len(text) - len(stripped))
        out.append(text)
    return "".join(out)


@dataclass(slots=True)
class _Args:
    """A step's arguments as a template value, with the references it makes (in template order)."""

    refs: list[_Ref] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    room: list[int] = field(default_factory=lambda: [MAX_REFERENCES])
    """The placeholders the call may still hold (one list shared by its steps' ``_Args``)."""

    def value(self, value: object, binder: _Binder, at: int, loc: str) -> Any:
        if isinstance(value, str):
            return self.string(value, binder, at, loc)
        if isinstance(value, list):
            return [self.value(v, binder, at, f"{loc}.{i}") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            if "$ref" in value or "$literal" in value:
                # mcpipe's templates read these keys: the object is passed as it is, which only works when
                # nothing inside it is a reference.
                if _has_placeholder(value):
                    self.problems.append(
                        f"{loc}: an object with a `$ref` or `$literal` key cannot hold `{{{{...}}}}` references"
                    )
                return {"$literal": dict(value)}
            return {k: self.value(v, binder, at, f"{loc}.{k}") for k, v in value.items()}
        return value

    def string(self, text: str, binder: _Binder, at: int, loc: str) -> Any:
        if self.room[0] < 0:  # past the bound already (said once)
            return None
        matches = _placeholders(text, self.room[0])
        self.room[0] -= len(matches)
        if self.room[0] < 0:
            self.problems.append(
                f"{loc}: more than {MAX_REFERENCES} `{{{{...}}}}` references in one call (at most {MAX_REFERENCES})"
            )
            return None
        if not matches:
            return {"$literal": text} if _OPENERS.search(text) else text
        parts: list[str | _Ref] = []
        last = 0
        for m in matches:
            ref = binder.bind(m.inner, at, loc)
            if isinstance(ref, str):
                self.problems.append(f"{loc}: {ref}")
                continue
            parts += [text[last : m.start], ref]
            self.refs.append(ref)
            last = m.end
        parts.append(text[last:])
        if len(parts) == 3 and parts[0] == parts[2] == "" and isinstance(parts[1], _Ref):
            return {"$ref": parts[1].path}  # the whole string: the value keeps its type
        return _text(parts)


def _has_placeholder(value: object) -> bool:
    if isinstance(value, str):
        return bool(_placeholders(value, 0))
    if isinstance(value, list):
        return any(_has_placeholder(v) for v in value)
    if isinstance(value, Mapping):
        return any(_has_placeholder(v) for v in value.values())
    return False


def js_truthy(value: object) -> bool:
    """JavaScript's ``Boolean(value)`` for a JSON value: false for null, false, 0, NaN and ``""``; true for
    everything else, empty arrays and objects included (which Python calls false)."""
    if value is None or isinstance(value, (str, int, float)):  # a bool is an int
        return bool(value) and value == value  # NaN is not equal to itself
    return True


@dataclass(frozen=True, slots=True)
class _Condition:
    """A step's ``if``: true when its path resolves to a truthy value (``evalCondition``). A variable the
    path reads is missing when its step failed or was skipped (discord saves only successes), and a missing
    value is falsy: the step is skipped, not failed."""

    ref: _Ref
    source: str  # what a dry run's plan shows
    template: Template

    def evaluate(self, env: Mapping[str, object]) -> bool:
        if not _succeeded(env, self.ref.path):
            return False
        try:
            return js_truthy(self.template.resolve(env))
        except InterpolationError:
            return False


def _plan_id(path: str) -> str:
    return path.split(".", 2)[1]


def _succeeded(env: Mapping[str, Any], path: str) -> bool:
    r = env["steps"].get(_plan_id(path))
    return isinstance(r, dict) and r.get("ok") is True and not r.get("skipped")


@dataclass(frozen=True, slots=True)
class _Built:
    """What a step's leaf runs: the tool it calls, its arguments compiled, what its references read."""

    target: str
    args: Template
    refs: tuple[_Ref, ...]
    shown: dict[str, str]  # mcpipe's normalized reference -> as written between the braces
    ids: tuple[str, ...]  # discord's id of each step, by position


async def _run_step(
    step: Leaf[None, _Built], inputs: Mapping[str, object], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Run one step as discord's executor does: its references resolved from the steps that succeeded (a
    step that failed or was skipped sets no variable), then the tool called through the run's registry."""
    # discord's executor checks its abort signal before each step: a caller's cancellation stops the run
    # before the next step even when the tools before it never waited on anything.
    await trio.lowlevel.checkpoint_if_cancelled()
    b = step.built
    for ref in b.refs:
        if not _succeeded(env, ref.path):
            r = env["steps"].get(_plan_id(ref.path))
            why = "was skipped" if isinstance(r, dict) and r.get("skipped") else "failed"
            message = f"{ref.where}: cannot resolve `{{{{{ref.shown}}}}}`: step '{b.ids[ref.step]}' {why}"
            raise StepFailure(message, ErrorCode.INTERPOLATION_FAILED)
    try:
        args = b.args.resolve(env)
    except InterpolationError as e:
        shown = b.shown.get(e.reference)
        message = str(e) if shown is None else str(e).replace(f"`{e.reference}`", f"`{{{{{shown}}}}}`")
        raise StepFailure(message, ErrorCode.INTERPOLATION_FAILED) from None
    return await call_tool(ctx.tools, b.target, args, ctx)


def translate(steps: list[DiscordStep], targets: list[str], *, max_text_bytes: int) -> Translation | list[Rejection]:
    """The plan of a checked call: one tool leaf per step, in order, the pipeline stopping at a failed step
    unless that step continues on error.

    Args:
        steps: the steps (:func:`parse_steps`).
        targets: the tool each step calls, as the registry names it (a fronted server's prefix added).
        max_text_bytes: the most one resolved argument may hold (``pipe.max_output_bytes``).

    Returns:
        The translation, or the steps refused before anything runs (``INTERPOLATION_FAILED``: a reference
        that names no earlier step, or cannot be written as mcpipe's).
    """
    ids: list[str] = []
    for i, st in enumerate(steps):
        ids.append(st.id if st.id not in ids else f"_{i}")
    binder = _Binder(steps, ids)
    rejected: list[Rejection] = []
    leaves: list[Leaf[None, _Built]] = []
    discord_ids = tuple(st.id for st in steps)
    room = [MAX_REFERENCES]
    for i, st in enumerate(steps):
        loc = f"steps.{i}.args"
        a = _Args(room=room)
        value = {k: a.value(v, binder, i, f"{loc}.{k}") for k, v in st.args.items()}
        condition = None
        if st.condition is not None:
            whole = _PLACEHOLDER.fullmatch(st.condition.strip())
            ref = binder.bind(whole.group(1) if whole else st.condition, i, f"steps.{i}.if")
            if isinstance(ref, str):
                a.problems.append(f"steps.{i}.if: {ref}")
            else:
                try:
                    condition = _Condition(ref, st.condition, Template({"$ref": ref.path}, location=f"steps.{i}.if"))
                except TemplateSyntaxError as e:
                    a.problems.append(f"steps.{i}.if: {e.reason}")
        if a.problems:
            rejected.append(Rejection(i, ErrorCode.INTERPOLATION_FAILED, "; ".join(a.problems)))
            continue
        try:
            template = Template(value, location=loc, max_text_bytes=max_text_bytes)
        except TemplateSyntaxError as e:  # not expected: every string was written for mcpipe's syntax
            rejected.append(Rejection(i, ErrorCode.INTERPOLATION_FAILED, f"{e.location}: {e.reason}"))
            continue
        made = [r for r in template.references if r.startswith("steps.")]  # not the backslash var
        shown = dict(zip(made, (r.shown for r in a.refs), strict=True)) if len(made) == len(a.refs) else {}
        built = _Built(targets[i], template, tuple(a.refs), shown, discord_ids)
        leaves.append(
            Leaf(
                ids[i],
                f"steps[{i}]",
                "tool",
                None,
                built,
                run=_run_step,
                tool=targets[i],
                when=condition,
                continue_on_error=st.continue_on_error,
                references=tuple((loc, r.path) for r in a.refs),
            )
        )
    if rejected:
        return rejected
    plan = Pipeline(Template({_BACKSLASH_VAR: "\\"}), tuple(leaves), None, False, None, "")
    return Translation(CompiledSpec.of(plan, answer="full"), tuple(ids))
