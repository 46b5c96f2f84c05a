"""Instructions a declared pipeline of 5 tool steps costs beyond one trivial call, counted by callgrind
(issue 32, point 1): a measure of the pipeline's own work that the machine's load does not move.

The server is :mod:`test_declared_floor`'s (``ping`` and ``ping5``, audit file written, metrics on), its lean
HTTP front (``mcpipe.server._fast.FastToolCall``) called in process with the same request bodies, no socket.
One process per tree runs under ``valgrind --tool=callgrind``: it starts, warms both calls up, then makes
``--calls`` trivial calls and as many pipeline calls, calling ``os.sched_yield`` between the phases, where
callgrind dumps its counts (``--dump-before=sched_yield``), so each phase is counted alone, without the start.

    python benches/floor_instructions.py [--calls 500] [--base PY]   # the table; needs valgrind
    python benches/floor_instructions.py drive CALLS AUDIT           # what runs under callgrind
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

WARMUP = 50


async def _drive(calls: int, audit_path: str) -> None:
    import orjson

    from mcpipe.config import parse_config
    from mcpipe.server import open_app
    from mcpipe.server._early import HostCheck
    from mcpipe.server._fast import FastToolCall
    from test_declared_floor import CHECK, LOADS, PIPELINE

    doc: dict[str, Any] = {
        "python_tools": ["server_load:bench_tools"],
        "builtins": False,
        "audit": {"path": audit_path},
        "pipelines": [PIPELINE],
    }
    out: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    def request(load: str) -> tuple[dict[str, Any], Any]:
        body = LOADS[load]
        name = orjson.loads(body)["params"]["name"].encode()
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/mcp",
            "headers": [
                (b"host", b"127.0.0.1:8000"),
                (b"content-type", b"application/json"),
                (b"accept", b"application/json, text/event-stream"),
                (b"mcp-protocol-version", b"2026-07-28"),
                (b"mcp-method", b"tools/call"),
                (b"mcp-name", name),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 8000),
            "scheme": "http",
            "query_string": b"",
            "root_path": "",
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        return scope, receive

    config = parse_config(orjson.dumps(doc), "json")
    async with open_app(config) as app:
        security = HostCheck(enable_dns_rebinding_protection=False)
        fast = FastToolCall(app.handlers, security, app.server.server_info_stamp)
        phases = [(load, WARMUP) for load in LOADS] + [(load, calls) for load in LOADS]
        for i, (load, n) in enumerate(phases):
            if i >= len(LOADS):
                os.sched_yield()  # callgrind dumps here: the phase before is counted alone
            scope, receive = request(load)
            for _ in range(n):
                out.clear()
                served, _ = await fast(scope, receive, send)
                if not served or CHECK not in b"".join(out):
                    raise SystemExit(f"floor_instructions: {load} was not answered: {b''.join(out)[:200]!r}")
        os.sched_yield()


def _dump_number(path: Path) -> int:
    """Callgrind's dumps are FILE.1, FILE.2, ...; the count at exit is FILE (or the last number)."""
    tail = path.name.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else 1 << 30


def _phases(python: str, calls: int, tmp: str, tag: str) -> list[int]:
    """The instructions of each phase: the start and warm-up, each load's calls, the exit."""
    out = f"{tmp}/callgrind.{tag}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(HERE)}
    argv = ["valgrind", "--tool=callgrind", "--dump-before=sched_yield", f"--callgrind-out-file={out}", python]
    drive = [__file__, "drive", str(calls), f"{tmp}/audit-{tag}.jsonl"]
    subprocess.run([*argv, *drive], env=env, check=True, capture_output=True)
    counts = []
    for path in sorted(Path(tmp).glob(f"callgrind.{tag}*"), key=_dump_number):
        found = re.search(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.M)
        if found is None:
            raise SystemExit(f"floor_instructions: no instruction count in {path}")
        counts.append(int(found.group(1)))
    if len(counts) < 3:
        raise SystemExit(f"floor_instructions: {len(counts)} dumps, not the phases ({out}*)")
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--base", help="another interpreter whose mcpipe is counted the same way, for an A/B")
    args, rest = p.parse_known_args()
    if rest[:1] == ["drive"]:
        import trio

        trio.run(_drive, int(rest[1]), rest[2])
        return 0
    if rest:
        p.error(f"unknown arguments: {' '.join(rest)}")
    print("| tree | trivial instructions/call | pipeline instructions/call | pipeline extra/call |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for tree, python in (("base", args.base), ("this", sys.executable)):
            if python is None:
                continue
            counts = _phases(python, args.calls, tmp, tree)
            trivial, pipeline = (x / args.calls / 1000 for x in counts[1:3])
            print(f"| {tree} | {trivial:.0f}k | {pipeline:.0f}k | {pipeline - trivial:.0f}k |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
