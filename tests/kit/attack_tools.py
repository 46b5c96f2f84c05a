"""Tools of the issue-20 attack tests (``kit.attack_tools:attack_tools``): a tool that kills the process serving
it, as a poison-pill run does to every worker that takes it; a tool that always fails retryably."""

from __future__ import annotations

import os
import signal

from mcpipe.tools import ToolRegistry
from mcpipe.tools._base import PURE

attack_tools = ToolRegistry()


@attack_tools.tool
def die() -> str:
    """Kill the process that runs it (SIGKILL: no cleanup, as an out-of-memory kill)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@attack_tools.tool(annotations=PURE)
def flaky() -> str:
    """Fail as a lost connection does (an ``OSError``: retryable), every time."""
    raise ConnectionResetError("the connection was reset")
