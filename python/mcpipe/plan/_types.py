"""Typed chaining: a reference that feeds a tool's argument a value of the wrong type, found before
anything runs.

Where a step's argument is exactly one reference to an earlier tool step's output
(``"limit": "${steps.search.structured.total}"``), the producing tool has an ``outputSchema`` and the
consuming tool an ``inputSchema`` that types the argument, :func:`type_problems` compares the two types.
Anything the schemas leave open (no type, a ``$ref``, a path the schema does not describe) is not
checked: only a sure mismatch is reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcpipe._describe import did_you_mean
from mcpipe.errors import ErrorCode, Problem

__all__ = ["ArgumentSite", "TypedSite", "argument_problems", "type_problems"]

_OUTPUT = re.compile(r"steps\.([A-Za-z_][A-Za-z0-9_-]*)\.(?:structured|output)((?:\.[A-Za-z0-9_-]+)*)")


@dataclass(frozen=True, slots=True)
class TypedSite:
    """One argument fed by one reference to a tool step's output.

    Attributes:
        location: the argument's location (``steps[2].args.limit``).
        tool: the tool the argument goes to.
        argument: the argument's name.
        reference: the normalized reference (``steps.search.structured.total``).
        producer: the tool of the step the reference reads.
    """

    location: str
    tool: str
    argument: str
    reference: str
    producer: str


@dataclass(frozen=True, slots=True)
class ArgumentSite:
    """The arguments of one tool step whose ``args`` is an object: its keys (never interpolated, so known
    before anything runs) and the JSON type of each argument written as a plain value (no reference).

    Attributes:
        location: the step's location (``steps[2]``).
        tool: the tool the step calls.
        keys: the argument names, as written.
        literals: ``(name, JSON type)`` of each argument that holds no reference.
    """

    location: str
    tool: str
    keys: tuple[str, ...]
    literals: tuple[tuple[str, str], ...]


def argument_problems(sites: Iterable[ArgumentSite], tools: object) -> list[Problem]:
    """What each step's ``args`` gets wrong against its tool's ``inputSchema``, found before anything runs
    (a later step's bad arguments would otherwise be refused only after the earlier steps had acted): a
    required argument missing, an argument the schema does not allow (``additionalProperties: false``), a
    plain value of a type the schema does not allow. What the schema leaves open is not checked."""
    get = getattr(tools, "get", None)
    if get is None:
        return []
    problems = []
    for site in sites:
        tool = get(site.tool)
        schema = getattr(tool, "input_schema", None) if tool is not None else None
        if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
            continue
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        if isinstance(required, list):
            missing = [r for r in required if isinstance(r, str) and r not in site.keys]
            if missing:
                names = ", ".join(f"`{m}`" for m in missing)
                problems.append(
                    Problem(
                        f"{site.location}.args",
                        ErrorCode.INVALID_SPEC,
                        f"tool '{site.tool}' requires {'argument' if len(missing) == 1 else 'arguments'} {names}",
                    )
                )
        if schema.get("additionalProperties") is False:
            for key in site.keys:
                if key not in props:
                    allowed = ", ".join(f"`{k}`" for k in props) or "none"
                    problems.append(
                        Problem(
                            f"{site.location}.args.{key}",
                            ErrorCode.INVALID_SPEC,
                            f"tool '{site.tool}' has no argument `{key}`{did_you_mean(key, list(props))} "
                            f"(its arguments: {allowed})",
                        )
                    )
        for key, kind in site.literals:
            expected = _types(props.get(key))
            if expected is not None and not _fits(frozenset({kind}), expected):
                problems.append(
                    Problem(
                        f"{site.location}.args.{key}",
                        ErrorCode.INVALID_SPEC,
                        f"tool '{site.tool}' expects {_names(expected)}, got {kind}",
                    )
                )
    return problems


def literal_type(value: object) -> str:
    """The JSON type of a plain value (``{"$literal": v}`` is ``v``'s)."""
    if isinstance(value, Mapping) and list(value) == ["$literal"]:
        value = value["$literal"]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    return "object"


def output_path(reference: str) -> tuple[str, list[str]] | None:
    """The step and the keys under its output a reference reads, when it is a plain path into
    ``steps.<id>.structured`` / ``.output`` (else None: not checked)."""
    m = _OUTPUT.fullmatch(reference)
    if m is None:
        return None
    return m.group(1), [k for k in m.group(2).split(".") if k]


def type_problems(sites: Iterable[TypedSite], tools: object) -> list[Problem]:
    """The arguments whose reference's type (from the producer's ``outputSchema``) does not fit the
    argument's type (from the consumer's ``inputSchema``)."""
    get = getattr(tools, "get", None)
    if get is None:
        return []
    problems = []
    for site in sites:
        producer, consumer = get(site.producer), get(site.tool)
        if producer is None or consumer is None:
            continue
        out_schema = getattr(producer, "output_schema", None)
        in_schema = getattr(consumer, "input_schema", None)
        if not isinstance(out_schema, Mapping) or not isinstance(in_schema, Mapping):
            continue
        props = in_schema.get("properties")
        expected = _types(props.get(site.argument)) if isinstance(props, Mapping) else None
        path = output_path(site.reference)
        produced = _types(_follow(out_schema, path[1])) if path is not None else None
        if expected is None or produced is None or _fits(produced, expected):
            continue
        problems.append(
            Problem(
                site.location,
                ErrorCode.INVALID_SPEC,
                f"expects {_names(expected)}, {site.reference} is {_names(produced)}",
            )
        )
    return problems


def _follow(schema: object, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(schema, Mapping):
            return None
        props = schema.get("properties")
        if isinstance(props, Mapping) and key in props:
            schema = props[key]
        elif key.lstrip("-").isdigit() and isinstance(schema.get("items"), Mapping):
            schema = schema["items"]
        else:
            return None
    return schema


def _types(schema: object) -> frozenset[str] | None:
    """The JSON types a schema allows, or None when it does not say (or says it in a way not read here)."""
    if not isinstance(schema, Mapping):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return frozenset({t})
    if isinstance(t, list) and all(isinstance(x, str) for x in t) and t:
        return frozenset(t)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            found: set[str] = set()
            for option in options:
                sub = _types(option)
                if sub is None:
                    return None
                found |= sub
            return frozenset(found)
    return None


def _fits(produced: frozenset[str], expected: frozenset[str]) -> bool:
    wider = set(expected)
    if "number" in wider:
        wider.add("integer")
    return produced <= wider


def _names(types: frozenset[str]) -> str:
    return " or ".join(sorted(types))
