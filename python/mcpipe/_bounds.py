"""Bounds on hostile input, checked before the work they protect (issue 9).

Each check is one small function that costs at most what its limit allows, never what the input holds:
the step count is counted by a walk that stops past ``max_steps`` and compiles nothing, sizes and depths
are measured by the Rust core's :func:`json_measure`, which stops past its limits. The limits themselves
live in :class:`mcpipe.compile.Limits` (the config's ``pipe`` section) and are documented in
``docs/reliability.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mcpipe._core import json_measure
from mcpipe.errors import OutputTooLargeError, Problem

__all__ = [
    "check_spec_size",
    "deepest_location",
    "depth_problem",
    "json_depth",
    "measure_output",
    "step_ids_for",
]

LIMIT = "LIMIT_EXCEEDED"


def json_depth(value: Any, limit: int) -> int:
    """How deeply ``value``'s containers nest (``1`` is 0, ``[1]`` is 1), counted no further than ``limit + 1``."""
    return json_measure(value, max_depth=limit)[1]


def depth_problem(value: Any, location: str, limit: int, what: str = "the value") -> Problem | None:
    """A located ``LIMIT_EXCEEDED`` problem when ``value`` nests deeper than ``limit``, else None."""
    if json_depth(value, limit) <= limit:
        return None
    return Problem(location, LIMIT, f"{what} nests more than {limit} levels deep; the limit is {limit}")


def deepest_location(value: Any, limit: int, base: str = "") -> str:
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


def check_spec_size(data: Any, text_bytes: int | None, *, max_bytes: int, max_steps: int) -> list[Problem]:
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
    count, exact = _count_steps(data, max_steps)
    if count > max_steps:
        has = f"{count}" if exact else f"at least {count}"
        problems.append(Problem("steps", LIMIT, f"the pipeline has {has} steps; the limit is {max_steps}"))
    return problems


def _count_steps(data: Any, limit: int) -> tuple[int, bool]:
    """Step objects in ``data``, counted until the count passes ``limit``; and whether that is all of them."""
    count = 0
    lists: list[Sequence[Any]] = []
    if isinstance(data, Mapping) and isinstance(data.get("steps"), list):
        lists.append(data["steps"])
    while lists:
        items = lists.pop()
        count += len(items)
        nested = [x for x in map(_nested_steps, items) if x is not None]
        if count > limit:
            return count, not lists and not nested
        lists.extend(nested)
    return count, True


def _nested_steps(item: Any) -> list[Any] | None:
    if not isinstance(item, Mapping):
        return None
    children = item.get("parallel")
    if isinstance(children, list):
        return children
    pipe = item.get("pipe")
    if isinstance(pipe, Mapping) and isinstance(pipe.get("steps"), list):
        return pipe["steps"]
    return None


_STEP_FORM = re.compile(r"(?:\{\{|<<)\s*step([1-9][0-9]*)")


def step_ids_for(value: Any, ids: Sequence[str]) -> dict[int, str] | Sequence[str]:
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
    value: Any, *, max_bytes: int, max_depth: int, location: str, what: str, wrapping: int = 0
) -> OutputTooLargeError | None:
    """The error for an output past ``max_bytes`` or nested deeper than ``max_depth``, else None;
    ``wrapping`` is how many levels the caller's own containers around the output add."""
    size, depth = json_measure(value, max_bytes=max_bytes, max_depth=max_depth + wrapping)
    if size > max_bytes:
        return OutputTooLargeError(size, max_bytes, location, what)
    if depth > max_depth + wrapping:
        return OutputTooLargeError(size, max_bytes, location, what, f"nests more than {max_depth} levels deep")
    return None
