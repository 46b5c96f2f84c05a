"""compile_spec: contract sections 1, 2 and 5 (shape, ids, references, tools, limits)."""

from __future__ import annotations

import json

import pytest

from mcpipe import Limits, SpecError, compile_spec
from mcpipe.compile import clear_cache
from mcpipe.plan import Leaf, Parallel, Pipe

TOOLS = {"search", "fetch", "extract", "echo"}


def tool(tid=None, name="echo", **args):
    step = {"tool": name, "args": args}
    if tid:
        step["id"] = tid
    return step


def problems(spec, **kw):
    with pytest.raises(SpecError) as info:
        compile_spec(spec, **kw)
    return [(p.location, p.code, p.message) for p in info.value.problems]


# --- accepted shapes ---------------------------------------------------------------------------------


def test_spec_object_json_text_bytes_and_wrapper_compile_alike():
    spec = {"steps": [tool("a", x=1)]}
    text = json.dumps(spec)
    forms = [spec, text, text.encode(), {"spec": spec}, {"spec": text}]
    plans = [compile_spec(f, tools=TOOLS).plan for f in forms]
    assert all(isinstance(p.steps[0], Leaf) and p.steps[0].id == "a" for p in plans)


def test_default_ids_are_step_and_position():
    plan = compile_spec({"steps": [tool(), tool("named"), {"parallel": [tool(), tool()]}]}).plan
    assert [s.id for s in plan.steps] == ["step1", "named", "step3"]
    group = plan.steps[2]
    assert isinstance(group, Parallel)
    assert [c.id for c in group.children] == ["step1", "step2"]
    assert group.children[1].location == "steps[2].parallel[1]"


def test_explicit_step_n_id_at_its_own_position_is_allowed():
    plan = compile_spec({"steps": [tool("step1"), tool("step2")]}).plan
    assert [s.id for s in plan.steps] == ["step1", "step2"]


def test_nested_pipe_compiles_with_its_own_scope():
    spec = {
        "vars": {"q": "x"},
        "steps": [
            tool("a", v="${vars.q}"),
            {"id": "inner", "pipe": {"vars": {"from_a": "${steps.a.output}"}, "steps": [tool(x="${vars.from_a}")]}},
        ],
        "return": {"$ref": "steps.inner.result"},
    }
    compiled = compile_spec(spec, tools=TOOLS)
    inner = compiled.plan.steps[1]
    assert isinstance(inner, Pipe)
    assert inner.pipe.location == "steps[1].pipe"
    assert compiled.leaf_count == 2 and compiled.step_count == 3


def test_summary_counts_come_from_every_level():
    spec = {"steps": [{"parallel": [tool(), {"pipe": {"steps": [tool(), tool()]}}]}, tool()]}
    compiled = compile_spec(spec)
    assert compiled.leaf_count == 4
    assert compiled.step_count == 6
    assert [loc for loc, _ in compiled.tool_sites] == [
        "steps[0].parallel[0]",
        "steps[0].parallel[1].pipe.steps[0]",
        "steps[0].parallel[1].pipe.steps[1]",
        "steps[1]",
    ]


def test_step_n_placeholders_map_to_the_ids_of_the_list():
    plan = compile_spec({"steps": [tool("search"), tool(u="{{step1.results.0.url}}")]}).plan
    assert plan.steps[1].args.references == ["steps.search.output.results.0.url"]


def test_parallel_children_read_step_n_of_the_enclosing_list():
    plan = compile_spec({"steps": [tool("first"), {"parallel": [tool(u="{{step1.x}}")]}]}).plan
    assert plan.steps[1].children[0].args.references == ["steps.first.output.x"]


def test_the_same_spec_text_compiles_once():
    clear_cache()
    spec = json.dumps({"steps": [tool("a")]})
    assert compile_spec(spec) is compile_spec(spec)
    assert compile_spec(spec, limits=Limits(max_steps=3)) is not compile_spec(spec)


