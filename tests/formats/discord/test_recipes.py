"""discord-mcp's recipes that call ``mcp_pipeline``, read from its own files (``upstream/``) and run through
mcpipe with stand-in tools of the same names and answer shapes (``kit.discord``), over the SDK's client: in
memory, over streamable HTTP, and with mcpipe fronting a discord-mcp stand-in server (stdio) by the one-line
switch. Each answer is compared with the one the recipe documents.

The recipes: ``recipes/pipeline-multistep.mdx`` (cappyeo's and jhm1909's, each with its success and its
early-abort answer), the envelope of ``architecture/pipeline.mdx``, the example in ``tools/meta/pipeline.ts``'s
description, the three pipelines of ``tools/meta/pipeline.bench.ts``, and seed 001's ``{{stepN.path}}``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from kit.clients import bearer_client
from kit.discord import SERVER, err
from kit.servers import http_server, make_config
from mcpipe.gateway import AuditLog
from mcpipe.server import open_app

UPSTREAM = Path(__file__).with_name("upstream")
CAPPYEO = UPSTREAM / "cappyeo"
JHM1909 = UPSTREAM / "jhm1909"
RECIPE = "site/src/content/docs/recipes/pipeline-multistep.mdx"


def json_blocks(path: Path) -> list[Any]:
    """The ```json blocks of a Markdown page, parsed."""
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", path.read_text(), re.S)]


def ts_literal(text: str) -> Any:
    """A TypeScript object or array literal of plain values (as the upstream sources write steps) as JSON."""
    text = text.replace("'", '"')
    text = re.sub(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:", r'\1"\2":', text)
    text = re.sub(r",(\s*[}\]])", r"\1", text)
    return json.loads(text)


def bench_pipelines() -> dict[str, list[dict[str, Any]]]:
    """The three pipelines of ``pipeline.bench.ts``, by their constant's name."""
    source = (CAPPYEO / "packages/mcp-core/src/tools/meta/pipeline.bench.ts").read_text()
    found = re.findall(r"const (\w+): readonly Step\[\] = (\[.*?\]);", source, re.S)
    return {name: ts_literal(body) for name, body in found}


def description_example() -> dict[str, Any]:
    """The example call in ``pipeline.ts``'s tool description."""
    source = (CAPPYEO / "packages/mcp-core/src/tools/meta/pipeline.ts").read_text()
    lines = re.findall(r"^\s*'(.*)',$", source.split("**Example**", 1)[1].split("**Returns**", 1)[0], re.M)
    body = [line for line in lines if line and line != "```"]
    return ts_literal("".join(body))


def shape(answer: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(s["id"], s["tool"], s["status"]) for s in answer["steps"]]


def check_success(answer: dict[str, Any], documented: dict[str, Any], *, results: bool) -> None:
    """An answer against a recipe's documented success: the same steps, statuses, keys, variables."""
    assert set(answer) == set(documented) == {"steps", "variables", "total_duration_ms", "aborted"}
    assert shape(answer) == shape(documented)
    assert answer["aborted"] is documented["aborted"] is False
    # jhm1909's older page abbreviates: some results and variables are left out of it.
    assert set(answer["variables"]) == set(documented["variables"]) or not results
    assert set(answer["variables"]) >= set(documented["variables"])
    for mine, theirs in zip(answer["steps"], documented["steps"], strict=True):
        assert set(mine) == set(theirs) | {"result"}
        if results:
            assert mine["result"] == theirs["result"]
        assert answer["variables"][mine["id"]] == mine["result"]


# --- in memory ------------------------------------------------------------------------------------------


async def test_the_multistep_recipe_answers_as_it_documents(pipeline, standins):
    call, success, _ = json_blocks(CAPPYEO / RECIPE)
    assert call["name"] == "mcp_pipeline"
    r = await pipeline(call["arguments"])
    assert r.is_error is False
    check_success(r.structured_content, success, results=True)
    # The announcement's id flowed into the event's location and description.
    event = dict(standins.calls)["events_create"]
    assert event["description"] == "Linked to announcement 888899990000111122"
    assert event["entity_metadata"]["location"].endswith("/222233334444555566/888899990000111122")
    assert r.content[0].text.startswith("**Pipeline ✅ complete** - 3/3 success (")


async def test_the_multistep_recipe_aborts_at_the_failing_step_as_it_documents(pipeline, standins):
    call, _, aborted = json_blocks(CAPPYEO / RECIPE)
    standins.respond("events_create", err("DISCORD_PERMISSION_DENIED", "Missing MANAGE_EVENTS"))
    out = (await pipeline(call["arguments"])).structured_content
    assert shape(out) == shape(aborted)  # `grant` is absent, not skipped
    assert out["steps"][1]["error"] == aborted["steps"][1]["error"]
    assert out["aborted"] is aborted["aborted"] is True
    assert set(out["variables"]) == set(aborted["variables"]) == {"announce"}
    assert standins.called() == ["messages_send", "events_create"]


async def test_the_older_multistep_recipe_runs_and_aborts_as_its_code_does(pipeline, standins):
    # jhm1909's copy of the recipe: the same call (other dates); its documented abort marks `grant` "skipped",
    # which its own executor never did (cappyeo's copy corrected the page): the step is absent.
    call, success, aborted = json_blocks(JHM1909 / RECIPE)
    out = (await pipeline(call["arguments"])).structured_content
    check_success(out, success, results=False)
    standins.calls.clear()
    standins.respond("events_create", err("DISCORD_403", "Missing MANAGE_EVENTS"))
    out = (await pipeline(call["arguments"])).structured_content
    assert shape(out) == shape(aborted)[:2] and shape(aborted)[2] == ("grant", "members_add_role", "skipped")
    assert out["steps"][1]["error"] == aborted["steps"][1]["error"]


