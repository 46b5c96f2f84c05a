"""Beyond the seeds (issue 17): per-step ``continue_on_error``, ``when``, defaults in references and
``for_each``, run by the scheduler against real Python tools."""

from __future__ import annotations

from typing import Any

from mcpipe.compile import Limits

# --- per-step continue_on_error ------------------------------------------------------------------------


async def test_a_step_that_may_fail_lets_the_pipeline_go_on_and_the_answer_names_it(run, probe):
    answer = await run(
        {
            "steps": [
                {"id": "a", "tool": "fail", "args": {"message": "flaky"}, "continue_on_error": True},
                {"id": "b", "tool": "echo", "args": {"value": "after"}},
            ]
        }
    )
    assert probe.log == ["fail flaky", "echo after"]
    assert answer["ok"] is False
    assert answer["error"] == "step 'a' failed: flaky"
    assert answer["result"] == {"value": "after"}
    assert answer["summary"] == {"total": 2, "succeeded": 1, "failed": 1, "skipped": 0, "cancelled": 0}


async def test_a_step_that_must_not_fail_stops_a_pipeline_that_continues_on_error(run, probe):
    answer = await run(
        {
            "continue_on_error": True,
            "steps": [
                {"id": "a", "tool": "fail", "args": {"message": "fatal"}, "continue_on_error": False},
                {"id": "b", "tool": "echo", "args": {"value": "never"}},
            ],
        }
    )
    assert probe.log == ["fail fatal"]
    assert answer["ok"] is False
    assert "b" not in answer["steps"]


async def test_a_parallel_child_that_may_fail_does_not_cancel_its_siblings(run, probe, autojump_clock):
    answer = await run(
        {
            "steps": [
                {
                    "id": "g",
                    "parallel": [
                        {"id": "f", "tool": "fail", "args": {"message": "x"}, "continue_on_error": True},
                        {"id": "w", "tool": "wait", "args": {"ms": 50, "label": "w"}},
                    ],
                }
            ]
        }
    )
    assert probe.cancelled == []
    assert answer["steps"]["g"]["children"]["w"]["ok"] is True
    assert answer["ok"] is False  # the group failed: one child did


async def test_every_failure_is_weighed_by_its_own_step_not_only_the_first_of_the_run(run, probe):
    # Three failures: `a` and `b` may fail, `c` may not. Each is weighed by its own policy, so the run
    # goes on after `a` and `b` and stops at `c` (before, only the run's first failure was weighed, and
    # `d` ran although the docs and the dry run say `c` stops the run).
    spec: dict[str, Any] = {
        "steps": [
            {"id": "a", "tool": "fail", "args": {"message": "a"}, "continue_on_error": True},
            {"id": "b", "tool": "fail", "args": {"message": "b"}, "continue_on_error": True},
            {"id": "c", "tool": "fail", "args": {"message": "c"}},
            {"id": "d", "tool": "echo", "args": {"value": "never"}},
        ]
    }
    answer = await run(spec)
    assert probe.log == ["fail a", "fail b", "fail c"]
    assert answer["ok"] is False
    assert answer["error"] == "step 'a' failed: a"  # the first failure, as the contract names it
    assert answer["result"] is None  # the run stopped
    assert [s for s in answer["steps"]] == ["a", "b", "c"]
    assert answer["summary"] == {"total": 4, "succeeded": 0, "failed": 3, "skipped": 1, "cancelled": 0}
    plan = (await run({**spec, "dry_run": True}))["plan"]
    assert [s["continue_on_error"] for s in plan["steps"]] == [True, True, False, False]


async def test_an_explicit_false_stops_a_continuing_pipeline_after_an_earlier_failure(run, probe):
    answer = await run(
        {
            "continue_on_error": True,
            "steps": [
                {"id": "a", "tool": "fail", "args": {"message": "a"}},
                {"id": "b", "tool": "fail", "args": {"message": "b"}, "continue_on_error": False},
                {"id": "c", "tool": "fail", "args": {"message": "c"}},
            ],
        }
    )
    assert probe.log == ["fail a", "fail b"]
    assert answer["ok"] is False and answer["result"] is None
    assert "c" not in answer["steps"]


