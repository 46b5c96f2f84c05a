"""Questions a downstream server asks during a call, relayed to the client that made the call.

mcpipe sits in front of ``asking_server.py`` (a real SDK server whose tools ask with the SDK's resolvers),
and real SDK clients with real elicitation, sampling and roots callbacks call it: directly, from an
``mcp_pipe`` step, and from a declared pipeline's ``tool`` step. Both eras on both sides: the caller
(2026-07-28 or the 2025-11-25 handshake) and the downstream connection (``protocol`` pinned to either).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import mcp_types as t
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY

from kit.interaction import ASKING, http_asking_server
from mcpipe.config import parse_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import App, open_app, serve_http

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 30
MODERN, LEGACY = "2026-07-28", "2025-11-25"

PIPELINES: list[dict[str, Any]] = [
    {
        "name": "remove",
        "description": "Count, then delete (the downstream asks to confirm).",
        "input_schema": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
        "steps": [
            {"kind": "tool", "id": "count", "tool": "ds.tally"},
            {"kind": "tool", "id": "gone", "tool": "ds.delete", "args": {"item": "${args.item}"}},
        ],
        "output": {"count": {"$ref": "steps.count.output"}, "gone": {"$ref": "steps.gone.output"}},
    }
]


class Answers:
    """The calling client's side: real callbacks that answer and record what they were asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def elicit(self, context: Any, params: Any) -> t.ElicitResult:
        self.asked.append(f"elicit: {params.message}")
        return t.ElicitResult(action="accept", content={"ok": True})

    async def sample(self, context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        content = params.messages[0].content
        self.asked.append(f"sample: {content.text if isinstance(content, t.TextContent) else content}")
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="short"), model="m")

    async def roots(self, context: Any) -> t.ListRootsResult:
        self.asked.append("roots")
        return t.ListRootsResult(roots=[t.Root(uri="file:///work", name="work")])

    def callbacks(self, *kinds: str) -> dict[str, Any]:
        every = {"elicitation": self.elicit, "sampling": self.sample, "roots": self.roots}
        return {f"{'list_roots' if k == 'roots' else k}_callback": every[k] for k in kinds or every}


def downstream(protocol: str, url: str | None = None, **extra: Any) -> dict[str, Any]:
    where: dict[str, Any] = {"url": url} if url else {"command": sys.executable, "args": [ASKING]}
    return {**where, "protocol": protocol, **extra}


@asynccontextmanager
async def gateway(protocol: str, url: str | None = None, **extra: Any) -> AsyncIterator[App]:
    """mcpipe with ``asking_server.py`` as its ``ds`` server (stdio, or ``url``), and the ``remove`` pipeline."""
    server = downstream(protocol, url, **extra)
    doc = {"audit": {"enabled": False}, "mcpServers": {"ds": server}, "pipelines": PIPELINES}
    async with open_app(parse_config(json.dumps(doc), "json", environ={})) as app:
        yield app


def caller(app: App, era: str, answers: Answers, *kinds: str) -> Client:
    return Client(app.server, mode="legacy" if era == LEGACY else era, **answers.callbacks(*kinds))


def text(result: t.CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, t.TextContent))


RELAYED = [(MODERN, MODERN), (LEGACY, MODERN), (LEGACY, LEGACY)]
"""(caller era, downstream protocol): every pairing where a question can be relayed."""


