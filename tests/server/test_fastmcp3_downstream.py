"""A fastmcp 3 server behind mcpipe: how a fastmcp 2/3 user gets ``mcp_pipe`` (``tests/kit/fastmcp3_server.py``).

fastmcp 3 runs on ``mcp`` 1.x and cannot be imported beside mcpipe (``mcp`` 2.x), so ``attach`` cannot take
it in process. The server runs in its own environment (made once, with ``fastmcp>=3,<4``, under
``tests/.cache/``) as the stdio ``command`` of an ``mcpServers`` entry, and ``mcpipe serve --stdio`` runs in
front of it: each step of ``mcp_pipe`` is one ``tools/call`` to the FastMCP 3 server, which its own handler
answers, so its middleware sees (and may refuse) each step's call.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from mcp import Client, StdioServerParameters

from mcpipe.gateway import PIPE_TOOL

TESTS = Path(__file__).parents[1]
SERVER = TESTS / "kit" / "fastmcp3_server.py"
REQUIREMENT = "fastmcp>=3,<4"
VENV = TESTS / ".cache" / "fastmcp3-venv"
"""The environment holding fastmcp 3, made once and kept across sessions (``tests/.cache`` is gitignored)."""
BUILD_TIMEOUT_S = 300
OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|Connection refused|ConnectTimeout|ReadTimeoutError"
)
"""What pip says when it cannot reach the package index (the one case that skips rather than fails)."""


def _python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _fastmcp3_python() -> Path:
    """The Python of an environment holding fastmcp 3: ``VENV`` if it is ready, else made now (bounded by
    ``BUILD_TIMEOUT_S``, its pip log kept beside it); skips only when the package index is unreachable."""
    ready = VENV / "ready.json"
    if ready.exists() and _python(VENV).exists():
        return _python(VENV)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    building = VENV.with_name(f"{VENV.name}.{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    log = VENV.with_name(f"{VENV.name}.log")
    started = time.monotonic()
    deadline = started + BUILD_TIMEOUT_S
    python = _python(building)
    steps = [
        [sys.executable, "-m", "venv", str(building)],
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--retries", "1", "--timeout", "15",
         "--progress-bar", "off", REQUIREMENT],
    ]  # fmt: skip
    with log.open("w") as out:
        for step in steps:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            try:
                done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=deadline - time.monotonic())
            except subprocess.TimeoutExpired:
                shutil.rmtree(building, ignore_errors=True)
                pytest.fail(
                    f"making the fastmcp 3 environment took over {BUILD_TIMEOUT_S} s, at `{' '.join(step[:4])} ...`;"
                    f" its output so far: {log}: {_tail(log)}"
                )
            if done.returncode != 0:
                shutil.rmtree(building, ignore_errors=True)
                text = log.read_text()
                if OFFLINE.search(text):
                    pytest.skip(f"the package index is unreachable, so no `{REQUIREMENT}` environment ({log})")
                pytest.fail(f"`{' '.join(step[:4])} ...` exited {done.returncode} ({log}): {_tail(log)}")
    found = subprocess.run(
        [str(python), "-c", "from importlib.metadata import version as v; print(v('fastmcp'), v('mcp'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    (building / "ready.json").write_text(
        json.dumps({"fastmcp": found[0], "mcp": found[1], "seconds": round(time.monotonic() - started, 1)})
    )
    try:
        building.rename(VENV)  # atomic: a session running beside this one either sees it ready or not at all
    except OSError:  # another session got there first: use its environment
        shutil.rmtree(building, ignore_errors=True)
    return _python(VENV)


def _tail(log: Path, lines: int = 5) -> str:
    return " | ".join(log.read_text().strip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def fastmcp3_python() -> Path:
    return _fastmcp3_python()


def _serve(config: Path, cwd: Path) -> StdioServerParameters:
    """``mcpipe serve --stdio --config config``, with this worktree's mcpipe first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "python"), *sys.path])}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "mcpipe", "serve", "--stdio", "--config", str(config)], env=env, cwd=cwd
    )


