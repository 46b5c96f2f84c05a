"""Adding a step kind is one module plus one registry line: the recipe of docs/declared-pipelines.md ("How to
add a step kind"), taken from the page, registered, then used by a declared pipeline served over MCP."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from mcp import Client

from mcpipe.config import parse_config
from mcpipe.declared import step_schema, validate_declared
from mcpipe.kinds import KINDS, Kind, Registry
from mcpipe.server import open_app

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "declared-pipelines.md"


def recipe() -> tuple[str, str]:
    """The kind module and the registry line of the recipe, as the page shows them."""
    text = DOC.read_text().split("### How to add a step kind", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return blocks[0], blocks[1].strip().rstrip(",")


def registry_line(package: str) -> dict[str, str]:
    """The recipe's registry line, its module found in ``package`` (the page's is ``mcpipe.kinds``)."""
    _, line = recipe()
    return {name: module.replace("mcpipe.kinds.", f"{package}.") for name, module in json.loads(f"{{{line}}}").items()}


@pytest.fixture
def kinds_package(tmp_path: Path) -> Iterator[str]:
    """A package holding the recipe's module, importable."""
    module, _ = recipe()
    package = tmp_path / "doc_kinds"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "repeat.py").write_text(module)
    sys.path.insert(0, str(tmp_path))
    try:
        yield "doc_kinds"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "doc_kinds" or m.startswith("doc_kinds.")]:
            del sys.modules[name]


@pytest.fixture
def repeat(kinds_package: str) -> Iterator[Kind]:
    """The recipe's kind, registered the way the registry's one line does it."""
    kind = Registry.of_modules(registry_line(kinds_package))["repeat"]
    KINDS.register(kind)
    try:
        yield kind
    finally:
        KINDS.unregister("repeat")


PIPELINE = {
    "name": "echo3",
    "input_schema": {"type": "object", "properties": {"w": {"type": "string"}}},
    "steps": [{"kind": "repeat", "id": "r", "text": "${args.w}", "times": 3, "sep": "-"}],
    "output": {"$ref": "steps.r.output"},
}


def test_the_recipe_is_one_module_and_one_registry_line():
    module, line = recipe()
    assert "KIND = Kind(" in module and re.fullmatch(r'"[a-z_]+": "mcpipe\.kinds\.[a-z_]+"', line)
    registry = (ROOT / "python" / "mcpipe" / "kinds" / "__init__.py").read_text()
    # every kind of the table is such a line (a config format's kinds, `mcpg.http`, register themselves)
    assert all(f'        "{k}": "{KINDS.module_of(k)}",\n' in registry for k in KINDS if "." not in k)


async def test_a_declared_pipeline_runs_the_new_kind_through_the_server(repeat: Kind):
    doc = {"audit": {"enabled": False}, "pipelines": [PIPELINE]}
    with trio.fail_after(20):
        async with open_app(parse_config(json.dumps(doc), "json", environ={})) as app, Client(app.server) as client:
            r = await client.call_tool("echo3", {"w": "ab"})
            bad = await client.call_tool("mcp_pipe", {"steps": [{"tool": "echo3", "args": {"w": 1}}]})
    assert not r.is_error and r.content[0].text == "ab-ab-ab"
    # its input schema refuses a plain argument of the wrong type before anything runs
    assert bad.structured_content is not None and bad.structured_content["error_code"] == "INVALID_SPEC"
    assert bad.structured_content["error"] == "steps[0].args.w: tool 'echo3' expects string, got integer"


def test_the_new_kinds_build_and_fields_report_located_problems(repeat: Kind):
    steps = [
        {"kind": "repeat", "id": "r", "text": "x", "times": 500},
        {"kind": "repeat", "text": "x", "times": "many", "color": "red"},
    ]
    problems = validate_declared([{**PIPELINE, "steps": steps}])
    assert [(p.location, p.message) for p in problems] == [
        ("pipelines.echo3.steps[0].times", "times must be between 1 and 100"),
        ("pipelines.echo3.steps[1].color", "unknown field `color` for kind `repeat`"),
        ("pipelines.echo3.steps[1].times", "Expected `int`, got `str`"),
    ]


def test_the_config_schema_lists_the_new_kind_and_forgets_it_when_unregistered(kinds_package: str):
    def kinds_in_schema() -> set[str]:
        defs = step_schema()["$defs"].values()
        return {d["properties"]["kind"]["enum"][0] for d in defs if "kind" in d["properties"]}

    before = kinds_in_schema()
    kind = Registry.of_modules(registry_line(kinds_package))["repeat"]
    KINDS.register(kind)
    try:
        assert kinds_in_schema() == before | {"repeat"}
        with pytest.raises(ValueError, match="already exists"):
            KINDS.register(kind)
    finally:
        KINDS.unregister("repeat")
    assert kinds_in_schema() == before and set(KINDS) | {"parallel", "pipe"} <= before


def test_a_module_without_a_kind_cannot_be_a_registry_line(kinds_package: str):
    with pytest.raises(TypeError, match="defines no KIND"):
        Registry.of_modules({"base": "mcpipe.kinds._base"})["base"]
