"""``/healthz`` under a flood of python steps (issue 32): a real ``mcpipe serve`` over HTTP, ``/healthz``
asked every 20 ms by a process of its own while ``CALLERS`` clients call a one-step python pipeline as fast
as they are answered, against ``/healthz`` on the same server idle; printed side by side with the load::

    pytest benches/test_python_flood.py -s

Under the default run (no ``-s``) it is a smoke test: the flood runs and every call answers.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import httpx2
import trio

from kit.attack import Served, served, write_config

CALLERS = 16
FLOOD_S = 4.0
SQUARE = "def main(n):\n    return {'n': n, 'square': n * n}\n"


def _config(directory: Path, steps: int = 1, reuse: str = "step") -> Path:
    """A server whose ``square`` pipeline is ``steps`` python steps, each squaring the previous one's ``n``
    again (``reuse``: ``outbound.python.reuse``)."""
    chain = [{"kind": "python", "id": "sq0", "code": SQUARE, "input": {"n": "${args.n}"}}]
    for i in range(1, steps):
        chain.append(
            {"kind": "python", "id": f"sq{i}", "code": SQUARE, "input": {"n": f"${{steps.sq{i - 1}.output.n}}"}}
        )
    doc = {
        "auth": {"tokens": [], "tools": ["*"]},
        "outbound": {"python": {"reuse": reuse}},
        "pipelines": [
            {
                "name": "square",
                "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
                "steps": chain,
            }
        ],
    }
    return write_config(directory, json.dumps(doc), ".json")


PROBE = """
import sys, time, json, http.client
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
conn = http.client.HTTPConnection(host, port, timeout=10)
took, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    conn.request("GET", "/healthz")
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status
    took.append(time.perf_counter() - t0)
    time.sleep(0.02)
print(json.dumps(took))
"""


async def _healthz_for(server: Served, seconds: float) -> list[float]:
    """``/healthz``'s times for ``seconds``, asked every 20 ms over one kept connection by a process of its
    own (so that each is the server's answer, not this process's event loop, busy with the callers)."""
    host, port = server.base.split("//", 1)[1].split("/")[0].rsplit(":", 1)
    done = await trio.run_process(
        [sys.executable, "-c", PROBE, host, port, str(seconds)], capture_stdout=True, check=True
    )
    return list(json.loads(done.stdout))


def _cpu_s(pid: int) -> float:
    """The process's CPU time so far (user and system, its threads included), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _line(name: str, values: list[float]) -> str:
    v = sorted(x * 1e3 for x in values)
    return (
        f"  {name:28s} median {statistics.median(v):6.2f} ms, p90 {v[int(len(v) * 0.9)]:6.2f} ms, max {v[-1]:6.2f} ms"
    )


async def test_healthz_while_python_steps_flood_the_server(tmp_path):
    await _flood(tmp_path)


async def test_healthz_while_runs_of_ten_python_steps_reusing_their_worker_flood_the_server(tmp_path):
    """Each call a run of 10 python steps with ``outbound.python.reuse: run`` (its first step's worker serves
    the other nine)."""
    await _flood(tmp_path, steps=10, reuse="run")


async def _flood(tmp_path: Path, steps: int = 1, reuse: str = "step") -> None:
    async with served(_config(tmp_path, steps, reuse)) as server, httpx2.AsyncClient(timeout=60) as http:
        first = await server.call("square", {"n": 2}, http)  # the fork server starts
        assert first["isError"] is False, first
        load0 = os.getloadavg()[0]
        with trio.fail_after(180):
            idle = await _healthz_for(server, 2.0)
            step_times: list[float] = []

            async def caller(i: int) -> None:
                end = trio.current_time() + FLOOD_S
                j = 0
                while trio.current_time() < end:
                    j += 1
                    t0 = trio.current_time()
                    answer = await server.call("square", {"n": i * 100 + j}, http)
                    step_times.append(trio.current_time() - t0)
                    n = i * 100 + j
                    assert answer["structuredContent"] == {"n": n, "square": n * n}, answer

            flooded: list[float] = []
            cpu0 = _cpu_s(server.proc.pid)

            async def probe() -> None:
                flooded.extend(await _healthz_for(server, FLOOD_S))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe)
                for i in range(CALLERS):
                    nursery.start_soon(caller, i)
        cpu = _cpu_s(server.proc.pid) - cpu0
        load1 = os.getloadavg()[0]
    print(
        f"\n/healthz, {CALLERS} callers of {steps} python step(s) a call (reuse: {reuse}) for {FLOOD_S:g} s "
        f"({len(step_times)} calls), load {load0:.1f} -> {load1:.1f}"
    )
    print(_line("/healthz idle", idle))
    print(_line(f"/healthz under {CALLERS} callers", flooded))
    print(_line("a call under the flood", step_times))
    print(
        f"  the server's CPU per call: {cpu / len(step_times) * 1e3:.2f} ms, "
        f"per step {cpu / len(step_times) / steps * 1e3:.2f} ms"
    )
    assert len(step_times) >= CALLERS and flooded
