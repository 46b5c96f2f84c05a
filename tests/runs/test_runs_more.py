"""Background declared pipelines, cancelling from another server, and the command line of runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from kit.servers import make_config
from mcpipe.cli import main
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.store import open_queue
from mcpipe.tools import ToolRegistry

gate = ToolRegistry()


@gate.tool
async def forever() -> str:
    """Never answers (until cancelled)."""
    await trio.sleep_forever()
    return ""


async def test_a_background_declared_pipeline_answers_a_run_id_and_its_result_is_the_tools_answer():
    pipelines = [
        {
            "name": "shout_later",
            "background": True,
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            "steps": [{"id": "up", "kind": "transform", "expression": "args.text + '!'"}],
            "output": {"said": "${steps.up.output}"},
        }
    ]
    with trio.fail_after(20):
        async with open_app(make_config(pipelines=pipelines)) as app, Client(app.server) as client:
            bad = await client.call_tool("shout_later", {})
            queued = await client.call_tool("shout_later", {"text": "hi"})
            run_id = queued.structured_content["run_id"]
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 10000})
    assert bad.is_error and "text" in bad.content[0].text  # checked before it is queued
    assert not queued.is_error and queued.structured_content["status"] == "queued"
    assert not done.is_error and done.structured_content == {"said": "hi!"}


async def test_cancel_from_one_server_reaches_a_run_executing_on_another(tmp_path):
    db = str(tmp_path / "runs.sqlite3")
    front_config = make_config(runs={"path": db})
    back_config = make_config(runs={"path": db, "lease_s": 1.0})
    spec = {"background": True, "steps": [{"id": "f", "tool": "forever"}]}
    with trio.fail_after(30):
        async with (
            open_app(front_config, extra_sources=[gate], execute=False) as front,
            open_app(back_config, extra_sources=[gate]) as back,
            Client(front.server) as client,
        ):
            run_id = (await client.call_tool(PIPE_TOOL, spec)).structured_content["result"]["run_id"]
            events = await _until(front.runs.queue, run_id, "step_started")
            await client.call_tool("pipe_cancel", {"run_id": run_id})
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 20000})
            status = (await client.call_tool("pipe_status", {"run_id": run_id})).structured_content
    assert events[-1].worker == back.worker.id != front.runs.server_id
    assert done.is_error and status["status"] == "cancelled" and status["worker"] == back.worker.id


async def _until(queue: Any, run_id: str, type_: str) -> list[Any]:
    seen: list[Any] = []
    while not any(e.type == type_ for e in seen):
        seen += await queue.events(run_id, after=seen[-1].cursor if seen else None, wait_s=1)
    return seen


def _config(tmp_path: Path) -> str:
    path = tmp_path / "mcpipe.toml"
    path.write_text('[audit]\nenabled = false\n[runs]\npath = "runs.sqlite3"\n')
    return str(path)


async def _one_run(tmp_path: Path) -> str:
    queue = open_queue(str(tmp_path / "runs.sqlite3"))
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        info = await queue.enqueue(PIPE_TOOL, {"steps": [{"tool": "echo"}]}, run_id="r1", by="cli-test")
        await queue.lease("w1", 30, 1)
        await queue.save("r1", "w1", {"s": {"ok": True}}, [("step_finished", {"path": "s", "ok": True})])
        await queue.finish("r1", "w1", "completed", {"content": [], "isError": False})
        nursery.cancel_scope.cancel()
    return info.id


def test_mcpipe_runs_and_events_show_the_queue(tmp_path, capsys):
    config = _config(tmp_path)
    trio.run(_one_run, tmp_path)
    assert main(["runs", "--config", config, "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["events", "r1", "--config", config]) == 0  # the run has ended: following stops at its end
    lines = capsys.readouterr().out.splitlines()
    assert [r["run_id"] for r in listed] == ["r1"] and listed[0]["status"] == "completed"
    assert [line.split()[1] for line in lines] == ["enqueued", "leased", "step_finished", "completed"]
    assert "w1" in lines[1] and "path=s" in lines[2]


def test_runs_commands_without_a_shared_queue_say_what_to_set_in_one_line(tmp_path, capsys):
    path = tmp_path / "mcpipe.toml"
    path.write_text("[audit]\nenabled = false\n")
    assert main(["runs", "--config", str(path)]) == 2
    assert main(["events", "r1", "--config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("[runs] path" in line and "redis://" in line for line in err)


def test_mcpipe_events_of_an_unknown_run_exits_1_with_one_line(tmp_path, capsys):
    config = _config(tmp_path)
    assert main(["events", "nope", "--config", config]) == 1
    assert capsys.readouterr().err.strip() == "mcpipe events: error: no run 'nope'"


class _Lines:
    """The lines a process writes to a pipe, read as they come."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buf = b""

    async def next(self) -> str | None:
        """The next line, or None at the end of the stream."""
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some()
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


