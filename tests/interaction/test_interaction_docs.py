"""The examples of docs/interaction.md compile (the declared pipeline, the gather fragment, the mcp_pipe
spec), and its tables name every kind and tool that exists."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import yaml

from mcpipe.compile import compile_spec
from mcpipe.declared import KINDS, StepScope, compile_step, compile_steps
from mcpipe.interaction import INTERACTION_TOOL_NAMES

DOC = Path(__file__).parents[2] / "docs" / "interaction.md"
TOOLS = {"billing.quote", "billing.charge", "notes.post", *INTERACTION_TOOL_NAMES}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_the_declared_example_compiles() -> None:
    [config] = [yaml.safe_load(b) for b in _blocks("yaml") if b.startswith("pipelines:")]
    for entry in config["pipelines"]:
        steps, problems = compile_steps(entry["steps"], "steps", StepScope(tools=TOOLS))
        assert problems == [], problems
        assert steps is not None


def test_the_gather_fragment_compiles() -> None:
    [fragment] = [b for b in _blocks("yaml") if "kind: gather" in b and not b.startswith("pipelines:")]
    [raw] = yaml.safe_load(textwrap.dedent(fragment))
    # A fragment: its reference to an earlier step (`fetch`) is left unchecked.
    step, problems = compile_step(raw, "steps[1]", StepScope(tools=TOOLS))
    assert problems == [], problems
    assert step is not None and step.kind == "gather"


def test_the_mcp_pipe_example_compiles() -> None:
    [spec] = [json.loads(b) for b in _blocks("json") if '"steps"' in b]
    compiled = compile_spec(spec, tools=TOOLS)
    assert compiled.leaf_count == 3


def test_the_doc_names_every_asking_kind_and_tool() -> None:
    text = DOC.read_text()
    for name in ("elicitation", "sampling", "roots_list", "gather", *INTERACTION_TOOL_NAMES):
        assert f"`{name}`" in text
    assert {"elicitation", "sampling", "roots_list", "gather"} <= set(KINDS)
