"""Issue 24, a new user's first hour again: the command line as real processes (a closed pipe ends quietly,
``check`` checks tool names as ``run`` would, ``call`` takes YAML and prints a failure once, the config
check's summary), a direct call's "did you mean", a model with no key, and the errors the docs show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from mcp import Client

from kit.servers import make_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.store import open_queue

ROOT = Path(__file__).parents[1]
MCPIPE = str(Path(sys.executable).with_name("mcpipe"))
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
SIGPIPE_STATUS = 141


def mcpipe(*args: str, cwd: Path, stdin: str | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MCPIPE, *args], cwd=cwd, capture_output=True, text=True, input=stdin, timeout=60, env=ENV, **kw
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def readme_first_example() -> str:
    """The pipeline README.md opens with."""
    return re.search(r"```json\n(\{.*?\})\n```", (ROOT / "README.md").read_text(), flags=re.S)[1]


# --- 3: a closed pipe ends every command quietly ----------------------------------------------------------


async def _finished_run(queue_file: Path) -> None:
    queue = open_queue(str(queue_file))
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        await queue.enqueue(PIPE_TOOL, {"steps": [{"tool": "echo"}]}, run_id="r1", by="cli-test")
        await queue.lease("w1", 30, 1)
        await queue.save("r1", "w1", {"s": {"ok": True}}, [("step_finished", {"path": "s", "ok": True})])
        await queue.finish("r1", "w1", "completed", {"content": [], "isError": False})
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "args",
    [["tools"], ["tools", "--json"], ["run", "p.json"], ["events", "r1", "--config", "runs.toml"]],
    ids=["tools", "tools-json", "run", "events"],
)
def test_a_reader_that_went_away_ends_the_command_quietly_with_the_sigpipe_status(tmp_path, args):
    write(tmp_path / "p.json", '{"steps": [{"tool": "echo", "args": {"a": 1}}]}')
    write(tmp_path / "runs.toml", '[audit]\nenabled = false\n[runs]\npath = "runs.sqlite3"\n')
    trio.run(_finished_run, tmp_path / "runs.sqlite3")
    read, written = os.pipe()
    os.close(read)  # `| head -1` that has already gone: every write to stdout fails with EPIPE
    try:
        r = subprocess.run(
            [MCPIPE, *args], cwd=tmp_path, stdout=written, stderr=subprocess.PIPE, text=True, timeout=60, env=ENV
        )
    finally:
        os.close(written)
    assert r.returncode == SIGPIPE_STATUS
    assert r.stderr == ""


def test_tools_piped_into_head_prints_its_first_line_and_nothing_on_stderr(tmp_path):
    r = subprocess.run(
        f"{MCPIPE} tools | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert r.stdout.startswith("mcp_pipe(") and r.stdout.count("\n") == 1
    assert r.stderr == "" and r.returncode in (0, SIGPIPE_STATUS)


# --- 4: check knows the tools run would have ------------------------------------------------------------


def test_check_refuses_the_readmes_first_example_as_run_does_and_says_what_it_checked_against(tmp_path):
    write(tmp_path / "readme.json", readme_first_example())
    checked = mcpipe("check", "readme.json", cwd=tmp_path)
    ran = mcpipe("run", "readme.json", cwd=tmp_path)
    unknown = [
        "readme.json: steps[0].tool: unknown tool 'web_search' [UNKNOWN_TOOL]",
        "readme.json: steps[1].tool: unknown tool 'web_fetch' [UNKNOWN_TOOL]",
        "readme.json: steps[2].tool: unknown tool 'extract_key_info' [UNKNOWN_TOOL]",
    ]
    assert checked.returncode == ran.returncode == 1
    assert checked.stdout == ""
    assert checked.stderr.splitlines() == [
        *unknown,
        "readme.json: note: tool names were checked against the built-in tools"
        " (--tools MODULE:REGISTRY or --config FILE adds yours)",
    ]
    assert ran.stderr.splitlines() == unknown


SEARCH_TOOLS = """
from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
def web_search(query: str) -> dict:
    return {"results": [{"url": "https://example.com"}]}


@registry.tool
def web_fetch(url: str) -> dict:
    return {"content": url}


@registry.tool
def extract_key_info(query: str, materials: str) -> dict:
    return {"contexts": [materials]}
