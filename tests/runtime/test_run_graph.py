"""The scheduler running a :class:`mcpipe.plan.Graph`: steps joined by conditional arcs, and ``for_each``
with an expression and its own concurrency."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

from mcpipe import Template
from mcpipe.compile import CompiledSpec
from mcpipe.declared import StepScope, compile_steps
from mcpipe.errors import ExpressionError
from mcpipe.plan import Arc, ForEach, Graph, Limits, Pipeline, explain
from mcpipe.runtime import run_compiled


class When:
    """An expression written as a Python function of the environment (what a front-end compiles)."""

    def __init__(self, f: Callable[[Mapping[str, Any]], Any], source: str = "") -> None:
        self.f = f
        self.source = source

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        try:
            return self.f(env)
        except KeyError as e:
            raise ExpressionError(f"no {e}") from None


def leaves(raw: list[dict[str, Any]], tools: Any) -> tuple[Any, ...]:
    steps, problems = compile_steps(raw, "steps", StepScope(tools=tools))
    assert problems == [], problems
    assert steps is not None
    return steps


def wait(sid: str, ms: float = 0, value: Any = None) -> dict[str, Any]:
    return {"kind": "tool", "id": sid, "tool": "wait", "args": {"ms": ms, "label": sid, "value": value}}


def graph(
    nodes: tuple[Any, ...], arcs: dict[int, list[Arc]], inclusive: frozenset[int] = frozenset(), **kw: Any
) -> Graph:
    return Graph(
        "flow",
        "workflow",
        nodes=nodes,
        arcs=tuple(tuple(arcs.get(i, [])) for i in range(len(nodes))),
        inclusive=tuple(i in inclusive for i in range(len(nodes))),
        **kw,
    )


async def run(node: Any, tools: Any, **kw: Any) -> dict[str, Any]:
    plan = CompiledSpec.of(Pipeline(Template({}), (node,), None, False, None, ""))
    with trio.fail_after(20):
        return await run_compiled(plan, tools, **kw)


def picked(value: str) -> When:
    return When(lambda env: env["last"]["output"]["value"] == value, f"value == {value!r}")


async def test_an_exclusive_node_takes_the_first_arc_whose_condition_holds_and_the_rest_never_run(tools, probe):
    nodes = leaves([wait("start", value="b"), wait("a"), wait("b"), wait("c"), wait("end")], tools)
    flow = graph(
        nodes,
        {0: [Arc(1, picked("a")), Arc(2, picked("b")), Arc(3)], 1: [Arc(4)], 2: [Arc(4)], 3: [Arc(4)]},
    )
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    assert [line for line in probe.log if line.startswith("start")] == ["start start", "start b", "start end"]
    assert set(answer["steps"]) == {"start", "b", "end", "flow"}
    assert answer["steps"]["flow"]["ran"] == ["start", "b", "end"]
    assert answer["result"] == {"label": "end", "value": None}
    # the graph's nodes count toward the summary; the two never reached are skipped
    assert answer["summary"] == {"total": 5, "succeeded": 3, "failed": 0, "skipped": 2, "cancelled": 0}


async def test_an_inclusive_fan_out_runs_its_branches_together_and_the_join_once_after_both(tools, probe):
    nodes = leaves([wait("start"), wait("left", 40), wait("right", 20), wait("join")], tools)
    seen: list[set[str]] = []

    def saw(env: Mapping[str, Any]) -> bool:
        seen.append(set(env["steps"]))
        return True

    flow = graph(nodes, {0: [Arc(1), Arc(2)], 1: [Arc(3, When(saw))], 2: [Arc(3, When(saw))]}, inclusive=frozenset({0}))
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    assert probe.max_in_flight == 2
    assert probe.log.count("start join") == 1
    assert probe.log.index("start join") > max(probe.log.index("end left"), probe.log.index("end right"))
    assert answer["steps"]["flow"]["ran"] == ["start", "right", "left", "join"]


async def test_a_join_whose_other_branch_was_not_chosen_runs_once_its_taken_branch_is_done(tools, probe):
    nodes = leaves([wait("start", value="x"), wait("x"), wait("y"), wait("y2"), wait("join")], tools)
    flow = graph(nodes, {0: [Arc(1, picked("x")), Arc(2, picked("y"))], 1: [Arc(4)], 2: [Arc(3)], 3: [Arc(4)]})
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    assert answer["steps"]["flow"]["ran"] == ["start", "x", "join"]
    assert "y2" not in answer["steps"]


async def test_a_node_reads_the_arcs_it_was_reached_by(tools, probe):
    nodes = leaves([wait("start"), wait("a"), wait("b")], tools)
    got: list[Any] = []
    at_b = When(lambda env: got.append([a.data for a in env["via"]]) or True)
    flow = graph(
        nodes, {0: [Arc(1, data="one"), Arc(2, data="two")], 1: [Arc(2, at_b, data="three")]}, inclusive=frozenset({0})
    )
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    assert got == [["one"]]  # what `a` was reached by, seen when its arc to `b` is decided


async def test_a_failed_node_fails_the_graph_and_cancels_the_branch_still_running(tools, probe):
    raw = [
        wait("start"),
        wait("slow", 5000),
        {"kind": "tool", "id": "bad", "tool": "fail", "args": {"after_ms": 50}},
        wait("end"),
    ]
    nodes = leaves(raw, tools)
    flow = graph(nodes, {0: [Arc(1), Arc(2)], 1: [Arc(3)], 2: [Arc(3)]}, inclusive=frozenset({0}))
    answer = await run(flow, tools)
    assert not answer["ok"]
    assert answer["error"] == "step 'flow' failed: step 'bad' failed: it failed"
    assert probe.cancelled == ["slow"]
    assert answer["steps"]["slow"]["error_code"] == "CANCELLED"
    assert "end" not in answer["steps"]


async def test_a_node_that_goes_on_after_failing_routes_by_its_arcs_and_the_graph_fails_at_the_end(tools, probe):
    raw = [{"kind": "tool", "id": "bad", "tool": "fail", "args": {}}, wait("cleanup"), wait("happy")]
    nodes = leaves(raw, tools)
    failed = When(lambda env: not env["last"]["ok"])
    flow = graph(nodes, {0: [Arc(1, failed), Arc(2)]}, continue_on_error=True)
    answer = await run(flow, tools)
    assert not answer["ok"]
    assert answer["steps"]["flow"]["ran"] == ["bad", "cleanup"]
    assert answer["steps"]["flow"]["error"] == "step 'bad' failed: it failed"


async def test_an_arc_condition_that_is_not_a_boolean_fails_the_graph_located(tools, probe):
    nodes = leaves([wait("start"), wait("next")], tools)
    flow = graph(nodes, {0: [Arc(1, When(lambda env: "yes"), location="workflow[0].next.arcs[0]")]})
    answer = await run(flow, tools)
    assert not answer["ok"]
    assert answer["steps"]["flow"]["error"] == "workflow[0].next.arcs[0].when: `when` must be a boolean, got string"
    assert "next" not in answer["steps"]


async def test_explain_describes_a_graph_with_its_arcs(tools):
    nodes = leaves([wait("start"), wait("a"), wait("b")], tools)
    flow = graph(nodes, {0: [Arc(1, picked("a")), Arc(2)]})
    plan = explain(Pipeline(Template({}), (flow,), None, False, None, ""), {}, Limits())
    described = plan["steps"][0]["graph"]
    assert described["entry"] == "start"
    assert described["arcs"] == [
        {"from": "start", "mode": "exclusive", "to": [{"step": "a", "when": "value == 'a'"}, {"step": "b"}]}
    ]


async def test_a_for_each_over_an_expression_runs_one_element_at_a_time_when_its_concurrency_is_one(tools, probe):
    (step,) = leaves([{"kind": "tool", "id": "each", "tool": "wait", "args": {"ms": 10, "label": "each"}}], tools)
    items = When(lambda env: ["a", "b", "c"], "[a, b, c]")
    loop = ForEach("loop", "steps[0]", items=items, step=step, max_concurrency=1)
    answer = await run(loop, tools)
    assert answer["ok"], answer["error"]
    assert probe.max_in_flight == 1
    assert len(answer["result"]) == 3
    assert probe.log == ["start each", "end each"] * 3


async def test_a_for_each_whose_expression_fails_fails_located(tools, probe):
    (step,) = leaves([wait("each")], tools)
    loop = ForEach("loop", "steps[0]", items=When(lambda env: env["nope"]), step=step)
    answer = await run(loop, tools)
    assert not answer["ok"]
    assert answer["error"] == "step 'loop' failed: steps[0].for_each: no 'nope'"
