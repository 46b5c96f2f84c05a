"""``retry`` on a tool step (issue 17): only idempotent tools, only retryable failures, every attempt
audited by the gateway."""

from __future__ import annotations

from typing import Any

import trio

from kit.audit import WatchedAudit
from mcpipe.compile import Limits
from mcpipe.gateway import Gateway
from mcpipe.runtime import run_pipeline
from mcpipe.tools import ToolRegistry, ToolResult


def flaky_tools(failures: int) -> tuple[ToolRegistry, list[int]]:
    """``flaky`` fails its first ``failures`` calls as a broken connection would; ``plain`` is the same
    tool without the idempotent annotation; ``refuses`` answers a tool error (not retryable)."""
    reg = ToolRegistry()
    calls: list[int] = []

    async def body(n: int) -> dict[str, Any]:
        calls.append(n)
        await trio.lowlevel.checkpoint()
        if len(calls) <= failures:
            raise ConnectionResetError("connection reset by peer")
        return {"n": n, "calls": len(calls)}

    @reg.tool(annotations={"idempotentHint": True})
    async def flaky(n: int = 0) -> dict[str, Any]:
        """Fail the first calls, then answer."""
        return await body(n)

    @reg.tool
    async def plain(n: int = 0) -> dict[str, Any]:
        """The same, not marked idempotent."""
        return await body(n)

    @reg.tool(annotations={"idempotentHint": True})
    async def refuses() -> ToolResult:
        """A handled failure."""
        calls.append(-1)
        return ToolResult.error("no")

    return reg, calls


async def run(spec: dict[str, Any], reg: ToolRegistry, **kw: Any) -> tuple[dict[str, Any], WatchedAudit]:
    audit = WatchedAudit()
    with trio.fail_after(30):
        answer = await run_pipeline(spec, Gateway([reg], audit=audit), **kw)
    return answer, audit


async def test_a_retryable_failure_is_retried_with_backoff_and_every_attempt_is_audited(autojump_clock):
    reg, _calls = flaky_tools(failures=2)
    t0 = trio.current_time()
    spec = {"steps": [{"id": "f", "tool": "flaky", "retry": {"attempts": 3, "backoff_ms": 200}}]}
    answer, audit = await run(spec, reg)
    assert answer["ok"] is True
    assert answer["result"] == {"n": 0, "calls": 3}
    assert answer["steps"]["f"]["attempts"] == 3
    assert trio.current_time() - t0 >= 0.6  # 200 ms, then 400 ms
    records = [(r["tool"], r["ok"], r["error_code"]) for r in audit.records]
    assert records == [("flaky", False, "TOOL_FAILED"), ("flaky", False, "TOOL_FAILED"), ("flaky", True, None)]


async def test_retries_stop_after_the_attempts_and_the_step_fails_with_the_last_error(autojump_clock):
    reg, calls = flaky_tools(failures=5)
    answer, audit = await run({"steps": [{"tool": "flaky", "retry": {"attempts": 2, "backoff_ms": 10}}]}, reg)
    assert answer["ok"] is False
    assert answer["error"] == "step 'step1' failed: ConnectionResetError: connection reset by peer"
    assert len(calls) == 2 and len(audit.records) == 2


async def test_a_tool_error_is_not_retried(autojump_clock):
    reg, calls = flaky_tools(failures=0)
    answer, _ = await run({"steps": [{"tool": "refuses", "retry": {"attempts": 3}}]}, reg)
    assert answer["error_code"] == "TOOL_ERROR"
    assert calls == [-1]


async def test_a_step_that_times_out_is_retried_and_the_last_timeout_fails_it(autojump_clock):
    reg = ToolRegistry()
    calls: list[float] = []

    @reg.tool(annotations={"idempotentHint": True})
    async def slow() -> dict[str, Any]:
        calls.append(trio.current_time())
        await trio.sleep(10 if len(calls) < 2 else 0)
        return {"done": len(calls)}

    ok, _ = await run({"steps": [{"tool": "slow", "timeout_ms": 100, "retry": {"attempts": 2, "backoff_ms": 0}}]}, reg)
    assert ok["result"] == {"done": 2}
    calls.clear()
    spec = {"steps": [{"tool": "slow", "timeout_ms": 100, "retry": {"attempts": 1}}]}
    failed, _ = await run(spec, reg)
    assert failed["error_code"] == "TIMEOUT"


async def test_a_retry_on_a_tool_not_marked_idempotent_is_refused_before_anything_runs():
    reg, calls = flaky_tools(failures=0)
    spec = {"steps": [{"tool": "flaky"}, {"id": "p", "tool": "plain", "retry": {"attempts": 2}}]}
    answer, audit = await run(spec, reg)
    assert calls == [] and audit.records == []
    assert answer["error_code"] == "INVALID_SPEC"
    assert [(p["location"], p["message"]) for p in answer["problems"]] == [
        (
            "steps[1].retry",
            "tool 'plain' is not marked idempotent, so it cannot be retried (its annotations say idempotentHint, "
            "or the operator lists it in pipe.idempotent_tools)",
        )
    ]


async def test_the_operator_may_mark_tools_idempotent(autojump_clock):
    reg, calls = flaky_tools(failures=1)
    spec = {"steps": [{"tool": "plain", "retry": {"attempts": 2, "backoff_ms": 1}}]}
    answer, _ = await run(spec, reg, limits=Limits(idempotent_tools=("pl*",)))
    assert answer["ok"] is True and len(calls) == 2


async def test_bad_retry_settings_are_refused_located():
    reg, _ = flaky_tools(failures=0)
    answer, _ = await run({"steps": [{"tool": "flaky", "retry": {"attempts": 0}}]}, reg)
    assert [(p["location"], p["message"]) for p in answer["problems"]] == [
        ("steps[0].retry.attempts", "Expected `int` >= 1")
    ]
