#!/usr/bin/env python3
"""NoETL's own playbooks on the real NoETL 4.26.0 and on mcpipe, side by side (``make bench-peers``; outside CI).

Five golden playbooks (``tests/formats/noetl/golden/4.26.0``): python only (``hello_world``), http to a local
server (``http_retry_status_code``), postgres (``postgres_retry_connection``), a loop (``test_simple_loop``)
and a loop calling a sub-playbook with postgres (``playbook_composition``). Both sides run on this host:

- **NoETL**: the oracle kit's stack (``../shared/noetl-oracle``: its server and worker from PyPI, PostgreSQL
  and NATS on 127.0.0.1), each playbook registered once, then executed through its API (``POST
  /api/execute``) and polled (``GET /api/executions/ID/status``, every ``--poll`` seconds) until it is done;
- **mcpipe**: one server process (``open_app`` + ``serve_http``, as ``mcpipe serve`` runs) serving the same
  copies, its credentials a PostgreSQL of its own; each playbook is an MCP tool, called with raw 2026-07-28
  ``tools/call`` POSTs on keep-alive connections (``server_load.blast``: one thread, no SDK client).

Both use the kit's HTTP stand-in on 127.0.0.1:18080 (counted on neither side), its handler as it is but with a
listen backlog of 128 (:func:`widen_stack_stand_in`; the kit's 5 dropped SYNs at concurrency 16). First each
side runs each playbook once and its answer is compared with NoETL's golden as
``tests/formats/noetl/test_goldens.py`` compares it (a subset, per step). Then, for ``--rounds`` rounds,
interleaved (the order of the sides swaps each round), each playbook runs ``--runs`` times at concurrency 1 and
16 on each side; a run records the wall time to result per playbook, the throughput, the CPU seconds and peak
RSS of every process of the side (NoETL: server, worker, PostgreSQL, NATS, with their children; mcpipe: its
process and its PostgreSQL), the machine's load average (``/proc/loadavg``) and its idle share of CPU time
(``/proc/stat``: 0 when every core was busy, with this side or anything else) during the run. Before each
measurement both sides' processes are let go quiet (:func:`quiet`), so one side's leftover work does not run in
the other's measurement. The table is printed in Markdown (and ``--json FILE`` keeps the raw figures).

    python benches/noetl_peer.py [--rounds 3] [--runs 6] [--cases a,b] [--keep]
    python benches/noetl_peer.py --only mcpipe ...   # mcpipe's side alone (the stand-in started if not up)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests"), str(ROOT / "scripts")]

from noetl_oracle import _python312  # noqa: E402

from formats.noetl.normalize import comparable, stable, subset_diff  # noqa: E402
from server_load import as_served, blast, proc_stat, process_tree, tools_call, trees_cpu_seconds  # noqa: E402

GOLDEN = ROOT / "tests" / "formats" / "noetl" / "golden" / "4.26.0"
VERSION = "4.26.0"
CASES = [
    "hello_world",
    "http_retry_status_code",
    "postgres_retry_connection",
    "test_simple_loop",
    "playbook_composition",
]
CALLEES = {"playbook_composition": ["user_profile_scorer"]}
KNOWN = {
    "playbook_composition": "NoETL 4.26 records five loop entries for four users (tests/formats/noetl/test_goldens.py "
    "KNOWN): the figures are measured, the answers differ there",
}
LAST = {"playbook_composition"}
"""NoETL 4.26's worker stopped taking commands after runs of this case (its sub-playbook's `finalize_result`
failing with `KeyError: 'score_breakdown'`): it runs after every other case, in the last round only."""
PAGE = os.sysconf("SC_PAGE_SIZE")
CONCURRENCY = (1, 16)


# --- processes: CPU and memory of a tree ---


def rss_mb(roots: list[int]) -> float:
    total = 0
    for pid in process_tree(roots):
        if (st := proc_stat(pid)) is not None:
            total += int(st[21]) * PAGE
    return total / 2**20


class Sampler:
    """Peak RSS of the trees and the machine's 1-minute load average, sampled every 0.25 s in a thread."""

    def __init__(self, roots: list[int]) -> None:
        self.roots, self.peak, self.loads = roots, 0.0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.roots))
            self.loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
            self._stop.wait(0.25)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Run:
    side: str
    case: str
    concurrency: int
    runs: int
    seconds: float
    cpu_s: float
    peak_rss_mb: float
    load: float
    latencies: list[float] = field(default_factory=list)
    unfinished: int = 0
    """Runs not done within the timeout (not in ``runs``)."""
    idle: float = 0.0
    """The machine's idle share of its CPU time during the run (0: every core busy, with this side or others)."""

    @property
    def per_s(self) -> float:
        return self.runs / self.seconds

    @property
    def cpu_per_run(self) -> float:
        return self.cpu_s / max(1, self.runs)


