"""Declared pipelines as tools: arguments, answers (output, content blocks), failures, composition, limits.

Every call goes through a real :class:`mcpipe.gateway.Gateway` holding the Python test tools and the
declared pipelines, the call path the server uses.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import trio

from kit.pipelines import load, text_of
from mcpipe.compile import Limits
from mcpipe.runtime import run_compiled
from mcpipe.tools import ToolContext

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
WAV = base64.b64encode(b"RIFF....WAVEfmt ").decode()

CHARGE = """
pipelines:
  - name: charge
    description: Charge an order.
    input_schema:
      type: object
      properties:
        order_id: {type: string, pattern: "^A-[0-9]+$"}
        amount: {type: number, minimum: 0}
        currency: {type: string, default: EUR}
      required: [order_id, amount]
      additionalProperties: false
    steps:
      - {kind: value, id: request, value: {order: "${args.order_id}", cents: "${args.amount}"}}
      - kind: transform
        id: receipt
        expression: '{"order": args.order_id, "charged": args.amount, "currency": args.currency}'
"""


# --- arguments --------------------------------------------------------------------------------------


async def test_arguments_are_validated_before_any_step_runs_with_every_error_located():
    p = load(CHARGE)
    result = await p.call("charge", {"order_id": "B-1", "amount": -1, "extra": 1})
    assert result.is_error
    assert text_of(result) == (
        "invalid arguments for tool 'charge': "
        "args: Additional properties are not allowed ('extra' was unexpected); "
        "args.amount: -1 is less than the minimum of 0; "
        "args.order_id: 'B-1' does not match '^A-[0-9]+$'"
    )
    # Nothing ran: the gateway saw only the pipeline's own call.
    assert [r["tool"] for r in p.audit.records] == ["charge"]


async def test_a_missing_required_argument_is_located_at_args():
    result = await load(CHARGE).call("charge", {"order_id": "A-1"})
    assert result.is_error and text_of(result).endswith("args: 'amount' is a required property")


async def test_top_level_defaults_fill_absent_arguments():
    result = await load(CHARGE).call("charge", {"order_id": "A-1", "amount": 5})
    assert not result.is_error, text_of(result)
    assert result.structured == {"order": "A-1", "charged": 5, "currency": "EUR"}


async def test_nested_errors_name_the_array_index():
    p = load(
        """
pipelines:
  - name: lines
    input_schema:
      type: object
      properties:
        lines: {type: array, items: {type: object, properties: {qty: {type: integer, minimum: 1}}}}
    steps: [{kind: value, value: ok}]
"""
    )
    result = await p.call("lines", {"lines": [{"qty": 1}, {"qty": 0}]})
    assert text_of(result) == "invalid arguments for tool 'lines': args.lines[1].qty: 0 is less than the minimum of 1"


# --- answers ----------------------------------------------------------------------------------------


async def test_an_object_output_is_structured_content_plus_its_json_as_text():
    result = await load(CHARGE).call("charge", {"order_id": "A-1", "amount": 5, "currency": "USD"})
    assert result.structured == {"order": "A-1", "charged": 5, "currency": "USD"}
    [block] = result.content
    assert block["type"] == "text" and json.loads(block["text"]) == result.structured


@pytest.mark.parametrize(
    ("output", "text", "structured"),
    [
        ('"Charged ${args.n} units"', "Charged 3 units", None),
        ("{total: '${args.n}', note: ok}", '{"total":3,"note":"ok"}', {"total": 3, "note": "ok"}),
        ("'${args.n}'", "3", None),
        ("['${args.n}', 4]", "[3,4]", None),
        ("{$ref: steps.first.output}", '{"first":true}', {"first": True}),
        ("{$ref: last.output}", "second", None),
    ],
)
async def test_the_output_template_shapes_the_answer(output, text, structured):
    p = load(
        f"""
pipelines:
  - name: t
    steps:
      - {{kind: value, id: first, value: {{first: true}}}}
      - {{kind: value, id: second, value: second}}
    output: {output}
"""
    )
    result = await p.call("t", {"n": 3})
    assert not result.is_error, text_of(result)
    assert result.content == [{"type": "text", "text": text}]
    assert result.structured == structured


CONTENT = f"""
pipelines:
  - name: media
    steps:
      - {{kind: value, id: doc, value: {{title: Report, body: "All good, ${{args.who}}."}}}}
    output: {{title: "${{steps.doc.output.title}}"}}
    content:
      - {{type: text, text: "${{steps.doc.output.body}}"}}
      - {{type: image, data: "{PNG}", mimeType: image/png}}
      - {{type: audio, data: "{WAV}", mimeType: audio/wav}}
      - type: resource
        resource: {{uri: "report://${{args.who}}", mimeType: text/markdown, text: "# ${{steps.doc.output.title}}"}}
      - type: resource
        resource: {{uri: "blob://1", mimeType: application/octet-stream, blob: "{PNG}"}}
      - {{type: resource_link, uri: "file:///tmp/report.md", name: report.md, mimeType: text/markdown}}
