"""What passes through the gateway besides tools: resources, templates, prompts, completion, subscriptions,
logging, list changes and downstream JSON-RPC errors (the SDK's everything-server as a stdio downstream)."""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from kit.servers import everything_downstream, http_server, make_config, running, stdio_downstream
from mcpipe.config import ConfigError
from mcpipe.declared import PlanTool, is_declared
from mcpipe.gateway import PIPE_TOOL
from mcpipe.runtime import run_compiled
from mcpipe.tools import ToolContext

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

ERAS = ["legacy", "2026-07-28"]
"""The client's era (towards mcpipe); the downstream everything-server negotiates its own."""


def _config(**servers: dict[str, Any]) -> Any:
    return make_config(mcpServers=servers or {"ev": everything_downstream()})


@pytest.mark.parametrize("mode", ERAS)
async def test_resources_templates_and_prompts_of_a_downstream_server_are_listed_and_read(mode):
    with trio.fail_after(30):
        async with running(_config()) as app, Client(app.server, mode=mode) as client:
            resources = {r.uri: r for r in (await client.list_resources()).resources}
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            text = await client.read_resource("test://static-text")
            binary = await client.read_resource("test://static-binary")
            templated = await client.read_resource("test://template/42/data")
            prompts = {p.name for p in (await client.list_prompts()).prompts}
            simple = await client.get_prompt("ev.test_simple_prompt")
            with_args = await client.get_prompt("ev.test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
            caps = client.server_capabilities
    assert {"test://static-text", "test://static-binary", "test://watched-resource"} <= set(resources)
    assert templates == ["test://template/{id}/data"]
    assert text.contents[0].text == "This is the content of the static text resource."
    assert binary.contents[0].blob
    assert '"id": "42"' in templated.contents[0].text
    assert {"ev.test_simple_prompt", "ev.test_prompt_with_arguments", "ev.test_prompt_with_image"} <= prompts
    assert simple.messages[0].content.text == "This is a simple prompt for testing."
    assert with_args.messages[0].content.text == "Prompt with arguments: arg1='a', arg2='b'"
    if mode == "legacy":  # (a pinned 2026-07-28 client assumes capabilities without asking)
        assert caps.resources is not None and caps.prompts is not None and caps.completions is not None


@pytest.mark.parametrize("mode", ERAS)
async def test_completion_goes_to_the_server_of_the_prompt_or_template(mode):
    with trio.fail_after(30):
        async with running(_config()) as app, Client(app.server, mode=mode) as client:
            by_prompt = await client.complete(
                types.PromptReference(type="ref/prompt", name="ev.test_prompt_with_arguments"),
                {"name": "arg1", "value": "x"},
            )
            by_template = await client.complete(
                types.ResourceTemplateReference(type="ref/resource", uri="test://template/{id}/data"),
                {"name": "id", "value": "1"},
            )
            with pytest.raises(MCPError) as unknown:
                await client.complete(types.PromptReference(type="ref/prompt", name="nope"), {"name": "a", "value": ""})
    assert by_prompt.completion.values == [] and by_template.completion.values == []
    assert unknown.value.code == types.INVALID_PARAMS


async def test_reading_a_uri_no_server_lists_is_invalid_params_naming_the_uri():
    with trio.fail_after(30):
        async with running(_config()) as app, Client(app.server) as client:
            with pytest.raises(MCPError) as err:
                await client.read_resource("test://nonexistent")
    assert err.value.code == types.INVALID_PARAMS and err.value.data == {"uri": "test://nonexistent"}


async def test_two_servers_serving_one_prompt_or_uri_the_first_in_config_order_wins_with_a_warning(caplog):
    cfg = _config(a=everything_downstream(prefix=""), b=everything_downstream(prefix=""))
    with trio.fail_after(30), caplog.at_level(logging.WARNING, "mcpipe.server"):
        async with running(cfg) as app, Client(app.server) as client:
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            resources = [r.uri for r in (await client.list_resources()).resources]
    assert prompts.count("test_simple_prompt") == 1 and resources.count("test://static-text") == 1
    warned = [r.getMessage() for r in caplog.records if "wins" in r.getMessage()]
    assert any("'test://static-text'" in w and "'a' wins" in w for w in warned)
    assert any("'test_simple_prompt'" in w and "'a' wins" in w for w in warned)


def test_two_servers_under_one_prefix_is_a_located_config_error():
    with pytest.raises(ConfigError) as err:
        make_config(mcpServers={"a": everything_downstream(prefix="x"), "b": everything_downstream(prefix="x")})
    (problem,) = err.value.problems
    assert problem.location == "mcpServers.b.prefix" and "mcpServers.a" in problem.message


@pytest.mark.parametrize("downstream", ["auto", "2025-11-25"])
async def test_a_2025_subscriber_hears_that_its_resource_was_updated_downstream(downstream):
    updated = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification) and message.params.uri == "test://watched-resource":
            updated.set()

    with trio.fail_after(30):
        async with (
            running(_config(ev=everything_downstream(protocol=downstream))) as app,
            Client(app.server, mode="legacy", message_handler=on_message) as client,
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource("test://watched-resource")
            await client.call_tool("ev.test_update_watched_resource", {})
            await updated.wait()
            after = await client.read_resource("test://watched-resource")
    assert after.contents[0].text == "Watched resource content, updated"


@pytest.mark.parametrize("downstream", ["auto", "2025-11-25"])
async def test_a_2026_client_listening_for_a_resource_hears_its_update(downstream):
    cfg = _config(ev=everything_downstream(protocol=downstream))
    with trio.fail_after(30):
        async with (
            running(cfg) as app,
            Client(app.server, mode="2026-07-28") as client,
            client.listen(resource_subscriptions=["test://watched-resource"]) as sub,
        ):
            await client.call_tool("ev.test_update_watched_resource", {})
            event = await anext(aiter(sub))
    assert getattr(event, "uri", None) == "test://watched-resource"


@pytest.mark.parametrize("downstream", ["auto", "2025-11-25"])
async def test_a_downstream_tool_list_change_is_announced_to_2025_and_2026_clients(downstream):
    cfg = _config(ev=everything_downstream(protocol=downstream))
    heard = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.set()

    with trio.fail_after(30):
        async with (
            running(cfg) as app,
            Client(app.server, mode="legacy", message_handler=on_message) as legacy,
            Client(app.server, mode="2026-07-28") as modern,
        ):
            await legacy.list_tools()  # a client the gateway knows of
            async with modern.listen(tools_list_changed=True) as sub:
                await modern.call_tool("ev.test_trigger_tool_change", {})
                event = await anext(aiter(sub))
            await heard.wait()
    assert type(event).__name__ == "ToolsListChanged"


@pytest.mark.parametrize("mode", ERAS)
async def test_log_messages_of_a_downstream_call_reach_that_caller_at_its_level_with_their_logger(mode):
    got: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        got.append(params)

    with trio.fail_after(30):
        async with running(_config()) as app:
            level: Any = "info" if mode != "legacy" else None
            async with Client(app.server, mode=mode, logging_callback=on_log, log_level=level) as client:
                if mode == "legacy":
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        await client.set_logging_level("info")
                await client.call_tool("ev.test_tool_with_logging", {})
                heard = list(got)
                if mode == "legacy":
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        await client.set_logging_level("error")
                    await client.call_tool("ev.test_tool_with_logging", {})
                    assert got == heard  # its three info messages are below "error" now: none came
            async with Client(app.server, mode=mode, logging_callback=on_log) as quiet:  # no level: nothing (2026)
                got.clear()
                await quiet.call_tool("ev.test_tool_with_logging", {})
    assert [m.data for m in heard] == ["Tool execution started", "Tool processing data", "Tool execution completed"]
    assert {m.level for m in heard} == {"info"} and all(m.logger == "everything" for m in heard)
    if mode != "legacy":
        assert got == []


async def _set_level(client: Client, level: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # logging/setLevel is deprecated in the 2026-07-28 era
        await client.set_logging_level(level)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_downstream_log_message_below_the_callers_level_is_dropped_and_one_at_or_above_it_arrives(mode):
    got: list[tuple[str, Any, str | None]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        got.append((params.level, params.data, params.logger))

    heard: dict[str, list[Any]] = {}
    with trio.fail_after(30):
        async with running(_config(ds=stdio_downstream())) as app:
            for level in ("debug", "warning", "error"):
                got.clear()
                level_2026: Any = level if mode != "legacy" else None
                async with Client(app.server, mode=mode, logging_callback=on_log, log_level=level_2026) as client:
                    if mode == "legacy":
                        await _set_level(client, level)
                    await client.call_tool("ds.chatter", {"tag": level})
                heard[level] = [(lv, data) for lv, data, _ in got]
                assert {logger for _, _, logger in got} == {"chatter"}
    assert heard == {
        "debug": [(lv, f"debug {lv}") for lv in ("debug", "info", "warning", "error")],
        "warning": [("warning", "warning warning"), ("error", "warning error")],
        "error": [("error", "error error")],
    }


@pytest.mark.parametrize("mode", ERAS)
async def test_two_clients_calling_one_downstream_logging_tool_at_once_over_http_each_get_only_their_own_messages(
    mode,
):
    heard: dict[str, list[Any]] = {"a": [], "b": [], "alone": []}
    answers: dict[str, str] = {}

    async def call(url: str, tag: str, together: int) -> None:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            heard[tag].append(params.data)

        level: Any = "debug" if mode != "legacy" else None
        async with Client(url, mode=mode, logging_callback=on_log, log_level=level) as client:
            if mode == "legacy":
                await _set_level(client, "debug")
            r = await client.call_tool("ds.chatter", {"tag": tag, "together": together})
            answers[tag] = r.content[0].text  # type: ignore[union-attr]

    with trio.fail_after(30):
        async with running(_config(ds=stdio_downstream())) as app, http_server(app) as url:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, url, "a", 2)  # the tool waits until both calls are in flight
                nursery.start_soon(call, url, "b", 2)
            await call(url, "alone", 1)
    assert answers == {"a": "a", "b": "b", "alone": "alone"}
    for tag in ("a", "b"):  # never another call's message (those sent while both ran name no request: dropped)
        assert all(m.startswith(f"{tag} ") for m in heard[tag]), heard
    assert heard["alone"] == [f"alone {lv}" for lv in ("debug", "info", "warning", "error")]


MISSING_SAMPLING = {
    "code": types.MISSING_REQUIRED_CLIENT_CAPABILITY,
    "message": "This tool requires the client 'sampling' capability",
    "data": {"requiredCapabilities": {"sampling": {}}},
}
"""The JSON-RPC error the everything-server answers a 2026-07-28 call of its sampling tool without sampling."""


async def test_a_downstream_json_rpc_error_reaches_a_direct_caller_unchanged_and_fails_a_pipeline_step_keeping_it():
    spec = {
        "continue_on_error": True,
        "steps": [{"id": "ask", "tool": "ev.test_missing_capability"}, {"id": "after", "tool": "echo", "args": {}}],
        "return": {"code": "${steps.ask.jsonrpc_error.code}", "data": "${steps.ask.jsonrpc_error.data}"},
    }
    with trio.fail_after(30):
        async with running(_config()) as app, Client(app.server, mode="2026-07-28") as client:
            with pytest.raises(MCPError) as err:
                await client.call_tool("ev.test_missing_capability", {})
            piped = await client.call_tool(PIPE_TOOL, spec)
    assert (err.value.code, err.value.message, err.value.data) == tuple(MISSING_SAMPLING.values())
    answer = piped.structured_content
    step = answer["steps"]["ask"]
    assert step["error_code"] == "TOOL_FAILED" and "error -32021" in step["error"]
    assert step.get("jsonrpc_error") == MISSING_SAMPLING, step
    assert answer["result"] == {"code": -32021, "data": {"requiredCapabilities": {"sampling": {}}}}
    assert "jsonrpc_error" not in answer["steps"]["after"]


REFUSAL = {"code": -32042, "message": "refused on purpose", "data": {"why": "a test"}}
"""The JSON-RPC error the tests' downstream server answers a call of its ``refuse`` tool."""


async def test_a_declared_tool_step_failing_with_a_downstream_json_rpc_error_keeps_the_error_in_its_result():
    probe = {"name": "probe", "steps": [{"kind": "tool", "id": "ask", "tool": "ds.refuse"}]}
    cfg = make_config(mcpServers={"ds": stdio_downstream()}, pipelines=[probe])
    with trio.fail_after(30):
        async with running(cfg) as app, Client(app.server) as client:
            called = await client.call_tool("probe", {})
            piped = await client.call_tool(PIPE_TOOL, {"steps": [{"id": "ask", "tool": "ds.refuse"}]})
            tool = app.gateway.get("probe")
            assert isinstance(tool, PlanTool) and is_declared(tool)
            answer = await run_compiled(tool.compiled, app.gateway, context=ToolContext())
    assert called.is_error and "TOOL_FAILED: step 'ask' failed: DownstreamError: " in called.content[0].text
    for step in (answer["steps"]["ask"], piped.structured_content["steps"]["ask"]):
        assert step["error_code"] == "TOOL_FAILED"
        assert step["jsonrpc_error"] == REFUSAL


async def _silent_listener(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A TCP server on 127.0.0.1 that accepts and never answers (a downstream that hangs while connecting)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(hold, listeners)


async def test_a_hanging_lazy_server_does_not_block_the_first_list_and_its_tools_say_unavailable(caplog):
    with trio.fail_after(30), caplog.at_level(logging.WARNING, "mcpipe.downstream"):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_silent_listener)
            far = {"url": f"http://127.0.0.1:{port}/mcp", "connect": "lazy", "connect_timeout_ms": 4000}
            async with running(make_config(mcpServers={"far": far})) as app, Client(app.server) as client:
                t0 = trio.current_time()
                listed = await client.list_tools()
                listed_in = trio.current_time() - t0
                piped = await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "far.anything"}]})
            nursery.cancel_scope.cancel()
    assert listed_in < 2 and not any(t.name.startswith("far.") for t in listed.tools)
    assert (listed.meta or {}).get("io.github.mcpipe/unavailable") == {"far": "connecting"}
    assert piped.structured_content["error_code"] == "TOOL_FAILED"
    assert "MCP server 'far' is unavailable" in piped.structured_content["error"]
    assert any("far is still connecting" in r.getMessage() for r in caplog.records)