# --- NoETL: the oracle kit's stack ---


def _http(method: str, url: str, body: Any = None) -> Any:
    data = orjson.dumps(body) if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return orjson.loads(r.read() or b"null")


class Noetl:
    def __init__(self, kit: Path, env: dict[str, str], poll: float) -> None:
        self.kit, self.env, self.poll = kit, env, poll
        self.timeout = 60.0
        self.unfinished = 0
        self.work = Path(env["NOETL_ORACLE_DIR"])
        stack = json.loads((self.work / f"stack-{VERSION}.json").read_text())
        self.base, self.pg_port = stack["url"], stack["pg_port"]
        self.registered: dict[str, dict[str, Any]] = {}

    def pids(self) -> list[int]:
        pids = []
        for name in (f"server-{VERSION}", f"worker-{VERSION}", f"nats-{VERSION}"):
            pids.append(int((self.work / "pids" / name).read_text().split()[0]))
        pids.append(int((self.work / "pg" / "data" / "postmaster.pid").read_text().split()[0]))
        return pids

    def prepare(self, cases: list[str]) -> None:
        for name in ("pg_local", "pg_k8s"):
            data = {"db_host": "127.0.0.1", "db_port": str(self.pg_port), "db_user": "demo", "db_password": "demo"}
            cred = {"name": name, "type": "postgres", "data": {**data, "db_name": "demo_noetl"}}
            _http("POST", f"{self.base}/api/credentials", cred)
        for case in cases:
            for callee in CALLEES.get(case, []):
                self.register(callee)
            reg = self.register(case)
            self.registered[case] = {"path": reg["path"], "version": reg["version"]}

    def register(self, name: str) -> Any:
        body = {"content": (GOLDEN / f"{name}.yaml").read_text(), "resource_type": "Playbook"}
        return _http("POST", f"{self.base}/api/catalog/register", body)

    def answer(self, case: str) -> dict[str, Any]:
        """One run through the kit's ``run.py --stable`` (its normalized answer, as the golden was recorded)."""
        python = self.env.get("NOETL_ORACLE_PYTHON") or _python312() or sys.executable
        proc = subprocess.run(
            [python, str(self.kit / "run.py"), str(GOLDEN / f"{case}.yaml"), "--version", VERSION, "--stable"],
            capture_output=True, text=True, env=self.env, timeout=120,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"run.py {case}: {proc.stderr.strip()[-300:]}")
        answer: dict[str, Any] = json.loads(proc.stdout)
        return answer

    def one(self, case: str) -> float | None:
        """One execution's wall time to its result (None: not done within ``--timeout`` seconds)."""
        t0 = time.perf_counter()
        ex = _http("POST", f"{self.base}/api/execute", self.registered[case])
        eid = ex["execution_id"]
        while True:
            time.sleep(self.poll)
            st = _http("GET", f"{self.base}/api/executions/{eid}/status")
            if st.get("completed") or st.get("failed"):
                if not st.get("completed"):
                    raise RuntimeError(f"NoETL: {case} execution {eid} failed: {str(st)[:300]}")
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > self.timeout:
                print(f"NoETL: {case} execution {eid} not done after {self.timeout:.0f} s", flush=True)
                return None

    def load(self, case: str, concurrency: int, runs: int) -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(lambda _: self.one(case), range(runs)))
        latencies = [x for x in answers if x is not None]
        self.unfinished += len(answers) - len(latencies)
        return time.perf_counter() - t0, latencies


# --- mcpipe: one server process and its PostgreSQL ---