PIPELINE = {
    "steps": [
        {
            "id": "p",
            "parallel": [
                {"id": "a", "tool": "weather.wait", "args": {"ms": 300, "together": 2}},
                {"id": "b", "tool": "weather.wait", "args": {"ms": 300, "together": 2}},
                {"id": "c", "tool": "weather.forecast", "args": {"city": "Lyon"}},
            ],
        },
        {"id": "s", "tool": "weather.shout", "args": {"text": "${steps.p.children.c.structured.city}"}},
        {"id": "f", "tool": "weather.forecast", "args": {"city": "{{s.result}}"}},
    ],
    "return": {
        "lyon": "${steps.p.children.c.structured.high}",
        "loud": "{{f}}",
        "slept": "{{p.a.slept}}",
        "met": ["{{p.a.met}}", "{{p.b.met}}"],
    },
}
REFUSED = {
    "steps": [
        {"id": "ok", "tool": "weather.shout", "args": {"text": "fine"}},
        {"id": "no", "tool": "weather.shout", "args": {"text": "forbidden"}},
        {"id": "after", "tool": "weather.forecast", "args": {"city": "Paris"}},
    ],
    "continue_on_error": True,
}


async def test_a_fastmcp3_server_behind_mcpipe_runs_each_pipeline_step_through_its_own_middleware(
    fastmcp3_python, tmp_path
):
    config = tmp_path / "mcpipe.toml"
    config.write_text(
        "builtins = false\n"
        f"audit = {{ path = {json.dumps(str(tmp_path / 'audit.jsonl'))} }}\n"
        "[mcpServers.weather]\n"
        f"command = {json.dumps(str(fastmcp3_python))}\n"
        f"args = [{json.dumps(str(SERVER))}]\n"
        'protocol = "2025-11-25"\n'  # its mcp 1.x speaks that era: no probe of the newer one at connect
    )
    with trio.fail_after(60):
        async with Client(_serve(config, tmp_path)) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            versions = (await client.call_tool("weather.versions", {})).structured_content
            answer = (await client.call_tool(PIPE_TOOL, PIPELINE)).structured_content
            refused = (await client.call_tool(PIPE_TOOL, REFUSED)).structured_content
            seen = (await client.call_tool("weather.calls_seen", {})).structured_content["calls"]
    assert versions["fastmcp"].startswith("3.") and versions["mcp"].startswith("1."), versions
    assert {PIPE_TOOL, "weather.forecast", "weather.shout", "weather.wait", "weather.calls_seen"} <= names

    assert answer["ok"], answer
    # Each wait stays until both are in (``kit.meeting``): 2 and 2 shows they ran side by side, 1 that they
    # ran one after the other; no timing, however the host schedules the two requests.
    assert answer["result"] == {"lyon": 21, "loud": {"city": "LYON", "high": 12}, "slept": 300, "met": [2, 2]}
    assert answer["summary"]["succeeded"] == 5  # the group's three children and the two steps after it

    # the middleware saw each step's call: the group's three in any order, then the sequential steps in order
    group, rest = seen[:3], seen[3:]
    assert sorted(group, key=json.dumps) == sorted(
        [
            {"tool": "wait", "args": {"ms": 300, "together": 2}},
            {"tool": "wait", "args": {"ms": 300, "together": 2}},
            {"tool": "forecast", "args": {"city": "Lyon"}},
        ],
        key=json.dumps,
    )
    assert rest[:2] == [{"tool": "shout", "args": {"text": "Lyon"}}, {"tool": "forecast", "args": {"city": "LYON"}}]

    # a step the middleware refuses fails with its message; the steps around it ran through it too
    assert not refused["ok"]
    steps = refused["steps"]
    assert steps["ok"]["ok"] and steps["after"]["ok"]
    assert steps["no"]["error_code"] == "TOOL_ERROR"
    assert "refused by the fastmcp 3 server's middleware" in steps["no"]["error"]
    assert rest[2:] == [
        {"tool": "shout", "args": {"text": "fine"}},
        {"tool": "shout", "args": {"text": "forbidden"}},
        {"tool": "forecast", "args": {"city": "Paris"}},
    ]
