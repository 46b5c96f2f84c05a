"""Connections to what declared steps talk to besides HTTP: SQL databases, NATS, gRPC, Kafka.

Each backend is a self-contained module (its connection management, its execution, its errors); the step
kinds (``sql``, ``sql_tx``, ``sql_await``, ``nats``, ``grpc``, ``kafka``) are thin wrappers over them.
Connections are opened lazily, shared per server, and closed when the server stops.

Backends of declared steps
--------------------------

(`python/mcpipe/backends/`). The `sql`, `sql_tx`, `sql_await`, `nats`, `grpc` and `kafka` steps are thin wrappers
over self-contained backend modules, each with its own connection management and execution; their errors
(`SqlError`, `NatsError`, `GrpcError`, `KafkaError`) are one `backends/_errors.BackendError`, whose `code` is the
step's error code:

- `backends/sql.py`: named databases (`[sql.NAME]`), SQLite built in and PostgreSQL through psycopg 3. The
  drivers block, so every statement runs in a worker thread (`_threads.run_interruptible`); a pool of at most
  `pool_size` connections per backend (a `CapacityLimiter` plus idle connections, opened lazily) bounds them. A
  statement past its timeout, or whose caller is cancelled, is interrupted (`sqlite3`'s `interrupt()`, a
  PostgreSQL cancel request, plus the server's `statement_timeout`); a connection goes back to the pool only once
  its thread has finished with it, else that thread closes it. Statements are parsed once; `:name` parameters are
  bound by the driver, never spliced into the text.
- `backends/nats.py`: a Trio-native NATS client (the text protocol), one connection per URL, requests matched to
  replies through one wildcard inbox subscription. `backends/jetstream.py` is JetStream over it (request/reply on
  `$JS.API.*`, publishes acknowledged by their stream): the key/value store (`KV_<bucket>` on
  `$KV.<bucket>.<key>`) and the object store (`OBJ_<bucket>`, chunks and a JSON description), laid out as nats-py
  and the Go client lay them out (its tests read each other's writes with nats-py); listings and an object's
  chunks come through an ephemeral push consumer, bounded (`MAX_LISTED`, `MAX_OBJECT_BYTES`). NoETL's `nats` tool
  runs on it.
- `backends/grpc.py`: one grpcio channel per URL; message types from server reflection or a descriptor set;
  blocking calls in worker threads, cancelled on the wire when the step is.
- `backends/kafka.py`: a Trio-native Kafka client (ApiVersions, Metadata, Produce, Fetch, ListOffsets in versions
  brokers from 0.11 to 4.x answer; record batches v2 with CRC-32C), a connection per broker plus one per response
  partition it follows (a broker answers a connection's requests in order, so a long-polling Fetch must not sit
  in front of a Produce); a request's response is matched by its correlation id. Its tests run a small Kafka-
  protocol broker (`tests/kit/kafkabroker.py`) and check both against kafka-python; `make kafka-tansu` runs them
  against tansu, a real Kafka-compatible broker.
- `backends/_connections.py`: `Connections` owns the long-lived connections (a NATS reader task must outlive the
  step that opened it) in a nursery of its own, which the server starts beside its other services; connections
  open on first use, are shared per URL, reopen after a break, and close when the server stops. SQL pools are
  closed by `DeclaredPipelines.aclose()` when the app exits.

"""

from mcpipe.backends._connections import Connections, NotRunning
from mcpipe.backends._threads import run_interruptible

__all__ = ["Connections", "NotRunning", "run_interruptible"]
