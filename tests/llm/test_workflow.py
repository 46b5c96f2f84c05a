"""The workflow tool (seed 002) served by the real server, called with the SDK's Client, its model a scripted
OpenAI-compatible server on 127.0.0.1 or the client itself (sampling, both eras), its API a real HTTP server
on 127.0.0.1. Every error stage is shown."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from mcp import Client

from kit.llm import FakeApi, Sampler, fake_api, fake_openai, http_error, text
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import App, open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 15
ERAS = ["2026-07-28", "legacy"]


@pytest.fixture(autouse=True)
def quote_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTE_KEY", "sk-quote-secret")


def quote_tool(base: str, **kw: Any) -> dict[str, Any]:
    return {
        "name": "get_stock_quote",
        "description": "Get a real-time stock quote",
        "base_url": base,
        "path": "/query",
        "method": "GET",
        "required_params": [{"name": "symbol", "description": "Stock ticker symbol (e.g., IBM)"}],
        "static_params": {"function": "GLOBAL_QUOTE"},
        "authenticated_params": {"apikey": {"env": "QUOTE_KEY"}},
        "output_schema": {"type": "object", "properties": {"symbol": {"type": "string"}, "price": {"type": "number"}}},
        **kw,
    }


def search_tool(base: str) -> dict[str, Any]:
    return {
        "name": "search_docs",
        "description": "Search the docs",
        "base_url": base,
        "path": "/search",
        "required_params": [{"name": "q"}],
    }


def spec(base: str, symbol: str = "IBM", **kw: Any) -> str:
    return json.dumps(
        {"tool": "get_stock_quote", "method": "GET", "url": f"{base}/query", "query_params": {"symbol": symbol}, **kw}
    )


@asynccontextmanager
async def served(model_url: str | None, api: FakeApi | None, **workflow: Any) -> AsyncIterator[App]:
    base = api.url if api is not None else "http://127.0.0.1:9"
    doc: dict[str, Any] = {
        "audit": {"enabled": False},
        "builtins": False,
        "workflow": {
            "model": "gpt" if model_url else "sampling",
            "tools": [quote_tool(base), search_tool(base)],
            **workflow,
        },
    }
    if model_url:
        doc["models"] = {"gpt": {"base_url": model_url, "json_retries": 1}}
    async with open_app(parse_config(json.dumps(doc), "json")) as app:
        yield app


async def call(app: App, args: dict[str, Any], era: str = "2026-07-28", sampler: Sampler | None = None) -> Any:
    kw = {"sampling_callback": sampler} if sampler is not None else {}
    async with Client(app.server, mode=era, **kw) as c:
        r = await c.call_tool("workflow", args)
    return r


ASK = {"user_instructions": "What is IBM trading at?", "tool_ids": ["get_stock_quote", "search_docs"]}


async def test_the_model_picks_a_tool_the_api_runs_and_the_answer_is_formatted_with_secrets_masked() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(text(spec(api.url)), text("IBM trades at $142.50."))
            async with served(fake.url, api) as app:
                r = await call(app, {**ASK, "format_response": True, "response_format_instructions": "One line."})
    assert not r.is_error, r.content
    out = r.structured_content
    assert out["status"] == "success" and out["error"] is None and out["error_stage"] is None
    assert out["selected_tool"] == "get_stock_quote"
    assert out["http_spec"] == {
        "method": "GET",
        "url": f"{api.url}/query",
        "query_params": {"symbol": "IBM", "function": "GLOBAL_QUOTE", "apikey": "***"},
    }
    assert out["raw_response"]["status_code"] == 200
    assert out["raw_response"]["body"] == {"Global Quote": {"01. symbol": "IBM", "05. price": "142.50"}}
    assert out["formatted_response"] == "IBM trades at $142.50."
    [request] = api.requests
    assert request["query"] == {"symbol": "IBM", "function": "GLOBAL_QUOTE", "apikey": "sk-quote-secret"}
    select, fmt = fake.requests
    system = select["messages"][0]["content"]
    assert "Tool: get_stock_quote" in system and "Endpoint: GET " in system and "apikey: [authenticated]" in system
    assert "sk-quote-secret" not in json.dumps(fake.requests)
    assert "One line." in fmt["messages"][-1]["content"] and "142.50" in fmt["messages"][-1]["content"]


async def test_unknown_tool_ids_fail_at_tool_retrieval_naming_them() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai() as fake, served(fake.url, None) as app:
            r = await call(app, {"user_instructions": "x", "tool_ids": ["get_stock_qoute", "nope"]})
    out = r.structured_content
    assert r.is_error and out["status"] == "error" and out["error_stage"] == "tool_retrieval"
    assert "['get_stock_qoute', 'nope']" in out["error"] and "did you mean `get_stock_quote`" in out["error"]
    assert fake.requests == []


async def test_tool_documentation_over_the_limit_fails_at_tool_context_generation() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai() as fake, served(fake.url, None, max_context_chars=100) as app:
            r = await call(app, ASK)
    out = r.structured_content
    assert out["error_stage"] == "tool_context_generation" and "more than the 100 allowed" in out["error"]
    assert fake.requests == []


async def test_malformed_json_is_retried_then_fails_at_llm_selection() -> None:
    with trio.fail_after(WAIT_S):
        script = (text("I'd call the quote API"), text("{'tool':"))
        async with fake_api() as api, fake_openai(*script) as fake, served(fake.url, api) as app:
            r = await call(app, ASK)
    out = r.structured_content
    assert out["status"] == "error" and out["error_stage"] == "llm_selection"
    assert "not usable after 2 tries" in out["error"]
    assert len(fake.requests) == 2 and api.requests == []


async def test_a_model_endpoint_failure_is_an_llm_selection_error() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(http_error(401, "Incorrect API key provided")) as fake, served(fake.url, None) as app:
            r = await call(app, ASK)
    out = r.structured_content
    assert out["error_stage"] == "llm_selection" and "HTTP 401: Incorrect API key provided" in out["error"]


async def test_a_request_off_the_tools_endpoint_is_sent_back_and_never_made() -> None:
    metadata = json.dumps(
        {"tool": "get_stock_quote", "method": "GET", "url": "http://169.254.169.254/latest/meta-data"}
    )
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(text(metadata)) as fake, served(fake.url, api) as app:
            fake.says(text(spec(api.url)))
            r = await call(app, ASK)
    out = r.structured_content
    assert out["status"] == "success" and out["selected_tool"] == "get_stock_quote"
    assert "must be the endpoint of tool 'get_stock_quote'" in fake.requests[1]["messages"][-1]["content"]
    assert [q["path"] for q in api.requests] == ["/query"]


async def test_a_model_that_insists_on_another_host_fails_at_llm_selection() -> None:
    evil = json.dumps({"tool": "get_stock_quote", "method": "GET", "url": "http://10.0.0.1/query"})
    other_path = json.dumps({"tool": "get_stock_quote", "method": "GET", "url": "http://127.0.0.1:1/admin"})
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(text(evil), text(other_path)) as fake, served(fake.url, api) as app:
            r = await call(app, ASK)
    out = r.structured_content
    assert out["error_stage"] == "llm_selection" and "must be the endpoint" in out["error"]
    assert api.requests == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"tool": "get_stock_quote", "method": "POST"}, "is called with GET, not POST"),
        ({"tool": "delete_all"}, "must be one of the offered tools"),
        ({"query_params": {}}, "required parameters of 'get_stock_quote' are missing: symbol"),
    ],
)
async def test_a_request_breaking_the_tools_rules_is_refused(answer: dict[str, Any], reason: str) -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api:
            bad = {**json.loads(spec(api.url)), **answer}
            async with fake_openai(text(json.dumps(bad)), text(json.dumps(bad))) as fake, served(fake.url, api) as app:
                r = await call(app, ASK)
    out = r.structured_content
    assert out["error_stage"] == "llm_selection" and reason in out["error"], out["error"]
    assert api.requests == []


async def test_the_model_cannot_set_a_secret_or_a_static_parameter() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api:
            sneaky = spec(api.url, query_params={"symbol": "IBM", "apikey": "mine", "function": "DELETE"})
            async with fake_openai(text(sneaky)) as fake, served(fake.url, api) as app:
                r = await call(app, ASK)
    assert r.structured_content["status"] == "success"
    assert api.requests[0]["query"]["apikey"] == "sk-quote-secret"
    assert api.requests[0]["query"]["function"] == "GLOBAL_QUOTE"


async def test_an_api_4xx_is_a_success_carrying_the_error_in_raw_response() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(text(spec(api.url, symbol=""))) as fake, served(fake.url, api) as app:
            r = await call(app, ASK)
    out = r.structured_content
    assert not r.is_error and out["status"] == "success" and out["error_stage"] is None
    assert out["raw_response"]["status_code"] == 400
    assert out["raw_response"]["body"] == {"Error Message": "symbol is required"}


async def test_an_unreachable_api_fails_at_api_execution() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text(spec("http://127.0.0.1:9"))) as fake, served(fake.url, None) as app:
            r = await call(app, ASK)
    out = r.structured_content
    assert out["status"] == "error" and out["error_stage"] == "api_execution"
    assert out["selected_tool"] == "get_stock_quote" and out["http_spec"]["query_params"]["apikey"] == "***"


async def test_a_tool_named_by_a_private_hostname_is_refused_by_the_outbound_policy() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api:
            port = api.url.rsplit(":", 1)[1]
            local = f"http://localhost:{port}"
            async with fake_openai(text(spec(local))) as fake:
                doc_api = FakeApi(url=local)
                async with served(fake.url, doc_api) as app:
                    r = await call(app, ASK)
    out = r.structured_content
    assert out["error_stage"] == "api_execution" and "loopback address, which is not allowed" in out["error"]
    assert api.requests == []


async def test_a_formatting_failure_is_not_fatal() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake, served(fake.url, api) as app:
            fake.says(text(spec(api.url)), http_error(500, "overloaded"))
            r = await call(app, {**ASK, "format_response": True})
    out = r.structured_content
    assert not r.is_error and out["status"] == "success"
    assert out["raw_response"]["status_code"] == 200 and out["formatted_response"] is None
    assert out["error_stage"] == "response_formatting" and "overloaded" in out["error"]


async def test_bad_arguments_are_one_located_line_each() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai() as fake, served(fake.url, None) as app:
            r = await call(app, {"user_instructions": "", "tool_ids": [], "format_respons": True})
    assert r.is_error
    message = r.content[0].text
    assert "format_respons: unknown argument (did you mean `format_response`?)" in message
    assert "user_instructions: a non-empty string is required" in message
    assert "tool_ids: a non-empty array" in message


@pytest.mark.parametrize("era", ERAS)
async def test_the_clients_own_model_selects_and_formats_and_the_api_runs_once(era: str) -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api:
            sampler = Sampler(spec(api.url, symbol="AAPL"), "AAPL is at $142.50.")
            async with served(None, api) as app:
                r = await call(app, {**ASK, "format_response": True}, era, sampler)
    out = r.structured_content
    assert out["status"] == "success", out
    assert out["formatted_response"] == "AAPL is at $142.50."
    assert len(api.requests) == 1 and api.requests[0]["query"]["symbol"] == "AAPL"
    select, fmt = sampler.requests
    assert "Tool: get_stock_quote" in select.system_prompt and "JSON Schema" in select.system_prompt
    assert select.messages[0].content.text == ASK["user_instructions"]
    assert "142.50" in fmt.messages[0].content.text


@pytest.mark.parametrize("era", ERAS)
async def test_a_malformed_sampled_answer_is_asked_again(era: str) -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api:
            sampler = Sampler("not json", spec(api.url))
            async with served(None, api) as app:
                r = await call(app, ASK, era, sampler)
    assert r.structured_content["status"] == "success"
    assert len(sampler.requests) == 2 and len(api.requests) == 1
    assert "not valid JSON" in sampler.requests[1].messages[-1].content.text


def test_workflow_config_problems_are_located() -> None:
    doc = {
        "workflow": {
            "model": "gtp",
            "tools": [
                quote_tool("http://api.example"),
                quote_tool("ftp://api.example"),
                {**search_tool("http://x"), "static_params": {"k": 1}, "authenticated_params": {"k": {"env": "K"}}},
            ],
        },
        "models": {"gpt": {}},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(doc), "json")
    lines = [str(p) for p in caught.value.problems]
    assert "workflow.model: unknown model `gtp` (did you mean `gpt`?)" in lines
    assert "workflow.tools[1].name: duplicate tool `get_stock_quote` (first at tools[0])" in lines
    assert any(line.startswith("workflow.tools[1].base_url: must be an http(s) URL") for line in lines)
    assert "workflow.tools[2].static_params: also authenticated: k" in lines


@asynccontextmanager
async def over_http(app: App) -> AsyncIterator[str]:
    from functools import partial

    from mcpipe.server import serve_http

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
        try:
            yield url.rsplit("/", 1)[0] + "/workflow"
        finally:
            stop.set()


async def test_post_workflow_answers_the_seeds_response_over_http() -> None:
    import httpx2

    with trio.fail_after(WAIT_S):
        async with (
            fake_api() as api,
            fake_openai() as fake,
            served(fake.url, api) as app,
            over_http(app) as url,
            httpx2.AsyncClient(trust_env=False) as http,
        ):
            fake.says(text(spec(api.url)))
            ok = await http.post(url, json=ASK)
            missing = await http.post(url, json={"user_instructions": "x", "tool_ids": ["nope"]})
            invalid = await http.post(url, json={"tool_ids": "x"})
            not_json = await http.post(url, content=b"{", headers={"content-type": "application/json"})
            get = await http.get(url)
    assert ok.status_code == 200 and ok.json()["status"] == "success"
    assert ok.json()["http_spec"]["query_params"]["apikey"] == "***"
    assert ok.json()["raw_response"]["body"]["Global Quote"]["05. price"] == "142.50"
    assert missing.status_code == 200 and missing.json()["error_stage"] == "tool_retrieval"
    assert invalid.status_code == 422
    assert invalid.json()["detail"] == [
        "user_instructions: a non-empty string is required",
        "tool_ids: a non-empty array of tool names is required",
    ]
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]
    assert get.status_code == 405 and get.headers["allow"] == "POST"


async def test_post_workflow_needs_the_bearer_token_and_the_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx2

    monkeypatch.setenv("TOKEN_A", "token-a")
    monkeypatch.setenv("TOKEN_B", "token-b")
    auth = {
        "tokens": [
            {"env": "TOKEN_A", "principal": "alice", "tools": ["workflow"]},
            {"env": "TOKEN_B", "principal": "bob", "tools": ["echo"]},
        ]
    }
    doc = {
        "audit": {"enabled": False},
        "auth": auth,
        "models": {"gpt": {"base_url": "http://127.0.0.1:9/v1"}},
        "workflow": {"model": "gpt", "tools": [search_tool("http://127.0.0.1:9")]},
    }
    with trio.fail_after(WAIT_S):
        async with (
            open_app(parse_config(json.dumps(doc), "json")) as app,
            over_http(app) as url,
            httpx2.AsyncClient(trust_env=False) as http,
        ):
            anonymous = await http.post(url, json=ASK)
            bob = await http.post(url, json=ASK, headers={"authorization": "Bearer token-b"})
            alice = await http.post(
                url,
                json={"user_instructions": "x", "tool_ids": ["zzz"]},
                headers={"authorization": "Bearer token-a"},
            )
    assert anonymous.status_code == 401
    assert bob.status_code == 403 and "may not call 'workflow'" in bob.json()["error"]
    assert alice.status_code == 200 and alice.json()["error_stage"] == "tool_retrieval"


async def test_a_post_tool_with_a_path_parameter_takes_the_body_and_only_its_own_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOTE_TOKEN", "tok-1")

    def note_tool(base: str) -> dict[str, Any]:
        return {
            "name": "add_note",
            "description": "Add a note to a user",
            "base_url": base,
            "path": "/users/{user_id}/notes",
            "method": "POST",
            "required_params": [{"name": "user_id"}, {"name": "text"}],
            "headers": {"x-client": "mcpipe"},
            "authenticated_params": {"authorization": {"env": "NOTE_TOKEN", "in": "header", "prefix": "Bearer "}},
        }

    def answer(url: str) -> str:
        return json.dumps({"tool": "add_note", "method": "POST", "url": url, "body": {"text": "hi"}})

    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(text(answer(f"{api.url}/users/42/admin")), text(answer(f"{api.url}/users/42/notes")))
            doc = {
                "audit": {"enabled": False},
                "builtins": False,
                "models": {"gpt": {"base_url": fake.url}},
                "workflow": {"model": "gpt", "tools": [note_tool(api.url)]},
            }
            async with open_app(parse_config(json.dumps(doc), "json")) as app:
                r = await call(app, {"user_instructions": "Note hi for user 42", "tool_ids": ["add_note"]})
    out = r.structured_content
    assert out["status"] == "success", out
    assert out["http_spec"] == {
        "method": "POST",
        "url": f"{api.url}/users/42/notes",
        "query_params": {},
        "headers": {"x-client": "mcpipe", "authorization": "***"},
        "body": {"text": "hi"},
    }
    assert out["raw_response"]["status_code"] == 201
    assert [q["path"] for q in api.requests] == ["/users/42/notes"]
    assert api.requests[0]["headers"]["x-client"] == "mcpipe"
    assert api.requests[0]["headers"]["authorization"] == "Bearer tok-1"
    assert "must be the endpoint of tool 'add_note'" in fake.requests[1]["messages"][-1]["content"]


async def test_an_unset_secret_fails_at_api_execution_and_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUOTE_KEY")
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake, served(fake.url, api) as app:
            fake.says(text(spec(api.url)))
            r = await call(app, ASK)
    out = r.structured_content
    assert out["error_stage"] == "api_execution"
    assert out["error"] == "the secret of `apikey` is not set (environment variable QUOTE_KEY)"
    assert api.requests == []


async def test_each_stage_done_is_a_progress_notification() -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake, served(fake.url, api) as app, Client(app.server) as c:
            fake.says(text(spec(api.url)), text("IBM: $142.50"))
            r = await c.call_tool("workflow", {**ASK, "format_response": True}, progress_callback=on_progress)
    assert r.structured_content["status"] == "success"
    assert seen == [
        (1.0, 4.0, "2 tool(s) documented for the model"),
        (2.0, 4.0, "the model chose get_stock_quote"),
        (3.0, 4.0, "the API answered HTTP 200"),
        (4.0, 4.0, "formatted"),
    ]


async def test_many_or_long_unknown_ids_give_a_bounded_message() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai() as fake, served(fake.url, None) as app:
            many = await call(app, {"user_instructions": "x", "tool_ids": [f"t{i}" for i in range(101)]})
            unknown = await call(
                app, {"user_instructions": "x", "tool_ids": ["x" * 5000, *[f"t{i}" for i in range(20)]]}
            )
    assert many.is_error and "tool_ids: at most 100 tools, got 101" in many.content[0].text
    error = unknown.structured_content["error"]
    assert error.endswith(" and 11 more") and len(error) < 400
