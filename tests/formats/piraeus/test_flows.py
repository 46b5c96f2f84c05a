"""piraeus's flows (``FlowDB``: numbered steps of type ``prompt``, ``tool`` or ``service`` whose inputs read the
flow's input and earlier steps as ``${step_N_output...}``) compiled into mcpipe's plan, served as tools and
answered as piraeus's ``FlowExecuteResponse``. The service steps port piraeus's ``test_http_client.py`` and
``test_prompt_service.py`` cases (named in each test). Reached with the SDK's client; the APIs are the
stand-ins on 127.0.0.1, the model the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kit.llm import FakeOpenAI, Sampler, text
from kit.piraeus import QUOTE, StandIn, piraeus_app, rehosted, upstream
from mcpipe.config import ConfigError, parse_config

QUOTE_TOOL = "EXAMPLE_STOCK_QUOTE_CONFIG.json"
EXPLAIN = {
    "name": "explain",
    "prompt_template": "Explain {symbol} at {price}.",
    "variables": [{"name": "symbol", "type": "string"}, {"name": "price", "type": "number"}],
}


def flow(name: str, *steps: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"the {name} flow",
        "steps": [{"step": i + 1, **s} for i, s in enumerate(steps)],
    }


def exports(api: StandIn, *flows: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"tools/quote.json": rehosted(upstream(QUOTE_TOOL), api.url), "prompts/explain.json": EXPLAIN}
    out.update({f"flows/{f['name']}.json": f for f in flows})
    return out


async def test_a_flow_runs_its_steps_in_order_each_reading_earlier_outputs(
    tmp_path: Path, api: StandIn, model: FakeOpenAI
) -> None:
    """A tool step, a prompt step reading its output's fields, a service step reading the prompt's text and a
    flow input: the answer is ``FlowExecuteResponse`` with every step's output once, and its log."""
    chain = flow(
        "quote_brief",
        {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "${symbol}"}},
        {
            "type": "prompt",
            "name": "explain",
            "inputs": {"symbol": "${step_1_output.symbol}", "price": "${step_1_output.price}"},
        },
        {
            "type": "service",
            "name": "prompt",
            "inputs": {
                "instructions": "Shorten: ${not_a_whole_ref}",
                "context": "${step_2_output}",
                "response_format_prompt": "${style}",
            },
        },
    )
    model.says(text("IBM trades at 142.5."), text("IBM: 142.5"))
    async with piraeus_app(tmp_path, exports(api, chain), model_url=model.url) as app, Client(app.server) as c:
        [listed] = [t for t in (await c.list_tools()).tools if t.name == "quote_brief"]
        r = await c.call_tool("quote_brief", {"symbol": "IBM", "style": "One line."})
    assert listed.input_schema["required"] == ["symbol", "style"] and listed.description == "the quote_brief flow"
    out = r.structured_content
    assert not r.is_error and out is not None, r.content
    assert out["status"] == "success" and out["flow_name"] == "quote_brief" and out["steps_executed"] == 3
    assert out["error"] is None
    assert out["outputs"]["step_1_output"]["price"] == 142.5
    assert out["outputs"]["step_2_output"] == "IBM trades at 142.5."
    assert out["outputs"]["step_3_output"] == {"content": "IBM: 142.5", "type": "text"}
    assert [(e["step"], e["type"], e["name"], e["status"]) for e in out["execution_log"]] == [
        (1, "tool", "get_stock_quote", "success"),
        (2, "prompt", "explain", "success"),
        (3, "service", "prompt", "success"),
    ]
    assert json.loads(r.content[0].text) == out  # type: ignore[union-attr]
    first, second = model.requests
    assert first["messages"][1]["content"] == "Instructions: Explain IBM at 142.5."
    # PromptService.prompt_normal's three stages; a string holding more than one reference stays as written.
    assert second["messages"][1]["content"] == (
        "Instructions: Shorten: ${not_a_whole_ref}\n\nContext: IBM trades at 142.5.\n\nResponse Format: One line."
    )


async def test_a_failed_step_stops_the_flow_and_the_answer_says_which(tmp_path: Path, api: StandIn) -> None:
    """piraeus's flow constructor stops at the first failing step: the answer is ``status: error`` naming the
    step, the log has it in error, no later step runs, no output is repeated."""
    broken = rehosted(upstream(QUOTE_TOOL), api.url)
    broken["name"], broken["api"]["base_url"] = "broken_quote", api.url + "/status/500"
    stops = flow(
        "stops",
        {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "IBM"}},
        {"type": "tool", "name": "broken_quote", "inputs": {"symbol": "${step_1_output.symbol}"}},
        {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "NEVER"}},
    )
    files = {**exports(api, stops), "tools/broken.json": broken}
    async with piraeus_app(tmp_path, files) as app, Client(app.server) as c:
        r = await c.call_tool("stops", {})
    out = r.structured_content
    assert r.is_error and out is not None
    assert out["status"] == "error" and out["steps_executed"] == 1 and out["outputs"] is None
    assert out["error"].startswith("step 2 (tool `broken_quote`) failed: Execution error: GET ")
    assert "answered HTTP 500" in out["error"]
    assert [(e["step"], e["status"]) for e in out["execution_log"]] == [(1, "success"), (2, "error")]
    assert out["execution_log"][1]["error_code"] == "TOOL_ERROR"
    assert [r["query"].get("symbol") for r in api.requests] == ["IBM", "IBM"]


