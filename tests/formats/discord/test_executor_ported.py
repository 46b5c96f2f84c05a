"""discord-mcp's ``pipeline/executor.test.ts``, every case ported: each test names the upstream case it ports
(``upstream/cappyeo/packages/mcp-core/src/pipeline/executor.test.ts``; jhm1909's copy has the same cases but
the last). Discord's tests call ``executePipeline`` with a mocked ``invoke``; here the same steps go through
mcpipe's ``mcp_pipeline`` over the SDK's client, the mocked answers scripted on stand-in tools of the same
names, and the calls the tools received read back."""

from __future__ import annotations

import trio

from kit.discord import err, ok
from mcpipe.formats.discord import pipeline_tool
from mcpipe.tools import ToolContext


async def test_runs_a_single_step_and_captures_result_under_step_id(pipeline, standins):
    # upstream: 'runs a single step and captures result under step id'
    standins.respond("messages_send", ok({"message_id": "m1"}))
    r = await pipeline(
        {"steps": [{"id": "send", "tool": "messages_send", "args": {"channel_id": "c1", "content": "hi"}}]}
    )
    out = r.structured_content
    assert r.is_error is False
    assert out["aborted"] is False
    assert len(out["steps"]) == 1
    assert out["steps"][0]["status"] == "success" and out["steps"][0]["id"] == "send"
    assert out["variables"]["send"] == {"message_id": "m1"}
    assert standins.calls == [("messages_send", {"channel_id": "c1", "content": "hi"})]


async def test_interpolates_variables_from_earlier_steps_into_later_step_args(pipeline, standins):
    # upstream: 'interpolates variables from earlier steps into later step args'
    standins.respond("messages_read", ok({"messages": [{"id": "msg_1"}]}))
    standins.respond("messages_delete", ok({"deleted": True, "message_id": "msg_1"}))
    r = await pipeline(
        {
            "steps": [
                {"id": "read", "tool": "messages_read", "args": {"channel_id": "c1"}},
                {
                    "id": "del",
                    "tool": "messages_delete",
                    "args": {"channel_id": "c1", "message_id": "{{read.messages[0].id}}"},
                },
            ]
        }
    )
    assert r.structured_content["aborted"] is False
    assert standins.calls[1][1] == {"channel_id": "c1", "message_id": "msg_1"}


async def test_save_as_aliases_the_result_under_both_step_id_and_the_alias(pipeline, standins):
    # upstream: 'save_as aliases the result under both step id and the alias'
    standins.respond("channels_list", ok({"count": 7}))
    r = await pipeline(
        {"steps": [{"id": "count", "tool": "channels_list", "args": {"guild_id": "g1"}, "save_as": "channels"}]}
    )
    variables = r.structured_content["variables"]
    assert variables["count"] == {"count": 7}
    assert variables["channels"] == {"count": 7}


async def test_skips_a_step_whose_if_resolves_falsy(pipeline, standins):
    # upstream: 'skips a step whose `if` resolves falsy'
    standins.respond("channels_list", ok({"count": 0}))
    standins.respond("messages_send", ok({"message_id": "m2"}))
    r = await pipeline(
        {
            "steps": [
                {"id": "first", "tool": "channels_list", "args": {"guild_id": "g1"}},
                {
                    "id": "maybe",
                    "tool": "messages_send",
                    "args": {"channel_id": "c1", "content": "hi"},
                    "if": "{{first.count}}",
                },
            ]
        }
    )
    assert r.structured_content["steps"][1]["status"] == "skipped"
    assert standins.called() == ["channels_list"]


async def test_aborts_the_pipeline_when_a_step_fails_by_default(pipeline, standins):
    # upstream: 'aborts the pipeline when a step fails (default continue_on_error: false)'
    standins.respond("messages_read", ok({"messages": []}))
    standins.respond("messages_send", err("DISCORD_PERMISSION_DENIED", "no perm"), ok({"never": "reached"}))
    r = await pipeline(
        {
            "steps": [
                {"id": "a", "tool": "messages_read", "args": {}},
                {"id": "b", "tool": "messages_send", "args": {"content": "x"}},
                {"id": "c", "tool": "messages_send", "args": {"content": "y"}},
            ]
        }
    )
    out = r.structured_content
    assert out["aborted"] is True
    assert len(out["steps"]) == 2
    assert out["steps"][0]["status"] == "success"
    assert out["steps"][1]["status"] == "error"
    assert len(standins.calls) == 2


