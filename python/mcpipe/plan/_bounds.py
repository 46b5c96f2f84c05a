"""Bounds on hostile input, checked before the work they protect (issue 9).

Each check is one small function that costs at most what its limit allows, never what the input holds:
the step count is counted by a walk that stops past ``max_steps`` and compiles nothing, sizes and depths
are measured by the Rust core's :func:`json_measure`, which stops past its limits. The limits themselves
live in :class:`mcpipe.plan.Limits` (the config's ``pipe`` section) and are documented in
``docs/reliability.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mcpipe._core import json_measure
from mcpipe.errors import OutputTooLargeError, Problem

__all__ = [
    "check_spec_size",
    "check_steps",
    "deepest_location",
    "depth_problem",
    "json_depth",
    "measure_output",
    "step_ids_for",
]

LIMIT = "LIMIT_EXCEEDED"


def json_depth(value: object, limit: int) -> int:
    """How deeply ``value``'s containers nest (``1`` is 0, ``[1]`` is 1), counted no further than ``limit + 1``."""
    return json_measure(value, max_depth=limit)[1]


def depth_problem(value: object, location: str, limit: int, what: str = "the value") -> Problem | None:
    """A located ``LIMIT_EXCEEDED`` problem when ``value`` nests deeper than ``limit``, else None."""
    if json_depth(value, limit) <= limit:
        return None
    return Problem(location, LIMIT, f"{what} nests more than {limit} levels deep; the limit is {limit}")


def deepest_location(value: object, limit: int, base: str = "") -> str:
    """Where ``value`` first nests past ``limit`` (``a.b[0].c``), found by an iterative walk: for messages
    about values already known to be too deep."""
    stack: list[tuple[Any, str, int]] = [(value, base, 0)]
    while stack:
        item, loc, depth = stack.pop()
        if isinstance(item, (Mapping, list, tuple)):
            if depth + 1 > limit:
                return loc
            pairs = item.items() if isinstance(item, Mapping) else enumerate(item)
            for key, child in pairs:
                sub = f"{loc}[{key}]" if isinstance(key, int) else f"{loc}.{key}" if loc else str(key)
                stack.append((child, sub, depth + 1))
    return base


def check_spec_size(data: object, text_bytes: int | None, *, max_bytes: int, max_steps: int) -> list[Problem]:
    """Problems of a spec too large to compile, found without compiling it.

    Args:
        data: the decoded spec.
        text_bytes: the size of its JSON text when it came as text, else None (then it is measured).
        max_bytes: the largest spec accepted.
        max_steps: the most steps accepted (every step object, nested and parallel children included).

    Returns:
        At most one problem per limit; empty when the spec may be compiled. The step walk visits at most
        ``max_steps`` steps (plus one list) and is iterative, so neither a long list, a wide group nor a deep
        nesting of pipes costs more than the limit.
    """
    problems = []
    size = text_bytes if text_bytes is not None else json_measure(data, max_bytes=max_bytes)[0]
    if size > max_bytes:
        problems.append(Problem("", LIMIT, f"the spec is at least {size} bytes; the limit is {max_bytes}"))
    steps = data.get("steps") if isinstance(data, Mapping) else None
    problems.extend(check_steps(steps, "steps", max_steps=max_steps, nested=_nested_steps))
    return problems


def check_steps(
    steps: object,
    location: str,
    *,
    max_steps: int,
    nested: Callable[[Any], tuple[str, list[Any]] | None],
    max_depth: int | None = None,
) -> list[Problem]:
    """Problems of a list of steps with too many steps or too deep a nesting, found without compiling it.

    Args:
        steps: the raw list of steps (anything else has no problems here: the compiler reports it).
        location: where the list is; the count problem is located there.
        max_steps: the most steps accepted, every nested one included.
        nested: a step's own list of steps, if it is a container: ``(suffix, list)``, the list standing at
            the step's location plus ``suffix`` (``.steps``, ``.parallel``, ``.pipe.steps``).
        max_depth: how deeply containers may nest (top-level steps are depth 0; a container at depth
            ``max_depth`` is one too many), located at the container; None: not checked here.

    Returns:
        The problems. The walk is iterative and visits the items of at most the lists it has counted until
        the count passes ``max_steps``, never deeper than ``max_depth``: neither a long list, a wide group
        nor a deep nesting costs more than the limits (and the input's own size).
    """
    problems: list[Problem] = []
    count = 0
    lists: list[tuple[Sequence[Any], str, int]] = [(steps, location, 0)] if isinstance(steps, list) else []
    while lists:
        items, loc, depth = lists.pop()
        count += len(items)
        inner = [(i, x) for i, x in enumerate(map(nested, items)) if x is not None]
        if count > max_steps:
            has = f"{count}" if not lists and not inner else f"at least {count}"
            problems.append(Problem(location, LIMIT, f"the pipeline has {has} steps; the limit is {max_steps}"))
            break
        for i, (suffix, children) in inner:
            where = f"{loc}[{i}]"
            if max_depth is not None and depth + 1 > max_depth:
                message = f"nesting is {depth + 1} levels deep here; the limit is {max_depth}"
                problems.append(Problem(where, LIMIT, message))
            else:
                lists.append((children, f"{where}{suffix}", depth + 1))
    return problems


def _nested_steps(item: object) -> tuple[str, list[Any]] | None:
    """An ``mcp_pipe`` step's own steps: a ``parallel`` group's, a ``pipe``'s."""
    if not isinstance(item, Mapping):
        return None
    children = item.get("parallel")
    if isinstance(children, list):
        return ".parallel", children
    pipe = item.get("pipe")
    if isinstance(pipe, Mapping) and isinstance(pipe.get("steps"), list):
        return ".pipe.steps", pipe["steps"]
    return None


_STEP_FORM = re.compile(r"(?:\{\{|<<)\s*step([1-9][0-9]*)")


def step_ids_for(value: object, ids: Sequence[str]) -> dict[int, str] | Sequence[str]:
    """The part of ``ids`` a template can use: the positions its ``{{stepN}}`` / ``<<stepN>>`` forms name.

    Handing every template the whole id list makes compiling a list of n steps cost n² (each template
    reads all n ids); this costs the template's own size. Short lists are handed as they are.
    """
    if len(ids) <= 8:
        return ids
    wanted: dict[int, str] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "{{" in item or "<<" in item:
                for m in _STEP_FORM.finditer(item):
                    n = int(m.group(1))
                    if n <= len(ids):
                        wanted[n] = ids[n - 1]
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return wanted


def measure_output(
    value: object, *, max_bytes: int, max_depth: int, location: str, what: str, wrapping: int = 0
) -> OutputTooLargeError | None:
    """The error for an output past ``max_bytes`` or nested deeper than ``max_depth``, else None;
    ``wrapping`` is how many levels the caller's own containers around the output add."""
    size, depth = json_measure(value, max_bytes=max_bytes, max_depth=max_depth + wrapping)
    if size > max_bytes:
        return OutputTooLargeError(size, max_bytes, location, what)
    if depth > max_depth + wrapping:
        return OutputTooLargeError(size, max_bytes, location, what, f"nests more than {max_depth} levels deep")
    return None
