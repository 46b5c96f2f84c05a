"""Fixtures of the server tests; helpers live in ``tests/kit``."""

from __future__ import annotations

import pytest

from kit.audit import WatchedAudit


@pytest.fixture
def audit() -> WatchedAudit:
    """An audit log keeping its records in memory, which a test can wait on."""
    return WatchedAudit()
