#!/usr/bin/env python3
"""The proxy path side by side: mcpipe (and mcpg, when built) in front of one downstream MCP server over
streamable HTTP (``make bench-peer-mcpg``; outside CI).

The downstream is the SDK's ``MCPServer`` on hypercorn's trio worker (``server_load.py sdk``: ``ping`` and
``inc``). In front of it, each in its own process, on 127.0.0.1:

- **mcpipe**: ``open_app`` + ``serve_http`` (as ``mcpipe serve`` runs), the downstream under
  ``mcpServers.down`` (prefix ``down``), its audit file written as in production;
- **mcpipe at a base** (``--base PYTHON``, e.g. another checkout's ``.venv/bin/python``): the same server
  from that interpreter's mcpipe, for an A/B of a change in one run;
- **mcpg** (``.mcpg/bin/mcpg`` when it is there, built outside this repository; ``--mcpg PATH``): the same
  downstream as an ``mcp.federations`` upstream (tool prefix ``down.``). Absent, the part is skipped and said
  so. It runs with its working directory in the run's temporary folder: mcpg's built-in audit sink, on by
  default, writes ``./mcpg-audit.log`` there (as mcpipe writes its audit file there), never into the checkout.

Loads (each a raw 2026-07-28 ``tools/call`` POST on keep-alive connections): ``proxy``, ``down.ping`` through
the gateway; ``pipe``, an ``mcp_pipe`` of 5 chained ``down.inc`` steps (mcpipe only); ``direct``, ``ping``
on the downstream itself (the floor). The load generator is ``benches/loadgen`` (Rust, std only, built with
cargo on first use) or, with ``--python-load``, ``server_load.blast`` (one Python thread on epoll).

For ``--rounds`` rounds, interleaved (the order of the gateways rotates each round), each load runs
``--calls`` calls at ``--clients`` clients; a row records calls/s, the gateway's CPU per call and the
downstream's (utime+stime from ``/proc/<pid>/stat``: so "gateway CPU / downstream CPU" is measured on the
same calls), the gateway's RSS after the load and its peak (``VmHWM``), the load generator's CPU per call,
and the machine's load average over the round. The table (medians over rounds) is printed in Markdown;
``--json FILE`` keeps every round.

    python benches/proxy_peer.py [--rounds 5] [--calls 3000] [--clients 8] [--base PY] [--mcpg PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE)]

from server_load import blast, cpu_seconds, tools_call  # noqa: E402

LOADGEN_DIR = HERE / "loadgen"
LOADGEN = ROOT / "target" / "loadgen" / "release" / "mcpipe-loadgen"


def chain(n: int) -> dict[str, Any]:
    """An ``mcp_pipe`` of ``n`` ``down.inc`` steps, each taking the previous step's output."""
    steps: list[dict[str, Any]] = [{"id": "s1", "tool": "down.inc", "args": {"n": 0}}]
    steps += [
        {"id": f"s{i}", "tool": "down.inc", "args": {"n": f"${{steps.s{i - 1}.structured.n}}"}} for i in range(2, n + 1)
    ]
    return {"steps": steps, "return": f"${{steps.s{n}.structured.n}}"}


LOADS: dict[str, tuple[str, dict[str, Any], bytes]] = {
    "proxy": ("down.ping", {"text": "hi"}, b'"hi"'),
    "pipe": ("mcp_pipe", chain(5), b'"result":5'),
}


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident set in MB: ``VmRSS`` now, ``VmHWM`` its peak so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@contextmanager
def process(
    argv: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd
        )
    except OSError as e:  # (a --base interpreter that is not there)
        raise SystemExit(f"{Path(sys.argv[0]).name}: cannot start the {what} ({argv[0]}): {e.strerror}") from None
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def url_of(proc: subprocess.Popen[bytes], what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("http"):
        raise SystemExit(f"proxy_peer: the {what} exited before listening (exit {proc.poll()})")
    return line


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, what: str, seconds: float = 60) -> None:
    import socket

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"proxy_peer: the {what} did not listen on 127.0.0.1:{port} within {seconds:g} s")


MCPG_CONFIG = """\
gateway:
  server:
    bind_address: "127.0.0.1:{port}"
    mcp_path: "/mcp"
    allowed_origins: []
    anonymous_rate_limit_per_min: 0
    relax_request_id_uniqueness: true
cluster:
  kind: single_node
license:
  non_production_use: true
mcp:
  federations:
    - name: down
      upstream:
        transport: streamable_http
        upstream_safety: {{ allow_insecure_http: true, allow_private_backends: true }}
        url: "{url}"
      naming:
        tool_prefix: "down."
      governance:
        minimum_trust: unauthenticated
"""


