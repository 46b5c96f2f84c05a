"""Step results: what a step produced, in the contract's terms (section 3), built in one place.

- :class:`StepOutput` is what a step kind answers (``output``, ``structured``, ``text``, ``content``,
  ``ok``, ``error``, ``error_code``, ``skipped``); :class:`StepFailure` is how a kind fails its step.
- :func:`tool_output` reads a tool's answer the same way for every step that calls a tool.
- The ``*_result`` builders make the result objects the scheduler records in ``steps`` (leaf, parallel
  group, nested pipe) and :func:`invalid_answer` the answer of a spec that fails validation.
- :func:`shape_answer` sizes an answer for the model that reads it (the spec's ``answer``: the result only,
  a summary per step, or the full records) and :func:`pipe_envelope` makes it a tool result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Literal

import orjson

from mcpipe._json import dumps
from mcpipe.errors import ErrorCode, Problem, SpecError
from mcpipe.tools import ToolResult

__all__ = [
    "ANSWER_MODES",
    "AnswerMode",
    "StepFailure",
    "StepOutput",
    "each_result",
    "graph_result",
    "group_result",
    "invalid_answer",
    "leaf_result",
    "ms_since",
    "pipe_envelope",
    "pipe_result",
    "preview",
    "shape_answer",
    "step_summary",
    "tool_output",
    "tool_result",
]


AnswerMode = Literal["result", "steps", "full"]
"""What a pipeline's answer holds (the spec's ``answer``): ``result``: the result, and what ran only when the run
failed; ``steps``: the result and a summary of every step; ``full``: every step's full record (contract
section 7)."""

ANSWER_MODES: tuple[AnswerMode, ...] = ("result", "steps", "full")

# The fields of a step result that hold (a copy of) its output: a summary leaves them out.
_OUTPUT_FIELDS = frozenset({"structured", "text", "content", "output", "result"})
_CONTAINERS = frozenset({"parallel", "pipe", "for_each"})


class StepFailure(Exception):
    """Raised by a kind's runner to fail its step with a message, a code and (optionally) an output.

    Attributes:
        code: the error code (``TOOL_ERROR``, ``TOOL_FAILED``, ``FORBIDDEN``, ``GATE_REJECTED``, ...).
        output: what the step produced before failing (the HTTP status and body, the command's stderr),
            kept in the step result for debugging; None when there is nothing.
        facts: more fields of the failed step's result (a downstream server's ``jsonrpc_error``).
    """

    def __init__(
        self,
        message: str,
        code: str = ErrorCode.TOOL_FAILED,
        output: object = None,
        facts: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.output = output
        self.facts = facts or {}


def ms_since(t0: float) -> float:
    """Milliseconds since ``t0`` (``perf_counter``), to the microsecond."""
    # int() rather than round(x, 3), which costs as much as a step.
    return int((perf_counter() - t0) * 1_000_000) / 1000


def tool_output(res: ToolResult) -> tuple[Any, str]:
    """``(structured, text)`` of a tool's answer: its structured content, else one text block that holds a
    JSON object or array, parsed; the text is the text of its text blocks."""
    content = res.content
    structured = res.structured
    if len(content) == 1:
        block = content[0]
        text = block.get("text", "") if block.get("type") == "text" else ""
        if structured is None and text:
            first = text[0]
            if first == "{" or first == "[" or (first.isspace() and text.lstrip()[:1] in ("{", "[")):
                try:
                    structured = orjson.loads(text)
                except orjson.JSONDecodeError:
                    pass
    else:
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    return structured, text


@dataclass(slots=True)
class StepOutput:
    """What a step kind produced, in the contract's step-result terms (section 3).

    Attributes:
        output: the step's ``output`` (``structured`` if not None, else ``text``).
        structured: the structured value (None when the output is text).
        text: the text (``""`` when the output is structured and the kind produced no text).
        content: MCP content blocks (only the ``tool`` kind has them; else ``[]``).
        ok: False when the step failed.
        error: why it failed (``""`` on success).
        error_code: a stable code (contract section 6) or None.
        skipped: True when ``when`` was false (or a ``progress`` step had no progress token).
        facts: more fields of a failed step's result (a downstream server's ``jsonrpc_error``).
    """

    output: Any = None
    structured: Any = None
    text: str = ""
    content: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = True
    error: str = ""
    error_code: str | None = None
    skipped: bool = False
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: object) -> StepOutput:
        """A successful output: a string is text, anything else structured."""
        if isinstance(value, str):
            return cls(value, None, value)
        return cls(value, value)

    @classmethod
    def failure(cls, message: str, code: str, output: object = None, facts: dict[str, Any] | None = None) -> StepOutput:
        """A failed step; ``output`` (if any) is kept as the structured value for debugging, ``facts`` are
        more fields of its result."""
        out = cls.of(output) if output is not None else cls()
        out.ok, out.error, out.error_code = False, message, code
        if facts:
            out.facts = facts
        return out

    @classmethod
    def skip(cls) -> StepOutput:
        """A skipped step: ok, with a null output."""
        return cls(skipped=True)

    @classmethod
    def from_tool(cls, res: ToolResult) -> StepOutput:
        """A ``tool`` step's output from what the tool answered (the same rules as ``mcp_pipe``)."""
        structured, text = tool_output(res)
        out = cls(structured if structured is not None else text, structured, text, res.content)
        if res.is_error:
            out.ok, out.error, out.error_code = False, text or "the tool reported an error", ErrorCode.TOOL_ERROR
        return out

    def result(self, step_id: str, kind: str, duration_ms: float) -> dict[str, Any]:
        """The step result object of contract section 3, plus ``skipped`` (and the failure's ``facts``)."""
        r: dict[str, Any] = {
            "id": step_id,
            "kind": kind,
            "ok": self.ok,
            "error": self.error,
            "error_code": self.error_code,
            "structured": self.structured,
            "text": self.text,
            "content": self.content,
            "output": self.output,
            "skipped": self.skipped,
            "duration_ms": duration_ms,
        }
        if self.facts:
            r.update(self.facts)
        return r


