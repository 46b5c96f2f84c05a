"""``mcp_pipe``'s answers sized for the model that reads them (issue 23): by default each step output appears
at most once in what the model reads (the result), the caller chooses what comes back (``answer``: ``result``,
``steps``, ``full``), the text block is the structured content serialized (the MCP spec's advice for
structured results), and an error answer carries the failing step and what ran, not every output."""

from __future__ import annotations

import jsonschema
import orjson
import pytest
from mcp import Client

from kit.servers import make_config, running
from mcpipe.gateway import PIPE_TOOL
from mcpipe.results import step_summary
from mcpipe.server._schema import PIPE_OUTPUT_SCHEMA

BIG = 50_000


def marked(tag: str) -> str:
    """A step output of ``BIG`` bytes that can be counted in an answer."""
    return f"<{tag}>" + "x" * BIG


def three_steps(**extra) -> dict:
    return {
        "steps": [
            {"id": "a", "tool": "echo", "args": {"v": marked("A")}},
            {"id": "b", "tool": "echo", "args": {"v": marked("B")}},
            {"id": "c", "tool": "echo", "args": {"v": marked("C")}},
        ],
        **extra,
    }


async def call(spec: dict, config=None):
    async with running(config) as app, Client(app.server) as client:
        await client.list_tools()  # the client checks answers against the output schema it was given
        return await client.call_tool(PIPE_TOOL, spec)


def counts(r) -> tuple[dict[str, int], dict[str, int]]:
    """How often each output appears in the text the model reads, and in the structured content."""
    text = r.content[0].text
    structured = orjson.dumps(r.structured_content).decode()
    tags = ("<A>", "<B>", "<C>")
    return {t: text.count(t) for t in tags}, {t: structured.count(t) for t in tags}


async def test_by_default_the_answer_holds_the_result_and_no_step_records():
    r = await call(three_steps())
    answer = r.structured_content
    assert answer["ok"] is True and answer["result"] == {"v": marked("C")}
    assert "steps" not in answer
    in_text, in_structured = counts(r)
    assert in_text == in_structured == {"<A>": 0, "<B>": 0, "<C>": 1}
    assert answer["summary"] == {"total": 3, "succeeded": 3, "failed": 0, "skipped": 0, "cancelled": 0}


async def test_a_summary_per_step_holds_no_output():
    r = await call(three_steps(answer="steps"))
    answer = r.structured_content
    assert counts(r)[0] == {"<A>": 0, "<B>": 0, "<C>": 1}
    assert answer["steps"]["a"] == {
        "id": "a",
        "kind": "tool",
        "ok": True,
        "error": "",
        "error_code": None,
        "duration_ms": answer["steps"]["a"]["duration_ms"],
    }


@pytest.mark.parametrize("mode", ["result", "steps", "full"])
async def test_the_text_block_is_the_structured_content_serialized_in_every_mode(mode):
    r = await call(three_steps(answer=mode))
    assert len(r.content) == 1 and orjson.loads(r.content[0].text) == r.structured_content
    jsonschema.validate(r.structured_content, PIPE_OUTPUT_SCHEMA)


async def test_full_records_are_the_contracts_answer_unchanged():
    r = await call(three_steps(answer="full"))
    step = r.structured_content["steps"]["a"]
    assert step["structured"] == step["output"] == {"v": marked("A")}
    assert orjson.loads(step["text"]) == step["structured"] and step["content"][0]["text"] == step["text"]
    in_text, _ = counts(r)
    assert in_text == {"<A>": 4, "<B>": 4, "<C>": 5}  # four copies per record, and the result


@pytest.mark.parametrize("mode", ["result", "steps"])
async def test_an_error_answer_carries_the_failing_step_and_what_ran_not_every_output(mode):
    spec = {
        "steps": [
            {"id": "a", "tool": "echo", "args": {"v": marked("A")}},
            {"id": "bad", "tool": "json_parse", "args": {"text": "not json"}},
            {"id": "c", "tool": "echo", "args": {"v": marked("C")}},
        ],
        "answer": mode,
    }
    r = await call(spec)
    answer = r.structured_content
    assert r.is_error is True and answer["ok"] is False and answer["error_code"] == "TOOL_ERROR"
    assert list(answer["steps"]) == ["a", "bad"]  # what ran
    assert "output" not in answer["steps"]["a"]
    assert answer["steps"]["bad"]["error_code"] == "TOOL_ERROR"
    assert len(r.content[0].text) < 2_000