async def test_continues_past_a_failed_step_when_continue_on_error_is_true(pipeline, standins):
    # upstream: 'continues past a failed step when continue_on_error is true'
    standins.respond("messages_delete", err("DISCORD_NOT_FOUND", "gone"))
    standins.respond("messages_send", ok({"ok": True}))
    r = await pipeline(
        {
            "steps": [
                {"id": "a", "tool": "messages_delete", "args": {}, "continue_on_error": True},
                {"id": "b", "tool": "messages_send", "args": {}},
            ]
        }
    )
    out = r.structured_content
    assert out["aborted"] is False
    assert out["steps"][0]["status"] == "error"
    assert out["steps"][1]["status"] == "success"


async def test_default_ids_unnamed_steps_as_step_index(pipeline, standins):
    # upstream: 'default-ids unnamed steps as step_<index>'
    standins.respond("messages_send", ok({"ok": True}), ok({"ok": True}))
    r = await pipeline(
        {
            "steps": [
                {"tool": "messages_send", "args": {"content": "a"}},
                {"tool": "messages_send", "args": {"content": "b"}},
            ]
        }
    )
    out = r.structured_content
    assert out["steps"][0]["id"] == "step_0"
    assert out["steps"][1]["id"] == "step_1"
    assert out["variables"]["step_0"] == {"ok": True}


async def test_records_duration_ms_per_step(pipeline, standins):
    # upstream: 'records duration_ms per step (>= 0)'
    standins.respond("x", ok({}))
    out = (await pipeline({"steps": [{"id": "a", "tool": "x", "args": {}}]})).structured_content
    assert out["steps"][0]["duration_ms"] >= 0
    assert isinstance(out["total_duration_ms"], (int, float))


async def test_captures_error_code_and_retriable_from_a_failed_call_tool_result(pipeline, standins):
    # upstream: 'captures error code + retriable from a failed CallToolResult'
    standins.respond("x", err("DISCORD_RATE_LIMITED", "wait"))
    out = (await pipeline({"steps": [{"id": "a", "tool": "x", "args": {}}]})).structured_content
    assert out["steps"][0]["error"]["code"] == "DISCORD_RATE_LIMITED"
    assert out["steps"][0]["error"]["retriable"] is False


# Discord's abort signal is the request's: in mcpipe, the caller's cancellation (a cancel notification, the
# connection closing) cancels the run's scope. A cancelled call answers nothing (the caller gave up on it), where
# discord answers `{aborted: true}`; what runs is the same: nothing after the cancellation.


async def test_aborts_pipeline_if_signal_is_already_aborted(standins):
    # upstream: 'aborts pipeline if signal is already aborted'
    tool = pipeline_tool()
    with trio.CancelScope() as scope:
        scope.cancel()
        await tool.call({"steps": [{"id": "a", "tool": "x", "args": {}}]}, ToolContext(tools=standins.registry))
    assert scope.cancelled_caught
    assert standins.calls == []


async def test_stops_before_the_next_step_when_the_signal_aborts_mid_pipeline(standins):
    # upstream: 'stops before the next step when the signal aborts mid-pipeline' (cappyeo's copy only)
    tool = pipeline_tool()
    send = standins.registry.get("messages_send")
    with trio.CancelScope() as scope:

        class Aborting:
            name = "messages_send"

            async def call(self, args, ctx):
                result = await send.call(args, ctx)
                scope.cancel()  # ac.abort() inside the first call
                return result

        steps = [
            {"id": "a", "tool": "messages_send", "args": {"content": "x"}},
            {"id": "b", "tool": "messages_send", "args": {"content": "y"}},
        ]
        await tool.call({"steps": steps}, ToolContext(tools=_Only(Aborting(), standins.registry)))
    assert scope.cancelled_caught
    assert standins.calls == [("messages_send", {"content": "x"})]


class _Only:
    """A registry answering ``tool`` under its name, and everything else from ``rest``."""

    def __init__(self, tool, rest) -> None:
        self.tool = tool
        self.rest = rest

    def get(self, name):
        return self.tool if name == self.tool.name else self.rest.get(name)

    def __contains__(self, name) -> bool:
        return self.get(name) is not None

    def allows(self, name, ctx) -> bool:
        return True

    async def call(self, name, args, ctx):
        return await self.get(name).call(args, ctx)
