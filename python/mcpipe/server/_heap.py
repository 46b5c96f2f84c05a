"""The cyclic collector of a process that serves (``mcpipe serve``, ``mcpipe worker``).

A served call allocates a few thousand objects that nearly all die by reference counting, and CPython's
default collector passes over its young objects every 700 allocations, and over everything the process
holds (the SDK, the config, the plans, the templates: about 250k objects for the NoETL playbooks) whenever
enough has survived a few passes. In a server at concurrency 16 that was 8% of its CPU (perf: the collector's
own functions). :func:`settle`, called once the app is open, moves what is loaded by then out of the
collector's reach (``gc.freeze``: it lives as long as the process) and passes over young objects every
:data:`YOUNG` allocations. Garbage made while serving, cycles included, is collected as before.

A library that embeds :func:`mcpipe.server.open_app` keeps its own collector's settings: only the CLI's
serving commands call :func:`settle`.
"""

from __future__ import annotations

import gc

YOUNG = 10_000
"""Allocations (less deallocations) between passes over the young generation (CPython: 700)."""


def settle() -> None:
    """Freeze what the process holds now (collected first, so no garbage is frozen) and raise the young
    generation's threshold; the older generations keep theirs."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)


def thaw() -> None:
    """Give the frozen objects back to the collector (after a reload: the config it replaced, frozen at the
    start, can then be collected once its app has closed)."""
    gc.unfreeze()
