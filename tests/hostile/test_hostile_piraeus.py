"""piraeus's prompts served (``formats/piraeus``) under a hostile caller: a prompt renders within a bound,
measured before anything is built. Over HTTP against a real ``mcpipe serve``, ``/healthz`` probed."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, quote

import httpx2
import pytest

from kit.attack import served, write_config
from kit.llm import _answer, fake_openai, lifespan, serving, text
from kit.piraeus import rehosted, upstream
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
        assert slowest < server.stall_s, server.health
        assert server.rss_mb() - before < 40
        _, fine = await session.request("prompts/get", {"name": "echo", "arguments": {"x": "hi"}})
        assert fine["result"]["messages"][0]["content"]["text"].startswith("A: hi B: hi")


KEY = "av-k3y-0123456789abcdef"


def _echoing_api(seen: list[str]) -> Any:
    """An API refusing every request, its error body echoing the key it was sent (as many APIs do)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        key = dict(parse_qsl(scope["query_string"].decode())).get("apikey", "")
        seen.append(key)
        await _answer(send, 401, {"Error Message": f"the API key {key} is not valid ({quote(key)})", "key": key})

    return app


async def test_an_apis_error_body_reaches_neither_caller_nor_model_with_the_key_in_it(tmp_path):
    # Before: a tool's failure carried the first 200 characters of the API's error body as they were (the key
    # in them twice), and the workflow's `raw_response` its whole body, key and all.
    seen: list[str] = []
    async with serving(_echoing_api(seen)) as api, fake_openai() as model:
        model.says(text(json.dumps({"tool": "get_stock_quote", "method": "GET", "url": f"{api}/query",
                                    "query_params": {"symbol": "IBM"}})))  # fmt: skip
        tools = tmp_path / "tools"
        tools.mkdir()
        (tools / "quote.json").write_text(json.dumps(rehosted(upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json"), api)))
        config = {
            "audit": {"enabled": False},
            "models": {"gpt": {"base_url": model.url, "json_retries": 1}},
            "piraeus": {"tools": "tools/*.json", "model": "gpt", "allow_private": True},
        }
        env = {"ALPHA_VANTAGE_API_KEY": KEY}
        async with served(write_config(tmp_path, json.dumps(config), ".json"), env=env) as server:

            async def attack() -> Any:
                failed = await server.call("get_stock_quote", {"symbol": "IBM"})
                async with httpx2.AsyncClient(timeout=60, trust_env=False) as http:
                    r = await http.post(
                        server.base + "/workflow",
                        json={"user_instructions": "IBM?", "tool_ids": ["get_stock_quote"], "format_response": False},
                    )
                return failed, r.json()

            (failed, workflow), slowest = await server.probed(attack)
    assert slowest < server.stall_s, server.health
    assert seen == [KEY, KEY]  # the API had the key, both times
    text_ = failed["content"][0]["text"]
    assert failed["isError"] and "answered HTTP 401" in text_ and "[redacted]" in text_, text_
    assert KEY not in json.dumps(failed) and KEY not in json.dumps(workflow), (failed, workflow)
    assert workflow["raw_response"]["body"]["key"] == "[redacted]", workflow
