"""Answer bytes per byte of step output (issue 23): ``mcp_pipe``'s answer on the wire (its two
representations: the structured content and the text block, as the issue counts them; the JSON-RPC message
adds the text's escapes, shown apart) and as the model reads it (the text), with the full records
(``answer: full``, the answer before issue 23), a summary per step (``steps``) and the default (``result``),
on the resolver workloads of ``../shared/bench/workloads.py`` and the seed examples, side by side.

    pytest benches/test_answers.py --benchmark-enable --benchmark-only -s    # with the table

Each workload becomes a pipeline whose steps answer exactly the workload's step outputs (a tool, ``emit``,
returns them) and whose ``return`` is the workload's template. The byte counts are exact (they do not depend
on the machine); the benchmark times shaping and encoding the answer. Targets, by default: at most 2x on the
wire and 1x in the text, per byte of what the answer must carry (the step outputs the result holds: a
``return`` that builds more than its outputs, as ``wide_args``'s 50 constant objects and 100 copies do, is
measured against its result).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio

from kit.discord import Standins
from mcpipe.formats.discord import pipeline_tool
from mcpipe.plan import Limits
from mcpipe.results import pipe_envelope, shape_answer
from mcpipe.runtime import run_pipeline
from mcpipe.tools import ToolContext, ToolRegistry

registry = ToolRegistry()
LIMITS = Limits(max_steps=100)  # `wildcard` is a group of 50 children: 51 steps


@registry.tool
def emit(value: dict[str, Any]) -> dict[str, Any]:
    """Answer ``value`` (a step output of the workload)."""
    return value


def _step(sid: str, result: dict[str, Any]) -> dict[str, Any]:
    """The spec step that reproduces a workload's step result."""
    if result["kind"] == "parallel":
        return {"id": sid, "parallel": [_step(cid, child) for cid, child in result["children"].items()]}
    return {"id": sid, "tool": "emit", "args": {"value": {"$literal": result["structured"]}}}


