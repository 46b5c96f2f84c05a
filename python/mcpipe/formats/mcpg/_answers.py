"""mcpg's answers: how a binding's run becomes its ``tools/call``, ``resources/read`` or ``prompts/get``.

Registered as answer shapes (:mod:`mcpipe.declared._answers`) that the translated pipelines name:

- ``mcpg.binding``: the backend's own result (an ``mcpg.*`` kind's output) is the answer, as it is;
- ``mcpg.payload``: a plugin backend mcpipe runs as its own kind (``twilio``): the step's output is the
  plugin's reply, projected as mcpg projects a backend plugin's payload (its JSON as text and structured
  content); a failed call is ``<kind> request failed: <error>``;
- ``mcpg.pipeline``: a pipeline binding without suspending steps (``execute_pipeline_binding``): the last
  step's output as text, and ``{pipeline, result, completed_steps, total_steps, duration_ms}``; a failed step
  is ``pipeline '<name>' failed at step '<id>': <error>``, a gate's refusal its message;
- ``mcpg.pipeline_suspending``: one with elicitation, sampling, roots or gather steps
  (``execute_pipeline_steps``): the last output pretty-printed and as the structured content; a failure is
  its message alone.

A prompt or a resource is the tool's answer decoded by mcpg's strict codecs (``runtime/invocation.rs``): the
first text block must be JSON holding ``messages`` or ``contents``; anything else is a JSON-RPC error -32603.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mcpipe.declared import PlanTool, SurfaceError, register_answer
from mcpipe.errors import ErrorCode
from mcpipe.plan import Pipeline
from mcpipe.tools import ToolResult

__all__ = ["BindingShape", "PayloadShape", "PipelineShape", "decode_prompt", "decode_resource"]

INTERNAL_ERROR = -32603


def _primary_text(result: ToolResult) -> str | None:
    return next((b.get("text") for b in result.content if b.get("type") == "text"), None)


class _Decode(Exception):
    pass


def _body(result: ToolResult, what: str) -> Any:
    """The result's first text block as JSON (``<what> is not JSON`` when it is not one)."""
    if result.is_error:
        error = _primary_text(result) or "tool returned isError without a text body"
        raise _Decode(f"backend returned an error response: {error}")
    body = _primary_text(result)
    if body is None:
        raise _Decode("backend response was empty")
    try:
        return json.loads(body)
    except ValueError as e:
        raise _Decode(_malformed(f"{what} is not JSON: {e}")) from None


def decode_resource(result: ToolResult, uri: str) -> dict[str, Any]:
    """``decode_resource_result``."""
    try:
        parsed = _body(result, f"resource body for {uri}")
        contents = parsed.get("contents") if isinstance(parsed, Mapping) else None
        if contents is None:
            raise _Decode(_malformed(f"resource body for {uri} is missing `contents`"))
        if not isinstance(contents, list):
            raise _Decode(_malformed("`contents` must be an array"))
        if not contents:
            raise _Decode(_malformed(f"`contents` for {uri} must contain at least one entry"))
        out = []
        for i, entry in enumerate(contents):
            c: Mapping[str, Any] = entry if isinstance(entry, Mapping) else {}
            if not isinstance(c.get("uri"), str):
                raise _Decode(_malformed(f"contents[{i}].uri must be a string"))
            item: dict[str, Any] = {"uri": c["uri"]}
            if isinstance(c.get("mimeType"), str):
                item["mimeType"] = c["mimeType"]
            if "text" in c and "blob" in c:
                raise _Decode(_malformed(f"contents[{i}] cannot carry both `text` and `blob`"))
            if "blob" in c:
                if not isinstance(c["blob"], str):
                    raise _Decode(_malformed(f"contents[{i}].blob must be a string"))
                item["blob"] = c["blob"]
            else:
                if not isinstance(c.get("text"), str):
                    raise _Decode(_malformed(f"contents[{i}] must carry either `text` or `blob`"))
                item["text"] = c["text"]
            if "_meta" in c:
                item["_meta"] = c["_meta"]
            out.append(item)
    except _Decode as d:
        raise SurfaceError(INTERNAL_ERROR, f"resource backend produced a non-conforming response: {d}") from None
    return {"contents": out}