async def _serve(config_path: str) -> None:
    """The mcpipe side's server process: ``open_app`` + ``serve_http``, as ``mcpipe serve`` runs them."""
    from functools import partial

    import trio

    from mcpipe.config import parse_config
    from mcpipe.server import open_app, serve_http

    path = trio.Path(config_path)
    config = parse_config(await path.read_text(), "json", base_dir=str(path.parent))
    async with open_app(config) as app, trio.open_nursery() as nursery:
        as_served()
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0))
        print(url, flush=True)


@contextmanager
def mcpipe_side(
    cases: list[str], python: dict[str, object] | None = None, workers: int = 1
) -> Iterator[tuple[str, list[int], dict[str, str]]]:
    """(MCP URL, [server pid, PostgreSQL pid], tool name of each case); ``python``: its ``outbound.python``;
    ``workers`` above 1: ``mcpipe serve --workers N`` (its supervisor's pid, whose tree holds the N server
    processes and their fork servers), as docs/deployment.md runs it on a host of that many cores."""
    from kit.realservers import postgres_server

    with postgres_server() as url, tempfile.TemporaryDirectory(prefix="noetl-peer-") as tmp:
        pg_port = int(url.rsplit(":", 1)[1].split("/")[0])
        pg_pid = postmaster_of(pg_port)
        paths, names = [], {}
        for case in cases:
            for name in [case, *CALLEES.get(case, [])]:
                shutil.copy(GOLDEN / f"{name}.yaml", Path(tmp) / f"{name}.yaml")
            paths.append(str(Path(tmp) / f"{case}.yaml"))
            names[case] = yaml.safe_load((GOLDEN / f"{case}.yaml").read_text())["metadata"]["name"]
        doc = {
            "outbound": {
                "http": {"allowed_hosts": ["127.0.0.1"]},
                "commands": {"sh": "/bin/sh"},
                "python": python or {},
            },
            "sql": {"pg_local": {"url": url}, "pg_k8s": {"url": url}},
            "playbooks": paths,
            "audit": {"path": str(Path(tmp) / "audit.jsonl")},
        }
        config = Path(tmp) / "mcpipe.json"
        config.write_text(json.dumps(doc))
        if workers > 1:
            from kit.realservers import free_port, wait_for_port

            port = free_port()
            argv = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", f"127.0.0.1:{port}"]
            proc = subprocess.Popen(
                [*argv, "--workers", str(workers), "--log-level", "warning"],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # (its group: the supervisor and its servers stopped together below)
            )
        else:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", str(config)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
            )
        try:
            if workers > 1:
                wait_for_port(port, proc, timeout=60)
                mcp_url = f"http://127.0.0.1:{port}/mcp"
            else:
                assert proc.stdout is not None
                mcp_url = proc.stdout.readline().decode().strip()
            if not mcp_url:
                raise RuntimeError("the mcpipe server exited before listening")
            yield mcp_url, [proc.pid, pg_pid], names
        finally:
            if workers > 1:
                os.killpg(proc.pid, signal.SIGTERM)  # the supervisor stops its servers, as on a shutdown
            else:
                proc.kill()
            proc.wait(30)


