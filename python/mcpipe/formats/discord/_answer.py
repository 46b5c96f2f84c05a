"""discord-mcp's answers to ``mcp_pipeline``, made from mcpipe's.

A run answers ``{steps: [...], variables, total_duration_ms, aborted}`` (``isError`` false, aborted or not)
with a short Markdown summary as its text, as ``tools/meta/pipeline.ts`` does; a call that fails discord's
input schema answers its ``VALIDATION_FAILED`` error envelope (``errors/format.ts``); a call refused before
anything runs (a nested pipeline, a reference to no earlier step, an unknown or forbidden tool) answers as
discord's recursion guard does: every step listed, the refused ones in error, the others skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcpipe.errors import ErrorCode
from mcpipe.formats.discord._steps import DiscordStep, Issue, Rejection
from mcpipe.tools import ToolResult

__all__ = ["RECURSION", "discord_answer", "rejected_answer", "summary_text", "validation_answer"]

RECURSION = "PIPELINE_RECURSION"
RECURSION_MESSAGE = "Nested mcp_pipeline calls are not permitted (v1)."
# mcpipe's codes as discord's executor reports them: a tool that raised is its catch branch.
_CODES = {ErrorCode.TOOL_FAILED: "PIPELINE_INTERNAL"}


def _ms(value: float) -> str:
    """``Number.toFixed(0)``."""
    return str(int(value + 0.5)) if value >= 0 else f"{value:.0f}"


def summary_text(records: Sequence[dict[str, Any]], aborted: bool, total_ms: float) -> str:
    """The text block of a run's answer (``pipeline.ts``'s summary)."""
    ok = sum(1 for r in records if r["status"] == "success")
    head = f"**Pipeline {'⚠️ aborted' if aborted else '✅ complete'}** - {ok}/{len(records)} success ({_ms(total_ms)}ms)"
    lines = [
        f"- {r['id']} ({r['tool']}) - {r['status']}"
        + (f" [{r['error']['code']}]" if "error" in r else "")
        + f" ({_ms(r['duration_ms'])}ms)"
        for r in records
    ]
    return "\n".join([head, *lines])


def _error(r: dict[str, Any]) -> dict[str, Any]:
    """A failed step's ``error`` as discord's executor fills it in."""
    code = r["error_code"]
    if code == ErrorCode.TOOL_ERROR:
        # The tool's own error result: its structured `code` and `retriable`, its first text block.
        payload = r.get("structured")
        payload = payload if isinstance(payload, dict) else {}
        content = r.get("content") or []
        first = content[0] if content and isinstance(content[0], dict) else {}
        return {
            "code": payload.get("code") if payload.get("code") is not None else "UNKNOWN",
            "message": first.get("text", "") if first.get("type") == "text" else "",
            "retriable": payload.get("retriable") is True,
        }
    return {"code": _CODES.get(code, code), "message": r["error"], "retriable": False}


def _record(st: DiscordStep, status: str, duration_ms: float, **given: object) -> dict[str, Any]:
    """One step's record of the answer (its ``result`` or ``error`` before ``duration_ms``, as discord's)."""
    return {"id": st.id, "tool": st.tool, "status": status, **given, "duration_ms": duration_ms}


def discord_answer(answer: dict[str, Any], steps: Sequence[DiscordStep], ids: Sequence[str]) -> ToolResult:
    """The answer of a run, from mcpipe's full answer (``answer: full``).

    Args:
        answer: the scheduler's answer.
        steps: the steps as discord sees them.
        ids: each step's id in the plan.
    """
    results = answer.get("steps") or {}
    records: list[dict[str, Any]] = []
    variables: dict[str, Any] = {}
    aborted = False
    for st, pid in zip(steps, ids, strict=True):
        r = results.get(pid)
        if r is None:
            aborted = True  # the run stopped before this step: it is left out, as discord breaks out of its loop
            break
        if r.get("skipped"):
            records.append(_record(st, "skipped", 0))
        elif r["ok"]:
            data = r.get("output")
            variables[st.id] = data
            if st.save_as is not None:
                variables[st.save_as] = data
            records.append(_record(st, "success", r["duration_ms"], result=data))
        else:
            records.append(_record(st, "error", r["duration_ms"], error=_error(r)))
            if not st.continue_on_error or r["error_code"] == ErrorCode.CANCELLED:
                aborted = True
    if not answer.get("ok") and not any(r["status"] == "error" for r in records):
        aborted = True  # the run failed beyond its steps (its deadline, the answer's size)
    total = answer.get("duration_ms", 0.0)
    data = {"steps": records, "variables": variables, "total_duration_ms": total, "aborted": aborted}
    return ToolResult([{"type": "text", "text": summary_text(records, aborted, total)}], data)


def rejected_answer(steps: Sequence[DiscordStep], rejections: Sequence[Rejection]) -> ToolResult:
    """A call refused before any step runs, answered as discord's recursion guard answers: the refused steps
    in error, every other step skipped, ``aborted``."""
    by_index = {x.index: x for x in reversed(rejections)}  # the first reason a step was refused
    records = [
        _record(st, "skipped", 0)
        if (r := by_index.get(i)) is None
        else _record(st, "error", 0, error={"code": r.code, "message": r.message, "retriable": False})
        for i, st in enumerate(steps)
    ]
    first = rejections[0]
    if first.code == RECURSION:
        text = "**Pipeline rejected**: nested mcp_pipeline calls are not permitted."
    else:
        text = f"**Pipeline rejected** ({first.code}): {first.message}"
    data = {"steps": records, "variables": {}, "total_duration_ms": 0, "aborted": True}
    return ToolResult([{"type": "text", "text": text}], data)


def validation_answer(issues: Sequence[Issue]) -> ToolResult:
    """discord's ``VALIDATION_FAILED`` error result for arguments its input schema refuses."""
    first = issues[0]
    hint = f"Fix `{first.path}`: {first.message}"
    text = "**Input Error**\n\n" + "\n".join(f"- `{i.path}`: {i.message}" for i in issues) + f"\n\n**Recovery**: {hint}"
    structured = {
        "code": "VALIDATION_FAILED",
        "retriable": False,
        "category": "client",
        "recovery_hint": hint,
        "issues": [{"path": i.path, "message": i.message, "code": i.code} for i in issues],
    }
    return ToolResult([{"type": "text", "text": text}], structured, is_error=True)
