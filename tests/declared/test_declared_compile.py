"""Compiling declared steps: located problems for every mistake, all at once, and the references each step
makes."""

from __future__ import annotations

import sys

import pytest

from mcpipe.declared import (
    CommandPolicy,
    HttpPolicy,
    Leaf,
    Parallel,
    Pipe,
    StepPolicy,
    StepScope,
    compile_step,
    compile_steps,
    step_schema,
)

POLICY = StepPolicy(
    http=HttpPolicy(allowed_hosts=["api.example.com"]),
    command=CommandPolicy(commands={"jq": ["/usr/bin/jq", "-c"], "py": sys.executable}),
)
SCOPE = StepScope(policy=POLICY, tools={"search", "fetch"})
LOC = "pipelines.charge.steps"

OK = object()


def problems_of(steps: list, scope: StepScope = SCOPE) -> list[tuple[str, str, str]]:
    _, problems = compile_steps(steps, LOC, scope)
    return [(p.location, p.code, p.message) for p in problems]


# Each case: steps, then (location under `pipelines.charge.steps`, code, a fragment of the message), or OK.
CASES = [
    ([{"kind": "value", "value": 1}], OK),
    ([{"kind": "value"}], ("[0]", "INVALID_SPEC", "missing required field `value`")),
    ([{"value": 1}], ("[0].kind", "INVALID_SPEC", "missing field `kind`")),
    ([{"kind": "valeu", "value": 1}], ("[0].kind", "INVALID_SPEC", "did you mean `value`?")),
    ([{"kind": 3}], ("[0].kind", "INVALID_SPEC", "unknown kind 3")),
    (
        [{"kind": "value", "value": 1, "vaule": 2}],
        ("[0].vaule", "INVALID_SPEC", "unknown field `vaule` for kind `value`"),
    ),
    ([{"kind": "value", "value": 1, "timeout_ms": 0}], ("[0].timeout_ms", "INVALID_SPEC", "> 0.0")),
    ([{"kind": "value", "value": 1, "id": "has space"}], ("[0].id", "INVALID_SPEC", "invalid id 'has space'")),
    ([{"kind": "value", "value": 1, "id": "step2"}], ("[0].id", "INVALID_SPEC", "reserved for the step at position 2")),
    (
        [{"kind": "value", "value": 1, "id": "a"}, {"kind": "value", "value": 1, "id": "a"}],
        ("[1].id", "INVALID_SPEC", "duplicate id 'a' (also pipelines.charge.steps[0])"),
    ),
    ([{"kind": "value", "value": "${nope.x}"}], ("[0].value", "INVALID_SPEC", "unknown root `nope`")),
    ([{"kind": "value", "value": "${args.x"}], ("[0].value", "INVALID_SPEC", "has no closing")),
    (
        [{"kind": "value", "value": {"a": ["${steps.later.output}"]}}, {"kind": "value", "id": "later", "value": 1}],
        ("[0].value.a[0]", "INVALID_SPEC", "does not run before this step"),
    ),
    ([{"kind": "value", "value": "${steps.ghost.output}"}], ("[0].value", "INVALID_SPEC", "unknown step 'ghost'")),
    ([{"kind": "value", "value": "${last.output}"}], ("[0].value", "INVALID_SPEC", "no step has finished here")),
    ([{"kind": "value", "value": "${vars.q}"}], OK),  # vars are not checked when the scope does not know them
    (
        [{"kind": "transform", "expression": "1 +"}],
        ("[0].expression", "INVALID_SPEC", "invalid CEL: syntax error at line 1, column 4"),
    ),
    ([{"kind": "transform", "expression": "foo.bar"}], ("[0].expression", "INVALID_SPEC", "unknown variable `foo`")),
    (
        [{"kind": "transform", "expression": "steps.ghost.output"}],
        ("[0].expression", "INVALID_SPEC", "unknown step 'ghost'"),
    ),
    ([{"kind": "transform", "expression": "'steps.ghost' + string(args.n)"}], OK),  # inside a string literal
    ([{"kind": "transform", "expression": "args.l.map(x, x * 2)"}], OK),  # a macro's variable
    ([{"kind": "transform", "expression": ""}], ("[0].expression", "INVALID_SPEC", "length >= 1")),
    (
        [{"kind": "cel_gate", "expression": "steps.x.ok", "id": "x"}],
        ("[0].expression", "INVALID_SPEC", "does not run before"),
    ),
    ([{"kind": "value", "value": 1, "when": "args.n >"}], ("[0].when", "INVALID_SPEC", "invalid CEL")),
    (
        [{"kind": "value", "value": 1, "input_transform": "steps.ghost"}],
        ("[0].input_transform", "INVALID_SPEC", "unknown step 'ghost'"),
    ),
    (
        [{"kind": "plugin_transform", "plugin": "xslt", "config": {}}],
        ("[0].plugin", "INVALID_SPEC", "unknown plugin 'xslt'"),
    ),
    ([{"kind": "plugin_transform", "plugin": "jsonata"}], ("[0].config", "INVALID_SPEC", "config: {expression")),
    (
        [{"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": "$sum("}}],
        ("[0].config.expression", "INVALID_SPEC", "invalid JSONata"),
    ),
    (
        [{"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": "a", "mode": 1}}],
        ("[0].config.mode", "INVALID_SPEC", "unknown field `mode`"),
    ),
    (
        [{"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": "steps.ghost.output"}}],
        ("[0].config.expression", "INVALID_SPEC", "unknown step 'ghost'"),
    ),
    ([{"kind": "http", "url": "https://api.example.com/x", "method": "post"}], OK),
    (
        [{"kind": "http", "url": "https://api.example.com/x", "method": "FETCH"}],
        ("[0].method", "INVALID_SPEC", "Invalid enum value 'FETCH'"),
    ),
    (
        [{"kind": "http", "url": "https://other.example.com/x"}],
        (
            "[0].url",
            "FORBIDDEN",
            "host 'other.example.com' is not in the allowed hosts (list it in outbound.http.allowed_hosts)",
        ),
    ),
    ([{"kind": "http", "url": "ftp://api.example.com/x"}], ("[0].url", "FORBIDDEN", "scheme 'ftp'")),
    ([{"kind": "http", "url": "${args.url}"}], OK),  # checked when it runs
    (
        [{"kind": "http", "url": "https://api.example.com", "expected_status_codes": [700]}],
        ("[0].expected_status_codes[0]", "INVALID_SPEC", "<= 599"),
    ),
    (
        [{"kind": "graphql", "url": "https://api.example.com/graphql"}],
        ("[0]", "INVALID_SPEC", "missing required field `operation`"),
    ),
    ([{"kind": "command", "command": "jq", "args": [".a"]}], OK),
    (
        [{"kind": "command", "command": "bash", "args": ["-c", "rm -rf /"]}],
        ("[0].command", "FORBIDDEN", "command 'bash' is not allowed"),
    ),
    ([{"kind": "command", "command": "jq", "shell": True}], ("[0].shell", "INVALID_SPEC", "unknown field `shell`")),
    ([{"kind": "mock", "delay_ms": -1}], ("[0].delay_ms", "INVALID_SPEC", ">= 0")),
    ([{"kind": "log", "data": "x", "level": "loud"}], ("[0].level", "INVALID_SPEC", "Invalid enum value 'loud'")),
    ([{"kind": "progress"}], ("[0]", "INVALID_SPEC", "missing required field `progress`")),
    ([{"kind": "tool", "tool": "search", "args": {"q": "${args.q}"}}], OK),
    ([{"kind": "tool", "tool": "serch"}], ("[0].tool", "UNKNOWN_TOOL", "unknown tool 'serch'")),
    ([{"kind": "tool", "tool": "mcp_pipe"}], ("[0].tool", "INVALID_SPEC", "use a `pipe` step")),
    ([{"kind": "parallel", "steps": []}], ("[0].steps", "INVALID_SPEC", "length >= 1")),
    (
        [
            {
                "kind": "parallel",
                "steps": [{"kind": "value", "id": "a", "value": 1}, {"kind": "value", "value": "${steps.a.output}"}],
            }
        ],
        ("[0].steps[1].value", "INVALID_SPEC", "a sibling in the same parallel group"),
    ),
    ([{"kind": "parallel", "steps": [{"kind": "nope"}]}], ("[0].steps[0].kind", "INVALID_SPEC", "unknown kind")),
    ([{"kind": "pipe", "steps": [{"kind": "value", "value": "${vars.q}"}], "vars": {"q": "${args.q}"}}], OK),
    (
        [{"kind": "pipe", "steps": [{"kind": "value", "value": "${vars.r}"}], "vars": {"q": 1}}],
        ("[0].steps[0].value", "INVALID_SPEC", "no var named 'r'"),
    ),
    (
        [
            {"kind": "value", "id": "outer", "value": 1},
            {"kind": "pipe", "steps": [{"kind": "value", "value": "${steps.outer.output}"}]},
        ],
        ("[1].steps[0].value", "INVALID_SPEC", "unknown step 'outer'"),
    ),
    (
        [{"kind": "pipe", "steps": [{"kind": "value", "id": "a", "value": 1}], "return": "${steps.b.output}"}],
        ("[0].return", "INVALID_SPEC", "unknown step 'b'"),
    ),
    ("not a list", ("", "INVALID_SPEC", "non-empty array")),
    ([3], ("[0]", "INVALID_SPEC", "a step must be an object, got number")),
]


