"""A ``tool`` step without ``when``, ``input_transform`` or a deadline runs on the scheduler's direct path
(``mcpipe.kinds.tool.tool_step``, its result made by ``mcpipe.results.tool_result``): its record, the
answer, the audit records and the counts are what ``Leaf.execute`` made of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.pipelines import load
from kit.servers import http_server, make_config
from mcpipe.plan import Leaf
from mcpipe.runtime import run_compiled
from mcpipe.server import open_app
from mcpipe.tools import ToolContext, ToolRegistry

CASES = {
    "structured": ("add", '{a: 1, b: "${args.b}"}', "succeeded"),
    "text": ("shout", '{text: "${args.t}"}', "succeeded"),
    "no_args_a_tool_error": ("refuse", "{}", "failed"),
    "unresolved": ("shout", '{text: "${args.missing.deeper}"}', "failed"),
    "arguments_refused": ("add", "{a: 1}", "failed"),
    "a_pipeline_as_a_tool": ("q", "{b: 2}", "succeeded"),
}

Q = """
  - name: q
    description: A pipeline called as a tool.
    input_schema: {type: object}
    steps:
      - {kind: tool, id: inner, tool: add, args: {a: 40, b: "${args.b}"}}
"""


def _pipes(case: str) -> str:
    tool, args, _ = CASES[case]
    return f"""
pipelines:
  - name: p
    description: One tool step.
    input_schema: {{type: object}}
    steps:
      - {{kind: tool, id: first, tool: shout, args: {{text: "${{args.t}}"}}}}
      - {{kind: tool, id: {case}, tool: {tool}, args: {args}}}
{Q}"""


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k != "duration_ms"}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


async def _through_execute(p: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The step records ``Leaf.execute`` makes of the pipeline's steps, run one after the other in the same
    environment (the path every step took before the direct one)."""
    plan = p.declared.get(name).compiled.plan
    env: dict[str, Any] = {"vars": {}, "steps": {}, "last": None, "args": args, "context": ToolContext().facts()}
    for step in plan.steps:
        ctx = ToolContext().for_step("pid", step.id, p.gateway)
        out = await step.execute(env, ctx)
        r = out.result(step.id, step.kind, 0.0)
        env["steps"][step.id] = env["last"] = r
    return env["steps"]


@pytest.mark.parametrize("case", list(CASES))
async def test_a_tool_steps_record_on_the_direct_path_is_the_one_execute_makes_byte_for_byte(case):
    p = load(_pipes(case))
    args = {"b": 2, "t": "hi"}
    answer = await run_compiled(p.declared.get("p").compiled, p.gateway, args=args)
    expected = await _through_execute(load(_pipes(case)), "p", args)
    got = answer["steps"]
    assert orjson.dumps(_without_times(got)) == orjson.dumps(_without_times(expected))
    assert all(isinstance(r["duration_ms"], float) and r["skipped"] is False for r in got.values())
    outcome = CASES[case][2]
    summary = {"total": 2, "succeeded": 1, "failed": 0, "skipped": 0, "cancelled": 0}
    summary[outcome] += 1
    assert answer["summary"] == summary
    assert answer["ok"] is (outcome == "succeeded")


async def test_a_plain_tool_step_does_not_go_through_execute_but_one_with_a_when_does(monkeypatch):
    executed: list[str] = []
    original = Leaf.execute

    async def spy(self: Leaf[Any, Any], env: Any, ctx: ToolContext, **kw: Any) -> Any:
        executed.append(self.id)
        return await original(self, env, ctx, **kw)

    monkeypatch.setattr(Leaf, "execute", spy)
    p = load(
        """
pipelines:
  - name: p
    description: A direct step, then a gated one.
    input_schema: {type: object}
    steps:
      - {kind: tool, id: direct, tool: add, args: {a: 1, b: 2}}
      - {kind: tool, id: gated, tool: add, when: "true", args: {a: "${steps.direct.output.sum}", b: 1}}
"""
    )
    answer = await run_compiled(p.declared.get("p").compiled, p.gateway)
    assert answer["ok"], answer["error"]
    assert answer["result"] == {"output": {"sum": 4.0}}
    assert executed == ["gated"]


async def test_the_audit_records_of_direct_tool_steps_name_their_pipeline_and_step():
    p = load(_pipes("structured"))
    result = await p.call("q", {"b": 2})
    assert not result.is_error
    records = p.audit.records
    assert records is not None
    assert [(r["tool"], r["ok"], r["error_code"], r["step"]) for r in records] == [
        ("add", True, None, "inner"),
        ("q", True, None, None),
    ]
    assert isinstance(records[0]["pipeline"], str) and len(records[0]["pipeline"]) == 16


ping_tools = ToolRegistry()


@ping_tools.tool
def ping(text: str) -> str:
    """Answer the text."""
    return text


async def _served_twice(gated: bool, tmp_path: Path) -> tuple[bytes, list[dict[str, Any]]]:
    when = {"when": "true"} if gated else {}
    steps = [
        {"kind": "tool", "id": "s1", "tool": "ping", "args": {"text": "${args.text}"}, **when},
        {"kind": "tool", "id": "s2", "tool": "ping", "args": {"text": "${steps.s1.output}"}, **when},
    ]
    pipeline = {"name": "twice", "description": "ping twice", "input_schema": {"type": "object"}, "steps": steps}
    audit = tmp_path / f"audit-{gated}.jsonl"
    config = make_config(
        python_tools=[f"{__name__}:ping_tools"], pipelines=[pipeline], audit={"path": str(audit)}, builtins=False
    )
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    params = {"name": "twice", "arguments": {"text": "hi"}, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "twice",
    }
    with trio.fail_after(30):
        async with (
            open_app(config) as app,
            http_server(app) as url,
            httpx2.AsyncClient() as http,
        ):
            r = await http.post(url, content=orjson.dumps(body), headers=headers)
    assert r.status_code == 200, r.text
    return r.content, [orjson.loads(line) for line in audit.read_bytes().splitlines()]


async def test_over_http_a_pipeline_of_tool_steps_answers_the_bytes_execute_answers(tmp_path):
    """The same pipeline with every step gated by a ``when`` that is true (so run by ``execute``) answers
    the same bytes over streamable HTTP, and its audit records say the same but for their times."""
    direct, direct_audit = await _served_twice(False, tmp_path)
    executed, executed_audit = await _served_twice(True, tmp_path)
    assert orjson.loads(direct)["result"]["content"] == [{"type": "text", "text": "hi"}]
    assert direct == executed
    fields = ("principal", "tool", "ok", "error_code", "cost", "step", "request_id")
    assert [tuple(x[f] for f in fields) for x in direct_audit] == [tuple(x[f] for f in fields) for x in executed_audit]
    assert [(x["tool"], x["step"]) for x in direct_audit] == [("ping", "s1"), ("ping", "s2"), ("twice", None)]
