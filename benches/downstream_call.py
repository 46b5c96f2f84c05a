#!/usr/bin/env python3
"""A downstream call alone: the gateway's CPU per ``DownstreamServer.call`` to the SDK's server over HTTP.

The downstream is the bench's SDK server (``server_load.py sdk``, hypercorn's trio worker) in its own process;
the gateway is ``open_app`` in this one, calling ``ping`` through the downstream server's actor in a loop (no
caller, no front: only the downstream call's path, lean call and wire). The figure is this process's CPU
(``process_time``) per call, after 200 calls of warm-up. ``--base PY`` runs the same under another
interpreter (another checkout's mcpipe), interleaved with this one, round by round, with the machine's load
average beside each row. ``--profile`` prints a cProfile (CPU clock) of one run instead.

    python benches/downstream_call.py [--rounds 3] [--calls 3000] [--base PY] [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
WARM_UP = 200

from server_load import server_process  # noqa: E402


async def _measure(calls: int, profile: bool) -> float:
    import trio

    from mcpipe.config import parse_config
    from mcpipe.server import open_app
    from mcpipe.tools import ToolContext

    async with server_process("sdk") as (url, _):
        doc = {"audit": {"enabled": False}, "mcpServers": {"down": {"url": url}}}
        async with open_app(parse_config(json.dumps(doc), "json", environ={})) as app:
            server = app.downstreams.servers[0]
            with trio.fail_after(30):
                await server.wait_connected()
            for _ in range(WARM_UP):
                await server.call("ping", {}, ToolContext())
            if profile:
                import cProfile
                import pstats

                profiler = cProfile.Profile(time.process_time)
                profiler.enable()
            t0 = time.process_time()
            for _ in range(calls):
                await server.call("ping", {}, ToolContext())
            cpu = time.process_time() - t0
            if profile:
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
            return cpu / calls


def _one(python: str, calls: int) -> float:
    out = subprocess.run(
        [python, str(Path(__file__).resolve()), "--calls", str(calls), "--child"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.split()[-1])


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--base", help="another interpreter whose mcpipe is the base of an A/B")
    p.add_argument("--profile", action="store_true", help="a cProfile (CPU clock) of one run")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rounds < 1 or args.calls < 1:
        p.error("--rounds and --calls must be at least 1")
    import trio

    if args.child or args.profile:
        per_call = trio.run(_measure, args.calls, args.profile)
        print(f"{per_call * 1e6:.1f}" if args.child else f"CPU per call: {per_call * 1e6:.1f} us")
        return
    ratios = []
    for r in range(args.rounds):
        here = _one(sys.executable, args.calls)
        line = f"round {r} this tree {here:.1f} us/call (load {_load()})"
        if args.base:
            base = _one(args.base, args.calls)
            ratios.append(here / base)
            line += f", base {base:.1f} us/call (load {_load()}), ratio {here / base:.2f}"
        print(line, flush=True)
    if ratios:
        print(f"this tree / base CPU per downstream call: median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
