"""NoETL playbooks served (``formats/noetl``) under hostile callers: a loop's ``filter`` over a caller's items,
templates queued behind others' slow ones, processes that ``shell`` and ``python`` steps leave behind. Over
HTTP against one real ``mcpipe serve`` (each attack a section of the test), ``/healthz`` probed."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from kit.attack import Served, served, write_config
from mcpipe.formats.noetl.toolkinds import NOETL_DUCKDB_DIR

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

FILTERED = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: filtered, path: hostile/filtered}
workload:
  items: []
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: each}]}
  - step: each
    loop: {in: "{{ workload.items }}", iterator: it, filter: "{{ it > 0 }}", spec: {mode: parallel}}
    tool: {kind: python, input: {x: "{{ iter.it }}"}, code: "result = {'x': x}"}
"""

SLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: slow, path: hostile/slow}
workload:
  n: 0
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.n: "{% for i in range(workload.n) %}{% for j in range(workload.n) %}{% endfor %}{% endfor %}x"}
"""

HELLO = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: hello, path: hostile/hello}
workload:
  who: world
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.greeting: "hello {{ workload.who }}"}
"""

BACKGROUND = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: background, path: hostile/background}
workload:
  pidfile: ""
workflow:
  - step: start
    tool:
      kind: shell
      env: {PIDFILE: "{{ workload.pidfile }}"}
      cmds:
        - >-
          sleep 300.31 >/dev/null 2>&1 & i=0;
          while [ $i -lt 4000 ] && ! pgrep -fx "sleep 300.31" >/dev/null; do i=$((i+1)); done; echo started
"""

PYTHONS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pythons, path: hostile/pythons}
workload:
  items: []
workflow:
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: each}]}
  - step: each
    loop: {in: "{{ workload.items }}", iterator: it, spec: {mode: parallel, max_in_flight: 24}}
    tool:
      kind: python
      input: {x: "{{ iter.it }}"}
      code: |
        import os, subprocess, time
        subprocess.Popen(["sleep", "301"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(x)
        result = {"pid": os.getpid()}
"""


DUCK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: duck, path: hostile/duck}
workload:
  n: 1
workflow:
  - step: start
    tool:
      kind: duckdb
      commands: >-
        CREATE TABLE t AS SELECT range AS i, repeat('x', 1000) AS s FROM range({{ workload.n }});
        SELECT count(*) AS n FROM t
"""


def _config(tmp_path: Path, *playbooks: tuple[str, str], extra: str = "") -> Path:
    paths = []
    for name, text in playbooks:
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        paths.append(str(path))
    return write_config(tmp_path, f"audit: {{enabled: false}}\n{extra}playbooks: {paths}\n")


def _children(pid: int) -> list[tuple[int, str, str]]:
    """``(pid, state, command)`` of the live children of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == str(pid):
            out.append((int(entry), fields.get("State", "").strip(), cmd.strip()))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:\t", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def _filter(server: Served) -> None:
    # Before: the filter was rendered item by item, each a thread hop under its own deadline: 400 000 items
    # (1.2 MB) took 76 s of the server's work before the loop's size was checked (here 200 000: 36 s).
    t0 = time.perf_counter()
    refused, slowest = await server.probed(lambda: server.call("filtered", {"items": [0] * 200_000 + [1]}))
    took = time.perf_counter() - t0
    assert refused["isError"] is True
    text = refused["content"][0]["text"]
    assert "workflow[1].loop.filter: the template took longer than 300 ms to render" in text
    assert took < 18, took  # half the 36 s it took before: a loaded host's slowness is not the bug's
    assert slowest < server.stall_s, server.health
    kept = await server.call("filtered", {"items": [0] * 2000 + [1, 2]})
    assert kept["structuredContent"]["steps"]["each"] == [{"x": 1}, {"x": 2}]


