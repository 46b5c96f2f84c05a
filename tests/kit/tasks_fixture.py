"""The tools the conformance suite's ``tasks-*`` scenarios call, served by ``mcpipe serve`` with
:data:`CONFIG`: ``greet`` (sync only), ``slow_compute`` and ``failing_job`` (declared pipelines, so they
run as tasks; ``failing_job`` requires it), ``protocol_error_job`` (a tool that raises: a protocol-level
failure), ``confirm_delete`` (asks the client once), ``multi_input`` (asks twice in parallel) and
``test_tool_with_task`` (``ask_before_task``: asks its client's name synchronously, then becomes a task)."""

from __future__ import annotations

from typing import Any

import trio

from mcpipe.tools import ToolContext, ToolRegistry, ToolResult

registry = ToolRegistry()


@registry.tool
def greet(name: str) -> str:
    """Say hello (a synchronous tool: never a task)."""
    return f"Hello, {name}!"


@registry.tool
async def sleep_then(seconds: float = 0, label: str = "") -> str:
    """Sleep ``seconds``, then answer."""
    await trio.sleep(seconds)
    return f"computed {label} after {seconds:g}s"


@registry.tool
async def fail_later() -> ToolResult:
    """A tool error after a second."""
    await trio.sleep(1)
    return ToolResult.error("the job failed")


class ProtocolErrorJob:
    """A task-supporting tool that raises (not a tool error: the call itself fails)."""

    name = "protocol_error_job"
    description = "Raises: a protocol-level failure"
    input_schema: dict[str, Any] = {"type": "object"}
    output_schema: dict[str, Any] | None = None
    task_support = "optional"

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await trio.lowlevel.checkpoint()
        raise RuntimeError("internal failure")


registry.register(ProtocolErrorJob())

CONFIG = """
python_tools = ["kit.tasks_fixture:registry"]
[audit]
enabled = false

[[pipelines]]
name = "slow_compute"
description = "Sleeps `seconds`, then answers"
input_schema = { type = "object", properties = { seconds = { type = "number" }, label = { type = "string" } } }

[[pipelines.steps]]
kind = "tool"
id = "s"
tool = "sleep_then"
args = { seconds = "${args.seconds}", label = "${args.label}" }

[[pipelines]]
name = "failing_job"
description = "A tool error after a second"
task_support = "required"
steps = [{ kind = "tool", id = "f", tool = "fail_later" }]

[[pipelines]]
name = "confirm_delete"
description = "Asks the user to confirm, then deletes"
input_schema = { type = "object", properties = { filename = { type = "string" } } }
output = { deleted = "${args.filename}", action = "${steps.confirm.output.action}" }

[[pipelines.steps]]
kind = "elicitation"
id = "confirm"
message = "Delete ${args.filename}?"
requested_schema = { type = "object", properties = { confirm = { type = "boolean" } } }

[[pipelines]]
name = "multi_input"
description = "Asks two questions at once"
output = { first = "${steps.both.output.a.content}", second = "${steps.both.output.b.content}" }

[[pipelines.steps]]
kind = "parallel"
id = "both"

[[pipelines.steps.steps]]
kind = "elicitation"
id = "a"
message = "Your name?"
requested_schema = { type = "object", properties = { name = { type = "string" }, confirm = { type = "boolean" } } }

[[pipelines.steps.steps]]
kind = "elicitation"
id = "b"
message = "Confirm?"
requested_schema = { type = "object", properties = { name = { type = "string" }, confirm = { type = "boolean" } } }

[[pipelines]]
name = "test_tool_with_task"
description = "Asks the user's name (input-required rounds), then works on it as a task"
task_support = "required"
ask_before_task = true

[[pipelines.steps]]
kind = "elicitation"
id = "user_name"
message = "Your name?"
requested_schema = { type = "object", properties = { name = { type = "string" } }, required = ["name"] }

[[pipelines.steps]]
kind = "tool"
id = "work"
tool = "sleep_then"
args = { seconds = 0.2, label = "for ${steps.user_name.output.content.name}" }
"""
