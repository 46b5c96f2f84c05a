"""A declared pipeline of 5 tool steps against one trivial call, over streamable HTTP, in the same server
(issue 32, point 1: the pipeline at most 1.1x the trivial call's server CPU).

The server is ``mcpipe serve``'s (``open_app`` + ``serve_http``, hypercorn's trio worker), its audit file
written as in production. It serves ``ping`` (an in-process Python tool answering its argument) and
``ping5``, a pipeline declared in its config (``pipelines``) of 5 ``tool`` steps, each calling ``ping`` with
the previous step's output (``${steps.s1.output}``...), so both answer the same text block.

The load is ``benches/loadgen`` (Rust, std only, built with cargo on first use; ``server_load.blast`` without
cargo, or with ``--python-load``): raw 2026-07-28 ``tools/call`` POSTs on keep-alive connections, so the
client does not eat the core the server runs on. For ``--rounds`` rounds the two loads alternate (their
order flips each round), each ``--calls`` calls at ``--clients`` clients; a row is the server's CPU per call
(utime+stime from ``/proc/<pid>/stat`` over the calls), calls/s and the load average. The figure is the
median over rounds of the round's ratio *pipeline CPU / trivial CPU*: both are measured minutes apart at
most, on the same loaded machine. ``--base PYTHON`` (another checkout's interpreter) serves the same two
tools from that tree's mcpipe too, interleaved, for an A/B of a change in one run.

    pytest benches/test_declared_floor.py --benchmark-enable --benchmark-only -s   # 5 rounds, the table
    python benches/test_declared_floor.py [--rounds 7] [--calls 3000] [--clients 8] [--base PY] [--json F]
    python benches/test_declared_floor.py serve [AUDIT]                            # serve; prints the URL

Under the default ``--benchmark-disable`` the test runs one short round, as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from proxy_peer import load_once, loadavg, loadgen, process, url_of  # noqa: E402
from server_load import as_served, cpu_seconds, tools_call  # noqa: E402

STEPS = 5
TEXT = "floor"
CHECK = b'"text":"floor"'

PIPELINE: dict[str, Any] = {
    "name": "ping5",
    "description": f"ping, {STEPS} times over, each step taking the previous one's output.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "steps": [
        {"kind": "tool", "id": "s1", "tool": "ping", "args": {"text": "${args.text}"}},
        *(
            {"kind": "tool", "id": f"s{i}", "tool": "ping", "args": {"text": f"${{steps.s{i - 1}.output}}"}}
            for i in range(2, STEPS + 1)
        ),
    ],
}

LOADS: dict[str, bytes] = {
    "trivial": tools_call("ping", {"text": TEXT}),
    "pipeline": tools_call("ping5", {"text": TEXT}),
}


async def _serve(audit_path: str) -> None:
    """The two tools on one server, as ``mcpipe serve`` runs it (audit on, metrics on, no traces)."""
    import orjson
    import trio

    from mcpipe.config import parse_config
    from mcpipe.server import open_app, serve_http

    doc: dict[str, Any] = {
        "python_tools": ["server_load:bench_tools"],
        "builtins": False,
        "audit": {"path": audit_path},
        "pipelines": [PIPELINE],
    }
    config = parse_config(orjson.dumps(doc), "json")
    async with open_app(config) as app, trio.open_nursery() as nursery:
        as_served()
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0))
        print(url, flush=True)


@dataclass
class Row:
    round: int
    server: str
    load: str
    calls: int
    calls_per_s: float
    cpu_ms: float
    loadgen_cpu_ms: float
    loadavg: float


def measure(gen: Path | None, r: int, server: str, url: str, pid: int, load: str, calls: int, clients: int) -> Row:
    body = LOADS[load]
    load_once(gen, url, body, clients, 40, CHECK)  # warm-up
    l0, c0 = loadavg(), cpu_seconds(pid)
    done, seconds, client = load_once(gen, url, body, clients, calls, CHECK)
    row = Row(
        r,
        server,
        load,
        done,
        done / seconds,
        (cpu_seconds(pid) - c0) * 1000 / done,
        client * 1000 / done,
        (l0 + loadavg()) / 2,
    )
    print(
        f"  round {r} {server:6} {load:8} {row.calls_per_s:6.0f}/s server {row.cpu_ms:.3f} ms/call "
        f"load {row.loadavg:.1f}",
        flush=True,
    )
    return row


def run(rounds: int, calls: int, clients: int, base: str | None, python_load: bool) -> list[Row]:
    """Start the server(s), run the interleaved rounds, answer every row."""
    gen = None if python_load else loadgen()
    rows: list[Row] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        servers: dict[str, tuple[str, int]] = {}
        for name, python in (("this", sys.executable), ("base", base)):
            if python is None:
                continue
            argv = [python, str(Path(__file__).resolve()), "serve", f"{tmp}/audit-{name}.jsonl"]
            proc = stack.enter_context(process(argv, name, env))
            servers[name] = (url_of(proc, f"{name} server"), proc.pid)
        names = list(servers)
        for r in range(rounds):
            order = list(LOADS) if r % 2 == 0 else list(LOADS)[::-1]
            for name in names[r % len(names) :] + names[: r % len(names)]:
                url, pid = servers[name]
                for load in order:
                    rows.append(measure(gen, r, name, url, pid, load, calls, clients))
    return rows


def ratios(rows: list[Row], server: str) -> list[float]:
    """Per round: the server's pipeline CPU per call over its trivial call's."""
    out = []
    for r in sorted({x.round for x in rows}):
        got = {x.load: x.cpu_ms for x in rows if x.round == r and x.server == server}
        if len(got) == 2:
            out.append(got["pipeline"] / got["trivial"])
    return out


def report(rows: list[Row]) -> str:
    med = statistics.median
    lines = [
        "| server | load | calls/s | server CPU ms/call | load average |",
        "|---|---|---|---|---|",
    ]
    for server in dict.fromkeys(x.server for x in rows):
        for load in LOADS:
            rs = [x for x in rows if x.server == server and x.load == load]
            lines.append(
                f"| {server} | {load} | {med(x.calls_per_s for x in rs):.0f} | {med(x.cpu_ms for x in rs):.3f} "
                f"| {min(x.loadavg for x in rs):.1f}-{max(x.loadavg for x in rs):.1f} |"
            )
    lines.append("")
    for server in dict.fromkeys(x.server for x in rows):
        per = ratios(rows, server)
        each = ", ".join(f"{p:.2f}" for p in per)
        lines.append(f"{server}: pipeline / trivial server CPU, median {med(per):.3f} (rounds {each})")
    return "\n".join(lines)


def test_a_declared_pipeline_of_5_tool_steps_vs_one_trivial_call(benchmark):
    smoke = getattr(benchmark, "disabled", True)
    rounds, calls = (1, 200) if smoke else (5, 3000)
    rows: list[Row] = []
    benchmark.pedantic(lambda: rows.extend(run(rounds, calls, 8, None, False)), rounds=1, iterations=1)
    print()
    print(report(rows))
    per = ratios(rows, "this")
    assert len(per) == rounds and all(x.calls >= calls * 0.9 for x in rows)
    benchmark.extra_info.update(ratio=round(statistics.median(per), 3))
    benchmark.extra_info.update({f"cpu_ms_{x.load}": round(x.cpu_ms, 3) for x in rows})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--base", help="another interpreter whose mcpipe serves the same tools, for an A/B")
    p.add_argument("--python-load", action="store_true", help="server_load.blast instead of the Rust loadgen")
    p.add_argument("--json")
    a = p.parse_args()
    rows = run(a.rounds, a.calls, a.clients, a.base, a.python_load)
    print()
    print(report(rows))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        import logging

        import trio

        logging.disable(logging.WARNING)
        trio.run(_serve, sys.argv[2] if len(sys.argv) > 2 else os.devnull)
    else:
        sys.exit(main())