"""


async def test_the_content_template_gives_every_kind_of_block_directly():
    result = await load(CONTENT).call("media", {"who": "ada"})
    assert not result.is_error, text_of(result)
    assert result.content == [
        {"type": "text", "text": "All good, ada."},
        {"type": "image", "data": PNG, "mimeType": "image/png"},
        {"type": "audio", "data": WAV, "mimeType": "audio/wav"},
        {"type": "resource", "resource": {"uri": "report://ada", "mimeType": "text/markdown", "text": "# Report"}},
        {"type": "resource", "resource": {"uri": "blob://1", "mimeType": "application/octet-stream", "blob": PNG}},
        {"type": "resource_link", "uri": "file:///tmp/report.md", "name": "report.md", "mimeType": "text/markdown"},
    ]
    assert result.structured == {"title": "Report"}  # an explicit object output is the structured part


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{$ref: args.blocks}", None),
        ('"${args.blocks}"', None),
    ],
)
async def test_content_blocks_built_at_run_time_are_checked(content, problem):
    p = load(
        f"""
pipelines:
  - name: c
    steps: [{{kind: value, value: 1}}]
    content: {content}
"""
    )
    good = [{"type": "text", "text": "hi"}]
    assert (await p.call("c", {"blocks": good})).content == good
    single = {"type": "text", "text": "one"}
    assert (await p.call("c", {"blocks": single})).content == [single]
    cases = [
        ([{"type": "image", "data": "not base64!", "mimeType": "image/png"}], "[0].data: not valid base64"),
        ([{"type": "text"}], "[0]: a `text` block needs `text`"),
        ([good[0], {"type": "video", "data": ""}], '[1].type: unknown content type "video"'),
        (
            [{"type": "resource", "resource": {"uri": "x://", "text": "a", "blob": PNG}}],
            "exactly one of `text` or `blob`",
        ),
        ([{"type": "text", "text": "a", "colour": "red"}], "[0].colour: unknown field for a `text` block"),
        ("just text", "expected a list of content blocks, got string"),
    ]
    for blocks, expected in cases:
        result = await p.call("c", {"blocks": blocks})
        assert result.is_error, blocks
        assert text_of(result).startswith("INVALID_OUTPUT: pipelines.c.content: "), text_of(result)
        assert expected in text_of(result)


async def test_an_output_schema_is_listed_and_checked():
    p = load(
        """
pipelines:
  - name: typed
    output_schema:
      type: object
      properties: {n: {type: integer}}
      required: [n]
    steps: [{kind: value, value: {n: "${args.n}"}}]
"""
    )
    tool = p.declared.get("typed")
    assert tool is not None and tool.output_schema["required"] == ["n"]
    assert (await p.call("typed", {"n": 2})).structured == {"n": 2}
    bad = await p.call("typed", {"n": "two"})
    assert bad.is_error
    assert (
        text_of(bad)
        == "INVALID_OUTPUT: the output does not match the output_schema: output.n: 'two' is not of type 'integer'"
    )


# --- failures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (
            "{kind: mock, id: backend, error: true, error_message: backend down}",
            "TOOL_ERROR: step 'backend' failed: backend down",
        ),
        (
            "{kind: cel_gate, id: big_enough, expression: 'args.n > 10', error_message: too small}",
            "GATE_REJECTED: step 'big_enough' failed: too small",
        ),
        ("{kind: tool, id: pay, tool: refuse}", "TOOL_ERROR: step 'pay' failed: card declined"),
        (
            "{kind: value, id: pick, value: '${args.missing}'}",
            "INTERPOLATION_FAILED: step 'pick' failed: step 'pick': pipelines.f.steps[0].value: cannot resolve "
            '`args.missing`: `missing` not found in object with 1 key: "n"',
        ),
        (
            "{kind: transform, id: divide, expression: 'args.n / 0'}",
            "TOOL_FAILED: step 'divide' failed:",
        ),
    ],
)
async def test_a_failed_step_answers_is_error_naming_the_step_and_the_reason(step, expected):
    p = load(
        f"""
pipelines:
  - name: f
    steps:
      - {step}
      - {{kind: tool, id: after, tool: shout, args: {{text: never}}}}
