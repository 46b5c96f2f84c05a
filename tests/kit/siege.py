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


@dataclass
class Probe:
    """``GET /healthz`` every ``every_s`` while an attack runs: each answer's status and latency."""

    url: str
    every_s: float = 0.25
    seen: list[tuple[int, float]] = field(default_factory=list)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            task_status.started()
            while True:
                t0 = trio.current_time()
                try:
                    r = await http.get(base_of(self.url) + "/healthz")
                    status = r.status_code
                except httpx2.HTTPError:
                    status = 0
                self.seen.append((status, trio.current_time() - t0))
                await trio.sleep(self.every_s)

    def check(self, within_s: float = 1.0) -> None:
        """Every probe answered 200 within ``within_s``."""
        assert self.seen, "the probe never ran"
        slow = [(s, round(t, 2)) for s, t in self.seen if s != 200 or t > within_s]
        assert not slow, f"/healthz answered late or not at all: {slow} of {len(self.seen)}"


@asynccontextmanager
async def probing(url: str, every_s: float = 0.25) -> AsyncIterator[Probe]:
    """A :class:`Probe` running for the block; checked (every answer 200 within 1 s) at its end."""
    probe = Probe(url, every_s)
    async with trio.open_nursery() as nursery:
        await nursery.start(probe.run)
        yield probe
        nursery.cancel_scope.cancel()
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