def test_cached_plans_still_check_tools_per_call():
    spec = {"steps": [tool("a", name="search")]}
    compile_spec(spec, tools=TOOLS)
    assert problems(spec, tools={"fetch"}) == [("steps[0].tool", "UNKNOWN_TOOL", "unknown tool 'search'")]


# --- every rejection, with its location -----------------------------------------------------------

REJECTED = [
    # shape and types
    ("not an object", [], ("", "INVALID_SPEC", "a pipeline spec must be an object, got array")),
    ("missing steps", {"vars": {}}, ("", "INVALID_SPEC", "Object missing required field `steps`")),
    ("empty steps", {"steps": []}, ("steps", "INVALID_SPEC", "Expected `array` of length >= 1")),
    ("vars not object", {"vars": 3, "steps": [tool()]}, ("vars", "INVALID_SPEC", "Expected `object`, got `int`")),
    (
        "bad continue_on_error",
        {"steps": [tool()], "continue_on_error": "yes"},
        ("continue_on_error", "INVALID_SPEC", "Expected `bool`, got `str`"),
    ),
    (
        "negative timeout",
        {"steps": [tool()], "timeout_ms": 0},
        ("timeout_ms", "INVALID_SPEC", "Expected `float` > 0.0"),
    ),
    (
        "unknown top-level field",
        {"steps": [tool()], "retrun": 1},
        ("retrun", "INVALID_SPEC", "unknown field `retrun` (did you mean `return`?)"),
    ),
    (
        "unknown step field",
        {"steps": [{"tool": "echo", "arg": {}}]},
        ("steps[0].arg", "INVALID_SPEC", "unknown field `arg` (did you mean `args`?)"),
    ),
    ("step not object", {"steps": ["echo"]}, ("steps[0]", "INVALID_SPEC", "a step must be an object, got string")),
    (
        "no kind",
        {"steps": [{"id": "a"}]},
        ("steps[0]", "INVALID_SPEC", "a step needs exactly one of `tool`, `parallel` or `pipe` (found none)"),
    ),
    (
        "two kinds",
        {"steps": [{"tool": "echo", "parallel": [tool()]}]},
        (
            "steps[0]",
            "INVALID_SPEC",
            "a step needs exactly one of `tool`, `parallel` or `pipe` (found `tool` and `parallel`)",
        ),
    ),
    (
        "args not object",
        {"steps": [{"tool": "echo", "args": [1]}]},
        ("steps[0].args", "INVALID_SPEC", "args must be an object, got array"),
    ),
    ("empty tool name", {"steps": [{"tool": ""}]}, ("steps[0].tool", "INVALID_SPEC", "Expected `str` of length >= 1")),
    (
        "empty parallel",
        {"steps": [{"parallel": []}]},
        ("steps[0].parallel", "INVALID_SPEC", "Expected `array` of length >= 1"),
    ),
    (
        "pipe not object",
        {"steps": [{"pipe": [tool()]}]},
        ("steps[0].pipe", "INVALID_SPEC", "Expected `object`, got `array`"),
    ),
    # ids
    (
        "bad id",
        {"steps": [tool("9a")]},
        ("steps[0].id", "INVALID_SPEC", "invalid id '9a': ids match [A-Za-z_][A-Za-z0-9_-]*"),
    ),
    (
        "duplicate id",
        {"steps": [tool("a"), tool("a")]},
        ("steps[1].id", "INVALID_SPEC", "duplicate id 'a' (also steps[0])"),
    ),
    (
        "reserved id",
        {"steps": [tool("step3")]},
        ("steps[0].id", "INVALID_SPEC", "id 'step3' is reserved for the step at position 3"),
    ),
    (
        "default id taken explicitly elsewhere",
        {"steps": [tool(), tool("step1")]},
        ("steps[1].id", "INVALID_SPEC", "id 'step1' is reserved for the step at position 1"),
    ),
    (
        "duplicate id among parallel children",
        {"steps": [{"parallel": [tool("x"), tool("x")]}]},
        ("steps[0].parallel[1].id", "INVALID_SPEC", "duplicate id 'x' (also steps[0].parallel[0])"),
    ),
    # tools
    ("unknown tool", {"steps": [tool(name="nope")]}, ("steps[0].tool", "UNKNOWN_TOOL", "unknown tool 'nope'")),
    (
        "mcp_pipe as a tool",
        {"steps": [tool(name="mcp_pipe")]},
        ("steps[0].tool", "INVALID_SPEC", "`mcp_pipe` cannot be called as a tool; use a `pipe` step"),
    ),
    # references
    (
        "unknown step",
        {"steps": [tool("a"), tool(u="${steps.fetch.output}")]},
        ("steps[1].args.u", "INVALID_SPEC", "reference to unknown step 'fetch'"),
    ),
    (
        "forward reference",
        {"steps": [tool(u={"$ref": "steps.b.output"}), tool("b")]},
        ("steps[0].args.u", "INVALID_SPEC", "reference to step 'b', which does not run before this step"),
    ),
    (
        "self reference",
        {"steps": [tool("a", u="${steps.a.output}")]},
        ("steps[0].args.u", "INVALID_SPEC", "reference to step 'a', which does not run before this step"),
    ),
    (
        "step n out of range",
        {"steps": [tool(u="{{step2}}")]},
        (
            "steps[0].args.u",
            "INVALID_SPEC",
            "invalid placeholder at character 0: `step2` is past the end of the step list (step 2 of 1 step)"
            " (character 2)",
        ),
    ),
    (
        "step n forward",
        {"steps": [tool(u="{{step2}}"), tool("b")]},
        ("steps[0].args.u", "INVALID_SPEC", "reference to step 'b', which does not run before this step"),
    ),
    (
        "sibling reference",
        {"steps": [{"id": "g", "parallel": [tool("p1"), tool("p2", u="${steps.p1.output}")]}]},
        ("steps[0].parallel[1].args.u", "INVALID_SPEC", "reference to step 'p1', a sibling in the same parallel group"),
    ),
    (
        "nested pipe cannot see the parent's steps",
        {"steps": [tool("a"), {"pipe": {"steps": [tool(u="${steps.a.output}")]}}]},
        ("steps[1].pipe.steps[0].args.u", "INVALID_SPEC", "reference to unknown step 'a'"),
    ),
    (
        "nested pipe cannot see the parent's vars",
        {"vars": {"q": 1}, "steps": [{"pipe": {"steps": [tool(u="${vars.q}")]}}]},
        ("steps[0].pipe.steps[0].args.u", "INVALID_SPEC", "reference `vars.q`: no var named 'q'"),
    ),
    (
        "unknown var",
        {"vars": {"q": 1}, "steps": [tool(u="${vars.qq}")]},
        ("steps[0].args.u", "INVALID_SPEC", "reference `vars.qq`: no var named 'qq'"),
    ),
    (
        "last before any step",
        {"steps": [tool(u="${last.output}")]},
        ("steps[0].args.u", "INVALID_SPEC", "reference `last.output`: no step has finished here, so `last` is null"),
    ),
    (
        "unknown root",
        {"steps": [tool(u="${step.a}")]},
        (
            "steps[0].args.u",
            "INVALID_SPEC",
            "invalid placeholder at character 0: unknown root `step` (expected one of vars, steps, last, args, "
            "context) (character 2)",
        ),
    ),
    (
        "unclosed placeholder",
        {"steps": [tool(u="x ${vars.q")]},
        ("steps[0].args.u", "INVALID_SPEC", "`${` has no closing `}` (character 2)"),
    ),
    (
        "return references an unknown step",
        {"steps": [tool("a")], "return": "${steps.b.output}"},
        ("return", "INVALID_SPEC", "reference to unknown step 'b'"),
    ),
    # limits
    (
        "too many steps",
        {"steps": [tool() for _ in range(5)]},
        ("steps", "LIMIT_EXCEEDED", "the pipeline has 5 steps; the limit is 4"),
    ),
    (
        "too deep",
        {"steps": [{"pipe": {"steps": [{"parallel": [{"pipe": {"steps": [tool()]}}]}]}}]},
        ("steps[0].pipe.steps[0].parallel[0]", "LIMIT_EXCEEDED", "nesting is 3 levels deep here; the limit is 2"),
    ),
]