def decode_prompt(result: ToolResult) -> dict[str, Any]:
    """``decode_prompt_result``."""
    try:
        parsed = _body(result, "prompt body")
        if not isinstance(parsed, Mapping) or "messages" not in parsed:
            raise _Decode(_malformed("prompt body is missing `messages`"))
        messages = parsed["messages"]
        if not isinstance(messages, list) or not all(_is_message(m) for m in messages):
            raise _Decode(_malformed("prompt `messages` does not match the spec content-block shape"))
        if not messages:
            raise _Decode(_malformed("`messages` must contain at least one entry"))
    except _Decode as d:
        raise SurfaceError(INTERNAL_ERROR, f"prompt backend produced a non-conforming response: {d}") from None
    return {"messages": messages}


_CONTENT_TYPES = {"text", "image", "audio", "resource_link", "resource"}


def _is_message(m: object) -> bool:
    return (
        isinstance(m, Mapping)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), Mapping)
        and m["content"].get("type") in _CONTENT_TYPES
    )


def _malformed(reason: str) -> str:
    return f"backend response is not a valid surface envelope: {reason}"


def _value(v: object) -> str:
    """A JSON value as serde_json's ``Display`` writes it: compact, object keys in order."""
    return json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _unexpected(items: Sequence[object]) -> str:
    quoted = ", ".join(f"'{i}'" for i in items)
    return f"{quoted} {'was' if len(items) == 1 else 'were'} unexpected)"


_SCHEMA_WORDS = {
    "minLength": "{v} is shorter than {limit} character{s}",
    "maxLength": "{v} is longer than {limit} character{s}",
    "minimum": "{v} is less than the minimum of {value}",
    "maximum": "{v} is greater than the maximum of {value}",
    "exclusiveMinimum": "{v} is less than or equal to the minimum of {value}",
    "exclusiveMaximum": "{v} is greater than or equal to the maximum of {value}",
    "enum": "{v} is not one of {value}",
    "const": "{value} was expected",
    "pattern": '{v} does not match "{limit}"',
    "format": '{v} is not a "{limit}"',
    "multipleOf": "{v} is not a multiple of {value}",
    "minItems": "{v} has less than {limit} item{s}",
    "maxItems": "{v} has more than {limit} item{s}",
    "minProperties": "{v} has less than {limit} propert{ies}",
    "maxProperties": "{v} has more than {limit} propert{ies}",
    "uniqueItems": "{v} has non-unique elements",
    "anyOf": "{v} is not valid under any of the schemas listed in the 'anyOf' keyword",
    "contains": "None of {v} are valid under the given schema",
    "not": "{value} is not allowed for {v}",
    "false": "False schema does not allow {v}",
}
"""The ``jsonschema`` crate's words for each keyword whose message needs only the instance (``v``) and the
keyword's value (``limit`` as it is, ``value`` as JSON; ``s`` and ``ies`` its plural endings)."""


def rust_schema_message(e: Any, missing: str | None = None) -> str:
    """One ``jsonschema`` (Python) validation error worded as the ``jsonschema`` crate (0.28) words it
    (``ValidationError``'s ``Display``), which mcpg's argument check reports; ``missing`` is the property a
    ``required`` error is about."""
    kind, limit, inst = e.validator, e.validator_value, e.instance
    v = _value(inst)
    match kind:
        case "type":
            if isinstance(limit, list):
                return f"{v} is not of types " + ", ".join(f'"{t}"' for t in limit)
            return f'{v} is not of type "{limit}"'
        case "required":
            return f"{_value(missing)} is a required property"
        case "additionalProperties" if isinstance(inst, Mapping):
            props = e.schema.get("properties") or {}
            patterns = list(e.schema.get("patternProperties") or {})
            extra = sorted(k for k in inst if k not in props and not any(re.search(p, k) for p in patterns))
            return f"Additional properties are not allowed ({_unexpected(extra)}"
        case "oneOf" if "is valid under each of" in e.message:
            return f"{v} is valid under more than one of the schemas listed in the 'oneOf' keyword"
        case "oneOf":
            return f"{v} is not valid under any of the schemas listed in the 'oneOf' keyword"
        case _ if kind in _SCHEMA_WORDS:
            words = _SCHEMA_WORDS[kind]
            one = limit == 1
            return words.format(v=v, limit=limit, value=_value(limit), s="" if one else "s", ies="y" if one else "ies")
    return str(e.message)


