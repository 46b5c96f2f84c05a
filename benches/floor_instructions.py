"""Instructions a declared pipeline of 5 tool steps costs beyond one trivial call, counted by callgrind
(issue 32, point 1): a measure of the pipeline's own work that the machine's load does not move.

The server is :mod:`test_declared_floor`'s (``ping`` and ``ping5``, audit file written, metrics on), its lean
HTTP front (``mcpipe.server._fast.FastToolCall``) called in process with the same request bodies, no socket.
Each load runs in its own process under ``valgrind --tool=callgrind``; both processes start and warm up alike,
so *(instructions of the pipeline run - instructions of the trivial run) / calls* is what a pipeline call
costs beyond a trivial one (``PYTHONHASHSEED=0``, so two runs of one tree count the same within 0.1%).

    python benches/floor_instructions.py [--calls 1000] [--base PY]   # the table; needs valgrind
    python benches/floor_instructions.py drive trivial|pipeline CALLS AUDIT  # what runs under callgrind
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


async def _drive(load: str, calls: int, audit_path: str) -> None:
    import orjson
    from mcp.server.transport_security import TransportSecuritySettings

    from mcpipe.config import parse_config
    from mcpipe.server import open_app
    from mcpipe.server._fast import FastToolCall
    from test_declared_floor import CHECK, LOADS, PIPELINE

    doc: dict[str, Any] = {
        "python_tools": ["server_load:bench_tools"],
        "builtins": False,
        "audit": {"path": audit_path},
        "pipelines": [PIPELINE],
    }
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
    out: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    config = parse_config(orjson.dumps(doc), "json")
    async with open_app(config) as app:
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        fast = FastToolCall(app.handlers, security, app.server.server_info_stamp)
        for _ in range(WARMUP + calls):
            out.clear()
            served, _ = await fast(scope, receive, send)
            if not served or CHECK not in b"".join(out):
                raise SystemExit(f"floor_instructions: {load} was not answered: {b''.join(out)[:200]!r}")


def _instructions(python: str, load: str, calls: int, tmp: str) -> int:
    out = f"{tmp}/callgrind.{load}.{os.getpid()}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(HERE)}
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, __file__]
    subprocess.run([*argv, "drive", load, str(calls), f"{tmp}/audit.jsonl"], env=env, check=True, capture_output=True)
    text = Path(out).read_text(errors="replace")
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if found is None:
        raise SystemExit(f"floor_instructions: no instruction count in {out}")
    return int(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--base", help="another interpreter whose mcpipe is counted the same way, for an A/B")
    args, rest = p.parse_known_args()
    if rest[:1] == ["drive"]:
        import trio

        load, calls, audit = rest[1], int(rest[2]), rest[3]
        trio.run(_drive, load, calls, audit)
        return 0
    if rest:
        p.error(f"unknown arguments: {' '.join(rest)}")
    print("| tree | trivial instructions/call | pipeline instructions/call | pipeline extra/call |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for tree, python in (("base", args.base), ("this", sys.executable)):
            if python is None:
                continue
            trivial = _instructions(python, "trivial", args.calls, tmp)
            pipeline = _instructions(python, "pipeline", args.calls, tmp)
            zero = _instructions(python, "trivial", 0, tmp)
            per = [(x - zero) / args.calls / 1000 for x in (trivial, pipeline)]
            print(f"| {tree} | {per[0]:.0f}k | {per[1]:.0f}k | {per[1] - per[0]:.0f}k |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