async def test_a_flow_called_without_its_inputs_runs_nothing(tmp_path: Path, api: StandIn) -> None:
    """A flow input it reads (``${symbol}``) is required: piraeus would pass the text ``${symbol}`` on."""
    needs = flow("needs_symbol", {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "${symbol}"}})
    async with piraeus_app(tmp_path, exports(api, needs)) as app, Client(app.server) as c:
        r = await c.call_tool("needs_symbol", {})
    assert r.is_error and r.structured_content is not None
    assert r.structured_content["error"] == "inputs: symbol: is required (read as ${symbol})"
    assert r.structured_content["execution_log"] == [] and api.requests == []


async def test_a_flow_step_may_call_another_flow_and_read_the_flows_input_whole(tmp_path: Path, api: StandIn) -> None:
    """A ``tool`` step names any tool, another flow included; ``${step_0_output}`` is the flow's input."""
    inner = flow("inner", {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "${symbol}"}})
    outer = flow(
        "outer",
        {"type": "tool", "name": "inner", "inputs": "${step_0_output}"},
        {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "${step_1_output.flow_name}"}},
    )
    outer["steps"][0]["inputs"] = {"symbol": "${step_0_output.symbol}"}
    async with piraeus_app(tmp_path, exports(api, inner, outer)) as app, Client(app.server) as c:
        r = await c.call_tool("outer", {"symbol": "MSFT"})
    out = r.structured_content
    assert out is not None and out["status"] == "success", r.content
    assert out["outputs"]["step_1_output"]["outputs"]["step_1_output"]["symbol"] == "MSFT"
    assert out["outputs"]["step_2_output"]["symbol"] == "inner"


async def test_the_execute_service_answers_piraeus_execute_response(tmp_path: Path, api: StandIn) -> None:
    """``service: execute`` (``/execute``, ``HTTPClientService.execute``), porting ``test_http_client.py``:
    ``test_http_client_get_request``, ``..._with_headers``, ``..._with_query_params``,
    ``..._post_request_with_json``, ``..._put_request``, ``..._patch_request``, ``..._delete_request``,
    ``..._empty_response_body``, ``..._non_json_response``, ``..._4xx_error``, ``..._response_headers``,
    ``..._execution_time_tracking`` and ``..._returns_http_response_spec``: a 4xx is a success carrying it, a 5xx
    an error (``..._max_retries_exceeded``, without the retries)."""
    specs = {
        "get": {
            "method": "GET",
            "url": f"{api.url}/query",
            "headers": {"X-Trace": "1"},
            "query_params": {"function": "GLOBAL_QUOTE", "symbol": "IBM"},
        },
        "post": {"method": "POST", "url": f"{api.url}/v1/items", "body": {"name": "pen"}},
        "put": {"method": "PUT", "url": f"{api.url}/v1/items", "body": {"name": "pen"}},
        "patch": {"method": "PATCH", "url": f"{api.url}/v1/items", "body": {"name": "ink"}},
        "delete": {"method": "DELETE", "url": f"{api.url}/empty"},
        "text": {"method": "GET", "url": f"{api.url}/text"},
        "not_found": {"method": "GET", "url": f"{api.url}/status/404"},
        "server_error": {"method": "GET", "url": f"{api.url}/status/503"},
    }
    flows = [
        flow(f"x_{k}", {"type": "service", "name": "execute", "inputs": {"http_spec": v}}) for k, v in specs.items()
    ]
    async with piraeus_app(tmp_path, exports(api, *flows)) as app, Client(app.server) as c:
        got = {k: (await c.call_tool(f"x_{k}", {})).structured_content for k in specs}
    data = {k: (v or {})["outputs"]["step_1_output"]["data"] for k, v in got.items() if k != "server_error"}
    assert data["get"]["status_code"] == 200 and data["get"]["body"] == {"Global Quote": QUOTE}
    assert data["get"]["headers"]["content-type"] == "application/json" and data["get"]["execution_time_ms"] >= 0
    assert set(data["get"]) == {"status_code", "headers", "body", "execution_time_ms"}
    assert data["post"]["body"] == {"id": 7, "received": {"name": "pen"}} and data["post"]["status_code"] == 201
    assert data["put"]["body"]["received"] == {"name": "pen"} and data["patch"]["body"]["received"] == {"name": "ink"}
    assert data["delete"]["status_code"] == 204 and data["delete"]["body"] is None
    assert data["text"]["body"] == "plain words"
    assert data["not_found"]["status_code"] == 404 and data["not_found"]["body"] == {"error": "status 404"}
    assert got["not_found"] is not None and got["not_found"]["outputs"]["step_1_output"]["status"] == "success"
    failed = got["server_error"]
    assert failed is not None and failed["status"] == "error"
    assert (
        failed["error"]
        == f"step 1 (service `execute`) failed: service `execute`: Server error '503' for url '{api.url}/status/503'"
    )
    sent = {(r["method"], r["path"]): r for r in api.requests}
    assert sent[("GET", "/query")]["headers"]["x-trace"] == "1"
    assert sent[("POST", "/v1/items")]["headers"]["content-type"] == "application/json"


