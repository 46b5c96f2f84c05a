"""Property tests: the Rust ``Template`` and the pure-Python oracle agree on every input.

Random templates (strings made of text, placeholders, escapes, broken openers, quotes and unicode; ``$ref``
and ``$literal`` objects; nested objects and arrays) are compiled and resolved against random environments
by both implementations; they must give the same value, or the same error with the same attributes and
message.
"""

from __future__ import annotations

import math
import os
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

import oracle
from mcpipe._core import Template
from mcpipe.errors import InterpolationError, TemplateSyntaxError

# MCPIPE_PROPERTY_SCALE=10 runs ten times as many examples (a longer fuzzing session).
SCALE = int(os.environ.get("MCPIPE_PROPERTY_SCALE", "1"))
KEYS = ["a", "b", "x", "0", "1", "-1", "a b", "é", "output", "it's", 'q"', "*", "", "steps", "step1"]
STEP_IDS = ["search", "fetch", "a", "step2", "x-y"]

# --- environments ------------------------------------------------------------------------------------

text_chars = st.characters(codec="utf-8") | st.sampled_from(list("${}<>\\.[]'\" \t\n*-0123456789"))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(text_chars, max_size=8)
)
keys = st.sampled_from(KEYS) | st.sampled_from(KEYS) | st.text(text_chars, max_size=4)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(keys, inner, max_size=5)
        | st.dictionaries(keys, inner, min_size=3, max_size=12)
    ),
    max_leaves=10,
)


@st.composite
def environments(draw: st.DrawFn) -> dict[str, Any]:
    steps = {sid: {"output": draw(values), "text": draw(scalars)} for sid in draw(st.sets(st.sampled_from(STEP_IDS)))}
    env = {"vars": draw(st.dictionaries(keys, values, max_size=4)), "steps": steps, "last": draw(values)}
    env["args"] = draw(values)
    env["context"] = {"request_id": "r-1", "client": {"name": "t", "version": "1"}, "principal": None}
    for root in draw(st.sets(st.sampled_from(list(env)), max_size=1)):
        del env[root]
    return env


# --- templates ---------------------------------------------------------------------------------------


def quoted(key: str, quote: str) -> str:
    return "[" + quote + key.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote + "]"


plain_keys = [k for k in KEYS if k and all(c not in k for c in " '\"*")]
segments = st.one_of(
    st.sampled_from(plain_keys).map(lambda k: "." + k),
    st.sampled_from(plain_keys).map(lambda k: "." + k),
    st.sampled_from(["[0]", "[1]", "[-1]", ".*", "[*]", ".-2", "[7]"]),
    st.builds(quoted, keys, st.sampled_from(["'", '"'])),
    st.sampled_from(["[99999999999999999999999]", ".", "[", "[x]", "[*", "['a"]),
)
roots = st.sampled_from(["vars", "vars", "vars", "steps", "last", "args", "context", "nope", ""])
paths = st.builds(lambda r, s: r + "".join(s), roots, st.lists(segments, max_size=4))
step_heads = st.sampled_from([*STEP_IDS, *STEP_IDS, "step1", "step2", "step3", "step0", "9x", ""])
step_paths = st.builds(lambda h, s: h + "".join(s), step_heads, st.lists(segments, max_size=3))
ws = st.sampled_from(["", " ", "\t", "  "])


@st.composite
def placeholders(draw: st.DrawFn) -> str:
    opener, closer, form = draw(st.sampled_from([("${", "}", 0), ("{{", "}}", 1), ("$<", ">", 0), ("<<", ">>", 1)]))
    body = draw(step_paths if form else paths)
    # Defaults (issue 17): valid ones of every type, and broken ones.
    body += draw(
        st.sampled_from(["", "", "", " ?? 0", '??"x}y"', " ?? 'it\\'s'", "?? -1.5e3", " ?? null", " ?? true"])
        | st.sampled_from(["?? ", "?? nope", "?? 01", '?? "open', "?? 'a\\q'", '?? "\\ud800"', "?? falsey"])
    )
    closer = draw(st.sampled_from([closer, closer, closer, "", closer[:1] + " x"]))
    return draw(st.sampled_from(["", "\\"])) + opener + draw(ws) + body + draw(ws) + closer


fragments = st.one_of(
    placeholders(),
    placeholders(),
    placeholders(),
    st.text(text_chars, max_size=6),
    st.sampled_from(["\\", "$", "{", "<", "<<"]),
)
template_strings = st.lists(fragments, max_size=4).map("".join) | st.builds(
    lambda before, p, after: "".join([*before, p, *after]),
    st.lists(fragments, max_size=2),
    placeholders(),
    st.lists(fragments, max_size=2),
)
templates = st.recursive(
    template_strings | template_strings | scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(keys, inner, max_size=4)
        | st.builds(lambda p: {"$ref": p}, paths | paths | step_paths | template_strings)
        | st.builds(lambda p, d: {"$ref": p, "default": d}, paths, values)
        | st.builds(lambda v: {"$literal": v}, values)
    ),
    max_leaves=10,
)
with_references = st.builds(
    lambda before, p, after: "".join([*before, p, *after]),
    st.lists(fragments, max_size=2),
    placeholders(),
    st.lists(fragments, max_size=2),
) | st.builds(lambda p: {"$ref": p}, paths)
main_templates = st.one_of(
    with_references,
    st.dictionaries(keys, with_references | templates, min_size=1, max_size=4),
    st.lists(with_references | templates, min_size=1, max_size=4),
    templates,
)
step_id_args = st.one_of(
    st.none(), st.just(STEP_IDS), st.dictionaries(st.integers(1, 4), st.sampled_from(STEP_IDS), max_size=3)
)
locations = st.sampled_from(["", "args", "steps[2].args", "return"])


