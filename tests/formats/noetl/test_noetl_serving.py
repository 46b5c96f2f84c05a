"""NoETL's playbooks served: each is a tool (its answer the run in NoETL's shape, structured), also a background
run on the run queue (its events hold each step's result), and the command line checks and runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from kit.noetl import UPSTREAM
from kit.served import served
from mcpipe.config import load_config
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

HELLO = "tests/fixtures/playbooks/hello_world/hello_world.yaml"
ISOLATION = "tests/fixtures/playbooks/test_loop_instance_isolation/playbook.yaml"
WAIT_S = 30


def _doc(*files: str, **entry: Any) -> dict[str, Any]:
    listed: list[Any] = [{"files": f, **entry} if entry else f for f in files]
    return {"playbooks": listed}


async def test_a_served_noetl_playbook_answers_its_run_in_noetls_shape_as_structured_content():
    with trio.fail_after(WAIT_S):
        async with served(_doc(HELLO), base_dir=str(UPSTREAM)) as app, Client(app.server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            r = await client.call_tool("hello_world", {"message": "from MCP"})
    assert "hello_world" in listed
    assert listed["hello_world"].input_schema["properties"] == {"message": {"type": "string"}}  # its workload
    assert not r.is_error
    assert r.structured_content == {
        "playbook": "hello_world",
        "status": "completed",
        "steps": {
            "start": [{"status": "initialized"}],
            "test_step": [{"status": "ok", "data": {"message": "from MCP"}}],
            "end": [{"status": "complete"}],
        },
        "failed_steps": [],
        "final": {"status": "complete"},
    }
    assert json.loads(r.content[0].text) == r.structured_content  # type: ignore[union-attr]


async def test_a_served_playbook_whose_step_fails_is_a_tool_error_with_its_run_in_noetls_shape():
    with trio.fail_after(WAIT_S):
        async with served(_doc(ISOLATION), base_dir=str(UPSTREAM)) as app, Client(app.server) as client:
            r = await client.call_tool("test_loop_instance_isolation", {})
    assert r.is_error
    assert r.content[0].text.startswith("TOOL_ERROR: step 'workflow' failed: step 'verify_results' failed:")  # type: ignore[union-attr]
    assert r.structured_content is not None
    assert r.structured_content["status"] == "failed"
    assert r.structured_content["failed_steps"] == ["verify_results"]


async def test_a_background_noetl_playbook_is_queued_and_its_events_carry_each_steps_result(tmp_path: Path):
    config = tmp_path / "mcpipe.json"
    doc = {"audit": {"enabled": False}, **_doc(str(UPSTREAM / HELLO), background=True)}
    config.write_text(json.dumps(doc))
    with trio.fail_after(WAIT_S):
        async with open_app(load_config(config)) as app, Client(app.server) as client:
            queued = await client.call_tool("hello_world", {})
            run_id = queued.structured_content["run_id"]  # type: ignore[index]
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 20000})
            page = await client.call_tool("pipe_events", {"run_id": run_id})
    assert queued.structured_content["status"] == "queued"  # type: ignore[index]
    assert not done.is_error, done.content
    assert done.structured_content["final"] == {"status": "complete"}  # type: ignore[index]
    events = page.structured_content["events"]  # type: ignore[index]
    kinds = [(e["type"], e.get("path")) for e in events]
    assert kinds[:2] == [("enqueued", None), ("leased", None)] and kinds[-1] == ("completed", None)
    exits = [e for e in events if e["type"] == "step_exit"]
    assert [e["step"] for e in exits] == ["start", "test_step", "end"]
    assert exits[1]["result"] == {"status": "ok", "data": {"message": "Hello World"}}
    # each step's result comes between its own step_started and step_finished
    paths = [(e["type"], e.get("path")) for e in events if e.get("path") == "test_step"]
    assert paths == [("step_started", "test_step"), ("step_exit", "test_step"), ("step_finished", "test_step")]


def _cli(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """``mcpipe playbook ARGS`` in NoETL's repository root (the vendored files' own paths), in this process."""
    from mcpipe.cli import main

    monkeypatch.chdir(UPSTREAM)
    code = main(["playbook", *args])
    out, err = capfd.readouterr()
    return code, out, err


def test_the_cli_checks_a_noetl_playbook_and_refuses_one_it_cannot_run_in_one_located_line(capfd, monkeypatch):
    code, out, err = _cli(capfd, monkeypatch, "check", HELLO)
    assert code == 0, err
    assert out == f"{HELLO}: ok (playbook `hello_world`, noetl.io/v2: 3 steps; 3 python)\n"
    code, out, err = _cli(capfd, monkeypatch, "check", "examples/snowflake/snowflake_simple.yaml")
    assert code == 1
    assert err == (
        "examples/snowflake/snowflake_simple.yaml:12: workflow[0].kind: "
        "NoETL tool kind `snowflake` (a cloud warehouse) has no mcpipe step kind\n"
    )


def test_the_cli_runs_a_noetl_playbook_with_an_input_and_prints_its_answer(capfd, monkeypatch):
    code, out, err = _cli(capfd, monkeypatch, "run", HELLO, "--input", "message=hi", "--events")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["noetl"]["steps"]["test_step"] == [{"status": "ok", "data": {"message": "hi"}}]
    events = [json.loads(line) for line in err.splitlines()]
    assert [e["step"] for e in events if e["type"] == "step_exit"] == ["start", "test_step", "end"]
