"""Fixtures of the server tests; helpers live in ``serverkit``."""

from __future__ import annotations

import pytest

from mcpipe.gateway import AuditLog


@pytest.fixture
def audit() -> AuditLog:
    """An audit log keeping its records in memory."""
    return AuditLog(None, keep=True)
