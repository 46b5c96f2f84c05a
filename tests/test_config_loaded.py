"""One load of a config compiles what it declares once: ``mcpipe check``, ``mcpipe serve`` and ``mcpipe convert``
share the load (:class:`mcpipe.config.Loaded`), so no pipeline, playbook or piraeus flow is compiled twice.

Each compile function is wrapped in-process (a counter per pipeline, file and flow); the config has every kind
of compiled section, and ``python_tools``, whose names are checked only once the tools are loaded.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

import mcpipe.declared._pipelines as declared_pipelines
import mcpipe.formats.noetl as noetl
import mcpipe.formats.piraeus as piraeus
from mcpipe.cli import main
from mcpipe.config import ConfigError, load
from mcpipe.server import open_app
from mcpipe.tools import ToolRegistry

ROOT = Path(__file__).parents[1]

TOOLS = ToolRegistry()


@TOOLS.tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


CONFIG = f"""
python_tools = ["{__name__}:TOOLS"]
playbooks = ["deploy_review.yaml"]

[audit]
enabled = false

[outbound.commands]
sh = "/bin/sh"

[models.reviewer]
model = "gpt-4o-mini"

[models.gpt]
model = "gpt-4o-mini"

[piraeus]
tools = "exports/tools/*.json"
prompts = "exports/prompts/*.json"
flows = "exports/flows/*.json"
model = "gpt"

[[pipelines]]
name = "hello"
description = "Greets loudly."
steps = [{{ id = "loud", kind = "tool", tool = "shout", args = {{ text = "hello" }} }}]

[[pipelines]]
name = "twice"
description = "Calls the other pipeline."
steps = [{{ id = "inner", kind = "tool", tool = "hello", args = {{}} }}]
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples" / "piraeus" / "exports", tmp_path / "exports")
    shutil.copy(ROOT / "examples" / "noetl" / "deploy_review.yaml", tmp_path)
    path = tmp_path / "mcpipe.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each pipeline, playbook file and piraeus flow was compiled."""
    counts: Counter[str] = Counter()

    def counting(fn: Callable[..., Any], key: Callable[..., str]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            counts[key(*args, **kwargs)] += 1
            return fn(*args, **kwargs)

        return wrapped

    steps = declared_pipelines.compile_steps
    monkeypatch.setattr(declared_pipelines, "compile_steps", counting(steps, lambda raw, loc, *a, **k: loc))
    playbook = noetl.load_playbook
    monkeypatch.setattr(noetl, "load_playbook", counting(playbook, lambda path, **k: str(path)))
    flow = piraeus.compile_flow
    monkeypatch.setattr(piraeus, "compile_flow", counting(flow, lambda f, **k: f"flow {f.name}"))
    return counts


EVERY = {
    "pipelines.hello.steps": 1,
    "pipelines.twice.steps": 1,
    "deploy_review.yaml": 1,
    "flow rate_explained": 1,
}


def test_mcpipe_check_compiles_each_pipeline_playbook_and_flow_once(config_file: Path, compiled, capsys) -> None:
    assert main(["check", "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "2 pipelines, " in out and "1 playbook" in out and "1 piraeus flow" in out
    assert dict(compiled) == EVERY


def test_mcpipe_convert_of_a_file_in_mcpipes_layout_compiles_each_once(config_file: Path, compiled, capsys) -> None:
    assert main(["convert", "--config", str(config_file)]) == 0
    assert "already in mcpipe's own layout" in capsys.readouterr().err
    assert dict(compiled) == EVERY


async def test_serving_a_load_compiles_nothing_again_and_serves_what_it_compiled(config_file: Path, compiled) -> None:
    loaded = await trio.to_thread.run_sync(load, config_file)  # what `mcpipe serve` does before open_app
    assert dict(compiled) == EVERY
    with trio.fail_after(30):
        async with open_app(loaded) as app, Client(app.server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"hello", "twice", "deploy_review", "rate_explained"} <= names
            result = await client.call_tool("twice", {})
    assert result.is_error is False, result
    assert "HELLO" in str(result.structured_content or result.content)
    assert dict(compiled) == EVERY


async def test_a_config_built_in_code_is_compiled_once_when_served(config_file: Path, compiled) -> None:
    config = (await trio.to_thread.run_sync(load, config_file)).config
    compiled.clear()
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server) as client:
            assert (await client.call_tool("hello", {})).is_error is False
    assert dict(compiled) == EVERY


def test_a_tool_loaded_later_is_checked_against_the_load_without_compiling_again(config_file: Path, compiled) -> None:
    loaded = load(config_file)
    assert loaded.tool_problems([TOOLS]) == []
    with pytest.raises(ConfigError) as e:
        loaded.declared_source([])  # without the python_tools: `shout` is unknown
    assert [str(p) for p in e.value.problems] == ["pipelines.hello.steps[0].tool: unknown tool 'shout'"]
    assert dict(compiled) == EVERY