"""
    )
    result = await p.call("f", {"n": 3})
    assert result.is_error
    assert text_of(result).startswith(expected), text_of(result)
    assert p.seen.calls == []  # the pipeline stopped at the failure


async def test_an_output_template_that_cannot_resolve_is_an_interpolation_error():
    p = load(
        """
pipelines:
  - name: o
    steps: [{kind: value, id: v, value: {a: 1}}]
    output: {b: "${steps.v.output.b}"}
"""
    )
    result = await p.call("o")
    assert result.is_error
    assert text_of(result).startswith("INTERPOLATION_FAILED: pipelines.o.output.b: cannot resolve `steps.v.output.b`")


async def test_a_step_timeout_and_the_pipeline_timeout_fail_the_call(autojump_clock):
    p = load(
        """
pipelines:
  - name: slow_step
    steps: [{kind: mock, id: wait, delay_ms: 5000, timeout_ms: 100, response: 1}]
  - name: slow_pipeline
    timeout_ms: 250
    steps:
      - {kind: mock, id: a, delay_ms: 200, response: 1}
      - {kind: mock, id: b, delay_ms: 200, response: 2}
"""
    )
    assert text_of(await p.call("slow_step")) == "TIMEOUT: step 'wait' failed: timed out after 100 ms"
    assert text_of(await p.call("slow_pipeline")) == "TIMEOUT: the pipeline timed out after 250 ms"


async def test_the_servers_deadline_caps_the_pipelines_own(autojump_clock):
    p = load(
        "pipelines: [{name: p, timeout_ms: 60000, steps: [{kind: mock, delay_ms: 5000, response: 1}]}]",
        limits=Limits(timeout_ms=1000),
    )
    assert text_of(await p.call("p")) == "TIMEOUT: the pipeline timed out after 1000 ms"


async def test_a_tool_the_caller_may_not_call_is_forbidden_before_any_step_runs():
    p = load(
        """
pipelines:
  - name: mixed
    steps:
      - {kind: tool, id: first, tool: add, args: {a: 1, b: 2}}
      - {kind: tool, id: second, tool: shout, args: {text: hi}}
""",
        grants={"bob": ["mixed", "add"]},
    )
    result = await p.call("mixed", {}, ToolContext(principal="bob"))
    assert result.is_error
    assert text_of(result) == "FORBIDDEN: pipelines.mixed.steps[1].tool: tool 'shout' is not allowed for this caller"
    assert p.seen.calls == []


# --- composition ------------------------------------------------------------------------------------


COMPOSED = """
pipelines:
  - name: total
    input_schema:
      type: object
      properties: {a: {type: number}, b: {type: number}}
      required: [a, b]
    steps:
      - {kind: tool, id: sum, tool: add, args: {a: "${args.a}", b: "${args.b}"}}
    output: {total: "${steps.sum.output.sum}"}

  - name: report
    steps:
      - kind: parallel
        id: both
        steps:
          - {kind: tool, id: first, tool: total, args: {a: "${args.x}", b: 1}}
          - {kind: tool, id: loud, tool: shout, args: {text: "${args.label}"}}
      - kind: pipe
        id: grand
        vars: {t: "${steps.both.output.first.total}"}
        steps:
          - {kind: tool, id: again, tool: total, args: {a: "${vars.t}", b: 100}}
        return: "${steps.again.output.total}"
    output:
      label: "${steps.both.output.loud}"
      first: "${steps.both.output.first.total}"
      grand: "${steps.grand.output}"
"""


async def test_a_declared_pipeline_calls_python_tools_and_other_declared_pipelines_through_the_gateway():
    p = load(COMPOSED)
    result = await p.call("report", {"x": 2, "label": "sum"})
    assert not result.is_error, text_of(result)
    assert result.structured == {"label": "SUM", "first": 3, "grand": 103}
    # Every call went through the gateway: the pipeline, the nested pipelines and their tools.
    tools = sorted(r["tool"] for r in p.audit.records)
    assert tools == ["add", "add", "report", "shout", "total", "total"]
    # Steps' calls carry their pipeline run and step path.
    steps = {r["step"] for r in p.audit.records if r["tool"] in ("total", "shout")}
    assert steps == {"both.first", "both.loud", "grand.again"}


async def test_when_skips_steps_and_containers_and_the_summary_counts_them_as_skipped():
    p = load(
        """
pipelines:
  - name: s
    steps:
      - {kind: value, id: a, value: 1}
      - {kind: value, id: b, when: "args.big", value: 2}
      - kind: parallel
        id: group
        when: "!args.big"
        steps:
          - {kind: value, id: c, value: 3}
          - {kind: value, id: d, when: "false", value: 4}
      - kind: pipe
        id: nested
        when: "args.big"
        steps: [{kind: value, id: e, value: 5}]
      - kind: value
        id: f
        value: {b: "${steps.b.output}", group: "${steps.group.output}", nested: "${steps.nested.output}"}