@pytest.mark.parametrize(("era", "protocol"), RELAYED)
async def test_a_downstream_tool_that_asks_gets_the_callers_answers_on_a_direct_call(era: str, protocol: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with gateway(protocol) as app, caller(app, era, answers) as c:
            deleted = await c.call_tool("ds.delete", {"item": "logs"})
            summary = await c.call_tool("ds.summarize", {"text": "a long story"})
            where = await c.call_tool("ds.where", {})
            both = await c.call_tool("ds.both", {"item": "tmp"})
            twice = await c.call_tool("ds.twice", {"item": "cache"})
    assert [text(r) for r in (deleted, summary, where, both, twice)] == [
        "deleted logs",
        "summary: short",
        "roots: file:///work",
        "deleted tmp in file:///work",
        "deleted cache in file:///work",
    ]
    assert answers.asked[:3] == ["elicit: Delete logs?", "sample: Summarize: a long story", "roots"]
    assert sorted(answers.asked[3:5]) == ["elicit: Delete tmp?", "roots"]
    assert answers.asked[5:] == ["elicit: Delete cache?", "roots"]


@pytest.mark.parametrize(("era", "protocol"), RELAYED)
async def test_pipeline_steps_relay_their_downstream_questions_and_finished_steps_run_once(
    era: str, protocol: str
) -> None:
    answers = Answers()
    spec = {
        "steps": [
            {"id": "count", "tool": "ds.tally"},
            {"id": "gone", "tool": "ds.delete", "args": {"item": "logs"}},
            {"id": "said", "tool": "ds.summarize", "args": {"text": "{{gone.result}}"}},
        ],
        "answer": "full",
    }
    with trio.fail_after(WAIT_S):
        async with gateway(protocol) as app, caller(app, era, answers) as c:
            piped = await c.call_tool(PIPE_TOOL, spec)
            declared = await c.call_tool("remove", {"item": "tmp"})
            tally = await c.call_tool("ds.tally", {})
    answer = piped.structured_content
    assert answer is not None and answer["ok"], answer
    assert answer["steps"]["gone"]["output"] == {"result": "deleted logs"}
    assert answer["result"] == {"result": "summary: short"}
    assert declared.structured_content == {"count": {"result": 2}, "gone": {"result": "deleted tmp"}}
    assert tally.structured_content == {"result": 3}  # each round of each pipeline re-ran no finished step
    assert answers.asked == ["elicit: Delete logs?", "sample: Summarize: deleted logs", "elicit: Delete tmp?"]


async def test_on_2026_the_downstream_questions_become_mcpipes_keyed_by_step_and_resume_on_the_retry() -> None:
    spec = {"steps": [{"id": "count", "tool": "ds.tally"}, {"id": "gone", "tool": "ds.both", "args": {"item": "x"}}]}
    with trio.fail_after(WAIT_S):
        async with gateway(MODERN) as app, caller(app, MODERN, Answers()) as c:
            first = await c.session.call_tool(PIPE_TOOL, spec, allow_input_required=True)
            assert isinstance(first, t.InputRequiredResult) and first.input_requests
            keys = sorted(first.input_requests)
            methods = sorted(r.method for r in first.input_requests.values())
            responses: dict[str, Any] = {
                k: t.ElicitResult(action="accept", content={"ok": True})
                if r.method == "elicitation/create"
                else t.ListRootsResult(roots=[t.Root(uri="file:///r")])
                for k, r in first.input_requests.items()
            }
            # Only one answer: mcpipe asks again for what is missing, without calling the downstream.
            one = dict([next(iter(responses.items()))])
            partial_retry = await c.session.call_tool(
                PIPE_TOOL, spec, input_responses=one, request_state=first.request_state, allow_input_required=True
            )
            assert isinstance(partial_retry, t.InputRequiredResult) and partial_retry.input_requests
            rest = {k: v for k, v in responses.items() if k in partial_retry.input_requests}
            done = await c.session.call_tool(
                PIPE_TOOL,
                spec,
                input_responses=rest,
                request_state=partial_retry.request_state,
                allow_input_required=True,
            )
            tally = await c.call_tool("ds.tally", {})
    assert all(k.startswith("gone.") for k in keys) and len(keys) == 2
    assert methods == ["elicitation/create", "roots/list"]
    assert first.request_state is not None and len(partial_retry.input_requests) == 1
    assert isinstance(done, t.CallToolResult) and done.structured_content is not None
    assert done.structured_content["result"] == {"result": "deleted x in file:///r"}
    assert tally.structured_content == {"result": 2}


@pytest.mark.parametrize("protocol", [MODERN, LEGACY])
async def test_a_2025_caller_without_the_capability_gets_a_tool_error_naming_it(protocol: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with gateway(protocol) as app, caller(app, LEGACY, answers, "sampling") as c:
            r = await c.call_tool("ds.delete", {"item": "logs"})
            piped = await c.call_tool(
                PIPE_TOOL, {"steps": [{"id": "gone", "tool": "ds.delete", "args": {"item": "x"}}]}
            )
    assert r.is_error and "the client did not declare the `elicitation` capability" in text(r)
    step = piped.structured_content["steps"]["gone"]  # type: ignore[index]
    assert step["error_code"] == "TOOL_FAILED" and "`elicitation` capability" in step["error"]
    assert answers.asked == []


async def test_a_2026_caller_without_the_capability_gets_missing_capability_error() -> None:
    with trio.fail_after(WAIT_S):
        async with gateway(MODERN) as app, caller(app, MODERN, Answers(), "sampling") as c:
            with pytest.raises(MCPError) as refused:
                await c.call_tool("ds.where", {})
    assert refused.value.code == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert refused.value.error.data == {"requiredCapabilities": {"roots": {}}}


async def test_a_2026_downstream_is_told_the_callers_capabilities_not_mcpipes() -> None:
    with trio.fail_after(WAIT_S):
        async with (
            gateway(MODERN) as app,
            caller(app, MODERN, Answers(), "sampling") as some,
            caller(app, MODERN, Answers()) as every,
        ):
            seen_by_some = await some.call_tool("ds.caps", {})
            seen_by_every = await every.call_tool("ds.caps", {})
            piped = await some.call_tool(PIPE_TOOL, {"steps": [{"id": "c", "tool": "ds.caps"}]})
    assert text(seen_by_some) == "sampling" and text(seen_by_every) == "elicitation,roots,sampling"
    assert piped.structured_content is not None and piped.structured_content["result"] == {"result": "sampling"}


async def test_answers_sent_without_a_state_reach_a_downstream_tool_called_directly_and_no_pipeline_step() -> None:
    ada = {"user_name": t.ElicitResult(action="accept", content={"name": "Ada"})}
    with trio.fail_after(WAIT_S):
        async with gateway(MODERN) as app, caller(app, MODERN, Answers()) as c:
            direct = await c.session.call_tool("ds.name", {}, input_responses=ada, allow_input_required=True)
            spec = {"steps": [{"id": "n", "tool": "ds.name"}]}
            piped = await c.session.call_tool(PIPE_TOOL, spec, input_responses=ada, allow_input_required=True)
    assert isinstance(direct, t.CallToolResult) and text(direct) == "hello Ada"
    assert isinstance(piped, t.InputRequiredResult) and piped.input_requests is not None
    assert list(piped.input_requests) == ["n.user_name"]


@pytest.mark.parametrize("era", [MODERN, LEGACY])
async def test_a_prompt_that_asks_gets_the_callers_answer(era: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with gateway("auto") as app, caller(app, era, answers) as c:  # a pinned era skips discovery
            got = await c.get_prompt("ds.topic")
    content = got.messages[0].content
    assert isinstance(content, t.TextContent) and content.text == "Write about anything"
    assert answers.asked == ["elicit: Which topic?"]


async def test_a_2025_downstream_cannot_ask_a_2026_caller_mid_call_and_the_call_says_why() -> None:
    with trio.fail_after(WAIT_S):
        async with gateway(LEGACY) as app, caller(app, MODERN, Answers()) as c:
            r = await c.call_tool("ds.delete", {"item": "logs"})
    assert r.is_error and "the caller speaks 2026-07-28" in text(r)


async def test_a_2025_downstream_question_is_refused_when_calls_of_two_requests_are_in_flight() -> None:
    release = trio.Event()
    first_asked = trio.Event()
    results: dict[str, t.CallToolResult] = {}

    async def slow_elicit(context: Any, params: Any) -> t.ElicitResult:
        first_asked.set()
        await release.wait()
        return t.ElicitResult(action="accept", content={"ok": True})

    with trio.fail_after(WAIT_S):
        async with (
            gateway(LEGACY) as app,
            Client(app.server, mode="legacy", elicitation_callback=slow_elicit) as a,
            Client(app.server, mode="legacy", **Answers().callbacks()) as b,
        ):

            async def call_a() -> None:
                results["a"] = await a.call_tool("ds.delete", {"item": "a"})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call_a)
                await first_asked.wait()
                with pytest.raises(MCPError) as refused:  # the downstream's error, as it answered it
                    await b.call_tool("ds.delete", {"item": "b"})
                release.set()
    assert text(results["a"]) == "deleted a"
    assert "the caller is ambiguous" in str(refused.value)


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_with_protocol_auto_a_2025_caller_reaches_a_tool_that_asks_the_2025_way_over_a_2025_session(
    transport: str,
) -> None:
    """Over HTTP by default; over stdio (a second process) when the config asks for it."""
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with (
            http_asking_server() if transport == "http" else _nothing() as url,
            gateway("auto", url, **({} if url else {"session_per_era": True})) as app,
            caller(app, LEGACY, answers) as old,
            caller(app, MODERN, Answers()) as new,
        ):
            ds = app.downstreams.servers[0]
            relayed = await old.call_tool("ds.old_style", {"item": "logs"})
            modern_call = await new.call_tool("ds.delete", {"item": "tmp"})
            assert ds.twin is not None
            sessions = (ds.connections, ds.twin.connections)
    assert text(relayed) == "deleted logs" and answers.asked == ["elicit: Delete logs?"]
    assert text(modern_call) == "deleted tmp"
    assert sessions == (1, 1)  # the 2026-07-28 session, and a 2025-11-25 one opened for the 2025-11-25 caller


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield None


async def test_over_stdio_there_is_one_session_unless_asked() -> None:
    with trio.fail_after(WAIT_S):
        async with gateway("auto") as app:
            twin = app.downstreams.servers[0].twin
    assert twin is None


@pytest.mark.parametrize(("era", "protocol"), RELAYED)
async def test_questions_are_relayed_over_real_http_on_both_sides(era: str, protocol: str) -> None:
    answers = Answers()
    stop = trio.Event()
    with trio.fail_after(WAIT_S):
        async with http_asking_server() as ds_url, gateway(protocol, ds_url) as app, trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
            try:
                mode = "legacy" if era == LEGACY else era
                async with Client(url, mode=mode, **answers.callbacks()) as c:
                    both = await c.call_tool("ds.both", {"item": "tmp"})
                    piped = await c.call_tool(
                        PIPE_TOOL, {"steps": [{"id": "s", "tool": "ds.summarize", "args": {"text": "t"}}]}
                    )
            finally:
                stop.set()
    assert text(both) == "deleted tmp in file:///work"
    assert piped.structured_content is not None and piped.structured_content["result"] == {"result": "summary: short"}
