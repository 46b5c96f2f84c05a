"""A fast yes for the common JSON Schemas, in front of ``jsonschema``: every validator
:func:`mcpipe._jsonschema.validator` makes (tool arguments, a declared pipeline's output, a downstream tool's
``outputSchema``, an OpenAPI operation's arguments) has it in front when its schema is in the subset.

``jsonschema`` validates a small object in 10-100 us, more than the rest of a short declared pipeline or of
a proxied call's own work. Most schemas use a handful of keywords, so for those this module compiles the
schema into nested Python closures that answer one question, cheaply: *is the instance certainly valid?* A True is
final. A False (or a schema using anything outside the subset) sends the instance to ``jsonschema``,
which decides and writes the messages. So the closures may be stricter than JSON Schema, never more
lenient: where the subset's semantics are subtle (numbers that are integers, equality in ``enum``) they
answer False and let ``jsonschema`` decide.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sized
from typing import Any, cast

from mcpipe._pattern import compile_pattern

__all__ = ["compile_fast"]

Check = Callable[[Any], bool]

_TYPES: dict[str, Check] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,  # 1.0 is an integer to JSON Schema: jsonschema decides that one
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}
# Keywords with no effect on validity, and the ones this module implements.
_NOTES = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"})
_KNOWN = _NOTES | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "$schema",
}


def compile_fast(schema: object) -> Check | None:
    """A check that answers True only for instances valid against ``schema``; None when the schema uses
    something outside the subset (then every instance goes to ``jsonschema``)."""
    if isinstance(schema, Mapping) and schema.get("$schema") not in (
        None,
        "https://json-schema.org/draft/2020-12/schema",
        "http://json-schema.org/draft-07/schema#",
    ):
        return None
    try:
        return _compile(schema)
    except _Unsupported:
        return None


class _Unsupported(Exception):
    pass


def _compile(schema: object) -> Check:
    if schema is True or (isinstance(schema, Mapping) and not (set(schema) - _NOTES - {"$schema"})):
        return _anything
    if not isinstance(schema, Mapping) or set(schema) - _KNOWN:
        raise _Unsupported
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not all(isinstance(k, str) and k in _TYPES for k in kinds):
            raise _Unsupported
        checks.append(_TYPES[kinds[0]] if len(kinds) == 1 else _any_of(tuple(_TYPES[k] for k in kinds)))
    if "enum" in schema or "const" in schema:
        allowed = schema["enum"] if "enum" in schema else [schema["const"]]
        if not isinstance(allowed, list) or not all(type(a) in _SCALARS for a in allowed):
            raise _Unsupported
        checks.append(_one_of(frozenset((type(a), a) for a in allowed)))
    checks.extend(_numbers(schema))
    checks.extend(_strings(schema))
    checks.extend(_arrays(schema))
    checks.extend(_objects(schema))
    if not checks:
        return _anything
    return checks[0] if len(checks) == 1 else _all_of(tuple(checks))


_SCALARS = (str, int, float, bool, type(None))


def _anything(v: object) -> bool:
    return True


def _any_of(tests: tuple[Check, ...]) -> Check:
    def check(v: object) -> bool:
        return any(t(v) for t in tests)

    return check


def _all_of(tests: tuple[Check, ...]) -> Check:
    def check(v: object) -> bool:
        return all(t(v) for t in tests)

    return check


def _one_of(pairs: frozenset[tuple[type, Any]]) -> Check:
    # The same type and ==: stricter than JSON Schema's equality (1 and 1.0), never more lenient.
    def check(v: object) -> bool:
        return type(v) in _SCALARS and (type(v), v) in pairs

    return check


def _number(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if value is None:
        return None
    if type(value) not in (int, float):
        raise _Unsupported
    return value  # type: ignore[no-any-return]


def _is_number(v: object) -> bool:
    return type(v) in (int, float)


def _bound(limit: float, compare: Callable[[Any, float], bool]) -> Check:
    def check(v: object) -> bool:
        return not _is_number(v) or compare(v, limit)

    return check


def _numbers(schema: Mapping[str, object]) -> list[Check]:
    out: list[Check] = []
    for key, compare in _COMPARISONS:
        limit = _number(schema, key)
        if limit is not None:
            out.append(_bound(limit, compare))
    return out


_COMPARISONS: tuple[tuple[str, Callable[[Any, float], bool]], ...] = (
    ("minimum", lambda v, b: v >= b),
    ("maximum", lambda v, b: v <= b),
    ("exclusiveMinimum", lambda v, b: v > b),
    ("exclusiveMaximum", lambda v, b: v < b),
)


def _count(schema: Mapping[str, object], key: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise _Unsupported
    return value


def _length(kind: type, low: int | None, high: int | None) -> Check:
    lo = 0 if low is None else low
    hi = high

    def check(v: object) -> bool:
        if type(v) is not kind:
            return True
        n = len(cast(Sized, v))
        return n >= lo and (hi is None or n <= hi)

    return check


def _strings(schema: Mapping[str, object]) -> list[Check]:
    out: list[Check] = []
    low, high = _count(schema, "minLength"), _count(schema, "maxLength")
    if low is not None or high is not None:
        out.append(_length(str, low, high))
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise _Unsupported
        try:
            compiled = compile_pattern(pattern)
        except re.error:
            raise _Unsupported from None
        if not compiled.linear:  # matched under a deadline, off the event loop: jsonschema's path does that
            raise _Unsupported
        search = compiled.search

        def matches(v: object) -> bool:
            return type(v) is not str or search(v)

        out.append(matches)
    return out


def _arrays(schema: Mapping[str, object]) -> list[Check]:
    out: list[Check] = []
    low, high = _count(schema, "minItems"), _count(schema, "maxItems")
    if low is not None or high is not None:
        out.append(_length(list, low, high))
    if "items" in schema:
        item = _compile(schema["items"])

        def items(v: object) -> bool:
            return type(v) is not list or all(item(x) for x in v)

        out.append(items)
    return out


def _objects(schema: Mapping[str, object]) -> list[Check]:
    out: list[Check] = []
    required = schema.get("required")
    if required is not None:
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _Unsupported
        names = tuple(required)

        def present(v: object) -> bool:
            return type(v) is not dict or all(n in v for n in names)

        out.append(present)
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, Mapping):
            raise _Unsupported
        compiled = tuple((name, _compile(sub)) for name, sub in props.items())

        def properties(v: object) -> bool:
            return type(v) is not dict or all(c(v[n]) for n, c in compiled if n in v)

        out.append(properties)
    extra = schema.get("additionalProperties")
    if extra is not None and extra is not True:
        known = frozenset(props or ())
        rest = None if extra is False else _compile(extra)

        def additional(v: object) -> bool:
            if type(v) is not dict:
                return True
            if rest is None:
                return all(k in known for k in v)
            return all(rest(x) for k, x in v.items() if k not in known)

        out.append(additional)
    return out
