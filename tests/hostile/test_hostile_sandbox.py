"""python and shell steps whose own code attacks the isolation (issue 27, items 12 to 16), each through a real
``mcpipe serve`` over HTTP, ``/healthz`` probed during the attack.

Each attack is the step's code. Before the sandbox (main before this work) every one of them succeeded: the
code raised its ``RLIMIT_AS`` back and allocated 600 MB under ``memory_mb: 128``; a ``setsid`` grandchild
outlived the step; a forked child holding the reply pipe held the answer; the code stopped the fork server
(every later python step hung); it read the server's environment and another caller's bearer token in the
server's memory; it wrote 400 MB; it forked without bound; a shell step's ``setsid sleep &`` outlived it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from kit.attack import Served, served, write_config
from kit.hostile import call, headers, result_of
from kit.processes import cmdline, detaching, gone

ALICE = "tok-alice-" + secrets.token_hex(8)
BOB = "tok-bob-" + secrets.token_hex(8)
SECRET = "s3cr3t-" + secrets.token_hex(8)

RAISE_AS = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
for wanted in ((resource.RLIM_INFINITY, resource.RLIM_INFINITY), (hard, hard)):
    try:
        resource.setrlimit(resource.RLIMIT_AS, wanted)
    except (ValueError, OSError):
        pass
block = bytearray(600 * 2**20)
result = {"allocated": len(block), "soft": soft, "hard": hard}
"""

LIMITS = """
import resource
result = {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NPROC")}
"""

HOLD_REPLY = """
import os, time
if os.fork() == 0:
    time.sleep(600)
    os._exit(0)
result = "answered"
"""

DETACH = detaching('"detached"')

STOP_FORK_SERVER = """
import os, signal
try:
    os.kill(target, signal.SIGSTOP)
    result = "stopped"
except OSError as e:
    result = type(e).__name__
"""

READ_SERVER = """
import os, re
out = {"uid": os.getuid()}
try:
    out["environ"] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
except OSError as e:
    out["environ"] = type(e).__name__
tokens = set()
try:
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or "[v" in line:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            while start < end:
                size = min(end - start, 4 * 2**20)
                try:
                    mem.seek(start)
                    tokens.update(m.decode() for m in re.findall(rb"tok-bob-[0-9a-f]{16}", mem.read(size)))
                except OSError:
                    pass
                start += size
    out["mem"] = "read"
except OSError as e:
    out["mem"] = type(e).__name__
out["tokens"] = sorted(tokens)
try:
    open(config, "a").close()
    out["config"] = "writable"
except OSError as e:
    out["config"] = type(e).__name__
result = out
"""

BIG_FILE = """
with open("big", "wb") as f:
    for _ in range(400):
        f.write(b"x" * 2**20)
result = "written"
"""

FORK_MANY = """
import os, time
forked, error = 0, None
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        forked += 1
except OSError as e:
    error = type(e).__name__
result = {"forked": forked, "error": error}
"""

SQUARE = "def main(n):\n    return n * n"

SHELL_DETACH = (
    'setsid sleep "$TAG" >/dev/null 2>&1 </dev/null &\n'
    'i=0; while [ $i -lt 4000 ] && ! pgrep -fx "sleep $TAG" >/dev/null; do i=$((i+1)); done; echo started'
)


def _python(name: str, code: str, inputs: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "input_schema": {"type": "object"},
        "steps": [{"kind": "python", "id": "run", "code": code, "input": inputs}],
    }


def _config(directory: Path) -> Path:
    pipelines = [
        _python("raise_as", RAISE_AS, {}),
        _python("limits", LIMITS, {}),
        _python("hold_reply", HOLD_REPLY, {}),
        _python("detach", DETACH, {"tag": "${args.tag}"}),
        _python("stop_fork_server", STOP_FORK_SERVER, {"target": "${args.target}"}),
        _python("read_server", READ_SERVER, {"pid": "${args.pid}", "config": "${args.config}"}),
        _python("big_file", BIG_FILE, {}),
        _python("fork_many", FORK_MANY, {}),
        _python("square", SQUARE, {"n": "${args.n}"}),
        {
            "name": "shell_detach",
            "input_schema": {"type": "object"},
            "steps": [{"kind": "shell", "id": "run", "env": {"TAG": "${args.tag}"}, "cmds": [SHELL_DETACH]}],
        },
    ]
    doc = {
        "auth": {
            "tokens": [{"env": "ALICE_TOKEN", "principal": "alice"}, {"env": "BOB_TOKEN", "principal": "bob"}],
            "tools": ["*"],
        },
        "outbound": {
            "commands": {"sh": "/bin/sh"},
            "python": {"memory_mb": 128, "max_file_mb": 16, "max_processes": 16, "timeout_ms": 20_000},
        },
        "pipelines": pipelines,
    }
    return write_config(directory, json.dumps(doc), ".json")


async def _call(server: Served, name: str, arguments: dict[str, Any], token: str = ALICE) -> Any:
    async with httpx2.AsyncClient(timeout=120) as http:
        r = await http.post(
            server.url,
            content=json.dumps(call(name, arguments)).encode(),
            headers={**headers(name), "authorization": f"Bearer {token}"},
        )
    assert r.status_code == 200, (r.status_code, r.text[:500])
    return result_of(r.text, r.headers.get("content-type", ""))["result"]


