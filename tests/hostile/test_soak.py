"""The soak in short form: 100 clients, mixed pipelines, a real ``mcpipe serve`` over HTTP (``make soak``
runs it for minutes)."""

from __future__ import annotations

import os

import pytest

from kit.soak import soak

# The server is a process of its own: what the test process's earlier in-process servers left for the garbage
# collector (the SDK's unclosed anyio streams) says nothing of it.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


async def test_a_hundred_clients_of_mixed_pipelines_get_answers_and_the_server_memory_stays_flat():
    report = await soak(float(os.environ.get("MCPIPE_SOAK_S", "20")), clients=100)
    print(report.summary())
    assert report.errors == 0
    assert len(report.latencies) > 100
    assert report.flat(), report.summary()
