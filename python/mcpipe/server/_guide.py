"""The server teaches its own language: the pipeline reference as resources, and a prompt for writing one.

Served wherever ``mcp_pipe`` is (``mcpipe serve``, the embedded default included), beside the config's own
prompts and resources and the downstream servers' (``server/_passthrough.py`` lists them together):

- resources ``mcpipe://guide/pipelines`` (writing a pipeline: the spec, steps, references, failures,
  examples) and ``mcpipe://guide/references`` (the template language), ``text/markdown``, written for a
  model (``server/guide/*.md``);
- a resource ``mcpipe://guide/pipelines/NAME`` for each declared pipeline and NoETL playbook the caller may
  call: what it does, its arguments, and its plan drawn as Mermaid (the drawing ``mcpipe explain --format
  mermaid`` and the console make), so that a client can show it;
- the prompt ``write_pipeline`` (optional argument ``task``): the rules, the tools this caller may call with
  their input and output schemas, the server's limits, and the guide's runnable examples, so that a model
  connected to mcpipe writes a correct pipeline without reading anything else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import quote, unquote

from mcpipe._util import PIPE_TOOL
from mcpipe.compile import Limits
from mcpipe.plan import Pipeline

__all__ = ["GUIDE_PROMPT", "GUIDE_RESOURCES", "INSTRUCTIONS", "PIPELINE_GUIDE", "Guide"]

GUIDE_PROMPT = "write_pipeline"

INSTRUCTIONS = (
    "To make several tool calls, call `mcp_pipe` once with a pipeline of them: steps in order, parallel groups, "
    "loops, later steps reading earlier outputs through references; by default it answers the result only. The prompt "
    "`write_pipeline` gives the rules with the tools you may call; the resources `mcpipe://guide/pipelines` "
    'and `mcpipe://guide/references` the whole language. `"dry_run": true` checks a pipeline without running it.'
)
"""The server's ``instructions`` (in ``initialize``, which clients put before the model) when it serves
``mcp_pipe``: where the guide is."""

SEARCH_INSTRUCTIONS = (
    "This server lists only a few of its tools: find the others with `search_tools` (a query in plain words), "
    "read their schemas with `describe_tools`, then call them by name or chain them in one `mcp_pipe` call."
)
"""Added to the ``instructions`` in search mode (``[tools] discovery = "search"``)."""
"""The prompt's name."""

GUIDE_RESOURCES: dict[str, tuple[str, str, str]] = {
    "mcpipe://guide/pipelines": (
        "pipelines.md",
        "Writing a pipeline for mcp_pipe",
        "How to write the spec mcp_pipe runs: steps, parallel groups, nested pipes, for_each, references "
        "between steps, failures, the answer, and runnable examples.",
    ),
    "mcpipe://guide/references": (
        "references.md",
        "References: the template language",
        "Every form of reference (${...}, {{...}}, $ref, defaults, literals), paths, and the errors they give.",
    ),
}
"""URI -> (file under ``server/guide``, title, description)."""

MIME = "text/markdown"

PIPELINE_GUIDE = "mcpipe://guide/pipelines/"
"""The prefix of a declared pipeline's or playbook's guide resource (its tool name follows, percent-encoded)."""


@cache
def guide_text(filename: str) -> str:
    """A guide file's text (shipped in the package, read once)."""
    return resources.files("mcpipe.server").joinpath("guide", filename).read_text(encoding="utf-8")


ToolsOf = Callable[[Any], list[dict[str, Any]]]
"""The tools a request's caller may call, as ``tools/list`` entries (``mcp_pipe`` first)."""
PipelinesOf = Callable[[Any], list[tuple[dict[str, Any], Pipeline]]]
"""The declared pipelines and playbooks a request's caller may call: each one's ``tools/list`` entry and plan."""