def leaf_result(
    sid: str, ok: bool, error: str, code: str | None, t0: float, *, kind: str = "tool", skippable: bool = False
) -> dict[str, Any]:
    """A leaf's result when it produced nothing (it failed before or instead of answering, was cancelled,
    or was skipped): no output. ``skippable`` results (declared steps) carry ``skipped: false``."""
    r: dict[str, Any] = {
        "id": sid,
        "kind": kind,
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": None,
        "text": "",
        "content": [],
        "output": None,
    }
    if skippable:
        r["skipped"] = False
    r["duration_ms"] = ms_since(t0)
    return r


def tool_result(sid: str, res: ToolResult, t0: float, *, kind: str = "tool", skippable: bool = False) -> dict[str, Any]:
    """A tool call's result from what the tool answered (contract section 3): a bare tool call's, or a step
    of a kind whose output is its tool's answer (the ``tool`` kind, ``kind``), whose result carries
    ``skipped: false`` when ``skippable`` (a declared step's), as ``StepOutput.from_tool(res).result(...)``
    would make it, without the ``StepOutput``."""
    # tool_output(res), written out: this runs once per step, and a call costs as much as the rest.
    content = res.content
    structured = res.structured
    if len(content) == 1:
        block = content[0]
        text = block.get("text", "") if block.get("type") == "text" else ""
        if structured is None and text:
            first = text[0]
            if first == "{" or first == "[" or (first.isspace() and text.lstrip()[:1] in ("{", "[")):
                try:
                    structured = orjson.loads(text)
                except orjson.JSONDecodeError:
                    pass
    else:
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    failed = res.is_error
    r: dict[str, Any] = {
        "id": sid,
        "kind": kind,
        "ok": not failed,
        "error": (text or "the tool reported an error") if failed else "",
        "error_code": ErrorCode.TOOL_ERROR if failed else None,
        "structured": structured,
        "text": text,
        "content": content,
        "output": structured if structured is not None else text,
    }
    if skippable:
        r["skipped"] = False
    r["duration_ms"] = ms_since(t0)
    return r


