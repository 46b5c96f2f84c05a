"""Regular expressions from JSON Schemas (``pattern``, ``patternProperties``), matched so that no input can hold
the server (issue 20: a downstream's ``outputSchema`` pattern ``^(a+)+$`` froze it 9 s on 28 characters).

A pattern is matched by the Rust core's :class:`~mcpipe._core.Regex` (the ``regex`` crate: an automaton,
time linear in the text, whatever the pattern) when that engine takes it, which is nearly always. The ECMA-262
features it has no linear-time algorithm for (lookaround, backreferences) are matched by Python's ``re`` in a
worker process of :mod:`mcpipe._workerpool`, killed past the deadline (:func:`set_pattern_timeout`,
``pipe.expression_timeout_ms``): :class:`PatternTimeout` then. That wait blocks its thread, so code that may
meet such a pattern validates off the event loop (:attr:`Pattern.linear` says which; :mod:`mcpipe._jsonschema`
does it for schemas).
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path

import orjson

from mcpipe._core import Regex
from mcpipe._workerpool import WorkerBusy, WorkerDied, WorkerPool, WorkerStartError, WorkerTimeout

__all__ = ["Pattern", "PatternTimeout", "compile_pattern", "pattern_timeout_ms", "set_pattern_timeout"]

WORKERS = 2
"""At most this many worker processes (and fallback matches at once); more wait for one."""

MEMORY_BYTES = 512 * 1024 * 1024
"""A worker's address-space limit."""

_timeout_ms = 1000.0


def set_pattern_timeout(ms: float) -> None:
    """How long a pattern the linear-time engine does not take may run (``pipe.expression_timeout_ms``)."""
    global _timeout_ms
    _timeout_ms = float(ms)


def pattern_timeout_ms() -> float:
    return _timeout_ms


class PatternTimeout(Exception):
    """A pattern matched by the fallback engine ran past its deadline (its worker was killed)."""


class Pattern:
    """A compiled pattern; :meth:`search` answers whether it matches anywhere in a text (JSON Schema's rule).

    Attributes:
        source: the pattern as written.
        linear: matched in linear time by the Rust core (else by ``re`` in a worker, under the deadline).
    """

    __slots__ = ("_regex", "linear", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._regex: Regex | None = Regex(source)
        except ValueError:
            self._regex = None
            re.compile(source)  # a pattern neither engine takes: re.error, as jsonschema raised before
        self.linear = self._regex is not None

    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in ``text``.

        Raises:
            PatternTimeout: the fallback engine ran past the deadline.
        """
        if self._regex is not None:
            try:
                return self._regex.search(text)
            except UnicodeEncodeError:  # a lone surrogate: only Python's str holds it
                pass
        return _search_in_worker(self.source, text)

    def __repr__(self) -> str:
        return f"Pattern({self.source!r}, linear={self.linear})"


@lru_cache(maxsize=1024)
def compile_pattern(source: str) -> Pattern:
    """The compiled pattern, cached.

    Raises:
        re.error: a pattern neither engine takes.
    """
    return Pattern(source)


# --- the fallback: re in killable worker processes --------------------------------------------------------

_POOL = WorkerPool(
    "pattern",
    # -P: the script's directory (mcpipe's, whose _json.py would shadow the standard library's) stays off
    # sys.path.
    [sys.executable, "-P", str(Path(__file__).with_name("_patternexec.py"))],
    size=WORKERS,
    memory_bytes=MEMORY_BYTES,
)
"""The workers (:mod:`mcpipe._workerpool`): called from threads, the wait for one and the match each under the
deadline."""


def _search_in_worker(source: str, text: str) -> bool:
    ms = _timeout_ms
    try:
        reply = _POOL.call_blocking(orjson.dumps([source, text]), ms / 1000, wait_s=ms / 1000)
    except WorkerBusy:
        raise PatternTimeout(f"no pattern worker was free within {ms:g} ms") from None
    except WorkerTimeout:
        raise PatternTimeout(f"matching the pattern {source!r} took longer than {ms:g} ms") from None
    except WorkerDied:
        raise PatternTimeout(f"matching the pattern {source!r} ended its worker (out of memory?)") from None
    except WorkerStartError:
        raise OSError("the pattern worker did not start") from None
    if reply.startswith(b"E"):
        raise re.error(reply[1:].decode(errors="replace").strip())
    return reply == b"1"