@pytest.mark.parametrize(("steps", "expected"), CASES)
def test_validation_reports_each_mistake_where_it_is(steps, expected):
    found = problems_of(steps)
    if expected is OK:
        assert found == []
        return
    where, code, fragment = expected
    assert any(loc == LOC + where and c == code and fragment in msg for loc, c, msg in found), found


def test_every_problem_is_reported_at_once_in_location_order():
    steps = [
        {"kind": "transform", "expression": "1 +", "when": "(", "extra": True},
        {"kind": "http", "url": "https://evil.example", "timeout_ms": -1},
        {"kind": "command", "command": "sh"},
        {"kind": "value", "value": "${steps.ghost.output}"},
    ]
    locations = [loc for loc, _, _ in problems_of(steps)]
    assert locations == [
        f"{LOC}[0].expression",
        f"{LOC}[0].extra",
        f"{LOC}[0].when",
        f"{LOC}[1].timeout_ms",
        f"{LOC}[1].url",
        f"{LOC}[2].command",
        f"{LOC}[3].value",
    ]


def test_a_compiled_step_lists_every_reference_it_makes_with_its_location():
    step, problems = compile_step(
        {
            "kind": "http",
            "id": "charge",
            "url": "https://api.example.com/${steps.fetch.output.id}",
            "body": {"amount": {"$ref": "steps.price.output"}},
            "when": 'steps["fetch"].ok && vars.live',
            "input_transform": '{"x": "steps.nope is a string"}',
        },
        "pipelines.charge.steps[2]",
        StepScope(policy=POLICY),
    )
    assert problems == [] and isinstance(step, Leaf)
    assert sorted(step.references) == sorted(
        [
            ("pipelines.charge.steps[2].when", "steps.fetch.ok"),
            ("pipelines.charge.steps[2].when", "vars.live"),
            ("pipelines.charge.steps[2].url", "steps.fetch.output.id"),
            ("pipelines.charge.steps[2].body.amount", "steps.price.output"),
        ]
    )