def group_result(
    sid: str, order: Iterable[Any], children: dict[str, Any], ok: bool, error: str, code: str | None, t0: float
) -> dict[str, Any]:
    """A parallel group's result; ``order`` is the children (anything with an ``id``) as written: they finish
    in any order, the result shows them as written."""
    ordered = {c.id: children[c.id] for c in order if c.id in children}
    return {
        "id": sid,
        "kind": "parallel",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": None,
        "text": "",
        "content": [],
        "output": {cid: r.get("output") for cid, r in ordered.items()},  # a skipped child has none
        "children": ordered,
        "duration_ms": ms_since(t0),
    }


def each_result(
    sid: str, children: list[dict[str, Any] | None], ok: bool, error: str, code: str | None, t0: float
) -> dict[str, Any]:
    """A ``for_each`` step's result: the outputs in element order (its ``output`` and ``structured``), each
    element's result in ``children`` (None for one cancelled before it started)."""
    outputs = [c.get("output") if c is not None else None for c in children]
    return {
        "id": sid,
        "kind": "for_each",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": outputs,
        "text": "",
        "content": [],
        "output": outputs,
        "children": children,
        "duration_ms": ms_since(t0),
    }


def pipe_result(
    sid: str, ok: bool, error: str, code: str | None, result: object, steps: dict[str, Any], t0: float
) -> dict[str, Any]:
    """A nested pipe's result: its ``result`` is its output, its ``steps`` the nested results."""
    return {
        "id": sid,
        "kind": "pipe",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": None,
        "text": "",
        "content": [],
        "output": result,
        "result": result,
        "steps": steps,
        "duration_ms": ms_since(t0),
    }


def graph_result(
    sid: str, ok: bool, error: str, code: str | None, output: object, ran: list[str], t0: float, output_from: str | None
) -> dict[str, Any]:
    """A graph's result: its output (the output of the node that finished last among those that took no
    arc, ``output_from``), and ``ran``, the ids of the nodes that ran, in the order they finished (their
    results are beside the graph's, in its list's results)."""
    return {
        "id": sid,
        "kind": "graph",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": output if not isinstance(output, str) else None,
        "text": output if isinstance(output, str) else "",
        "content": [],
        "output": output,
        "output_from": output_from,
        "ran": ran,
        "duration_ms": ms_since(t0),
    }


def invalid_answer(problems: list[Problem], started: float) -> dict[str, Any]:
    """The answer to a call whose spec (or caller) fails the checks: no step ran."""
    return {
        "ok": False,
        "error": str(SpecError(problems)),
        "error_code": problems[0].code,
        "result": None,
        "steps": {},
        "summary": {"total": 0, "succeeded": 0, "failed": 0, "skipped": 0, "cancelled": 0},
        "duration_ms": ms_since(started),
        "problems": [{"location": p.location, "code": p.code, "message": p.message} for p in problems],
    }


def pipe_envelope(answer: dict[str, Any]) -> dict[str, Any]:
    """The section-7 answer as a tool result: structured, one JSON text block, ``isError = not ok``."""
    return {
        "content": [{"type": "text", "text": dumps(answer).decode()}],
        "structuredContent": answer,
        "isError": not answer.get("ok", False),
    }


def step_summary(r: dict[str, Any]) -> dict[str, Any]:
    """A step result without its output: ``id``, ``kind``, ``ok``, ``error``, ``error_code``, ``duration_ms``
    and the facts a result may carry (``skipped``, ``attempts``, ``jsonrpc_error``), a group's and a
    ``for_each``'s ``children`` and a pipe's ``steps`` summarized likewise. A failed leaf keeps its ``output``
    (what it produced before failing: an error payload, an HTTP body) unless that is its ``error`` again."""
    out: dict[str, Any] = {}
    for key, value in r.items():
        if key in _OUTPUT_FIELDS:
            continue
        if key == "children":
            if isinstance(value, dict):
                value = {cid: step_summary(c) for cid, c in value.items()}
            elif isinstance(value, list):
                value = [step_summary(c) if c is not None else None for c in value]
        elif key == "steps" and isinstance(value, dict):
            value = {sid: step_summary(c) for sid, c in value.items()}
        out[key] = value
    if not r.get("ok", True) and r.get("kind") not in _CONTAINERS:
        output = r.get("output")
        if output is not None and output != "" and output != r.get("error"):
            out["output"] = output
    return out


