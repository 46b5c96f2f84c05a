"""``mcpipe._core.Template``: every rule of the template language (contract sections 3-4), table-driven.

Each case gives a template, an environment and the expected result written out literally (an error is
written as ``Fails(...)`` with the attributes it must carry). The same cases also run through the oracle,
so the oracle and the core cannot drift from these literal values either.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

import oracle
from mcpipe._core import Template
from mcpipe.errors import InterpolationError, OutputTooLargeError, TemplateSyntaxError


@dataclass(frozen=True)
class Fails:
    """The expected error: its class, its message and its attributes."""

    cls: type[Exception]
    message: str
    attrs: dict[str, Any] = field(default_factory=dict)


def missing(message: str, **attrs: Any) -> Fails:
    return Fails(InterpolationError, message, attrs)


def syntax(message: str, **attrs: Any) -> Fails:
    return Fails(TemplateSyntaxError, message, attrs)


ENV: dict[str, Any] = {
    "vars": {
        "q": "mcp protocol",
        "n": 3,
        "f": 1.5,
        "big": 10**30,
        "yes": True,
        "no": False,
        "none": None,
        "obj": {"a": 1, "b": [1, "x"]},
        "list": [10, 20, 30],
        "tuple": (1, 2),
        "a.b": "dotted",
        "a b": "spaced",
        "[x]": "bracketed",
        "0": "zero key",
        "-1": "minus one key",
        "*": "star key",
        "": "empty key",
        "é": "accent",
        'it\'s "q"': "quotes",
        "unicode": "héllo ✓ 😀",
        "ctl": 'a\nb\t"c"\\',
        "ctlobj": {"s": 'a\nb\t"c"\\', "u": "\x01é"},
        "nested": {"deep": {"deeper": [{"x": 1}, {"x": 2}]}},
        "people": [{"name": "ada", "langs": ["en", "fr"]}, {"name": "bob", "langs": []}],
        "byid": {"p1": {"name": "ada"}, "p2": {"name": "bob"}},
        "many": {f"k{i}": i for i in range(12)},
        "empty": {},
        "nan": float("nan"),
        "inf": float("-inf"),
        "e16": 1e16,
        "small": 1e-5,
        "tie": 562949953421312.25,
    },
    "steps": {
        "search": {"id": "search", "output": {"results": [{"url": "https://a", "title": "A"}]}, "text": "t"},
        "fetch": {"id": "fetch", "output": "page text", "ok": True},
        "step3": {"id": "step3", "output": [1, 2]},
    },
    "last": {"output": "page text"},
    "args": {"topic": "trio"},
    "context": {"request_id": "r-1", "client": {"name": "cli", "version": "1"}, "principal": None},
}
IDS = ["search", "fetch"]

CASES: list[tuple[str, Any, Any]] = [
    # --- typed references ---
    ("ref keeps a number", {"$ref": "vars.n"}, 3),
    ("ref keeps an object", {"$ref": "vars.obj"}, {"a": 1, "b": [1, "x"]}),
    ("ref keeps null", {"$ref": "vars.none"}, None),
    ("ref keeps a boolean", {"$ref": "vars.yes"}, True),
    ("ref allows whitespace around the path", {"$ref": "  vars.q\t"}, "mcp protocol"),
    ("ref to a whole root", {"$ref": "args"}, {"topic": "trio"}),
    ("ref turns a tuple into a list", {"$ref": "vars.tuple"}, [1, 2]),
    ("ref with another key is a plain object", {"$ref": "vars.n", "x": 1}, {"$ref": "vars.n", "x": 1}),
    ("ref that is not a string", {"$ref": 3}, syntax("`$ref` takes a path string", location="")),
    (
        "ref with trailing text",
        {"$ref": "vars.a b"},
        syntax('invalid `$ref` path "vars.a b": unexpected ` `'),
    ),
    (
        "ref with an unknown root",
        {"$ref": "step1.x"},
        syntax(
            'invalid `$ref` path "step1.x": unknown root `step1` (expected one of vars, steps, last, args, context)'
        ),
    ),
    (
        "ref written as a placeholder",
        {"$ref": "${vars.n}"},
        syntax('invalid `$ref` path "${vars.n}": expected a reference'),
    ),
    (
        "ref path quoted as JSON in messages",
        {"$ref": 'a"\n'},
        syntax('invalid `$ref` path "a\\"\\n": unknown root `a` (expected one of vars, steps, last, args, context)'),
    ),
    # --- literals ---
    ("literal is untouched", {"$literal": {"$ref": "vars.n", "s": "${vars.q}"}}, {"$ref": "vars.n", "s": "${vars.q}"}),
    ("literal of a string with an opener", {"$literal": "${not a ref"}, "${not a ref"),
    ("literal with another key is a plain object", {"$literal": 1, "x": "${vars.n}"}, {"$literal": 1, "x": 3}),
    # --- whole-string placeholders ---
    ("whole placeholder keeps the number type", "${vars.n}", 3),
    ("whole placeholder keeps a float", "${vars.f}", 1.5),
    ("whole placeholder keeps an object", "${vars.obj}", {"a": 1, "b": [1, "x"]}),
    ("whole placeholder keeps null", "${vars.none}", None),
    ("whole placeholder allows whitespace inside the braces", "${ \tvars.n  }", 3),
    ("dollar-angle placeholder", "$<vars.n>", 3),
    ("step placeholder by position", "{{step1}}", {"results": [{"url": "https://a", "title": "A"}]}),
    ("step placeholder with a path", "{{step1.results[0].url}}", "https://a"),
    ("step placeholder by id", "{{ fetch }}", "page text"),
    ("step placeholder by id with a path", "{{search.results.0.title}}", "A"),
    ("double-angle step placeholder", "<<step2>>", "page text"),
    # --- text interpolation ---
    ("string interpolates as itself", "q=${vars.q}!", "q=mcp protocol!"),
    ("number interpolates in shortest form", "n=${vars.n} f=${vars.f}", "n=3 f=1.5"),
    ("big integers interpolate exactly", "${vars.big}.", "1000000000000000000000000000000."),
    ("floats interpolate as Python repr", "${vars.e16} ${vars.small}", "1e+16 1e-05"),
    ("float ties break to the even digit like Python repr", "${vars.tie} ", "562949953421312.2 "),
    ("non-finite floats interpolate as JSON does", "${vars.nan} ${vars.inf}", "NaN -Infinity"),
    ("booleans interpolate as true and false", "${vars.yes}/${vars.no}", "true/false"),
    ("null interpolates as the empty string", "[${vars.none}]", "[]"),
    ("objects interpolate as compact JSON", "o=${vars.obj}", 'o={"a":1,"b":[1,"x"]}'),
    ("arrays interpolate as compact JSON", "${vars.list} ", "[10,20,30] "),
    ("tuples interpolate as JSON arrays", "${vars.tuple} ", "[1,2] "),
    ("unicode is kept in text", "${vars.unicode}|${vars.people.*.name}", 'héllo ✓ 😀|["ada","bob"]'),
    (
        "a placeholder inside a placeholder is an error",
        "${vars.obj.b} ${$<vars.ctl>}",
        syntax("invalid placeholder at character 14: expected a reference (character 16)"),
    ),
    ("strings inside JSON are escaped", "j=${vars.ctlobj}", 'j={"s":"a\\nb\\t\\"c\\"\\\\","u":"\\u0001é"}'),
    ("nested objects interpolate as compact JSON", "x${vars.nested.deep}", 'x{"deeper":[{"x":1},{"x":2}]}'),
    ("a top-level string is not escaped", "x${vars.ctl}", 'xa\nb\t"c"\\'),
    (
        "empty containers and nested arrays interpolate",
        "${vars.empty}${vars.people}",
        '{}[{"name":"ada","langs":["en","fr"]},{"name":"bob","langs":[]}]',
    ),
    ("two placeholders and nothing else make text", "${vars.n}${vars.n}", "33"),
    (
        "mixed brackets in one string",
        "${vars.q} {{step2}} $<args.topic> <<fetch>>",
        "mcp protocol page text trio page text",
    ),
    # --- escapes and plain text ---
    ("escaped dollar-brace is literal", "\\${vars.n}", "${vars.n}"),
    ("escaped double brace is literal", "a \\{{step1}} b", "a {{step1}} b"),
    ("escaped alternative openers are literal", "\\$<vars.n> \\<<step1>>", "$<vars.n> <<step1>>"),
    ("a backslash before anything else stays", "a\\b\\", "a\\b\\"),
    ("an escaped placeholder next to a real one", "\\${x} ${vars.n}", "${x} 3"),
    ("double angles without a reference are text", "a << b, x <<EOF", "a << b, x <<EOF"),
    ("dollar-angle without a reference is text", "if $<5> then", "if $<5> then"),
    ("dollar-angle without a closer is text", "$<vars.n", "$<vars.n"),
    ("lone dollars and braces are text", "$ { } { $", "$ { } { $"),
    ("object keys are never interpolated", {"${vars.q}": "${vars.n}"}, {"${vars.q}": 3}),
    ("constants pass through", {"a": [1, 2.5, None, True, "s"]}, {"a": [1, 2.5, None, True, "s"]}),
    # --- syntax errors ---
    (
        "dollar-brace without a closer",
        "ab ${vars.n",
        syntax("`${` has no closing `}` (character 3)", reason="`${` has no closing `}` (character 3)"),
    ),
    ("double brace without a closer", "é {{step1", syntax("`{{` has no closing `}}` (character 2)")),
    (
        "unknown root in a placeholder",
        "${nope.x}",
        syntax(
            "invalid placeholder at character 0: unknown root `nope` "
            "(expected one of vars, steps, last, args, context) (character 2)"
        ),
    ),
    (
        "step position past the end of the list",
        "{{step3.-1}}",
        syntax(
            "invalid placeholder at character 0: `step3` is past the end of the step list (step 3 of 2 steps)"
            " (character 2)"
        ),
    ),
    ("empty placeholder", "x ${ }", syntax("invalid placeholder at character 2: expected a reference (character 5)")),
    (
        "empty path segment",
        "${vars..a}",
        syntax("invalid placeholder at character 0: empty path segment (character 7)"),
    ),
    (
        "something after the path",
        "${vars.a b}",
        syntax("invalid placeholder at character 0: expected `}` (character 9)"),
    ),
    ("not a step id", "{{1st}}", syntax("invalid placeholder at character 0: `1st` is not a step id (character 2)")),
    (
        "bad bracket",
        "${vars[x]}",
        syntax("invalid placeholder at character 0: expected an index, `*` or a quoted key after `[` (character 7)"),
    ),
    ("unclosed bracket", "${vars[1}", syntax("invalid placeholder at character 0: expected `]` (character 8)")),
    (
        "unterminated quoted key",
        "${vars['a}",
        syntax("invalid placeholder at character 0: unterminated quoted key (character 10)"),
    ),
    # --- paths ---
    ("dotted digits index an array", "${vars.list.1}", 20),
    ("bracketed index", "${vars.list[2]}", 30),
    ("negative index counts from the end", "${vars.list.-1}", 30),
    ("bracketed negative index", "${vars.list[-3]}", 10),
    ("digits on an object are a key", "${vars.0}", "zero key"),
    ("negative digits on an object are a key", "${vars.-1}", "minus one key"),
    ("bracketed digits on an object are a key", "${vars[0]}", "zero key"),
    ("double-quoted key with a dot", '${vars["a.b"]}', "dotted"),
    ("single-quoted key with a space", "${vars['a b']}", "spaced"),
    ("quoted key with brackets", "${vars['[x]']}", "bracketed"),
    ("quoted key with escaped quotes", "${vars['it\\'s \"q\"']}", "quotes"),
    ("quoted star is a key", "${vars['*']}", "star key"),
    ("quoted empty key", "${vars['']}", "empty key"),
    ("unicode plain key", "${vars.é}", "accent"),
    ("star maps over an array", {"$ref": "vars.people.*.name"}, ["ada", "bob"]),
    ("bracketed star", {"$ref": "vars.people[*].langs"}, [["en", "fr"], []]),
    ("star maps over object values in order", {"$ref": "vars.byid.*.name"}, ["ada", "bob"]),
    ("two stars nest", {"$ref": "vars.people.*.langs.*"}, [["en", "fr"], []]),
    ("star at the end copies the elements", {"$ref": "vars.obj.*"}, [1, [1, "x"]]),
    ("star over an empty object", {"$ref": "vars.empty.*"}, []),
    # --- resolve errors ---
    (
        "missing key names the keys found",
        {"x": {"$ref": "vars.obj.c"}},
        missing(
            'x: cannot resolve `vars.obj.c`: `c` not found in object with 2 keys: "a", "b"',
            reference="vars.obj.c",
            location="x",
            segment="c",
            found_type="object",
            found_keys=["a", "b"],
            found_length=2,
        ),
    ),
    (
        "missing key in a big object shows ten keys",
        "${vars.many.zz}",
        missing(
            "cannot resolve `vars.many.zz`: `zz` not found in object with 12 keys: "
            + ", ".join(f'"k{i}"' for i in range(10))
            + ", ...",
            found_keys=[f"k{i}" for i in range(10)],
            found_length=12,
        ),
    ),
    (
        "index out of range names the length",
        ["${vars.list.3}"],
        missing(
            "[0]: cannot resolve `vars.list.3`: `3` not found in array of length 3",
            location="[0]",
            segment="3",
            found_type="array",
            found_keys=None,
            found_length=3,
        ),
    ),
    (
        "negative index out of range",
        "${vars.list[-4]}",
        missing("cannot resolve `vars.list.-4`: `-4` not found in array of length 3"),
    ),
    (
        "huge index is out of range",
        "${vars.list.99999999999999999999999}",
        missing(
            "cannot resolve `vars.list.99999999999999999999999`: "
            "`99999999999999999999999` not found in array of length 3"
        ),
    ),
    (
        "a key on an array fails",
        "${vars.list.a}",
        missing("cannot resolve `vars.list.a`: `a` not found in array of length 3"),
    ),
    (
        "a quoted digit key on an array fails",
        "${vars.list['0']}",
        missing('cannot resolve `vars.list["0"]`: `["0"]` not found in array of length 3', segment='["0"]'),
    ),
    (
        "a segment on a string fails",
        "${vars.q.x}",
        missing("cannot resolve `vars.q.x`: `x` not found in string", found_type="string", found_length=None),
    ),
    ("a segment on a number fails", "${vars.n.x}", missing("cannot resolve `vars.n.x`: `x` not found in number")),
    ("a segment on a boolean fails", "${vars.yes.x}", missing("cannot resolve `vars.yes.x`: `x` not found in boolean")),
    (
        "a segment on null fails",
        "${vars.none.x}",
        missing("cannot resolve `vars.none.x`: `x` not found in null", found_type="null"),
    ),
    (
        "a segment on an empty object",
        "${vars.empty.x}",
        missing("cannot resolve `vars.empty.x`: `x` not found in empty object", found_keys=[], found_length=0),
    ),
    (
        "star on a string fails",
        "${vars.q.*}",
        missing("cannot resolve `vars.q.*`: `*` not found in string", segment="*"),
    ),
    (
        "a failure under a star names the element",
        {"$ref": "vars.people.*.langs.0"},
        missing("cannot resolve `vars.people.*.langs.0`: `0` not found in array of length 0"),
    ),
    (
        "a missing step names the steps that ran",
        "{{step2.x}}",
        missing("cannot resolve `steps.fetch.output.x`: `x` not found in string"),
    ),
    (
        "a step that did not run",
        "{{nope}}",
        missing(
            'cannot resolve `steps.nope.output`: `nope` not found in object with 3 keys: "search", "fetch", "step3"'
        ),
    ),
    (
        "quoted keys show in brackets in errors",
        "${vars['a.b'].x}",
        missing('cannot resolve `vars["a.b"].x`: `x` not found in string', reference='vars["a.b"].x'),
    ),
    (
        "quoted plain keys normalize to dots",
        "${vars['obj'][\"zz\"]}",
        missing('cannot resolve `vars.obj.zz`: `zz` not found in object with 2 keys: "a", "b"'),
    ),
    (
        "interpolated text fails like a typed reference",
        "a ${vars.obj.c} b",
        missing('cannot resolve `vars.obj.c`: `c` not found in object with 2 keys: "a", "b"'),
    ),
]


def check(template: Any, env: Any, expected: Any, cls: Any = Template, **kw: Any) -> None:
    if isinstance(expected, Fails):
        with pytest.raises(expected.cls) as info:
            cls(template, **kw).resolve(env)
        assert type(info.value) is expected.cls
        assert str(info.value) == expected.message
        for name, value in expected.attrs.items():
            assert getattr(info.value, name) == value, name
    else:
        result = cls(template, **kw).resolve(env)
        assert result == expected
        assert type(result) is type(expected)


@pytest.mark.parametrize(("template", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_template_resolves_to_the_written_value(template, expected):
    check(template, ENV, expected, step_ids=IDS)


@pytest.mark.parametrize(("template", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_oracle_resolves_to_the_written_value(template, expected):
    check(template, ENV, expected, cls=oracle.Template, step_ids=IDS)


# --- the environment --------------------------------------------------------------------------------


def test_a_missing_root_names_the_roots_of_the_environment():
    with pytest.raises(InterpolationError) as info:
        Template({"a": ["${last.x}"]}, location="steps[2].args").resolve({"vars": {}, "steps": {}})
    e = info.value
    assert (
        str(e)
        == 'steps[2].args.a[0]: cannot resolve `last.x`: `last` not found in environment with 2 keys: "vars", "steps"'
    )
    assert (e.reference, e.location, e.segment, e.found_type) == ("last.x", "steps[2].args.a[0]", "last", "environment")
    assert (e.found_keys, e.found_length) == (["vars", "steps"], 2)


def test_an_empty_environment_is_described_as_empty():
    with pytest.raises(InterpolationError, match=r"`vars` not found in empty environment$"):
        Template("${vars}").resolve({})


def test_dict_and_list_subclasses_are_followed_and_copied_as_plain_containers():
    env = {"vars": collections.OrderedDict(a=collections.UserList([1]), b=MyList([{"x": 1}]))}
    assert Template({"$ref": "vars"}).resolve({"vars": {"d": collections.OrderedDict(k=MyList([1]))}}) == {
        "d": {"k": [1]}
    }
    result = Template({"$ref": "vars.b"}).resolve(env)
    assert type(result) is list and result == [{"x": 1}]
    assert Template("${vars.b.0.x}").resolve(env) == 1
    assert Template({"$ref": "vars.*"}).resolve({"vars": collections.OrderedDict(a=1, b=2)}) == [1, 2]


class MyList(list):
    pass


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


def test_foreign_values_pass_through_typed_references_unchanged():
    thing = Opaque()
    assert Template("${vars.t}").resolve({"vars": {"t": thing}}) is thing
    assert Template({"$ref": "vars.t"}).resolve({"vars": {"t": {"x": thing}}})["x"] is thing


def test_foreign_values_in_text_fail_like_json_dumps():
    with pytest.raises(TypeError, match="Object of type Opaque is not JSON serializable"):
        Template("a ${vars.t}").resolve({"vars": {"t": Opaque()}})
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        Template("a ${vars.t}").resolve({"vars": {"t": [1, {2}]}})


def test_json_edge_cases_in_text_match_json_dumps():
    env = {"vars": {"d": {1: "int key", None: "null key"}, "big": [2**70], "i": IntFlagLike(3)}}
    assert Template("${vars.d}!").resolve(env) == '{"1":"int key","null":"null key"}!'
    assert Template("${vars.big}!").resolve(env) == f"[{2**70}]!"
    assert Template("${vars.i}!").resolve(env) == "3!"


class IntFlagLike(int):
    def __repr__(self) -> str:
        return "IntFlagLike()"


def test_a_cyclic_value_raises_instead_of_crashing():
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="Circular reference detected"):
        Template("x${vars.c}").resolve({"vars": {"c": cyclic}})
    with pytest.raises(RecursionError):
        Template("${vars.c}").resolve({"vars": {"c": cyclic}})


def test_non_dict_environments_are_read_through_the_mapping_protocol():
    env = collections.ChainMap({"vars": {"x": 1}})
    assert Template("${vars.x}").resolve(env) == 1
    with pytest.raises(InterpolationError, match='`args` not found in environment with 1 key: "vars"'):
        Template("${args}").resolve(env)


# --- compiling ---------------------------------------------------------------------------------------


def test_references_are_listed_normalized_in_template_order():
    t = Template(
        {"a": "${vars['x'].y[0]} {{step2.z}}", "b": [{"$ref": "steps.s.output.*"}], "c": {"$literal": "${vars.no}"}},
        step_ids=["s", "t"],
        location="args",
    )
    assert t.references == ["vars.x.y.0", "steps.t.output.z", "steps.s.output.*"]
    assert t.reference_sites == [
        ("args.a", "vars.x.y.0"),
        ("args.a", "steps.t.output.z"),
        ("args.b[0]", "steps.s.output.*"),
    ]
    assert not t.is_constant
    assert Template({"a": [1, "\\${x}"], "b": {"$literal": "${y}"}}).is_constant


@pytest.mark.parametrize(
    ("step_ids", "expected"),
    [
        (None, "steps.step2.output"),
        (["a", "b"], "steps.b.output"),
        (["step2"], "steps.step2.output"),
        ({2: "two"}, "steps.two.output"),
        ({True: "one", 2: "two"}, "steps.two.output"),
    ],
)
def test_step_ids_map_positions_to_ids(step_ids, expected):
    assert Template("{{step2}}", step_ids=step_ids).references == [expected]
    assert oracle.Template("{{step2}}", step_ids=step_ids).references == [expected]


@pytest.mark.parametrize("cls", [Template, oracle.Template])
def test_a_step_position_past_the_end_of_the_list_is_refused_at_compile_time_where_it_is(cls):
    with pytest.raises(TemplateSyntaxError) as info:
        cls({"a": "ok", "b": "see {{step3}}"}, step_ids=["step1", "fetch"], location="steps[2].args")
    assert info.value.location == "steps[2].args.b"
    assert "`step3` is past the end of the step list (step 3 of 2 steps)" in info.value.reason
    # a mapping names some positions only, and no ids leave `stepN` as the id it spells
    assert cls("{{step3}}", step_ids={1: "a"}).references == ["steps.step3.output"]
    assert cls("{{step3}}").references == ["steps.step3.output"]


@pytest.mark.parametrize(
    ("step_ids", "message"),
    [({"1": "a"}, "step_ids keys must be integers, not str"), (["a", 1], "step ids must be strings, not int")],
)
def test_step_ids_must_be_integers_to_strings(step_ids, message):
    for cls in (Template, oracle.Template):
        with pytest.raises(TypeError, match=message):
            cls("x", step_ids=step_ids)


@pytest.mark.parametrize(
    ("template", "location"),
    [
        ({"a": {"b c": [0, "${bad}"]}}, 'args.a["b c"][1]'),
        ({"0": "${bad}"}, 'args["0"]'),
        ({1: "${bad}"}, "args[1]"),
        ({"a-b_c": "${bad}"}, "args.a-b_c"),
        (("${bad}",), "args[0]"),
    ],
)
def test_syntax_errors_name_their_location(template, location):
    for cls in (Template, oracle.Template):
        with pytest.raises(TemplateSyntaxError) as info:
            cls(template, location="args")
        assert info.value.location == location
        assert info.value.reason.startswith("invalid placeholder at character 0: unknown root `bad`")
        assert str(info.value) == f"{location}: {info.value.reason}"


def test_a_lone_surrogate_is_allowed_only_in_plain_strings():
    assert Template({"a": "x\ud800"}).resolve({}) == {"a": "x\ud800"}
    assert Template("${vars.s}!").resolve({"vars": {"s": "\udc00"}}) == "\udc00!"
    for cls in (Template, oracle.Template):
        with pytest.raises(TemplateSyntaxError, match="lone surrogate"):
            cls("\ud800${vars.x}")
        with pytest.raises(TemplateSyntaxError, match="lone surrogate"):
            cls({"$ref": "vars.\ud800"})


def test_absurdly_deep_templates_raise_recursion_error_instead_of_crashing():
    deep: Any = "${vars.x}"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        Template(deep)
    shallow: Any = "${vars.x}"
    for _ in range(500):
        shallow = {"a": shallow}
    assert Template(shallow).references == ["vars.x"]


def test_templates_are_frozen():
    t = Template("${vars.x}")
    with pytest.raises(AttributeError):
        t.references = []  # type: ignore[misc]


# --- fresh results -----------------------------------------------------------------------------------


def test_every_resolve_returns_new_containers_that_share_nothing_with_env_or_template():
    env = {"vars": {"obj": {"a": [1, {"b": 2}]}, "list": [[1], [2]], "t": ([1],)}}
    template = {
        "const": {"k": [1, 2, {"x": []}]},
        "lit": {"$literal": {"k": [1]}},
        "ref": {"$ref": "vars.obj"},
        "star": {"$ref": "vars.list.*"},
        "tuple": "${vars.t}",
        "arr": ["${vars.obj.a}", 3],
    }
    snapshot = copy.deepcopy(env)
    t = Template(template)
    first = t.resolve(env)
    expected = copy.deepcopy(first)
    for value in (first, first["const"], first["lit"], first["ref"], first["star"], first["arr"]):
        mutate(value)
    first["ref"]["a"][1]["b"] = "changed"
    first["star"][0].append("changed")
    first["tuple"][0].append("changed")
    first["const"]["k"][2]["x"].append("changed")
    assert env == snapshot
    assert t.resolve(env) == expected
    assert t.resolve(env) is not t.resolve(env)


def mutate(value: Any) -> None:
    if isinstance(value, dict):
        value["mutated"] = True
    else:
        value.append("mutated")


def test_mutating_the_input_after_compiling_does_not_change_the_template():
    literal = {"k": [1]}
    value = {"lit": {"$literal": literal}, "const": [1, [2]]}
    t = Template(value)
    literal["k"].append(2)
    value["const"][1].append(3)
    assert t.resolve({}) == {"lit": {"k": [1]}, "const": [1, [2]]}


@pytest.mark.parametrize(
    ("template", "values", "expected", "base"),
    [
        (
            "https://h/r/${args.a}/i?q=${args.b}",
            {"a": "../x y", "b": "1&c=2"},
            "https://h/r/..%2Fx%20y/i?q=1%26c%3D2",
            "https://h/r/",
        ),
        ("${args.base}/r/${args.a}", {"base": "http://h:8/v1", "a": "a/b"}, "http://h:8/v1/r/a%2Fb", None),
        ("${args.scheme}://h/${args.a}", {"scheme": "https", "a": "é"}, "https://h/%C3%A9", None),
        ("https://h/${args.a}", {"a": None}, "https://h/", "https://h/"),
        ("https://h/${args.a}", {"a": {"k": [1]}}, "https://h/%7B%22k%22%3A%5B1%5D%7D", "https://h/"),
        ("${args.a}", {"a": "http://h/../x"}, "http://h/../x", None),
    ],
)
def test_a_url_template_percent_encodes_the_values_after_its_scheme(template, values, expected, base):
    t = Template(template, url=True)
    assert t.resolve({"args": values}) == expected
    assert t.url_base == base
    assert Template(template).url_base is None


def test_a_url_template_is_bounded_by_its_encoded_size():
    t = Template("https://h/${args.a}", url=True, max_text_bytes=100)
    assert t.resolve({"args": {"a": "x" * 80}}) == "https://h/" + "x" * 80
    with pytest.raises(OutputTooLargeError):
        t.resolve({"args": {"a": "/" * 40}})  # 120 bytes once encoded
