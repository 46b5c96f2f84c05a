"""The examples of docs/playbooks.md and docs/workflow.md run: every playbook compiles, the ones with
``# input:``/``# model says:``/``# answer:`` lines give their answer against a scripted OpenAI-compatible
server, the config examples load, the error listing is what the checker says, and the workflow's request
gives the documented response against a real API on 127.0.0.1."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import yaml
from mcp import Client

from kit.llm import BROKEN, fake_api, fake_openai, text
from mcpipe.config import parse, parse_config
from mcpipe.formats import format_sources
from mcpipe.formats.noetl import compile_playbook, load_playbook, playbook_tool
from mcpipe.models import ModelConfig, Models
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = (ROOT / "docs" / "playbooks.md").read_text()
WORKFLOW = (ROOT / "docs" / "workflow.md").read_text()
WAIT_S = 15


def blocks(doc: str, lang: str) -> list[str]:
    """The fenced blocks of ``lang`` (``""``: fences without a language)."""
    out, current, inside = [], [], False
    for line in doc.splitlines(keepends=True):
        if not inside and line.startswith("```"):
            inside, wanted, current = True, line.strip() == f"```{lang}", []
        elif inside and line.strip() == "```":
            inside = False
            if wanted:
                out.append("".join(current))
        elif inside:
            current.append(line)
    return out


def comment(block: str, name: str) -> Any:
    m = re.search(rf"^# {name}: (.*)$", block, re.M)
    return None if m is None else json.loads(m.group(1))


PLAYBOOK_BLOCKS = [b for b in blocks(PLAYBOOKS, "yaml") if re.search(r"^metadata:", b, re.M)]


@pytest.mark.parametrize("block", PLAYBOOK_BLOCKS, ids=lambda b: yaml.safe_load(b)["metadata"]["name"])
async def test_every_playbook_in_the_doc_compiles_and_gives_its_answer(block: str) -> None:
    raw = yaml.safe_load(block)
    assert compile_playbook(raw)[1] == []
    said = comment(block, "model says")
    if said is None:
        return
    with trio.fail_after(WAIT_S):
        async with fake_openai(*[text(s) for s in said]) as fake:
            models = Models({m["name"]: ModelConfig(base_url=fake.url) for m in raw["mcp"]["models"]})
            pb, problems = compile_playbook(raw, models=models)
            assert pb is not None, problems
            answer = await playbook_tool(pb).run(comment(block, "input"))
    assert answer["ok"], answer["error"]
    assert answer["answer"] == comment(block, "answer")
    assert len(fake.requests) == len(said)


def test_the_docs_error_listing_is_what_the_checker_says(tmp_path: Path) -> None:
    (tmp_path / "playbook.yaml").write_text(BROKEN)
    _, problems = load_playbook(tmp_path / "playbook.yaml")
    said = {str(p).replace(f"{tmp_path}/", "") for p in problems}
    listing = next(b for b in blocks(PLAYBOOKS, "") if b.startswith("playbook.yaml:"))
    for line in listing.splitlines():
        assert line in said


def test_the_docs_serving_config_loads_with_its_playbooks(tmp_path: Path) -> None:
    config = next(b for b in blocks(PLAYBOOKS, "toml") if b.startswith("playbooks ="))
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "nightly").mkdir()
    first, *rest = PLAYBOOK_BLOCKS
    (tmp_path / "nightly" / "0.yaml").write_text(first)
    for i, block in enumerate(rest):
        (tmp_path / "playbooks" / f"{i}.yaml").write_text(block)
    loaded = parse(config, "toml", base_dir=str(tmp_path))
    cfg = loaded.config
    assert msgspec.to_builtins(cfg.playbooks) == ["playbooks/*.yaml", {"files": "nightly/*.yaml", "background": True}]
    assert "gpt-4o" in cfg.models
    (served,) = format_sources(loaded.context())
    queued = {t.name for t in served if t.background}
    assert queued == {"support_answer"} and len(list(served)) == len(PLAYBOOK_BLOCKS)


def _workflow_doc() -> tuple[str, dict[str, Any], str, dict[str, Any]]:
    config = next(b for b in blocks(WORKFLOW, "toml") if "[workflow]" in b)
    request, model_answer, response = blocks(WORKFLOW, "json")
    return config, json.loads(request), model_answer, json.loads(response)


async def test_the_workflow_docs_request_gives_the_documented_response(monkeypatch: pytest.MonkeyPatch) -> None:
    config, request, model_answer, expected = _workflow_doc()
    monkeypatch.setenv("ALPHAVANTAGE_KEY", "sk-av")
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            config = config.replace("https://www.alphavantage.co", api.url).replace(
                "https://api.openai.com/v1", fake.url
            )
            fake.says(
                text(model_answer.replace("https://www.alphavantage.co", api.url)), text(expected["formatted_response"])
            )
            async with open_app(parse_config(config, "toml")) as app, Client(app.server) as c:
                r = await c.call_tool("workflow", request)
    got = r.structured_content
    assert got["raw_response"].pop("execution_time_ms") >= 0
    expected["raw_response"].pop("execution_time_ms")
    expected["http_spec"]["url"] = expected["http_spec"]["url"].replace("https://www.alphavantage.co", api.url)
    assert got == expected
    assert api.requests[0]["query"]["apikey"] == "sk-av"
    assert fake.requests[0]["model"] == "gpt-4o-mini" and fake.requests[0]["temperature"] == 0
