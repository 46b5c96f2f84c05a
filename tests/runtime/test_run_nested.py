"""Nested pipes: their own scope, their vars resolved in the parent's environment (section 3)."""

from __future__ import annotations


async def test_a_nested_pipe_gets_its_vars_from_the_parent_and_returns_its_result(run):
    spec = {
        "vars": {"q": "outer"},
        "steps": [
            {"id": "a", "tool": "echo", "args": {"value": "from a"}},
            {
                "id": "sub",
                "pipe": {
                    "vars": {"got": "${steps.a.structured.value}", "q": "${vars.q}!"},
                    "steps": [
                        {"id": "x", "tool": "echo", "args": {"value": "${vars.got} / ${vars.q}"}},
                        {"id": "y", "tool": "echo", "args": {"value": "{{x.value}}"}},
                    ],
                    "return": {"$ref": "steps.y.structured.value"},
                },
            },
            {"id": "b", "tool": "echo", "args": {"value": "${steps.sub.result}|${steps.sub.steps.x.output.value}"}},
        ],
    }
    answer = await run(spec)
    assert answer["ok"], answer["error"]
    sub = answer["steps"]["sub"]
    assert sub["result"] == sub["output"] == "from a / outer!"
    assert list(sub["steps"]) == ["x", "y"]
    assert answer["steps"]["b"]["output"] == {"value": "from a / outer!|from a / outer!"}
    assert answer["summary"]["total"] == 4


async def test_a_nested_pipe_cannot_see_its_parents_steps(run, probe):
    spec = {
        "steps": [
            {"id": "a", "tool": "echo"},
            {"id": "sub", "pipe": {"steps": [{"tool": "echo", "args": {"value": "${steps.a.output}"}}]}},
        ]
    }
    answer = await run(spec)
    assert answer["error_code"] == "INVALID_SPEC"
    assert answer["problems"] == [
        {
            "location": "steps[1].pipe.steps[0].args.value",
            "code": "INVALID_SPEC",
            "message": "reference to unknown step 'a'",
        }
    ]
    assert probe.log == []


async def test_nested_ids_are_their_own_namespace(run):
    spec = {
        "steps": [
            {"id": "x", "tool": "echo", "args": {"value": "outer"}},
            {"id": "sub", "pipe": {"steps": [{"id": "x", "tool": "echo", "args": {"value": "inner"}}]}},
        ],
        "return": ["${steps.x.output.value}", "${steps.sub.steps.x.output.value}"],
    }
    assert (await run(spec))["result"] == ["outer", "inner"]


async def test_a_nested_pipe_without_return_gives_the_output_of_its_last_step(run):
    spec = {
        "steps": [
            {
                "id": "sub",
                "pipe": {"steps": [{"tool": "echo", "args": {"value": 1}}, {"tool": "text", "args": {"value": "t"}}]},
            }
        ]
    }
    assert (await run(spec))["steps"]["sub"]["result"] == "t"


async def test_nested_vars_that_cannot_resolve_fail_the_pipe_step_before_its_steps_run(run, probe):
    spec = {
        "steps": [
            {"id": "a", "tool": "echo", "args": {"value": {}}},
            {"id": "sub", "pipe": {"vars": {"v": {"$ref": "steps.a.structured.value.k"}}, "steps": [{"tool": "echo"}]}},
        ]
    }
    answer = await run(spec)
    sub = answer["steps"]["sub"]
    assert sub["error_code"] == "INTERPOLATION_FAILED"
    assert sub["error"].startswith("steps[1].pipe.vars.v: cannot resolve `steps.a.structured.value.k`")
    assert sub["steps"] == {} and sub["result"] is None
    assert probe.log == ["echo {}"]
    assert answer["summary"] == {"total": 2, "succeeded": 1, "failed": 0, "skipped": 1, "cancelled": 0}


async def test_a_failing_nested_step_fails_the_pipe_step_with_its_code(run):
    spec = {"steps": [{"id": "sub", "pipe": {"steps": [{"id": "f", "tool": "fail", "args": {"message": "bad"}}]}}]}
    answer = await run(spec)
    sub = answer["steps"]["sub"]
    assert (sub["error_code"], sub["error"]) == ("TOOL_ERROR", "step 'f' failed: bad")
    assert answer["error"] == "step 'sub' failed: step 'f' failed: bad"


async def test_a_nested_pipe_keeps_its_own_continue_on_error(run):
    spec = {
        "steps": [
            {
                "id": "sub",
                "pipe": {
                    "continue_on_error": True,
                    "steps": [{"id": "f", "tool": "fail"}, {"id": "g", "tool": "echo", "args": {"value": 2}}],
                    "return": "${steps.g.output.value}",
                },
            },
            {"id": "after", "tool": "echo"},
        ]
    }
    answer = await run(spec)
    sub = answer["steps"]["sub"]
    assert sub["ok"] is False and sub["result"] == 2 and list(sub["steps"]) == ["f", "g"]
    assert "after" not in answer["steps"]  # the outer pipeline stops on the failed pipe step


async def test_a_pipe_inside_a_parallel_group_runs_beside_its_siblings(run, probe, autojump_clock):
    import trio

    spec = {
        "steps": [
            {
                "id": "g",
                "parallel": [
                    {
                        "id": "p",
                        "pipe": {
                            "steps": [
                                {"tool": "wait", "args": {"ms": 50, "label": "p1"}},
                                {"tool": "wait", "args": {"ms": 50, "label": "p2"}},
                            ]
                        },
                    },
                    {"id": "w", "tool": "wait", "args": {"ms": 100, "label": "w"}},
                ],
            }
        ]
    }
    t0 = trio.current_time()
    answer = await run(spec)
    assert answer["ok"]
    assert trio.current_time() - t0 == 0.1
    assert probe.max_in_flight == 2
