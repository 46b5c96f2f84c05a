"""piraeus's prompts served (``formats/piraeus``) under a hostile caller: a prompt renders within a bound,
measured before anything is built. Over HTTP against a real ``mcpipe serve``, ``/healthz`` probed."""

from __future__ import annotations

import json

import httpx2
import pytest

from kit.attack import served, write_config
from kit.session import open_session
from mcpipe.formats.piraeus._prompt import MAX_RENDERED_CHARS

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

TWENTY = " ".join(f"{chr(65 + i)}: {{x}}" for i in range(20))
PROMPT = {"name": "echo", "description": "says x twenty times", "prompt_template": TWENTY, "variables": ["x"]}


async def test_a_prompt_naming_a_variable_often_renders_within_the_bound(tmp_path):
    # Before: a template naming `x` 20 times turned a 3 MB argument into a 60 MB answer (RSS +65 MB after it,
    # /healthz held 0.9 s).
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "echo.json").write_text(json.dumps(PROMPT))
    config = {"audit": {"enabled": False}, "piraeus": {"prompts": "prompts/*.json", "model": "sampling"}}
    async with (
        served(write_config(tmp_path, json.dumps(config), ".json")) as server,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        session = await open_session(http, server.url)
        before = server.rss_mb()
        (status, refused), slowest = await server.probed(
            lambda: session.request("prompts/get", {"name": "echo", "arguments": {"x": "y" * 3_000_000}})
        )
        assert status == 200 and refused["error"]["code"] == -32602
        assert refused["error"]["message"] == (
            f"OUTPUT_TOO_LARGE: prompt 'echo' would render 60000079 characters, more than {MAX_RENDERED_CHARS}"
        )
        assert slowest < 1.0, server.health
        assert server.rss_mb() - before < 40
        _, fine = await session.request("prompts/get", {"name": "echo", "arguments": {"x": "hi"}})
        assert fine["result"]["messages"][0]["content"]["text"].startswith("A: hi B: hi")
