from __future__ import annotations

from collections.abc import Iterator

import pytest

from kit.realservers import kafka_broker, nats_server, postgres_server


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """One PostgreSQL server for the session's tests (each test uses tables of its own)."""
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    with nats_server() as url:
        yield url


# The topics the Kafka tests use: the tests' broker creates a topic on first use, tansu (MCPIPE_KAFKA=tansu,
# `make kafka-tansu`) does not, so the fixture creates these first. A new Kafka test's topic goes here.
KAFKA_TOPICS = (
    # test_kafka_client.py
    "orders",
    "rpc.requests",
    "rpc.responses",
    "nobody.listens",
    "nobody.answers",
    # test_kafka_steps.py
    "quotes.requests",
    "quotes.responses",
    "void.requests",
    "void.responses",
    "orders.A-1",
    # test_kafka_interop.py
    "interop.a",
    "interop.b",
    "kp.requests",
    "kp.responses",
    # test_mcpg_services.py
    "requests",
    "responses",
)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A Kafka-protocol broker for the session: the tests' own, or tansu with MCPIPE_KAFKA=tansu."""
    with kafka_broker(KAFKA_TOPICS) as bootstrap:
        yield bootstrap