async def test_a_server_that_goes_down_is_logged_as_a_warning(caplog):
    cfg = make_config(mcpServers={"broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(1)"]}})
    with trio.fail_after(30), caplog.at_level(logging.INFO, "mcpipe.downstream"):
        async with running(cfg):
            pass
    down = [r for r in caplog.records if "downstream broken is down" in r.getMessage()]
    assert down and down[0].levelno == logging.WARNING


async def test_a_server_that_comes_back_with_another_tool_list_is_announced(tmp_path):
    flag = tmp_path / "extra"
    cfg = make_config(mcpServers={"ds": stdio_downstream(env={"DOWNSTREAM_EXTRA": str(flag)})})
    heard = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.set()

    with trio.fail_after(30):
        async with running(cfg) as app, Client(app.server, mode="legacy", message_handler=on_message) as client:
            before = {t.name for t in (await client.list_tools()).tools}
            flag.write_text("on")
            await client.call_tool("ds.crash", {})  # it restarts, now serving `extra` too
            await heard.wait()
            after = {t.name for t in (await client.list_tools()).tools}
    assert "ds.extra" not in before and "ds.extra" in after


async def test_mcpipe_own_log_steps_follow_the_level_a_2025_client_set():
    pipeline = {
        "name": "chatty",
        "description": "logs at two levels",
        "steps": [
            {"kind": "log", "id": "quiet", "level": "debug", "data": "details"},
            {"kind": "log", "id": "loud", "level": "warning", "data": "careful"},
        ],
    }
    got: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        got.append((params.level, params.data))

    with trio.fail_after(30):
        async with (
            running(make_config(pipelines=[pipeline])) as app,
            Client(app.server, mode="legacy", logging_callback=on_log) as client,
        ):
            await client.call_tool("chatty", {})
            everything = list(got)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.set_logging_level("info")
            got.clear()
            await client.call_tool("chatty", {})
    assert everything == [("debug", "details"), ("warning", "careful")]
    assert got == [("warning", "careful")]


async def test_a_principal_sees_the_resources_and_prompts_only_of_servers_whose_tools_it_may_call():
    auth = {
        "tokens": [
            {"env": "T1", "principal": "ev-user", "tools": ["ev.test_simple_text"]},
            {"env": "T2", "principal": "other", "tools": ["echo"]},
        ]
    }
    cfg = make_config({"T1": "a", "T2": "b"}, mcpServers={"ev": everything_downstream()}, auth=auth)
    seen = {}
    with trio.fail_after(30):
        async with running(cfg) as app:
            for principal in ("ev-user", "other"):
                app.handlers.default_principal = principal
                async with Client(app.server, mode="legacy") as client:
                    # (mcpipe's own guide is everyone's who may call mcp_pipe: only the server's count here)
                    resources = [r for r in (await client.list_resources()).resources if r.uri.startswith("test://")]
                    prompts = [p for p in (await client.list_prompts()).prompts if p.name.startswith("ev.")]
                    try:
                        await client.read_resource("test://static-text")
                        readable = True
                    except MCPError:
                        readable = False
                seen[principal] = (len(resources) > 0, len(prompts) > 0, readable)
    assert seen == {"ev-user": (True, True, True), "other": (False, False, False)}
