"""``ask_before_task``: a task call asks its client synchronously (input-required rounds) and becomes a task
at its first step that reaches out, the task resuming after the steps of those rounds (the MRTR -> tasks
composition of SEP-2663; the conformance suite's ``tasks-mrtr-composition`` runs in ``make conformance``).

The calls go through the server's own call path (``Interactions.call`` over ``ToolHandlers.call``) with a
real run queue and worker, in memory."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.servers import make_config
from mcpipe.config import ConfigError
from mcpipe.server import open_app
from mcpipe.server._tasks import TASKS
from mcpipe.tools import ToolContext

ASK = {"type": "object", "properties": {"name": {"type": "string"}}}

PIPELINES: list[dict[str, Any]] = [
    {
        "name": "greet_later",
        "task_support": "required",
        "ask_before_task": True,
        "steps": [
            {"kind": "value", "id": "hello", "value": "hi"},
            {"kind": "elicitation", "id": "user_name", "message": "Your name?", "requested_schema": ASK},
            {"kind": "tool", "id": "go", "tool": "mark", "args": {"tag": "${steps.user_name.output.content.name}"}},
            {"kind": "elicitation", "id": "again", "message": "Once more?", "requested_schema": ASK},
        ],
        "output": {"done": "${steps.go.output}", "again": "${steps.again.output.content.name}"},
    },
    {
        "name": "work_first",
        "ask_before_task": True,
        "steps": [{"kind": "tool", "id": "go", "tool": "mark", "args": {"tag": "first"}}],
    },
    {
        "name": "only_asks",
        "ask_before_task": True,
        "steps": [{"kind": "elicitation", "id": "q", "message": "Name?", "requested_schema": ASK}],
        "output": {"name": "${steps.q.output.content.name}"},
    },
]

CAPS = {"elicitation": {}, "extensions": {TASKS: {}}}


@pytest.fixture
def marks(tmp_path, monkeypatch):
    """The tags the ``mark`` tool wrote, one per call (the tool counts its own runs)."""
    path = tmp_path / "marks"
    monkeypatch.setenv("MCPIPE_TEST_MARKS", str(path))
    return lambda: [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def accept(name: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"name": name}}


async def call(app: Any, name: str, **kw: Any) -> dict[str, Any]:
    handlers = app.handlers
    tasks = handlers.tasks
    ctx = ToolContext(request_id="r1", principal=None, tools=app.gateway)

    async def escalate(state: dict[str, Any]) -> dict[str, Any]:
        return await tasks.create(name, {}, ctx, CAPS, recorded=state["memo"], answers=state["answers"])

    return await handlers.interactions.call(
        handlers.call, name, {}, ctx, modern=True, capabilities=CAPS, escalate=escalate, **kw
    )


async def settled(app: Any, task_id: str) -> Any:
    """The run once it waits for input or has ended."""
    while True:
        info = await app.runs.queue.get(task_id)
        if info.status in ("input_required", "completed", "failed", "cancelled"):
            return info
        await trio.sleep(0.02)


async def test_a_call_asks_synchronously_then_becomes_a_task_on_the_round_that_brings_the_answer(marks):
    config = make_config(pipelines=PIPELINES, python_tools=["kit.run_tools:registry"])
    with trio.fail_after(20):
        async with open_app(config) as app:
            first = await call(app, "greet_later")
            second = await call(
                app, "greet_later", state=first["requestState"], responses={"user_name": accept("Alice")}
            )
            asked = await settled(app, second["taskId"])
            await app.runs.queue.answer(asked.id, {"again": accept("Bob")})
            done = await settled(app, second["taskId"])
    assert first["resultType"] == "input_required" and "taskId" not in first
    assert list(first["inputRequests"]) == ["user_name"]
    assert second["resultType"] == "task" and "requestState" not in second and "inputRequests" not in second
    # the question after the work is asked inside the task; the answered one is not asked again
    assert asked.status == "input_required" and list(asked.meta["pending"]) == ["again"]
    assert done.status == "completed"
    assert done.answer["structuredContent"] == {"done": "Alice", "again": "Bob"}
    assert marks() == ["Alice"]  # the work ran once, in the task, with the answer of the synchronous round


async def test_a_pipeline_that_reaches_out_first_is_a_task_from_its_first_round_and_one_that_only_asks_never(marks):
    config = make_config(pipelines=PIPELINES, python_tools=["kit.run_tools:registry"])
    with trio.fail_after(20):
        async with open_app(config) as app:
            task = await call(app, "work_first")
            done = await settled(app, task["taskId"])
            first = await call(app, "only_asks")
            sync = await call(app, "only_asks", state=first["requestState"], responses={"q": accept("Cy")})
    assert task["resultType"] == "task" and done.status == "completed" and marks() == ["first"]
    assert first["resultType"] == "input_required"
    assert "taskId" not in sync and sync["structuredContent"] == {"name": "Cy"}


def test_ask_before_task_on_a_forbidden_task_pipeline_is_one_located_config_error():
    pipelines = [
        {"name": "p", "task_support": "forbidden", "ask_before_task": True, "steps": [{"kind": "log", "data": "x"}]}
    ]
    with pytest.raises(ConfigError) as err:
        make_config(pipelines=pipelines)
    assert "pipelines.p.ask_before_task" in str(err.value) and "forbidden" in str(err.value)
