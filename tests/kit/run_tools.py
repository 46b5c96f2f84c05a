"""Tools for the queued-run tests: each call appends its tag to the file ``$MCPIPE_TEST_MARKS`` when it
finishes, so the tools themselves count how often every step ran (``O_APPEND`` writes of one short line
do not interleave across processes)."""

from __future__ import annotations

import os

import trio

from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
async def mark(tag: str, ms: float = 0) -> str:
    """Sleep ``ms`` milliseconds, then append ``tag`` to the marks file."""
    if ms:
        await trio.sleep(ms / 1000)
    fd = os.open(os.environ["MCPIPE_TEST_MARKS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{tag} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return tag


gate = ToolRegistry()
"""In-process tools a test holds back: ``wait_for(tag)`` returns once the test calls ``release(tag)``."""
_release: dict[str, trio.Event] = {}


@gate.tool
async def wait_for(tag: str) -> str:
    """Wait until the test releases ``tag``."""
    await _release.setdefault(tag, trio.Event()).wait()
    return f"released {tag}"


def release(tag: str) -> None:
    """Let every ``wait_for(tag)`` call, past and future, return."""
    _release.setdefault(tag, trio.Event()).set()


def reset_gate() -> None:
    """Forget every release (at the start of a test)."""
    _release.clear()
