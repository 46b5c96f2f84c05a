"""Hostile specs meet their limits before they cost anything (issue 9, points 1-5), in memory."""

from __future__ import annotations

from typing import Any

import pytest

import mcpipe.compile as compile_module
import mcpipe.plan._check as checker_module
from kit.hostile import doubling_spec, nested
from mcpipe import Template
from mcpipe._core import json_measure
from mcpipe._json import dumps
from mcpipe.compile import Limits, clear_cache, compile_spec, configure_cache
from mcpipe.errors import OutputTooLargeError, SpecError
from mcpipe.interaction import InMemoryPipelineStore
from mcpipe.results import pipe_envelope
from mcpipe.runtime import run_pipeline
from mcpipe.store import ClaimUnverifiable, StateTooLarge
from mcpipe.tools.builtin import builtin_tools


class TemplateSpy:
    """Counts the templates compiled (by the shared checker, for every front-end), and the step ids handed
    to them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.templates = 0
        self.ids = 0
        real = checker_module.Template

        def spy(value: Any, **kw: Any) -> Any:
            self.templates += 1
            self.ids += len(kw.get("step_ids") or ())
            return real(value, **kw)

        monkeypatch.setattr(checker_module, "Template", spy)


def codes(e: SpecError) -> list[tuple[str, str]]:
    return [(p.location, p.code) for p in e.problems]


# --- 1. size and step count before compiling, compiling linear ----------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"steps": [{"tool": "echo"}] * 5000},
        {"steps": [{"parallel": [{"tool": "echo"}] * 20_000}]},
        {"steps": [{"pipe": {"steps": [{"tool": "echo"}] * 3000}}] * 3},
    ],
    ids=["5000 steps", "20000 parallel children", "pipes of 3000"],
)
def test_a_spec_past_the_step_limit_is_refused_before_any_template_is_compiled(spec, monkeypatch):
    spy = TemplateSpy(monkeypatch)
    with pytest.raises(SpecError) as e:
        compile_spec(spec)
    assert codes(e.value) == [("steps", "LIMIT_EXCEEDED")]
    assert spy.templates == 0


def test_a_flat_list_past_the_limit_says_how_many_steps_it_has():
    with pytest.raises(SpecError, match="the pipeline has 51 steps; the limit is 50"):
        compile_spec({"steps": [{"tool": "echo"}] * 51})


def test_a_spec_past_the_byte_limit_is_refused_before_any_template_is_compiled(monkeypatch):
    spy = TemplateSpy(monkeypatch)
    spec = {"vars": {"v": "x" * 2000}, "steps": [{"tool": "echo"}]}
    with pytest.raises(SpecError, match=r"the spec is at least 20[0-9]{2} bytes; the limit is 1000") as e:
        compile_spec(spec, limits=Limits(max_spec_bytes=1000))
    assert codes(e.value) == [("", "LIMIT_EXCEEDED")] and spy.templates == 0


def test_compiling_hands_each_template_only_the_step_ids_it_names(monkeypatch):
    # Before: every template got the whole id list, so n steps cost n² (5000 steps took 8-25 s).
    spy = TemplateSpy(monkeypatch)
    n = 3000
    steps = [{"id": f"s{i}", "tool": "echo", "args": {"i": i}} for i in range(n)]
    steps.append({"tool": "echo", "args": {"first": "{{step1.v}}", "prev": f"${{steps.s{n - 1}.output}}"}})
    compiled = compile_spec({"steps": steps}, limits=Limits(max_steps=n + 1))
    assert compiled.step_count == n + 1
    assert spy.ids == 1  # only `{{step1}}` needed an id


def test_parallel_children_share_one_scope_and_still_cannot_see_each_other():
    spec = {
        "steps": [{"parallel": [{"id": "a", "tool": "echo"}, {"tool": "echo", "args": {"x": "${steps.a.output}"}}]}]
    }
    with pytest.raises(SpecError, match="a sibling in the same parallel group"):
        compile_spec(spec)


# --- 2. nesting depth of any JSON value -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "location"),
    [
        ({"steps": [{"tool": "echo", "args": nested(1000)}]}, "steps[0].args"),
        ({"vars": {"x": nested(1000)}, "steps": [{"tool": "echo"}]}, "vars"),
        ({"steps": [{"tool": "echo"}], "return": nested(1000)}, "return"),
        ({"steps": [{"pipe": {"vars": {"x": nested(200)}, "steps": [{"tool": "echo"}]}}]}, "steps[0].pipe.vars"),
    ],
    ids=["args", "vars", "return", "nested pipe vars"],
)
def test_a_value_nested_1000_deep_is_a_located_limit_problem_not_a_recursion_error(spec, location):
    with pytest.raises(SpecError) as e:
        compile_spec(spec)
    assert codes(e.value) == [(location, "LIMIT_EXCEEDED")]
    assert "nests more than 64 levels deep" in str(e.value)


def test_nesting_up_to_the_limit_compiles():
    compile_spec({"steps": [{"tool": "echo", "args": nested(63)}]})


async def test_run_pipeline_answers_a_deep_spec_with_its_problems():
    answer = await run_pipeline({"steps": [{"tool": "echo", "args": nested(1000)}]}, builtin_tools())
    assert answer["ok"] is False and answer["error_code"] == "LIMIT_EXCEEDED"
    assert answer["problems"][0]["location"] == "steps[0].args"


def test_json_measure_counts_depth_and_stops_past_its_limits():
    assert json_measure(1) == (5 + 15, 0) or json_measure(1)[1] == 0
    assert json_measure([1, [2, {"a": []}]])[1] == 4
    assert json_measure(nested(100_000), max_depth=64)[1] == 65  # stops one past the limit
    size, _ = json_measure(["x" * 100] * 1_000_000, max_bytes=1000)
    assert 1000 < size < 2000  # stopped soon after passing the limit, not after a million items


@pytest.mark.parametrize("value", [{"a": [1, 2.5, None, True]}, ["é" * 10, "日本" * 3, "😀"], {"k": {"n": -12}}])
def test_json_measure_is_never_below_the_json_size(value):
    import orjson

    assert json_measure(value)[0] >= len(orjson.dumps(value))


# --- 3. output bounds ------------------------------------------------------------------------------------


def test_interpolated_text_past_its_limit_is_refused_before_it_is_built():
    t = Template({"v": "${vars.a}${vars.a}"}, location="args", max_text_bytes=1000)
    assert t.resolve({"vars": {"a": "x" * 500}}) == {"v": "x" * 1000}
    with pytest.raises(OutputTooLargeError) as e:
        t.resolve({"vars": {"a": "x" * 501}})
    assert e.value.code == "OUTPUT_TOO_LARGE" and e.value.location == "args.v" and e.value.limit == 1000


@pytest.mark.parametrize(
    "value",
    ["é" * 600, ["x" * 300, "y" * 300], {"k": "z" * 600}, 10**30],
    ids=["non-ascii", "array", "object", "big int"],
)
def test_every_kind_of_interpolated_value_counts_towards_the_text_limit(value):
    t = Template("${vars.a}-${vars.a}", max_text_bytes=1000)
    with pytest.raises(OutputTooLargeError):
        t.resolve({"vars": {"a": value if not isinstance(value, int) else [value] * 40}})


async def test_the_doubling_attack_ends_in_a_clean_output_too_large_located_at_the_step():
    # Before: the server segfaulted in orjson.dumps (a 34 GB allocation refused).
    answer = await run_pipeline(doubling_spec(), builtin_tools())
    assert answer["ok"] is False and answer["error_code"] == "OUTPUT_TOO_LARGE"
    failed = [s for s in answer["steps"].values() if not s["ok"]]
    assert failed[0]["error_code"] == "OUTPUT_TOO_LARGE" and failed[0]["output"] is None
    assert failed[0]["error"].startswith(f"steps[{int(failed[0]['id'][1:]) - 1}]")
    assert list(answer["steps"])[-1] == failed[0]["id"]  # nothing ran after it


async def test_fifty_interpolations_of_a_megabyte_fail_the_step_instead_of_building_a_400_mb_answer():
    spec = {
        "vars": {"v": "x" * 1_000_000},
        "steps": [{"tool": "echo", "args": {f"k{i}": "${vars.v}" for i in range(50)}}],
    }
    answer = await run_pipeline(spec, builtin_tools())
    assert answer["error_code"] == "OUTPUT_TOO_LARGE"
    # Refused while resolving the arguments, at the reference that passed the limit: the tool never ran.
    assert answer["steps"]["step1"]["error"].startswith("steps[0].args.k8: the resolved value would take")


def test_a_template_naming_one_large_value_many_times_is_refused_before_copying_it_many_times():
    # Typed references copy containers: a thousand references to a 100 000-item list would copy 800 MB.
    t = Template({f"k{i}": "${vars.big}" for i in range(1000)}, max_text_bytes=8 * 1024 * 1024)
    env = {"vars": {"big": list(range(100_000))}}
    with pytest.raises(OutputTooLargeError) as e:
        t.resolve(env)
    assert e.value.location.startswith("k") and "the resolved value would take" in str(e.value)
    assert len(Template({"a": "${vars.big}", "b": "${vars.big}"}).resolve(env)["b"]) == 100_000


def sent_bytes(answer: dict[str, Any]) -> int:
    """The bytes of the JSON-RPC response carrying ``answer`` as ``mcp_pipe``'s result (the lean path's
    encoding: the structured answer, and its JSON again in the text block)."""
    return len(dumps({"jsonrpc": "2.0", "id": 1, "result": pipe_envelope(answer)}))


BIG = {"v": "x" * 10_000}


@pytest.mark.parametrize(
    ("spec", "location"),
    [
        # The repro, scaled down: each echo step's output is sent 8 times (`structured`, `output`,
        # `text` and the content block, in the answer and again in its text block), 80 KB a step.
        ({"vars": BIG, "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}] * 8}, "steps[1]"),
        # for_each of 100 x 2 KB: every output is in `children` (4 copies) and twice more in the step's own.
        (
            {
                "vars": {"items": list(range(100)), "v": "x" * 2000},
                "steps": [
                    {"id": "e", "for_each": "${vars.items}", "step": {"tool": "echo", "args": {"v": "${vars.v}"}}}
                ],
            },
            "steps[0].step",
        ),
        # Quotes and backslashes cost twice, then four times, as sent: escapes are counted.
        ({"vars": {"v": '"\\' * 1500}, "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}] * 4}, "steps[1]"),
        # A pipe's result is its `output` and its `result`; the top-level result repeats the last output.
        (
            {
                "vars": {"v": "x" * 15_000},
                "steps": [
                    {"pipe": {"vars": {"v": "${vars.v}"}, "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}]}}
                ],
            },
            "steps[0]",
        ),
    ],
    ids=["8 echo steps", "for_each", "escapes", "pipe"],
)
async def test_the_outputs_of_all_steps_together_are_bounded_by_the_answer_limit(spec, location):
    # Before: the limit counted each output once, so the answer sent was 2-8 times the limit.
    limit = 200_000
    limits = Limits(max_output_bytes=150_000, max_answer_bytes=limit)
    answer = await run_pipeline(spec, builtin_tools(), limits=limits)
    assert answer["ok"] is False and answer["error_code"] == "OUTPUT_TOO_LARGE"
    assert f"would take the answer past its limit of {limit} bytes as sent" in answer["error"]
    assert f"{location}: the output of step" in answer["error"]
    assert sent_bytes(answer) <= limit
    # The same pipeline with room for it: the answer as sent is measured from above, never much above.
    roomy = await run_pipeline(spec, builtin_tools(), limits=Limits(max_output_bytes=10**8, max_answer_bytes=10**8))
    assert roomy["ok"] is True and sent_bytes(roomy) > limit


async def test_an_answer_just_under_the_limit_is_sent_whole():
    spec = {"vars": {"v": "x" * 1000}, "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}] * 3}
    answer = await run_pipeline(spec, builtin_tools(), limits=Limits(max_answer_bytes=40_000))
    assert answer["ok"] is True and sent_bytes(answer) <= 40_000


async def test_a_return_template_that_multiplies_outputs_is_bounded():
    limits = Limits(max_answer_bytes=100_000)
    spec = {
        "vars": {"v": ["x" * 100] * 50},
        "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}],
        "return": ["${steps.step1.structured.v}"] * 20,
    }
    answer = await run_pipeline(spec, builtin_tools(), limits=limits)
    assert answer["error_code"] == "OUTPUT_TOO_LARGE" and answer["error"].startswith("return: the result")


async def test_an_output_nested_too_deep_fails_its_step():
    spec = {"vars": {"v": nested(62)}, "steps": [{"tool": "echo", "args": {"v": {"w": {"x": {"y": "${vars.v}"}}}}}]}
    answer = await run_pipeline(spec, builtin_tools())
    assert answer["error_code"] == "OUTPUT_TOO_LARGE" and "nests more than 64 levels deep" in answer["error"]


# --- 4. the compile cache -------------------------------------------------------------------------------


def test_the_plan_cache_is_bounded_by_what_its_plans_hold():
    clear_cache()
    configure_cache(max_bytes=32_000_000)
    try:
        for i in range(40):  # each charged 64 x its 100 KB of text (issue 20: not twice its text)
            compile_spec({"vars": {"pad": "x" * 100_000, "i": i}, "steps": [{"tool": "echo"}]})
        cache = compile_module._CACHE
        assert cache.bytes <= 32_000_000 and len(cache) == 4
    finally:
        configure_cache(max_bytes=compile_module.CACHE_BYTES)
        clear_cache()


def test_invalid_specs_are_not_cached():
    clear_cache()
    for i in range(10):
        with pytest.raises(SpecError):
            compile_spec({"steps": [{"tool": "echo", "args": {"x": f"${{nope{i}}}"}}]})
    assert len(compile_module._CACHE) == 0


# --- 5. suspended states ---------------------------------------------------------------------------------


async def test_the_store_evicts_the_oldest_states_past_its_count():
    store = InMemoryPipelineStore(max_states=3)
    for i in range(5):
        await store.put(f"h{i}", b"x", 2e9)
    assert [await store.take(f"h{i}") for i in range(5)] == [None, None, b"x", b"x", b"x"]


async def test_the_store_evicts_the_oldest_states_past_its_bytes():
    store = InMemoryPipelineStore(max_bytes=10_000)
    for i in range(6):
        await store.put(f"h{i}", b"x" * 3000, 2e9)
    assert store.stored_bytes <= 10_000
    assert [await store.take(f"h{i}") is not None for i in range(6)] == [False, False, False, True, True, True]
    assert store.stored_bytes == 0


async def test_a_state_larger_than_the_store_is_refused_with_a_clear_error():
    store = InMemoryPipelineStore(max_bytes=1000)
    with pytest.raises(
        StateTooLarge, match="the suspended pipeline's state is 1001 bytes; the pipeline store keeps at most 1000"
    ):
        await store.put("h", b"x" * 1001, 2e9)
    assert len(store) == 0


# --- the declared front-end gets the same checks through the shared checker -------------------------------


def test_declared_steps_hand_each_template_only_the_step_ids_it_names(monkeypatch):
    from mcpipe.declared import StepScope, compile_steps

    spy = TemplateSpy(monkeypatch)
    n = 3000
    steps: list[dict[str, Any]] = [{"id": f"s{i}", "kind": "value", "value": {"i": i}} for i in range(n)]
    steps.append({"kind": "value", "value": {"first": "{{step1.v}}", "prev": f"${{steps.s{n - 1}.output}}"}})
    compiled, problems = compile_steps(steps, "pipelines.p.steps", StepScope())
    assert problems == [] and compiled is not None and len(compiled) == n + 1
    assert spy.ids == 1  # only `{{step1}}` needed an id


def test_a_declared_template_nested_past_the_depth_limit_is_a_located_limit_problem():
    from mcpipe.declared import StepScope, compile_steps

    steps = [{"kind": "value", "value": nested(100)}]
    compiled, problems = compile_steps(steps, "pipelines.p.steps", StepScope(max_json_depth=64))
    assert compiled is None
    assert [(p.location, p.code) for p in problems] == [("pipelines.p.steps[0].value", "LIMIT_EXCEEDED")]


def test_declared_parallel_children_still_cannot_see_each_other():
    from mcpipe.declared import StepScope, compile_steps

    steps = [
        {
            "kind": "parallel",
            "steps": [{"id": "a", "kind": "value", "value": 1}, {"kind": "value", "value": "${steps.a.output}"}],
        }
    ]
    _, problems = compile_steps(steps, "pipelines.p.steps", StepScope())
    assert [p.message for p in problems] == ["reference to step 'a', a sibling in the same parallel group"]


async def test_the_store_keeps_at_most_max_claims_evicting_the_soonest_expiring():
    now = 1_000_000.0
    store = InMemoryPipelineStore(clock=lambda: now, max_claims=3)
    for state, ttl in [("a", 10), ("b", 40), ("c", 20), ("d", 30)]:
        assert await store.claim(state, now + ttl) is True
    assert len(store) == 3  # `a`, the soonest to expire, went
    assert await store.claim("b", now + 40) is False  # the claims kept still refuse a replay


async def test_a_claim_evicted_early_never_lets_its_state_be_replayed():
    now = 1_000_000.0
    store = InMemoryPipelineStore(clock=lambda: now, max_claims=2)
    for state, ttl in [("a", 10), ("b", 20), ("c", 30)]:
        assert await store.claim(state, now + ttl) is True
    # `a`'s claim was evicted; its state carries its expiry, so its replay falls under what was evicted.
    with pytest.raises(ClaimUnverifiable, match="cannot tell whether this state was already used"):
        await store.claim("a", now + 10)
    with pytest.raises(ClaimUnverifiable):
        await store.claim("never-seen", now + 5)  # as soon to expire: it cannot be told from a replay
    assert await store.claim("b", now + 20) is False
    assert await store.claim("e", now + 60) is True  # states expiring later are resumed as ever
    with pytest.raises(ClaimUnverifiable):
        await store.claim("b", now + 20)  # `b` went for `e`, and is refused all the same
    assert len(store) == 2


# --- fan-out: nested for_each multiplies -------------------------------------------------------------------


def nested_each(levels: int, items: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"tool": "echo", "args": {"i": "${index}"}}
    for level in range(levels):
        step = {"id": f"e{level}", "for_each": items, "step": step}
    return step


def test_nested_for_each_over_known_items_past_max_calls_is_refused_at_compile_time():
    # Before: three nested for_each over a 100-item var (a 400-byte spec) made 1 000 000 calls in principle;
    # the issue measured 215 000 tool calls, 9 s and 904 MB before the run ended.
    spec = {"vars": {"items": list(range(100))}, "steps": [nested_each(3, "${vars.items}")]}
    with pytest.raises(SpecError) as e:
        compile_spec(spec)
    assert codes(e.value) == [("steps[0].for_each", "LIMIT_EXCEEDED")]
    assert "at least 1000000 step executions (nested for_each multiplies); the limit is 1000" in str(e.value)
    two = {"vars": {"items": list(range(40))}, "steps": [nested_each(2, "${vars.items}")]}
    with pytest.raises(SpecError, match="at least 1600 step executions"):
        compile_spec(two)
    compile_spec(two, limits=Limits(max_calls=1600))


async def test_nested_for_each_over_items_known_only_at_run_time_stops_at_max_calls():
    calls = 0
    tools = builtin_tools()

    @tools.tool
    def count() -> int:
        nonlocal calls
        calls += 1
        return calls

    each = nested_each(3, "${steps.list.structured.items}")
    each["step"]["step"]["step"] = {"tool": "count"}
    spec = {"steps": [{"id": "list", "tool": "echo", "args": {"items": list(range(100))}}, each]}
    answer = await run_pipeline(spec, tools, limits=Limits(max_calls=500))
    assert answer["ok"] is False and answer["error_code"] == "LIMIT_EXCEEDED"
    assert "step executions; the limit is 500" in answer["error"]
    assert calls < 500
