"""Pipelines that ask the client, served by the real server and called with the SDK's Client (real
elicitation, sampling and roots callbacks), in memory and over HTTP, in both protocol eras.

Every scenario runs four ways: {2026-07-28 (suspend and resume), 2025-11-25 (ask over the session)} x
{in memory, HTTP on 127.0.0.1}. Side-effecting steps count their calls, so a resume that ran a finished
step again would show.
"""

from __future__ import annotations

from typing import Any

import mcp_types as t
import pytest
import trio
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY

from kit.interaction import (
    CHARGES,
    ERAS,
    SCHEMA,
    TRANSPORTS,
    WAIT_S,
    Answers,
    accept,
    client,
    first_round,
    served,
)
from kit.servers import http_server

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

both = pytest.mark.parametrize("era", ERAS)
anywhere = pytest.mark.parametrize("transport", TRANSPORTS)


@both
@anywhere
async def test_confirm_then_call_a_tool(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("confirm_pay", {"amount": 5})
    assert not r.is_error, r.content
    assert r.structured_content == {
        "confirm": {"action": "accept", "content": {"ok": True}},
        "paid": {"charged": 5, "n": 1},
    }
    assert answers.elicited == ["Charge 5?"]
    assert CHARGES == [5]


@both
@anywhere
async def test_a_declined_question_is_an_output_a_gate_can_test(era: str, transport: str) -> None:
    answers = Answers("decline")
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("confirm_pay", {"amount": 5})
    assert r.is_error
    assert "GATE_REJECTED" in r.content[0].text and "the user did not accept" in r.content[0].text
    assert CHARGES == []


@both
@anywhere
async def test_a_resume_never_runs_a_finished_step_again(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("prep_then_pay", {})
    assert not r.is_error, r.content
    assert r.structured_content == {"hold": 1, "pay": 2}
    assert CHARGES == [1, 2]


@both
@anywhere
async def test_sampling_twice_in_a_row(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("twice", {})
    assert not r.is_error, r.content
    assert r.structured_content == {"draft": "reply 1", "polish": "reply 2"}
    assert [block.text for [block] in answers.sampled] == ["Write a line", "Polish: reply 1"]


@both
@anywhere
async def test_gather_asks_three_questions_in_one_round(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("collect", {})
    assert not r.is_error, r.content
    out = r.structured_content
    assert out is not None
    assert out["confirm"] == {"action": "accept", "content": {"ok": True}}
    assert out["summary"]["text"] == "reply 1" and out["summary"]["model"] == "test-model"
    assert out["where"] == {"roots": [{"uri": "file:///work", "name": "work"}]}
    assert (len(answers.elicited), len(answers.sampled), answers.rooted) == (1, 1, 1)
    assert CHARGES == [7]


@both
@anywhere
async def test_gather_inside_a_parallel_group_leaves_its_sibling_alone(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("side_by_side", {})
    assert not r.is_error, r.content
    assert r.structured_content is not None
    assert r.structured_content["ask"]["a"]["action"] == "accept"
    assert sorted(answers.elicited) == ["A?", "B?"]
    assert CHARGES == [3, 4]


@both
@anywhere
async def test_mcp_pipe_asks_with_the_builtin_tools(era: str, transport: str) -> None:
    spec = {
        "steps": [
            {"id": "hold", "tool": "charge", "args": {"amount": 1}},
            {"id": "ok", "tool": "ask_user", "args": {"message": "Go?", "requested_schema": {"$literal": SCHEMA}}},
            {"id": "idea", "tool": "sample", "args": {"messages": "An idea about ${steps.ok.structured.action}"}},
            {"id": "where", "tool": "list_roots", "args": {}},
            {"id": "pay", "tool": "charge", "args": {"amount": 2}},
        ],
        "return": {
            "ok": {"$ref": "steps.ok.structured.action"},
            "idea": {"$ref": "steps.idea.structured.text"},
            "root": {"$ref": "steps.where.structured.roots.0.uri"},
        },
    }
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("mcp_pipe", spec)
    assert not r.is_error, r.content
    assert r.structured_content is not None
    assert r.structured_content["result"] == {"ok": "accept", "idea": "reply 1", "root": "file:///work"}
    assert [block.text for [block] in answers.sampled] == ["An idea about accept"]
    assert CHARGES == [1, 2]


@anywhere
async def test_a_missing_capability_fails_the_request_with_32021_on_2026(transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, answers, list_roots_callback=None) as c:
            with pytest.raises(MCPError) as caught:
                await c.call_tool("needs_roots", {})
            skipped = await c.call_tool("roots_or_skip", {})
    assert caught.value.code == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert caught.value.data == {"requiredCapabilities": {"roots": {}}}
    assert CHARGES == [9]  # the step before ran; nothing was asked
    assert skipped.structured_content == {"skipped": True}


@anywhere
async def test_a_missing_capability_fails_the_step_on_2025(transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "legacy", transport, answers, list_roots_callback=None) as c:
            r = await c.call_tool("needs_roots", {})
            skipped = await c.call_tool("roots_or_skip", {})
    assert r.is_error
    assert "did not declare the `roots` capability" in r.content[0].text
    assert skipped.structured_content == {"skipped": True}


async def test_the_missing_capability_error_is_http_400() -> None:
    import httpx2

    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "needs_roots",
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            },
        },
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "needs_roots",
    }
    with trio.fail_after(WAIT_S):
        async with served() as app, http_server(app) as url, httpx2.AsyncClient() as http:
            resp = await http.post(url, json=body, headers=headers)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY


# --- the 2026-07-28 rounds, driven by hand ---


@anywhere
async def test_the_input_required_result_keys_questions_by_step_id_and_token(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            single = await first_round(c, "confirm_pay", {"amount": 3})
            gathered = await first_round(c, "collect", {})
    assert single.result_type == "input_required" and single.request_state
    assert list(single.input_requests or {}) == ["confirm"]
    assert set(gathered.input_requests or {}) == {"confirm", "summary", "where"}
    assert isinstance((gathered.input_requests or {})["where"], t.ListRootsRequest)


@anywhere
async def test_tampered_and_foreign_state_is_invalid_params(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "confirm_pay", {"amount": 3})
            state = ir.request_state or ""
            flipped = state[:-3] + ("A" if state[-3] != "A" else "B") + state[-2:]
            for bad in (flipped, "v1.not-a-state", "plain text"):
                with pytest.raises(MCPError) as caught:
                    await c.session.call_tool(
                        "confirm_pay", {"amount": 3}, input_responses={"confirm": accept()}, request_state=bad
                    )
                assert caught.value.code == INVALID_PARAMS
                assert "Invalid requestState" in caught.value.message
            # A state resumes only the call it was minted for.
            with pytest.raises(MCPError) as other:
                await c.session.call_tool(
                    "confirm_pay", {"amount": 4}, input_responses={"confirm": accept()}, request_state=state
                )
            assert other.value.code == INVALID_PARAMS and other.value.data == {"reason": "other_call"}
    assert CHARGES == []


@anywhere
async def test_a_replayed_state_is_refused(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "confirm_pay", {"amount": 3})
            done = await c.session.call_tool(
                "confirm_pay", {"amount": 3}, input_responses={"confirm": accept()}, request_state=ir.request_state
            )
            assert isinstance(done, t.CallToolResult) and not done.is_error
            with pytest.raises(MCPError) as caught:
                await c.session.call_tool(
                    "confirm_pay", {"amount": 3}, input_responses={"confirm": accept()}, request_state=ir.request_state
                )
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {"reason": "replayed"}
    assert "already used" in caught.value.message
    assert CHARGES == [3]


@anywhere
async def test_a_replay_stays_refused_when_the_full_store_evicted_its_claim(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served(interaction={"max_claims": 1}) as app, client(app, "2026-07-28", transport, Answers()) as c:
            first = await first_round(c, "confirm_pay", {"amount": 3})
            second = await first_round(c, "confirm_pay", {"amount": 4})
            answer = {"confirm": accept()}
            for amount, ir in ((3, first), (4, second)):  # the second claim evicts the first
                done = await c.session.call_tool(
                    "confirm_pay", {"amount": amount}, input_responses=answer, request_state=ir.request_state
                )
                assert isinstance(done, t.CallToolResult) and not done.is_error
            with pytest.raises(MCPError) as caught:
                await c.session.call_tool(
                    "confirm_pay", {"amount": 3}, input_responses=answer, request_state=first.request_state
                )
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {"reason": "unverifiable"}
    assert "cannot tell whether this state was already used" in caught.value.message
    assert CHARGES == [3, 4]


@anywhere
async def test_a_retry_lacking_an_answer_is_asked_again_for_what_is_missing(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "collect", {})
            partial_answers: dict[str, Any] = {
                "confirm": accept(),
                "where": t.ListRootsResult(roots=[]),
                "nobody_asked": accept(),
            }
            again = await c.session.call_tool(
                "collect",
                {},
                input_responses=partial_answers,
                request_state=ir.request_state,
                allow_input_required=True,
            )
            assert isinstance(again, t.InputRequiredResult)
            assert list(again.input_requests or {}) == ["summary"]
            sample = t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="s"), model="m")
            done = await c.session.call_tool(
                "collect", {}, input_responses={"summary": sample}, request_state=again.request_state
            )
    assert isinstance(done, t.CallToolResult) and not done.is_error
    assert done.structured_content is not None
    assert done.structured_content["confirm"]["action"] == "accept"
    assert done.structured_content["summary"]["text"] == "s"
    assert done.structured_content["where"] == {"roots": []}
    assert CHARGES == [7]


async def test_a_large_state_stays_in_the_store_behind_a_handle() -> None:
    with trio.fail_after(WAIT_S):
        async with served(interaction={"inline_max_bytes": 64}) as app:
            store = app.handlers.interactions.store
            async with client(app, "2026-07-28", "memory", Answers()) as c:
                ir = await first_round(c, "prep_then_pay", {})
                assert len(store) == 1  # the state's blob
                assert len(ir.request_state or "") < 400
                done = await c.session.call_tool(
                    "prep_then_pay", {}, input_responses={"confirm": accept()}, request_state=ir.request_state
                )
    assert isinstance(done, t.CallToolResult) and not done.is_error
    assert done.structured_content == {"hold": 1, "pay": 2}


@anywhere
async def test_questions_of_parallel_children_are_asked_in_one_round(transport: str) -> None:
    spec = {
        "steps": [
            {
                "id": "both",
                "parallel": [
                    {"id": "a", "tool": "ask_user", "args": {"message": "A?"}},
                    {"id": "b", "tool": "ask_user", "args": {"message": "B?"}},
                    {"id": "pay", "tool": "charge", "args": {"amount": 1}},
                ],
            }
        ]
    }
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "mcp_pipe", spec)
            assert set(ir.input_requests or {}) == {"both.a", "both.b"}
            assert CHARGES == [1]  # the sibling finished; it is not cancelled by the others' suspension
            done = await c.session.call_tool(
                "mcp_pipe",
                spec,
                input_responses={"both.a": accept(), "both.b": t.ElicitResult(action="decline")},
                request_state=ir.request_state,
            )
    assert isinstance(done, t.CallToolResult) and not done.is_error
    assert done.structured_content is not None
    outputs = done.structured_content["result"]
    assert outputs["a"]["action"] == "accept" and outputs["b"]["action"] == "decline"
    assert CHARGES == [1]
