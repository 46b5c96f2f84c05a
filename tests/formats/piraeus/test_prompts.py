"""piraeus's prompts (``PromptDB``: a template with ``{variable}`` placeholders and typed ``PromptVariable``s;
``Prompt``: bare variable names, or none) served as MCP prompts and reached with the SDK's client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from kit.piraeus import piraeus_app
from mcpipe.config import ConfigError, parse_config

REPORT = {
    "name": "stock_report",
    "description": "Report on a stock",
    "prompt_template": "Report on {symbol} over {days} days{detail}. Flags: {flags}. Limit {limit}.",
    "variables": [
        {"name": "symbol", "type": "string", "description": "Ticker symbol"},
        {"name": "days", "type": "integer", "required": True},
        {"name": "detail", "type": "string", "required": False},
        {"name": "flags", "type": "array", "default": ["a"]},
        {"name": "limit", "type": "number", "required": False, "default": 2.5},
    ],
}
CITY = {
    "name": "city_brief",
    "content": "Tell me about {city}, in {{ language }}. Braces {like this} stay.",
    "variables": [],
}


async def test_prompts_are_listed_with_their_typed_variables(tmp_path: Path) -> None:
    """``prompts/list``: each variable an argument, ``required`` unless it has a default, its type said in its
    description (MCP arguments are strings); a row without variables takes its placeholders as required
    string variables (``{name}`` and ``{{ name }}``)."""
    files = {"prompts/report.json": REPORT, "prompts/city.json": CITY}
    async with piraeus_app(tmp_path, files) as app, Client(app.server) as c:
        listed = {p.name: p for p in (await c.list_prompts()).prompts}
    args = [(a.name, a.required, a.description) for a in listed["stock_report"].arguments or []]
    assert args == [
        ("symbol", True, "Ticker symbol"),
        ("days", True, "(integer)"),
        ("detail", False, None),
        ("flags", False, "(array)"),
        ("limit", False, "(number)"),
    ]
    assert listed["stock_report"].description == "Report on a stock"
    assert [(a.name, a.required) for a in listed["city_brief"].arguments or []] == [("city", True), ("language", True)]


async def test_prompts_get_renders_typed_values_and_defaults(tmp_path: Path) -> None:
    """``prompts/get``: string arguments converted to each variable's type (``"7"`` is the integer 7, an array
    is JSON), defaults filled, an optional variable left out renders as nothing; other braces are text."""
    files = {"prompts/report.json": REPORT, "prompts/city.json": CITY}
    async with piraeus_app(tmp_path, files) as app, Client(app.server) as c:
        report = await c.get_prompt("stock_report", {"symbol": "IBM", "days": "7"})
        full = await c.get_prompt(
            "stock_report", {"symbol": "IBM", "days": "7", "detail": " (daily)", "flags": '["x", "y"]', "limit": "3"}
        )
        city = await c.get_prompt("city_brief", {"city": "Oslo", "language": "French"})
    assert report.messages[0].content.text == 'Report on IBM over 7 days. Flags: ["a"]. Limit 2.5.'  # type: ignore[union-attr]
    assert full.messages[0].content.text == 'Report on IBM over 7 days (daily). Flags: ["x","y"]. Limit 3.0.'  # type: ignore[union-attr]
    assert city.messages[0].content.text == "Tell me about Oslo, in French. Braces {like this} stay."  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"symbol": "IBM"}, "days: an integer is required"),
        ({"symbol": "IBM", "days": "seven"}, "days: expected an integer, got 'seven'"),
        ({"symbol": "IBM", "days": "1", "flags": "[1"}, "flags: expected JSON of an array"),
        ({"symbol": "IBM", "days": "1", "dayz": "2"}, "dayz: unknown argument (did you mean `days`?)"),
    ],
)
async def test_prompts_get_with_bad_arguments_is_invalid_params(
    tmp_path: Path, args: dict[str, str], message: str
) -> None:
    async with piraeus_app(tmp_path, {"prompts/report.json": REPORT}) as app, Client(app.server) as c:
        with pytest.raises(MCPError) as caught:
            await c.get_prompt("stock_report", args)
    assert caught.value.error.code == -32602
    assert caught.value.error.message == f"invalid arguments for prompt 'stock_report': {message}"


def problems(tmp_path: Path, prompt: Any) -> list[str]:
    (tmp_path / "p.json").write_text(json.dumps(prompt))
    try:
        parse_config(json.dumps({"piraeus": {"prompts": "p.json"}}), "json", base_dir=str(tmp_path))
    except ConfigError as e:
        return [str(p) for p in e.problems]
    return []


@pytest.mark.parametrize(
    ("prompt", "lines"),
    [
        (
            {"name": "x", "prompt_template": "Hi {nam}", "variables": [{"name": "name", "type": "string"}]},
            ["p.json: prompt_template: `{nam}` names no variable (did you mean `name`?) (declared: name)"],
        ),
        (
            {"name": "x", "prompt_template": "{a}", "variables": [{"name": "a", "type": "float"}]},
            ["p.json: variables[0].type: expected one of string, number, integer, boolean, array, object, got 'float'"],
        ),
        (
            {"name": "x", "prompt_template": "{a}", "variables": [{"name": "a", "type": "integer", "default": "many"}]},
            ["p.json: variables[0].default: expected an integer, got 'many'"],
        ),
        ({"name": "x", "variables": []}, ["p.json: prompt_template: is required (or `content`)"]),
        (
            {"name": "x", "prompt_template": "{a}", "variables": ["a", "a"]},
            ["p.json: variables[1]: variable `a` is declared twice"],
        ),
        (
            {"name": "x", "prompt_template": "t", "vars": []},
            ["p.json: vars: unknown key `vars` (did you mean `variables`?)"],
        ),
    ],
)
def test_a_bad_prompt_row_is_refused_located(tmp_path: Path, prompt: Any, lines: list[str]) -> None:
    assert problems(tmp_path, prompt) == lines