async def test_a_child_that_must_not_fail_cancels_its_siblings_after_a_tolerated_failure(run, probe, autojump_clock):
    answer = await run(
        {
            "steps": [
                {
                    "id": "g",
                    "parallel": [
                        {"id": "f1", "tool": "fail", "args": {"message": "f1"}, "continue_on_error": True},
                        {"id": "f2", "tool": "fail", "args": {"message": "f2", "after_ms": 10}},
                        {"id": "w", "tool": "wait", "args": {"ms": 50, "label": "w"}},
                    ],
                }
            ]
        }
    )
    assert probe.cancelled == ["w"]
    assert answer["steps"]["g"]["children"]["w"]["error_code"] == "CANCELLED"
    assert answer["steps"]["g"]["error"] == "step 'f1' failed: f1"


# --- when ----------------------------------------------------------------------------------------------


async def test_a_step_whose_cel_condition_is_false_is_skipped_and_counted_so(run, probe):
    answer = await run(
        {
            "vars": {"n": 2},
            "steps": [
                {"id": "a", "tool": "echo", "args": {"value": 1}},
                {"id": "b", "tool": "echo", "args": {"value": 2}, "when": "vars.n > 5"},
                {"id": "c", "tool": "echo", "args": {"value": 3}, "when": "steps.a.structured.value == 1"},
            ],
        }
    )
    assert probe.log == ["echo 1", "echo 3"]
    assert answer["ok"] is True
    assert answer["steps"]["b"]["skipped"] is True
    assert "output" not in answer["steps"]["b"]
    assert answer["summary"] == {"total": 3, "succeeded": 2, "failed": 0, "skipped": 1, "cancelled": 0}


async def test_a_skipped_step_is_not_last_so_the_default_result_is_the_last_step_that_ran(run):
    answer = await run(
        {
            "steps": [
                {"id": "a", "tool": "echo", "args": {"value": "ran"}},
                {"id": "b", "tool": "echo", "args": {"value": "no"}, "when": "false"},
            ]
        }
    )
    assert answer["result"] == {"value": "ran"}


async def test_a_condition_written_as_one_reference_is_taken_as_a_boolean(run, probe):
    answer = await run(
        {
            "vars": {"go": True, "stop": False},
            "steps": [
                {"id": "a", "tool": "echo", "args": {"value": "go"}, "when": "${vars.go}"},
                {"id": "b", "tool": "echo", "args": {"value": "stop"}, "when": "${ vars.stop }"},
            ],
        }
    )
    assert probe.log == ["echo go"]
    assert answer["steps"]["b"]["skipped"] is True


async def test_a_condition_that_is_not_a_boolean_fails_its_step_located(run, probe):
    answer = await run({"vars": {"n": "yes"}, "steps": [{"tool": "echo", "args": {"value": 1}, "when": "${vars.n}"}]})
    assert probe.log == []
    assert answer["ok"] is False
    assert answer["steps"]["step1"]["error"] == "steps[0].when: `when` must be a boolean, got string"
    cel = await run({"steps": [{"tool": "echo", "args": {"value": 1}, "when": "1 + 1"}]})
    assert cel["steps"]["step1"]["error"] == "steps[0].when: `when` must be a boolean, got number"


async def test_a_reference_to_a_skipped_step_is_a_clear_error_unless_it_has_a_default(run, probe):
    answer = await run(
        {
            "steps": [
                {"id": "a", "tool": "echo", "args": {"value": 1}, "when": "false"},
                {"id": "b", "tool": "echo", "args": {"value": "${steps.a.structured.value}"}},
            ]
        }
    )
    assert answer["ok"] is False
    assert answer["error_code"] == "INTERPOLATION_FAILED"
    assert answer["steps"]["b"]["error"] == (
        "steps[1].args.value: cannot resolve `steps.a.structured.value`: step 'a' was skipped (its `when` was "
        'false); give the reference a default: `${steps.a.structured.value ?? "..."}`'
    )
    fine = await run(
        {
            "steps": [
                {"id": "a", "tool": "echo", "args": {"value": 1}, "when": "false"},
                {"id": "b", "tool": "echo", "args": {"value": "${steps.a.structured.value ?? 'none'}"}},
            ]
        }
    )
    assert fine["ok"] is True
    assert fine["result"] == {"value": "none"}


