"""Sequential steps, step results and the answer (contract sections 3, 6 and 7)."""

from __future__ import annotations

import orjson
import pytest
import trio

# The two examples of seed 000 (`mcp_pipe`), verbatim.
SEARCH_FETCH_EXTRACT = """
{
    "vars": { "q": "mcp protocol overview" },
    "steps": [
        { "id": "search", "tool": "web_search", "args": { "query": "${vars.q}" } },
        {
            "id": "fetch",
            "tool": "web_fetch",
            "args": { "url": { "$ref": "steps.search.structured.results.0.url" } }
        },
        {
            "id": "extract",
            "tool": "extract_key_info",
            "args": {
                "query": "${vars.q}",
                "materials": "${steps.fetch.structured.content}"
            }
        }
    ],
    "return": { "$ref": "steps.extract.structured.contexts" }
}
"""

PARALLEL_FETCH = """
{
    "vars": { "q": "golang", "u1": "https://a", "u2": "https://b" },
    "steps": [
        {
            "id": "pages",
            "parallel": [
                { "id": "p1", "tool": "web_fetch", "args": { "url": "${vars.u1}" } },
                { "id": "p2", "tool": "web_fetch", "args": { "url": "${vars.u2}" } }
            ]
        },
        {
            "id": "extract",
            "tool": "extract_key_info",
            "args": {
                "query": "${vars.q}",
                "materials": "${steps.pages.children.p1.structured.content}\\n${steps.pages.children.p2.structured.content}"
            }
        }
    ],
    "return": { "$ref": "steps.extract.structured.contexts" }
}
"""  # noqa: E501

ANSWER_KEYS = ["ok", "error", "error_code", "result", "steps", "summary", "duration_ms"]
COMMON_KEYS = ["id", "kind", "ok", "error", "error_code", "structured", "text", "content", "output"]


async def test_seed_search_fetch_extract_runs_end_to_end(run, probe, autojump_clock):
    answer = await run(SEARCH_FETCH_EXTRACT)
    assert answer["ok"], answer["error"]
    assert probe.log == [
        "search mcp protocol overview",
        "fetch https://example.org/mcp-protocol-overview",
        "extract",
    ]
    assert answer["result"] == ["mcp protocol overview: <content of https://example.org/mcp-protocol-overview>"]
    assert list(answer["steps"]) == ["search", "fetch", "extract"]
    assert answer["summary"] == {"total": 3, "succeeded": 3, "failed": 0, "skipped": 0, "cancelled": 0}


async def test_seed_parallel_fetch_runs_end_to_end_concurrently(run, probe, autojump_clock):
    t0 = trio.current_time()
    answer = await run(PARALLEL_FETCH)
    assert answer["ok"], answer["error"]
    # The two fetches (50 ms each) overlapped.
    assert trio.current_time() - t0 == pytest.approx(0.05)
    assert answer["result"] == ["golang: <content of https://a>", "golang: <content of https://b>"]
    pages = answer["steps"]["pages"]
    assert list(pages["children"]) == ["p1", "p2"]
    assert pages["output"] == {
        "p1": {"url": "https://a", "content": "<content of https://a>"},
        "p2": {"url": "https://b", "content": "<content of https://b>"},
    }


async def test_steps_run_in_order_each_after_the_previous_finished(run, probe, autojump_clock):
    spec = {"steps": [{"tool": "wait", "args": {"ms": 30, "label": str(i)}} for i in range(1, 4)]}
    answer = await run(spec)
    assert answer["ok"]
    assert probe.log == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]
    assert probe.max_in_flight == 1
    assert list(answer["steps"]) == ["step1", "step2", "step3"]


async def test_answer_has_exactly_the_fields_of_section_7(run):
    answer = await run({"steps": [{"id": "a", "tool": "echo", "args": {"value": 1}}]})
    assert list(answer) == ANSWER_KEYS
    assert answer["ok"] is True and answer["error"] == "" and answer["error_code"] is None
    assert isinstance(answer["duration_ms"], float) and answer["duration_ms"] >= 0
    assert list(answer["summary"]) == ["total", "succeeded", "failed", "skipped", "cancelled"]
    orjson.dumps(answer)  # JSON-ready as it is


async def test_step_results_carry_every_field_of_section_3_by_kind(run):
    spec = {
        "steps": [
            {"id": "t", "tool": "echo", "args": {"value": 1}},
            {"id": "g", "parallel": [{"id": "c", "tool": "echo", "args": {"value": 2}}]},
            {"id": "p", "pipe": {"steps": [{"tool": "echo", "args": {"value": 3}}]}},
        ]
    }
    steps = (await run(spec))["steps"]
    assert list(steps["t"]) == [*COMMON_KEYS, "duration_ms"]
    assert list(steps["g"]) == [*COMMON_KEYS, "children", "duration_ms"]
    assert list(steps["p"]) == [*COMMON_KEYS, "result", "steps", "duration_ms"]
    assert steps["t"] == {
        "id": "t",
        "kind": "tool",
        "ok": True,
        "error": "",
        "error_code": None,
        "structured": {"value": 1},
        "text": '{"value":1}',
        "content": [{"type": "text", "text": '{"value":1}'}],
        "output": {"value": 1},
        "duration_ms": steps["t"]["duration_ms"],
    }
    assert steps["g"]["output"] == {"c": {"value": 2}}
    assert steps["p"]["kind"] == "pipe" and steps["p"]["result"] == {"value": 3} == steps["p"]["output"]


