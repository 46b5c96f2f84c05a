"""JSON Schema validators whose patterns cannot hold the server: ``jsonschema``'s validators with the keywords
that match patterns (``pattern``, ``patternProperties``, ``additionalProperties``, ``unevaluatedProperties``)
matching through :mod:`mcpipe._pattern` instead of ``re`` (issue 20, point 8).

Every schema mcpipe validates against goes through :func:`validator`: declared pipelines' ``input_schema`` and
``output_schema``, a downstream tool's ``outputSchema``, a model's structured output. A schema whose every
pattern is matched in linear time (:func:`needs_thread` is False, nearly always) is validated where it is;
one with a pattern only the fallback engine takes is validated in a thread (:func:`errors_async`), so its
deadline never holds the event loop. A pattern past its deadline is a validation error of the instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import ValidationError
    from jsonschema.protocols import Validator

from mcpipe._fastschema import compile_fast
from mcpipe._pattern import PatternTimeout, compile_pattern
from mcpipe._util import RunLimiter

__all__ = ["Checked", "errors_async", "needs_thread", "patterns_of", "validator", "warm", "warmed"]


def validator(schema: object, *, default: type[Any] | None = None, **kwargs: object) -> Any:
    """A validator of ``schema`` (its ``$schema``'s draft, else ``default``, else Draft 2020-12) matching
    patterns safely. ``jsonschema`` is imported here, on the first schema: it takes a command a second
    (its format checkers build grammars at import).

    Raises:
        re.error: a pattern no engine takes (as ``jsonschema`` raised).
    """
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    cls = validator_for(schema, default=Draft202012Validator if default is None else default)
    checker = _safe(cls)(schema, **kwargs)
    fast = compile_fast(schema)
    return checker if fast is None else Checked(checker, fast)


class Checked:
    """A validator with :func:`~mcpipe._fastschema.compile_fast`'s check of its schema in front: an instance
    the check accepts has no errors, and only one it does not accept is walked by ``jsonschema`` (which then
    decides, and words the errors). Every other attribute is the ``jsonschema`` validator's."""

    __slots__ = ("checker", "fast")

    def __init__(self, checker: Validator, fast: Callable[[Any], bool]) -> None:
        self.checker = checker
        self.fast = fast

    def iter_errors(self, instance: Any) -> Iterable[ValidationError]:
        """The instance's errors: none at once when the compiled check accepts it."""
        if self.fast(instance):
            return ()
        return self.checker.iter_errors(instance)

    def is_valid(self, instance: Any) -> bool:
        """Whether the instance has no errors."""
        return self.fast(instance) or self.checker.is_valid(instance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.checker, name)


def warm() -> None:
    """Import ``jsonschema`` now. A server calls this in a worker thread once it is answering, so that its
    first call does not import it on the event loop: with the ``format`` checkers installed (the extra
    ``jsonschema[format]``), the import builds grammars for a second or more, and ``/healthz`` would wait
    that long behind the first call that validates a schema."""
    import jsonschema.validators  # noqa: F401  (imported for its side effect: loaded once, kept in sys.modules)


async def warmed() -> None:
    """:func:`warm` in a worker thread, the first time: an async caller about to make its first validator
    calls this, so that importing ``jsonschema`` (seconds on a loaded host) does not hold the event loop, and
    with it the keepers renewing the leases of queued runs."""
    import sys

    if "jsonschema.validators" not in sys.modules:
        import trio

        await trio.to_thread.run_sync(warm)


def patterns_of(schema: object) -> Iterator[str]:
    """Every pattern written in ``schema`` (``pattern`` values, ``patternProperties`` keys), found by an
    iterative walk (a property named ``pattern`` whose value is a schema is not one)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    yield value
                elif key == "patternProperties" and isinstance(value, Mapping):
                    yield from (k for k in value if isinstance(k, str))
                    stack.extend(value.values())
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def needs_thread(schema: object) -> bool:
    """Whether validating against ``schema`` may match a pattern with the fallback engine (then validate
    with :func:`errors_async`, off the event loop). A pattern neither engine takes counts: it fails there."""
    for source in patterns_of(schema):
        try:
            if not compile_pattern(source).linear:
                return True
        except Exception:  # re.error: let validation report it, in a thread like the fallback
            return True
    return False


_threads = RunLimiter("mcpipe_schema_threads", 4)


async def errors_async(checker: Any, instance: Any, *, in_thread: bool) -> list[ValidationError]:
    """Every error of ``instance`` under ``checker`` (a :func:`validator`); in a thread when ``in_thread``
    (:func:`needs_thread` of its schema)."""
    if not in_thread:
        return list(checker.iter_errors(instance))
    import trio

    return await trio.to_thread.run_sync(lambda: list(checker.iter_errors(instance)), limiter=_threads())


# --- the keywords ------------------------------------------------------------------------------------------


def _found(pattern: str, text: str) -> bool | str:
    """Whether ``pattern`` matches in ``text``; the reason as a string when it could not be told in time."""
    try:
        return compile_pattern(pattern).search(text)
    except PatternTimeout as e:
        return str(e)


def _pattern(validator: Validator, patrn: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    from jsonschema import ValidationError

    if validator.is_type(instance, "string"):
        found = _found(patrn, instance)
        if isinstance(found, str):
            yield ValidationError(found)
        elif not found:
            yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Validator, pattern_properties: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for k, v in instance.items():
            found = _found(pattern, k)
            if isinstance(found, str):
                yield ValidationError(found)
            elif found:
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional(instance: Any, schema: Any) -> Iterator[Any]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for name in instance:
        if name not in properties and not any(_found(p, name) is True for p in patterns):
            yield name


def _additional_properties(validator: Validator, ap: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    # jsonschema's own, with find_additional_properties matching through mcpipe._pattern.
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            listed = sorted(extras, key=str)
            verb = "was" if len(listed) == 1 else "were"
            shown = ", ".join(repr(extra) for extra in listed)
            yield ValidationError(f"Additional properties are not allowed ({shown} {verb} unexpected)")


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator: Validator, instance: Any, schema: Any) -> list[Any]:
    """``jsonschema._utils.find_evaluated_property_keys_by_schema`` (MIT, Julian Berman), with
    ``patternProperties`` matched through :mod:`mcpipe._pattern`."""
    if validator.is_type(schema, "boolean"):
        return []
    keys: list[Any] = []
    for ref_keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(ref_keyword)
        if ref is not None:
            resolved = validator._resolver.lookup(ref)
            keys += _evaluated_keys(
                validator.evolve(schema=resolved.contents, _resolver=resolved.resolver), instance, resolved.contents
            )
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys += properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys += (key for key, value in instance.items() if _valid(validator.descend(value, subschema)))
    if "patternProperties" in schema:
        for name in instance:
            if any(_found(p, name) is True for p in schema["patternProperties"]):
                keys.append(name)
    if "dependentSchemas" in schema:
        for name, subschema in schema["dependentSchemas"].items():
            if name in instance:
                keys += _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _valid(validator.descend(instance, subschema)):
                keys += _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys += _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys += _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys += _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator: Validator, unevaluated: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    left = []
    for name in instance:
        if name not in evaluated:
            for _ in validator.descend(instance[name], unevaluated, path=name, schema_path=name):
                left.append(name)
    if left and unevaluated is False:
        listed = sorted(left, key=str)
        verb = "was" if len(listed) == 1 else "were"
        shown = ", ".join(repr(extra) for extra in listed)
        yield ValidationError(f"Unevaluated properties are not allowed ({shown} {verb} unexpected)")


@lru_cache(maxsize=16)
def _safe(cls: type[Any]) -> type[Any]:
    keywords: dict[str, Any] = {}
    known = cls.VALIDATORS
    if "pattern" in known:
        keywords["pattern"] = _pattern
    if "patternProperties" in known:
        keywords["patternProperties"] = _pattern_properties
    if "additionalProperties" in known:
        keywords["additionalProperties"] = _additional_properties
    if "unevaluatedProperties" in known:
        keywords["unevaluatedProperties"] = _unevaluated_properties
    from jsonschema.validators import extend

    return extend(cls, keywords)
