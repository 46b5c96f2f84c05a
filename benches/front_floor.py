#!/usr/bin/env python3
"""The HTTP front alone: a trivial ASGI app (a fixed JSON answer with its ``Content-Length``) served by
``serve_bounded`` (``mcpipe.server._listen``) with each front, ``own`` (``mcpipe.server._front``) and
``hypercorn`` (hypercorn's H11 protocol), each in its own process on 127.0.0.1; and, with ``--floor``, a
minimal loop of a dozen lines (no checks at all: what an HTTP/1.1 exchange on trio costs at the least).

For ``--rounds`` rounds, interleaved (the order rotates each round), ``benches/loadgen`` sends ``--calls``
POSTs at ``--clients`` keep-alive clients to each; a row is the server's CPU per request (utime+stime from
``/proc/<pid>/stat``), requests/s and the load average. Printed: the medians, and the median of the rounds'
ratios *own / hypercorn*.

    python benches/front_floor.py [--rounds 5] [--calls 6000] [--clients 4] [--floor]
    python benches/front_floor.py serve own|hypercorn|floor PORT
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from proxy_peer import free_port, load_once, loadavg, loadgen  # noqa: E402
from server_load import cpu_seconds  # noqa: E402

ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{}}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


async def floor(port: int) -> None:
    import trio

    async def connection(stream: trio.SocketStream) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
            end = buf.index(b"\r\n\r\n") + 4
            length = 0
            for line in buf[:end].split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            while len(buf) < end + length:
                buf += await stream.receive_some(65536)
            buf = buf[end + length :]
            head = b"HTTP/1.1 200 \r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in HEADERS) + b"\r\n"
            await stream.send_all(head + ANSWER)

    await trio.serve_tcp(connection, port, host="127.0.0.1")


def serve(front: str, port: int) -> None:
    import trio
    from hypercorn.config import Config

    from mcpipe.server._listen import serve_bounded

    if front == "floor":
        trio.run(floor, port)
        return
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    trio.run(partial(serve_bounded, app, config, max_connections=64, front=front))


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=6000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--floor", action="store_true", help="the minimal loop too")
    a = p.parse_args()
    gen = loadgen()
    if gen is None:
        raise SystemExit("front_floor: needs cargo to build benches/loadgen")
    fronts = ["own", "hypercorn"] + (["floor"] if a.floor else [])
    procs = {}
    for front in fronts:
        port = free_port()
        procs[front] = (subprocess.Popen([sys.executable, __file__, "serve", front, str(port)]), port)
    time.sleep(3)
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    cpu: dict[str, list[float]] = {f: [] for f in fronts}
    try:
        for r in range(a.rounds):
            order = fronts[r % len(fronts) :] + fronts[: r % len(fronts)]
            for front in order:
                proc, port = procs[front]
                url = f"http://127.0.0.1:{port}/mcp"
                load_once(gen, url, body, a.clients, 200, b"result")
                l0, c0 = loadavg(), cpu_seconds(proc.pid)
                done, seconds, _ = load_once(gen, url, body, a.clients, a.calls, b"result")
                ms = (cpu_seconds(proc.pid) - c0) * 1000 / done
                cpu[front].append(ms)
                print(
                    f"  round {r} {front:9} {done / seconds:7.0f}/s  {ms:.3f} ms CPU/request  "
                    f"load {(l0 + loadavg()) / 2:.1f}",
                    flush=True,
                )
    finally:
        for proc, _ in procs.values():
            proc.kill()
    for front in fronts:
        print(f"{front:9} median {statistics.median(cpu[front]):.3f} ms CPU/request")
    ratios = [o / h for o, h in zip(cpu["own"], cpu["hypercorn"], strict=True)]
    print(f"own / hypercorn: median {statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