@contextmanager
def mcpg_process(binary: str, tmp: Path, down_url: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """mcpg in front of ``down_url``: its config and its working directory (``tmp/mcpg``, where its audit sink
    writes ``mcpg-audit.log``) inside the run's temporary folder; yields (its MCP URL, the process)."""
    port = free_port()
    home = tmp / "mcpg"
    home.mkdir(exist_ok=True)
    cfg = home / "mcpg.yaml"
    cfg.write_text(MCPG_CONFIG.format(port=port, url=down_url))
    env = {**os.environ, "MCPG_CONFIG": str(cfg), "RUST_LOG": "error"}
    with process([str(Path(binary).resolve())], "mcpg", env, cwd=home) as proc:
        wait_listening(port, "mcpg gateway")
        yield f"http://127.0.0.1:{port}/mcp", proc


def mcpg_profile(binary: Path) -> str:
    """The cargo profile recorded beside ``binary`` (``.mcpg/BUILD.json``, by its build), else "unknown"."""
    try:
        report = json.loads((binary.parents[1] / "BUILD.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    return str(report.get("mcpg_profile", "dev"))


def loadgen() -> Path | None:
    """The Rust load generator, built with cargo once (its own crate, std only); None without cargo."""
    if LOADGEN.is_file() and LOADGEN.stat().st_mtime >= (LOADGEN_DIR / "src" / "main.rs").stat().st_mtime:
        return LOADGEN
    cargo = shutil.which("cargo")
    if cargo is None:
        return None
    subprocess.run(
        [cargo, "build", "--release", "-q", "--manifest-path", str(LOADGEN_DIR / "Cargo.toml")],
        check=True,
        env={**os.environ, "CARGO_TARGET_DIR": str(LOADGEN.parents[1])},
    )
    return LOADGEN


def load_once(
    gen: Path | None, url: str, body: bytes, clients: int, calls: int, check: bytes
) -> tuple[int, float, float]:
    """(calls done, seconds, the load generator's CPU seconds)."""
    if gen is None:
        return blast(url, body, clients=clients, calls=calls, check=check)
    out = subprocess.run(
        [str(gen), url, str(clients), str(calls), check.decode()], input=body, capture_output=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"proxy_peer: loadgen failed: {out.stderr.decode().strip()}")
    done, seconds, cpu = out.stdout.split()
    return int(done), float(seconds), float(cpu)


@dataclass
class Row:
    round: int
    gateway: str
    load: str
    calls: int
    calls_per_s: float
    gateway_cpu_ms: float
    downstream_cpu_ms: float
    gateway_rss_mb: float
    gateway_peak_rss_mb: float
    loadgen_cpu_ms: float
    loadavg: float

    @property
    def ratio(self) -> float:
        return self.gateway_cpu_ms / self.downstream_cpu_ms if self.downstream_cpu_ms else float("nan")


def measure(
    gen: Path | None, r: int, name: str, url: str, pid: int, down_pid: int, load: str, a: argparse.Namespace
) -> Row:
    tool, args, check = LOADS[load] if load != "direct" else ("ping", {"text": "hi"}, b'"hi"')
    body = tools_call(tool, args)
    load_once(gen, url, body, a.clients, 40, check)  # warm-up
    l0 = loadavg()
    g0, d0 = cpu_seconds(pid), cpu_seconds(down_pid)
    done, seconds, client = load_once(gen, url, body, a.clients, a.calls, check)
    g1, d1 = cpu_seconds(pid), cpu_seconds(down_pid)
    row = Row(
        r,
        name,
        load,
        done,
        done / seconds,
        (g1 - g0) * 1000 / done if pid != down_pid else 0.0,
        (d1 - d0) * 1000 / done,
        rss_mb(pid),
        rss_mb(pid, "VmHWM"),
        client * 1000 / done,
        (l0 + loadavg()) / 2,
    )
    print(
        f"  round {r} {name:8} {load:6} {row.calls_per_s:7.0f}/s gateway {row.gateway_cpu_ms:.3f} ms "
        f"downstream {row.downstream_cpu_ms:.3f} ms ratio {row.ratio:.2f} rss {row.gateway_rss_mb:.0f} MB "
        f"(peak {row.gateway_peak_rss_mb:.0f}) "
        f"load {row.loadavg:.1f}",
        flush=True,
    )
    return row


def mcpipe_argv(python: str, down: str, audit: str) -> list[str]:
    return [python, str(HERE / "server_load.py"), "proxy", down, audit]


def table(rows: list[Row]) -> str:
    out = [
        "| gateway | load | calls/s | gateway CPU ms/call | downstream CPU ms/call | gateway / downstream CPU "
        "| gateway RSS MB | gateway peak RSS MB | load generator CPU ms/call | load average |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r.gateway, r.load) for r in rows}, key=lambda k: (k[1], k[0]))
    for gw, ld in keys:
        rs = [r for r in rows if (r.gateway, r.load) == (gw, ld)]
        med = statistics.median
        out.append(
            f"| {gw} | {ld} | {med(r.calls_per_s for r in rs):.0f} | {med(r.gateway_cpu_ms for r in rs):.3f} "
            f"| {med(r.downstream_cpu_ms for r in rs):.3f} | {med(r.ratio for r in rs):.2f} "
            f"| {max(r.gateway_rss_mb for r in rs):.0f} | {max(r.gateway_peak_rss_mb for r in rs):.0f} "
            f"| {med(r.loadgen_cpu_ms for r in rs):.3f} "
            f"| {min(r.loadavg for r in rs):.1f}-{max(r.loadavg for r in rs):.1f} |"
        )
    return "\n".join(out)


def ratios(rows: list[Row], a: str, b: str, load: str) -> str:
    """Per round: a's gateway CPU over b's, and its median."""
    per = []
    for r in sorted({x.round for x in rows}):
        ra = [x for x in rows if x.round == r and x.gateway == a and x.load == load]
        rb = [x for x in rows if x.round == r and x.gateway == b and x.load == load]
        if ra and rb:
            per.append(ra[0].gateway_cpu_ms / rb[0].gateway_cpu_ms)
    if not per:
        return ""
    each = ", ".join(f"{p:.2f}" for p in per)
    return f"{a} / {b} gateway CPU on {load}: median {statistics.median(per):.2f} (rounds {each})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--base", help="another interpreter whose mcpipe serves as the base of an A/B")
    p.add_argument("--mcpg", default=str(ROOT / ".mcpg" / "bin" / "mcpg"))
    p.add_argument("--loads", default="proxy,pipe,direct")
    p.add_argument("--python-load", action="store_true", help="server_load.blast instead of the Rust loadgen")
    p.add_argument("--json")
    a = p.parse_args()
    loads = [x for x in a.loads.split(",") if x]
    bad = [x for x in loads if x not in (*LOADS, "direct")]
    if bad:
        raise SystemExit(f"proxy_peer: unknown load {bad[0]!r} (proxy, pipe, direct)")
    gen = None if a.python_load else loadgen()
    print(f"load generator: {gen or 'server_load.blast (Python, epoll)'}", flush=True)
    rows: list[Row] = []
    # The folder outlives the processes (the stack ends them first): mcpg writes into it until it is killed.
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        down = stack.enter_context(process([sys.executable, str(HERE / "server_load.py"), "sdk"], "downstream", env))
        down_url = url_of(down, "downstream SDK server")
        gateways: dict[str, tuple[str, int]] = {}
        mc = stack.enter_context(process(mcpipe_argv(sys.executable, down_url, f"{tmp}/audit.jsonl"), "mcpipe", env))
        gateways["mcpipe"] = (url_of(mc, "mcpipe gateway"), mc.pid)
        if a.base:
            base = stack.enter_context(process(mcpipe_argv(a.base, down_url, f"{tmp}/audit-base.jsonl"), "base", env))
            gateways["base"] = (url_of(base, "base mcpipe gateway"), base.pid)
        if Path(a.mcpg).is_file():
            mcpg_url, mg = stack.enter_context(mcpg_process(a.mcpg, Path(tmp), down_url))
            gateways["mcpg"] = (mcpg_url, mg.pid)
            print(f"mcpg: {a.mcpg} ({mcpg_profile(Path(a.mcpg))} build)", flush=True)
        else:
            print(f"mcpg: not there ({a.mcpg}; built outside this repository): its rows are left out", flush=True)
        names = list(gateways)
        for r in range(a.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for load in loads:
                if load == "direct":
                    rows.append(measure(gen, r, "none", down_url, down.pid, down.pid, "direct", a))
                    continue
                for name in order:
                    if load == "pipe" and name == "mcpg":
                        continue
                    url, pid = gateways[name]
                    rows.append(measure(gen, r, name, url, pid, down.pid, load, a))
    print()
    print(table(rows))
    for other in ("mcpg", "base"):
        for load in loads:
            line = ratios(rows, "mcpipe", other, load)
            if line:
                print(line)
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