async def test_the_architecture_pages_envelope_is_what_an_aborted_run_answers(pipeline, standins):
    (documented,) = json_blocks(CAPPYEO / "site/src/content/docs/architecture/pipeline.mdx")
    call, _, _ = json_blocks(CAPPYEO / RECIPE)
    standins.respond("events_create", err("DISCORD_PERMISSION_DENIED", "..."))
    out = (await pipeline(call["arguments"])).structured_content
    assert shape(out) == shape(documented)
    assert set(out["steps"][0]) == set(documented["steps"][0]) and set(out["steps"][1]) == set(documented["steps"][1])
    assert out["steps"][1]["error"] == documented["steps"][1]["error"]
    assert out["aborted"] is documented["aborted"] is True


async def test_the_example_of_the_tools_description_sends_to_the_first_channel(pipeline, standins):
    r = await pipeline(description_example())
    assert shape(r.structured_content) == [
        ("channels", "channels_list", "success"),
        ("send", "messages_send", "success"),
    ]
    assert standins.calls[1] == ("messages_send", {"channel_id": "222233334444555566", "content": "hi"})


@pytest.mark.parametrize("name", ["oneStep", "fiveStepLinear", "fiveStepInterpolated"])
async def test_the_bench_pipelines_run_and_interpolate_typed_values(pipeline, standins, name):
    steps = bench_pipelines()[name]
    out = (await pipeline({"steps": steps})).structured_content
    assert [s["status"] for s in out["steps"]] == ["success"] * len(steps)
    assert out["aborted"] is False
    received = [args for _, args in standins.calls]
    if name == "fiveStepInterpolated":
        assert received[1] == {"ref": "value-from-step"}
        assert received[2] == {"ref": "value-from-step", "count": 3}  # a number, as the whole-string form keeps it
    else:
        assert received == [s["args"] for s in steps]


async def test_seed_001s_step_n_names_the_nth_step_from_one(pipeline, standins):
    # Seed 001 (jhm1909's architecture page): "{{stepN.field}} - read field on the Nth step's result
    # (1-indexed)"; the diagram interpolates {{step1...}} into step 2.
    assert "1-indexed" in (JHM1909 / "site/src/content/docs/architecture/pipeline.mdx").read_text()
    r = await pipeline(
        {
            "steps": [
                {"tool": "messages_send", "args": {"channel_id": "222233334444555566", "content": "hi"}},
                {
                    "tool": "events_create",
                    "args": {"description": "see {{step1.message_id}}", "n": "{{step_0.jump_url}}"},
                },
            ]
        }
    )
    out = r.structured_content
    assert [s["id"] for s in out["steps"]] == ["step_0", "step_1"]
    assert standins.calls[1][1]["description"] == "see 888899990000111122"
    assert standins.calls[1][1]["n"].endswith("/888899990000111122")


# --- over streamable HTTP -------------------------------------------------------------------------------


async def test_the_multistep_recipe_over_streamable_http(standins):
    call, success, _ = json_blocks(CAPPYEO / RECIPE)
    config = make_config(pipe={"mcp_pipeline": True})
    async with (
        open_app(config, extra_sources=[standins.registry]) as app,
        http_server(app) as url,
        bearer_client(url, None) as client,
    ):
        r = await client.call_tool("mcp_pipeline", call["arguments"])
    check_success(r.structured_content, success, results=True)


# --- fronting a discord-mcp server ----------------------------------------------------------------------


def fronted(**server: Any) -> Any:
    """A config fronting the stand-in discord-mcp server (stdio) with the one-line switch."""
    return make_config(
        builtins=False,
        mcpServers={"discord": {"command": sys.executable, "args": [SERVER], "mcp_pipeline": True, **server}},
    )


async def test_fronting_a_discord_mcp_server_runs_its_agents_pipelines_over_its_tools():
    call, success, _ = json_blocks(CAPPYEO / RECIPE)
    audit = AuditLog(keep=True)
    with trio.fail_after(60):
        async with open_app(fronted(), audit=audit) as app, Client(app.server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            # mcpipe's mcp_pipeline in place of the server's own
            assert "1-based" in (tools["discord.mcp_pipeline"].description or "")
            r = await client.call_tool("discord.mcp_pipeline", call["arguments"])
    check_success(r.structured_content, success, results=True)
    steps = [rec for rec in audit.records or [] if rec["step"]]
    assert [rec["tool"] for rec in steps] == [
        "discord.messages_send",
        "discord.events_create",
        "discord.members_add_role",
    ]


async def test_a_fronted_server_s_failing_step_aborts_the_run_as_documented():
    call, _, aborted = json_blocks(CAPPYEO / RECIPE)
    env = {"STANDIN_FAIL": "events_create:DISCORD_PERMISSION_DENIED:Missing MANAGE_EVENTS"}
    with trio.fail_after(60):
        async with open_app(fronted(env=env)) as app, Client(app.server) as client:
            out = (await client.call_tool("discord.mcp_pipeline", call["arguments"])).structured_content
            nested = await client.call_tool(
                "discord.mcp_pipeline", {"steps": [{"tool": "mcp_pipeline", "args": {"steps": []}}]}
            )
    assert shape(out) == shape(aborted)
    assert out["steps"][1]["error"] == aborted["steps"][1]["error"]
    assert nested.structured_content["steps"][0]["error"]["code"] == "PIPELINE_RECURSION"
