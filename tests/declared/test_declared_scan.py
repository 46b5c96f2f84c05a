"""The light scan that finds which roots and step ids an expression reads, without being fooled by
string literals, comments, members or macro variables."""

from __future__ import annotations

import pytest

from mcpipe.declared import ROOTS, CelExpr
from mcpipe.expr import scan_cel, scan_jsonata


@pytest.mark.parametrize(
    ("source", "references"),
    [
        ("steps.fetch.output.url", ["steps.fetch.output.url"]),
        ("steps.fetch.output.items.size() > 0", ["steps.fetch.output.items"]),
        ("size(steps.a.output) + size(steps.b.output)", ["steps.a.output", "steps.b.output"]),
        ("steps['my-step'].output", ["steps.my-step.output"]),
        ('steps["with.dot"].ok', ['steps["with.dot"].ok']),
        ("steps.a.output[0].name", ["steps.a.output.0.name"]),
        ("steps[args.which]", ["steps", "args.which"]),
        ('"steps.fake" + steps.real.text', ["steps.real.text"]),
        ("'it''s' + steps.q.text", ["steps.q.text"]),
        (r'"escaped \" steps.fake" + steps.real.text', ["steps.real.text"]),
        ('r"raw \\" + steps.real.text', ["steps.real.text"]),
        ("'''triple 'steps.fake' ''' + steps.real.text", ["steps.real.text"]),
        ('b"steps.fake".size() + steps.real.output', ["steps.real.output"]),
        ("msg.steps.inner", []),
        ("args.items.map(steps_x, steps_x * 2)", ["args.items"]),
        ("last.output.n + vars.k", ["last.output.n", "vars.k"]),
        ("context.principal == null", ["context.principal"]),
        ("// steps.commented\nargs.x", ["args.x"]),
    ],
)
def test_cel_scan_finds_root_references_outside_string_literals(source, references):
    mentions, _ = scan_cel(source, ROOTS)
    assert [m.normalized() for m in mentions] == references


def test_cel_scan_reports_the_variables_macros_bind():
    _, bound = scan_cel("args.l.exists(e, e > 1) && args.m.all(k, v, v > 0) && cel.bind(z, 1, z > 0)", ROOTS)
    assert bound == {"e", "k", "v", "z"}


def test_cel_expression_passes_only_the_steps_it_names():
    expr = CelExpr.compile("steps.a.output + 1")
    assert expr.steps == frozenset({"a"})
    assert CelExpr.compile("steps[args.k].output").steps is None  # dynamic: every step is passed
    assert expr.evaluate({"steps": {"a": {"output": 1}, "b": {"output": object()}}}) == 2


@pytest.mark.parametrize(
    ("source", "references"),
    [
        ("steps.fetch.output.orders.id", ["steps.fetch.output.orders.id"]),
        ('{"n": $count(steps.a.output)}', ["steps.a.output"]),
        ("'steps.fake' & steps.real.text", ["steps.real.text"]),
        ("/* steps.commented */ args.x", ["args.x"]),
        ("$steps.x", []),
        ("$$.steps.y.output", ["steps.y.output"]),
        ("steps.`my-step`.output", ["steps.my-step.output"]),
        ("orders.steps", []),
    ],
)
def test_jsonata_scan_finds_root_paths_outside_strings_and_comments(source, references):
    assert [m.normalized() for m in scan_jsonata(source, ROOTS)] == references


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("steps.a.output.x + steps.a.output.y", 3),
        ("has(steps.a.output.z)", False),
        ("steps.a.ok && steps.a.output.x == 1", True),
        ('steps["a"].output.y', 2),
        ("steps.exists(k, k == 'b')", True),  # read whole: every step is passed
        ("args.size()", 2),
        ("has(args.missing)", False),
        ("last.output.n", 9),
    ],
)
def test_cel_sees_the_same_values_when_only_the_parts_it_reads_are_passed(source, expected):
    e = {
        "steps": {"a": {"ok": True, "output": {"x": 1, "y": 2}, "text": ""}, "b": {"ok": False, "output": None}},
        "args": {"p": 1, "q": 2},
        "last": {"output": {"n": 9}, "ok": True},
    }
    assert CelExpr.compile(source).evaluate(e) == expected