def postmaster_of(port: int) -> int:
    """The PostgreSQL server listening on ``port``: a ``postgres`` process whose data dir (its cwd) has a
    ``postmaster.pid`` naming it and the port."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "postgres":
                continue
            lines = (Path(os.readlink(f"/proc/{entry}/cwd")) / "postmaster.pid").read_text().splitlines()
        except (OSError, ValueError):
            continue
        if len(lines) > 3 and lines[0] == entry and lines[3] == str(port):
            return int(entry)
    raise RuntimeError(f"no PostgreSQL server found on port {port}")


def mcpipe_answer(url: str, tool: str) -> dict[str, Any]:
    body = tools_call(tool, {})
    req = urllib.request.Request(
        url, data=body, method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": tool},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    if raw.startswith(b"event:") or b"\ndata:" in raw or raw.startswith(b"data:"):
        raw = next(line[5:] for line in raw.splitlines() if line.startswith(b"data:"))
    answer = orjson.loads(raw)["result"]["structuredContent"]
    return {
        "status": answer.get("status"),
        "steps": answer.get("steps"),
        "failed_steps": sorted(answer.get("failed_steps") or []),
        "final": answer.get("final"),
    }


def mcpipe_load(url: str, tool: str, concurrency: int, runs: int) -> tuple[float, list[float]]:
    done, seconds, _ = blast(
        url, tools_call(tool, {}), clients=concurrency, calls=runs, check=b'"failed_steps":[]', max_seconds=120
    )
    if done != max(1, runs // concurrency) * concurrency:
        raise RuntimeError(f"mcpipe: {done} of {runs} runs of {tool} answered")
    # Each client runs its share one after the other: a run's wall time is its client's share of the time.
    return seconds, [seconds * concurrency / done] * done


# --- the comparison ---


def check(side: str, case: str, got: dict[str, Any]) -> str:
    want = comparable(json.loads((GOLDEN / f"{case}.json").read_text()))
    diff = subset_diff({k: want[k] for k in ("status", "steps", "failed_steps", "final")}, comparable(stable(got)))
    if not diff:
        return "equal"
    if case in KNOWN:
        return f"differs (known: {KNOWN[case]})"
    raise AssertionError(f"{side} {case} does not answer NoETL's golden:\n" + "\n".join(diff[:20]))


def _cpu_ticks() -> tuple[int, int]:
    """The machine's (idle, all) CPU ticks so far (``/proc/stat``)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def quiet(roots: list[int], max_seconds: float = 10.0) -> None:
    """Wait (at most ``max_seconds``) until the trees use under a twentieth of a core over 0.25 s: a side
    still finishing the last runs' work (NoETL's server writes its events after a status says done) does
    not take the cores from the next side's measurement."""
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        cpu0 = trees_cpu_seconds(roots)
        time.sleep(0.25)
        if trees_cpu_seconds(roots) - cpu0 < 0.0125:
            return


def measure(side: str, roots: list[int], case: str, c: int, runs: int, fn: Any) -> Run:
    cpu0, (idle0, all0) = trees_cpu_seconds(roots), _cpu_ticks()
    with Sampler(roots) as s:
        seconds, latencies = fn(case, c, runs)
    cpu, (idle1, all1) = trees_cpu_seconds(roots) - cpu0, _cpu_ticks()
    return Run(side, case, c, len(latencies), seconds, cpu, s.peak, max(s.loads, default=0.0),
               latencies, runs - len(latencies), (idle1 - idle0) / max(1, all1 - all0))  # fmt: skip


