"""The mcpg oracle's harness: serve an mcpg config, call it over MCP, and record what came back.

Shared by ``scripts/mcpg_oracle/record.py`` (records goldens from the real mcpg binary),
``scripts/mcpg_oracle/diff.py`` (mcpg and ``mcpipe serve`` side by side) and
``tests/formats/mcpg/test_mcpg_goldens.py`` (replays the goldens against mcpipe in CI).

A case (``tests/formats/mcpg/cases.yaml``) names an mcpg config (an upstream file, by its INDEX key,
or one of ``tests/formats/mcpg/cases/``), the outside services it talks to, the hosts to point at them,
and the calls to make. Its golden (``tests/formats/mcpg/golden/served/<case>.json``) holds the exact
config served (a template: ``{{port:NAME}}`` for each service's port, ``{{dir}}`` for the run's
scratch folder, ``{{plugins}}`` for the folder of mcpg's backend plugins), the services as they were
set up, and per call its inputs, mcpg's JSON-RPC response and what the services received.

The client is a plain JSON-RPC client of the streamable HTTP transport (``RawMcp``), written here so
the responses are recorded byte for byte as the server sent them (the SDK's typed results would
normalise them). Volatile values (UUIDs, timestamps, durations, ports, the scratch folder) are
masked (``mask``) before anything is recorded or compared.
"""

from __future__ import annotations

import copy
import http.client
import json
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

__all__ = [
    "KEPT",
    "PROTOCOL",
    "CaseRun",
    "RawMcp",
    "StandIn",
    "compare",
    "mask",
    "oracle_overlay",
    "render",
    "render_env",
    "rewrite_hosts",
    "run_calls",
    "services",
]

PROTOCOL = "2025-06-18"
# Who the oracle's client says it is (``x-mcpg-subject-id``, trusted by the overlay's
# ``trust_subject_header``): a header-asserted caller.
SUBJECT = "mcpg-oracle"
PORT = re.compile(r"\{\{port:([\w-]+)\}\}")
UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
ISO_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\b")
# Keys whose values change from run to run, wherever they appear (a JSON key, or a key inside a text).
VOLATILE_KEYS = (
    "duration_ms",
    "durationMs",
    "elapsed_ms",
    "elapsedMs",
    "latency_ms",
    "request_id",
    "requestId",
    "timestamp",
    "started_at",
    "finished_at",
    "trace_id",
    "traceId",
    "span_id",
    "requestState",
    "request_state",
    "correlation_token",
)
VOLATILE_IN_TEXT = re.compile(r'("(?:' + "|".join(VOLATILE_KEYS) + r')"\s*:\s*)(-?\d+(?:\.\d+)?|"(?:[^"\\]|\\.)*")')
# Request headers whose value is the client's own business (its name, version, compression, the
# trace context it made up): recorded masked, never compared.
VOLATILE_HEADERS = frozenset(
    {"user-agent", "accept-encoding", "connection", "traceparent", "tracestate", "idempotency-key", "host"}
)