def test_compile_step_without_visibility_leaves_reference_checks_to_the_caller():
    step, problems = compile_step({"kind": "transform", "expression": "steps.later.output"}, "s", StepScope())
    assert problems == [] and step is not None
    _, problems = compile_step(
        {"kind": "transform", "expression": "steps.later.output"},
        "s",
        StepScope(visible=frozenset(), step_ids=("s1", "later")),
    )
    assert [p.message for p in problems] == ["reference to step 'later', which does not run before this step"]


def test_containers_compile_to_parallel_and_pipe_shapes():
    steps, problems = compile_steps(
        [
            {"kind": "value", "id": "a", "value": 1},
            {
                "kind": "parallel",
                "id": "both",
                "when": "steps.a.ok",
                "steps": [
                    {"kind": "value", "id": "x", "value": "${steps.a.output}"},
                    {"kind": "tool", "id": "y", "tool": "search"},
                ],
            },
            {
                "kind": "pipe",
                "id": "sub",
                "vars": {"n": "${steps.a.output}"},
                "steps": [{"kind": "value", "value": "${vars.n}"}],
            },
        ],
        LOC,
        SCOPE,
    )
    assert problems == [] and steps is not None
    _, both, sub = steps
    assert isinstance(both, Parallel) and [c.id for c in both.children] == ["x", "y"]
    assert both.when is not None and both.location == f"{LOC}[1]"
    assert isinstance(sub, Pipe) and sub.pipe.steps[0].id == "step1" and sub.pipe.ret is None


