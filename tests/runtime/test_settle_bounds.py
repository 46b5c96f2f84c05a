"""A leaf's result is checked against the output's bounds and charged to the answer in one walk when it is
small (``_Run.bound``), with the answer of the two walks it replaces (``_Run.bound_exactly``): the same
error or none, and the same weight kept in the answer."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mcpipe._core import json_measure
from mcpipe.plan import Leaf, Limits
from mcpipe.results import tool_result
from mcpipe.runtime._scheduler import _Run
from mcpipe.tools import ToolContext, ToolRegistry, ToolResult

TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(["", '"\\\n\x01', "é" * 30, "😀€x"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TEXT, inner, max_size=6),
    max_leaves=40,
)
# Many small numbers: what the output check weighs most against what they weigh in the answer (20 bytes to 2).
DIGITS = st.lists(st.integers(0, 9), max_size=300) | st.lists(st.booleans() | st.none(), max_size=300)
BLOCKS = st.lists(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT)
    | st.just({"type": "image", "data": "aGk=", "mimeType": "x"}),
    max_size=3,
)
STEP: Leaf[Any, Any] = Leaf("s", "steps[0]", "tool", None, None)


def _run(limits: Limits, kept: int) -> _Run:
    run = _Run(ToolRegistry(), ToolContext(), limits, None, {}, 1)
    run.answer_bytes = kept
    return run


def _outcome(run: _Run, error: Exception | None) -> tuple[str | None, int, str | None]:
    return (None if error is None else str(error), run.answer_bytes, None if run.full is None else str(run.full))


@settings(max_examples=400, deadline=None)
@given(
    structured=st.none() | JSON | DIGITS,
    content=BLOCKS,
    is_error=st.booleans(),
    facts=st.none() | st.dictionaries(st.sampled_from(["jsonrpc_error", "status"]), JSON, max_size=2),
    max_output=st.integers(1, 20_000) | st.just(8 * 1024 * 1024) | st.floats(1, 12),
    max_depth=st.integers(0, 6),
    max_answer=st.integers(1, 20_000) | st.just(16 * 1024 * 1024),
    kept=st.integers(0, 3000),
)
def test_one_walk_answers_what_the_two_walks_answer(
    structured, content, is_error, facts, max_output, max_depth, max_answer, kept
):
    res = ToolResult(content=content, structured=structured, is_error=is_error)
    r = tool_result("s", res, 0.0, skippable=True)
    if facts:
        r.update(facts)
    if isinstance(max_output, float):  # near the one walk's margin: a multiple of the result's weight as sent
        max_output = int(json_measure(r, wire=True)[0] * max_output)
    limits = Limits(max_output_bytes=max_output, max_json_depth=max_depth, max_answer_bytes=max_answer)
    one, two = _run(limits, kept), _run(limits, kept)
    assert _outcome(one, one.bound(r, STEP)) == _outcome(two, two.bound_exactly(r, STEP))


def test_a_small_output_is_walked_once_and_a_large_one_by_the_exact_check(monkeypatch):
    from mcpipe.runtime import _scheduler

    walks: list[bool] = []
    real = _scheduler.json_measure

    def counting(value: Any, **kw: Any) -> tuple[int, int]:
        walks.append(bool(kw.get("wire")))
        return real(value, **kw)

    monkeypatch.setattr(_scheduler, "json_measure", counting)
    monkeypatch.setattr(_scheduler, "measure_output", _counted(walks))
    limits = Limits(max_output_bytes=100_000)
    small = tool_result("s", ToolResult(structured={"a": [1, 2, 3]}, content=[{"type": "text", "text": "x"}]), 0.0)
    assert _run(limits, 0).bound(small, STEP) is None
    assert walks == [True]
    walks.clear()
    large = tool_result("s", ToolResult(structured={"a": "x" * 20_000}), 0.0)
    assert _run(limits, 0).bound(large, STEP) is None
    assert walks == [True, False, True]  # the one walk, then the output's check and the answer's charge


def _counted(walks: list[bool]) -> Any:
    from mcpipe.plan import measure_output

    def counting(value: Any, **kw: Any) -> Any:
        walks.append(False)
        return measure_output(value, **kw)

    return counting
