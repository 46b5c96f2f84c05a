"""Start-up: what a command costs before its own work, each as a fresh process (issue 32, item 4).

Each row starts a new interpreter, as a shell does: ``python -c pass`` (the floor), ``import mcpipe.cli``,
``mcpipe --version``, ``check`` and ``run`` of a one-step spec, ``playbook run`` of NoETL's ``hello_world``
(its run itself takes a few milliseconds), and ``mcpipe serve`` until ``GET /healthz`` answers, beside the floor of
any server on its stack (``import`` of Trio, hypercorn and the MCP SDK's server, nothing of mcpipe). Wall time is
what pytest-benchmark records; each round also records the child's CPU time (user + system, from
``os.wait4``), which the machine's load does not inflate, and the table at the end prints both (medians)
with the load average. Then the ``-X importtime`` top list of each command: the modules costing it most,
cumulative, so a regression names its culprit.

    pytest benches/test_startup.py --benchmark-enable --benchmark-only -s

Under the default ``--benchmark-disable`` each runs once, as a smoke test. Figures: docs/performance.md,
"Start-up".

The children write and read their bytecode in a directory of the run's own (``PYTHONPYCACHEPREFIX``), as an
installed package has its ``.pyc`` files: with ``PYTHONDONTWRITEBYTECODE`` set (as on the shared VM) and an
editable install, every start would compile mcpipe's sources again, which no user pays. The warm-up round
writes them.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "tests" / "formats" / "noetl" / "golden" / "4.26.0" / "hello_world.yaml"
SPEC = '{"steps": [{"id": "a", "tool": "echo", "args": {"text": "hi"}}], "return": "${steps.a.structured.text}"}'
MCPIPE = [sys.executable, "-m", "mcpipe"]
SERVE_WAIT_S = 60.0
TOP = 8

SERVER_STACK = (
    "import trio, hypercorn.trio.tcp_server, hypercorn.protocol, mcp.server.lowlevel, "
    "mcp.server.streamable_http_manager"
)
"""What any server on mcpipe's stack imports before it can answer: the floor of ``mcpipe serve``'s row."""

CPU: dict[str, list[float]] = {}
WALL: dict[str, list[float]] = {}
ENV: dict[str, str] = {}
"""The children's environment: bytecode cached in the run's own directory (set by the ``spec`` fixture)."""


def _commands(spec: Path) -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import mcpipe.cli": [sys.executable, "-c", "import mcpipe.cli"],
        "mcpipe --version": [*MCPIPE, "--version"],
        "mcpipe check": [*MCPIPE, "check", str(spec)],
        "mcpipe run": [*MCPIPE, "run", str(spec)],
        "mcpipe playbook run": [*MCPIPE, "playbook", "run", str(HELLO)],
        "import the server stack": [sys.executable, "-c", SERVER_STACK],
    }


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The one-step spec; after the module's rows, the table and the import-time top lists are printed."""
    path = tmp_path_factory.mktemp("startup") / "spec.json"
    path.write_text(SPEC)
    ENV.clear()
    ENV.update({k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    ENV["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    yield path
    if CPU:
        _print_figures(path)


def _run(name: str, argv: list[str]) -> None:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    WALL.setdefault(name, []).append(time.perf_counter() - start)
    CPU.setdefault(name, []).append(usage.ru_utime + usage.ru_stime)
    assert proc.returncode == 0, err.decode()[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_until_healthz(extra: list[str] | None = None) -> str:
    """Start ``mcpipe serve``, wait for /healthz, stop it; answers its stderr (the importtime list, with -X)."""
    port = _free_port()
    argv = [sys.executable, *(extra or []), "-m", "mcpipe", "serve", "--http", f"127.0.0.1:{port}"]
    with tempfile.TemporaryFile() as log:  # not a pipe: -X importtime writes more than a pipe holds unread
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=ENV)
        try:
            _wait_healthz(proc, port, start)
            WALL.setdefault("mcpipe serve to /healthz", []).append(time.perf_counter() - start)
            with open(f"/proc/{proc.pid}/stat") as f:  # the server's CPU so far (it keeps running)
                fields = f.read().rpartition(")")[2].split()
            tick = os.sysconf("SC_CLK_TCK")
            CPU.setdefault("mcpipe serve to /healthz", []).append((int(fields[11]) + int(fields[12])) / tick)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        log.seek(0)
        return log.read().decode()


def _wait_healthz(proc: subprocess.Popen[bytes], port: int, start: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                assert answer.status == 200
            return
        except OSError:
            assert proc.poll() is None, "mcpipe serve exited before /healthz answered"
            assert time.perf_counter() - start < SERVE_WAIT_S, "mcpipe serve did not answer /healthz"
            time.sleep(0.005)


@pytest.mark.benchmark(group="startup")
@pytest.mark.parametrize(
    "name",
    [
        "python -c pass",
        "import mcpipe.cli",
        "mcpipe --version",
        "mcpipe check",
        "mcpipe run",
        "mcpipe playbook run",
        "import the server stack",
    ],
)
def test_command_start_up(benchmark, spec, name):
    argv = _commands(spec)[name]
    benchmark.pedantic(_run, args=(name, argv), rounds=7, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="startup")
def test_serve_ready_to_answer(benchmark, spec):
    benchmark.pedantic(_serve_until_healthz, rounds=5, iterations=1, warmup_rounds=1)


def _importtime_top(stderr: str, n: int = TOP) -> Iterator[str]:
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, module = line[len("import time:") :].split("|")
        rows.append((int(cumulative), module.rstrip()))
    for cumulative, module in sorted(rows, reverse=True)[:n]:
        yield f"    {cumulative / 1000:8.1f} ms  {module}"


def _print_figures(spec: Path) -> None:
    """The medians of the rows (CPU and wall), then each command's -X importtime top list."""
    print(f"\n\nstart-up, medians (load average {os.getloadavg()[0]:.2f}):")
    print(f"  {'command':28s} {'CPU':>9s} {'wall':>9s}")
    for name in CPU:
        cpu, wall = statistics.median(CPU[name]), statistics.median(WALL[name])
        print(f"  {name:28s} {cpu * 1000:7.0f} ms {wall * 1000:7.0f} ms")
    for name, argv in _commands(spec).items():
        if name == "python -c pass":
            continue
        out = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, check=True, env=ENV
        )
        print(f"\n  {name}, -X importtime (cumulative):")
        print("\n".join(_importtime_top(out.stderr)))
    print("\n  mcpipe serve to /healthz, -X importtime (cumulative):")
    print("\n".join(_importtime_top(_serve_until_healthz(["-X", "importtime"]))))