def _json_pointer(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def rust_schema_errors(errors: list[Any]) -> list[str]:
    """``validate_tool_arguments``'s list: ``<instance path>: <message>`` (the message alone at the top), in the
    order the crate finds them (its schemas' keys in order, depth first)."""
    ordered = sorted(errors, key=lambda e: [str(p) for p in e.absolute_schema_path])
    reported: dict[tuple[str, ...], set[str]] = {}
    out = []
    for e in ordered:
        missing = None
        if e.validator == "required":
            seen = reported.setdefault(tuple(map(str, e.absolute_path)), set())
            have = e.instance if isinstance(e.instance, Mapping) else {}
            missing = next((p for p in e.validator_value if p not in have and p not in seen), None)
            if missing is None:
                continue
            seen.add(missing)
        where = _json_pointer(e.absolute_path)
        message = rust_schema_message(e, missing)
        out.append(f"{where}: {message}" if where else message)
    return out


class _Surfaces:
    def invalid(self, tool: PlanTool, errors: list[str], args: object = None) -> ToolResult:
        """``validate_tool_arguments``'s refusal, as a tool result (``tools_call.rs``), each error worded as the
        ``jsonschema`` crate words it."""
        errors_of = getattr(getattr(tool, "dialect", None), "schema_errors", None)
        found = errors_of(args) if args is not None and errors_of is not None else []
        why = "; ".join(rust_schema_errors(found)) if found else "; ".join(_pointer(e) for e in errors)
        return ToolResult.error(
            f"Input validation failed for tool '{tool.name}': arguments validation failed: {why}."
            " Inspect the tool's inputSchema via tools/list and retry."
        )

    def resource(self, tool: object, result: ToolResult, uri: str) -> dict[str, Any]:
        return decode_resource(result, uri)

    def prompt(self, tool: object, result: ToolResult) -> dict[str, Any]:
        return decode_prompt(result)


def _failure(answer: Mapping[str, object]) -> ToolResult:
    """A run mcpg would not have had (the deadline, a limit): its error as one text block."""
    return ToolResult.error(str(answer.get("error") or ErrorCode.TOOL_FAILED))


class BindingShape(_Surfaces):
    """``mcpg.binding``: the backend's result as it is."""

    def tool(self, tool: object, answer: Mapping[str, object]) -> ToolResult:
        if not answer["ok"]:
            return _failure(answer)
        r = _output(answer)
        if not isinstance(r, Mapping):
            return ToolResult.error("the binding gave no result")
        meta = r.get("_meta") if isinstance(r.get("_meta"), dict) else None
        # mcpg's structured content is whatever JSON the backend answered: sent as it is where MCP allows it.
        return ToolResult(
            list(r.get("content") or []),
            r.get("structuredContent"),
            bool(r.get("isError")),
            meta,
            terse=True,
            any_json=True,
        )


class PayloadShape(_Surfaces):
    """``mcpg.payload``: a plugin's reply (the step's output) as ``execute_binding_plugin`` projects it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def tool(self, tool: PlanTool, answer: Mapping[str, object]) -> ToolResult:
        if not answer["ok"]:
            _, failed = _failed_step(answer)
            if failed is None:
                return _failure(answer)
            return ToolResult.error(f"{self.kind} request failed: {_step_error(failed)}")
        from mcpipe.formats.mcpg._kinds import envelope_result

        r = envelope_result(_value(_output(answer)).encode())
        is_error = bool(r.get("isError"))
        audit = {"backend_kind": self.kind, "binding_profile": tool.name, "outcome": "error" if is_error else "success"}
        blocks = list(r.get("content") or [])
        return ToolResult(blocks, r.get("structuredContent"), is_error, {"audit": audit}, terse=True, any_json=True)


def _pipeline_timed_out(answer: Mapping[str, object]) -> bool:
    """The pipeline's own deadline passed (not one step's ``timeout_ms``)."""
    return answer.get("error_code") == ErrorCode.TIMEOUT and str(answer.get("error", "")).startswith("the pipeline ")


def _deadline_ms(answer: Mapping[str, object]) -> float:
    """The deadline the scheduler says passed (``the pipeline timed out after 200 ms``): the server's cap."""
    m = re.search(r"after ([0-9.]+) ms", str(answer.get("error", "")))
    return float(m.group(1)) if m else 0.0


