"""``mcp_pipe`` itself as an MCP task (the tasks extension, SEP-2663), driven by a real SDK client that declares
the extension, over streamable HTTP on 127.0.0.1: create (a flat ``CreateTaskResult``), ``tasks/get`` while it
works and once it has completed (the section-7 answer inlined), and ``tasks/cancel`` of a running one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pytest
import trio
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field, TypeAdapter

from kit.run_tools import gate, release, reset_gate
from kit.servers import http_server, make_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.server._tasks import TASKS


class CreatedTask(Result):
    """The flat ``CreateTaskResult`` of SEP-2663."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    ttl_ms: int = Field(alias="ttlMs")
    poll_interval_ms: int = Field(alias="pollIntervalMs")


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"  # SEP-2663: mirrored into Mcp-Name


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


ANY = TypeAdapter(dict[str, Any])


class TasksExtension(ClientExtension):
    """The client side of the tasks extension: declares it, and claims the ``task`` result of ``tools/call``."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        while True:
            task = await get_task(ctx.session, created.task_id)
            if task["status"] == "completed":
                return CallToolResult.model_validate(task["result"])
            await trio.sleep(created.poll_interval_ms / 1000)


async def get_task(session: Any, task_id: str) -> dict[str, Any]:
    return await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), ANY)


async def until(session: Any, task_id: str, status: str) -> dict[str, Any]:
    """``tasks/get`` until the task has ``status`` (every wait is bounded by the test's ``fail_after``)."""
    while True:
        task = await get_task(session, task_id)
        if task["status"] == status:
            return task
        await trio.sleep(0.02)


async def test_mcp_pipe_as_a_task_is_created_then_worked_on_then_completed_with_its_answer_inlined():
    reset_gate()
    spec = {
        "steps": [
            {"id": "a", "tool": "echo", "args": {"x": 1}},
            {"id": "b", "tool": "wait_for", "args": {"tag": "go"}},
        ],
        "answer": "full",
    }
    with trio.fail_after(30):
        async with (
            open_app(make_config(), extra_sources=[gate]) as app,
            http_server(app) as url,
            Client(url, extensions=[TasksExtension()]) as client,
        ):
            created = await client.session.call_tool(PIPE_TOOL, spec, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            working = await get_task(client.session, created.task_id)
            info = await app.runs.queue.get(created.task_id)
            release("go")
            done = await until(client.session, created.task_id, "completed")
    assert created.status == "working" and created.ttl_ms == 7 * 86400 * 1000
    assert working["status"] == "working" and "result" not in working
    assert info is not None and info.target == PIPE_TOOL  # the task is a run of the queue
    result = done["result"]
    assert result["isError"] is False
    answer = result["structuredContent"]
    assert answer["ok"] is True and answer["result"] == "released go"
    assert answer["steps"]["a"]["output"] == {"x": 1}


async def test_a_task_client_calling_mcp_pipe_gets_the_answer_through_its_extension():
    # The extension's claim resolves the task by polling tasks/get: the caller sees a plain CallToolResult.
    with trio.fail_after(30):
        async with (
            open_app(make_config()) as app,
            http_server(app) as url,
            Client(url, extensions=[TasksExtension()]) as client,
        ):
            result = await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "echo", "args": {"y": 2}}]})
    assert not result.is_error and result.structured_content["result"] == {"y": 2}


async def test_tasks_cancel_stops_a_running_mcp_pipe_task_and_it_ends_cancelled():
    reset_gate()
    spec = {"steps": [{"id": "w", "tool": "wait_for", "args": {"tag": "never"}}]}
    with trio.fail_after(30):
        async with (
            open_app(make_config(runs={"lease_s": 0.6}), extra_sources=[gate]) as app,
            http_server(app) as url,
            Client(url, extensions=[TasksExtension()]) as client,
        ):
            created = await client.session.call_tool(PIPE_TOOL, spec, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            # Cancel it once its step runs (then its worker, not the queue, has to stop it).
            events = await app.runs.queue.events(created.task_id)
            while not any(e.type == "step_started" for e in events):
                events += await app.runs.queue.events(created.task_id, after=events[-1].cursor, wait_s=5)
            cancel = CancelTask(params=TaskIdParams(task_id=created.task_id))
            ack = await client.session.send_request(cancel, ANY)
            done = await until(client.session, created.task_id, "cancelled")
            again = await client.session.send_request(cancel, ANY)
            with pytest.raises(MCPError) as unknown:
                await get_task(client.session, "no-such-task")
    # an empty ack (beside the envelope's resultType and _meta), also for a task that has ended
    for reply in (ack, again):
        assert set(reply) <= {"resultType", "_meta"} and reply.get("resultType", "complete") == "complete"
    assert done["status"] == "cancelled" and "result" not in done
    assert unknown.value.code == -32602


async def test_a_task_refused_by_a_full_run_queue_is_answered_at_once_with_a_located_error():
    spec = {"steps": [{"tool": "echo"}]}
    with trio.fail_after(30):
        # No worker: the first task stays queued, and the queue keeps one run.
        async with (
            open_app(make_config(runs={"max_runs": 1}), execute=False) as app,
            http_server(app) as url,
            Client(url, extensions=[TasksExtension()]) as client,
        ):
            first = await client.session.call_tool(PIPE_TOOL, spec, allow_claimed=True)
            refused = await client.session.call_tool(PIPE_TOOL, spec, allow_claimed=True)
    assert isinstance(first, CreatedTask)
    assert isinstance(refused, CallToolResult) and refused.is_error
    problem = refused.structured_content["problems"][0]
    assert problem["location"] == "task" and problem["code"] == "LIMIT_EXCEEDED"
    assert problem["message"].startswith("the run queue is full: 1 run is queued or running")
