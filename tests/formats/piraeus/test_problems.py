"""Every problem of the ``[piraeus]`` section and of the files it names is found at load (``mcpipe check`` and
``mcpipe serve`` alike), each one located line: the file and the JSON path in it, or the config key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.piraeus import upstream
from mcpipe.config import ConfigError, load_config


def problems(tmp_path: Path, files: dict[str, Any], section: dict[str, Any], **doc: Any) -> list[str]:
    for name, data in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
    (tmp_path / "mcpipe.json").write_text(json.dumps({"piraeus": section, **doc}))
    try:
        load_config(tmp_path / "mcpipe.json")
    except ConfigError as e:
        return [str(p).removeprefix(str(tmp_path / "mcpipe.json") + ":") for p in e.problems]
    return []


def test_the_section_and_its_globs_are_checked(tmp_path: Path) -> None:
    assert problems(tmp_path, {}, {"tools": "none/*.json", "model": "gtp", "prompt": "x"}, models={"gpt": {}}) == [
        "piraeus.prompt: unknown key `prompt`",
    ]
    assert problems(tmp_path, {}, {"tools": ["none/*.json", "also/*.json"], "model": "gtp"}, models={"gpt": {}}) == [
        "piraeus.model: unknown model `gtp` (did you mean `gpt`?)",
        "piraeus.tools[0]: no file matches `none/*.json`",
        "piraeus.tools[1]: no file matches `also/*.json`",
    ]


def test_a_file_that_is_not_json_is_located_by_line(tmp_path: Path) -> None:
    lines = problems(tmp_path, {"tools/t.json": '{\n  "name": "x",\n  "api": \n}'}, {"tools": "tools/*.json"})
    assert lines == ["tools/t.json:4: not valid JSON: unexpected character, expected a JSON value (column 1)"]


def tool(**over: Any) -> dict[str, Any]:
    raw = upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json")
    for key, value in over.items():
        target = raw
        *path, last = key.split("__")
        for p in path:
            target = target[p]
        if value is None:
            target.pop(last)
        else:
            target[last] = value
    return raw


@pytest.mark.parametrize(
    ("config", "lines"),
    [
        (tool(api__method="get"), ["api.method: expected one of GET, POST, PUT, PATCH, DELETE, got 'get'"]),
        (
            tool(api__auth__method="basic"),
            ["api.auth.method: expected one of none, api_key_header, api_key_query, bearer, oauth2, got 'basic'"],
        ),
        (
            tool(api__auth__secret_ref=None),
            ["api.auth.secret_ref: is required for `api_key_query`: piraeus would send an empty credential"],
        ),
        (tool(api__base_url="ftp://x/y"), ["api.base_url: expected an http(s) URL with a host, got 'ftp://x/y'"]),
        (
            tool(api__base_url="https://h/q?function=x"),
            ["api.base_url: must not carry a query or fragment (static query parameters go in `api.params`)"],
        ),
        (tool(api__timeout=0), ["api.timeout: must be more than 0 seconds, got 0"]),
        (tool(api__params={"function": 1}), ["api.params.function: expected a string, got number"]),
        (tool(input_schema=None), ["input_schema: is required"]),
        (tool(name="get stock"), ["name: `get stock` is not a tool name: 1 to 64 letters, digits, `_`, `.` or `-`"]),
        (
            tool(mapping__input_to_params={"sym": "symbol"}),
            [
                "mapping.input_to_params.sym: maps `sym`, which input_schema does not declare "
                "(did you mean `symbol`?): it would never be sent"
            ],
        ),
        (
            tool(mapping__responce_path="x"),
            ["mapping.responce_path: unknown key `responce_path` (did you mean `response_path`?)"],
        ),
        ({**tool(), "tags": "finance"}, ["tags: expected an array of strings"]),
        ([tool(), tool(description=None)], ["[1].description: is required"]),
        ([tool(), tool()], ["[1].name: `get_stock_quote` is also defined at tools/t.json: [0]"]),
        (
            {"id": "row", "name": "x", "tool_config": None, "method": "GET", "url": "https://x"},
            [
                "tool_config: is empty: a tool made of the builder's flattened fields "
                "(method, url, headers, query_params) has no ToolConfig, no input schema and no mapping; "
                "export its tool_config"
            ],
        ),
        (
            "[1, 2]",
            [
                "[0]: expected a ToolConfig or a tool row (an object), got number",
                "[1]: expected a ToolConfig or a tool row (an object), got number",
            ],
        ),
    ],
)
def test_a_bad_tool_config_is_refused_located_in_its_file(tmp_path: Path, config: Any, lines: list[str]) -> None:
    assert problems(tmp_path, {"tools/t.json": config}, {"tools": "tools/*.json"}) == [
        f"tools/t.json: {x}" for x in lines
    ]


def test_a_disabled_tool_is_checked_but_not_served(tmp_path: Path) -> None:
    """``enabled: false`` (which piraeus's factory never reads) keeps the tool out of the tools and the workflow."""
    from mcpipe.config import parse_config
    from mcpipe.formats.piraeus import load_piraeus
    from mcpipe.models import Models

    (tmp_path / "t.json").write_text(json.dumps(tool(enabled=False)))
    cfg = parse_config(json.dumps({"piraeus": {"tools": "t.json"}}), "json", base_dir=str(tmp_path))
    assert cfg.piraeus is not None
    loaded, found = load_piraeus(cfg.piraeus, Models(), base_dir=str(tmp_path))
    assert not found and loaded is not None
    assert loaded.tools == {} and loaded.workflow is None
    flow = {"name": "f", "steps": [{"step": 1, "type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "X"}}]}
    assert problems(tmp_path, {"f.json": flow}, {"tools": "t.json", "flows": "f.json"}) == [
        "f.json: steps[0].name: tool `get_stock_quote` is disabled (`enabled: false`)"
    ]
