"""A new user's first hour, a third time: the MCP surface as a model meets it (a real SDK client over stdio to
``mcpipe serve --stdio``: the instructions, the guide, the prompt, a pipeline written from them alone, and
the answers to its mistakes), and Ctrl-C at the command line as a real process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

MCPIPE = str(Path(sys.executable).with_name("mcpipe"))
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}


async def _as_a_model(cwd: Path) -> dict[str, Any]:
    """Connect over stdio, read what the server teaches, and call ``mcp_pipe`` with what it teaches."""
    params = StdioServerParameters(command=MCPIPE, args=["serve", "--stdio"], env=ENV, cwd=str(cwd))
    seen: dict[str, Any] = {}
    with anyio.fail_after(30):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            seen["instructions"] = init.instructions or ""
            for resource in (await session.list_resources()).resources:
                contents = (await session.read_resource(resource.uri)).contents
                seen[str(resource.uri)] = getattr(contents[0], "text", "")
            prompt = await session.get_prompt("write_pipeline", {"task": "split words and join them"})
            seen["prompt"] = "\n".join(getattr(m.content, "text", "") for m in prompt.messages)
            # the prompt's first example, as a model copies it
            example = re.search(r"```json\n(\{.*?\})\n```", seen["prompt"], flags=re.S)
            assert example is not None
            first = json.loads(example[1])
            seen["first"] = (await session.call_tool("mcp_pipe", first)).structured_content
            # a pipeline a model writes from the rules, with the mistakes it makes on a first try
            wrong = {
                "answer": "all",
                "steps": [
                    {"id": "now", "tool": "now", "args": {}},
                    {"id": "cut", "tool": "text_split", "args": {"text": 3, "separator": ","}},
                    {"id": "swap", "tool": "text_replace", "args": {"text": "${steps.now.structured.iso}"}},
                ],
            }
            seen["wrong"] = (await session.call_tool("mcp_pipe", wrong)).structured_content
            fixed = {
                "steps": [
                    {"id": "cut", "tool": "text_split", "args": {"text": "a,b,c", "sep": ","}},
                    {"id": "join", "tool": "text_join", "args": {"items": "${steps.cut.structured.items}", "sep": "+"}},
                ],
                "return": "${steps.join.structured.text}",
            }
            seen["fixed"] = (await session.call_tool("mcp_pipe", fixed)).structured_content
    return seen


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return anyio.run(_as_a_model, tmp_path_factory.mktemp("model"))


def test_a_model_over_stdio_is_told_where_the_guide_is_and_what_it_teaches_runs(seen):
    assert "mcp_pipe" in seen["instructions"] and "write_pipeline" in seen["instructions"]
    assert "mcpipe://guide/pipelines" in seen["instructions"]
    assert seen["mcpipe://guide/pipelines"].startswith("# Writing a pipeline")
    assert seen["mcpipe://guide/references"].startswith("# References")
    assert "### `text_split`" in seen["prompt"] and "split words and join them" in seen["prompt"]
    assert seen["first"]["ok"] is True and seen["first"]["result"] == "trio! rust! mcp!"
    assert seen["fixed"]["ok"] is True and seen["fixed"]["result"] == "a+b+c"


def test_a_models_first_mistakes_are_every_one_located_before_any_step_runs(seen):
    wrong = seen["wrong"]
    assert wrong["ok"] is False and wrong["error_code"] == "INVALID_SPEC" and wrong["steps"] == {}
    assert [(p["location"], p["message"]) for p in wrong["problems"]] == [
        ("answer", "Invalid enum value 'all' (expected one of `result`, `steps`, `full`)"),
        (
            "steps[1].args.separator",
            "tool 'text_split' has no argument `separator` (its arguments: `text`, `sep`, `maxsplit`)",
        ),
        ("steps[1].args.text", "tool 'text_split' expects string, got integer"),
        ("steps[2].args", "tool 'text_replace' requires argument `old`"),
    ]


def test_the_tool_argument_mistakes_are_located_together_before_any_step_runs(tmp_path):
    spec = {
        "steps": [
            {"id": "now", "tool": "now", "args": {}},
            {"id": "cut", "tool": "text_split", "args": {"text": 3, "separator": ","}},
            {"id": "swap", "tool": "text_replace", "args": {"text": "${steps.now.structured.iso}"}},
        ]
    }
    r = subprocess.run(
        [MCPIPE, "call", "mcp_pipe", json.dumps(spec)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "mcpipe call: mcp_pipe: steps[1].args.separator: tool 'text_split' has no argument `separator` "
        "(its arguments: `text`, `sep`, `maxsplit`) [INVALID_SPEC]",
        "mcpipe call: mcp_pipe: steps[1].args.text: tool 'text_split' expects string, got integer [INVALID_SPEC]",
        "mcpipe call: mcp_pipe: steps[2].args: tool 'text_replace' requires argument `old` [INVALID_SPEC]",
    ]


def test_ctrl_c_during_a_call_ends_it_with_one_line_and_status_130(tmp_path):
    (tmp_path / "slow.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path

            import trio

            from mcpipe.tools import ToolRegistry

            registry = ToolRegistry()


            @registry.tool
            async def nap(seconds: float) -> str:
                \"\"\"Sleep.\"\"\"
                Path("started").write_text("")
                await trio.sleep(seconds)
                return "done"
            """
        )
    )
    proc = subprocess.Popen(
        [MCPIPE, "call", "nap", '{"seconds": 30}', "--tools", "slow:registry"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        # a shell's background job ignores SIGINT; a terminal's foreground job does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (130, "", "mcpipe call: interrupted\n")


def test_call_prints_every_line_of_a_tool_errors_text_not_only_its_heading(tmp_path):
    # discord's `mcp_pipeline` says `**Input Error**` first, and what is wrong on the lines after
    (tmp_path / "discord.toml").write_text("[audit]\nenabled = false\n[pipe]\nmcp_pipeline = true\n")
    steps = {"steps": [{"id": "1a", "tool": "text_split", "args": {}}]}
    r = subprocess.run(
        [MCPIPE, "call", "mcp_pipeline", json.dumps(steps), "--config", "discord.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    pattern = "/^[a-z][a-z0-9_]{0,63}$/i"
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.splitlines() == [
        "mcpipe call: mcp_pipeline: **Input Error**",
        f"mcpipe call: mcp_pipeline: - `steps.0.id`: Invalid string: must match pattern {pattern}",
        f"mcpipe call: mcp_pipeline: **Recovery**: Fix `steps.0.id`: Invalid string: must match pattern {pattern}",
    ]