@pytest.mark.parametrize(
    ("texts", "structured", "output"),
    [
        (['{"a": 1}'], {"a": 1}, {"a": 1}),
        (["  [1, 2]"], [1, 2], [1, 2]),
        (["plain words"], None, "plain words"),
        (["{not json"], None, "{not json"),
        (["3"], None, "3"),  # only an object or an array counts as structured
        (['{"a": 1}', '{"b": 2}'], None, '{"a": 1}{"b": 2}'),  # two blocks: text, never parsed
        ([], None, ""),
    ],
)
async def test_structured_is_parsed_from_exactly_one_json_text_block(run, texts, structured, output):
    answer = await run({"steps": [{"id": "b", "tool": "blocks", "args": {"texts": texts}}]})
    step = answer["steps"]["b"]
    assert (step["structured"], step["output"]) == (structured, output)
    assert step["text"] == "".join(texts)
    assert step["content"] == [{"type": "text", "text": t} for t in texts]


async def test_structured_content_of_the_tool_wins_over_its_text(run):
    answer = await run({"steps": [{"id": "e", "tool": "echo", "args": {"value": "x"}}]})
    assert answer["steps"]["e"]["structured"] == {"value": "x"}


async def test_without_return_the_result_is_the_output_of_the_last_step(run):
    answer = await run({"steps": [{"tool": "echo", "args": {"value": 1}}, {"tool": "text", "args": {"value": "hi"}}]})
    assert answer["result"] == "hi"


async def test_return_template_is_resolved_against_the_finished_steps(run):
    spec = {
        "vars": {"n": 2},
        "steps": [{"id": "a", "tool": "echo", "args": {"value": "${vars.n}"}}, {"tool": "echo", "args": {"value": 5}}],
        "return": {"first": {"$ref": "steps.a.structured.value"}, "second": "{{step2.value}}", "last": "${last.ok}"},
    }
    answer = await run(spec)
    assert answer["result"] == {"first": 2, "second": 5, "last": True}


async def test_later_steps_receive_typed_values_from_earlier_ones(run, probe):
    spec = {
        "steps": [
            {"id": "a", "tool": "echo", "args": {"value": [1, 2, 3]}},
            {"id": "b", "tool": "echo", "args": {"value": {"$ref": "steps.a.structured.value"}}},
            {"id": "c", "tool": "echo", "args": {"value": "n=${steps.b.output.value.-1} last=${last.output.value.0}"}},
        ]
    }
    answer = await run(spec)
    assert answer["steps"]["b"]["structured"] == {"value": [1, 2, 3]}
    assert answer["steps"]["c"]["structured"] == {"value": "n=3 last=1"}


async def test_return_that_cannot_resolve_fails_the_pipeline_and_keeps_every_step(run):
    spec = {"steps": [{"id": "a", "tool": "echo", "args": {"value": 1}}], "return": "${steps.a.structured.nope}"}
    answer = await run(spec)
    assert answer["ok"] is False
    assert answer["error_code"] == "INTERPOLATION_FAILED"
    assert "steps.a.structured.nope" in answer["error"] and "return" in answer["error"]
    assert answer["result"] is None
    assert answer["steps"]["a"]["ok"] is True
    assert answer["summary"]["succeeded"] == 1


async def test_vars_may_use_the_args_and_context_roots(run):
    from mcpipe.tools import ToolContext

    spec = {
        "vars": {"who": "${args.name}", "rid": "${context.request_id}"},
        "steps": [{"tool": "echo", "args": {"value": "${vars.who}/${vars.rid}"}}],
    }
    answer = await run(spec, args={"name": "ada"}, context=ToolContext(request_id="r-9"))
    assert answer["result"] == {"value": "ada/r-9"}


async def test_vars_that_cannot_resolve_fail_before_any_step_runs(run, probe):
    answer = await run({"vars": {"x": {"$ref": "args.missing"}}, "steps": [{"tool": "echo"}]})
    assert answer["ok"] is False and answer["error_code"] == "INTERPOLATION_FAILED"
    assert answer["steps"] == {} and probe.log == []
    assert answer["summary"] == {"total": 1, "succeeded": 0, "failed": 0, "skipped": 1, "cancelled": 0}