"""
    )
    tool = p.declared.get("s")
    answer = await run_compiled(tool.compiled, p.gateway, args={"big": False})
    assert answer["ok"], answer["error"]
    assert answer["result"]["output"] == {"b": None, "group": {"c": 3, "d": None}, "nested": None}
    assert answer["summary"] == {"total": 6, "succeeded": 3, "failed": 0, "skipped": 3, "cancelled": 0}
    steps = answer["steps"]
    assert steps["b"]["skipped"] and steps["b"]["ok"] and steps["b"]["error"] == "" and steps["b"]["output"] is None
    assert steps["nested"]["skipped"] and steps["nested"]["kind"] == "pipe"
    assert steps["group"]["skipped"] is False and steps["group"]["children"]["d"]["skipped"]


async def test_input_transform_reshapes_args_for_a_step_and_for_a_nested_pipe():
    p = load(
        """
pipelines:
  - name: it
    steps:
      - kind: pipe
        id: inner
        input_transform: '{"name": args.first + " " + args.last}'
        steps:
          - {kind: value, id: greet, value: "hello ${args.name}"}
      - kind: tool
        id: loud
        tool: shout
        input_transform: '{"t": steps.inner.output}'
        args: {text: "${args.t}"}
"""
    )
    result = await p.call("it", {"first": "Ada", "last": "Lovelace"})
    assert text_of(result) == "HELLO ADA LOVELACE"


async def test_log_and_progress_steps_reach_the_caller():
    p = load(
        """
pipelines:
  - name: chatty
    steps:
      - {kind: log, id: hello, level: warning, data: "starting ${args.job}"}
      - {kind: progress, id: half, progress: 1, total: 2, message: halfway}
      - {kind: value, id: done, value: done}
"""
    )
    logs, progress = [], []

    async def log(level, data):
        logs.append((level, data))

    async def report(p_, total, message):
        progress.append((p_, total, message))

    ctx = ToolContext(log=log, progress=report, progress_token="tok")
    assert text_of(await p.call("chatty", {"job": "j1"}, ctx)) == "done"
    assert logs == [("warning", "starting j1")] and progress == [(1, 2, "halfway")]
    # Without a progress token, the progress step is skipped.
    progress.clear()
    assert text_of(await p.call("chatty", {"job": "j2"}, ToolContext(log=log, progress=report))) == "done"
    assert progress == []


async def test_cancelling_the_call_cancels_a_running_tool_step():
    p = load("pipelines: [{name: waits, steps: [{kind: tool, id: h, tool: hang, args: {label: x}}]}]")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.call, "waits")
            await p.seen.started.wait()
            nursery.cancel_scope.cancel()
    assert p.seen.cancelled == ["x"]
    codes = {r["tool"]: r["error_code"] for r in p.audit.records}
    assert codes == {"hang": "CANCELLED", "waits": "CANCELLED"}


async def test_an_unbound_pipeline_answers_an_error_instead_of_raising():
    from mcpipe.declared import load_declared

    declared, problems = load_declared([{"name": "lone", "steps": [{"kind": "value", "value": 1}]}])
    assert problems == []
    result = await declared.get("lone").call({}, ToolContext())
    assert result.is_error and "not bound" in text_of(result)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "declared"


async def test_the_offline_example_configs_run_as_documented():
    content = load((EXAMPLES / "content_blocks.yaml").read_text())
    report = await content.call("weekly_report", {"week": "2026-W47"})
    assert not report.is_error, text_of(report)
    assert [b["type"] for b in report.content] == ["text", "image", "audio", "resource", "resource_link"]
    assert report.content[0]["text"] == "Sales of 2026-W47: 16" and report.structured == {
        "week": "2026-W47",
        "total": 16,
    }
    total = await content.call("sales_total", {"days": [3, 5, 8]})
    assert text_of(total) == "Total 16.0, mean 5.333333333333333 per day"

    composition = load((EXAMPLES / "composition.yaml").read_text())
    basket = await composition.call("basket", {"first": "a", "second": "b"})
    assert not basket.is_error, text_of(basket)
    assert basket.structured["total"] == 25.0 and basket.structured["quotes"]["a"]["sku"] == "a"

    order = load((EXAMPLES / "order_summary.yaml").read_text())
    summary = await order.call("order_summary", {"customer": "ada", "lines": [{"sku": "a", "qty": 2, "price": 3.5}]})
    assert summary.structured["summary"] == "2 units, 7 EUR"
