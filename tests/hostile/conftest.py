"""Hypothesis profiles of the hostile-input suite: quick in the normal run, long under ``make fuzz``."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "hostile",
    max_examples=40,
    deadline=1000,  # no input may take a second
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("MCPIPE_FUZZ_EXAMPLES", "3000")),
    deadline=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_of_the_module() -> Iterator[None]:
    """Collect what a module's in-process servers left unclosed (the SDK's anyio streams) before the next
    module starts: its own warning filters apply to it, not those of whichever test the collector runs in."""
    yield
    gc.collect()
