"""A declared pipeline whose call never yields (its steps call synchronous Python tools) writes its steps' audit
records and its own in one ``write``: the same lines, in order. One whose steps may yield writes each record when
its call ends. A run of tool calls only checks for cancellation at its start, without a pass of the event loop,
as a synchronous tool does; a run with anything else in it still passes the event loop once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import trio
import yaml

from kit.audit import counted_writes
from kit.servers import http_server, make_config
from mcpipe.declared import load_declared
from mcpipe.gateway import AuditLog, Gateway
from mcpipe.server import open_app
from mcpipe.tools import ToolContext, ToolRegistry

PIPELINES = """
- name: loud
  description: Shout twice.
  input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  steps:
    - {kind: tool, id: a, tool: shout, args: {text: "${args.text}"}}
    - {kind: tool, id: b, tool: shout, args: {text: "${steps.a.output}!"}}
- name: twice
  description: Call loud from a step.
  input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  steps:
    - {kind: tool, id: x, tool: loud, args: {text: "${args.text}"}}
- name: loud_later
  description: Shout, then shout after a checkpoint.
  input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  steps:
    - {kind: tool, id: a, tool: shout, args: {text: "${args.text}"}}
    - {kind: tool, id: b, tool: shout_later, args: {text: "${steps.a.output}"}}
- name: broken
  description: A step that raises.
  input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  steps:
    - {kind: tool, id: a, tool: shout, args: {text: "${args.text}"}}
    - {kind: tool, id: b, tool: explode, args: {}}
- name: gated
  description: Sync steps behind a when.
  input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  steps:
    - {kind: tool, id: a, tool: shout, when: "args.text != ''", args: {text: "${args.text}"}}
"""


def _tools() -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    @reg.tool
    async def shout_later(text: str) -> str:
        """Upper-case a text after a checkpoint."""
        await trio.lowlevel.checkpoint()
        return text.upper()

    @reg.tool
    def explode() -> str:
        """Raise."""
        raise RuntimeError("boom")

    return reg


@pytest.fixture
def audited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Gateway, list[bytes], Path]:
    """A gateway over the pipelines above with an audit file, and every ``write`` the audit log makes."""
    writes = counted_writes(monkeypatch)
    reg = _tools()
    declared, problems = load_declared(yaml.safe_load(PIPELINES), tools=reg)
    assert problems == []
    path = tmp_path / "audit.jsonl"
    gateway = Gateway([reg, declared], audit=AuditLog(str(path)))
    declared.bind(gateway)
    return gateway, writes, path


async def _call(gateway: Gateway, name: str, **args: Any) -> Any:
    with trio.fail_after(10):
        return await gateway.call(name, args, ToolContext(request_id="7"))


def _records(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines()]


async def test_a_declared_pipeline_of_synchronous_tools_writes_its_records_in_one_write(audited):
    gateway, writes, path = audited
    result = await _call(gateway, "loud", text="hey")
    assert result.joined_text() == "HEY!"
    assert len(writes) == 1
    records = _records(writes[0])
    assert [(r["tool"], r["step"], r["ok"]) for r in records] == [
        ("shout", "a", True),
        ("shout", "b", True),
        ("loud", None, True),
    ]
    pid = records[0]["pipeline"]
    assert pid is not None and records[1]["pipeline"] == pid and records[2]["pipeline"] is None
    assert writes[0].endswith(b"\n") and writes[0].count(b"\n") == 3
    await _call(gateway, "shout", text="direct")  # a direct call still writes its record by itself
    assert len(writes) == 2 and _records(writes[1])[0]["tool"] == "shout"
    assert path.read_bytes() == b"".join(writes)


async def test_a_pipeline_calling_such_a_pipeline_writes_every_record_of_its_call_in_one_write(audited):
    gateway, writes, _ = audited
    result = await _call(gateway, "twice", text="hey")
    assert result.joined_text() == "HEY!"
    assert len(writes) == 1
    records = _records(writes[0])
    assert [(r["tool"], r["step"]) for r in records] == [("shout", "a"), ("shout", "b"), ("loud", "x"), ("twice", None)]


async def test_a_pipeline_whose_step_may_yield_writes_each_record_when_its_call_ends(audited):
    gateway, writes, _ = audited
    result = await _call(gateway, "loud_later", text="hey")
    assert result.joined_text() == "HEY"
    assert [[(r["tool"], r["step"]) for r in _records(w)] for w in writes] == [
        [("shout", "a")],
        [("shout_later", "b")],
        [("loud_later", None)],
    ]


async def test_the_records_of_a_failed_or_cancelled_pipeline_call_are_written_too(audited):
    gateway, writes, _ = audited
    result = await _call(gateway, "broken", text="hey")
    assert result.is_error
    assert len(writes) == 1
    assert [(r["tool"], r["error_code"]) for r in _records(writes[0])] == [
        ("shout", None),
        ("explode", "TOOL_FAILED"),
        ("broken", "TOOL_ERROR"),
    ]
    with trio.CancelScope() as scope:
        scope.cancel()
        await _call(gateway, "loud", text="hey")
    assert scope.cancelled_caught
    assert len(writes) == 2
    assert [(r["tool"], r["error_code"]) for r in _records(writes[1])] == [("loud", "CANCELLED")]


class _Steps(trio.abc.Instrument):
    """Counts the steps of one task: a step begins each time it resumes after passing the event loop."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_a_run_of_synchronous_tool_calls_does_not_pass_the_event_loop_but_a_run_with_a_when_does(audited):
    gateway, _, _ = audited
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        assert (await _call(gateway, "loud", text="a")).joined_text() == "A!"
        assert (await _call(gateway, "twice", text="b")).joined_text() == "B!"
        assert steps.count == 0  # as a synchronous tool: the call never let another task run
        assert (await _call(gateway, "gated", text="c")).joined_text() == "C"
        assert steps.count == 1  # a run that is not tool calls only passes the event loop once
    finally:
        trio.lowlevel.remove_instrument(steps)


served_tools = _tools()


async def test_over_http_a_declared_pipeline_of_synchronous_tools_writes_its_records_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Served by ``mcpipe serve``'s HTTP front (the lean path runs the call inline), the 2-step pipeline's three
    records reach the audit file in one write, as in memory; the yielding one's in three."""
    writes = counted_writes(monkeypatch)  # os.write is the process's: hypercorn's too, not counted
    audit = tmp_path / "audit.jsonl"
    config = make_config(
        python_tools=[f"{__name__}:served_tools"],
        pipelines=yaml.safe_load(PIPELINES),
        audit={"path": str(audit)},
        builtins=False,
    )
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    answers = []
    with trio.fail_after(30):
        async with open_app(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            for rid, name in enumerate(("loud", "loud_later")):
                params = {"name": name, "arguments": {"text": "hey"}, "_meta": meta}
                body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
                headers = {
                    "content-type": "application/json",
                    "accept": "application/json, text/event-stream",
                    "mcp-protocol-version": "2026-07-28",
                    "mcp-method": "tools/call",
                    "mcp-name": name,
                }
                r = await http.post(url, content=orjson.dumps(body), headers=headers)
                assert r.status_code == 200, r.text
                answers.append(orjson.loads(r.content)["result"]["content"])
    assert answers == [[{"type": "text", "text": "HEY!"}], [{"type": "text", "text": "HEY"}]]
    assert [[(x["tool"], x["step"]) for x in _records(w)] for w in writes] == [
        [("shout", "a"), ("shout", "b"), ("loud", None)],
        [("shout", "a")],
        [("shout_later", "b")],
        [("loud_later", None)],
    ]
    assert audit.read_bytes() == b"".join(writes)