def table(results: list[Run], cases: list[str]) -> str:
    rows = [
        "| playbook | conc. | NoETL wall/run | mcpipe wall/run | NoETL runs/s | mcpipe runs/s | throughput x "
        "| NoETL CPU/run | mcpipe CPU/run | NoETL peak RSS | mcpipe peak RSS | load (1 min; machine idle) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for c in CONCURRENCY:
            n = [r for r in results if r.side == "noetl" and r.case == case and r.concurrency == c]
            m = [r for r in results if r.side == "mcpipe" and r.case == case and r.concurrency == c]
            if not n or not m:
                continue
            ratio = statistics.median(b.per_s / max(a.per_s, 1e-9) for a, b in zip(n, m, strict=False))
            lost = sum(r.unfinished for r in n)
            nwall = [x for r in n for x in r.latencies]
            rows.append(
                f"| `{case}` | {c} | {statistics.median(nwall) * 1000 if nwall else float('nan'):.0f} ms"
                f"{f' ({lost} of {lost + len(nwall)} not done in 60 s)' if lost else ''} "
                f"| {statistics.median(x for r in m for x in r.latencies) * 1000:.1f} ms "
                f"| {max(r.per_s for r in n):.2f} | {max(r.per_s for r in m):.1f} | **{ratio:.0f}x** "
                f"| {min(r.cpu_per_run for r in n) * 1000:.0f} ms | {min(r.cpu_per_run for r in m) * 1000:.1f} ms "
                f"| {max(r.peak_rss_mb for r in n):.0f} MB | {max(r.peak_rss_mb for r in m):.0f} MB "
                f"| {min(r.load for r in n + m):.1f}-{max(r.load for r in n + m):.1f} "
                f"(idle {min(r.idle for r in m):.0%}-{max(r.idle for r in m):.0%}) |"
            )
    return "\n".join(rows)


# The kit's stand-in as it is, but for its listen backlog: http.server's default of 5 overflows at 16 runs in
# flight (each request a connection of its own), and every SYN dropped costs a run 1 s (4 December).
WIDE_STAND_IN = (
    "import http.server, runpy, sys; http.server.ThreadingHTTPServer.request_queue_size = 128; "
    "path = sys.argv[1]; sys.argv = [path, *sys.argv[2:]]; runpy.run_path(path, run_name='__main__')"
)
STAND_IN_PORT = 18080


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start_stand_in(kit: Path, python: str, port: int) -> subprocess.Popen[bytes]:
    """The kit's ``httpd.py`` (the same handler, the same answers) with a backlog of 128, in its own session."""
    argv = [python, "-c", WIDE_STAND_IN, str(kit / "httpd.py"), str(port), "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while not _listening(port):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the HTTP stand-in did not listen on {port}")
        time.sleep(0.05)
    return proc


def widen_stack_stand_in(kit: Path, work: Path) -> None:
    """Replace the NoETL stack's stand-in by :func:`_start_stand_in`'s, run by the same interpreter (NoETL's
    venv), its pid written where ``stack.sh`` keeps the stand-in's, so ``stack.sh stop`` ends it as its own."""
    pidfile = work / "pids" / "httpd"
    try:
        os.killpg(int(pidfile.read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    deadline = time.monotonic() + 10
    while _listening(STAND_IN_PORT):
        if time.monotonic() > deadline:
            print("noetl_peer: the stack's stand-in did not stop; its backlog of 5 stays", file=sys.stderr)
            return
        time.sleep(0.05)
    python = work / f"venv-{VERSION}" / "bin" / "python"
    proc = _start_stand_in(kit, str(python if python.exists() else sys.executable), STAND_IN_PORT)
    pidfile.write_text(str(proc.pid))


@contextmanager
def stand_in(port: int = STAND_IN_PORT) -> Iterator[None]:
    """The kit's HTTP stand-in on ``port`` (with a backlog of 128), started here unless one already listens."""
    if _listening(port):
        yield
        return
    kit = Path(os.environ.get("NOETL_ORACLE_KIT", ROOT.parent / "shared" / "noetl-oracle")).resolve()
    proc = _start_stand_in(kit, sys.executable, port)
    try:
        yield
    finally:
        proc.kill()
        proc.wait(10)


def mcpipe_alone(cases: list[str], python: dict[str, object], rounds: int, runs: int, workers: int = 1) -> int:
    """``--only mcpipe``: mcpipe's side alone, its answers checked against the goldens first, then each case at
    concurrency 1 and 16 (``runs * 10`` and ``runs * 40`` runs, as beside NoETL) for ``rounds`` rounds."""
    with stand_in(), mcpipe_side(cases, python, workers) as (url, pids, names):
        for case in cases:
            print(f"{case}: mcpipe {check('mcpipe', case, mcpipe_answer(url, names[case]))}", flush=True)
        print(f"mcpipe server pid {pids[0]}", flush=True)
        for rnd in range(rounds):
            for case in cases:
                for c in CONCURRENCY:
                    n = max(c, runs if c == 1 else runs * 4) * 10
                    quiet(pids)
                    r = measure("mcpipe", pids, case, c, n, lambda case, c, n: mcpipe_load(url, names[case], c, n))
                    print(f"round {rnd + 1} mcpipe {case:26s} c={c:2d}: {r.per_s:8.2f} runs/s, "
                          f"wall {statistics.median(r.latencies) * 1000:6.1f} ms/run, "
                          f"CPU {r.cpu_per_run * 1000:7.1f} ms/run, RSS {r.peak_rss_mb:5.0f} MB, "
                          f"load {r.load:.1f}, idle {r.idle:.0%}", flush=True)  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=6, help="NoETL's runs of a playbook at concurrency 1 (x4 at 16)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--poll", type=float, default=0.05, help="seconds between NoETL status polls")
    ap.add_argument("--keep", action="store_true", help="leave the NoETL stack running")
    ap.add_argument("--no-start", action="store_true", help="the NoETL stack is already up")
    ap.add_argument("--json", help="write the raw figures here")
    ap.add_argument(
        "--only", choices=("mcpipe",), help="run mcpipe's side alone (no NoETL stack; its answers still checked)"
    )
    ap.add_argument("--python-reuse", choices=("step", "run"), default="step", help="mcpipe's outbound.python.reuse")
    ap.add_argument("--python-workers", type=int, default=4, help="mcpipe's outbound.python.workers")
    ap.add_argument("--python-prefork", type=int, default=2, help="mcpipe's outbound.python.prefork (spares kept)")
    ap.add_argument(
        "--mcpipe-workers", type=int, default=1, help="mcpipe serve --workers N (server processes; 1: one in-process)"
    )
    args = ap.parse_args()
    if args.serve:
        import trio

        trio.run(_serve, args.serve)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if not (GOLDEN / f"{c}.json").is_file()]
    if unknown:
        print(f"noetl_peer: no golden case {', '.join(unknown)} in {GOLDEN}", file=sys.stderr)
        return 2
    python = {"reuse": args.python_reuse, "workers": args.python_workers, "prefork": args.python_prefork}
    if args.only == "mcpipe":
        return mcpipe_alone(cases, python, args.rounds, args.runs, args.mcpipe_workers)
    kit = Path(os.environ.get("NOETL_ORACLE_KIT", ROOT.parent / "shared" / "noetl-oracle")).resolve()
    if not (kit / "run.py").exists():
        print(f"noetl_peer: no oracle kit at {kit} (set NOETL_ORACLE_KIT)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("NOETL_ORACLE_DIR", "/tmp/mcpipe-noetl-oracle")
    Path(env["NOETL_ORACLE_DIR"]).mkdir(parents=True, exist_ok=True)
    if not args.no_start:
        for step in (["setup.sh", VERSION], ["stack.sh", "start", VERSION]):
            done = subprocess.run([str(kit / step[0]), *step[1:]], env=env)
            if done.returncode:
                failed = f"noetl_peer: {' '.join(step)} failed (exit {done.returncode}; its message is above)"
                print(failed, file=sys.stderr)
                return 1
    widen_stack_stand_in(kit, Path(env["NOETL_ORACLE_DIR"]))
    results: list[Run] = []
    try:
        noetl = Noetl(kit, env, args.poll)
        noetl.prepare(cases)
        with mcpipe_side(cases, python, args.mcpipe_workers) as (url, mcpipe_pids, names):
            verdicts = {}
            for case in cases:
                verdicts[case] = (
                    check("NoETL", case, noetl.answer(case)),
                    check("mcpipe", case, mcpipe_answer(url, names[case])),
                )
                print(f"{case}: NoETL {verdicts[case][0]}; mcpipe {verdicts[case][1]}", flush=True)
            sides = {
                "noetl": (noetl.pids(), noetl.load),
                "mcpipe": (mcpipe_pids, lambda case, c, runs: mcpipe_load(url, names[case], c, runs)),
            }
            # A case that may leave NoETL unable to run more (LAST) runs after every other, in the last round only.
            for rnd in range(args.rounds):
                order = ["noetl", "mcpipe"] if rnd % 2 == 0 else ["mcpipe", "noetl"]
                last = rnd == args.rounds - 1
                for case in [c for c in cases if c not in LAST] + [c for c in cases if c in LAST and last]:
                    for c in CONCURRENCY:
                        runs = args.runs if c == 1 else args.runs * 4
                        if runs < c:
                            runs = c
                        for side in order:
                            pids, fn = sides[side]
                            # mcpipe answers in milliseconds: give it more runs, so its figures are not noise
                            n = runs if side == "noetl" else runs * 10
                            quiet(sides["noetl"][0] + sides["mcpipe"][0])
                            r = measure(side, pids, case, c, n, fn)
                            results.append(r)
                            print(f"round {rnd + 1} {side:6s} {case:26s} c={c:2d}: {r.per_s:8.2f} runs/s, "
                                  f"CPU {r.cpu_per_run * 1000:7.1f} ms/run, RSS {r.peak_rss_mb:5.0f} MB, "
                                  f"load {r.load:.1f}, idle {r.idle:.0%}", flush=True)  # fmt: skip
        print()
        print(table(results, cases))
        if args.json:
            Path(args.json).write_text(json.dumps([r.__dict__ | {"per_s": r.per_s} for r in results], indent=1))
    finally:
        if not args.keep and not args.no_start:
            subprocess.run([str(kit / "stack.sh"), "stop", VERSION], env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
