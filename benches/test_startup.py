"""Start-up: what a command costs before its own work, each as a fresh process (issue 32, item 4).

Each row starts a new interpreter, as a shell does: ``python -c pass`` (the floor), ``import mcpipe.cli``,
``mcpipe --version``, ``check`` and ``run`` of a one-step spec, ``check --config`` of ``examples/mcpipe.toml``,
``playbook run`` of NoETL's ``hello_world`` (its run itself takes a few milliseconds) beside its floor (``import
trio, yaml, jinja2``), and ``mcpipe serve`` until ``GET /healthz`` answers, until a 2026-07-28 client's ``tools/list``
and ``tools/call`` are answered (which ``mcpipe serve`` answers before the SDK has loaded: ``server/_early.py``), and
until a real client's ``initialize`` then ``tools/list`` are answered over streamable HTTP, beside the floors of any
server on
its stack: ``import mcp`` (the SDK), the ``import`` of Trio, hypercorn and the MCP SDK's server (nothing of
mcpipe), and the same with the SDK's package ``__init__`` files deferred as mcpipe defers them
(``mcpipe._sdk``). Wall time is what pytest-benchmark records; each round also records the child's CPU time
(user + system, from ``os.wait4``), which the machine's load inflates far less, and the table at the end
prints both (medians) with the load average. Then the ``-X importtime`` top list of each command: the modules
costing it most, cumulative, so a regression names its culprit.

    pytest benches/test_startup.py --benchmark-enable --benchmark-only -s

With ``MCPIPE_STARTUP_BASELINE`` naming the ``python`` directory of another tree (a worktree of main, with its
``_core`` extension built or copied in), every ``mcpipe`` row and the server's also run against that tree
(``PYTHONPATH``), as a row of its own marked ``(baseline)``: before and after, in one run.

Under the default ``--benchmark-disable`` each runs once, as a smoke test. Figures: docs/performance.md,
"Start-up".

The children write and read their bytecode in a directory of the run's own (``PYTHONPYCACHEPREFIX``), as an
installed package has its ``.pyc`` files: with ``PYTHONDONTWRITEBYTECODE`` set (as on the shared VM) and an
editable install, every start would compile mcpipe's sources again, which no user pays. The warm-up round
writes them.
"""

from __future__ import annotations

import json
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
CONFIG = ROOT / "examples" / "mcpipe.toml"
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


NOETL_FLOOR = "import trio, yaml, jinja2"
"""What any NoETL run needs (its templates are Jinja, its files YAML): the floor of ``playbook run``'s row."""
DEFERRED_STACK = f"import mcpipe._sdk as s; s.defer_sdk_packages(); {SERVER_STACK}"
"""The server stack with the SDK's package ``__init__`` files deferred as ``mcpipe`` defers them (``_sdk``)."""


BASELINE = os.environ.get("MCPIPE_STARTUP_BASELINE")
BASELINE_MARK = " (baseline)"
SERVE = "mcpipe serve to /healthz"
SERVE_MCP = "mcpipe serve to initialize+tools/list"
SERVE_MODERN = "mcpipe serve to tools/list+tools/call (2026-07-28)"
ACCEPT = "application/json, text/event-stream"


def _commands(spec: Path) -> dict[str, list[str]]:
    rows = _rows(spec)
    if BASELINE:
        rows.update({name + BASELINE_MARK: argv for name, argv in list(rows.items()) if name.startswith("mcpipe")})
    return rows


def _env(name: str) -> dict[str, str]:
    """The children's environment: a baseline row's imports mcpipe from the baseline's tree."""
    if not name.endswith(BASELINE_MARK):
        return ENV
    assert BASELINE is not None
    return {**ENV, "PYTHONPATH": BASELINE}


def _rows(spec: Path) -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import mcpipe.cli": [sys.executable, "-c", "import mcpipe.cli"],
        "mcpipe --version": [*MCPIPE, "--version"],
        "mcpipe check": [*MCPIPE, "check", str(spec)],
        "mcpipe run": [*MCPIPE, "run", str(spec)],
        "mcpipe check --config": [*MCPIPE, "check", "--config", str(CONFIG)],
        "import trio, yaml, jinja2": [sys.executable, "-c", NOETL_FLOOR],
        "mcpipe playbook run": [*MCPIPE, "playbook", "run", str(HELLO)],
        "import mcp": [sys.executable, "-c", "import mcp"],
        "import the server stack": [sys.executable, "-c", SERVER_STACK],
        "the server stack, SDK deferred": [sys.executable, "-c", DEFERRED_STACK],
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
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(name))
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


