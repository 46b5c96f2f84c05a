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


def times(n: int) -> When:
    """True the first ``n`` times it is asked, then false (a page count, say)."""
    asked = [0]

    def more(env: Mapping[str, Any]) -> bool:
        asked[0] += 1
        return asked[0] <= n

    return When(more, f"asked <= {n}")


async def test_an_arc_back_runs_its_node_again_and_the_step_after_the_loop_once_the_loop_ends(tools, probe):
    nodes = leaves([wait("start"), wait("page"), wait("check"), wait("end")], tools)
    flow = graph(nodes, {0: [Arc(1)], 1: [Arc(2)], 2: [Arc(1, times(2), "arcs[2][0]", back=True), Arc(3)]})
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    ran = ["start", "page", "check", "page#2", "check#2", "page#3", "check#3", "end"]
    assert answer["steps"]["flow"]["ran"] == ran
    assert [k for k in answer["steps"] if k != "flow"] == ran  # every run recorded, in the order runs finished
    assert [line for line in probe.log if line.startswith("start")].count("start end") == 1
    assert answer["summary"]["total"] == 8 and answer["summary"]["succeeded"] == 8


async def test_a_join_after_a_loop_waits_for_the_loop_to_end_and_for_its_other_branch(tools, probe):
    nodes = leaves([wait("start"), wait("page"), wait("side", 30), wait("join")], tools)
    flow = graph(
        nodes,
        {0: [Arc(1), Arc(2)], 1: [Arc(1, times(3), back=True), Arc(3)], 2: [Arc(3)]},
        inclusive=frozenset({0}),
    )
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    ran = answer["steps"]["flow"]["ran"]
    assert ran.count("join") == 1 and ran[-1] == "join"
    assert [r for r in ran if r.startswith("page")] == ["page", "page#2", "page#3", "page#4"]


async def test_a_node_run_again_past_the_limit_fails_the_graph_located_at_the_arc(tools, probe):
    nodes = leaves([wait("start"), wait("poll"), wait("end")], tools)
    flow = graph(nodes, {0: [Arc(1)], 1: [Arc(1, times(1000), "workflow[1].next.arcs[0]", back=True), Arc(2)]})
    answer = await run(flow, tools, limits=Limits(max_step_runs=4))
    assert not answer["ok"] and answer["error_code"] == "LIMIT_EXCEEDED"
    assert answer["error"].startswith("step 'flow' failed: workflow[1].next.arcs[0]: step 'poll' would run 5 times")
    assert answer["steps"]["flow"]["ran"] == ["start", "poll", "poll#2", "poll#3", "poll#4"]
    assert "end" not in answer["steps"]


async def test_each_run_again_counts_towards_the_runs_step_executions(tools, probe):
    nodes = leaves([wait("start"), wait("poll"), wait("end")], tools)
    flow = graph(nodes, {0: [Arc(1)], 1: [Arc(1, times(1000), "arc", back=True), Arc(2)]})
    answer = await run(flow, tools, limits=Limits(max_calls=6))
    assert not answer["ok"] and answer["error_code"] == "LIMIT_EXCEEDED"
    assert "running step 'poll' again would bring the run to 7 step executions; the limit is 6" in answer["error"]


async def test_a_skippable_for_each_and_graph_run_as_themselves_and_say_whether_they_were_skipped(tools, probe):
    # a front-end whose steps say `skipped` (as declared pipelines do) may give them any node type: the
    # scheduler's dispatch is a match over the plan's node types, so each runs as what it is
    (step,) = leaves([wait("each")], tools)
    loop = ForEach("loop", "steps[0]", items=Template(["a", "b"]), step=step, skippable=True)
    answer = await run(loop, tools)
    assert answer["ok"], answer["error"]
    assert answer["steps"]["loop"]["skipped"] is False
    assert len(answer["result"]) == 2
    nodes = leaves([wait("start"), wait("end", value=7)], tools)
    flow = graph(nodes, {0: [Arc(1)]}, skippable=True)
    answer = await run(flow, tools)
    assert answer["ok"], answer["error"]
    assert answer["steps"]["flow"]["skipped"] is False
    assert answer["result"] == {"label": "end", "value": 7}
    never = ForEach("loop", "steps[0]", items=Template(["a"]), step=step, skippable=True, when=When(lambda env: False))
    answer = await run(never, tools)
    assert answer["steps"]["loop"]["skipped"] is True
