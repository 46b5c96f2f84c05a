"""A lean load generator for MCP over streamable HTTP, and the servers the server benchmarks compare.

The SDK's client costs about 4 ms of CPU per call, more than the servers under test, so the load is raw
HTTP/1.1 on keep-alive connections: one pre-encoded 2026-07-28 ``tools/call`` POST (stateless, no session),
written and read back on a trio socket, counted and timed. The server runs in its own process; its CPU is
read from ``/proc/<pid>/stat`` (utime + stime) before and after the load.

    python server_load.py sdk|mcpipe|proxy URL     # serve the benchmark's tools; prints the MCP URL on stdout
"""

from __future__ import annotations

import math
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio

from mcpipe.tools import ToolRegistry

HERE = Path(__file__).parent
TICK = os.sysconf("SC_CLK_TCK")
MODERN = "2026-07-28"
WARMUP = 20
"""Calls made before measuring, on every run."""

bench_tools = ToolRegistry()


@bench_tools.tool
def ping(text: str) -> str:
    """Answer the text (the trivial tool both servers serve)."""
    return text


@bench_tools.tool
def inc(n: int) -> dict[str, int]:
    """Add one (the step of the pipeline benchmark)."""
    return {"n": n + 1}


@bench_tools.tool
async def tick(ms: float, i: int = 0) -> dict[str, int]:
    """Wait ``ms`` milliseconds (a step of the console benchmark's busy run)."""
    await trio.sleep(ms / 1000)
    return {"i": i}


def tools_call(name: str, arguments: dict[str, Any], request_id: int = 1) -> bytes:
    """One 2026-07-28 ``tools/call`` request body (the per-request envelope in ``_meta``)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
    }
    params = {"name": name, "arguments": arguments, "_meta": meta}
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


def request_bytes(host: str, port: int, path: str, body: bytes, bearer: str | None = None) -> bytes:
    name = orjson.loads(body)["params"]["name"]
    auth = f"Authorization: Bearer {bearer}\r\n" if bearer else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}Content-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\n"
        f"Mcp-Method: tools/call\r\nMcp-Name: {name}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Conn:
    """A keep-alive HTTP/1.1 connection: send a request, read one response; reopens when the server
    closes it (hypercorn ends a keep-alive connection after ``keep_alive_max_requests``)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.stream: trio.SocketStream | None = None
        self.buf = b""

    async def _fill(self) -> None:
        assert self.stream is not None
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream, self.buf = None, b""

    async def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        if self.stream is None:
            self.stream = await trio.open_tcp_stream(self.host, self.port)
        await self.stream.send_all(request)
        while b"\r\n\r\n" not in self.buf:
            await self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            while len(self.buf) < n:
                await self._fill()
            body, self.buf = self.buf[:n], self.buf[n:]
        else:
            body = await self._chunked()
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        return status, body

    async def _chunked(self) -> bytes:
        body = b""  # an SSE stream: read to the terminal chunk
        while True:
            while b"\r\n" not in self.buf:
                await self._fill()
            size_line, _, self.buf = self.buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(self.buf) < size + 2:
                await self._fill()
            body += self.buf[:size]
            self.buf = self.buf[size + 2 :]
            if size == 0:
                return body


@dataclass
class Load:
    """What one load run measured."""

    calls: int
    seconds: float
    cpu_seconds: float

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def cpu_ms_per_call(self) -> float:
        return self.cpu_seconds * 1000 / self.calls


def median_cpu_ratio(loads: Sequence[Load], base: Sequence[Load]) -> float:
    """The median over rounds of each round's CPU per call against ``base``'s in the same round. A round whose
    base counted no CPU at all (a smoke round of a few calls, under one 10 ms tick of ``/proc``) has no ratio
    and is left out; NaN when no round has one."""
    ratios = [a.cpu_ms_per_call / b.cpu_ms_per_call for a, b in zip(loads, base, strict=True) if b.cpu_seconds > 0]
    return statistics.median(ratios) if ratios else math.nan


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command (``[0]`` is the state), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = proc_stat(pid)
    if fields is None:
        raise ProcessLookupError(f"no process {pid} to read the CPU of")
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its live children (the workers of ``mcpipe serve --workers``)."""
    total = cpu_seconds(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None and int(stat[1]) == pid:
            total += (int(stat[11]) + int(stat[12])) / TICK
    return total


def process_tree(roots: list[int]) -> list[int]:
    """The roots and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := proc_stat(int(entry))) is not None:
            children.setdefault(int(st[1]), []).append(int(entry))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def trees_cpu_seconds(roots: list[int]) -> float:
    """utime + stime of the trees' processes, and of their children that have exited (cutime + cstime)."""
    total = 0
    for pid in process_tree(roots):
        if (st := proc_stat(pid)) is not None:
            total += sum(int(x) for x in st[11:15])
    return total / TICK


