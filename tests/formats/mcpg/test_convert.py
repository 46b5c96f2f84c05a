"""``mcpipe convert`` writes an mcpg config in mcpipe's own layout, saying where each part came from, and the
file it writes serves what the mcpg file serves; ``mcpipe check --explain`` shows the same mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client

from mcpipe.cli import main
from mcpipe.config import parse_config
from mcpipe.formats import detect_config
from mcpipe.server import open_app

MCPG = """
mcp:
  capabilities:
    tools:
      - name: quote
        description: a quote
        governance: {minimum_trust: unauthenticated}
        backend: {kind: mock, response: {price: 3}}
      - name: twice
        description: a pipeline
        governance: {minimum_trust: unauthenticated}
        backend:
          kind: pipeline
          steps:
            - {id: n, kind: transform, expression: 'arguments.n * 2'}
    prompts:
      - name: hello
        description: a prompt
        governance: {minimum_trust: unauthenticated}
        backend: {kind: mock, response: {messages: [{role: user, content: {type: text, text: hi}}]}}
"""


async def _answers(text: str) -> list[Any]:
    config = parse_config(text, "yaml", environ={})
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server) as c:
            quote = await c.call_tool("quote", {"a": 1})
            twice = await c.call_tool("twice", {"n": 4})
            hello = await c.get_prompt("hello", {})
    return [
        (quote.content[0].text, quote.structured_content),  # type: ignore[union-attr]
        (twice.content[0].text, {k: v for k, v in (twice.structured_content or {}).items() if k != "duration_ms"}),  # type: ignore[union-attr]
        [m.model_dump() for m in hello.messages],
    ]


async def test_a_converted_mcpg_config_is_mcpipes_own_layout_and_serves_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "mcpg.yaml"
    source.write_text(MCPG)
    assert main(["convert", "--config", str(source)]) == 0
    out = capsys.readouterr().out
    assert "#   pipelines.quote  <-  mcp.capabilities.tools[0]" in out
    converted = yaml.safe_load(out)
    assert detect_config(converted) is None  # mcpipe's own layout
    assert await _answers(out) == await _answers(MCPG)


def test_check_explain_shows_where_each_part_of_an_mcpg_config_went(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "mcpg.yaml"
    source.write_text(MCPG)
    assert main(["check", "--config", str(source), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "mcpg's layout, read as mcpipe's:" in out
    assert "  pipelines.twice.steps[0]  <-  mcp.capabilities.tools[1].backend.steps[0]" in out
    assert "  trust.tools.hello  <-  mcp.capabilities.prompts[0].governance" in out


def test_converting_a_file_with_problems_lists_them_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "mcpg.yaml"
    source.write_text("cluster: {kind: nats}\ngateway: {server: {tunnel: {enabled: true}}}\n")
    assert main(["convert", "--config", str(source)]) == 1
    err = capsys.readouterr().err
    assert f"{source}:gateway.server.tunnel: " in err
    assert f"{source}:cluster.kind: a `nats` cluster is not in mcpipe" in err