@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in REJECTED], ids=[n for n, *_ in REJECTED])
def test_invalid_specs_are_rejected_with_a_located_problem(spec, expected):
    found = problems(spec, tools=TOOLS, limits=Limits(max_steps=4, max_depth=2))
    assert expected in found, found


def test_every_problem_is_reported_not_only_the_first():
    spec = {
        "steps": [
            tool("a", name="nope"),
            tool("a"),
            {"tool": "echo", "args": {"u": "${steps.zz.output}"}, "bogus": 1},
        ],
        "extra": True,
    }
    found = problems(spec, tools=TOOLS)
    assert [(loc, code) for loc, code, _ in found] == [
        ("extra", "INVALID_SPEC"),
        ("steps[0].tool", "UNKNOWN_TOOL"),
        ("steps[1].id", "INVALID_SPEC"),
        ("steps[2].args.u", "INVALID_SPEC"),
        ("steps[2].bogus", "INVALID_SPEC"),
    ]


def test_spec_error_message_lists_every_problem_with_its_location():
    with pytest.raises(SpecError) as info:
        compile_spec({"steps": [tool("a"), tool("a", u="${steps.b.output}")]})
    text = str(info.value)
    assert "steps[1].id: duplicate id 'a' (also steps[0])" in text
    assert "steps[1].args.u: reference to unknown step 'b'" in text
    assert info.value.code == "INVALID_SPEC"


