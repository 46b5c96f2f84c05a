"""A real ``mcpipe serve`` process under attack (issue 20): started on a free port of 127.0.0.1 with a config
file, its ``/healthz`` probed while an attack runs, its RSS read from ``/proc``.

The server is a process of its own, so a frozen event loop shows as a slow ``/healthz`` (an app served in the
test's own process would freeze the test with it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import httpx2
import trio

from kit.hostile import call, headers, result_of

TESTS = Path(__file__).parent.parent

STALL_S = 3.0
"""The floor of :attr:`Served.stall_s`: a probe held longer shows a frozen event loop, not a busy host."""

QUIET_PROBES = 3
"""How many ``/healthz`` probes :meth:`Served.probed` makes before an attack to measure the host."""


@dataclass
class Served:
    """A running server: its MCP URL, its process, and its log so far."""

    url: str
    proc: trio.Process
    log: Any
    health: list[float] = field(default_factory=list)
    quiet: list[float] = field(default_factory=list)
    """``/healthz`` latencies measured before an attack (by :meth:`probed`): this host's speed right now."""

    @property
    def base(self) -> str:
        return self.url.rsplit("/", 1)[0]

    def rss_mb(self) -> float:
        """The server's resident memory now, in MB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def text(self) -> str:
        """What the server has logged."""
        self.log.seek(0)
        return str(self.log.read().decode(errors="replace"))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    async def post(self, body: Any, name: str, http: httpx2.AsyncClient | None = None) -> Any:
        """A ``tools/call`` (``body`` a JSON-RPC message, or bytes); the JSON-RPC answer. ``http``: a client to
        share (many calls at once: a client each costs the test's own event loop its TLS setup, which a
        ``/healthz`` probed from the test then waits for)."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        if http is None:
            async with httpx2.AsyncClient(timeout=120) as own:
                r = await own.post(self.url, content=content, headers=headers(name))
        else:
            r = await http.post(self.url, content=content, headers=headers(name))
        assert r.status_code == 200, (r.status_code, r.text[:500])
        return result_of(r.text, r.headers.get("content-type", ""))

    async def call(self, name: str, arguments: Any, http: httpx2.AsyncClient | None = None) -> Any:
        """Call a tool; the JSON-RPC result."""
        return (await self.post(call(name, arguments), name, http))["result"]

    async def healthz(self) -> float:
        """Seconds ``/healthz`` took to answer (10 when it did not within 10 s)."""
        t0 = perf_counter()
        async with httpx2.AsyncClient(timeout=10) as http:
            try:
                r = await http.get(self.base + "/healthz")
            except httpx2.TimeoutException:
                return 10.0
        assert r.status_code == 200
        return perf_counter() - t0

    @property
    def stall_s(self) -> float:
        """The slowest ``/healthz`` that still shows a responsive event loop, in seconds: what a test compares
        :meth:`probed`'s slowest probe with. The bugs it guards against froze the loop for the attack's whole
        work (4 s to over a minute); a healthy loop answers in milliseconds, but a 2-core host shared with other
        jobs now and then holds a probe a second or more. So the bound is ``STALL_S``, or ten times the slowest
        quiet probe measured on this host just before the attack when that is more (a loaded host)."""
        return max(STALL_S, 10 * max(self.quiet, default=0.0))

    async def probed(self, attack: Callable[[], Awaitable[Any]], every: float = 0.1) -> tuple[Any, float]:
        """Run ``attack`` while ``/healthz`` is asked every ``every`` seconds; answers its value and the
        slowest ``/healthz`` seen (at least one probe is made while the attack runs, and the one in flight when
        it ends is waited for). Before the attack, a few quiet probes measure the host (``quiet``,
        :attr:`stall_s`)."""
        for _ in range(QUIET_PROBES):
            self.quiet.append(await self.healthz())
        done = trio.Event()
        slowest = 0.0
        probes = 0

        async def probe() -> None:
            nonlocal slowest, probes
            while not done.is_set() or probes == 0:
                took = await self.healthz()
                self.health.append(took)
                slowest = max(slowest, took)
                probes += 1
                with trio.move_on_after(every):
                    await done.wait()

        value: Any = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            try:
                value = await attack()
            finally:
                done.set()
        return value, slowest


def write_config(directory: Path, text: str, suffix: str = ".yaml") -> Path:
    path = directory / f"mcpipe{suffix}"
    path.write_text(text)
    return path


@asynccontextmanager
async def served(
    config: Path | None = None,
    *,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    limit_as_mb: int | None = None,
) -> AsyncIterator[Served]:
    """``mcpipe serve`` with ``config`` on a free port of 127.0.0.1 (the test tools importable); killed on exit.

    Args:
        limit_as_mb: an address-space limit of the server process (``RLIMIT_AS``), as the issue's
            attacks were run under.
    """
    command = [sys.executable, "-m", "mcpipe", "serve", "--http", "127.0.0.1:0", "--log-level", "info"]
    if config is not None:
        command += ["--config", str(config)]
    command += args or []
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), environ.get("PYTHONPATH", "")])
    if limit_as_mb is not None:
        # prlimit applies the limit to the server only (a preexec_fn would run in the test's process).
        command = ["prlimit", f"--as={limit_as_mb * 1024 * 1024}", "--", *command]
    with tempfile.TemporaryFile() as log:
        proc = await trio.lowlevel.open_process(command, stdin=None, stdout=log, stderr=log, env=environ)
        try:
            # Ready, and past the import of what calls use (the server does it beside its first calls, which
            # would otherwise wait on it; an attack's /healthz probes measure the attack, not that import).
            marker, warmed = "serving MCP at ", "loaded the call path in "
            with trio.fail_after(60):
                while True:
                    log.seek(0)
                    text = log.read().decode(errors="replace")
                    if marker in text and warmed in text:
                        url = text.split(marker, 1)[1].split()[0]
                        break
                    if proc.poll() is not None:
                        raise RuntimeError(f"the server exited: {text}")
                    await trio.sleep(0.05)
            yield Served(url, proc, log)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
                with trio.move_on_after(10):
                    await proc.wait()