def _serve_until_healthz(name: str = SERVE, extra: list[str] | None = None) -> str:
    """Start ``mcpipe serve``, wait for /healthz, stop it; answers its stderr (the importtime list, with -X).
    The row :data:`SERVE_MCP` waits further, for a real client's ``initialize`` then ``tools/list`` over
    streamable HTTP (2025-11-25) to be answered."""
    port = _free_port()
    argv = [sys.executable, *(extra or []), "-m", "mcpipe", "serve", "--http", f"127.0.0.1:{port}"]
    with tempfile.TemporaryFile() as log:  # not a pipe: -X importtime writes more than a pipe holds unread
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=_env(name))
        try:
            _wait_healthz(proc, port, start)
            if name.startswith(SERVE_MCP):
                _initialize_and_list(port)
            elif name.startswith(SERVE_MODERN):
                _list_and_call(port)
            WALL.setdefault(name, []).append(time.perf_counter() - start)
            with open(f"/proc/{proc.pid}/stat") as f:  # the server's CPU so far (it keeps running)
                fields = f.read().rpartition(")")[2].split()
            tick = os.sysconf("SC_CLK_TCK")
            CPU.setdefault(name, []).append((int(fields[11]) + int(fields[12])) / tick)
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


def _post(port: int, message: dict[str, object], session: str | None = None) -> tuple[bytes, str | None]:
    """POST one JSON-RPC message to ``/mcp``: the body and the ``Mcp-Session-Id`` answered."""
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": "2025-11-25"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    body = json.dumps(message).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read(), answer.headers.get("Mcp-Session-Id")


def _initialize_and_list(port: int) -> None:
    """What a real client does first: ``initialize``, ``notifications/initialized``, ``tools/list``."""
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    body, session = _post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
    assert b'"protocolVersion"' in body, body[:500]
    _post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    body, _ = _post(port, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session)
    assert b'"tools"' in body, body[:500]


def _modern(port: int, method: str, params: dict[str, object], name: str | None = None) -> bytes:
    """POST one 2026-07-28 request (its envelope in ``_meta``, its routing headers) to ``/mcp``: the body."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": "2026-07-28"}
    headers["Mcp-Method"] = method
    if name is not None:
        headers["Mcp-Name"] = name
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        out: bytes = answer.read()
        return out


def _list_and_call(port: int) -> None:
    """What a 2026-07-28 client does first: ``tools/list``, then a ``tools/call`` (the built-in ``echo``)."""
    assert b'"tools"' in _modern(port, "tools/list", {})
    answer = _modern(port, "tools/call", {"name": "echo", "arguments": {"text": "hi"}}, "echo")
    assert b'"isError":false' in answer, answer[:500]


ROWS = (
    "python -c pass",
    "import mcpipe.cli",
    "mcpipe --version",
    "mcpipe check",
    "mcpipe run",
    "mcpipe check --config",
    "import trio, yaml, jinja2",
    "mcpipe playbook run",
    "import mcp",
    "import the server stack",
    "the server stack, SDK deferred",
)


def _with_baseline(names: tuple[str, ...]) -> list[str]:
    """Each row, and after it its baseline's when there is a baseline and the row is mcpipe's."""
    return [r for n in names for r in (n, n + BASELINE_MARK) if r == n or (BASELINE and n.startswith("mcpipe"))]


@pytest.mark.benchmark(group="startup")
@pytest.mark.parametrize("name", _with_baseline(ROWS))
def test_command_start_up(benchmark, spec, name):
    argv = _commands(spec)[name]
    benchmark.pedantic(_run, args=(name, argv), rounds=7, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="startup")
@pytest.mark.parametrize("name", _with_baseline((SERVE, SERVE_MODERN, SERVE_MCP)))
def test_serve_ready_to_answer(benchmark, spec, name):
    benchmark.pedantic(_serve_until_healthz, args=(name,), rounds=5, iterations=1, warmup_rounds=1)


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
    print(f"  {'command':42s} {'CPU':>9s} {'wall':>9s}")
    for name in CPU:
        cpu, wall = statistics.median(CPU[name]), statistics.median(WALL[name])
        print(f"  {name:42s} {cpu * 1000:7.0f} ms {wall * 1000:7.0f} ms")
    for name, argv in _commands(spec).items():
        if name == "python -c pass":
            continue
        out = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, check=True, env=_env(name)
        )
        print(f"\n  {name}, -X importtime (cumulative):")
        print("\n".join(_importtime_top(out.stderr)))
    print("\n  mcpipe serve to /healthz, -X importtime (cumulative):")
    print("\n".join(_importtime_top(_serve_until_healthz("-X importtime", ["-X", "importtime"]))))