async def test_a_failed_steps_output_is_left_out_when_it_is_only_its_error_again():
    spec = {"steps": [{"id": "f", "tool": "fail", "args": {}}], "answer": "steps"}
    answer = (await call(spec)).structured_content
    assert answer["steps"]["f"]["error"] == "it did not work" and "output" not in answer["steps"]["f"]


def test_a_failed_steps_own_structured_output_stays_in_its_summary():
    record = {
        "id": "charge",
        "kind": "http",
        "ok": False,
        "error": "HTTP 402",
        "error_code": "TOOL_ERROR",
        "structured": {"status": 402, "body": {"reason": "card declined"}},
        "text": "",
        "content": [],
        "output": {"status": 402, "body": {"reason": "card declined"}},
        "duration_ms": 3.0,
    }
    assert step_summary(record) == {
        "id": "charge",
        "kind": "http",
        "ok": False,
        "error": "HTTP 402",
        "error_code": "TOOL_ERROR",
        "duration_ms": 3.0,
        "output": {"status": 402, "body": {"reason": "card declined"}},
    }


async def test_a_pipeline_refused_for_size_answers_small_by_default():
    # Issue 23: refused for size at its third step, the answer still held every output (25 MB at the default
    # limits); here 100 KB outputs against a 2 MB answer limit, which the full records pass at the third step.
    config = make_config(pipe={"max_answer_bytes": 2_000_000})
    steps = [{"id": f"s{i}", "tool": "echo", "args": {"v": "y" * 100_000}} for i in range(5)]
    full = await call({"steps": steps, "answer": "full"}, config)
    small = await call({"steps": steps}, config)
    for r in (full, small):
        assert r.structured_content["error_code"] == "OUTPUT_TOO_LARGE"
        assert list(r.structured_content["steps"]) == ["s0", "s1", "s2"]
    assert len(full.content[0].text) > 800_000  # two steps, four copies of each output
    assert len(small.content[0].text) < 3_000


async def test_the_servers_default_answer_is_configured_by_pipe_answer():
    r = await call(three_steps(), make_config(pipe={"answer": "full"}))
    assert r.structured_content["steps"]["a"]["output"] == {"v": marked("A")}


async def test_answer_applies_to_the_whole_call_and_is_refused_inside_a_nested_pipe():
    spec = {"steps": [{"id": "p", "pipe": {"steps": [{"tool": "echo"}], "answer": "full"}}]}
    answer = (await call(spec)).structured_content
    assert answer["error_code"] == "INVALID_SPEC"
    assert answer["problems"][0]["location"] == "steps[0].pipe.answer"


async def test_an_unknown_answer_mode_is_a_located_error():
    answer = (await call(three_steps(answer="everything"))).structured_content
    assert answer["error_code"] == "INVALID_SPEC" and answer["problems"][0]["location"] == "answer"


async def test_nested_and_parallel_records_are_summarized_too():
    spec = {
        "steps": [
            {"id": "g", "parallel": [{"id": "x", "tool": "echo", "args": {"v": marked("A")}}]},
            {"id": "p", "pipe": {"steps": [{"id": "y", "tool": "echo", "args": {"v": marked("B")}}]}},
            {"id": "e", "for_each": "${steps.g.output.x.v}", "step": {"tool": "echo"}, "when": "false"},
        ],
        "return": "done",
    }
    r = await call({**spec, "answer": "steps"})
    answer = r.structured_content
    assert counts(r)[0] == {"<A>": 0, "<B>": 0, "<C>": 0}
    assert answer["steps"]["g"]["children"]["x"]["ok"] is True
    assert answer["steps"]["p"]["steps"]["y"]["ok"] is True and "result" not in answer["steps"]["p"]
    assert answer["steps"]["e"]["skipped"] is True
