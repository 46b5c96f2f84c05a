"""``mcpipe serve --stdio`` as a subprocess, driven by the SDK Client, in both protocol eras."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from mcp import Client, StdioServerParameters

from kit.servers import DOWNSTREAM
from mcpipe.gateway import PIPE_TOOL
from mcpipe.runs import RUN_TOOL_NAMES


def serve(*args: str, cwd: Path) -> StdioServerParameters:
    """``mcpipe serve --stdio`` in ``cwd`` (where the default audit file lands)."""
    return StdioServerParameters(command=sys.executable, args=["-m", "mcpipe", "serve", "--stdio", *args], cwd=cwd)


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_the_embedded_default_serves_mcp_pipe_and_the_built_ins_over_stdio(mode, tmp_path):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    spec = {
        "steps": [
            {"tool": "text_split", "args": {"text": "a b"}},
            {"tool": "text_join", "args": {"items": "${last.structured.items}", "sep": "+"}},
        ]
    }
    with trio.fail_after(30):
        async with Client(serve(cwd=tmp_path), mode=mode) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            r = await client.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)
    assert {PIPE_TOOL, "echo", "json_parse", "text_join", "now"} <= names
    assert r.structured_content["result"] == {"text": "a+b"} and seen == [1.0, 2.0]
    assert (tmp_path / "mcpipe-audit.jsonl").read_text().count("\n") == 3  # the default audit file, in the cwd


async def test_a_config_with_a_downstream_server_chains_stdio_to_stdio(tmp_path):
    config = tmp_path / "mcpipe.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {"ds": {"command": sys.executable, "args": [DOWNSTREAM], "include": ["add"]}},
                "builtins": False,
                "audit": {"path": str(tmp_path / "audit.jsonl")},
            }
        )
    )
    spec = {
        "steps": [
            {"tool": "ds.add", "args": {"a": 2, "b": 2}},
            {"tool": "ds.add", "args": {"a": "{{step1.result}}", "b": 1}},
        ]
    }
    with trio.fail_after(30):
        async with Client(serve("--config", str(config), cwd=tmp_path)) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            r = await client.call_tool(PIPE_TOOL, spec)
    assert names == {PIPE_TOOL, *RUN_TOOL_NAMES, "ds.add"}  # mcp_pipe's background runs come with pipe_*
    assert r.structured_content["result"] == {"result": 5}
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x["tool"] for x in records] == ["ds.add", "ds.add", PIPE_TOOL]


async def test_a_bad_config_exits_2_listing_every_problem(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[pipe]\nmax_steps = "x"\n[mcpServers.a]\n')
    r = await trio.run_process(
        [sys.executable, "-m", "mcpipe", "serve", "--config", str(config)], capture_stderr=True, check=False
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and "pipe.max_steps" in err and "mcpServers.a" in err


async def test_sigterm_stops_a_stdio_server_at_once_even_while_stdin_stays_open_and_logs_as_stdio(tmp_path):
    args = [sys.executable, "-m", "mcpipe", "serve", "--stdio"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = await trio.lowlevel.open_process(args, cwd=tmp_path, **pipes)
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    try:
        with trio.fail_after(60):
            request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
            await proc.stdin.send_all(json.dumps(request).encode() + b"\n")
            reply = b""
            while b"\n" not in reply:
                reply += await proc.stdout.receive_some()
            t0 = trio.current_time()
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
            elapsed = trio.current_time() - t0
            log = b""
            while chunk := await proc.stderr.receive_some():
                log += chunk
    finally:
        if proc.returncode is None:
            proc.kill()
    assert json.loads(reply)["result"]["serverInfo"]["name"] == "mcpipe"
    # Not at once is for ever (stdin stays open); at once is the process's teardown, more on a loaded host.
    assert proc.returncode == 0 and elapsed < 15, elapsed
    # The signal is logged as the stdio server's, not the HTTP front's.
    assert "INFO mcpipe.stdio: received SIGTERM: shutting down" in log.decode()
    assert "mcpipe.http" not in log.decode()
