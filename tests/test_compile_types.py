"""Typed chaining (issue 17): a reference that feeds a tool's argument a value of the wrong type is
refused, located, before anything runs, where both tools' schemas say the types."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio

from mcpipe.compile import compile_spec
from mcpipe.errors import SpecError
from mcpipe.runtime import run_pipeline
from mcpipe.tools import ToolRegistry


class Found(msgspec.Struct):
    total: str
    count: int
    items: list[int]
    meta: dict[str, Any]


def tools() -> tuple[ToolRegistry, list[str]]:
    reg = ToolRegistry()
    calls: list[str] = []

    @reg.tool
    def search(q: str) -> Found:
        calls.append("search")
        return Found("3", 3, [1, 2], {})

    @reg.tool
    def page(limit: int = 10, offset: float = 0, note: str = "", anything: Any = None) -> dict[str, Any]:
        calls.append("page")
        return {"limit": limit}

    @reg.tool
    def loose(x: Any = None) -> str:
        return "ok"

    return reg, calls


def problems(spec: dict[str, Any], reg: ToolRegistry) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as e:
        compile_spec(spec, tools=reg)
    return [(p.location, p.message) for p in e.value.problems]


def spec_with(args: dict[str, Any]) -> dict[str, Any]:
    return {"steps": [{"id": "search", "tool": "search", "args": {"q": "x"}}, {"tool": "page", "args": args}]}


def test_a_string_fed_to_an_integer_argument_is_refused_located():
    reg, _ = tools()
    assert problems(spec_with({"limit": "${steps.search.structured.total}"}), reg) == [
        ("steps[1].args.limit", "expects integer, steps.search.structured.total is string")
    ]
    assert problems(spec_with({"note": {"$ref": "steps.search.output.items"}}), reg) == [
        ("steps[1].args.note", "expects string, steps.search.output.items is array")
    ]


def test_types_that_fit_and_types_the_schemas_leave_open_are_not_reported():
    reg, _ = tools()
    fine = {
        "limit": "${steps.search.structured.count}",
        "offset": {"$ref": "steps.search.structured.items.0"},  # an integer fits a number
        "note": "n=${steps.search.structured.items}",  # text, not one typed reference
        "anything": "${steps.search.structured.total}",  # the argument has no type
    }
    compile_spec(spec_with(fine), tools=reg)
    compile_spec(spec_with({"limit": "${steps.search.structured.meta.x}"}), tools=reg)  # not described
    compile_spec(spec_with({"limit": "${steps.search.structured.total ?? 1}"}), tools=reg)  # a default
    compile_spec(spec_with({"limit": "${steps.search.structured.total}"}))  # no tools: nothing to check


async def test_a_run_with_a_type_mismatch_calls_nothing():
    reg, calls = tools()
    with trio.fail_after(10):
        answer = await run_pipeline(spec_with({"limit": "${steps.search.structured.total}"}), reg)
    assert calls == []
    assert answer["error_code"] == "INVALID_SPEC"
    assert answer["problems"][0]["location"] == "steps[1].args.limit"


# --- plain arguments against the tool's input schema (first hour: a later step's bad arguments were refused
# only when its turn came, after the earlier steps had acted) -----------------------------------------------


def test_a_plain_argument_the_input_schema_refuses_is_located_before_any_step_runs():
    reg, calls = tools()
    spec = {
        "steps": [
            {"id": "search", "tool": "search", "args": {"q": "x"}},
            {"tool": "page", "args": {"limit": "ten", "offset": 2, "note": None, "anything": [1]}},
            {"tool": "search", "args": {"qq": "x"}},
        ]
    }
    assert problems(spec, reg) == [
        ("steps[1].args.limit", "tool 'page' expects integer, got string"),
        ("steps[1].args.note", "tool 'page' expects string, got null"),
        ("steps[2].args", "tool 'search' requires argument `q`"),
        ("steps[2].args.qq", "tool 'search' has no argument `qq` (did you mean `q`?) (its arguments: `q`)"),
    ]
    answer = trio.run(run_pipeline, spec, reg)
    assert answer["error_code"] == "INVALID_SPEC" and calls == []


def test_arguments_that_hold_references_are_left_to_the_call_and_literals_fit_their_schema():
    reg, _ = tools()
    spec = {
        "vars": {"n": "ten"},
        "steps": [
            {"id": "search", "tool": "search", "args": {"q": "x"}},
            {
                "id": "each",
                "for_each": "${steps.search.structured.items}",
                "step": {"tool": "page", "args": {"limit": "${item}"}},
            },
            {
                "tool": "page",
                "args": {"limit": {"$literal": 3}, "offset": 1, "note": "text ${vars.n}", "anything": "${vars.n}"},
            },
            {"tool": "loose", "args": {"x": {"$ref": "vars.n"}}},
        ],
    }
    compile_spec(spec, tools=reg)