# --- comparing outcomes ------------------------------------------------------------------------------


def normal(value: Any) -> Any:
    """A comparable form: exact types kept, NaN made equal to itself."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    if isinstance(value, dict):
        return ("dict", [(type(k), k, normal(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [normal(v) for v in value])
    return (type(value).__name__, value)


def outcome(fn: Any) -> tuple[Any, ...]:
    try:
        return ("ok", normal(fn()))
    except TemplateSyntaxError as e:
        return ("syntax", str(e), e.reason, e.location)
    except InterpolationError as e:
        return ("missing", str(e), e.reference, e.location, e.segment, e.found_type, e.found_keys, e.found_length)
    except Exception as e:  # any other error must match by class and message
        return ("error", type(e), str(e))


def compiled(cls: Any, template: Any, step_ids: Any, location: str) -> tuple[Any, Any]:
    result = outcome(lambda: cls(template, step_ids=step_ids, location=location))
    if result[0] != "ok":
        return result, None
    t = cls(template, step_ids=step_ids, location=location)
    return ("ok", t.references, t.reference_sites), t


@settings(max_examples=250 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(main_templates, environments(), step_id_args, locations)
def test_rust_and_oracle_agree_on_every_template_and_environment(template, env, step_ids, location):
    rust_compiled, rust = compiled(Template, template, step_ids, location)
    oracle_compiled, slow = compiled(oracle.Template, template, step_ids, location)
    assert rust_compiled == oracle_compiled
    if rust is not None:
        assert rust.is_constant == (not slow.references)
        assert outcome(lambda: rust.resolve(env)) == outcome(lambda: slow.resolve(env))


@settings(max_examples=200 * SCALE, deadline=None)
@given(st.lists(fragments, min_size=1, max_size=6).map("".join), values)
def test_interpolated_text_matches_the_oracle_for_any_value(prefix, value):
    template = prefix + "|${vars.v}|"
    env = {"vars": {"v": value}}
    assert outcome(lambda: Template(template).resolve(env)) == outcome(lambda: oracle.Template(template).resolve(env))


@settings(max_examples=300 * SCALE, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
@example(562949953421312.25)  # two shortest forms equally close: Python takes the even digit
def test_floats_are_written_as_python_repr_in_text(x):
    assert Template("${vars.x} ").resolve({"vars": {"x": x}}) == repr(x) + " "


def segment_for(key: Any) -> str:
    if isinstance(key, int):
        return f"[{key}]" if key >= 0 else f".{key}"
    if key and all(c not in key for c in ".[]{}<>$\\\"' \t\n\r\f\v") and key != "*":
        return "." + key
    return quoted(key, "'" if "'" not in key else '"')


@st.composite
def existing_paths(draw: st.DrawFn, value: Any) -> str:
    """A reference that (mostly) exists in `vars`: each step picks a real key or index, or `*`."""
    path = "vars"
    for _ in range(draw(st.integers(0, 4))):
        if isinstance(value, dict) and value:
            key = draw(st.sampled_from(list(value)))
            path, value = path + segment_for(key), value[key]
        elif isinstance(value, (list, tuple)) and value:
            i = draw(st.integers(-len(value), len(value) - 1))
            if draw(st.booleans()):
                path, value = path + ".*", value[0]
            else:
                path, value = path + segment_for(i), value[i]
        else:
            break
    return path


@st.composite
def resolvable_cases(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    env_vars = draw(st.dictionaries(keys, values, min_size=1, max_size=5))
    refs = draw(st.lists(existing_paths(env_vars), min_size=1, max_size=3))
    pieces = [draw(st.sampled_from(["${%s}", "$<%s>", " ${ %s } "])) % r for r in refs]
    text = "".join(p + draw(st.text(text_chars, max_size=3)) for p in pieces)
    template = draw(st.sampled_from([text, {"$ref": refs[0]}, pieces[0], {"t": text, "r": [{"$ref": refs[-1]}]}]))
    return template, {"vars": env_vars}


@settings(max_examples=150 * SCALE, deadline=None)
@given(resolvable_cases())
def test_rust_and_oracle_agree_on_references_that_exist(case):
    template, env = case
    assert outcome(lambda: Template(template).resolve(env)) == outcome(lambda: oracle.Template(template).resolve(env))
