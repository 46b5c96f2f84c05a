"""The tests' kit: the servers, clients, tools and audit logs more than one test folder uses.

``tests`` is on ``sys.path`` (``pythonpath`` in pyproject.toml) and tests import with
``--import-mode=importlib``, so helpers live here, imported as ``kit.<module>``, never by test files'
names.

What is here
------------

`tests/kit/` holds what more than one test folder uses: servers (`kit.servers`: `running`, `http_server`,
`start_process`, the downstream test server), clients (`kit.clients.bearer_client`), the test tools (`kit.tools`:
`slow`, `boom`, `fail`, `hang`, `block`), `kit.audit.WatchedAudit`, the interaction scenarios
(`kit.interaction`), the declared-step helpers (`kit.declared`, `kit.pipelines`), and the model tests' servers
(`kit.llm`: a scripted OpenAI-compatible endpoint and a JSON API on 127.0.0.1, a client answering sampling), the
real servers of the backends (`kit.realservers`, `kit.grpcserver`, `kit.kafkabroker`, whose `Broker` also counts
the connections it accepts) and `kit.tcpcount.CountingForwarder`, which counts the connections a client opens to
a server that does not say (grpcio), `kit.containers` (the image under podman, for `make image-test`),
`kit.processes` (a step's processes: the detaching python step, `/proc` command lines, waiting until they are
gone), `kit.queues` (a running run queue on SQLite or Redis) and `kit.mcp_script` (how the script servers, such
as `downstream_server.py`, serve HTTP). Tests
run with `--import-mode=importlib` and `tests` on `pythonpath`, so they import `kit.*`, never each other.

The Kafka tests (`kafka_bootstrap` in `tests/backends/conftest.py`, from `kit.realservers.kafka_broker`) run
against the tests' Python broker (`kit.kafkabroker`) unless `MCPIPE_KAFKA=tansu`: then against tansu, an
Apache-2.0 Kafka-compatible broker (`kit.realservers.tansu_broker`: in-memory storage, a free 127.0.0.1 port, a
temporary directory, the tests' topics created first, since tansu creates none on first use; a new Kafka test's
topic goes in `KAFKA_TOPICS` there). `make kafka-tansu` builds tansu into `.tansu/` and runs them so. It is not
part of `make test` (CI): building tansu took 14 min 22 s on the 2-core machine, for about 10 s of tests; see
docs/declared-pipelines.md.

"""
