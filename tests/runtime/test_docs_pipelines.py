"""Every runnable example of docs/pipelines.md runs, against the built-in tools, and answers as shown."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from mcpipe.runtime import run_pipeline
from mcpipe.tools.builtin import builtin_tools

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipelines.md"
EXAMPLES = re.findall(r"```json pipeline\n(.*?)```\s*```json answer\n(.*?)```", DOC.read_text(), re.S)


def test_the_doc_has_runnable_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize(("spec", "expected"), EXAMPLES, ids=[f"example{i + 1}" for i in range(len(EXAMPLES))])
async def test_a_runnable_example_answers_as_the_doc_says(spec, expected):
    answer = await run_pipeline(spec, builtin_tools())
    shown = orjson.loads(expected)
    assert {k: answer[k] for k in shown} == shown


def test_the_python_example_runs():
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    namespace: dict = {}
    exec(compile(code.replace("on_event=print", "on_event=None"), str(DOC), "exec"), namespace)
    assert namespace["answer"]["ok"] is True
    assert namespace["answer"]["result"] == "HTTPS://EXAMPLE.ORG/TRIO"