async def test_mcpipe_events_follows_a_running_run_live_and_exits_when_it_ends(tmp_path):
    import subprocess
    import sys

    config = _config(tmp_path)
    queue = open_queue(str(tmp_path / "runs.sqlite3"), poll_s=0.02)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.run)
            # This test is the run's worker: the run is still going when `mcpipe events` starts.
            await queue.enqueue(PIPE_TOOL, {"steps": []}, run_id="r1", by="srv")
            assert await queue.lease("w1", 60, 1) is not None
            await queue.save("r1", "w1", {}, [("step_started", {"path": "a"})])
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "mcpipe", "events", "r1", "--config", config, "--json"],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            lines = _Lines(proc.stdout)
            seen: list[tuple[str, str | None]] = []

            async def read(n: int) -> None:
                for _ in range(n):
                    line = await lines.next()
                    assert line is not None, f"mcpipe events ended early, after {seen}"
                    event = json.loads(line)
                    seen.append((event["type"], event.get("path")))

            await read(3)  # the events so far
            so_far = list(seen)
            assert proc.returncode is None  # it follows: the run goes on
            # Each event is printed as it is written, while the run is still going.
            await queue.save("r1", "w1", {"a": {"ok": True}}, [("step_finished", {"path": "a", "ok": True})])
            await read(1)
            await queue.save("r1", "w1", {}, [("step_started", {"path": "b"})])
            await read(1)
            assert proc.returncode is None
            await queue.finish("r1", "w1", "completed", {"content": [], "isError": False})
            await read(1)
            assert await lines.next() is None  # the run ended: so does the command
            code = await proc.wait()
            nursery.cancel_scope.cancel()
    assert so_far == [("enqueued", None), ("leased", None), ("step_started", "a")]
    assert seen[3:] == [("step_finished", "a"), ("step_started", "b"), ("completed", None)]
    assert code == 0


def test_listing_runs_needs_no_secret_of_auth_tokens_but_does_need_the_queues(tmp_path):
    """`mcpipe runs` and `events` read the queue: the tokens the HTTP front checks need not be set to list
    runs, and a variable the queue's own section reads must be (issue 27, item 25)."""
    import os
    import subprocess
    import sys

    trio.run(_one_run, tmp_path)
    path = tmp_path / "mcpipe.toml"
    path.write_text(
        '[audit]\nenabled = false\n[runs]\npath = "runs.sqlite3"\n'
        '[[auth.tokens]]\nenv = "T_RUNS_NOT_SET"\nprincipal = "alice"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("T_RUNS_")}

    def mcpipe(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mcpipe", *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)

    listed = mcpipe("runs", "--config", "mcpipe.toml", "--json")
    events = mcpipe("events", "r1", "--config", "mcpipe.toml", "--no-follow")
    assert (listed.returncode, listed.stderr) == (0, "")
    assert [json.loads(line)["run_id"] for line in listed.stdout.splitlines()] == ["r1"]
    assert events.returncode == 0 and events.stdout.splitlines()[-1].split()[1] == "completed"
    path.write_text('[audit]\nenabled = false\n[runs]\npath = "${env.T_RUNS_DB}"\n')
    refused = mcpipe("runs", "--config", "mcpipe.toml")
    assert refused.returncode == 2
    assert refused.stderr == "error: mcpipe.toml:runs.path: environment variable `T_RUNS_DB` is not set\n"
