from __future__ import annotations

from collections.abc import Iterator

import pytest

from realservers import kafka_broker, nats_server, postgres_server


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """One PostgreSQL server for the session's tests (each test uses tables of its own)."""
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    with nats_server() as url:
        yield url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with kafka_broker() as bootstrap:
        yield bootstrap