async def _attack(server: Served, name: str, arguments: dict[str, Any] | None = None) -> Any:
    """Call ``name`` with ``/healthz`` probed meanwhile (the slowest under ``server.stall_s``); its result."""
    with trio.fail_after(60):
        answer, slowest = await server.probed(lambda: _call(server, name, arguments or {}))
    assert slowest < server.stall_s, server.health
    return answer


def _ok(answer: Any) -> Any:
    assert answer["isError"] is False, answer["content"][0]["text"][:500]
    if "structuredContent" in answer:
        return answer["structuredContent"]
    text = answer["content"][0]["text"]
    try:
        return json.loads(text)
    except ValueError:
        return text  # a string result is its text


def _failed(answer: Any) -> str:
    assert answer["isError"] is True, answer
    return str(answer["content"][0]["text"])


def _ppid(pid: int) -> int:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return -1
    return int(data[data.rfind(b")") + 2 :].split()[1])


def _fork_servers(server: Served) -> list[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if _ppid(p) == server.proc.pid and b"_zygote.py" in cmdline(p)]


@pytest.fixture
async def server(tmp_path: Path):
    env = {"ALICE_TOKEN": ALICE, "BOB_TOKEN": BOB, "SERVER_SECRET": SECRET}
    async with served(_config(tmp_path), env=env) as s:
        s.config = tmp_path / "mcpipe.json"  # type: ignore[attr-defined]
        yield s


async def _full_isolation(server: Served) -> None:
    # The promises below are those of a root server on a kernel with PID namespaces (this machine, CI).
    if os.geteuid() != 0:
        pytest.skip("the server's workers get a uid of their own only when it runs as root")


async def test_a_step_cannot_raise_its_own_limits_nor_allocate_past_memory_mb(server):
    await _full_isolation(server)
    text = _failed(await _attack(server, "raise_as"))
    assert "LIMIT_EXCEEDED" in text and "ran out of memory (limit 128 MiB)" in text, text
    limits = _ok(await _attack(server, "limits"))
    assert limits["RLIMIT_AS"] == [128 * 2**20] * 2
    assert limits["RLIMIT_FSIZE"] == [16 * 2**20] * 2
    assert limits["RLIMIT_NPROC"] == [16, 16]


async def test_a_forked_child_holding_the_reply_socket_does_not_hold_the_answer(server):
    await _full_isolation(server)
    assert _ok(await _attack(server, "hold_reply")) == "answered"  # within the attack's bound, not 600 s


async def test_a_setsid_grandchild_is_killed_when_its_python_step_ends(server):
    await _full_isolation(server)
    tag = "600.4242"
    assert _ok(await _attack(server, "detach", {"tag": tag})) == "detached"
    with trio.fail_after(10):
        await gone(b"sleep\0" + tag.encode() + b"\0")


async def test_a_shell_steps_setsid_sleep_is_killed_when_its_program_ends(server):
    await _full_isolation(server)
    tag = "600.7777"
    assert _ok(await _attack(server, "shell_detach", {"tag": tag}))["stdout"] == "started\n"
    with trio.fail_after(10):
        await gone(b"sleep\0" + tag.encode() + b"\0")


async def test_a_step_cannot_stop_the_fork_server_and_a_stopped_one_is_replaced(server):
    await _full_isolation(server)
    assert _ok(await _attack(server, "square", {"n": 2})) == 4
    [fork_server] = _fork_servers(server)
    # The step's own attack: the fork server is neither visible to it nor of its uid.
    assert _ok(await _attack(server, "stop_fork_server", {"target": fork_server})) in (
        "ProcessLookupError",
        "PermissionError",
    )
    # Stopped from outside: the warm workers it forked answer, then it is found stopped and replaced.
    os.kill(fork_server, signal.SIGSTOP)
    try:
        for n in range(6):
            assert _ok(await _attack(server, "square", {"n": n})) == n * n
        assert [p for p in _fork_servers(server) if p != fork_server] != []
    finally:
        if _ppid(fork_server) == server.proc.pid:
            os.kill(fork_server, signal.SIGCONT)


async def test_a_step_reads_neither_the_servers_environment_nor_another_callers_token(server):
    await _full_isolation(server)
    for n in range(3):  # bob's bearer token passes through the server's memory
        assert _ok(await _call(server, "square", {"n": n}, token=BOB)) == n * n
    args = {"pid": server.proc.pid, "config": str(server.config)}
    got = _ok(await _attack(server, "read_server", args))
    assert got["uid"] != 0
    assert got["environ"] in ("FileNotFoundError", "PermissionError") and SECRET not in json.dumps(got)
    assert got["mem"] in ("FileNotFoundError", "PermissionError") and got["tokens"] == []
    assert got["config"] == "PermissionError"


async def test_a_step_cannot_write_a_file_past_max_file_mb_nor_fork_past_max_processes(server):
    await _full_isolation(server)
    text = _failed(await _attack(server, "big_file"))
    assert "File too large" in text, text
    got = _ok(await _attack(server, "fork_many"))
    assert got["error"] == "BlockingIOError" and got["forked"] < 16, got
    assert server.alive and "Traceback" not in server.text()
