"""An mcpg file serves no ``mcp_pipe`` (as mcpg), says so, and ``MCPIPE_MCPG_PIPE=1`` serves it beside the
bindings, under the file's trust rules (issue 27, item 25)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client
from mcp.shared.exceptions import MCPError

from kit.servers import http_server
from mcpipe.config import parse_config
from mcpipe.server import open_app

ROOT = Path(__file__).resolve().parents[3]
ORDERS = ROOT / "examples" / "mcpg" / "orders.yaml"
SPEC = {"steps": [{"tool": "orders.init"}, {"id": "left", "tool": "orders.db", "args": {"id": 5}}]}


async def _listed_and_piped(text: str, environ: dict[str, str]) -> tuple[list[str], Any]:
    config = parse_config(text, "yaml", base_dir=str(ORDERS.parent), environ=environ)
    with trio.fail_after(60):
        async with open_app(config) as app, http_server(app) as url, Client(url) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            try:
                piped: Any = await c.call_tool("mcp_pipe", SPEC)
            except MCPError as e:
                piped = e
    return names, piped


async def test_the_switch_serves_mcp_pipe_beside_an_mcpg_files_bindings(tmp_path: Path) -> None:
    environ = {"ORDERS_DB": str(tmp_path / "orders.db")}
    names, piped = await _listed_and_piped(ORDERS.read_text(), {**environ, "MCPIPE_MCPG_PIPE": "1"})
    assert "mcp_pipe" in names and "orders.db" in names
    assert piped.is_error is False and piped.structured_content["result"] == 3
    without, refused = await _listed_and_piped(ORDERS.read_text(), environ)
    assert "mcp_pipe" not in without and "orders.db" in without
    assert isinstance(refused, MCPError)  # an mcpg file: a call naming no tool is -32602, as mcpg answers


async def test_mcp_pipe_switched_on_calls_only_what_the_files_trust_rules_let_its_caller_call(tmp_path: Path) -> None:
    doc = yaml.safe_load(ORDERS.read_text())
    del doc["governance"]["policy"]  # mcpg's default floor: header_asserted
    for binding in doc["mcp"]["capabilities"]["tools"]:
        del binding["governance"]
    environ = {"ORDERS_DB": str(tmp_path / "orders.db"), "MCPIPE_MCPG_PIPE": "1"}
    names, piped = await _listed_and_piped(yaml.safe_dump(doc), environ)
    assert "orders.db" not in names  # an anonymous caller sees none of the bindings
    assert piped.is_error and piped.structured_content["error_code"] == "FORBIDDEN"  # refused before it ran
    assert [p["location"] for p in piped.structured_content["problems"]] == ["steps[0].tool", "steps[1].tool"]


@pytest.mark.parametrize(
    ("args", "status", "line"),
    [
        (["check", "--config", str(ORDERS)], 0, "; no mcp_pipe: an mcpg file serves none, as mcpg does: set "
         "MCPIPE_MCPG_PIPE=1 to serve it beside the bindings"),
        (["call", "mcp_pipe", "{}", "--config", str(ORDERS)], 2, "mcpipe call: error: no tool `mcp_pipe`: an mcpg "
         "file serves none, as mcpg does: set MCPIPE_MCPG_PIPE=1 to serve it beside the bindings"),
    ],
)  # fmt: skip
def test_the_command_line_says_an_mcpg_file_serves_no_mcp_pipe_and_how_to_serve_it(tmp_path, args, status, line):
    env = {**{k: v for k, v in os.environ.items() if k != "MCPIPE_MCPG_PIPE"}, "ORDERS_DB": str(tmp_path / "o.db")}
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == status, done.stderr
    assert line in (done.stdout + done.stderr)