async def run_load(
    url: str,
    pid: int,
    body: bytes,
    *,
    clients: int,
    calls: int,
    max_seconds: float = 30.0,
    check: bytes = b"",
    request: bytes | list[bytes] | None = None,
    cpu: Any = cpu_seconds,
) -> Load:
    """``clients`` connections each sending ``calls // clients`` requests back to back (bounded by
    ``max_seconds``); every answer must be 200 and contain ``check``. ``request`` replaces the 2026-07-28
    request built from ``body`` (a list: client ``i`` sends the ``i``-th, e.g. each on its own 2025-11-25
    session); ``cpu`` reads the server's CPU seconds (of ``pid``)."""
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    requests = request if isinstance(request, list) else [request or request_bytes(host, int(port), "/" + path, body)]
    per_client = max(1, calls // clients)
    done = 0

    async def client(n: int, request: bytes = requests[0]) -> None:
        nonlocal done
        conn = _Conn(host, int(port))
        try:
            for _ in range(n):
                status, answer = await conn.roundtrip(request)
                if status != 200 or check not in answer:
                    raise AssertionError(f"bad answer {status}: {answer[:300]!r}")
                done += 1
        finally:
            await conn.close()

    await client(WARMUP)  # imports, caches, first-call paths
    done = 0
    cpu0, t0 = cpu(pid), time.perf_counter()
    with trio.move_on_after(max_seconds):
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(client, per_client, requests[i % len(requests)])
    elapsed = time.perf_counter() - t0
    return Load(done, elapsed, cpu(pid) - cpu0)


@dataclass
class Blast(Load):
    """What one :func:`blast` measured: the server's figures and the load generator's own CPU."""

    client_cpu_seconds: float

    @property
    def client_cpu_ms_per_call(self) -> float:
        return self.client_cpu_seconds * 1000 / self.calls


class _Raw:
    """One keep-alive connection of :func:`blast`: a non-blocking socket and what it has read."""

    __slots__ = ("buf", "left", "sock")

    def __init__(self, addr: tuple[str, int], left: int) -> None:
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buf = b""
        self.left = left


def _answer(buf: bytes) -> tuple[int, bytes, bool, int] | None:
    """The first complete response in ``buf``: (status, body, server closes, bytes used), or None yet."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].lower()
    status = int(head[9:12])
    closes = b"\r\nconnection: close" in head
    at = head.find(b"\r\ncontent-length:")
    if at >= 0:
        stop = head.find(b"\r\n", at + 2)
        size = int(head[at + 17 : stop if stop >= 0 else len(head)])
        if len(buf) < end + 4 + size:
            return None
        return status, buf[end + 4 : end + 4 + size], closes, end + 4 + size
    # chunked (an SSE answer): complete once the terminal chunk is in
    last = buf.find(b"\r\n0\r\n\r\n", end)
    if last < 0:
        return None
    return status, buf[end + 4 : last], closes, last + 7


def blast(
    url: str, body: bytes, *, clients: int, calls: int, check: bytes, max_seconds: float = 30.0
) -> tuple[int, float, float]:
    """A cheap load: ``clients`` keep-alive connections, each one request in flight (``calls // clients``
    each), driven from one thread by ``epoll`` on non-blocking sockets: a send and a receive per call, no
    event loop, so the load generator takes a small share of the CPU the servers compete for. Every answer
    must be 200 and contain ``check``. Answers (calls done, seconds, this thread's CPU seconds)."""
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    addr = (host, int(port))
    request = request_bytes(host, int(port), "/" + path, body)
    per_client = max(1, calls // clients)
    poll = select.epoll()
    conns: dict[int, _Raw] = {}

    def connect(left: int) -> None:
        conn = _Raw(addr, left)
        conns[conn.sock.fileno()] = conn
        poll.register(conn.sock.fileno(), select.EPOLLIN)
        conn.sock.send(request)

    done = 0
    cpu0, t0 = time.thread_time(), time.perf_counter()
    deadline = t0 + max_seconds
    try:
        for _ in range(clients):
            connect(per_client)
        while conns and time.perf_counter() < deadline:
            for fd, _ in poll.poll(1.0):
                conn = conns[fd]
                try:
                    chunk = conn.sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:  # closed under a request: its answer never came, so send it again
                    poll.unregister(fd)
                    del conns[fd]
                    conn.sock.close()
                    connect(conn.left)
                    continue
                conn.buf += chunk
                while (got := _answer(conn.buf)) is not None:
                    status, answer, closes, used = got
                    conn.buf = conn.buf[used:]
                    if status != 200 or check not in answer:
                        raise AssertionError(f"bad answer {status}: {answer[:300]!r}")
                    done += 1
                    conn.left -= 1
                    if closes or not conn.left:
                        poll.unregister(fd)
                        del conns[fd]
                        conn.sock.close()
                        if conn.left:
                            connect(conn.left)
                        break
                    conn.sock.send(request)
        return done, time.perf_counter() - t0, time.thread_time() - cpu0
    finally:
        for conn in conns.values():
            conn.sock.close()
        poll.close()


async def run_blast(
    url: str, pid: int, body: bytes, *, clients: int, calls: int, check: bytes, cpu: Any = cpu_seconds
) -> Blast:
    """:func:`blast` in a thread (the trio loop stays free, e.g. to drain the servers' logs), with the
    server's CPU seconds (``cpu`` of ``pid``) over it."""
    cpu0 = cpu(pid)
    done, seconds, client = await trio.to_thread.run_sync(
        partial(blast, url, body, clients=clients, calls=calls, check=check)
    )
    return Blast(done, seconds, cpu(pid) - cpu0, client)


@asynccontextmanager
async def server_process(kind: str, *extra: str) -> AsyncIterator[tuple[str, int]]:
    """Start ``python server_load.py <kind>``; yields (MCP URL, pid); kills it on exit."""
    async with url_server([str(HERE / "server_load.py"), kind, *extra], f"{kind} server") as served:
        yield served


@asynccontextmanager
async def url_server(
    argv: list[str], what: str, stderr: int | None = subprocess.DEVNULL
) -> AsyncIterator[tuple[str, int]]:
    """Run ``python *argv``, a server that prints its URL on the first line of stdout; yields (URL, pid) and
    kills it on exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = await trio.lowlevel.open_process(
        [sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
    )
    try:
        buf = b""
        assert proc.stdout is not None
        with trio.fail_after(30):
            while b"\n" not in buf:
                chunk = await proc.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"the {what} exited before listening")
                buf += chunk
        yield buf.split(b"\n")[0].decode().strip(), proc.pid
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()


# --- the servers (run in their own process) -------------------------------------------------------


def _hypercorn_config() -> Any:
    from hypercorn.config import Config

    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    cfg.errorlog = None
    return cfg


async def _serve_sdk() -> None:
    """The same tool on the SDK's MCPServer app, on hypercorn's trio worker."""
    from hypercorn.trio import serve
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("bench")
    app.tool()(ping.fn)
    app.tool()(inc.fn)
    asgi = app.streamable_http_app()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, asgi, _hypercorn_config()))
        print(binds[0] + "/mcp", flush=True)


def as_served() -> None:
    """What ``mcpipe serve`` does once its app is open (:func:`mcpipe.server._heap.settle`: the collector
    settled); nothing on a tree before it (an A/B's base)."""
    try:
        from mcpipe.server._heap import settle
    except ImportError:
        return
    settle()


async def _serve_mcpipe(audit_path: str, variant: str = "") -> None:
    """mcpipe serving the benchmark's tools. ``variant``: ``sdk-path`` (every request through the SDK, no
    lean paths), ``bare`` (no metrics, no traces), ``traced`` (metrics, and tracing live through the
    OpenTelemetry API with no SDK installed: non-recording spans, the caller's traceparent carried on),
    ``recorded`` (metrics, and SDK spans recorded into a provider with no exporter), ``console`` (the web
    console served, ``[console] enabled``); by default metrics are on and traces off, as ``mcpipe serve`` runs
    without telemetry config."""
    from mcpipe import telemetry
    from mcpipe.config import parse_config
    from mcpipe.server import open_app, serve_http

    doc: dict[str, Any] = {
        "python_tools": ["server_load:bench_tools"],
        "builtins": False,
        "audit": {"path": audit_path},
    }
    if variant == "bare":
        doc["telemetry"] = {"metrics": False}
    if variant == "jwt":  # callers present a JWT of an issuer whose keys are inline (no fetch to measure)
        doc["auth"] = {
            "oidc": [{"issuer": "https://idp.example.com", "audiences": ["bench"], "jwks": os.environ["BENCH_JWKS"]}]
        }
    if variant == "console":
        doc["console"] = {"enabled": True}
    config = parse_config(orjson.dumps(doc), "json")
    async with open_app(config) as app, trio.open_nursery() as nursery:
        as_served()
        known = telemetry.current().known  # type: ignore[union-attr]
        if variant == "traced":
            from opentelemetry import trace

            telemetry.install(telemetry.Telemetry(tracer=trace.get_tracer("mcpipe"), known=known))
        elif variant == "recorded":
            from opentelemetry.sdk.trace import TracerProvider

            telemetry.install(telemetry.Telemetry(tracer_provider=TracerProvider(), known=known))
        serve = partial(serve_http, app, host="127.0.0.1", port=0, fast_path=variant != "sdk-path")
        url = await nursery.start(serve)
        print(url, flush=True)


async def _serve_proxy(down_url: str, audit_path: str) -> None:
    """mcpipe in front of one downstream MCP server over streamable HTTP (``mcpServers.down``, prefix
    ``down``): the gateway of ``proxy_peer.py``."""
    from mcpipe.config import parse_config
    from mcpipe.server import open_app, serve_http

    doc: dict[str, Any] = {
        "builtins": False,
        "audit": {"path": audit_path},
        "mcpServers": {"down": {"url": down_url}},
    }
    config = parse_config(orjson.dumps(doc), "json")
    async with open_app(config) as app, trio.open_nursery() as nursery:
        as_served()
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0))
        print(url, flush=True)


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    match sys.argv[1]:
        case "sdk":
            trio.run(_serve_sdk)
        case "mcpipe":
            trio.run(_serve_mcpipe, sys.argv[2] if len(sys.argv) > 2 else os.devnull, *sys.argv[3:4])
        case "proxy":
            trio.run(_serve_proxy, sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else os.devnull)
        case other:
            raise SystemExit(f"unknown server kind {other!r}")