class Guide:
    """The guide's resources and prompt, for the requests of one server.

    Args:
        tools_of: the tools a request's caller may call (as its ``tools/list``).
        limits: the server's pipeline limits, stated in the prompt.
    """

    def __init__(
        self, tools_of: ToolsOf, limits: Limits, *, search: bool = False, pipelines_of: PipelinesOf | None = None
    ) -> None:
        self.tools_of = tools_of
        self.limits = limits
        self.search = search
        """Search mode: the listed tools are a few; the prompt teaches finding the others."""
        self.pipelines_of = pipelines_of
        """The declared pipelines and playbooks a caller may call (each has a guide resource), or None."""

    def resources(self, ctx: object = None) -> list[dict[str, Any]]:
        """The ``resources/list`` entries (with ``ctx``: the guides of the pipelines its caller may call)."""
        out = [
            {
                "uri": uri,
                "name": uri.rsplit("/", 1)[-1],
                "title": title,
                "description": description,
                "mimeType": MIME,
                "size": len(guide_text(filename).encode()),
            }
            for uri, (filename, title, description) in GUIDE_RESOURCES.items()
        ]
        if ctx is not None and self.pipelines_of is not None:
            for entry, _ in self.pipelines_of(ctx):
                name = entry["name"]
                out.append(
                    {
                        "uri": PIPELINE_GUIDE + quote(name, safe=""),
                        "name": name,
                        "title": f"The pipeline {name}, drawn",
                        "description": f"What the tool {name} runs: its arguments and its steps drawn (Mermaid).",
                        "mimeType": MIME,
                    }
                )
        return out

    def read(self, uri: str, ctx: object = None) -> dict[str, Any] | None:
        """The ``resources/read`` result of a guide URI, or None when ``uri`` is not one (a pipeline's guide
        is one for the callers who may call it)."""
        found = GUIDE_RESOURCES.get(uri)
        if found is not None:
            return {"contents": [{"uri": uri, "mimeType": MIME, "text": guide_text(found[0])}]}
        if not uri.startswith(PIPELINE_GUIDE) or ctx is None or self.pipelines_of is None:
            return None
        name = unquote(uri[len(PIPELINE_GUIDE) :])
        for entry, plan in self.pipelines_of(ctx):
            if entry["name"] == name:
                return {"contents": [{"uri": uri, "mimeType": MIME, "text": pipeline_text(entry, plan)}]}
        return None

    def prompts(self) -> list[dict[str, Any]]:
        """The ``prompts/list`` entries."""
        return [
            {
                "name": GUIDE_PROMPT,
                "title": "Write an mcp_pipe pipeline",
                "description": "How to write a pipeline for mcp_pipe over the tools you may call here (with their "
                "schemas), the rules it must follow, and examples that run.",
                "arguments": [
                    {"name": "task", "description": "what the pipeline should do (optional)", "required": False}
                ],
            }
        ]

    def get(self, ctx: object, name: str, arguments: dict[str, str] | None) -> dict[str, Any] | None:
        """The ``prompts/get`` result of the guide's prompt for ``ctx``'s caller, or None for another name."""
        if name != GUIDE_PROMPT:
            return None
        text = self.prompt_text(self.tools_of(ctx), (arguments or {}).get("task"))
        return {
            "description": "Write an mcp_pipe pipeline over the tools you may call",
            "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        }

    def prompt_text(self, tools: list[dict[str, Any]], task: str | None = None) -> str:
        """The prompt: the rules, the caller's tools with their schemas, the limits, examples, the task."""
        callable_tools = [t for t in tools if t.get("name") != PIPE_TOOL]
        lines = [
            f"You can run a whole pipeline of tool calls in one call of the tool `{PIPE_TOOL}`: its arguments are",
            "the pipeline (a JSON object). Write the pipeline by these rules, then call it.",
            "",
            "## Rules",
            "",
            *_RULES,
            "",
            "## Limits of this server",
            "",
            f"- at most {self.limits.max_steps} steps in all (nested and parallel ones included), nesting depth "
            f"at most {self.limits.max_depth}, at most {self.limits.max_concurrency} tool calls at once;",
            f"- a `for_each` runs at most {self.limits.max_items} elements.",
            "",
        ]
        if self.search:
            lines += [
                "## Finding the tools",
                "",
                "This server lists only a few tools; the others are found by searching, and called as ever:",
                "",
                '1. `search_tools` with `{"query": "what you want to do"}` answers the best matching tools you may',
                "   call: their names, a line of description, their argument names;",
                '2. `describe_tools` with `{"names": [...]}` answers their full input schemas;',
                "3. call a found tool by its name, or chain several in one `mcp_pipe` call: its steps name found",
                "   tools exactly as listed ones (a tool you may not call is never found).",
                "",
                f"## The tools listed ({len(callable_tools)})",
                "",
            ]
        else:
            lines += [
                f"## The tools you may call ({len(callable_tools)})",
                "",
                "Call only these, with arguments matching each input schema. The output schema, when there is one,",
                "gives the paths under `steps.<id>.structured`.",
                "",
            ]
        for tool in callable_tools:
            lines.append(f"### `{tool['name']}`")
            description = (tool.get("description") or "").strip()
            if description:
                lines += ["", description]
            lines += ["", f"input schema: `{_compact(tool.get('inputSchema') or {'type': 'object'})}`"]
            if tool.get("outputSchema"):
                lines.append(f"output schema: `{_compact(tool['outputSchema'])}`")
            lines.append("")
        if not callable_tools:
            lines += ["(none: this caller may call no tool but mcp_pipe)", ""]
        lines += [
            "## Examples",
            "",
            "These run on mcpipe's built-in tools (use the tools listed above in yours):",
            "",
            *[f"```json\n{example}\n```\n" for example in examples()],
            "The full reference: the resources `mcpipe://guide/pipelines` and `mcpipe://guide/references`.",
        ]
        if task:
            lines += ["", "## The task", "", task.strip()]
        return "\n".join(lines).rstrip() + "\n"


_RULES = [
    '- The pipeline: `{"vars": {...}, "steps": [...], "return": ...}`. `steps` is required and not empty; '
    "no other keys but `continue_on_error`, `timeout_ms`, `answer` and `dry_run`.",
    '- A tool step: `{"id": "a", "tool": "NAME", "args": {...}}`. A group: `{"id": "g", "parallel": [steps]}` '
    '(children run at once). A nested pipeline: `{"id": "p", "pipe": {"vars": ..., "steps": [...]}}`. '
    'A loop: `{"id": "e", "for_each": "${...a list...}", "step": {...}}`, with `${item}` and `${index}`.',
    "- Ids: letters, digits, `_`, `-`, not starting with a digit; unique in their list.",
    "- A later step reads an earlier one: `${steps.ID.structured.KEY}` (the tool's structured result), "
    "`${steps.ID.text}`, `${steps.ID.output}`; `{{ID.KEY}}` is short for `${steps.ID.output.KEY}`.",
    "- Only steps that run before, in the same list: never a later step, never a sibling inside a group; "
    "after a group, its children are `steps.GROUP.children.CHILD`.",
    '- `"${...}"` as the whole string keeps the value\'s type; inside text it becomes text. '
    '`{"$ref": "path"}` is the value too. Paths: `.key`, `.0`, `.-1`, `.*` (every element).',
    '- A default for a value that may be missing: `${path ?? \'none\'}` or `{"$ref": path, "default": []}`.',
    "- `vars` hold your inputs (`${vars.name}`); a nested pipe sees only its own `vars`: pass values in through them.",
    '- `when` on a step runs it only if true (`"${vars.flag}"` or CEL such as `"vars.n > 2"`); '
    "`continue_on_error: true` keeps going after a failure.",
    "- `return` shapes the answer's `result`; without it, the last step's output is the result.",
    '- Not sure? Call with `"dry_run": true` first: every check, the plan, nothing run. A spec with problems '
    "is answered with every problem located: fix them all and call again.",
]


def pipeline_text(entry: dict[str, Any], plan: Pipeline) -> str:
    """A declared pipeline's or playbook's guide: its description, its input schema, and its plan as a Mermaid
    ``flowchart`` in a fenced block (what Markdown viewers that know Mermaid draw)."""
    from mcpipe.plan import drawn  # drawing is loaded when a guide of a pipeline is read, not at start

    name = entry["name"]
    lines = [f"# `{name}`", ""]
    description = (entry.get("description") or "").strip()
    if description:
        lines += [description, ""]
    lines += [
        f"Call the tool `{name}` with arguments matching its input schema:",
        "",
        f"`{_compact(entry.get('inputSchema') or {'type': 'object'})}`",
        "",
        "Its steps, drawn (`mcpipe explain --format mermaid` draws the same):",
        "",
        "```mermaid",
        drawn(plan).mermaid().rstrip("\n"),
        "```",
    ]
    return "\n".join(lines) + "\n"


def _compact(schema: object) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


@cache
def _examples() -> tuple[str, ...]:
    text = guide_text("pipelines.md")
    out = []
    for block in text.split("```json pipeline\n")[1:]:
        out.append(block.split("\n```", 1)[0].strip())
    return tuple(out)


def examples() -> list[str]:
    """The runnable example pipelines of the guide (``json pipeline`` blocks of ``pipelines.md``), as text."""
    return list(_examples())