async def _render_threads(server: Served) -> None:
    # Before: the deadline of a rendering counted its wait for one of the 4 render threads: while others'
    # templates ran to their deadline, a trivial one failed "took longer than 300 ms to render".
    stop = trio.Event()
    answers: list[dict[str, Any]] = []

    async def attacker() -> None:
        while not stop.is_set():
            await server.call("slow", {"n": 100_000})  # 10^10 loop turns: each runs to the deadline

    async def innocent() -> None:
        await trio.sleep(0.5)  # the render threads busy, attackers queued for them
        for _ in range(2):
            answers.append(await server.call("hello", {"who": "x"}))
        stop.set()

    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(attacker)
        nursery.start_soon(innocent)
    failed = [a["content"][0]["text"] for a in answers if a["isError"]]
    assert not failed, failed
    assert all(a["structuredContent"]["status"] == "completed" for a in answers)


async def _shell_child(server: Served, pidfile: Path) -> None:
    # Before: `sleep 300 >/dev/null &` (no longer holding the output pipes) outlived the step and the server,
    # one more process per call. (The program waits until its sleep runs; its pid is its PID namespace's.)
    answer = await server.call("background", {"pidfile": str(pidfile)})
    assert answer["isError"] is False, answer
    sleepers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p)) == "sleep 300.31"]
    fds = []
    for pid in sleepers:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))  # readable once the process has exited
    try:
        with trio.fail_after(5):
            for fd in fds:
                await trio.lowlevel.wait_readable(fd)
    finally:
        for fd in fds:
            os.close(fd)


async def _python_steps(server: Served) -> None:
    # Holds: 24 python steps at once, each spawning a child that would sleep 301 s, queue for the python
    # workers; each step's process group ends with it, and only the fork server stays.
    answer, slowest = await server.probed(lambda: server.call("pythons", {"items": [0.05] * 24}))
    assert answer["isError"] is False, answer["content"][0]["text"][:500]
    assert len(answer["structuredContent"]["steps"]["each"]) == 24
    assert slowest < server.stall_s, server.health

    def lingering() -> tuple[list[str], list[tuple[int, str, str]], list[str]]:
        left = [c for c in _children(server.proc.pid) if c[1][:1] != "Z" or "sleep" in c[2]]
        zombies = [c for c in _children(server.proc.pid) if c[1][:1] == "Z"]
        sleepers = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p)) == "sleep 301"]
        own = [c[2] for c in left if "_zygote.py" not in c[2] and "sh -c" not in c[2]]
        return own, zombies, [p for p in sleepers if _alive(int(p))]

    with trio.move_on_after(20):  # the steps' processes end with them: waited for, a loaded host reaps late
        while lingering() != ([], [], []):  # noqa: ASYNC110 (other processes: nothing to wait on)
            await trio.sleep(0.05)
    assert lingering() == ([], [], [])


async def _duckdb_files(server: Served) -> None:
    # Before: every run of a duckdb task without a `database` left its file (NoETL's file per execution) in
    # /tmp/mcpipe-noetl, its tables included: a caller's loop of calls filled the disk (here 3 MB a call).
    for _ in range(3):
        answer = await server.call("duck", {"n": 3000})
        assert answer["isError"] is False, answer["content"][0]["text"][:300]
        run_id = answer["structuredContent"]["steps"]["start"][0]["execution_id"]
        assert not _exists(NOETL_DUCKDB_DIR / f"duckdb_{run_id}.duckdb")


async def test_playbooks_hold_a_hostile_callers_items_templates_and_processes(tmp_path):
    playbooks = [("filtered", FILTERED), ("slow", SLOW), ("hello", HELLO), ("background", BACKGROUND)]
    playbooks += [("pythons", PYTHONS), ("duck", DUCK)]
    extra = "pipe: {expression_timeout_ms: 300}\noutbound: {commands: {sh: /bin/sh}}\n"
    async with served(_config(tmp_path, *playbooks, extra=extra)) as server:
        await _filter(server)
        await _render_threads(server)
        await _shell_child(server, tmp_path / "child.pid")
        await _python_steps(server)
        await _duckdb_files(server)
        assert server.alive and "Traceback" not in server.text()


def _exists(path: Path) -> bool:
    return path.exists()


def _pid(path: Path) -> int:
    return int(path.read_text())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