def pipelines(workloads: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The workloads with step outputs as pipelines, and seed 000's example."""
    out = {}
    for name, (template, env) in workloads.items():
        if not env["steps"]:
            continue  # `tiny`: no step output to measure against
        steps = [_step(sid, r) for sid, r in env["steps"].items()]
        out[name] = {"vars": env["vars"], "steps": steps, "return": template}
    # Seed 000: search, fetch, extract; the answer is the extracted contexts.
    results = [{"url": f"https://example.org/{i}", "title": f"result {i}", "score": i / 10} for i in range(10)]
    content = "\n".join(f"line {i} of the page about mcp" for i in range(400))
    contexts = [f"mcp protocol: line {i}" for i in range(0, 400, 4)]
    out["seed_000"] = {
        "vars": {"q": "mcp protocol"},
        "steps": [
            {"id": "search", "tool": "emit", "args": {"value": {"$literal": {"results": results}}}},
            {
                "id": "fetch",
                "tool": "emit",
                "args": {"value": {"$literal": {"url": results[0]["url"], "content": content}}},
            },
            {"id": "extract", "tool": "emit", "args": {"value": {"$literal": {"contexts": contexts}}}},
        ],
        "return": {"$ref": "steps.extract.structured.contexts"},
    }
    return out


def output_bytes(steps: dict[str, Any]) -> int:
    """The JSON bytes of every leaf step's output."""
    total = 0
    for r in steps.values():
        if r["kind"] == "parallel":
            total += output_bytes(r["children"])
        else:
            total += len(orjson.dumps(r["output"]))
    return total


def sizes(answer: dict[str, Any]) -> tuple[int, int, int]:
    """(wire, text, message) bytes of an answer as its tool result: the structured content's JSON plus the text,
    the text, and the tool result as one JSON value (the text's escapes counted)."""
    wire = pipe_envelope(answer)
    text = len(wire["content"][0]["text"].encode())
    return len(orjson.dumps(wire["structuredContent"])) + text, text, len(orjson.dumps(wire))


async def _measure(specs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    rows = {}
    for name, spec in specs.items():
        full = await run_pipeline(spec, registry, limits=LIMITS, answer="full")
        assert full["ok"], (name, full["error"])
        base = output_bytes(full["steps"])
        row = {"output": float(base), "result": float(len(orjson.dumps(full["result"])))}
        for mode in ("full", "steps", "result"):
            wire, text, message = sizes(shape_answer(full, mode))
            row[f"{mode} wire"] = wire / base
            row[f"{mode} text"] = text / base
            row[f"{mode} message"] = message / base
        rows[name] = row
    return rows


async def _discord_recipe() -> dict[str, float]:
    """Seed 001: the multistep recipe through ``mcp_pipeline`` (discord's answer: results and variables in the
    structured content, a Markdown summary as the text)."""
    standins = Standins()
    steps = [
        {"id": "announce", "tool": "messages_send", "args": {"channel_id": "222233334444555566", "content": "hi"}},
        {"id": "event", "tool": "events_create", "args": {"guild_id": "1", "description": "{{announce.message_id}}"}},
        {"id": "grant", "tool": "members_add_role", "args": {"guild_id": "1", "user_id": "2", "role_id": "3"}},
    ]
    result = await pipeline_tool().call({"steps": steps}, ToolContext(tools=standins.registry))
    base = sum(len(orjson.dumps(s["result"])) for s in result.structured["steps"])
    text = len(result.content[0]["text"].encode())
    wire = len(orjson.dumps(result.structured)) + text
    message = len(orjson.dumps(result.wire()))
    return {"output": float(base), "wire": wire / base, "text": text / base, "message": message / base}


def _table(rows: dict[str, dict[str, float]], discord: dict[str, float]) -> str:
    head = (
        "workload",
        "output B",
        "result B",
        "full wire",
        "full text",
        "steps wire",
        "steps text",
        "result wire",
        "result text",
        "result message",
    )
    lines = [head]
    for name, row in rows.items():
        cells = [f"{row[f'{m} {w}']:.2f}x" for m in ("full", "steps", "result") for w in ("wire", "text")]
        lines.append((name, f"{row['output']:.0f}", f"{row['result']:.0f}", *cells, f"{row['result message']:.2f}x"))
    d = discord
    lines.append(
        (
            "seed_001 (mcp_pipeline)",
            f"{d['output']:.0f}",
            "",
            "",
            "",
            "",
            "",
            f"{d['wire']:.2f}x",
            f"{d['text']:.2f}x",
            f"{d['message']:.2f}x",
        )
    )
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines)


FRAME = 256
"""What an answer holds beside its result: ok, error, error_code, the summary counts, duration_ms."""


def test_default_answers_hold_at_most_2x_the_step_outputs_on_the_wire_and_1x_in_the_text(benchmark, workloads):
    specs = pipelines(workloads)
    rows = trio.run(_measure, specs)
    discord = trio.run(_discord_recipe)
    print("\n" + _table(rows, discord))
    for name, row in rows.items():
        carried = max(row["output"], row["result"])  # a return may build more than its outputs
        assert row["full wire"] > 6, name  # the records held each output four times, twice over
        assert row["result text"] * row["output"] <= carried + FRAME, (name, row)
        assert row["result wire"] * row["output"] <= 2 * (carried + FRAME), (name, row)
    # discord's own shape: each output twice in the structured content (`result` and `variables`), a record of
    # about 100 bytes per step, a Markdown summary as the text.
    assert discord["text"] <= 1.0
    assert discord["wire"] * discord["output"] <= 2 * discord["output"] + 3 * 150 + FRAME
    benchmark.extra_info.update({name: {k: round(v, 3) for k, v in row.items()} for name, row in rows.items()})
    full = trio.run(run_pipeline, specs["large_subtree"], registry)
    benchmark(shape_answer, full, "result")


@pytest.mark.parametrize("mode", ["full", "steps", "result"])
def test_bench_sending_the_large_subtree_answer(benchmark, workloads, mode):
    """What the answer costs to shape and encode as it is sent (orjson, as the lean path does)."""
    full = trio.run(run_pipeline, pipelines(workloads)["large_subtree"], registry)

    def send() -> int:
        return len(orjson.dumps(pipe_envelope(shape_answer(full, mode))))

    benchmark(send)
