"""A piraeus prompt served as an MCP prompt (``prompts/list``, ``prompts/get``), and rendered for flow steps.

piraeus stores templates with ``{variable}`` placeholders and typed variables but never renders them (its
flow constructor sends ``prompt_template`` as it is); mcpipe renders them so: each placeholder of a declared
variable (``{name}``, or ``{{name}}`` as the newer rows write it) is replaced by the variable's value (a
string as it is, anything else as JSON); every other brace is text. A value is converted to the variable's
type as pydantic converts it (``"5"`` is the number 5); a required variable must be given unless it has a
default; an optional one left out renders as its default, or as nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from mcp_types import INVALID_PARAMS

from mcpipe._describe import did_you_mean
from mcpipe.declared import SurfaceError
from mcpipe.errors import ErrorCode, MCPipeError
from mcpipe.formats.piraeus._model import Prompt, Variable
from mcpipe.formats.piraeus._read import coerce
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["MAX_RENDERED_CHARS", "PromptSurface", "PromptTooLarge", "article", "render_value"]

MAX_RENDERED_CHARS = 8 * 1024 * 1024
"""The longest rendered prompt (as ``pipe.max_output_bytes`` bounds a resolved template): a template naming
a variable 20 times turned a caller's 3 MB argument into a 60 MB answer."""


class PromptTooLarge(MCPipeError):
    """A prompt would render past :data:`MAX_RENDERED_CHARS` (measured before anything is built)."""

    code: str = ErrorCode.OUTPUT_TOO_LARGE


def article(kind: str) -> str:
    """``an integer``, ``a string``."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def render_value(value: object) -> str:
    """A variable's value as it appears in the text: a string as it is, anything else as compact JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


class _PromptAnswer:
    """``prompts/get``'s answer: one user message holding the rendered template; bad arguments are the
    JSON-RPC ``INVALID_PARAMS`` error."""

    def prompt(self, tool: object, result: ToolResult) -> dict[str, Any]:
        if result.is_error:
            raise SurfaceError(INVALID_PARAMS, result.joined_text())
        return {"messages": [{"role": "user", "content": {"type": "text", "text": result.joined_text()}}]}


_ANSWER = _PromptAnswer()


class PromptSurface:
    """One prompt: listed by ``prompts/list`` with its variables as arguments (``required`` when it has no
    default), rendered by ``prompts/get`` (through the gateway: the caller's grants and the audit apply, by
    the prompt's name)."""

    surface = "prompt"

    def __init__(self, prompt: Prompt) -> None:
        self.prompt = prompt
        self.name = prompt.name
        self.title: str | None = None
        self.description = prompt.description or ""
        self.arguments = [_argument(v) for v in prompt.variables]
        self.meta: dict[str, Any] | None = None
        self.mime_type: str | None = None
        self.completions: dict[str, list[str]] = {}
        self.answer = _ANSWER
        self.input_schema: dict[str, Any] = {"type": "object"}
        self.output_schema: dict[str, Any] | None = None
        self._parts = prompt.parts()
        self._vars = {v.name: v for v in prompt.variables}

    def __repr__(self) -> str:
        return f"<piraeus prompt {self.name}>"

    def values(self, given: Mapping[str, object], *, from_text: bool) -> tuple[dict[str, Any], list[str]]:
        """The variables' values from ``given`` (MCP's string arguments when ``from_text``, else JSON values),
        converted to their types, defaults filled; answers ``(values, problems)``."""
        problems = [f"{k}: unknown argument{did_you_mean(str(k), self._vars)}" for k in given if k not in self._vars]
        out: dict[str, Any] = {}
        for name, var in self._vars.items():
            value = given.get(name)
            if value is None:
                if var.default is not None:
                    out[name] = var.default
                elif var.required:
                    problems.append(f"{name}: {article(var.type)} is required")
                continue
            if from_text and isinstance(value, str) and var.type in ("array", "object"):
                try:
                    value = orjson.loads(value)
                except orjson.JSONDecodeError:
                    problems.append(f"{name}: expected JSON of an {var.type}")
                    continue
            converted, why = coerce(value, var.type)
            if why is not None:
                problems.append(f"{name}: {why}")
            else:
                out[name] = converted
        return out, problems

    def render(self, values: Mapping[str, object]) -> str:
        """The template with each placeholder replaced (an absent optional variable renders as nothing).

        Raises:
            PromptTooLarge: it would be longer than :data:`MAX_RENDERED_CHARS`.
        """
        texts = {name: render_value(value) for name, value in values.items()}
        size = sum(len(p) if isinstance(p, str) else len(texts.get(p.name, "")) for p in self._parts)
        if size > MAX_RENDERED_CHARS:
            raise PromptTooLarge(f"prompt '{self.name}' would render {size} characters, more than {MAX_RENDERED_CHARS}")
        return "".join(p if isinstance(p, str) else texts.get(p.name, "") for p in self._parts)

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        values, problems = self.values(args, from_text=True)
        if problems:
            return ToolResult.error(f"invalid arguments for prompt '{self.name}': " + "; ".join(problems))
        try:
            return ToolResult.text(self.render(values))
        except PromptTooLarge as e:
            return ToolResult.error(f"{e.code}: {e}")


def _argument(v: Variable) -> dict[str, Any]:
    """An MCP prompt argument; arguments are strings, so a variable's type is said in its description."""
    said = v.description or ""
    if v.type != "string":
        said = f"{said} ({v.type})" if said else f"({v.type})"
    entry: dict[str, Any] = {"name": v.name, "required": v.required and v.default is None}
    if said:
        entry["description"] = said
    return entry
