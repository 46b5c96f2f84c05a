"""Helpers of the sieges of a real server (``tests/hostile``, issue 20, items 4-13): a ``/healthz`` probe beside
an attack, a ``mcpipe serve`` process (its RSS read from ``/proc``), raw JSON-RPC posts."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import orjson
import trio

V = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"


def base_of(url: str) -> str:
    """``http://127.0.0.1:PORT`` of an MCP URL."""
    return url.rsplit("/", 1)[0]


STALL_S = 3.0
"""The floor of :meth:`Probe.stall_s`: a probe held longer shows a frozen event loop, not a busy host."""

QUIET_PROBES = 3
"""How many ``/healthz`` probes :func:`probing` makes before its block to measure the host."""


@dataclass
class Probe:
    """``GET /healthz`` every ``every_s`` while an attack runs: each answer's status and latency; ``quiet``: the
    latencies of a few probes made before it (this host's speed right now)."""

    url: str
    every_s: float = 0.25
    seen: list[tuple[int, float]] = field(default_factory=list)
    quiet: list[float] = field(default_factory=list)

    async def _get(self, http: httpx2.AsyncClient) -> tuple[int, float]:
        t0 = trio.current_time()
        try:
            try:
                r = await http.get(base_of(self.url) + "/healthz")
            except httpx2.RemoteProtocolError:
                # The keep-alive race: the server closed the resting connection (a flood past its descriptor
                # limit evicts resting ones) as this request went out on it. A client sends an idempotent GET
                # again on a new connection, once; the time counted is both tries'.
                r = await http.get(base_of(self.url) + "/healthz")
            status = r.status_code
        except httpx2.HTTPError:
            status = 0
        return status, trio.current_time() - t0

    async def run(self, stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Measure ``quiet``, then probe until ``stop`` is set; the probe in flight then is waited for (a probe
        held by a frozen loop is counted, not cancelled) and at least one probe is made after ``started``."""
        async with httpx2.AsyncClient(timeout=10) as http:
            for _ in range(QUIET_PROBES):
                self.quiet.append((await self._get(http))[1])
            task_status.started()
            while not stop.is_set() or not self.seen:
                self.seen.append(await self._get(http))
                with trio.move_on_after(self.every_s):
                    await stop.wait()

    def stall_s(self) -> float:
        """The slowest ``/healthz`` that still shows a responsive event loop, in seconds. The bugs the sieges
        guard against froze the loop for the attack's whole work; a healthy loop answers in milliseconds, but a
        2-core host shared with other jobs now and then holds a probe a second or more. So the bound is
        ``STALL_S``, or ten times the slowest quiet probe when that is more (a loaded host)."""
        return max(STALL_S, 10 * max(self.quiet, default=0.0))

    def check(self) -> None:
        """Every probe answered 200, none held past :meth:`stall_s`."""
        assert self.seen, "the probe never ran"
        bound = self.stall_s()
        slow = [(s, round(t, 2)) for s, t in self.seen if s != 200 or t > bound]
        assert not slow, f"/healthz answered late (over {bound:.1f} s) or not at all: {slow} of {len(self.seen)}"


@asynccontextmanager
async def probing(url: str, every_s: float = 0.25) -> AsyncIterator[Probe]:
    """A :class:`Probe` running for the block (a few quiet probes first); checked (every answer 200, none held
    past :meth:`Probe.stall_s`) at its end."""
    probe = Probe(url, every_s)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(probe.run, stop)
        try:
            yield probe
        finally:
            stop.set()
    probe.check()


def rss_mb(pid: int) -> float:
    """The resident memory of process ``pid``, in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class Served:
    """A ``mcpipe serve`` process: its MCP URL and its log file."""

    proc: trio.Process
    url: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@asynccontextmanager
async def serve_process(
    config: str, workdir: Path, *, env: dict[str, str] | None = None, nofile: int | None = None
) -> AsyncIterator[Served]:
    """``mcpipe serve --config`` with ``config`` (TOML) on a free port of 127.0.0.1, its log in ``workdir``;
    ``nofile``: its descriptor limit. Stopped (SIGTERM, then SIGKILL) on exit."""
    path = workdir / "mcpipe.toml"
    path.write_text(config)
    log = workdir / "server.log"

    def limit() -> None:  # in the child, before exec
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "mcpipe", "serve", "--config", str(path), "--http", "127.0.0.1:0"],
            stdin=None,
            stdout=out,
            stderr=out,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
            preexec_fn=limit,
        )
    try:
        # Ready, and past the import of what calls use (done beside the first calls, which would wait on it).
        marker, warmed = "serving MCP at ", "loaded the call path in "
        with trio.fail_after(60):
            while marker not in (text := log.read_text(errors="replace")) or warmed not in text:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited: {text}")
                await trio.sleep(0.05)
        yield Served(proc, text.split(marker, 1)[1].split()[0], log)
    finally:
        if proc.returncode is None:
            proc.terminate()
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def headers(name: str, *, token: str | None = None, method: str = "tools/call") -> dict[str, str]:
    out = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": V,
        "mcp-method": method,
        "mcp-name": name,
    }
    if token is not None:
        out["authorization"] = f"Bearer {token}"
    return out


def capabilities(*, tasks: bool = False, elicitation: bool = False) -> dict[str, Any]:
    caps: dict[str, Any] = {}
    if tasks:
        caps["extensions"] = {TASKS: {}}
    if elicitation:
        caps["elicitation"] = {"form": {}}
    return caps


def call(name: str, arguments: Any, caps: dict[str, Any] | None = None, rid: int = 1) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": caps or {}}
    params = {"name": name, "arguments": arguments, "_meta": meta}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def task_request(method: str, task_id: str, caps: dict[str, Any], rid: int = 1, **extra: Any) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": caps}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {"taskId": task_id, "_meta": meta, **extra}}


def message_of(r: httpx2.Response) -> Any:
    """The JSON-RPC message of a response (the last ``data:`` line of an SSE stream)."""
    text = r.text
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        text = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")][-1]
    return orjson.loads(text) if text else None


async def rpc(
    http: httpx2.AsyncClient, url: str, message: dict[str, Any], name: str, *, token: str | None = None
) -> tuple[int, Any]:
    """POST one JSON-RPC message; the HTTP status and the message answered."""
    method = message["method"]
    r = await http.post(url, content=orjson.dumps(message), headers=headers(name, token=token, method=method))
    return r.status_code, message_of(r) if r.content else None