def test_nesting_deeper_than_the_limit_is_rejected():
    inner = {"kind": "value", "value": 1}
    for _ in range(3):
        inner = {"kind": "parallel", "steps": [inner]}
    found = problems_of([inner], StepScope(max_depth=2))
    assert [(loc, code) for loc, code, _ in found] == [(f"{LOC}[0].steps[0].steps[0]", "LIMIT_EXCEEDED")]


def test_the_step_schema_covers_every_kind():
    schema = step_schema()
    tags = {d["properties"]["kind"]["enum"][0] for d in schema["$defs"].values() if "kind" in d.get("properties", {})}
    tags = {t for t in tags if "." not in t}  # a config format's kinds (`mcpg.http`), when its module is loaded
    assert tags == {
        "tool", "http", "graphql", "command", "mock", "value", "store_content", "transform", "cel_gate",
        "plugin_transform", "log", "progress", "parallel", "pipe",
        "elicitation", "sampling", "roots_list", "gather",
        "sql", "sql_tx", "sql_await", "nats", "grpc", "kafka", "python", "duckdb", "postgres", "shell",
        "twilio",
        "roots",  # a `gather` entry's kind (the others share their step kind's name)
    }  # fmt: skip


async def test_prelude_applies_a_containers_when_and_input_transform():
    from mcpipe.declared import SKIP, prelude

    steps, problems = compile_steps(
        [
            {
                "kind": "parallel",
                "id": "group",
                "when": "args.go",
                "input_transform": '{"n": args.n * 2}',
                "steps": [{"kind": "value", "value": "${args.n}"}],
            }
        ],
        LOC,
        SCOPE,
    )
    assert problems == [] and steps is not None
    group = steps[0]
    base = {"args": {"go": False, "n": 1}, "steps": {}, "vars": {}, "context": {}, "last": None}
    assert await prelude(group, base) is SKIP
    inner = await prelude(group, {**base, "args": {"go": True, "n": 2}})
    assert inner["args"] == {"n": 4} and inner["steps"] is base["steps"]


def test_tool_sites_and_walk_reach_nested_steps():
    from mcpipe.declared import tool_sites, walk

    steps, problems = compile_steps(
        [
            {"kind": "tool", "id": "a", "tool": "search"},
            {"kind": "parallel", "id": "p", "steps": [{"kind": "tool", "id": "b", "tool": "fetch"}]},
            {"kind": "pipe", "id": "q", "steps": [{"kind": "tool", "id": "c", "tool": "search"}]},
        ],
        LOC,
        SCOPE,
    )
    assert problems == [] and steps is not None
    assert [s.id for s in walk(steps)] == ["a", "p", "b", "q", "c"]
    assert tool_sites(steps) == [
        (f"{LOC}[0]", "search"),
        (f"{LOC}[1].steps[0]", "fetch"),
        (f"{LOC}[2].steps[0]", "search"),
    ]