def _at_step(plan: Pipeline, answer: Mapping[str, Any]) -> str:
    """The step the deadline stopped: the one cancelled, else the first that had not run."""
    results = answer.get("steps") or {}
    for sid, r in results.items():
        if isinstance(r, Mapping) and r.get("error_code") == ErrorCode.CANCELLED:
            return str(sid)
    for node in plan.steps:
        if getattr(node, "id", None) not in results:
            return str(node.id)
    return ""


def _failed_step(answer: Mapping[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """(steps completed before it, the failed step's result)."""
    done = 0
    for r in (answer.get("steps") or {}).values():
        if not isinstance(r, Mapping):
            continue
        if not r.get("ok", True):
            return done, dict(r)
        done += 1
    return done, None


def _step_error(r: Mapping[str, object]) -> str:
    error = str(r.get("error") or "step execution failed")
    if r.get("kind") == "transform":  # execute_transform_step's wording (the CEL engine's own message after it)
        return f"transform evaluation failed: CEL execution failed: {error}"
    return error


class PipelineShape(_Surfaces):
    """``mcpg.pipeline`` (``suspending=False``) and ``mcpg.pipeline_suspending``."""

    def __init__(self, suspending: bool) -> None:
        self.suspending = suspending

    def tool(self, tool: Any, answer: dict[str, Any]) -> ToolResult:
        total = tool.compiled.leaf_count
        if not answer["ok"] and _pipeline_timed_out(answer):
            if self.suspending:  # `execute_pipeline_steps`
                return ToolResult.error("pipeline execution timed out")
            # `execute_pipeline_binding`: mcpg checks its deadline before each step, and names that step; mcpipe
            # stops the step that is running when the deadline passes, and names it.
            plan = tool.compiled.plan
            ms = plan.timeout_ms if plan.timeout_ms is not None else _deadline_ms(answer)
            return ToolResult.error(
                f"pipeline '{tool.name}' timed out after {ms:g}ms at step '{_at_step(plan, answer)}'"
            )
        if not answer["ok"]:
            done, failed = _failed_step(answer)
            if failed is None:
                return _failure(answer)
            gate = failed.get("error_code") == ErrorCode.GATE_REJECTED
            error = _step_error(failed)
            if self.suspending:
                return ToolResult.error(error)
            step, why = ("gate_step", "reason") if gate else ("failed_step", "error")
            structured = {
                "pipeline": tool.name,
                step: failed.get("id"),
                why: error,
                "completed_steps": done,
                "total_steps": total,
            }
            text = error if gate else f"pipeline '{tool.name}' failed at step '{failed.get('id')}': {error}"
            return ToolResult([{"type": "text", "text": text}], structured, True)
        last = _output(answer)
        if self.suspending:
            text = json.dumps(last, indent=2, sort_keys=True, ensure_ascii=False)
            return ToolResult([{"type": "text", "text": text}], last, False, terse=True, any_json=True)
        text = last if isinstance(last, str) else _value(last)
        structured = {
            "pipeline": tool.name,
            "result": last,
            "completed_steps": total,
            "total_steps": total,
            "duration_ms": int(answer.get("duration_ms") or 0),
        }
        return ToolResult([{"type": "text", "text": text}], structured, False, terse=True)


def _pointer(error: str) -> str:
    """``args.a.b[0]: why`` as mcpg writes it (``/a/b/0: why``; ``why`` alone at the top)."""
    where, _, why = error.partition(": ")
    if where == "args":
        return why
    path = where.removeprefix("args").replace("[", ".").replace("]", "")
    return "/" + "/".join(p for p in path.split(".") if p) + ": " + why


def _output(answer: Mapping[str, object]) -> Any:
    """The last step's output (a declared pipeline answers ``{"output": ...}``)."""
    result = answer.get("result")
    return result.get("output") if isinstance(result, Mapping) else result


register_answer("mcpg.binding", BindingShape())
register_answer("mcpg.payload", PayloadShape("twilio"))
register_answer("mcpg.pipeline", PipelineShape(suspending=False))
register_answer("mcpg.pipeline_suspending", PipelineShape(suspending=True))