def shape_answer(answer: dict[str, Any], mode: str) -> dict[str, Any]:
    """The answer sized for the model that reads it: each step output at most once.

    Args:
        answer: the full answer (contract section 7), as the scheduler made it.
        mode: ``full`` (the answer as it is), ``steps`` (every step result summarized: :func:`step_summary`) or
            ``result`` (no ``steps`` when the run succeeded; summarized when it failed, so an error answer
            says what ran and carries the failing step).

    Returns:
        A new answer (``answer`` itself for ``full``), its fields in the same order.
    """
    if mode == "full":
        return answer
    keep_steps = mode == "steps" or not answer.get("ok", False)
    out: dict[str, Any] = {}
    for key, value in answer.items():
        if key == "steps":
            if keep_steps:
                out[key] = {sid: step_summary(r) for sid, r in value.items()}
        else:
            out[key] = value
    return out


PREVIEW_BYTES = 1500
"""About the most a :func:`preview` holds as JSON: an event keeps its data within 4 KB."""
PREVIEW_STRING = 400
"""The most characters of one string a :func:`preview` keeps."""
PREVIEW_ITEMS = 24
"""The most keys of an object, or items of an array, a :func:`preview` keeps."""
PREVIEW_DEPTH = 6


PREVIEW_AS_TEXT = 256 * 1024
"""Up to this size a value too large to keep whole is previewed as the start of its JSON text (one encoding);
past it, by a walk that keeps its first entries (which costs what the preview holds, not what the value does)."""


def preview(value: object, *, budget: int = PREVIEW_BYTES) -> tuple[Any, int]:
    """A small copy of ``value`` for a run's events and the console, and ``value``'s size as the answer's bounds
    measure it (``json_measure``: its JSON text, from above).

    A value of at most ``budget`` bytes is its own preview. A larger one up to :data:`PREVIEW_AS_TEXT` is the
    start of its JSON text (``budget`` characters, then how large it was); a larger one still is a copy of about
    ``budget`` bytes: strings past :data:`PREVIEW_STRING` characters (or past what is left) cut, saying how long
    they were; objects and arrays keeping their first entries (at most :data:`PREVIEW_ITEMS`) and a ``"..."``
    entry saying how many there were; containers deeper than :data:`PREVIEW_DEPTH` written ``"..."``.
    """
    from mcpipe._core import json_measure

    size = json_measure(value)[0]
    if size <= budget:
        return value, size
    if size <= PREVIEW_AS_TEXT:
        text = dumps(value).decode(errors="replace")
        return f"{text[:budget]}... ({len(text)} bytes of JSON)", size
    return _preview(value, PREVIEW_DEPTH, [budget]), size


def _preview(value: object, depth: int, left: list[int]) -> Any:
    if isinstance(value, str):
        room = max(16, min(PREVIEW_STRING, left[0]))
        if len(value) <= room:
            left[0] -= len(value) + 3
            return value
        left[0] -= room + 30
        return f"{value[:room]}... ({len(value)} characters)"
    if isinstance(value, dict):
        if depth <= 0 or left[0] <= 0:
            left[0] -= 5
            return "..."
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i == PREVIEW_ITEMS or left[0] <= 0:
                out["..."] = f"{len(value)} keys"
                break
            key = str(k)[:64]
            left[0] -= len(key) + 4
            out[key] = _preview(v, depth - 1, left)
        return out
    if isinstance(value, (list, tuple)):
        if depth <= 0 or left[0] <= 0:
            left[0] -= 5
            return "..."
        items = []
        for i, v in enumerate(value):
            if i == PREVIEW_ITEMS or left[0] <= 0:
                items.append(f"... ({len(value)} items)")
                break
            left[0] -= 1
            items.append(_preview(v, depth - 1, left))
        return items
    left[0] -= 8
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)[:PREVIEW_STRING]
