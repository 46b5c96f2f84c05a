"""A config served over HTTP is reloaded without a restart (SIGHUP, or ``reload.watch``): the same sessions see
the new tools and are told the list changed; a file that does not load leaves the current config serving, with
one located log line."""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
import yaml

from kit.clients import bearer_client
from kit.servers import start_process
from mcpipe.config import load_config
from mcpipe.server._http import serve_http
from mcpipe.server._reload import Reloader

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _write(path: Path, tool: str, **more: Any) -> None:
    doc = {
        "builtins": False,
        "audit": {"enabled": False},
        "pipelines": [{"name": tool, "description": f"the {tool} tool", "steps": [{"kind": "value", "value": tool}]}],
        **more,
    }
    path.write_text(yaml.safe_dump(doc))


class Changes:
    def __init__(self) -> None:
        self.event = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.event.set()


async def _tools(client: Any) -> list[str]:
    return sorted(t.name for t in (await client.list_tools()).tools if t.name != "mcp_pipe" and "pipe_" not in t.name)


async def test_a_watched_file_is_reloaded_for_the_open_session_and_a_bad_one_keeps_serving_with_one_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mcpipe.yaml"
    _write(path, "first", reload={"watch": True, "poll_ms": 1000})
    args = [sys.executable, "-m", "mcpipe.server", "--config", str(path), "--http", "127.0.0.1:0"]
    proc, url = await start_process(args, {"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    changes = Changes()
    log = b""
    try:
        with trio.fail_after(30):
            async with bearer_client(url, None, mode="legacy", message_handler=changes) as client:
                before = await _tools(client)
                _write(path, "second", reload={"watch": True, "poll_ms": 1000})
                await changes.event.wait()  # told on its own session, within a poll
                after = await _tools(client)
                called = await client.call_tool("second", {})
                path.write_text("pipelines: [{name: third, steps: [{kind: nope}]}]\n")
                assert proc.stderr is not None
                while b"config reload refused" not in log:
                    log += await proc.stderr.receive_some()
                with trio.move_on_after(2.5):  # two more polls of the same bad file: nothing more is said
                    while True:
                        log += await proc.stderr.receive_some()
                still = await _tools(client)
    finally:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await proc.wait()
    assert (before, after, still) == (["first"], ["second"], ["second"])
    assert called.content[0].text == "second"  # type: ignore[union-attr]
    refused = [line for line in log.decode().splitlines() if "config reload refused" in line]
    assert len(refused) == 1, log.decode()
    assert f"config reload refused (file_watch): {path}:pipelines.third.steps[0].kind:" in refused[0]


async def test_sighup_reloads_an_mcpg_config_and_its_new_binding_answers(tmp_path: Path) -> None:
    # mcpg's hot-reload (docs/hot-reload.md): SIGHUP rebuilds the runtime, swapped atomically.
    path = tmp_path / "mcpg.yaml"

    def mcpg(tool: str) -> None:
        binding = {
            "name": tool,
            "description": "d",
            "governance": {"minimum_trust": "unauthenticated"},
            "backend": {"kind": "mock", "response": {"tool": tool}},
        }
        path.write_text(
            yaml.safe_dump(
                {"gateway": {"config_watch": {"enabled": False}}, "mcp": {"capabilities": {"tools": [binding]}}}
            )
        )

    mcpg("old.tool")
    reloader = Reloader(str(path), load_config(path))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            app = await nursery.start(reloader.run)
            stop = trio.Event()
            url = await nursery.start(
                lambda task_status: serve_http(
                    app,
                    host="127.0.0.1",
                    port=0,
                    shutdown_trigger=stop.wait,
                    on_front=reloader.attach,
                    task_status=task_status,
                )
            )
            # 2025-11-25: mcpg's lists carry a 60 s ttlMs under 2026-07-28, which a client may honour.
            async with bearer_client(url, None, mode="legacy") as client:
                before = await _tools(client)
                mcpg("new.tool")
                changed = reloader.changed
                os.kill(os.getpid(), signal.SIGHUP)
                await changed.wait()
                after = await _tools(client)
                answer = await client.call_tool("new.tool", {})
            stop.set()
            nursery.cancel_scope.cancel()
    assert (before, after, reloader.reloads) == (["old.tool"], ["new.tool"], 1)
    assert answer.structured_content["response"] == {"tool": "new.tool"}  # type: ignore[index]


def test_mcpgs_config_watch_becomes_reload_watch_with_its_one_second_floor() -> None:
    from mcpipe.config import parse_config

    with warnings.catch_warnings():
        config = parse_config("gateway: {config_watch: {enabled: true, poll_interval_ms: 200}}\n", "yaml", environ={})
    assert (config.reload.watch, config.reload.poll_ms) == (True, 1000)
