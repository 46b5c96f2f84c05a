"""Connections to what declared steps talk to besides HTTP: SQL databases, NATS, gRPC, Kafka.

Each backend is a self-contained module (its connection management, its execution, its errors); the step
kinds (``sql``, ``sql_tx``, ``sql_await``, ``nats``, ``grpc``, ``kafka``) are thin wrappers over them.
Connections are opened lazily, shared per server, and closed when the server stops.
"""

from mcpipe.backends._connections import Connections, NotRunning
from mcpipe.backends._threads import run_interruptible

__all__ = ["Connections", "NotRunning", "run_interruptible"]
