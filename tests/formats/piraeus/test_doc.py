"""docs/formats/piraeus.md's examples hold: its config loads with piraeus's example tool, and the flow it shows
compiles and answers the shape it shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mcp import Client

from kit.llm import FakeOpenAI, text
from kit.piraeus import StandIn, piraeus_app, rehosted, upstream
from mcpipe.config import parse_config

DOC = (Path(__file__).resolve().parents[3] / "docs" / "formats" / "piraeus.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)


def test_the_docs_config_loads(tmp_path: Path) -> None:
    import tomllib

    [config] = [b for b in blocks("toml") if "[piraeus]" in b]
    for folder in ("tools", "prompts", "flows"):
        (tmp_path / "exports" / folder).mkdir(parents=True)
    (tmp_path / "exports" / "tools" / "quote.json").write_text(json.dumps(upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json")))
    (tmp_path / "exports" / "prompts" / "greet.json").write_text(
        json.dumps(upstream("test_database_endpoints.mock_prompt.json"))
    )
    (tmp_path / "exports" / "flows" / "f.json").write_text(
        json.dumps(
            {"name": "f", "steps": [{"step": 1, "type": "prompt", "name": "greeting", "inputs": {"name": "${who}"}}]}
        )
    )
    cfg = parse_config(json.dumps(tomllib.loads(config)), "json", base_dir=str(tmp_path))
    assert cfg.piraeus is not None and cfg.piraeus.secrets == {"ALPHA_VANTAGE_API_KEY": "demo"}


async def test_the_docs_flow_answers_the_docs_shape(tmp_path: Path, api: StandIn, model: FakeOpenAI) -> None:
    answer, flow = [json.loads(b) for b in blocks("json") if '"flow_name"' in b or '"steps": [' in b]
    prompt = {
        "name": "explain_quote",
        "prompt_template": "Explain a move of {change} for {symbol}.",
        "variables": [{"name": "symbol", "type": "string"}, {"name": "change", "type": "number"}],
    }
    files = {
        "tools/quote.json": rehosted(upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json"), api.url),
        "prompts/explain.json": prompt,
        "flows/doc.json": flow,
    }
    model.says(text(answer["outputs"]["step_2_output"]))
    async with piraeus_app(tmp_path, files, model_url=model.url) as app, Client(app.server) as c:
        r = await c.call_tool(flow["name"], {"symbol": "IBM"})
    out = r.structured_content
    assert out is not None and set(out) == set(answer) and out["status"] == answer["status"]
    assert out["outputs"]["step_2_output"] == answer["outputs"]["step_2_output"]
    assert {k: out["outputs"]["step_1_output"][k] for k in answer["outputs"]["step_1_output"]} == answer["outputs"][
        "step_1_output"
    ]
    strip = [{k: v for k, v in e.items() if k != "duration_ms"} for e in answer["execution_log"]]
    assert [{k: v for k, v in e.items() if k != "duration_ms"} for e in out["execution_log"]] == strip


def test_the_docs_tool_file_is_piraeus_own_example_and_loads(tmp_path: Path) -> None:
    [tool] = [json.loads(b) for b in blocks("json") if '"input_to_params"' in b]
    assert tool == upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json")
    (tmp_path / "quote.json").write_text(json.dumps(tool))
    cfg = parse_config('[piraeus]\ntools = "quote.json"\nworkflow = false\n', "toml", base_dir=str(tmp_path))
    assert cfg.piraeus is not None


def test_a_tool_file_with_auth_at_its_top_level_is_refused_saying_it_goes_under_api(tmp_path: Path) -> None:
    import subprocess
    import sys

    tool = upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json")
    tool["auth"] = tool["api"].pop("auth")
    tool["response_path"] = tool["mapping"].pop("response_path")
    (tmp_path / "quote.json").write_text(json.dumps(tool))
    (tmp_path / "mcpipe.toml").write_text('[piraeus]\ntools = "quote.json"\nworkflow = false\n')
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", "check", "--config", "mcpipe.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: mcpipe.toml:quote.json: auth: unknown key `auth`: it goes under `api` (`api.auth`)",
        "error: mcpipe.toml:quote.json: response_path: unknown key `response_path`: it goes under `mapping` "
        "(`mapping.response_path`)",
    ]