async def test_tool_error_fails_the_step_with_its_text_and_stops_the_pipeline(run, probe):
    spec = {"steps": [{"id": "f", "tool": "fail", "args": {"message": "no such page"}}, {"tool": "echo"}]}
    answer = await run(spec)
    step = answer["steps"]["f"]
    assert (step["ok"], step["error_code"], step["error"]) == (False, "TOOL_ERROR", "no such page")
    assert step["text"] == "no such page"
    assert answer["ok"] is False and answer["error_code"] == "TOOL_ERROR"
    assert answer["error"] == "step 'f' failed: no such page"
    assert answer["result"] is None
    assert list(answer["steps"]) == ["f"]
    assert answer["summary"] == {"total": 2, "succeeded": 0, "failed": 1, "skipped": 1, "cancelled": 0}


async def test_a_raising_tool_is_tool_failed_and_logged(run, caplog):
    answer = await run({"steps": [{"id": "b", "tool": "boom", "args": {"message": "kaput"}}]})
    step = answer["steps"]["b"]
    assert (step["error_code"], step["error"]) == ("TOOL_FAILED", "RuntimeError: kaput")
    assert answer["error_code"] == "TOOL_FAILED"
    assert any("tool 'boom' raised" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_invalid_arguments_are_a_tool_error_naming_the_argument(run):
    # A value known only at run time (an output no schema describes) is checked when the tool is called.
    spec = {
        "steps": [
            {"id": "e", "tool": "echo", "args": {"value": "soon"}},
            {"id": "w", "tool": "wait", "args": {"ms": "${steps.e.structured.value}"}},
        ]
    }
    answer = await run(spec)
    step = answer["steps"]["w"]
    assert step["error_code"] == "TOOL_ERROR"
    assert step["error"] == "invalid arguments for tool 'wait': Expected `float`, got `str` - at `args.ms`"


async def test_a_missing_value_at_run_time_is_interpolation_failed_before_the_tool_is_called(run, probe):
    spec = {
        "steps": [
            {"id": "search", "tool": "echo", "args": {"value": []}},
            {"id": "fetch", "tool": "web_fetch", "args": {"url": {"$ref": "steps.search.structured.value.0"}}},
        ]
    }
    answer = await run(spec)
    step = answer["steps"]["fetch"]
    assert step["error_code"] == "INTERPOLATION_FAILED"
    assert step["error"] == (
        "steps[1].args.url: cannot resolve `steps.search.structured.value.0`: `0` not found in array of length 0"
    )
    assert answer["error"] == f"step 'fetch' failed: {step['error']}"
    assert not any(line.startswith("fetch") for line in probe.log)
    assert answer["summary"]["failed"] == 1


async def test_continue_on_error_runs_every_step_and_names_the_first_failure(run, probe):
    spec = {
        "continue_on_error": True,
        "steps": [
            {"id": "a", "tool": "fail", "args": {"message": "first"}},
            {"id": "b", "tool": "echo", "args": {"value": "${steps.a.structured.x}"}},
            {"id": "c", "tool": "echo", "args": {"value": "${steps.a.text}"}},
            {"id": "d", "tool": "fail", "args": {"message": "second"}},
        ],
        "return": {"c": "${steps.c.output.value}"},
    }
    answer = await run(spec)
    assert [answer["steps"][s]["error_code"] for s in "abcd"] == [
        "TOOL_ERROR",
        "INTERPOLATION_FAILED",
        None,
        "TOOL_ERROR",
    ]
    assert answer["ok"] is False
    assert answer["error_code"] == "TOOL_ERROR" and answer["error"] == "step 'a' failed: first"
    assert answer["result"] == {"c": "first"}
    assert answer["summary"] == {"total": 4, "succeeded": 1, "failed": 3, "skipped": 0, "cancelled": 0}


async def test_tool_calls_get_the_request_context_for_their_step(run, probe):
    from mcpipe.tools import ToolContext

    ctx = ToolContext(request_id="r-1", client={"name": "cli", "version": "1"}, pipeline="pipe-1")
    spec = {
        "steps": [
            {"id": "me", "tool": "whoami"},
            {"id": "g", "parallel": [{"id": "c", "tool": "whoami"}]},
            {"id": "p", "pipe": {"steps": [{"id": "inner", "tool": "whoami"}]}},
        ]
    }
    answer = await run(spec, context=ctx)
    assert answer["ok"]
    assert [(c.pipeline, c.step, c.request_id) for c in probe.contexts] == [
        ("pipe-1", "me", "r-1"),
        ("pipe-1", "g.c", "r-1"),
        ("pipe-1", "p.inner", "r-1"),
    ]
    assert all(c.client == {"name": "cli", "version": "1"} for c in probe.contexts)


async def test_without_a_pipeline_id_each_run_gets_a_fresh_one(run, probe):
    await run({"steps": [{"tool": "whoami"}]})
    await run({"steps": [{"tool": "whoami"}]})
    first, second = (c.pipeline for c in probe.contexts)
    assert first and second and first != second


async def test_an_exception_without_a_message_is_named_by_its_type(run):
    answer = await run({"steps": [{"id": "b", "tool": "boom", "args": {"message": ""}}]})
    assert answer["steps"]["b"]["error"] == "RuntimeError"
