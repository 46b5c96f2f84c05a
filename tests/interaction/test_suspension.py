"""The pieces of suspension on their own (the pipeline store, the state sealer) and the end-to-end cases
the scenarios file leaves out: another principal resuming, expiry, nesting, timeouts, the audit trail."""

from __future__ import annotations

import json
import sys
from typing import Any

import mcp_types as t
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from kit.audit import WatchedAudit
from kit.clients import bearer_client
from kit.interaction import CHARGES, PIPELINES, SCHEMA, Answers, client, first_round, served
from kit.servers import http_server
from mcpipe.config import parse_config
from mcpipe.gateway import AuditLog
from mcpipe.interaction import InMemoryPipelineStore, Interactions, StateError, StateSealer, args_digest
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 20
KEY = "k" * 32


class Clock:
    """A settable wall clock for expiries."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# --- the pipeline store ---


async def test_the_store_gives_a_blob_once_and_refuses_a_second_claim() -> None:
    clock = Clock()
    store = InMemoryPipelineStore(clock=clock)
    await store.put("h", b"blob", clock.now + 10)
    assert await store.take("h") == b"blob"
    assert await store.take("h") is None
    assert await store.claim("jti", clock.now + 10) is True
    assert await store.claim("jti", clock.now + 10) is False


async def test_an_expired_blob_is_not_given() -> None:
    clock = Clock()
    store = InMemoryPipelineStore(clock=clock)
    await store.put("h", b"blob", clock.now + 10)
    clock.now += 11
    assert await store.take("h") is None


async def test_the_sweeper_started_with_nursery_start_drops_expired_entries(autojump_clock: Any) -> None:
    clock = Clock()
    store = InMemoryPipelineStore(clock=clock, interval_s=30)
    await store.put("old", b"x", clock.now + 10)
    await store.claim("used", clock.now + 10)
    await store.put("young", b"y", clock.now + 1000)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            assert len(store) == 3
            clock.now += 20
            await trio.sleep(31)  # virtual time: one sweep
            assert len(store) == 1
            nursery.cancel_scope.cancel()
    assert await store.take("young") == b"y"


# --- the sealer ---


def sealer(clock: Clock, **kw: Any) -> StateSealer:
    return StateSealer(InMemoryPipelineStore(clock=clock), keys=[KEY], clock=clock, **kw)


BINDING = {"tool": "pay", "digest": args_digest("pay", {"amount": 1}), "principal": "alice"}
STATE = {"memo": {"a": {"ok": True}}, "answers": {}, "pending": {}}


async def test_a_state_round_trips_once() -> None:
    s = sealer(Clock())
    token = await s.seal(STATE, **BINDING)
    assert "memo" not in token and "alice" not in token  # encrypted, not merely signed
    assert await s.unseal(token, **BINDING) == STATE
    with pytest.raises(StateError) as again:
        await s.unseal(token, **BINDING)
    assert again.value.reason == "replayed"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"principal": "bob"}, "other_principal"),
        ({"principal": None}, "other_principal"),
        ({"tool": "refund"}, "other_call"),
        ({"digest": args_digest("pay", {"amount": 2})}, "other_call"),
    ],
)
async def test_a_state_resumes_only_its_own_call_and_principal(change: dict[str, Any], reason: str) -> None:
    s = sealer(Clock())
    token = await s.seal(STATE, **BINDING)
    with pytest.raises(StateError) as caught:
        await s.unseal(token, **{**BINDING, **change})
    assert caught.value.reason == reason
    # A refused attempt does not use the state up.
    assert await s.unseal(token, **BINDING) == STATE


async def test_an_expired_state_is_refused() -> None:
    clock = Clock()
    s = sealer(clock, ttl_s=60)
    token = await s.seal(STATE, **BINDING)
    clock.now += 61
    with pytest.raises(StateError) as caught:
        await s.unseal(token, **BINDING)
    assert caught.value.reason == "expired"


async def test_a_state_sealed_under_another_key_is_tampered() -> None:
    clock = Clock()
    other = StateSealer(InMemoryPipelineStore(clock=clock), keys=["o" * 32], clock=clock)
    token = await other.seal(STATE, **BINDING)
    with pytest.raises(StateError) as caught:
        await sealer(clock).unseal(token, **BINDING)
    assert caught.value.reason == "tampered"


async def test_a_rotated_key_still_opens_states_sealed_before() -> None:
    clock = Clock()
    store = InMemoryPipelineStore(clock=clock)
    old = StateSealer(store, keys=[KEY], clock=clock)
    token = await old.seal(STATE, **BINDING)
    rotated = StateSealer(store, keys=["n" * 32, KEY], clock=clock)
    assert await rotated.unseal(token, **BINDING) == STATE


async def test_a_configured_key_variable_that_is_unset_gives_a_process_key_not_the_default_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCPIPE_STATE_KEY", KEY)
    monkeypatch.delenv("MCPIPE_TEST_OTHER_KEY", raising=False)
    config = parse_config('[interaction]\nstate_key_env = "MCPIPE_TEST_OTHER_KEY"\n')
    made = Interactions.from_config(config.interaction)
    assert made.sealer.ephemeral
    token = await StateSealer(InMemoryPipelineStore(), keys=[KEY]).seal(STATE, **BINDING)
    with pytest.raises(StateError) as caught:
        await made.sealer.unseal(token, **BINDING)
    assert caught.value.reason == "tampered"


async def test_a_large_state_travels_as_a_handle_that_works_once() -> None:
    clock = Clock()
    s = sealer(clock, inline_max_bytes=16)
    token = await s.seal(STATE, **BINDING)
    assert len(s.store) == 1  # type: ignore[arg-type]
    assert await s.unseal(token, **BINDING) == STATE
    assert len(s.store) == 1  # type: ignore[arg-type]  # the blob went, the claim stays until it expires


# --- end to end ---


TOKENS = {"T_ALICE": "alice-secret", "T_BOB": "bob-secret"}
AUTH = {"tokens": [{"env": "T_ALICE", "principal": "alice"}, {"env": "T_BOB", "principal": "bob"}]}


async def test_resuming_as_another_principal_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)  # the HTTP layer reads the tokens from the environment
    with trio.fail_after(WAIT_S):
        async with served(TOKENS, auth=AUTH) as app, http_server(app) as url:
            async with bearer_client(url, "alice-secret", "2026-07-28", **Answers().callbacks()) as alice:
                ir = await first_round(alice, "confirm_pay", {"amount": 3})
            async with bearer_client(url, "bob-secret", "2026-07-28", **Answers().callbacks()) as bob:
                with pytest.raises(MCPError) as caught:
                    await bob.session.call_tool(
                        "confirm_pay",
                        {"amount": 3},
                        input_responses={"confirm": t.ElicitResult(action="accept", content={"ok": True})},
                        request_state=ir.request_state,
                    )
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {"reason": "other_principal"}
    assert CHARGES == []


async def test_an_expired_state_is_invalid_params_on_the_wire() -> None:
    clock = Clock()
    with trio.fail_after(WAIT_S):
        async with served() as app:
            app.handlers.interactions = Interactions(keys=[KEY], ttl_s=60, clock=clock)
            async with client(app, "2026-07-28", "memory", Answers()) as c:
                ir = await first_round(c, "confirm_pay", {"amount": 3})
                clock.now += 61
                with pytest.raises(MCPError) as caught:
                    await c.session.call_tool(
                        "confirm_pay",
                        {"amount": 3},
                        input_responses={"confirm": t.ElicitResult(action="accept", content={"ok": True})},
                        request_state=ir.request_state,
                    )
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {"reason": "expired"} and "expired" in caught.value.message


NESTED = {
    "steps": [
        {"id": "hold", "tool": "charge", "args": {"amount": 1}},
        {"id": "declared", "tool": "prep_then_pay", "args": {}},
        {
            "id": "inner",
            "pipe": {
                "steps": [
                    {"id": "confirm", "tool": "ask_user", "args": {"message": "Inner?"}},
                    {"id": "pay", "tool": "charge", "args": {"amount": 5}},
                ]
            },
        },
    ],
    "return": {"declared": {"$ref": "steps.declared.structured"}, "inner": {"$ref": "steps.inner.result"}},
}


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
async def test_questions_asked_inside_nested_pipelines_resume_without_rerunning_anything(era: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, "memory", answers) as c:
            r = await c.call_tool("mcp_pipe", NESTED)
    assert not r.is_error, r.content
    assert r.structured_content is not None
    assert r.structured_content["result"]["declared"] == {"hold": 2, "pay": 3}
    assert answers.elicited == ["Go on?", "Inner?"]
    # hold(1), then the declared pipeline's hold(1) and pay(2), then the nested pipe's pay(5): once each.
    assert CHARGES == [1, 1, 2, 5]


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
async def test_the_tools_can_be_called_directly(era: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, "memory", answers) as c:
            r = await c.call_tool("ask_user", {"message": "Hello?", "requested_schema": SCHEMA})
            roots = await c.call_tool("list_roots", {})
    assert r.structured_content == {"action": "accept", "content": {"ok": True}}
    assert roots.structured_content == {"roots": [{"uri": "file:///work", "name": "work"}]}


async def test_on_2025_a_question_waits_under_the_step_deadline() -> None:
    async def never(context: Any, params: Any) -> t.ElicitResult:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    spec = {"steps": [{"id": "q", "tool": "ask_user", "args": {"message": "?"}, "timeout_ms": 100}]}
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "legacy", "memory", Answers(), elicitation_callback=never) as c:
            r = await c.call_tool("mcp_pipe", spec)
    assert r.is_error
    assert r.structured_content is not None and r.structured_content["error_code"] == "TIMEOUT"


async def test_a_suspended_round_is_audited_as_suspended() -> None:
    audit = AuditLog(None, keep=True)
    spec = {"steps": [{"id": "q", "tool": "ask_user", "args": {"message": "?"}}]}
    config = parse_config(json.dumps({"audit": {"enabled": False}}), "json", environ={})
    with trio.fail_after(WAIT_S):
        async with (
            open_app(config, audit=audit) as app,
            Client(app.server, mode="2026-07-28", elicitation_callback=Answers().elicit) as c,
        ):
            r = await c.call_tool("mcp_pipe", spec)
    assert not r.is_error
    codes = [(rec["tool"], rec["error_code"]) for rec in audit.records or []]
    assert codes == [("ask_user", "SUSPENDED"), ("mcp_pipe", "SUSPENDED"), ("ask_user", None), ("mcp_pipe", None)]


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_pipeline_that_asks_still_reports_progress(era: str, transport: str) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    spec = {
        "steps": [
            {"id": "hold", "tool": "charge", "args": {"amount": 1}},
            {"id": "ok", "tool": "ask_user", "args": {"message": "Go?"}},
            {"id": "pay", "tool": "charge", "args": {"amount": 2}},
        ]
    }
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, Answers()) as c:
            r = await c.call_tool("mcp_pipe", spec, progress_callback=on_progress)
    assert not r.is_error, r.content
    assert CHARGES == [1, 2]
    assert seen and seen[-1] == 3.0


async def test_on_2025_cancelling_the_call_cancels_the_wait_for_an_answer() -> None:
    audit = WatchedAudit()
    asked = trio.Event()

    async def hold(context: Any, params: Any) -> t.ElicitResult:
        asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    spec = {
        "steps": [{"id": "q", "tool": "ask_user", "args": {"message": "?"}}, {"tool": "charge", "args": {"amount": 1}}]
    }
    config = parse_config(
        json.dumps({"audit": {"enabled": False}, "python_tools": ["kit.interaction:side_tools"]}), "json", environ={}
    )
    CHARGES.clear()
    with trio.fail_after(WAIT_S):
        async with (
            open_app(config, audit=audit) as app,
            Client(app.server, mode="legacy", elicitation_callback=hold) as c,
        ):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(c.call_tool, "mcp_pipe", spec)
                await asked.wait()
                nursery.cancel_scope.cancel()  # the client gives up: notifications/cancelled
            await audit.until_any(lambda r: r["tool"] == "mcp_pipe")
    records = {r["tool"]: r["error_code"] for r in audit.records or []}
    assert records == {"ask_user": "CANCELLED", "mcp_pipe": "CANCELLED"}
    assert CHARGES == []


async def test_a_state_from_another_server_sharing_the_key_is_refused() -> None:
    clock = Clock()
    store = InMemoryPipelineStore(clock=clock)
    token = await StateSealer(store, keys=[KEY], audience="billing", clock=clock).seal(STATE, **BINDING)
    with pytest.raises(StateError) as caught:
        await StateSealer(store, keys=[KEY], audience="search", clock=clock).unseal(token, **BINDING)
    assert caught.value.reason == "other_server"


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
async def test_in_a_gather_only_the_entry_that_may_skip_is_skipped(era: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, "memory", answers, list_roots_callback=None) as c:
            r = await c.call_tool("collect_or_skip", {})
    assert not r.is_error, r.content
    assert r.structured_content == {
        "confirm": {"action": "accept", "content": {"ok": True}},
        "where": {"skipped": True},
    }
    assert answers.elicited == ["Sure?"]


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
async def test_a_declared_pipeline_asks_over_stdio(era: str, tmp_path: Any) -> None:
    config = tmp_path / "mcpipe.json"
    twice = next(p for p in PIPELINES if p["name"] == "twice")
    config.write_text(json.dumps({"audit": {"enabled": False}, "pipelines": [twice]}))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcpipe", "serve", "--stdio", "--config", str(config)], cwd=tmp_path
    )
    answers = Answers()
    with trio.fail_after(30):
        async with Client(params, mode=era, **answers.callbacks()) as c:
            r = await c.call_tool("twice", {})
    assert not r.is_error, r.content
    assert r.structured_content == {"draft": "reply 1", "polish": "reply 2"}


async def test_without_a_state_key_only_a_suspension_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MCPIPE_STATE_KEY", raising=False)
    spec = {"steps": [{"id": "q", "tool": "ask_user", "args": {"message": "?"}}]}
    config = parse_config(json.dumps({"audit": {"enabled": False}}), "json", environ={})
    caplog.set_level("INFO", logger="mcpipe")
    with trio.fail_after(WAIT_S):
        async with open_app(config) as app:
            started = [r.getMessage() for r in caplog.records if "MCPIPE_STATE_KEY" in r.getMessage()]
            async with Client(app.server, mode="2026-07-28", elicitation_callback=Answers().elicit) as c:
                await c.call_tool("echo", {"x": 1})
                for _ in range(2):
                    await c.call_tool("mcp_pipe", spec)
    told = [r for r in caplog.records if "MCPIPE_STATE_KEY" in r.getMessage()]
    assert started == []
    assert [(r.levelname, r.getMessage()) for r in told] == [
        ("WARNING", "a pipeline is suspended, and no MCPIPE_STATE_KEY is set: only this process can resume it")
    ]


async def test_a_state_whose_claim_the_full_store_evicted_is_refused_as_unverifiable_not_resumed() -> None:
    clock = Clock()
    s = StateSealer(InMemoryPipelineStore(clock=clock, max_claims=2), keys=[KEY], clock=clock)
    tokens = []
    for _ in range(3):
        tokens.append(await s.seal(STATE, **BINDING))
        clock.now += 1  # each state expires a second after the one before
    for token in tokens:
        assert await s.unseal(token, **BINDING) == STATE
    with pytest.raises(StateError) as first:
        await s.unseal(tokens[0], **BINDING)  # its claim went to keep the store within 2
    assert first.value.reason == "unverifiable"
    assert "call the tool again" in str(first.value)
    with pytest.raises(StateError) as second:
        await s.unseal(tokens[1], **BINDING)
    assert second.value.reason == "replayed"
    assert await s.unseal(await s.seal(STATE, **BINDING), **BINDING) == STATE
