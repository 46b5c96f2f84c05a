"""What one run keeps until it ends.

A step may leave something for the later steps of the same run (a ``python`` worker kept with
``outbound.python.reuse: run``, :mod:`mcpipe.kinds._pyworker`), to be released when the run is over,
however it ends. The scheduler opens a :class:`RunScope` around the outermost run of a call
(:func:`enter` / :func:`leave`); a run inside a step (a nested pipeline, a sub-playbook, a declared
pipeline called from a pipeline) is part of it. Steps find it with :func:`current` and register what to
release with :meth:`RunScope.on_end`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from contextvars import ContextVar, Token

__all__ = ["RunScope", "current", "enter", "leave"]

_log = logging.getLogger("mcpipe.runtime")


class RunScope:
    """One outermost run: what to release when it ends (each registered once, under a key)."""

    __slots__ = ("_ends", "open")

    def __init__(self) -> None:
        self._ends: dict[Hashable, Callable[[], object]] | None = None
        self.open = True
        """False once the run has ended (nothing may be kept for it any more)."""

    def on_end(self, key: Hashable, release: Callable[[], object]) -> None:
        """Call ``release`` when the run ends (once per ``key``: a second registration is ignored)."""
        if self._ends is None:
            self._ends = {}
        self._ends.setdefault(key, release)

    def close(self) -> None:
        """The run is over: release what was kept, newest first (a release that fails is logged)."""
        self.open = False
        ends, self._ends = self._ends, None
        if not ends:  # the usual run: nothing kept
            return
        for release in reversed(list(ends.values())):
            try:
                release()
            except Exception:  # one failed release must not keep the others
                _log.exception("releasing what a run kept failed")


_CURRENT: ContextVar[RunScope | None] = ContextVar("mcpipe_run_scope", default=None)


def current() -> RunScope | None:
    """The run this task belongs to (None outside a run)."""
    return _CURRENT.get()


def enter() -> Token[RunScope | None] | None:
    """Open a scope for a run, unless one is open already (a run inside a step): the token to
    :func:`leave` with, or None when this run is part of an outer one."""
    if _CURRENT.get() is not None:
        return None
    return _CURRENT.set(RunScope())


def leave(token: Token[RunScope | None] | None) -> None:
    """Close the scope :func:`enter` opened (nothing when it opened none)."""
    if token is None:
        return
    scope = _CURRENT.get()
    _CURRENT.reset(token)
    if scope is not None:
        scope.close()