async def test_the_prompt_services_build_piraeus_prompts_and_requests(
    tmp_path: Path, api: StandIn, model: FakeOpenAI
) -> None:
    """``service: prompt`` ports ``test_prompt_service.py``'s ``test_prompt_with_single_stage`` (only
    ``Instructions:``), ``test_prompt_templates_applied_correctly`` (the normal-mode system prompt);
    ``prompt-mcp`` (``test_prompt_mcp_mode_http_spec``) answers the model's ``HTTPRequestSpec`` dumped whole, and
    ``prompt-execute`` runs it; the ``workflow`` service answers a ``WorkflowResponse``."""
    spec = {"method": "GET", "url": f"{api.url}/query", "query_params": {"function": "GLOBAL_QUOTE", "symbol": "AAPL"}}
    pick = {"tool": "get_stock_quote", "method": "GET", "url": f"{api.url}/query", "query_params": {"symbol": "IBM"}}
    model.says(text("Hello world!"), text(json.dumps(spec)), text(json.dumps(spec)), text(json.dumps(pick)))
    docs = "Stock API: GET {url}?function=GLOBAL_QUOTE&symbol=..."
    flows = [
        flow("say", {"type": "service", "name": "prompt", "inputs": {"instructions": "Say hello"}}),
        flow(
            "plan",
            {"type": "service", "name": "prompt_mcp", "inputs": {"instructions": "AAPL quote", "api_docs": docs}},
        ),
        flow(
            "plan_run",
            {"type": "service", "name": "prompt-execute", "inputs": {"instructions": "AAPL", "api_docs": docs}},
        ),
        flow(
            "wf",
            {
                "type": "service",
                "name": "workflow",
                "inputs": {"user_instructions": "IBM?", "tool_ids": ["get_stock_quote"]},
            },
        ),
    ]
    async with piraeus_app(tmp_path, exports(api, *flows), model_url=model.url) as app, Client(app.server) as c:
        say, plan, run, wf = [(await c.call_tool(n, {})).structured_content for n in ("say", "plan", "plan_run", "wf")]
    assert say is not None and say["outputs"]["step_1_output"] == {"content": "Hello world!", "type": "text"}
    system, user = model.requests[0]["messages"]
    assert (
        system["content"].startswith("You are a helpful AI assistant.") and user["content"] == "Instructions: Say hello"
    )
    assert plan is not None and plan["outputs"]["step_1_output"] == {
        "content": {**spec, "headers": None, "body": None},
        "type": "http_spec",
    }
    assert "API Documentation:\nStock API" in model.requests[1]["messages"][1]["content"]
    assert run is not None and run["outputs"]["step_1_output"]["data"]["body"]["Global Quote"]["01. symbol"] == "AAPL"
    assert wf is not None and wf["outputs"]["step_1_output"]["selected_tool"] == "get_stock_quote"
    assert wf["outputs"]["step_1_output"]["http_spec"]["query_params"]["apikey"] == "***"


def problems(tmp_path: Path, files: dict[str, Any], **section: Any) -> list[str]:
    for name, data in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    doc = {"piraeus": {"tools": "tools/*.json", "prompts": "prompts/*.json", "flows": "flows/*.json", **section}}
    try:
        parse_config(json.dumps(doc), "json", base_dir=str(tmp_path))
    except ConfigError as e:
        return [str(p) for p in e.problems]
    return []


