"""The model client against a real OpenAI-compatible server on 127.0.0.1 answering from a script."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.llm import fake_openai, http_error, text, tool_call
from mcpipe.models import (
    Message,
    ModelConfig,
    ModelError,
    ModelOutputError,
    Models,
    OpenAIModel,
    ToolCall,
    ToolSpec,
    converse,
    load_models,
    parse_json,
)
from mcpipe.tools import ToolContext

WAIT_S = 10
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def model(url: str, **kw: Any) -> OpenAIModel:
    return OpenAIModel("gpt-test", ModelConfig(base_url=url, **kw), environ={"OPENAI_API_KEY": "sk-test"})


async def test_a_plain_answer_comes_back_with_the_request_built_from_the_preset() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("Hello there")) as fake:
            m = model(fake.url, model="gpt-4o-mini", params={"temperature": 0.2})
            out = await converse(m, [Message.system("Be brief."), Message.user("Hi")], ToolContext(), key="t")
    assert out.text == "Hello there" and out.data is None and out.attempts == 1
    [request] = fake.requests
    assert request["model"] == "gpt-4o-mini" and request["temperature"] == 0.2
    assert request["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert fake.headers[0]["authorization"] == "Bearer sk-test"


async def test_the_standard_environment_variables_name_the_endpoint_and_key() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("ok")) as fake:
            models = Models({}, environ={"OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "sk-env"})
            out = await converse(models.get("gpt-5"), [Message.user("x")], ToolContext(), key="t")
    assert out.text == "ok"
    assert fake.requests[0]["model"] == "gpt-5"
    assert fake.headers[0]["authorization"] == "Bearer sk-env"


async def test_a_preset_reads_its_own_key_variable_and_sends_no_key_when_it_is_unset() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("a"), text("b")) as fake:
            env = {"MY_KEY": "sk-mine"}
            mine = OpenAIModel("m", ModelConfig(base_url=fake.url, api_key_env="MY_KEY"), environ=env)
            none = OpenAIModel("m", ModelConfig(base_url=fake.url, api_key_env="UNSET_KEY"), environ=env)
            await converse(mine, [Message.user("x")], ToolContext(), key="t")
            await converse(none, [Message.user("x")], ToolContext(), key="t")
    assert fake.headers[0]["authorization"] == "Bearer sk-mine"
    assert "authorization" not in fake.headers[1]


async def test_malformed_json_is_sent_back_with_the_reason_and_the_retry_is_used() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("Sure! {city: Paris"), text('```json\n{"city": "Paris"}\n```')) as fake:
            out = await converse(model(fake.url), [Message.user("Where?")], ToolContext(), key="t", json_schema=SCHEMA)
    assert out.data == {"city": "Paris"} and out.attempts == 2
    first, second = fake.requests
    assert first["response_format"]["type"] == "json_schema"
    assert first["response_format"]["json_schema"]["schema"] == SCHEMA
    retry = second["messages"][-1]
    assert retry["role"] == "user" and "not valid JSON" in retry["content"]
    assert second["messages"][-2] == {"role": "assistant", "content": "Sure! {city: Paris"}


async def test_an_answer_off_the_schema_is_retried_too() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text('{"town": "Paris"}'), text('{"city": "Paris"}')) as fake:
            out = await converse(model(fake.url), [Message.user("Where?")], ToolContext(), key="t", json_schema=SCHEMA)
    assert out.data == {"city": "Paris"}
    assert "'city' is a required property" in fake.requests[1]["messages"][-1]["content"]


async def test_still_malformed_after_the_configured_retries_fails_with_the_last_answer() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("no"), text("still no")) as fake:
            with pytest.raises(ModelOutputError) as caught:
                await converse(model(fake.url), [Message.user("x")], ToolContext(), key="t", json=True, json_retries=1)
    assert caught.value.attempts == 2 and caught.value.text == "still no"
    assert "not usable after 2 tries" in str(caught.value)
    assert len(fake.requests) == 2


async def test_the_models_tool_calls_run_in_order_and_their_results_go_back() -> None:
    ran: list[tuple[str, dict[str, Any], int]] = []

    async def run_tool(call: ToolCall, n: int) -> tuple[str, bool]:
        ran.append((call.name, call.arguments, n))
        return '{"temp": 21}', False

    weather = ToolSpec("weather", "Weather of a city", {"type": "object", "properties": {"city": {"type": "string"}}})
    with trio.fail_after(WAIT_S):
        async with fake_openai(tool_call("weather", {"city": "Oslo"}), text("It is 21 degrees.")) as fake:
            out = await converse(
                model(fake.url), [Message.user("Weather?")], ToolContext(), key="t", tools=[weather], run_tool=run_tool
            )
    assert out.text == "It is 21 degrees." and out.attempts == 2
    assert ran == [("weather", {"city": "Oslo"}, 1)]
    assert out.tool_calls == [{"name": "weather", "arguments": {"city": "Oslo"}, "ok": True, "result": '{"temp": 21}'}]
    first, second = fake.requests
    assert first["tools"][0]["function"]["name"] == "weather"
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "weather"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}


async def test_malformed_tool_arguments_and_unknown_tools_are_answered_without_calling() -> None:
    ran: list[str] = []

    async def run_tool(call: ToolCall, n: int) -> tuple[str, bool]:
        ran.append(call.name)
        return "called", False

    weather = ToolSpec("weather", "Weather", {"type": "object"})
    script = (tool_call("weather", "{city: Oslo"), tool_call("rm_rf", {}, "call_2"), text("gave up"))
    with trio.fail_after(WAIT_S):
        async with fake_openai(*script) as fake:
            out = await converse(
                model(fake.url), [Message.user("x")], ToolContext(), key="t", tools=[weather], run_tool=run_tool
            )
    assert ran == [] and out.text == "gave up"
    assert "not valid JSON" in fake.requests[1]["messages"][-1]["content"]
    assert "there is no tool 'rm_rf' here (offered: weather)" in fake.requests[2]["messages"][-1]["content"]


async def test_endless_tool_rounds_stop_at_the_limit() -> None:
    async def run_tool(call: ToolCall, n: int) -> tuple[str, bool]:
        return "again", False

    spec = ToolSpec("loop", "Loops", {"type": "object"})
    with trio.fail_after(WAIT_S):
        async with fake_openai(*[tool_call("loop", {})] * 3) as fake:
            with pytest.raises(ModelError, match="more than 2 rounds"):
                await converse(
                    model(fake.url),
                    [Message.user("x")],
                    ToolContext(),
                    key="t",
                    tools=[spec],
                    run_tool=run_tool,
                    max_tool_rounds=2,
                )


async def test_an_http_error_of_the_endpoint_is_a_model_error_naming_it() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai(http_error(429, "Rate limit reached")) as fake:
            with pytest.raises(ModelError, match="answered HTTP 429: Rate limit reached"):
                await converse(model(fake.url), [Message.user("x")], ToolContext(), key="t")


async def test_an_unreachable_endpoint_and_a_slow_one_fail_clearly() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_openai() as fake:
            url = fake.url
        with pytest.raises(ModelError, match=r"request to .* failed"):
            await converse(model(url), [Message.user("x")], ToolContext(), key="t")


async def test_the_sampling_model_outside_mcp_says_there_is_no_client() -> None:
    with pytest.raises(ModelError, match="this call was not made over MCP"):
        await converse(Models().get("sampling"), [Message.user("x")], ToolContext(), key="t")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("  ```json\n[1, 2]\n```  ", [1, 2]),
        ("```\n3\n```", 3),
        ("{'a': 1}", ValueError),
        ("", ValueError),
    ],
)
def test_parse_json_takes_bare_or_fenced_json(answer: str, expected: Any) -> None:
    if expected is ValueError:
        with pytest.raises(ValueError, match="not valid JSON"):
            parse_json(answer)
    else:
        assert parse_json(answer) == expected


def test_model_presets_are_checked_with_located_problems() -> None:
    presets, problems = load_models({"ok": {"base_url": "http://x/v1"}, "bad": {"colour": 1}})
    assert "ok" in presets
    assert [str(p) for p in problems] == ["models.bad.colour: unknown key `colour`"]
    _, problems = load_models({"bad": {"json_retries": 99}})
    assert problems[0].location == "models.bad.json_retries" and "<= 10" in problems[0].message


def test_params_cannot_set_what_mcpipe_sets() -> None:
    _, problems = load_models({"gpt": {"params": {"stream": True, "temperature": 0}}})
    assert [str(p) for p in problems] == ["models.gpt.params.stream: `stream` is set by mcpipe, not in params"]
