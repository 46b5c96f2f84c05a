"""Playbooks (seed 004): parsed, checked with located errors, compiled to pipeline steps and run end to end
against a scripted OpenAI-compatible server and a real HTTP API on 127.0.0.1, and served as tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client

from kit.llm import BROKEN, LOOKUPS, Sampler, fake_api, fake_openai, http_error, lookup_playbook, text, tool_call
from mcpipe.config import ConfigError, parse_config
from mcpipe.declared import HttpPolicy, PlanTool, StepPolicy
from mcpipe.formats.noetl import compile_playbook, load_playbook, playbook_tool
from mcpipe.models import ModelConfig, Models
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

HERE = Path(__file__).parent
RESEARCH = HERE / "playbooks" / "research.yaml"
WAIT_S = 15
LOCAL = StepPolicy(http=HttpPolicy(allowed_hosts=["127.0.0.1"]))


def research(model_url: str, api_url: str) -> PlanTool:
    raw = yaml.safe_load(RESEARCH.read_text())
    raw["workload"]["api"] = api_url
    pb, problems = compile_playbook(raw, models=Models({"gpt-4o": ModelConfig(base_url=model_url)}), policy=LOCAL)
    assert problems == [] and pb is not None
    return playbook_tool(pb)


async def test_a_resource_a_tool_and_a_turn_run_end_to_end_with_their_events_in_order() -> None:
    events: list[dict[str, Any]] = []
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(tool_call("search_docs", {"query": "refund window"}), text("Refunds take 14 days."))
            answer = await research(fake.url, api.url).run({"query": "refunds"}, on_event=events.append)
    assert answer["ok"], answer["error"]
    assert answer["answer"] == "Refunds take 14 days."
    assert [(e["type"], e.get("id"), e.get("kind") or e.get("tool")) for e in events] == [
        ("started", None, None),
        ("step_started", "resource_kb_articles", "resource"),
        ("step_finished", "resource_kb_articles", "resource"),
        ("step_started", "turn_t1", "model_turn"),
        ("tool_call_started", "turn_t1", "search_docs"),
        ("tool_call_finished", "turn_t1", "search_docs"),
        ("turn_saved", "turn_t1", None),
        ("step_finished", "turn_t1", "model_turn"),
        ("completed", None, None),
    ]
    saved = events[6]
    assert saved["storage"] == "event_log" and saved["result"]["text"] == "Refunds take 14 days."
    # The tool ran with the model's arguments over the playbook's input.
    assert api.requests[0]["path"] == "/search" and api.requests[0]["query"] == {"q": "refund window"}
    first, second = fake.requests
    assert first["model"] == "gpt-4o" and first["temperature"] == 0.2
    assert first["tools"][0]["function"]["name"] == "search_docs"
    assert first["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"query": {"type": "string"}},
    }
    system, user = first["messages"]
    assert system == {"role": "system", "content": "You are a helpful assistant."}
    assert user["content"] == (
        'Resource kb_articles:\n[{"id":1,"title":"Refunds","topic":"billing"}]\n\n'
        "What are key points about billing for refunds?\n\n"
        "Summarize the following text:\nrefunds\n"
    )
    assert json.loads(second["messages"][-1]["content"]) == {"hits": [{"title": "About refund window"}]}
    turn = answer["steps"]["turn_t1"]["output"]
    assert turn["tool_calls"][0]["name"] == "search_docs"
    assert turn["usage"] == {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}  # two answers


async def test_a_turn_with_an_output_schema_answers_its_parsed_json_after_a_retry() -> None:
    doc = {
        "metadata": {"path": "x/y", "name": "structured"},
        "mcp": {
            "models": [{"name": "m"}],
            "turns": [
                {"name": "draft", "model": "m", "user": [{"text": "Name a city for {{ input.who }}"}]},
                {
                    "name": "pick",
                    "model": "m",
                    "user": [{"use": "turn:draft"}, {"text": "As JSON, please."}],
                    "output_schema": {"type": "object", "required": ["city"]},
                },
            ],
        },
    }
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("Oslo"), text("city: Oslo"), text('{"city": "Oslo"}')) as fake:
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            answer = await playbook_tool(pb).run({"who": "Ann"})
    assert answer["ok"] and answer["answer"] == {"city": "Oslo"}
    assert fake.requests[1]["messages"][0]["content"] == "Oslo\n\nAs JSON, please."
    assert "not valid JSON" in fake.requests[2]["messages"][-1]["content"]


async def test_a_missing_input_fails_the_turn_naming_the_template() -> None:
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            answer = await research(fake.url, api.url).run({})
    assert not answer["ok"] and answer["error_code"] == "INTERPOLATION_FAILED"
    assert "mcp.turns[0].user[1].text: 'dict object' has no attribute 'query'" in answer["error"]
    assert fake.requests == []


async def test_a_template_cannot_reach_python_internals() -> None:
    doc = {
        "metadata": {"path": "x", "name": "escape"},
        "mcp": {
            "models": [{"name": "m"}],
            "turns": [{"name": "t", "model": "m", "user": [{"text": "{{ input.__class__.__mro__ }}"}]}],
        },
    }
    pb, _ = compile_playbook(doc)
    assert pb is not None
    answer = await playbook_tool(pb).run({})
    assert not answer["ok"] and "refused by the sandbox" in answer["error"]


def test_every_unresolved_name_and_duplicate_is_a_located_error(tmp_path: Path) -> None:
    f = tmp_path / "playbook.yaml"
    f.write_text(BROKEN)
    pb, problems = load_playbook(f)
    assert pb is None
    lines = [str(p).replace(str(tmp_path) + "/", "") for p in problems]
    assert lines == [
        "playbook.yaml:6: mcp.models[1].name: duplicate model `gpt-5` (first at mcp.models[0])",
        "playbook.yaml:20: mcp.prompts[0].template: template syntax error: unexpected end of template, "
        "expected 'end of print statement'. (line 1)",
        # NoETL's postgres tool fields, mapped by mcpipe.formats.noetl.toolkinds
        "playbook.yaml:13: mcp.tools[1].spec.auth: postgres tool: `auth` (a credential: the config's [sql.NAME]) "
        "is required",
        "playbook.yaml:13: mcp.tools[1].spec.command: postgres tool: no SQL; give `command` (or query, queries, "
        "commands, cmd, cmds, or their _b64 forms)",
        "playbook.yaml:25: mcp.turns[0].user[0].use: unknown resource `kbb` (did you mean `kb`?)",
        "playbook.yaml:26: mcp.turns[0].user[1].use: unknown prompt `summarise` (did you mean `summarize`?)",
        "playbook.yaml:27: mcp.turns[1]: a template reads `resources.nope`, an unknown resource",
        "playbook.yaml:27: mcp.turns[1]: a template reads `turns.t3`, not an earlier turn",
        "playbook.yaml:27: mcp.turns[1]: a template reads `secret`, which is not defined "
        "(roots: input, workload, secrets, resources, turns, prompts, context, args, mcp)",
        "playbook.yaml:28: mcp.turns[1].model: unknown model `gpt5` (did you mean `gpt-5`?)",
        "playbook.yaml:32: mcp.turns[1].save: `save` takes `storage: event_log` (the run's events), "
        "got {'storage': 's3'}",
        "playbook.yaml:31: mcp.turns[1].tools_allowed[1]: unknown tool `serch` (did you mean `search`?)",
        "playbook.yaml:1: metadata.path: is required",
    ]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("metadata: {name: x, path: y}\nmcp: {turns: []}\nwat: 1\n", "wat: unknown key `wat`"),
        ("metadata: [1]\n", "metadata: must be an object, got array"),
        (
            "metadata: {name: 'a b', path: y}\nmcp: {models: [{name: m}], turns: [{name: t, model: m, user: [hi]}]}\n",
            "metadata.name: a playbook's name is its tool name",
        ),
        (
            "metadata: {name: x, path: y}\nmcp: {tools: [{type: http, spec: {url: u}}]}\n",
            "mcp.tools[0].name: every tool needs a `name`",
        ),
        (
            "metadata: {name: x, path: y}\nworkflow: [{step: start, next: nowhere}]\n",
            "workflow[0].next: unknown step `nowhere`",
        ),
        ("metadata: {name: x, path: y}\nworkflow: [{step: a}]\n", "workflow: needs a step named `start`"),
        (
            "metadata: {name: x, path: y}\nworkbook: [{name: fetch, type: value, value: 1}]\n"
            "workflow: [{step: start, next: w}, {step: w, type: workbook, task: fetc}]\n",
            "workflow[1].task: unknown workbook action `fetc` (did you mean `fetch`?)",
        ),
        (
            "metadata: {name: x, path: y}\nworkflow: [{step: start, next: a}, {step: a, next: start}]\n",
            "workflow[0]: the chain of `next` comes back to `start` (a cycle)",
        ),
        ("metadata: {name: x\n", "not valid YAML"),
    ],
)
def test_structural_problems_are_located(tmp_path: Path, doc: str, expected: str) -> None:
    f = tmp_path / "pb.yaml"
    f.write_text(doc)
    _, problems = load_playbook(f)
    assert any(expected in str(p) for p in problems), [str(p) for p in problems]


async def test_a_workflow_chains_a_workbook_action_and_a_turn() -> None:
    doc = {
        "metadata": {"path": "x", "name": "chained"},
        "workbook": [{"name": "fetch", "type": "value", "value": {"n": "{{ input.n }}"}}],
        "mcp": {
            "models": [{"name": "m"}],
            "resources": [{"name": "facts", "type": "value", "spec": {"value": "sky is blue"}}],
            "turns": [{"name": "say", "model": "m", "user": [{"use": "resource:facts"}, {"text": "go"}]}],
        },
        "workflow": [
            {"step": "start", "next": ["get"]},
            {"step": "get", "type": "workbook", "task": "fetch", "next": "talk"},
            {"step": "talk", "type": "mcp", "turn": "say", "next": "end"},
            {"step": "end"},
        ],
    }
    events: list[dict[str, Any]] = []
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("done")) as fake:
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            answer = await playbook_tool(pb).run({"n": 3}, on_event=events.append)
    assert answer["ok"] and answer["answer"] == "done"
    started = [e["id"] for e in events if e["type"] == "step_started"]
    assert started == ["task_fetch", "resource_facts", "turn_say"]
    assert answer["steps"]["task_fetch"]["output"] == {"n": 3}


ERAS = ["2026-07-28", "legacy"]


@asynccontextmanager
async def connect(app: Any, transport: str, era: str, sampler: Sampler) -> AsyncIterator[Client]:
    """An SDK client of the app, in memory or over streamable HTTP on 127.0.0.1."""
    if transport == "memory":
        async with Client(app.server, mode=era, sampling_callback=sampler) as c:
            yield c
        return
    from functools import partial

    from mcpipe.server import serve_http

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
        try:
            async with Client(url, mode=era, sampling_callback=sampler) as c:
                yield c
        finally:
            stop.set()


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_served_playbook_asks_the_clients_model_and_calls_a_server_tool(
    era: str, transport: str, tmp_path: Path
) -> None:
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "ask.yaml").write_text(
        yaml.safe_dump(
            {
                "metadata": {"path": "pb/ask", "name": "ask_client", "description": "Ask the client's model."},
                "mcp": {
                    "models": [{"name": "client", "provider": "sampling"}],
                    "resources": [
                        {"name": "now", "type": "tool", "spec": {"tool": "echo", "args": {"said": "{{ input.q }}"}}}
                    ],
                    "turns": [
                        {"name": "first", "model": "client", "user": ["Q: {{ input.q }}", {"use": "resource:now"}]},
                        {"name": "second", "model": "client", "user": ["Better: {{ turns.first.text }}"]},
                    ],
                },
            }
        )
    )
    config = tmp_path / "mcpipe.json"
    config.write_text(json.dumps({"audit": {"enabled": False}, "builtins": ["echo"], "playbooks": ["pb/*.yaml"]}))
    from mcpipe.config import load_config

    sampler = Sampler("draft one", "final one")
    with trio.fail_after(WAIT_S):
        async with open_app(load_config(config)) as app, connect(app, transport, era, sampler) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            r = await c.call_tool("ask_client", {"q": "why?"})
    assert tools["ask_client"].description == "Ask the client's model."
    assert list(tools["ask_client"].input_schema["properties"]) == ["q"]
    assert "q" in tools["ask_client"].input_schema["properties"]
    assert not r.is_error, r.content
    assert r.content[0].text == "final one"
    first, second = sampler.requests
    assert first.messages[0].content.text.startswith("Q: why?\n\nResource now:\n")
    assert "why?" in first.messages[0].content.text
    assert second.messages[0].content.text == "Better: draft one"


def test_a_config_with_a_broken_playbook_lists_its_problems_located_in_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(BROKEN)
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps({"playbooks": ["*.yaml", "none/*.yaml"]}), "json", base_dir=str(tmp_path))
    lines = [str(p) for p in caught.value.problems]
    assert any(
        line.endswith("bad.yaml:28: mcp.turns[1].model: unknown model `gpt5` (did you mean `gpt-5`?)") for line in lines
    )
    assert "playbooks[1]: no file matches `none/*.yaml`" in lines


CLI_WAIT_S = 90
"""A fresh interpreter importing the server takes seconds on a busy machine."""


async def run_cli(*args: str) -> trio.CompletedProcess[bytes]:
    import sys

    return await trio.run_process(
        [sys.executable, "-m", "mcpipe", "playbook", *args], capture_stdout=True, capture_stderr=True, check=False
    )


async def test_the_cli_checks_a_playbook_and_lists_located_problems(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(BROKEN)
    with trio.fail_after(CLI_WAIT_S):
        ok = await run_cli("check", str(RESEARCH))
        bad = await run_cli("check", str(tmp_path / "bad.yaml"))
    assert ok.returncode == 0 and ok.stdout.decode().endswith("ok (playbook `research`: 1 resource, 1 model_turn)\n")
    assert bad.returncode == 1 and bad.stdout == b""
    lines = bad.stderr.decode().splitlines()
    assert f"{tmp_path}/bad.yaml:28: mcp.turns[1].model: unknown model `gpt5` (did you mean `gpt-5`?)" in lines
    assert "Traceback" not in bad.stderr.decode()


async def test_the_cli_answers_a_file_it_cannot_use_in_one_located_line(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xfe\xff\x00")
    cases = [
        (
            str(tmp_path / "none.yaml"),
            2,
            f"mcpipe playbook check: error: cannot read {tmp_path}/none.yaml: no such file",
        ),
        (str(tmp_path), 2, f"mcpipe playbook check: error: cannot read {tmp_path}: a directory"),
        (str(tmp_path / "list.yaml"), 1, f"{tmp_path}/list.yaml: must be an object, got array"),
        (str(tmp_path / "binary.yaml"), 1, f"{tmp_path}/binary.yaml: cannot read: 'utf-8' codec can't decode"),
    ]
    for path, code, line in cases:
        with trio.fail_after(CLI_WAIT_S):
            r = await run_cli("check", path)
        said = r.stderr.decode()
        assert r.returncode == code and said.startswith(line) and said.count("\n") == 1, said


async def test_the_cli_runs_a_playbook_with_inputs_and_prints_its_events(tmp_path: Path) -> None:
    with trio.fail_after(CLI_WAIT_S):
        async with fake_api() as api, fake_openai(text("Refunds take 14 days.")) as fake:
            raw = yaml.safe_load(RESEARCH.read_text())
            raw["workload"]["api"] = api.url
            (tmp_path / "pb.yaml").write_text(yaml.safe_dump(raw))
            (tmp_path / "mcpipe.json").write_text(
                json.dumps({"audit": {"enabled": False}, "models": {"gpt-4o": {"base_url": fake.url}}})
            )
            r = await run_cli(
                "run",
                str(tmp_path / "pb.yaml"),
                "--config",
                str(tmp_path / "mcpipe.json"),
                "--input",
                "query=refunds",
                "--events",
            )
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["ok"] and answer["answer"] == "Refunds take 14 days."
    events = [json.loads(line)["type"] for line in r.stderr.decode().splitlines()]
    assert events == [
        "started",
        "step_started",
        "step_finished",
        "step_started",
        "turn_saved",
        "step_finished",
        "completed",
    ]
    assert "refunds" in fake.requests[0]["messages"][1]["content"]


async def test_the_cli_run_says_what_failed_in_one_line() -> None:
    with trio.fail_after(CLI_WAIT_S):
        r = await run_cli("run", str(RESEARCH), "--input", "bad")
    assert r.returncode == 2
    assert r.stderr.decode() == "mcpipe playbook run: error: --input takes NAME=VALUE, got 'bad'\n"


@pytest.mark.parametrize("era", ERAS)
async def test_the_clients_model_calls_a_playbook_tool_through_sampling_with_tools(era: str, tmp_path: Path) -> None:
    import mcp_types as t

    config = lookup_playbook(tmp_path)
    sampler = Sampler({"id": "u1", "name": "lookup", "input": {"said": "hello"}}, "It said hello.")
    LOOKUPS.clear()
    caps = t.SamplingCapability(tools=t.SamplingToolsCapability())
    with trio.fail_after(WAIT_S):
        async with (
            open_app(parse_config(json.dumps(config), "json", base_dir=str(tmp_path))) as app,
            Client(app.server, mode=era, sampling_callback=sampler, sampling_capabilities=caps) as c,
        ):
            r = await c.call_tool("with_tools", {"q": "x"})
    assert not r.is_error, r.content
    assert r.content[0].text == "It said hello."
    first, second = sampler.requests
    assert [tool.name for tool in first.tools] == ["lookup"]
    assert first.tools[0].input_schema["properties"] == {"said": {"type": "string"}}
    use, result = second.messages[-2], second.messages[-1]
    assert use.role == "assistant" and use.content_as_list[0].type == "tool_use"
    assert result.role == "user" and result.content_as_list[0].type == "tool_result"
    assert result.content_as_list[0].tool_use_id == "u1"
    assert '"said":"hello"' in result.content_as_list[0].content[0].text
    assert LOOKUPS == ["hello"]  # once, though a 2026-07-28 call runs again after each answer


async def test_tools_over_sampling_need_the_clients_sampling_tools_capability(tmp_path: Path) -> None:
    doc = {
        "metadata": {"path": "pb/tools", "name": "with_tools"},
        "mcp": {
            "models": [{"name": "client", "provider": "sampling"}],
            "tools": [{"name": "lookup", "type": "value", "spec": {"value": 1}}],
            "turns": [{"name": "t", "model": "client", "user": ["hi"], "tools_allowed": ["lookup"]}],
        },
    }
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump(doc))
    config = {"audit": {"enabled": False}, "builtins": False, "playbooks": ["pb.yaml"]}
    with trio.fail_after(WAIT_S):
        async with (
            open_app(parse_config(json.dumps(config), "json", base_dir=str(tmp_path))) as app,
            Client(app.server, mode="legacy", sampling_callback=Sampler("x")) as c,
        ):
            r = await c.call_tool("with_tools", {})
    assert r.is_error and "MODEL_FAILED" in r.content[0].text
    assert "no `sampling.tools` capability" in r.content[0].text


async def test_a_served_playbook_reports_its_steps_and_tool_calls_as_progress(tmp_path: Path) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(tool_call("search_docs", {"query": "x"}), text("done"))
            raw = yaml.safe_load(RESEARCH.read_text())
            raw["workload"]["api"] = api.url
            (tmp_path / "pb.yaml").write_text(yaml.safe_dump(raw))
            config = {
                "audit": {"enabled": False},
                "builtins": False,
                "playbooks": ["pb.yaml"],
                "models": {"gpt-4o": {"base_url": fake.url}},
                "outbound": {"http": {"allowed_hosts": ["127.0.0.1"]}},
            }
            async with (
                open_app(parse_config(json.dumps(config), "json", base_dir=str(tmp_path))) as app,
                Client(app.server) as c,
            ):
                r = await c.call_tool("research", {"query": "refunds"}, progress_callback=on_progress)
    assert not r.is_error, r.content
    assert seen == [
        (1.0, 2.0, "step resource_kb_articles finished (ok)"),
        (1.001, 2.0, "tool search_docs called (ok)"),
        (2.0, 2.0, "step turn_t1 finished (ok)"),
    ]


def kinds_doc(api: str, **resource: Any) -> dict[str, Any]:
    return {
        "metadata": {"path": "x", "name": "kinds"},
        "workload": {"api": api},
        "mcp": {
            "models": [{"name": "m"}],
            "resources": [{"name": "r", **resource}],
            "turns": [{"name": "t", "model": "m", "user": [{"use": "resource:r"}]}],
        },
    }


async def test_actions_are_declared_step_kinds_with_their_fields_and_jinja_templates() -> None:
    resource = {
        "type": "http",
        "spec": {
            "method": "post",
            "url": "{{ workload.api }}/echo",
            "params": {"q": "{{ input.q | upper }}"},
            "body": {"items": "{{ [input.q, input.q] }}"},
            "expected_status_codes": [200],
        },
    }
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(text("ok")) as fake:
            doc = kinds_doc(api.url, **resource)
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}), policy=LOCAL)
            assert pb is not None, problems
            answer = await playbook_tool(pb).run({"q": "ab"})
    assert answer["ok"], answer["error"]
    assert answer["steps"]["resource_r"]["output"] == {
        "method": "POST",
        "query": {"q": "AB"},
        "body": {"items": ["ab", "ab"]},
    }


def test_a_kinds_own_checks_are_located_in_the_playbook() -> None:
    unknown_field = kinds_doc("http://x", type="http", spec={"url": "{{ workload.api }}", "methd": "GET"})
    not_allowed = kinds_doc("http://x", type="http", spec={"url": "https://evil.example/x"})
    cel = kinds_doc("http://x", type="transform", spec={"expression": "args.("})
    typo = kinds_doc("http://x", type="htp", spec={})
    lines = [str(p) for d in (unknown_field, not_allowed, cel, typo) for p in compile_playbook(d, policy=LOCAL)[1]]
    assert lines == [
        "mcp.resources[0].spec.methd: unknown field `methd` for kind `http` (did you mean `method`?)",
        "mcp.resources[0].spec.url: host 'evil.example' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)",
        lines[2],
        "mcp.resources[0].type: unknown type `htp` (did you mean `http`?) (the types are the declared step kinds, "
        "see docs/playbooks.md)",
    ]
    assert lines[2].startswith("mcp.resources[0].spec.expression: invalid CEL")


async def test_a_rendered_url_off_the_allowlist_is_refused_at_run_time() -> None:
    doc = kinds_doc("http://localhost:9", type="http", spec={"url": "{{ workload.api }}/x"})
    pb, problems = compile_playbook(doc, policy=StepPolicy(http=HttpPolicy(allowed_hosts=["localhost"])))
    assert pb is not None, problems
    with trio.fail_after(WAIT_S):
        answer = await playbook_tool(pb).run({})
    assert not answer["ok"] and answer["error_code"] == "FORBIDDEN"
    assert "mcp.resources[0]: host 'localhost' resolves to 127.0.0.1, a loopback address" in answer["error"]


async def test_a_cel_transform_action_reads_the_pipeline_environment() -> None:
    doc = kinds_doc("http://x", type="transform", spec={"expression": "args.n * 2"})
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("ok")) as fake:
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            answer = await playbook_tool(pb).run({"n": 21})
    assert answer["ok"] and answer["steps"]["resource_r"]["output"] == 42
    assert fake.requests[0]["messages"][0]["content"] == "Resource r:\n42"


def two_calls(*calls: tuple[str, str]) -> dict[str, Any]:
    """A scripted answer calling several tools in one round."""
    return {
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}} for name, cid in calls
            ],
        },
        "finish_reason": "tool_calls",
    }


async def test_parallel_tool_calls_run_a_rounds_calls_at_once_and_answer_in_the_order_asked() -> None:
    from mcpipe.tools import ToolRegistry

    released = trio.Event()
    registry = ToolRegistry()

    @registry.tool
    async def wait_for_release() -> str:
        """Waits until the other tool has run: serially, it would wait forever."""
        await released.wait()
        return "released"

    @registry.tool
    def release() -> str:
        """Lets the other tool go on."""
        released.set()
        return "go"

    doc = {
        "metadata": {"path": "x", "name": "together"},
        "mcp": {
            "models": [{"name": "m"}],
            "tools": [
                {"name": "first", "type": "tool", "spec": {"tool": "wait_for_release"}},
                {"name": "second", "type": "tool", "spec": {"tool": "release"}},
            ],
            "turns": [
                {
                    "name": "t",
                    "model": "m",
                    "user": ["go"],
                    "tools_allowed": ["first", "second"],
                    "parallel_tool_calls": True,
                }
            ],
        },
    }
    with trio.fail_after(WAIT_S):
        async with fake_openai(two_calls(("first", "a"), ("second", "b")), text("both done")) as fake:
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            answer = await playbook_tool(pb, registry=registry).run({})
    assert answer["ok"] and answer["answer"] == "both done"
    results = fake.requests[1]["messages"][-2:]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [("a", "released"), ("b", "go")]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ prompts.p.template | render({'input': {'text': input.q}}) }}", "Say: {{ 1 + 1 }}"),
        ("{{ input.q | render }}", "only a prompt's template (prompts.NAME.template) can be rendered"),
        ("{{ 'a' * 10**9 }}", "`*` would build 1000000000 items"),
        ("{{ 2 ** 100000 }}", "the power 2 ** 100000 is too large"),
        ("{{ range(10**9) | list }}", "MAX_RANGE"),
        ("{{ input.__class__ }}", "refused by the sandbox"),
    ],
)
async def test_templates_render_prompts_but_never_caller_text_and_cannot_blow_up(template: str, expected: str) -> None:
    doc = {
        "metadata": {"path": "x", "name": "sandboxed"},
        "mcp": {
            "models": [{"name": "m"}],
            "prompts": [{"name": "p", "template": "Say: {{ input.text }}"}],
            "turns": [{"name": "t", "model": "m", "user": [template]}],
        },
    }
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("ok")) as fake:
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            answer = await playbook_tool(pb).run({"q": "{{ 1 + 1 }}"})
    if answer["ok"]:
        assert fake.requests[0]["messages"][0]["content"] == expected  # the caller's text stays text
    else:
        assert expected in answer["error"] and answer["error_code"] == "INTERPOLATION_FAILED"
        assert fake.requests == []


async def test_secrets_come_from_mcpipe_secret_variables_and_a_missing_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCPIPE_SECRET_API_TOKEN", "s3cret")
    spec = {"url": "{{ workload.api }}/echo", "headers": {"authorization": "Bearer {{ secrets.api_token }}"}}
    missing = {"url": "{{ workload.api }}/echo", "headers": {"authorization": "{{ secrets.other }}"}}
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(text("ok")) as fake:
            models = Models({"m": ModelConfig(base_url=fake.url)})
            pb, _ = compile_playbook(kinds_doc(api.url, type="http", spec=spec), models=models, policy=LOCAL)
            bad, _ = compile_playbook(kinds_doc(api.url, type="http", spec=missing), models=models, policy=LOCAL)
            assert pb is not None and bad is not None
            ok = await playbook_tool(pb).run({})
            failed = await playbook_tool(bad).run({})
    assert ok["ok"] and ok["steps"]["resource_r"]["output"]["authorization"] == "Bearer s3cret"
    assert not failed["ok"] and failed["error_code"] == "INTERPOLATION_FAILED"
    assert "mcp.resources[0].spec" in failed["error"] and "'other'" in failed["error"]


async def test_a_call_argument_overrides_the_workload_value_of_the_same_name() -> None:
    doc = {
        "metadata": {"path": "x", "name": "w"},
        "workload": {"topic": "billing", "tone": "kind"},
        "mcp": {
            "models": [{"name": "m"}],
            "turns": [{"name": "t", "model": "m", "user": ["{{ workload.topic }}/{{ workload.tone }}"]}],
        },
    }
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("a"), text("b")) as fake:
            pb, _ = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None
            await playbook_tool(pb).run({})
            await playbook_tool(pb).run({"topic": "refunds", "unrelated": 1})
    assert [r["messages"][0]["content"] for r in fake.requests] == ["billing/kind", "refunds/kind"]


async def test_a_failing_turn_ends_the_run_with_its_events_and_code() -> None:
    events: list[dict[str, Any]] = []
    with trio.fail_after(WAIT_S):
        async with fake_api() as api, fake_openai(http_error(503, "overloaded")) as fake:
            answer = await research(fake.url, api.url).run({"query": "x"}, on_event=events.append)
    assert not answer["ok"] and answer["error_code"] == "MODEL_FAILED"
    assert "mcp.turns[0]: model 'gpt-4o': " in answer["error"] and "HTTP 503: overloaded" in answer["error"]
    assert [(e["type"], e.get("ok")) for e in events] == [
        ("started", None),
        ("step_started", None),
        ("step_finished", True),
        ("step_started", None),
        ("step_finished", False),
        ("failed", None),
    ]
    assert events[-1]["error_code"] == "MODEL_FAILED"


@pytest.mark.parametrize(
    ("section", "entry", "expected"),
    [
        ("tools", {"name": "a", "type": "value", "spec": {"value": 1}}, "mcp.tools[1].name: duplicate tool `a`"),
        (
            "resources",
            {"name": "a", "type": "value", "spec": {"value": 1}},
            "mcp.resources[1].name: duplicate resource `a`",
        ),
        ("prompts", {"name": "a", "template": "x"}, "mcp.prompts[1].name: duplicate prompt `a`"),
        ("turns", {"name": "a", "model": "m", "user": ["x"]}, "mcp.turns[1].name: duplicate turn `a`"),
    ],
)
def test_every_duplicate_name_is_a_located_error(section: str, entry: dict[str, Any], expected: str) -> None:
    mcp: dict[str, Any] = {"models": [{"name": "m"}], "turns": [{"name": "t", "model": "m", "user": ["x"]}]}
    mcp[section] = [entry, entry]
    _, problems = compile_playbook({"metadata": {"path": "x", "name": "dup"}, "mcp": mcp})
    assert any(str(p).startswith(expected) for p in problems), [str(p) for p in problems]


def test_a_duplicate_workbook_action_and_workflow_step_are_located_errors() -> None:
    doc = {
        "metadata": {"path": "x", "name": "dup"},
        "workbook": [{"name": "w", "type": "value", "value": 1}, {"name": "w", "type": "value", "value": 2}],
        "workflow": [{"step": "start", "next": "a"}, {"step": "a", "type": "workbook", "task": "w"}, {"step": "a"}],
    }
    lines = [str(p) for p in compile_playbook(doc)[1]]
    assert "workbook[1].name: duplicate workbook action `w` (first at workbook[0])" in lines
    assert "workflow[2].step: duplicate step `a` (first at workflow[1])" in lines


async def test_arguments_off_a_tools_input_schema_are_sent_back_without_running_it() -> None:
    doc = {
        "metadata": {"path": "x", "name": "strict"},
        "mcp": {
            "models": [{"name": "m"}],
            "tools": [
                {
                    "name": "lookup",
                    "type": "value",
                    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                    "spec": {"value": "{{ args.n * 2 }}"},
                }
            ],
            "turns": [{"name": "t", "model": "m", "user": ["go"], "tools_allowed": ["lookup"]}],
        },
    }
    events: list[dict[str, Any]] = []
    script = (tool_call("lookup", {"n": "three"}), tool_call("lookup", {"n": 3}, "call_2"), text("6"))
    with trio.fail_after(WAIT_S):
        async with fake_openai(*script) as fake:
            pb, problems = compile_playbook(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            answer = await playbook_tool(pb).run({}, on_event=events.append)
    assert answer["ok"] and answer["answer"] == "6"
    refused = fake.requests[1]["messages"][-1]["content"]
    assert refused.startswith("not called: the arguments do not match the tool's input schema (n: 'three' is not")
    assert fake.requests[2]["messages"][-1]["content"] == "6"
    assert [e["n"] for e in events if e["type"] == "tool_call_finished"] == [2]


async def test_templates_read_the_mcp_section_as_seed_004_writes_it() -> None:
    doc = {
        "metadata": {"path": "x", "name": "seedish"},
        "mcp": {
            "models": [{"name": "gpt-4o", "provider": "openai", "params": {"temperature": 0.2}}],
            "tools": [{"name": "search_docs", "type": "value", "spec": {"value": 1}}],
            "turns": [
                {
                    "name": "t1",
                    "model": "gpt-4o",
                    "user": ["{{ mcp.models['gpt-4o'].name }} may use {{ mcp.turns.t1.tools_allowed | join(',') }}"],
                    "tools_allowed": ["search_docs"],
                }
            ],
        },
    }
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("ok")) as fake:
            pb, problems = compile_playbook(doc, models=Models({"gpt-4o": ModelConfig(base_url=fake.url)}))
            assert pb is not None, problems
            assert (await playbook_tool(pb).run({}))["ok"]
    assert fake.requests[0]["messages"][0]["content"] == "gpt-4o may use search_docs"


def test_the_served_input_names_are_what_the_templates_read_less_what_prompt_parts_give() -> None:
    raw = yaml.safe_load(RESEARCH.read_text())
    pb, _ = compile_playbook(raw)
    assert pb is not None and pb.inputs == ["query"]  # `text` of the prompt comes from the part's inputs
    raw["mcp"]["turns"][0]["user"][2] = {"use": "prompt:summarize"}
    pb, _ = compile_playbook(raw)
    assert pb is not None and pb.inputs == ["query", "text"]


def test_kinds_that_need_the_servers_connections_say_so() -> None:
    doc = kinds_doc("http://x", type="sql", spec={"backend": "main", "sql": "select 1"})
    [problem] = compile_playbook(doc)[1]
    assert str(problem) == (
        "mcp.resources[0].type: `sql` actions are not wired to the server's connections in playbooks yet: "
        "call a declared pipeline that uses it as a `tool`"
    )
