"""A playbook needs the scopes of every tool its steps reach, on every path a call takes, refused before anything
runs and naming the missing scope: a NoETL playbook (``kind: tool`` steps) and a seed 004 one (``tool``
workbook actions) served as tools, called directly, from ``mcp_pipe``, as a background run and as an MCP
task; and a declared pipeline reaching the same tools, directly and as a task. Real SDK clients over
streamable HTTP on 127.0.0.1 with static tokens (the handlers hold the rule), and an OAuth token of the real
authorization server (the HTTP front's 403 step-up names every scope the playbook reaches)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
import trio
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Result
from pydantic import ConfigDict, Field

from kit.authserver import auth_server
from kit.clients import bearer_client
from kit.servers import http_server, running
from kit.tools import test_tools
from mcpipe.config import parse_config
from mcpipe.gateway import AuditLog
from mcpipe.server import open_app
from mcpipe.server._tasks import TASKS

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

NOETL = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: {name}
workload: {{}}
workflow:
  - step: start
    tool: {{kind: noop}}
    next:
      - step: greet
  - step: greet
    tool:
      kind: tool
      tool: echo
      args: {{said: hello}}
    next:
      - step: clock
  - step: clock
    tool:
      kind: tool
      tool: now
      args: {{}}
    next:
      - step: end
  - step: end
    tool: {{kind: noop}}
"""
"""A NoETL playbook whose steps call ``echo`` (files:read), then ``now`` (files:write)."""

SEED = """\
metadata:
  name: stamp004
  path: examples/stamp004
workbook:
  - name: greet
    type: tool
    spec:
      tool: echo
      args: {said: hello}
  - name: clock
    type: tool
    spec:
      tool: now
      args: {}
workflow:
  - step: start
    next: a
  - step: a
    type: workbook
    task: greet
    next: b
  - step: b
    type: workbook
    task: clock
    next: end
  - step: end
"""
"""The same in seed 004's form: ``tool`` workbook actions."""

SCOPES = [{"scope": "files:read", "tools": ["echo"]}, {"scope": "files:write", "tools": ["now"]}]
TOKENS = {"T_READ": "read-t0ken", "T_BOTH": "both-t0ken"}
MISSING = "needs the OAuth scope files:write, which the caller's token does not carry"


def _doc(tmp_path: Path, auth: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / "stamp.yaml").write_text(NOETL.format(name="stamp"))
    (tmp_path / "later.yaml").write_text(NOETL.format(name="stamp_later"))
    (tmp_path / "seed.yaml").write_text(SEED)
    return {
        "audit": {"enabled": False},
        "playbooks": ["stamp.yaml", "seed.yaml", {"files": "later.yaml", "background": True}],
        "auth": {"scopes": SCOPES, **auth},
        "pipelines": [
            {
                "name": "wrapper",
                "steps": [
                    {"id": "e", "kind": "tool", "tool": "echo", "args": {"x": 1}},
                    {"id": "n", "kind": "tool", "tool": "now", "args": {}},
                ],
            }
        ],
    }


class CreatedTask(Result):
    """SEP-2663's flat ``CreateTaskResult``."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class Tasks(ClientExtension):
    """The client side of the tasks extension: declared, and its ``task`` result taken as it is."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        raise AssertionError("the test reads the created task itself")


def _text(result: Any) -> str:
    return result.content[0].text if isinstance(result, CallToolResult) else repr(result)