"""


def test_check_with_tools_or_a_config_checks_against_those_and_notes_servers_it_cannot_reach(tmp_path):
    write(tmp_path / "readme.json", readme_first_example())
    write(tmp_path / "fh24_search.py", SEARCH_TOOLS)
    config = write(
        tmp_path / "mcpipe.toml",
        """
        python_tools = ["fh24_search:registry"]
        [audit]
        enabled = false
        [mcpServers.gone]
        command = "true"
        """,
    )
    with_tools = mcpipe("check", "readme.json", "--tools", "fh24_search:registry", cwd=tmp_path)
    with_config = mcpipe("check", "readme.json", "--config", str(config), cwd=tmp_path)
    assert with_tools.returncode == 0, with_tools.stderr
    assert with_tools.stdout == "readme.json: ok (3 steps, 3 tool calls)\n"
    assert with_config.returncode == 0, with_config.stderr
    assert with_config.stdout == "readme.json: ok (3 steps, 3 tool calls)\n"
    [note] = with_config.stderr.splitlines()
    assert note.startswith("readme.json: note: the tools of server `gone` are not checked: ")


# --- 5: call prints a failure once and takes YAML; a direct call's did-you-mean --------------------------


def test_call_of_a_failing_mcp_pipe_prints_each_problem_once_on_stderr_and_nothing_on_stdout(tmp_path):
    r = mcpipe("call", "mcp_pipe", "-", cwd=tmp_path, stdin='{"steps": [{"tool": "text_jion"}]}')
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "mcpipe call: mcp_pipe: steps[0].tool: unknown tool 'text_jion' (did you mean `text_join`?) [UNKNOWN_TOOL]"
    ]
    whole = mcpipe("call", "mcp_pipe", "-", "--json", cwd=tmp_path, stdin='{"steps": [{"tool": "text_jion"}]}')
    assert whole.returncode == 1 and orjson.loads(whole.stdout)["structuredContent"]["error_code"] == "UNKNOWN_TOOL"


def test_call_takes_its_arguments_as_yaml_as_run_takes_a_spec(tmp_path):
    flow = mcpipe("call", "text_join", "items: [a, b]\nsep: '+'", cwd=tmp_path)
    piped = mcpipe("call", "mcp_pipe", "-", cwd=tmp_path, stdin="steps:\n  - tool: text_split\n    args: {text: a b}\n")
    assert flow.returncode == 0, flow.stderr
    assert orjson.loads(flow.stdout) == {"text": "a+b"}
    assert piped.returncode == 0, piped.stderr
    assert orjson.loads(piped.stdout)["result"] == {"items": ["a", "b"]}


async def test_a_direct_call_of_an_unknown_tool_suggests_the_closest_tool_the_caller_may_call():
    async with open_app(make_config()) as app, Client(app.server) as client:
        result = await client.call_tool("text_jion", {})
    assert result.is_error
    assert result.content[0].text == "UNKNOWN_TOOL: unknown tool 'text_jion' (did you mean `text_join`?)"


# --- 5: the config check counts playbooks and prints each problem once ------------------------------------

PLAYBOOK = (ROOT / "tests" / "llm" / "playbooks" / "research.yaml").read_text()


def test_the_config_check_counts_playbooks_and_prints_each_playbook_problem_once(tmp_path):
    write(tmp_path / "playbooks" / "research.yaml", PLAYBOOK)
    config = write(tmp_path / "mcpipe.toml", 'playbooks = ["playbooks/*.yaml"]\n[audit]\nenabled = false\n')
    ok = mcpipe("check", "--config", str(config), cwd=tmp_path)
    write(tmp_path / "playbooks" / "research.yaml", PLAYBOOK.replace("model: gpt-4o", "model: gpt-40"))
    bad = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == f"{config}: ok (0 downstream servers, 0 python_tools entries, 0 pipelines, 1 playbook)\n"
    assert bad.returncode == 1
    [line] = bad.stderr.splitlines()
    assert line.startswith(f"error: {config}:playbooks/research.yaml:") and "unknown model `gpt-40`" in line


# --- 5: a model with no key and no base URL ---------------------------------------------------------------


def test_a_model_with_no_key_and_no_base_url_says_the_key_is_unset(tmp_path):
    write(tmp_path / "research.yaml", PLAYBOOK)
    r = mcpipe("playbook", "run", "research.yaml", "--input", "query=refunds", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "research.yaml: MODEL_FAILED: step 'turn_t1' failed: mcp.turns[0]: model 'gpt-4o': OPENAI_API_KEY is not "
        "set (and no base URL is given: set OPENAI_API_KEY, or OPENAI_BASE_URL / the model's base_url for another "
        "endpoint)"
    )


# --- 5: the errors the docs show are the errors printed ---------------------------------------------------

DOCS_ERRORS = [
    # (the line docs/cli.md shows, the command that prints it, files to write first)
    (
        "mcpipe check: error: p.json:2:18: invalid JSON: trailing comma is not allowed",
        ["check", "p.json"],
        {"p.json": '{"steps": [\n {"tool": "echo"},]}'},
    ),
    (
        "mcpipe check: error: p.json: a pipeline spec must be an object with `steps`, got a string",
        ["check", "p.json"],
        {"p.json": '"fetch the page"'},
    ),
    (
        "error: mcpipe.toml:pipe.max_depth: expected `int`, got `str`",
        ["check", "--config", "mcpipe.toml"],
        {"mcpipe.toml": '[pipe]\nmax_depth = "deep"\n'},
    ),
    (
        "error: mcpipe.toml:bultins: unknown key `bultins` (did you mean `builtins`?)",
        ["check", "--config", "mcpipe.toml"],
        {"mcpipe.toml": "bultins = true\n"},
    ),
    (
        "mcpipe call: error: no tool `text_jon` (did you mean `text_join`?)",
        ["call", "text_jon", "{}"],
        {},
    ),
]


@pytest.mark.parametrize(("shown", "args", "files"), DOCS_ERRORS, ids=[" ".join(a[1]) for a in DOCS_ERRORS])
def test_the_errors_docs_cli_md_shows_are_printed_as_shown(tmp_path, shown, args, files):
    assert shown in (ROOT / "docs" / "cli.md").read_text()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = mcpipe(*args, cwd=tmp_path)
    assert shown in r.stderr.splitlines(), r.stderr