def mask(value: Any, ports: dict[str, int] | None = None, scratch: str | None = None) -> Any:
    """``value`` with its run-to-run values replaced by markers (``<uuid>``, ``<time>``, ``<masked>``,
    ``{{port:NAME}}``, ``{{dir}}``); dicts, lists and strings are walked, other values kept."""
    ports = ports or {}

    def text(s: str) -> str:
        if scratch:
            s = s.replace(scratch, "{{dir}}")
        for name, port in sorted(ports.items(), key=lambda kv: -kv[1]):
            s = re.sub(rf"(?<=[:/]){port}\b", "{{port:" + name + "}}", s)
        s = UUID.sub("<uuid>", s)
        s = ISO_TIME.sub("<time>", s)
        return VOLATILE_IN_TEXT.sub(lambda m: m.group(1) + '"<masked>"', s)

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ("<masked>" if k in VOLATILE_KEYS else walk(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return text(v)
        return v

    return walk(value)


def render(template: str, ports: dict[str, int], scratch: str, plugins: str = "") -> str:
    """The config ``template`` with its placeholders filled."""

    def port(m: re.Match[str]) -> str:
        if m.group(1) not in ports:
            raise KeyError(f"the config names service {m.group(1)!r}, which the case does not start")
        return str(ports[m.group(1)])

    return PORT.sub(port, template).replace("{{dir}}", scratch).replace("{{plugins}}", plugins)


def render_env(env: dict[str, str], ports: dict[str, int], scratch: str) -> dict[str, str]:
    """The case's environment (what ``${env.NAME}`` reads) with its placeholders filled."""
    return {k: render(str(v), ports, scratch) for k, v in env.items()}


# --- configs ---------------------------------------------------------------------------------------


def rewrite_hosts(doc: Any, hosts: dict[str, str]) -> Any:
    """``doc`` with every occurrence, in its strings, of a key of ``hosts`` (a scheme and host, maybe a
    port: ``https://api.name.com``, ``db.internal:5432``) replaced by its value: a service name stands
    for ``http://127.0.0.1:{{port:NAME}}``, anything else is used as written (``127.0.0.1:{{port:db}}``).
    Only where the service is changes; paths, queries and everything else stay."""
    targets = {k: (v if "{{" in v else "http://127.0.0.1:{{port:" + v + "}}") for k, v in hosts.items()}

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            for origin, target in targets.items():
                v = v.replace(origin, target)
        return v

    return walk(doc)


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(over, list):
        return base + over
    return over


def _backend_kinds(doc: dict[str, Any]) -> set[str]:
    kinds: set[str] = set()

    def steps(items: list[Any]) -> None:
        for s in items or []:
            if isinstance(s, dict):
                kind = s.get("kind")
                if kind in ("sql_tx", "sql_await"):
                    kinds.add("sql")
                elif isinstance(kind, str):
                    kinds.add(kind)
                steps(s.get("steps") or [])

    caps = (doc.get("mcp") or {}).get("capabilities") or {}
    for section in ("tools", "prompts", "resources", "resource_templates"):
        for binding in caps.get(section) or []:
            backend = (binding or {}).get("backend") or {}
            kind = backend.get("kind")
            if isinstance(kind, str):
                kinds.add(kind)
            steps(backend.get("steps") or [])
    return kinds


# mcpg loads these as cdylibs from plugins[] rows (its own conformance run.sh injects the mock one).
PLUGIN_IDS = {
    "http": "dev.mcpg.backend.http",
    "mock": "dev.mcpg.backend.mock",
    "command": "dev.mcpg.backend.command",
    "sql": "dev.mcpg.backend.sql",
    "nats": "dev.mcpg.backend.nats",
    "kafka": "dev.mcpg.backend.kafka",
    "jsonata": "dev.mcpg.transform.jsonata",  # a transform: its row's artifact, never a row of its own
    "grpc": "dev.mcpg.backend.grpc",
}


def oracle_overlay(doc: dict[str, Any], trust_floor: bool = True) -> dict[str, Any]:
    """``doc`` with what serving it here needs, and nothing else: the listener on a free loopback
    port, private (loopback) backends allowed since the stand-ins are on 127.0.0.1, the per-IP
    anonymous rate limit off, unsigned plugins accepted, a ``plugins[]`` row for each backend plugin
    the bindings use (mcpg has none linked in, its conformance run.sh injects the mock one so), and
    (``trust_floor``) the caller's ``x-mcpg-subject-id`` header trusted, which makes ``RawMcp`` a
    header-asserted caller: mcpg's default trust floor for a binding (``HeaderAsserted``) hides every
    binding from anonymous callers, and its remedy is this setting (mcpg's ``trust_ceiling_remedy``);
    and ``license.non_production_use: true``, which the licence gate asks of an unlicensed deployment
    that loads gated plugins (grpc, kafka)."""
    server: dict[str, Any] = {
        "bind_address": "127.0.0.1:{{port:mcp}}",
        "allow_private_backends": True,
        "anonymous_rate_limit_per_min": 0,
    }
    if trust_floor:
        server["trust_subject_header"] = True
    over: dict[str, Any] = {
        "gateway": {"server": server, "plugin_registry": {"default_signature_policy": "disabled"}},
        # Not a production deployment: mcpg's licence gate then admits its entitlement-gated plugins
        # (grpc, kafka, ...), as its refusal message says.
        "license": {"non_production_use": True},
    }
    kinds = {kind: pid for kind, pid in PLUGIN_IDS.items() if kind in _backend_kinds(doc)}
    rows = []
    for row in doc.get("plugins") or []:
        # A row of the config for one of these plugins: only where its artifact is changes.
        pid = str((row or {}).get("ref") or (row or {}).get("id"))
        kind = next((k for k, p in PLUGIN_IDS.items() if p == pid), None)
        if kind is not None:
            kinds.pop(kind, None)
            row = {**row, "source": {"path": "{{plugins}}/" + kind + "/plugin.so"}}
        rows.append(row)
    for kind, pid in sorted(kinds.items()):
        row = {
            "id": pid,
            "kind": "native",
            "class": "backend",
            "source": {"path": "{{plugins}}/" + kind + "/plugin.so"},
        }
        if kind not in ("mock", "command"):
            row["granted_capabilities"] = ["network_outbound"]
        rows.append(row)
    doc = {**doc, "plugins": rows} if rows else doc
    return _merge(doc, over)


def mcp_url(config_text: str) -> tuple[str, str]:
    """The MCP path and health path the config serves at (mcpg's defaults: /mcp and /health)."""
    doc = yaml.safe_load(config_text) or {}
    server = ((doc.get("gateway") or {}).get("server")) or {}
    return str(server.get("mcp_path") or "/mcp"), str(server.get("health_path") or "/health")


# --- services --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Route:
    """One answer of a stand-in: a request whose method and path (a regular expression, matched
    whole) fit gets ``status``, ``headers`` and ``body`` (JSON unless ``text`` is set)."""

    method: str
    path: str
    status: int = 200
    body: Any = None
    text: str | None = None
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class StandIn:
    """An HTTP server on 127.0.0.1 standing in for a real API: answers from its routes (the first that
    fits; 404 with a JSON error otherwise) and records every request it received (but HEADs: mcpg
    probes its http bindings' health with them on its own; they are answered 200 and counted in
    ``probes``)."""

    def __init__(self, routes: list[dict[str, Any]]) -> None:
        self.routes = [Route(**r) for r in routes]
        self.received: list[dict[str, Any]] = []
        self.probes = 0
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                owner._record(self.command, self.path, dict(self.headers.items()), raw)
                status, headers, payload = owner._answer(self.command, urlsplit(self.path).path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def do_HEAD(self) -> None:
                # mcpg's binding health probe (a HEAD of the binding's URL, in the background):
                # answered, never recorded, since no call made it.
                owner.probes += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hangs up early (a server capping what it reads) is not the stand-in's error

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _record(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> None:
        parts = urlsplit(target)
        body: Any
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        entry = {
            "method": method,
            "path": parts.path,
            "query": parts.query,
            "headers": {k.lower(): ("<masked>" if k.lower() in VOLATILE_HEADERS else v) for k, v in headers.items()},
            "body": body,
        }
        with self._lock:
            self.received.append(entry)

    def _answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        for r in self.routes:
            if r.method.upper() == method and re.fullmatch(r.path, path):
                if r.text is not None:
                    payload = r.text.encode()
                    ctype = r.content_type or "text/plain"
                else:
                    payload = json.dumps(r.body).encode()
                    ctype = r.content_type or "application/json"
                return r.status, {"Content-Type": ctype, **r.headers}, payload
        return 404, {"Content-Type": "application/json"}, b'{"error":"no route in the stand-in"}'

    def take(self) -> list[dict[str, Any]]:
        """What was received since the last ``take``."""
        with self._lock:
            out, self.received = self.received, []
        return out

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class NatsResponders:
    """NATS responders on a real nats-server: each subject answers its JSON reply to every request,
    and every message received is recorded (subject, data, headers)."""

    def __init__(self, url: str, replies: dict[str, Any]) -> None:
        self.url, self.replies = url, replies
        self.received: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import asyncio

        import nats

        async def main() -> None:
            nc = await nats.connect(self.url)

            async def handle(msg: Any) -> None:
                try:
                    data: Any = json.loads(msg.data) if msg.data else None
                except ValueError:
                    data = msg.data.decode(errors="replace")
                headers = {
                    k.lower(): ("<masked>" if k.lower() in VOLATILE_HEADERS else v)
                    for k, v in (msg.headers or {}).items()
                }
                with self._lock:
                    self.received.append({"subject": msg.subject, "data": data, "headers": headers})
                if msg.reply:
                    await msg.respond(json.dumps(self.replies[msg.subject]).encode())

            for subject in self.replies:
                await nc.subscribe(subject, cb=handle)
            await nc.flush()
            self._ready.set()
            await asyncio.get_running_loop().run_in_executor(None, self._stop.wait)
            await nc.drain()

        asyncio.run(main())

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self.received = self.received, []
        return out

    def __enter__(self) -> NatsResponders:
        self._thread.start()
        if not self._ready.wait(20):
            raise TimeoutError("the NATS responders did not subscribe within 20 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


class KafkaResponders:
    """A worker on a Kafka broker: for each record on a request topic of ``responders`` (``{topic: {topic:
    <response topic>, reply: <JSON>, delay_ms: <wait before the first reply>}}``), its JSON reply on the
    response topic, with the request's ``correlation_id`` header (as a request/reply caller such as mcpg's
    kafka plugin matches it). It reads with mcpipe's own Kafka client, from the start of each partition."""

    def __init__(self, bootstrap: str, responders: dict[str, Any]) -> None:
        self.bootstrap, self.responders = bootstrap, responders
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import trio

        from mcpipe.backends.kafka import KafkaClient

        async def main() -> None:
            client = KafkaClient(self.bootstrap, client_id="mcpg-oracle-worker")
            offsets: dict[tuple[str, int], int] = {}
            answered: set[str] = set()
            async with trio.open_nursery() as nursery:
                await nursery.start(client.run)
                self._ready.set()
                while not self._stop.is_set():
                    for topic, how in self.responders.items():
                        for partition in range(2):
                            try:
                                records, offsets[(topic, partition)] = await client.fetch(
                                    topic, partition, offsets.get((topic, partition), 0), max_wait_ms=50
                                )
                            except Exception:
                                await trio.sleep(0.05)  # the topic does not exist (yet)
                                continue
                            for r in records:
                                if topic not in answered:
                                    answered.add(topic)
                                    await trio.sleep(int(how.get("delay_ms") or 0) / 1000)
                                cid = next((v for k, v in r.headers if k == "correlation_id"), None)
                                headers = {"correlation_id": cid} if cid is not None else {}
                                reply = json.dumps(how.get("reply")).encode()
                                await client.produce(how["topic"], reply, headers=headers)
                nursery.cancel_scope.cancel()

        trio.run(main)

    def __enter__(self) -> KafkaResponders:
        self._thread.start()
        if not self._ready.wait(20):
            raise TimeoutError("the Kafka worker did not connect within 20 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


class KafkaTopics:
    """What a Kafka broker holds on some topics, read with mcpipe's own Kafka client: ``take`` returns the
    records produced since the last ``take`` (topic, value, headers)."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.offsets: dict[tuple[str, int], int] = {}

    def take(self) -> list[dict[str, Any]]:
        import trio

        from mcpipe.backends.kafka import KafkaClient

        async def read() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            client = KafkaClient(self.bootstrap, client_id="mcpg-oracle")
            async with trio.open_nursery() as nursery:
                await nursery.start(client.run)
                for topic in self.topics:
                    for partition in range(2):
                        offset = self.offsets.get((topic, partition), 0)
                        try:
                            records, self.offsets[(topic, partition)] = await client.fetch(
                                topic, partition, offset, max_wait_ms=100
                            )
                        except Exception:
                            continue  # the topic does not exist (yet)
                        for r in records:
                            try:
                                value: Any = json.loads(r.value) if r.value else None
                            except ValueError:
                                value = (r.value or b"").decode(errors="replace")
                            headers = {
                                k: (
                                    "<masked>"
                                    if k in VOLATILE_HEADERS or k == "correlation_id"
                                    else (v or b"").decode()
                                )
                                for k, v in r.headers
                            }
                            out.append(
                                {"topic": topic, "value": value, "headers": headers}
                            )  # a keyless record lands on any partition
                nursery.cancel_scope.cancel()
            return out

        return trio.run(read)


@dataclass
class CaseRun:
    """The services of one run: their ports by name, the scratch folder, and per service that records
    what it receives a function taking what it received so far."""

    ports: dict[str, int]
    scratch: str
    recorders: dict[str, Callable[[], list[dict[str, Any]]]]

    def received(self) -> dict[str, list[dict[str, Any]]]:
        out = {}
        for name, take in sorted(self.recorders.items()):
            got = take()
            if got:
                out[name] = got
        return out


@contextmanager
def services(spec: dict[str, Any], scratch: Path) -> Iterator[CaseRun]:
    """Start the services of a case (``spec``: ``http``/``sqlite``/``postgres``/``nats``/``kafka``/
    ``grpc``, each a mapping of service name to its setup) and a free port named ``mcp`` for the
    server under test."""
    from kit import realservers

    ports: dict[str, int] = {"mcp": free_port()}
    recorders: dict[str, Callable[[], list[dict[str, Any]]]] = {}
    with ExitStack() as stack:
        for name, s in (spec.get("http") or {}).items():
            standin = stack.enter_context(StandIn(s.get("routes") or []))
            recorders[name] = standin.take
            ports[name] = standin.port
        for name, s in (spec.get("sqlite") or {}).items():
            db = sqlite3.connect(scratch / f"{name}.db")
            db.executescript(s.get("setup") or "")
            db.commit()
            db.close()
        for name, s in (spec.get("postgres") or {}).items():
            url = stack.enter_context(realservers.postgres_server())
            ports[name] = int(urlsplit(url).port or 0)
            if s.get("setup"):
                import psycopg

                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(s["setup"])
        for name, s in (spec.get("nats") or {}).items():
            url = stack.enter_context(realservers.nats_server())
            ports[name] = int(urlsplit(url).port or 0)
            if (s or {}).get("responders"):
                responders = stack.enter_context(NatsResponders(url, s["responders"]))
                recorders[name] = responders.take
        for name, s in (spec.get("kafka") or {}).items():
            bootstrap = stack.enter_context(realservers.kafka_broker((s or {}).get("topics") or []))
            ports[name] = int(bootstrap.rsplit(":", 1)[1])
            if (s or {}).get("topics"):
                recorders[name] = KafkaTopics(bootstrap, s["topics"]).take
            if (s or {}).get("responders"):
                stack.enter_context(KafkaResponders(bootstrap, s["responders"]))
        for name in spec.get("grpc") or {}:
            from kit import grpcserver

            url, seen = stack.enter_context(grpcserver.grpc_server())
            ports[name] = int(urlsplit(url).port or 0)

            def took(seen: Any = seen) -> list[dict[str, Any]]:
                calls = [{"method": m} for m in seen.methods if "reflection" not in m]
                for call, data in zip(calls, seen.calls, strict=False):
                    meta = data.get("metadata") or {}
                    call["id"] = data.get("id")
                    call["metadata"] = {k: ("<masked>" if k in VOLATILE_HEADERS else v) for k, v in meta.items()}
                seen.methods.clear()
                seen.calls.clear()
                return calls

            recorders[name] = took
        yield CaseRun(ports=ports, scratch=str(scratch), recorders=recorders)


# --- the client ------------------------------------------------------------------------------------


class RawMcp:
    """A JSON-RPC client of MCP's streamable HTTP transport (protocol ``PROTOCOL``), blocking.

    ``answers`` answers the server's own requests (``elicitation/create``, ``sampling/createMessage``,
    ``roots/list``) by method; notifications the server sends while a request runs are kept in
    ``notifications``. Every request carries ``x-mcpg-subject-id: <subject>`` (``None``: none)."""

    def __init__(
        self, url: str, answers: dict[str, Any] | None = None, timeout: float = 30.0, subject: str | None = SUBJECT
    ) -> None:
        parts = urlsplit(url)
        self.subject = subject
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
        self.answers = answers or {}
        self.timeout = timeout
        self.session: str | None = None
        self.next_id = 0
        self.notifications: list[dict[str, Any]] = []
        self._conns: list[http.client.HTTPConnection] = []

    def _close(self) -> None:
        while self._conns:
            self._conns.pop().close()

    def _post(self, message: dict[str, Any]) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._conns.append(conn)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL,
        }
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        if self.subject:
            headers["x-mcpg-subject-id"] = self.subject
        conn.request("POST", self.path, body=json.dumps(message).encode(), headers=headers)
        return conn.getresponse()

    def _events(self, resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
        data: list[str] = []
        while True:
            line = resp.readline()
            if not line:
                break
            text = line.decode().rstrip("\r\n")
            if text.startswith("data:"):
                data.append(text[5:].lstrip())
            elif text == "" and data:
                payload = "\n".join(data)
                data = []
                if payload.strip():
                    yield json.loads(payload)
        if data and "".join(data).strip():
            yield json.loads("\n".join(data))

    def _answer(self, request: dict[str, Any]) -> None:
        method = request.get("method", "")
        if method in self.answers:
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": self.answers[method]}
        else:
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "not answered"}}
        self._post(reply).read()

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request; return the server's response message (``result`` or ``error``)."""
        try:
            return self._request(method, params)
        finally:
            self._close()

    def _request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        resp = self._post(message)
        if resp.getheader("Mcp-Session-Id"):
            self.session = resp.getheader("Mcp-Session-Id")
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        if ctype == "text/event-stream":
            for event in self._events(resp):
                if event.get("id") == rid and ("result" in event or "error" in event):
                    resp.close()
                    return event
                if "method" in event and "id" in event:
                    self._answer(event)
                elif "method" in event:
                    self.notifications.append(event)
            raise RuntimeError(f"{method}: the event stream ended without a response")
        body = resp.read()
        if resp.status >= 400 and not body.strip().startswith(b"{"):
            return {"jsonrpc": "2.0", "id": rid, "http_error": {"status": resp.status, "body": body.decode()}}
        answer = json.loads(body) if body.strip() else {}
        if resp.status >= 400 and "error" not in answer:
            return {"jsonrpc": "2.0", "id": rid, "http_error": {"status": resp.status, "body": answer}}
        return answer

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        try:
            self._post(message).read()
        finally:
            self._close()

    def initialize(self) -> dict[str, Any]:
        caps: dict[str, Any] = {}
        if "elicitation/create" in self.answers:
            caps["elicitation"] = {}
        if "sampling/createMessage" in self.answers:
            caps["sampling"] = {}
        if "roots/list" in self.answers:
            caps["roots"] = {"listChanged": False}
        result = self.request(
            "initialize",
            {"protocolVersion": PROTOCOL, "capabilities": caps, "clientInfo": {"name": "mcpg-oracle", "version": "1"}},
        )
        self.notify("notifications/initialized")
        return result


def wait_http(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Block until ``url`` answers an HTTP GET (any status), bounded."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the server exited before it listened")
        try:
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=2)
            conn.request("GET", parts.path or "/")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def run_calls(url: str, calls: list[dict[str, Any]], run: CaseRun, answers: dict[str, Any]) -> list[dict[str, Any]]:
    """Make each call of a case in one session; per call: its method and params, the server's
    response (masked) and what each stand-in received meanwhile (masked)."""
    client = RawMcp(url, answers=answers)
    client.initialize()
    run.received()  # anything the server did at start-up is not the call's
    out = []
    for call in calls:
        client.notifications = []
        response = client.request(call["method"], call.get("params"))
        response.pop("id", None)
        response.pop("jsonrpc", None)
        entry = {
            "method": call["method"],
            "params": call.get("params"),
            "response": mask(response, run.ports, run.scratch),
            "received": mask(run.received(), run.ports, run.scratch),
        }
        if client.notifications:
            entry["notifications"] = mask(client.notifications, run.ports, run.scratch)
        out.append(entry)
    return out


# --- comparing -------------------------------------------------------------------------------------


def _strip_headers(received: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(received)
    for requests in out.values():
        for r in requests:
            r["headers"] = {k: v for k, v in r["headers"].items() if k not in VOLATILE_HEADERS}
    return out


def _meaningful(notifications: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The notifications a call's config asked for: mcpg's own transport chatter (``logger:
    mcpg.transport``: "SSE stream opened", "Streaming protocol response") is not compared."""
    return [
        n
        for n in notifications or []
        if not (
            n.get("method") == "notifications/message" and (n.get("params") or {}).get("logger") == "mcpg.transport"
        )
    ]


LISTED = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources"}
LISTED["resources/templates/list"] = "resourceTemplates"


def _unordered(method: str, response: dict[str, Any]) -> dict[str, Any]:
    """A list response with its items in name order: MCP gives lists no order (mcpg sorts them by name,
    others keep the config's order), so the order is not compared."""
    key = LISTED.get(method)
    items = (response.get("result") or {}).get(key) if key else None
    if not isinstance(items, list):
        return response

    def by(item: Any) -> str:
        return (
            str(item.get("name") or item.get("uri") or item.get("uriTemplate") or "") if isinstance(item, dict) else ""
        )

    return {**response, "result": {**response["result"], key: sorted(items, key=by)}}


def _both_json(a: str, b: str) -> tuple[Any, Any] | None:
    """Both texts parsed, when both are JSON documents (an object or an array): mcpg writes some
    results as JSON text with its keys in hash order, which changes from run to run, so such texts are
    compared as the values they hold."""
    try:
        pa, pb = json.loads(a), json.loads(b)
    except ValueError:
        return None
    return (pa, pb) if isinstance(pa, (dict, list)) and isinstance(pb, (dict, list)) else None


# --- differences kept on purpose ------------------------------------------------------------------
#
# Where mcpipe answers otherwise than mcpg on purpose, each reason is a rule that recognises its difference
# (``path``: where in the call, ``a``: mcpg's value, ``b``: mcpipe's, ``call``: mcpg's recorded call) and
# nothing else. ``docs/formats/mcpg.md`` ("Where mcpipe answers otherwise, and why") gives each its reason, and
# ``tests/formats/mcpg/not_yet.json`` (``kept``) names the ones each case needs.

_CEL_FAILED = "CEL execution failed: "
_MISSING = object()


def _structured_object(path: str, a: Any, b: Any, call: dict[str, Any]) -> bool:
    """A structured answer that is not an object (a SQL row list, a scalar, null): MCP's 2025 schema wants an
    object there, so mcpipe sends ``{"result": <value>}`` (and nothing for null), where mcpg sends the value."""
    if not path.endswith("response.result.structuredContent"):
        return False
    if b is _MISSING:
        return a is None
    return not isinstance(a, dict) and b == {"result": a}


def _cel_wording(path: str, a: Any, b: Any, call: dict[str, Any]) -> bool:
    """A CEL expression that fails in both: the engines word the failure each their own way; where it failed
    (mcpg's words before ``CEL execution failed:``) is the same."""
    return (
        isinstance(a, str)
        and isinstance(b, str)
        and _CEL_FAILED in a
        and _CEL_FAILED in b
        and a.split(_CEL_FAILED, 1)[0] == b.split(_CEL_FAILED, 1)[0]
    )


def _pipeline_context(path: str, a: Any, b: Any, call: dict[str, Any]) -> bool:
    """A pipeline step reading ``original_args`` or ``request_context``, which mcpg's docs give every step and
    mcpg as released does not declare to CEL: mcpg fails the call, mcpipe answers it."""
    result = (call.get("response") or {}).get("result") or {}
    texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
    return any(
        f"{_CEL_FAILED}Undeclared reference to '{name}'" in t
        for t in texts
        for name in ("original_args", "request_context")
    )


def _gather_legacy(path: str, a: Any, b: Any, call: dict[str, Any]) -> bool:
    """A pipeline with a ``gather`` step called on a protocol version before 2026-07-28: mcpg refuses it
    (-32603, it sends several questions only as one multi-entry input request, 2026-07-28's), mcpipe asks
    them over the session one after another and answers."""
    error = (call.get("response") or {}).get("error") or {}
    return error.get("message") == "multi-entry MRTR (gather step) is only supported on the modern wire"


KEPT: dict[str, Any] = {
    "structured-object": _structured_object,
    "cel-wording": _cel_wording,
    "pipeline-context": _pipeline_context,
    "gather-legacy": _gather_legacy,
}
"""The differences kept on purpose, by reason: each recognises its own difference and nothing else."""


def compare(
    expected: list[dict[str, Any]],
    actual: list[dict[str, Any]],
    kept: Iterable[str] = (),
    used: set[str] | None = None,
) -> list[str]:
    """Every difference between two lists of recorded calls, one line each (empty when they agree):
    the responses (the items of a list in name order, a text holding JSON as the value it holds), what
    the services received (but the client-side headers of ``VOLATILE_HEADERS``), and the notifications
    sent meanwhile (but mcpg's transport chatter). A difference one of the ``kept`` reasons (``KEPT``)
    recognises is not listed: its reason is added to ``used``."""
    diffs: list[str] = []
    rules = [(name, KEPT[name]) for name in kept]
    call: dict[str, Any] = {}

    def excused(path: str, a: Any, b: Any) -> bool:
        for name, rule in rules:
            if rule(path, a, b, call):
                if used is not None:
                    used.add(name)
                return True
        return False

    def walk(path: str, a: Any, b: Any) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if k not in b:
                    if not excused(f"{path}.{k}", a[k], _MISSING):
                        diffs.append(f"{path}.{k}: missing (expected {json.dumps(a[k])[:200]})")
                elif k not in a:
                    if not excused(f"{path}.{k}", _MISSING, b[k]):
                        diffs.append(f"{path}.{k}: unexpected {json.dumps(b[k])[:200]}")
                else:
                    walk(f"{path}.{k}", a[k], b[k])
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b) and not excused(path, a, b):
                diffs.append(f"{path}: {len(b)} items, expected {len(a)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(f"{path}[{i}]", x, y)
        elif isinstance(a, str) and isinstance(b, str) and a != b and (parsed := _both_json(a, b)):
            walk(path + "(json)", *parsed)
        elif a != b and not excused(path, a, b):
            diffs.append(f"{path}: {json.dumps(b)[:300]} != expected {json.dumps(a)[:300]}")

    for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
        call = e
        params = e.get("params") or {}
        label = f"call {i} {e['method']} {json.dumps(params.get('name') or params.get('uri') or '')}"
        walk(label + " response", _unordered(e["method"], e["response"]), _unordered(e["method"], a["response"]))
        walk(label + " received", _strip_headers(e["received"]), _strip_headers(a["received"]))
        walk(label + " notifications", _meaningful(e.get("notifications")), _meaningful(a.get("notifications")))
    if len(expected) != len(actual):
        diffs.append(f"{len(actual)} calls made, {len(expected)} recorded")
    return diffs