async def test_a_playbook_reaching_a_scoped_tool_is_refused_on_every_path_before_anything_runs(tmp_path, monkeypatch):
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)  # the HTTP front reads static tokens from the environment
    tokens = [
        {"env": "T_READ", "principal": "reader", "scopes": ["files:read"]},
        {"env": "T_BOTH", "principal": "writer", "scopes": ["files:read", "files:write"]},
    ]
    doc = _doc(tmp_path, {"tokens": tokens})
    config = parse_config(json.dumps(doc), "json", base_dir=str(tmp_path), environ=TOKENS)
    audit = AuditLog(None, keep=True)
    pipe = {"steps": [{"id": "a", "tool": "echo", "args": {"x": 1}}, {"id": "b", "tool": "stamp", "args": {}}]}
    refused: dict[str, Any] = {}
    with trio.fail_after(60):
        async with running(config, audit=audit) as app, http_server(app) as url:
            async with bearer_client(url, "read-t0ken") as client:  # direct calls (no tasks declared)
                refused["noetl"] = await client.call_tool("stamp", {})
                refused["seed"] = await client.call_tool("stamp004", {})
                refused["background"] = await client.call_tool("stamp_later", {})
                refused["pipe"] = await client.call_tool("mcp_pipe", pipe)
                refused["pipe_background"] = await client.call_tool("mcp_pipe", {**pipe, "background": True})
                refused["declared"] = await client.call_tool("wrapper", {})
                listed = {t.name for t in (await client.list_tools()).tools}
            async with bearer_client(url, "read-t0ken", extensions=[Tasks()]) as client:  # calls made tasks
                refused["task"] = await client.session.call_tool("stamp", {}, allow_claimed=True)
                refused["seed_task"] = await client.session.call_tool("stamp004", {}, allow_claimed=True)
                refused["declared_task"] = await client.session.call_tool("wrapper", {}, allow_claimed=True)
                refused["pipe_task"] = await client.session.call_tool("mcp_pipe", pipe, allow_claimed=True)
            nothing_ran = [r for r in audit.records or () if r["ok"]]
            queued = await app.runs.queue.counts()
            async with bearer_client(url, "both-t0ken") as client:
                ran = await client.call_tool("stamp", {})
                ran_seed = await client.call_tool("stamp004", {})
            async with bearer_client(url, "both-t0ken", extensions=[Tasks()]) as client:
                task = await client.session.call_tool("stamp", {}, allow_claimed=True)
    for path, result in refused.items():
        assert isinstance(result, CallToolResult), (path, result)  # never a task, nor a queued run
        assert result.is_error, path
        assert MISSING in _text(result), (path, _text(result))
    assert "tool 'stamp' needs the OAuth scope files:write" in _text(refused["noetl"])
    assert "tool 'stamp004' needs the OAuth scope files:write" in _text(refused["seed"])
    assert "tool 'stamp_later' needs" in _text(refused["background"])
    assert not nothing_ran, nothing_ran  # no step of any of them ran: echo neither
    assert not any(queued.values()), queued  # no background run and no task was queued
    assert not {"stamp", "stamp004", "stamp_later", "wrapper", "now"} & listed and "echo" in listed
    assert not ran.is_error and ran.structured_content["status"] == "completed"
    assert not ran_seed.is_error
    assert isinstance(task, CreatedTask)
    assert [(r["tool"], r["ok"]) for r in audit.records or () if r["tool"] in ("echo", "now")][:2] == [
        ("echo", True),
        ("now", True),
    ]


async def test_over_oauth_a_playbook_call_gets_the_step_up_naming_every_scope_its_steps_reach(tmp_path):
    resource = "https://mcp.example.com/mcp"
    async with auth_server() as idp:
        oidc = {"oidc": [{"issuer": idp.url, "allow_private": True, "scope_claims": ["scope"]}]}
        doc = _doc(tmp_path, {**oidc, "resource": {"url": resource}})
        config = parse_config(json.dumps(doc), "json", base_dir=str(tmp_path), environ={})
        reader = idp.mint("alice", aud=resource, scope="files:read")
        answers = {}
        with trio.fail_after(60):
            async with (
                open_app(config, extra_sources=[test_tools]) as app,
                http_server(app) as url,
                httpx2.AsyncClient(headers={"authorization": f"Bearer {reader}"}) as http,
            ):
                for name in ("stamp", "stamp004", "stamp_later", "wrapper"):
                    meta = {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {},
                    }
                    body = {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {"name": name, "arguments": {}, "_meta": meta},
                    }
                    headers = {
                        "mcp-protocol-version": "2026-07-28",
                        "accept": "application/json, text/event-stream",
                        "mcp-method": "tools/call",
                        "mcp-name": name,
                    }
                    answers[name] = await http.post(url, json=body, headers=headers)
    for name, r in answers.items():
        assert r.status_code == 403, (name, r.status_code, r.text)
        challenge = r.headers["www-authenticate"]
        assert 'error="insufficient_scope"' in challenge, challenge
        scope = challenge.split('scope="', 1)[1].split('"', 1)[0]
        assert sorted(scope.split()) == ["files:read", "files:write"], challenge  # what the step-up asks for
