"""Playbooks on the run queue: a served playbook with ``background`` is queued, executed by the worker, and
its run's events (``pipe_events``) carry the playbook's own events between its steps'; a side effect inside
a step (a turn's tool call) is saved with the run at once and not done again when the run is taken over."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client

from kit.llm import LOOKUPS, fake_api, fake_openai, lookup_playbook, text, tool_call
from mcpipe.config import ConfigError, load_config, parse_config
from mcpipe.models import once
from mcpipe.runs import RunRecord
from mcpipe.server import open_app
from mcpipe.store import open_queue
from mcpipe.tools import Request, ToolContext

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

RESEARCH = Path(__file__).parent / "playbooks" / "research.yaml"
WAIT_S = 60
"""A guard against a hang, not a budget: run alone, a test here may import ``jsonschema`` on its first schema
check, which in the test environment (``rfc3987_syntax``'s grammar, from check-jsonschema) costs 2-3 s of CPU
idle and 15-20 s on a 2-core machine running three other suites."""


def _served(tmp_path: Path, model_url: str, api_url: str, **entry: Any) -> Path:
    raw = yaml.safe_load(RESEARCH.read_text())
    raw["workload"]["api"] = api_url
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "research.yaml").write_text(yaml.safe_dump(raw))
    config = tmp_path / "mcpipe.json"
    doc = {
        "audit": {"enabled": False},
        "models": {"gpt-4o": {"base_url": model_url}},
        "outbound": {"http": {"allowed_hosts": ["127.0.0.1"]}},
        "playbooks": [{"files": "pb/*.yaml", **entry}],
    }
    config.write_text(json.dumps(doc))
    return config


async def test_a_background_playbook_is_queued_and_its_run_events_hold_its_steps_and_tool_calls_in_order(
    tmp_path: Path,
) -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(tool_call("search_docs", {"query": "refund window"}), text("Refunds take 14 days."))
            config = load_config(_served(tmp_path, fake.url, api.url, background=True))
            async with open_app(config) as app, Client(app.server) as client:
                queued = await client.call_tool("research", {"query": "refunds"})
                run_id = queued.structured_content["run_id"]
                done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 15000})
                page = await client.call_tool("pipe_events", {"run_id": run_id})
    assert not queued.is_error and queued.structured_content["status"] == "queued"
    assert not done.is_error, done.content
    assert done.content[0].text == "Refunds take 14 days."
    events = page.structured_content["events"]
    assert [(e["type"], e.get("path")) for e in events] == [
        ("enqueued", None),
        ("leased", None),
        ("step_started", "resource_kb_articles"),
        ("step_finished", "resource_kb_articles"),
        ("step_started", "turn_t1"),
        ("tool_call_started", "turn_t1"),
        ("tool_call_finished", "turn_t1"),
        ("turn_saved", "turn_t1"),
        ("step_finished", "turn_t1"),
        ("completed", None),
    ]
    by_type = {e["type"]: e for e in events}
    assert by_type["tool_call_started"]["tool"] == "search_docs"
    assert by_type["tool_call_started"]["arguments"] == {"query": "refund window"}
    assert by_type["tool_call_finished"]["ok"] is True
    assert by_type["turn_saved"]["result"]["text"] == "Refunds take 14 days."
    assert {e["worker"] for e in events[1:]} == {app.worker.id}
    assert api.requests[0]["query"] == {"q": "refund window"}  # the tool ran once, on the worker


async def test_a_playbook_served_without_background_answers_inline(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(text("Refunds take 14 days.")) as fake:
            config = load_config(_served(tmp_path, fake.url, api.url))
            async with open_app(config) as app, Client(app.server) as client:
                r = await client.call_tool("research", {"query": "refunds"})
                listed = await app.runs.queue.runs(limit=10)
    assert not r.is_error and r.content[0].text == "Refunds take 14 days."
    assert listed == []  # nothing was queued


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"files": "pb/*.yaml", "backgroud": True}, "playbooks[0].backgroud: unknown key `backgroud`"),
        ({"background": True}, "playbooks[0].files: is required: a glob of playbook files"),
        ({"files": "pb/*.yaml", "background": "yes"}, "playbooks[0].background: expected a bool, got string"),
        ({"files": "pb/*.yaml", "task_support": "always"}, "playbooks[0].task_support: expected one of"),
        ({"files": "none/*.yaml"}, "playbooks[0].files: no file matches `none/*.yaml`"),
        (3, "playbooks[0]: expected `str | object`, got `int`"),
    ],
)
def test_a_bad_playbooks_entry_is_a_located_config_problem(tmp_path: Path, entry: Any, expected: str) -> None:
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "research.yaml").write_text(RESEARCH.read_text())
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps({"playbooks": [entry]}), "json", base_dir=str(tmp_path))
    assert any(str(p).startswith(expected) for p in caught.value.problems), caught.value.problems


async def test_a_side_effect_inside_a_queued_step_is_saved_at_once_and_not_done_again_by_the_next_worker(
    tmp_path: Path,
) -> None:
    done: list[str] = []

    async def call_the_api() -> dict[str, Any]:
        done.append("called")
        return {"status": 200}

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            queue = open_queue(str(tmp_path / "runs.sqlite3"), poll_s=0.02)
            await nursery.start(queue.run)
            info = await queue.enqueue("research", {}, principal=None)
            leased = await queue.lease("w1", 30, 1)
            assert leased is not None and leased.id == info.id
            first = RunRecord(queue, info.id, "w1", await queue.recorded(info.id))
            ctx = ToolContext(step="turn_t1", request=Request(interaction=first))
            got = await once(ctx, "tool1", call_the_api)
            # What a worker taking the run over loads: the value is there without any later save.
            second = RunRecord(queue, info.id, "w1", await queue.recorded(info.id))
            again = await once(replace(ctx, request=Request(interaction=second)), "tool1", call_the_api)
            events = await queue.events(info.id)
            nursery.cancel_scope.cancel()
    assert got == again == {"status": 200} and done == ["called"]
    assert [e.type for e in events] == ["enqueued", "leased"]  # a kept value is not a step


async def _until_event(queue: Any, run_id: str, kinds: set[str], after: str | None) -> tuple[list[Any], str | None]:
    """The run's events from ``after`` on, up to the first of ``kinds``; and the cursor after it."""
    seen: list[Any] = []
    while not any(e.type in kinds for e in seen):
        batch = await queue.events(run_id, after=after, wait_s=1)
        if batch:
            after = batch[-1].cursor
        seen += batch
    return seen, after


async def test_a_playbook_task_on_the_clients_model_waits_for_each_answer_and_its_tool_runs_once(
    tmp_path: Path,
) -> None:
    config = lookup_playbook(tmp_path)
    use = {"type": "tool_use", "id": "u1", "name": "lookup", "input": {"said": "hello"}}
    answers = [
        {"role": "assistant", "content": [use], "model": "client-model", "stopReason": "toolUse"},
        {"role": "assistant", "content": {"type": "text", "text": "It said hello."}, "model": "client-model"},
    ]
    LOOKUPS.clear()
    questions = []
    with trio.fail_after(WAIT_S):
        async with open_app(parse_config(json.dumps(config), "json", base_dir=str(tmp_path))) as app:
            queue = app.runs.queue
            # What the tasks extension does with a call of a client that declares it (server/_tasks.py).
            caps = {"sampling": {"tools": {}}}
            info = await app.runs.submit("with_tools", {"q": "x"}, ToolContext(), meta={"capabilities": caps})
            events, cursor = [], None
            for answer in answers:
                batch, cursor = await _until_event(queue, info.id, {"input_required"}, cursor)
                events += batch
                waiting = await queue.get(info.id)
                assert waiting is not None and waiting.status == "input_required"
                pending = waiting.meta["pending"]
                (key,) = pending
                questions.append(pending[key]["request"])
                await queue.answer(info.id, {key: answer})
            batch, cursor = await _until_event(queue, info.id, {"completed", "failed"}, cursor)
            events += batch
            done = await queue.get(info.id)
    assert done is not None and done.status == "completed", done
    assert done.answer["content"][0]["text"] == "It said hello."
    assert LOOKUPS == ["hello"]  # the turn ran again on each resume; the tool call did not
    assert [q["method"] for q in questions] == ["sampling/createMessage"] * 2
    assert questions[0]["params"]["tools"][0]["name"] == "lookup"
    tool_result = questions[1]["params"]["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result" and json.loads(tool_result["content"][0]["text"])["said"] == "hello"
    assert [(e.type, e.data.get("path")) for e in events] == [
        ("enqueued", None),
        ("leased", None),
        ("step_started", "turn_t"),
        ("input_required", None),
        ("resumed", None),
        ("leased", None),
        ("step_started", "turn_t"),
        ("tool_call_started", "turn_t"),
        ("tool_call_finished", "turn_t"),
        ("input_required", None),
        ("resumed", None),
        ("leased", None),
        ("step_started", "turn_t"),
        ("step_finished", "turn_t"),
        ("completed", None),
    ]
