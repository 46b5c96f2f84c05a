"""Every example of ``examples/`` runs as its README says: the README's command (the ``sh`` block under "Run
it"), run from the repository root with this environment's ``mcpipe`` and ``python`` first on PATH, prints
JSON holding the README's answer (the ``json`` block after it: every key it shows, with its value; a README
may abridge, and ``duration_ms`` fields vary, so they are not compared)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
EXPECTED = {"mcpg", "noetl", "discord", "piraeus", "gateway", "redis-workers"}
VARYING = {"duration_ms", "total_duration_ms"}


def readme_command(readme: Path) -> tuple[str, Any]:
    text = readme.read_text()
    assert "\n## Run it\n" in text, f"{readme}: no `## Run it` section"
    section = text.split("\n## Run it\n", 1)[1]
    command = re.search(r"```sh\n(.*?)```", section, re.S)
    assert command is not None, f"{readme}: no sh block under Run it"
    lines = [line for line in command.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, f"{readme}: the example is one command, not {lines}"
    answer = re.search(r"```json\n(.*?)```", section[command.end() :], re.S)
    assert answer is not None, f"{readme}: no json answer after the command"
    return lines[0], json.loads(answer.group(1))


def holds(expected: Any, actual: Any, where: str = "answer") -> list[str]:
    """Where ``actual`` differs from ``expected``: each key ``expected`` shows, recursively (lists item by
    item, of the same length), the varying durations aside."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: {actual!r} is no object"]
        return [
            problem
            for key, value in expected.items()
            if key not in VARYING
            for problem in (
                holds(value, actual[key], f"{where}.{key}") if key in actual else [f"{where}.{key}: missing"]
            )
        ]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{where}: {actual!r} is not a list of {len(expected)}"]
        return [p for i, (e, a) in enumerate(zip(expected, actual, strict=True)) for p in holds(e, a, f"{where}[{i}]")]
    return [] if expected == actual else [f"{where}: {actual!r}, not {expected!r}"]


def test_every_use_case_has_its_example() -> None:
    have = {p.parent.name for p in EXAMPLES.glob("*/README.md")}
    assert have >= EXPECTED, f"missing examples: {sorted(EXPECTED - have)}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_answers_as_its_readme_says(name: str) -> None:
    command, expected = readme_command(EXAMPLES / name / "README.md")
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    answer = json.loads(done.stdout)
    assert holds(expected, answer) == [], done.stdout


def test_a_changed_answer_is_found() -> None:
    assert holds({"ok": True, "result": {"n": [1, 2]}, "duration_ms": 1}, {"ok": True, "result": {"n": [1, 3]}}) == [
        "answer.result.n[1]: 3, not 2"
    ]
