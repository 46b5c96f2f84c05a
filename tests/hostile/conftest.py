"""Hypothesis profiles of the hostile-input suite: quick in the normal run, long under ``make fuzz``."""

from __future__ import annotations

import os

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