def test_every_problem_of_a_flow_file_is_located_one_line_each(tmp_path: Path) -> None:
    """The ``FlowStep`` model's checks (types, numbers 1..n) and what mcpipe checks before serving: references
    to steps that do not run before, unknown prompts and services, a prompt's variables, a flow calling itself."""
    bad = {
        "name": "bad",
        "steps": [
            {"step": 1, "type": "prompt", "name": "explian", "inputs": {}},
            {
                "step": 2,
                "type": "prompt",
                "name": "explain",
                "inputs": {"symbol": "${step_3_output}", "price": "high", "x": 1},
            },
            {"step": 3, "type": "service", "name": "emails", "inputs": {}},
            {"step": 4, "type": "tool", "name": "bad", "inputs": {}},
            {"step": 5, "type": "tool", "name": "get_stock_quote", "inputs": {}},
        ],
    }
    numbers = {
        "name": "numbers",
        "steps": [{"step": 1, "type": "tool", "name": "t"}, {"step": 3, "type": "lambda", "name": "t"}],
    }
    files = {
        "tools/quote.json": upstream(QUOTE_TOOL),
        "prompts/explain.json": EXPLAIN,
        "flows/bad.json": bad,
        "flows/numbers.json": numbers,
        "flows/loop.json": [
            flow("ping", {"type": "tool", "name": "pong"}),
            flow("pong", {"type": "tool", "name": "ping"}),
        ],
    }
    assert problems(tmp_path, files) == [
        "flows/numbers.json: steps[1].type: expected one of prompt, tool, service, got 'lambda'",
        "flows/bad.json: steps[0].name: no prompt `explian` (did you mean `explain`?)",
        "flows/bad.json: steps[1].inputs.symbol: `${step_3_output}` reads step 3, which does not run before step 2",
        "flows/bad.json: steps[1].inputs.price: expected a number, got 'high'",
        "flows/bad.json: steps[1].inputs.x: prompt `explain` has no variable `x`",
        "flows/bad.json: steps[2].name: no service `emails` "
        "(known: prompt, prompt-mcp, execute, prompt-execute, workflow)",
        "flows/bad.json: steps[3].name: flow `bad` calls itself",
        "flows/bad.json: steps[4].inputs: tool `get_stock_quote` needs `symbol`",
        "flows/loop.json: [0]: flow `ping` calls itself through other flows",
        "flows/loop.json: [1]: flow `pong` calls itself through other flows",
    ]


def test_the_workflow_service_needs_a_workflow(tmp_path: Path) -> None:
    files = {"flows/wf.json": flow("wf", {"type": "service", "name": "workflow", "inputs": {}})}
    [line] = problems(tmp_path, files, workflow=False, tools=[], prompts=[])
    assert line.startswith("flows/wf.json: steps[0].name: no service `workflow` (the workflow is not served")


@pytest.mark.parametrize(
    ("inputs", "why"),
    [
        ({"instructions": ""}, "instructions: must not be empty"),
        ({"instructions": "x", "contxt": "y"}, "contxt: unknown field (did you mean `context`?)"),
        ({"instructions": "x", "context": 3}, "context: expected a string, got number"),
    ],
)
async def test_a_service_step_whose_inputs_are_not_its_request_fails_saying_why(
    tmp_path: Path, api: StandIn, inputs: dict[str, Any], why: str
) -> None:
    broken = flow("broken", {"type": "service", "name": "prompt", "inputs": inputs})
    async with piraeus_app(tmp_path, exports(api, broken)) as app, Client(app.server) as c:
        r = await c.call_tool("broken", {})
    assert r.is_error and r.structured_content is not None
    assert r.structured_content["error"] == f"step 1 (service `prompt`) failed: service `prompt`: {why}"


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
async def test_a_prompt_step_may_ask_the_callers_model_and_no_step_runs_twice(
    tmp_path: Path, api: StandIn, era: str
) -> None:
    """With ``model = "sampling"`` a prompt step asks the calling client's model (MCP sampling, both eras). On
    2026-07-28 the call suspends for the question and is retried: the tool step before it is not called again."""
    chain = flow(
        "sampled",
        {"type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "${symbol}"}},
        {
            "type": "prompt",
            "name": "explain",
            "inputs": {"symbol": "${step_1_output.symbol}", "price": "${step_1_output.price}"},
        },
    )
    sampler = Sampler("From the client's model.")
    async with (
        piraeus_app(tmp_path, exports(api, chain)) as app,
        Client(app.server, mode=era, sampling_callback=sampler) as c,
    ):
        r = await c.call_tool("sampled", {"symbol": "IBM"})
    out = r.structured_content
    assert out is not None and out["status"] == "success", r.content
    assert out["outputs"]["step_2_output"] == "From the client's model."
    [asked] = sampler.requests
    assert asked.messages[0].content.text == "Instructions: Explain IBM at 142.5."  # type: ignore[union-attr]
    assert len(api.requests) == 1
