"""Every python, postgres, duckdb and shell tool of NoETL's vendored playbooks (``upstream/``) is mapped onto a
step that compiles, or refused with a problem located in that tool."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpipe.backends.sql import SqlBackend, SqlBackendConfig
from mcpipe.declared import CommandPolicy, StepPolicy, StepScope, compile_step
from mcpipe.errors import Problem
from mcpipe.formats.noetl.toolkinds import JINJA_IN_CODE, KINDS, TEMPLATE_FIELDS, map_tool

UPSTREAM = Path(__file__).resolve().parent / "upstream"


def _tools(node: Any, loc: str) -> Iterator[tuple[dict[str, Any], str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{loc}.{key}" if loc else str(key)
            if key == "tool" and isinstance(value, dict):
                yield value, where
            elif key == "tool" and isinstance(value, list):
                yield from ((t, f"{where}[{i}]") for i, t in enumerate(value) if isinstance(t, dict))
            else:
                yield from _tools(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _tools(value, f"{loc}[{i}]")


def corpus() -> list[tuple[str, dict[str, Any], str]]:
    found = []
    for file in sorted(UPSTREAM.rglob("*.yaml")):
        try:
            docs = list(yaml.load_all(file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
        except yaml.YAMLError:
            continue  # a file that is not YAML: the front-end's corpus test reports it
        for doc in docs:
            for tool, loc in _tools(doc, ""):
                if tool.get("kind") in KINDS:
                    found.append((str(file.relative_to(UPSTREAM)), tool, loc))
    return found


def test_every_tool_maps_onto_a_step_that_compiles_or_is_refused_where_it_is():
    tools = corpus()
    if not tools:
        pytest.skip("the vendored NoETL playbooks (tests/formats/noetl/upstream) are not here")
    outcomes: Counter[tuple[str, str]] = Counter()
    for file, tool, loc in tools:
        kind = tool["kind"]
        problems: list[Problem] = []
        step = map_tool(kind, tool, loc, problems)
        if step is None:
            assert problems, (file, loc)
            assert all(p.location.startswith(loc) for p in problems), (file, [p.location for p in problems])
            outcomes[kind, "refused"] += 1
            continue
        assert problems == [], (file, problems)
        step.pop(JINJA_IN_CODE, None)  # code holding Jinja runs as written: the front-end warns
        # The front-end renders the template fields; as constants here, with every backend they name known.
        raw = {k: ({"$literal": v} if k in TEMPLATE_FIELDS[kind] else v) for k, v in step.items()}
        backends = (
            {step["backend"]: SqlBackend("b", SqlBackendConfig(url="postgresql://h/db"))} if "backend" in step else {}
        )
        policy = StepPolicy(command=CommandPolicy(commands={"sh": "/bin/sh"}), sql=backends)
        compiled, found = compile_step(raw, loc, StepScope(policy=policy))
        if compiled is None:
            # Only code that does not compile, which NoETL fails at run time: `return` outside a function, ...
            assert [p.location for p in found] == [f"{loc}.code"], (file, found)
            outcomes[kind, "code does not compile"] += 1
        else:
            outcomes[kind, "mapped"] += 1
    mapped = sum(n for (_, what), n in outcomes.items() if what == "mapped")
    assert mapped >= 0.9 * len(tools), outcomes
