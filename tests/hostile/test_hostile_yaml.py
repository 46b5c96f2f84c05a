"""Every YAML reader refuses alias expansion past a bound, located (issue 20, point 3): a 1 KB "billion laughs"
document made ``mcpipe playbook check`` and ``mcpipe serve`` spin over 60 s."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mcpipe._yaml import MAX_ALIAS_NODES, YamlBoundError, compose_yaml, load_yaml

ROOT = Path(__file__).parent.parent.parent
PACKAGE = ROOT / "python" / "mcpipe"


def laughs(levels: int = 9, width: int = 9) -> str:
    """Nine anchors, each a list of nine aliases to the one before: 9^9 nodes as a tree, 0.5 KB as text."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_built_located_at_the_node_that_passes_the_bound():
    t0 = time.perf_counter()
    with pytest.raises(YamlBoundError) as caught:
        load_yaml(laughs())
    assert time.perf_counter() - t0 < 10  # milliseconds; building the 9^9 nodes takes minutes and gigabytes
    mark = caught.value.problem_mark
    assert mark is not None and mark.line == 5  # l5: about 600 000 nodes, the first anchor past 100 000
    assert "its aliases expand the document past" in str(caught.value)


def test_a_long_string_aliased_many_times_is_refused_by_the_characters_it_adds():
    # 100 aliases add 100 nodes only, but 20 MB of text to any JSON written of the value.
    text = f"s: &s {'x' * 200_000}\nl: [{', '.join(['*s'] * 100)}]\n"
    with pytest.raises(YamlBoundError, match=r"characters of values \(16777216 more than the 200002 it holds\)"):
        load_yaml(text)
    fewer = text.replace(", ".join(["*s"] * 100), ", ".join(["*s"] * 50))  # 10 MB more: it loads
    assert len(load_yaml(fewer)["l"]) == 50


def test_a_document_that_contains_itself_is_refused():
    with pytest.raises(YamlBoundError, match="an alias refers to a node that contains it"):
        load_yaml("a: &a [1, *a]")


def test_ordinary_aliases_and_merge_keys_load_as_the_safe_loader_loads_them():
    text = "base: &b {x: 1, y: [1, 2]}\nuse: {<<: *b, y: 3}\nagain: *b\nday: 2024-01-02\n"
    assert load_yaml(text) == yaml.safe_load(text)
    assert load_yaml(text, timestamps=False)["day"] == "2024-01-02"
    # Aliases adding up to the bound load; one node more is refused.
    width = MAX_ALIAS_NODES // 2
    fits = "a: &a [1]\nb: [" + ", ".join(["*a"] * width) + "]\n"
    assert len(load_yaml(fits)["b"]) == width
    node = compose_yaml(fits)
    assert node is not None


def _calls_into_yaml(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "yaml":
            if node.attr in {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all", "compose"}:
                found.append((node.lineno, node.attr))
            if node.attr in {"compose_all", "parse", "SafeLoader", "CSafeLoader", "Loader", "FullLoader"}:
                found.append((node.lineno, node.attr))
        if isinstance(node, ast.ImportFrom) and node.module == "yaml":
            found += [(node.lineno, f"from yaml import {a.name}") for a in node.names if a.name not in {"YAMLError"}]
    return found


def test_every_yaml_read_of_the_package_goes_through_the_bounded_loader():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_yaml.py" and path.parent == PACKAGE:
            continue
        for line, what in _calls_into_yaml(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: yaml.{what}")
    assert offenders == [], "read YAML with mcpipe._yaml.load_yaml (or compose_yaml), never yaml directly"


def _mcpipe(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "mcpipe", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


PLAYBOOK = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: bomb, path: x/bomb}}
workload:
{body}
mcp:
  models: [{{name: m, provider: openai}}]
  turns: [{{name: t, model: m, user: "{{{{ workload | tojson }}}}"}}]
"""


def _bomb_playbook(tmp_path: Path) -> Path:
    body = "".join("  " + line + "\n" for line in laughs().splitlines())
    path = tmp_path / "bomb.yaml"
    path.write_text(PLAYBOOK.format(body=body))
    assert path.stat().st_size < 1024
    return path


def test_playbook_check_refuses_an_alias_bomb_at_once_located(tmp_path):
    _bomb_playbook(tmp_path)
    t0 = time.perf_counter()
    out = _mcpipe("playbook", "check", "bomb.yaml", cwd=tmp_path)
    assert time.perf_counter() - t0 < 40  # a process start, on a loaded host too; before: over 60 s of spinning
    assert out.returncode != 0
    assert "bomb.yaml:10" in out.stdout + out.stderr and "an alias bomb?" in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_serve_refuses_a_yaml_config_with_an_alias_bomb_located_and_does_not_start(tmp_path):
    (tmp_path / "mcpipe.yaml").write_text("x-bomb:\n" + "".join("  " + ln + "\n" for ln in laughs().splitlines()))
    out = _mcpipe("serve", "--config", "mcpipe.yaml", "--http", "127.0.0.1:0", cwd=tmp_path)
    assert out.returncode != 0
    assert "mcpipe.yaml:7:7: " in out.stderr and "an alias bomb?" in out.stderr
    assert "Traceback" not in out.stderr


def test_mcpipe_run_refuses_a_spec_file_with_an_alias_bomb(tmp_path):
    (tmp_path / "spec.yaml").write_text("vars:\n" + "".join("  " + ln + "\n" for ln in laughs().splitlines()))
    out = _mcpipe("run", "spec.yaml", cwd=tmp_path)
    assert out.returncode != 0
    assert "spec.yaml:7:7: invalid YAML" in out.stderr and "an alias bomb?" in out.stderr
