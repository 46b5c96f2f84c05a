"""discord-mcp's ``tools/meta/pipeline.test.ts`` and the ``mcp_pipeline`` cases of ``server.contract.test.ts``,
ported: each test names the upstream case (``upstream/cappyeo/packages/mcp-core/src/...``; the jhm1909 copy of
``pipeline.test.ts`` differs only in its step ids). Upstream instantiates the tool class, or calls it through
its server over an in-memory transport; here mcpipe serves it and the SDK's client calls it."""

from __future__ import annotations

from kit.discord import ok


async def test_exposes_correct_metadata(client):
    # upstream (pipeline.test.ts): 'exposes correct metadata'. Its `category: 'meta'` is discord's own grouping
    # of tools (its MCP_CATEGORIES), which MCP does not carry: not served.
    tools = {t.name: t for t in (await client.list_tools()).tools}
    tool = tools["mcp_pipeline"]
    assert tool.name == "mcp_pipeline"
    assert tool.annotations is not None and tool.annotations.open_world_hint is True
    assert tool.input_schema["properties"]["steps"]["maxItems"] == 20
    assert tool.output_schema is not None and set(tool.output_schema["required"]) == {
        "steps",
        "variables",
        "total_duration_ms",
        "aborted",
    }


async def test_refuses_recursive_mcp_pipeline_calls(pipeline, standins):
    # upstream (pipeline.test.ts): 'refuses recursive mcp_pipeline calls (no nested pipelines)'
    r = await pipeline({"steps": [{"id": "nest", "tool": "mcp_pipeline", "args": {"steps": []}}]})
    out = r.structured_content
    assert out["aborted"] is True
    assert out["steps"][0]["status"] == "error"
    assert out["steps"][0]["error"]["code"] == "PIPELINE_RECURSION"
    assert standins.calls == []


async def test_refuses_a_step_calling_mcp_pipe_as_a_nested_pipeline_too(pipeline, standins):
    # mcpipe's own pipeline tool is a pipeline as much as discord's.
    out = (await pipeline({"steps": [{"id": "a", "tool": "mcp_pipe", "args": {"steps": []}}]})).structured_content
    assert out["steps"][0]["error"]["code"] == "PIPELINE_RECURSION"


async def test_forwards_each_step_to_the_injected_invoke_function(pipeline, standins):
    # upstream (jhm1909's pipeline.test.ts): 'forwards each step to the injected invoke function'
    standins.respond("channels_list", ok({"count": 3}))
    standins.respond("roles_list", ok({"count": 3}))
    r = await pipeline(
        {
            "steps": [
                {"id": "s1", "tool": "channels_list", "args": {"guild_id": "g1"}},
                {"id": "s2", "tool": "roles_list", "args": {"guild_id": "g1"}},
            ]
        }
    )
    assert len(standins.calls) == 2
    assert standins.called() == ["channels_list", "roles_list"]
    steps = r.structured_content["steps"]
    assert len(steps) == 2
    assert all(s["status"] == "success" for s in steps)


async def test_snowflake_step_ids_fail_the_input_schema_as_discords_server_refuses_them(pipeline, standins):
    # upstream (cappyeo's pipeline.test.ts): 'forwards each step to the injected invoke function', with step ids
    # '115759770816628172' and '637012073593481124'. Upstream runs the tool class directly, past the server's
    # validation middleware; through discord's own server those ids fail its `id` pattern (a letter first), and
    # through mcpipe likewise: VALIDATION_FAILED, nothing runs.
    r = await pipeline(
        {
            "steps": [
                {"id": "115759770816628172", "tool": "channels_list", "args": {"guild_id": "416150631470215224"}},
                {"id": "637012073593481124", "tool": "roles_list", "args": {"guild_id": "416150631470215224"}},
            ]
        }
    )
    assert r.is_error is True
    assert r.structured_content["code"] == "VALIDATION_FAILED"
    assert [i["path"] for i in r.structured_content["issues"]] == ["steps.0.id", "steps.1.id"]
    assert standins.calls == []


async def test_mcp_pipeline_executes_a_2_step_pipeline_end_to_end(pipeline, standins):
    # upstream (server.contract.test.ts): 'mcp_pipeline executes a 2-step pipeline end-to-end'
    r = await pipeline(
        {
            "steps": [
                {"id": "step1", "tool": "channels_list", "args": {"guild_id": "999000999000999000"}},
                {
                    "id": "step2",
                    "tool": "messages_send",
                    "args": {"channel_id": "{{step1.channels[0].id}}", "content": "pipeline ran"},
                },
            ]
        }
    )
    assert r.is_error is False
    out = r.structured_content
    assert out["aborted"] is False
    assert [(s["id"], s["status"]) for s in out["steps"]] == [("step1", "success"), ("step2", "success")]
    assert standins.calls[1] == ("messages_send", {"channel_id": "222233334444555566", "content": "pipeline ran"})


async def test_mcp_pipeline_rejects_nested_pipeline_calls(pipeline, standins):
    # upstream (server.contract.test.ts): 'mcp_pipeline rejects nested pipeline calls'
    r = await pipeline({"steps": [{"id": "inner", "tool": "mcp_pipeline", "args": {"steps": []}}]})
    assert r.is_error is False
    out = r.structured_content
    assert out["aborted"] is True
    assert any(s["status"] == "error" and s["error"]["code"] == "PIPELINE_RECURSION" for s in out["steps"])
