"""docs/server.md says what the embedded default (`mcpipe serve` with no config) serves and writes: its
table of tools is checked against the default's own `tools/list`, so the two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

import trio
from mcp import Client

from mcpipe.config import DEFAULT_CONFIG
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app

DOC = Path(__file__).parents[2] / "docs" / "server.md"


def _documented_default_tools() -> list[str]:
    """The first column of the table under `## The embedded default`."""
    section = DOC.read_text().split("\n## The embedded default\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, re.M)


def test_the_embedded_default_table_has_rows() -> None:
    names = _documented_default_tools()
    assert len(names) >= 10 and len(set(names)) == len(names), names


async def test_the_embedded_default_serves_exactly_the_tools_docs_server_md_lists(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with open_app(DEFAULT_CONFIG) as app, Client(app.server) as client:
        served = [t.name for t in (await client.list_tools()).tools]
    assert served[0] == PIPE_TOOL
    documented = _documented_default_tools()
    assert len(served) == len(set(served))
    missing, extra = set(served[1:]) - set(documented), set(documented) - set(served[1:])
    assert (missing, extra) == (set(), set()), f"served, not in the table: {missing}; in the table, not served: {extra}"


async def test_the_embedded_default_writes_only_its_audit_log_even_with_a_background_run(tmp_path, monkeypatch) -> None:
    """docs/server.md: the run queue lives in the process's memory; the one file written is the audit log."""
    monkeypatch.chdir(tmp_path)
    steps = [{"tool": "text_join", "args": {"items": ["a", "b"]}}]
    spec = {"background": True, "steps": steps, "return": "${last.structured.text}"}
    async with open_app(DEFAULT_CONFIG) as app, Client(app.server) as client:
        started = await client.call_tool(PIPE_TOOL, spec)
        run_id = started.structured_content["result"]["run_id"]
        with trio.fail_after(10):
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 5000})
        assert done.structured_content["ok"] is True and done.structured_content["result"] == "ab"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mcpipe-audit.jsonl"]
    assert PIPE_TOOL in (tmp_path / "mcpipe-audit.jsonl").read_text()