async def test_a_skipped_group_skips_its_children(run, probe):
    answer = await run(
        {
            "steps": [
                {"id": "a", "tool": "echo", "args": {"value": 1}},
                {"id": "g", "when": "false", "parallel": [{"tool": "echo"}, {"tool": "echo"}]},
            ]
        }
    )
    assert probe.log == ["echo 1"]
    assert answer["summary"]["skipped"] == 2
    assert answer["steps"]["g"]["skipped"] is True


# --- defaults ------------------------------------------------------------------------------------------


async def test_defaults_replace_missing_and_null_values_in_every_form(run):
    answer = await run(
        {
            "vars": {"x": None, "list": [1]},
            "steps": [
                {
                    "tool": "echo",
                    "args": {
                        "value": {
                            "typed": "${vars.list.5 ?? 0}",
                            "null": "${vars.x ?? false}",
                            "text": "n=${vars.list.9 ?? 'none'}",
                            "ref": {"$ref": "vars.list.7", "default": {"a": [1]}},
                            "kept": "${vars.list.0 ?? 7}",
                        }
                    },
                }
            ],
        }
    )
    assert answer["ok"] is True
    assert answer["result"]["value"] == {"typed": 0, "null": False, "text": "n=none", "ref": {"a": [1]}, "kept": 1}


# --- for_each ------------------------------------------------------------------------------------------


def _search(n: int) -> dict[str, Any]:
    return {"id": "search", "tool": "echo", "args": {"value": [{"url": f"u{i}"} for i in range(n)]}}


async def test_for_each_runs_its_step_per_element_and_answers_the_outputs_in_order(run, probe, autojump_clock):
    answer = await run(
        {
            "steps": [
                _search(3),
                {
                    "id": "pages",
                    "for_each": "${steps.search.structured.value}",
                    "as": "item",
                    "step": {"tool": "wait", "args": {"ms": 10, "label": "${item.url}", "value": "${index}"}},
                },
            ]
        }
    )
    assert answer["ok"] is True
    pages = answer["steps"]["pages"]
    assert pages["kind"] == "for_each"
    assert pages["output"] == [{"label": f"u{i}", "value": i} for i in range(3)]
    assert [c["output"]["label"] for c in pages["children"]] == ["u0", "u1", "u2"]
    assert answer["summary"] == {"total": 4, "succeeded": 4, "failed": 0, "skipped": 0, "cancelled": 0}


async def test_for_each_runs_under_the_calls_concurrency_limit(run, probe, autojump_clock):
    spec = {
        "vars": {"xs": list(range(10))},
        "steps": [{"id": "e", "for_each": "${vars.xs}", "step": {"tool": "wait", "args": {"ms": 50}}}],
    }
    answer = await run(spec, limits=Limits(max_concurrency=3))
    assert answer["ok"] is True
    assert probe.max_in_flight == 3


async def test_for_each_over_a_non_array_fails_located(run, probe):
    answer = await run(
        {"vars": {"xs": {"a": 1}}, "steps": [{"id": "e", "for_each": "${vars.xs}", "step": {"tool": "echo"}}]}
    )
    assert probe.log == []
    assert answer["ok"] is False
    assert answer["error_code"] == "INTERPOLATION_FAILED"
    assert answer["steps"]["e"]["error"] == "steps[0].for_each: expected an array, got object"


async def test_for_each_past_max_items_fails_before_any_call(run, probe):
    spec = {"vars": {"xs": list(range(5))}, "steps": [{"id": "e", "for_each": "${vars.xs}", "step": {"tool": "echo"}}]}
    answer = await run(spec, limits=Limits(max_items=4))
    assert probe.log == []
    assert answer["error_code"] == "LIMIT_EXCEEDED"
    assert answer["steps"]["e"]["error"] == "steps[0].for_each: 5 items; the limit is 4"
    assert (await run(spec))["ok"] is True  # the default limit is 100