def test_invalid_json_text_names_line_and_column():
    found = problems('{"steps": [\n  {"tool": "echo",}\n]}')
    assert found[0][0] == ""
    assert found[0][2].startswith("invalid JSON:") and "line 2" in found[0][2]


@pytest.mark.parametrize("bad", ["9a", "has space", "a.b"])
def test_an_invalid_id_is_reported_once_at_every_depth(bad):
    message = f"invalid id '{bad}': ids match [A-Za-z_][A-Za-z0-9_-]*"
    spec = {"steps": [tool(bad), {"pipe": {"steps": [tool(bad)]}}, {"parallel": [tool(bad)]}]}
    assert problems(spec) == [
        ("steps[0].id", "INVALID_SPEC", message),
        ("steps[1].pipe.steps[0].id", "INVALID_SPEC", message),
        ("steps[2].parallel[0].id", "INVALID_SPEC", message),
    ]


def test_a_string_that_is_not_json_text_is_told_the_spec_must_be_an_object_with_steps():
    message = "a pipeline spec must be an object with `steps` (or its JSON text), got a string"
    assert problems("str") == [("", "INVALID_SPEC", message)]
    assert problems({"spec": "fetch the page"}) == [("spec", "INVALID_SPEC", message)]


def test_invalid_json_inside_the_wrapper_is_located_at_spec():
    assert problems({"spec": "{nope"})[0][:2] == ("spec", "INVALID_SPEC")


def test_wrapper_with_other_fields_is_rejected():
    assert problems({"spec": {"steps": [tool()]}, "vars": {}})[0][:2] == ("vars", "INVALID_SPEC")


def test_unknown_tools_are_reported_along_with_structural_problems():
    found = problems({"steps": [tool(name="nope"), tool("step1")]}, tools=TOOLS)
    assert ("steps[0].tool", "UNKNOWN_TOOL", "unknown tool 'nope'") in found
    assert any(loc == "steps[1].id" for loc, _, _ in found)


def test_an_unknown_tool_suggests_the_closest_name():
    assert problems({"steps": [tool(name="serch")]}, tools=TOOLS) == [
        ("steps[0].tool", "UNKNOWN_TOOL", "unknown tool 'serch' (did you mean `search`?)")
    ]


def test_the_limit_on_steps_counts_nested_and_parallel_children():
    spec = {"steps": [{"parallel": [tool(), tool()]}, {"pipe": {"steps": [tool()]}}]}
    assert compile_spec(spec, limits=Limits(max_steps=5)).step_count == 5
    assert problems(spec, limits=Limits(max_steps=4))[0][1] == "LIMIT_EXCEEDED"
