"""Small helpers every layer may use: the pipe tool's name, name globs, ``module:attr`` loading, telling a
suspension from a failure, the capacity limiters of a Trio run, and reading an HTTP body up to a bound.

They live at the bottom so that no layer has to reach up (the gateway used to take ``glob_matcher`` from
the config, the scheduler and the gateway each had their own copy of the suspension test).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import trio

__all__ = [
    "PIPE_TOOL",
    "RateLimit",
    "RunLimiter",
    "assignments",
    "glob_matcher",
    "is_cancellation",
    "is_suspension",
    "log_safe",
    "read_capped",
]

PIPE_TOOL = "mcp_pipe"
"""The name of the server's own pipeline tool; no step may call it and no other tool may take it."""


def glob_matcher(patterns: list[str]) -> Callable[[str], bool]:
    """A predicate matching tool names against ``*``-globs (``*`` alone matches everything)."""
    if "*" in patterns:
        return lambda _name: True
    exact = frozenset(p for p in patterns if "*" not in p)
    globs = [re.compile(re.escape(p).replace(r"\*", ".*") + r"\Z") for p in patterns if "*" in p]
    if not globs:
        return exact.__contains__
    return lambda name: name in exact or any(g.match(name) for g in globs)


def assignments(items: list[str], flag: str) -> dict[str, Any]:
    """``NAME=VALUE`` command-line items (``--var``, ``--input``) as a dict: a value is JSON when it parses
    as JSON, else the text. Raises ValueError naming ``flag`` for an item without ``=`` or a name."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} takes NAME=VALUE, got {item!r}")
        try:
            values[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            values[key] = value
    return values


def is_suspension(exc: BaseException) -> bool:
    """Whether ``exc`` is a pipeline suspending to ask its 2026-07-28 client (``mcpipe.interaction``), alone
    or as the only content of a group: not a failure, the call resumes on the client's retry."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_suspension(e) for e in exc.exceptions)
    return getattr(exc, "suspends_pipeline", False) is True


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is trio's cancellation, alone or as the only content of a group (a nursery inside
    the cancelled code wraps it in one)."""
    import trio

    if isinstance(exc, trio.Cancelled):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, 0x85, 0x2028, 0x2029]} | {
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
}


def log_safe(data: object, limit: int = 2048) -> str:
    """``data`` as one line of a log: JSON unless a string, control characters (newlines included) escaped,
    at most ``limit`` characters (the rest said in a count). What another system sends cannot forge or
    flood mcpipe's log lines through it."""
    whole = data if isinstance(data, str) else orjson.dumps(data, default=str).decode()
    size = len(whole)
    text = whole[: limit * 2].translate(_CONTROL)
    if len(text) > limit or size > limit * 2:
        text = f"{text[:limit]}... ({size} characters)"
    return text


class RateLimit:
    """A token bucket: :meth:`take` is True at most ``rate`` times a second on average (``burst`` at once);
    :meth:`dropped` says how many were refused since it was last asked."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()
        self._dropped = 0

    def take(self, cost: float = 1.0) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        self._dropped += 1
        return False

    def dropped(self) -> int:
        out, self._dropped = self._dropped, 0
        return out


class RunLimiter:
    """A capacity limiter of ``total`` slots per Trio run, made on first use (a limiter belongs to the run
    that made it, so each run, each test, gets its own): ``_threads = RunLimiter("mcpipe_x_threads", 4)``,
    then ``trio.to_thread.run_sync(fn, limiter=_threads())``."""

    def __init__(self, name: str, total: int) -> None:
        self._name = name
        self._var: trio.lowlevel.RunVar[trio.CapacityLimiter] | None = None  # made on first use: trio is lazy
        self._total = total

    def __call__(self) -> trio.CapacityLimiter:
        import trio

        if self._var is None:
            self._var = trio.lowlevel.RunVar(self._name)
        try:
            return self._var.get()
        except LookupError:
            limiter = trio.CapacityLimiter(self._total)
            self._var.set(limiter)
            return limiter


async def read_capped(response: Any, limit: int) -> tuple[bytes, bool]:
    """A streamed HTTP response's body (an ``httpx`` response sent with ``stream=True``), read as it arrives:
    ``(body, False)``, or ``(its first limit bytes, True)`` when there is more, nothing past that read."""
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(response.aiter_bytes()) as parts:
        async for chunk in parts:
            if size + len(chunk) > limit:
                chunks.append(chunk[: limit - size])
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks), False