async def test_a_failing_element_stops_the_others_unless_errors_are_tolerated(run, probe, autojump_clock):
    step = {"tool": "fail", "args": {"message": "${item.m}", "after_ms": "${item.d}"}}
    xs = [{"m": "a", "d": 0}, {"m": "b", "d": 10}, {"m": "c", "d": 20}]
    spec: dict[str, Any] = {"vars": {"xs": xs}, "steps": [{"id": "e", "for_each": "${vars.xs}", "step": step}]}
    answer = await run(spec)
    assert answer["ok"] is False
    assert answer["steps"]["e"]["error"] == "item 0 failed: a"
    assert probe.log == ["fail a"]
    probe.log.clear()
    spec["steps"][0]["continue_on_error"] = True
    tolerant = await run(spec)
    assert probe.log == ["fail a", "fail b", "fail c"]
    assert [c["error"] for c in tolerant["steps"]["e"]["children"]] == ["a", "b", "c"]


async def test_an_element_whose_condition_is_false_is_skipped_and_its_output_is_null(run, probe):
    answer = await run(
        {
            "vars": {"xs": [1, 2, 3]},
            "steps": [
                {
                    "id": "e",
                    "for_each": "${vars.xs}",
                    "step": {"tool": "echo", "args": {"value": "${item}"}, "when": "item != 2"},
                }
            ],
        }
    )
    assert probe.log == ["echo 1", "echo 3"]
    assert answer["ok"] is True
    assert answer["result"] == [{"value": 1}, None, {"value": 3}]
    assert answer["steps"]["e"]["children"][1]["skipped"] is True
    assert answer["summary"] == {"total": 3, "succeeded": 2, "failed": 0, "skipped": 1, "cancelled": 0}


async def test_a_for_each_with_no_elements_answers_an_empty_list_and_counts_nothing(run, probe):
    answer = await run({"vars": {"xs": []}, "steps": [{"id": "e", "for_each": "${vars.xs}", "step": {"tool": "echo"}}]})
    assert answer["ok"] is True and answer["result"] == []
    assert answer["summary"]["total"] == 0


async def test_a_for_each_inside_a_for_each_binds_the_inner_element_and_counts_every_call(run):
    spec = {
        "vars": {"m": [[1, 2], [3, 4, 5]]},
        "steps": [
            {
                "id": "o",
                "for_each": "${vars.m}",
                "step": {"id": "i", "for_each": "${item}", "step": {"tool": "echo", "args": {"value": "${item}"}}},
            }
        ],
    }
    answer = await run(spec)
    assert answer["result"] == [[{"value": 1}, {"value": 2}], [{"value": 3}, {"value": 4}, {"value": 5}]]
    assert answer["summary"] == {"total": 5, "succeeded": 5, "failed": 0, "skipped": 0, "cancelled": 0}


async def test_a_condition_that_cannot_resolve_fails_its_step_once_located(run, probe):
    answer = await run({"vars": {"o": {}}, "steps": [{"tool": "echo", "when": "${vars.o.on}"}]})
    assert probe.log == []
    assert answer["error_code"] == "INTERPOLATION_FAILED"
    assert (
        answer["steps"]["step1"]["error"] == "steps[0].when: cannot resolve `vars.o.on`: `on` not found in empty object"
    )


async def test_as_names_the_element_in_templates_and_conditions_beside_item(run, probe):
    spec = {
        "vars": {"xs": [{"u": "a"}, {"u": "b"}, {"u": "c"}]},
        "steps": [
            {
                "id": "pages",
                "for_each": "${vars.xs}",
                "as": "page",
                "step": {"tool": "echo", "args": {"value": "${page.u}-${index}"}, "when": "page.u != 'b'"},
            }
        ],
    }
    answer = await run(spec)
    assert answer["ok"] is True
    assert answer["result"] == [{"value": "a-0"}, None, {"value": "c-2"}]
    outside = await run({"steps": [{"tool": "echo", "args": {"value": "${page.u}"}}]})
    assert [p["location"] for p in outside["problems"]] == ["steps[0].args.value"]


async def test_a_parallel_tool_child_whose_condition_is_false_is_skipped(run, probe):
    answer = await run(
        {
            "steps": [
                {
                    "id": "g",
                    "parallel": [
                        {"id": "on", "tool": "echo", "args": {"value": 1}},
                        {"id": "off", "tool": "echo", "args": {"value": 2}, "when": "false"},
                    ],
                }
            ]
        }
    )
    assert probe.log == ["echo 1"]
    assert answer["steps"]["g"]["children"]["off"]["skipped"] is True
    assert answer["summary"]["skipped"] == 1
