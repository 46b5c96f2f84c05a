"""A bounded soak: mixed pipelines from many clients against a real ``mcpipe serve`` over HTTP.

``make soak`` runs it for a few minutes (``python tests/hostile/soak.py --seconds 180``); the normal
suite runs a short form (``test_soak.py``). It reports the latency percentiles and the server's RSS, and
judges memory flat when the RSS of the last quarter of the run is within a margin of the RSS after the
first quarter (warm-up: caches, pools and allocator arenas fill up then).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson
import trio

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": V,
    "mcp-method": "tools/call",
}

CHAIN = {"steps": [{"tool": "echo", "args": {"n": i}} for i in range(5)], "return": "${last.output}"}
PARALLEL = {"steps": [{"parallel": [{"tool": "echo", "args": {"i": i}} for i in range(8)]}]}
NESTED = {
    "vars": {"w": "x"},
    "steps": [{"pipe": {"vars": {"v": "${vars.w}"}, "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}]}}],
}
TEXT = {
    "steps": [
        {"tool": "text_join", "args": {"items": ["a", "b", "c"], "sep": "-"}},
        {"tool": "text_split", "args": {"text": "${last.structured.text}", "sep": "-"}},
    ]
}
MIX: list[tuple[str, str, dict[str, Any]]] = [
    # (label, tool, arguments)
    ("chain", "mcp_pipe", CHAIN),
    ("parallel", "mcp_pipe", PARALLEL),
    ("nested", "mcp_pipe", NESTED),
    ("text", "mcp_pipe", TEXT),
    ("invalid", "mcp_pipe", {"steps": [{"tool": "echo", "args": {"x": "${steps.nope.output}"}}]}),
    ("failing", "mcp_pipe", {"steps": [{"tool": "json_parse", "args": {"text": "{"}}, {"tool": "echo"}]}),
    ("too many steps", "mcp_pipe", {"steps": [{"tool": "echo"}] * 200}),
    ("too deep", "echo", {"v": {"a": {"a": {"a": {"a": {"a": {}}}}}}}),
    ("payload", "echo", {"blob": "y" * 50_000}),
    ("direct", "echo", {"hello": "world"}),
]


@dataclass
class Report:
    seconds: float
    clients: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MB)

    def percentile(self, p: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(p / 100 * len(data)))] * 1000 if data else float("nan")

    def rss_after(self, fraction: float) -> float:
        """The largest RSS seen in the first ``fraction`` of the run (the warm-up's high-water mark); the
        first sample when a loaded machine took none that early."""
        cut = self.seconds * fraction
        return max((mb for t, mb in self.rss_mb if t <= cut), default=self.rss_mb[0][1])

    def rss_tail(self, fraction: float) -> float:
        """The median RSS of the last ``fraction`` of the run."""
        cut = self.seconds * (1 - fraction)
        tail = sorted(mb for t, mb in self.rss_mb if t >= cut)
        return tail[len(tail) // 2] if tail else float("nan")

    def flat(self, margin_mb: float = 25.0, margin_ratio: float = 0.15) -> bool:
        warm = self.rss_after(0.25)
        return self.rss_tail(0.25) <= warm + max(margin_mb, warm * margin_ratio)

    def summary(self) -> str:
        n = len(self.latencies)
        return (
            f"{n} requests from {self.clients} clients in {self.seconds:.0f} s ({n / self.seconds:.0f}/s), "
            f"{self.errors} transport errors; "
            f"latency p50 {self.percentile(50):.1f} ms, p99 {self.percentile(99):.1f} ms; "
            f"server RSS {self.rss_mb[0][1]:.0f} MB at start, {self.rss_after(0.25):.0f} MB after warm-up, "
            f"{self.rss_tail(0.25):.0f} MB at the end (peak {max(mb for _, mb in self.rss_mb):.0f} MB)"
        )


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def start_server(log: Any) -> tuple[trio.Process, str]:
    """``mcpipe serve`` on a free port of 127.0.0.1; its URL once it listens."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "mcpipe", "serve", "--http", "127.0.0.1:0", "--log-level", "info"],
        stdin=None,
        stdout=log,
        stderr=log,
    )
    marker = "serving MCP at "
    with trio.fail_after(60):
        while True:
            log.seek(0)
            text = log.read().decode(errors="replace")
            if marker in text:
                return proc, text.split(marker, 1)[1].split()[0]
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {text}")
            await trio.sleep(0.05)


async def soak(seconds: float, clients: int = 100, seed: int = 9) -> Report:
    report = Report(seconds, clients)
    rng = random.Random(seed)
    with tempfile.TemporaryFile() as log:
        proc, url = await start_server(log)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        try:

            async def client(k: int) -> None:
                local = random.Random(rng.random())
                async with httpx2.AsyncClient(timeout=30) as http:
                    rid = 0
                    while time.perf_counter() < deadline:
                        _, tool, arguments = local.choice(MIX)
                        rid += 1
                        body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call"}
                        body["params"] = {"name": tool, "arguments": arguments, "_meta": META}
                        start = time.perf_counter()
                        try:
                            hdrs = {**HEADERS, "mcp-name": tool}
                            r = await http.post(url, content=orjson.dumps(body), headers=hdrs)
                            ok = r.status_code == 200 and b'"result"' in r.content
                        except httpx2.HTTPError:
                            ok = False
                        report.latencies.append(time.perf_counter() - start)
                        if not ok:
                            report.errors += 1

            async def sample() -> None:
                while time.perf_counter() < deadline:
                    report.rss_mb.append((time.perf_counter() - t0, rss_mb(proc.pid)))
                    await trio.sleep(0.5)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                for k in range(clients):
                    nursery.start_soon(client, k)
        finally:
            proc.terminate()
            with trio.move_on_after(10):
                await proc.wait()
            if proc.poll() is None:
                proc.kill()
                await proc.wait()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("MCPIPE_SOAK_S", "180")))
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args()
    report = trio.run(soak, args.seconds, args.clients)
    print(report.summary())
    if report.errors or not report.flat():
        print("FAILED: " + ("transport errors" if report.errors else "memory grew"))
        sys.exit(1)


if __name__ == "__main__":
    main()
