"""The sandbox's fallbacks: where a kernel (or the operator's policy) gives a python step no PID namespace, or
no uid of its own, what it detaches is still killed when it ends (the fork server is a child subreaper, and
a worker with a uid of its own kills every process of that uid)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from kit.declared import compiled, env
from kit.processes import detaching, gone
from mcpipe._sandbox import isolation
from mcpipe.declared import StepPolicy
from mcpipe.kinds import PythonPolicy
from mcpipe.tools._base import ToolContext

DETACH = detaching('[os.getuid(), os.readlink("/proc/self/ns/pid")]')


@pytest.mark.parametrize(
    ("separate_uid", "namespaces", "tag"),
    [(True, False, "600.5151"), (False, False, "600.5252"), (False, True, "600.5353"), (True, True, "600.5454")],
    ids=["own-uid-no-pidns", "server-uid-no-pidns", "server-uid-pidns", "own-uid-pidns"],
)
async def test_what_a_step_detaches_is_killed_when_it_ends_whatever_the_isolation(separate_uid, namespaces, tag):
    iso = await isolation()
    policy = StepPolicy(python=PythonPolicy(separate_uid=separate_uid, namespaces=namespaces, timeout_ms=20_000))
    step = compiled({"kind": "python", "code": DETACH, "input": {"tag": tag}}, policy)
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert out.ok, out.error
    uid, namespace = out.output
    assert (uid != os.getuid()) == (separate_uid and iso.uid)
    assert (namespace != os.readlink("/proc/self/ns/pid")) == (namespaces and iso.pidns)
    with trio.fail_after(10):
        await gone(b"sleep\0" + tag.encode() + b"\0")


async def test_the_probe_says_what_this_machine_gives_a_worker():
    iso = await isolation()
    assert iso.dumpable and iso.subreaper
    if os.geteuid() == 0:  # this machine and CI: root, a kernel with PID namespaces
        assert (iso.uid, iso.pidns, iso.proc) == (True, True, True), iso.reasons


@pytest.mark.parametrize(
    ("separate_uid", "namespaces"),
    [(True, False), (False, False), (False, True), (True, True)],
    ids=["own-uid-no-pidns", "server-uid-no-pidns", "server-uid-pidns", "own-uid-pidns"],
)
async def test_a_step_imports_a_standard_module_the_fork_server_has_not_whatever_the_isolation(
    separate_uid, namespaces
):
    # A uid of its own cannot read Python's files under a /root of mode 0700 (this machine's pyenv): they
    # are revealed to it in a mount namespace of its own, with or without a PID namespace.
    policy = StepPolicy(python=PythonPolicy(separate_uid=separate_uid, namespaces=namespaces, timeout_ms=20_000))
    code = "import sys\nfresh = 'csv' not in sys.modules\nimport csv\nresult = [fresh, csv.QUOTE_ALL]"
    step = compiled({"kind": "python", "code": code}, policy)
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert out.ok, out.error
    assert out.output == [True, 1]


async def _ended(fd: int) -> None:
    """Wait (bounded by the caller) until the process of pidfd ``fd`` has ended."""
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


async def test_the_fork_server_outlives_the_thread_that_started_it():
    # The server starts it from a thread of Trio's cache, which ends after 10 s without work; the kernel's
    # parent-death signal follows that thread, and it had been SIGKILL: every worker died with it, mid-step.
    import threading

    from mcpipe._sandbox import SANDBOX

    SANDBOX.stop()
    starter = threading.Thread(target=SANDBOX._current)
    starter.start()
    starter.join()
    zygote = SANDBOX._zygote
    assert zygote is not None
    step = compiled({"kind": "python", "code": "result = 6 * 7"}, StepPolicy(python=PythonPolicy(timeout_ms=20_000)))
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert (out.ok, out.output) == (True, 42), out.error
    assert SANDBOX._zygote is zygote and zygote.proc.poll() is None


KILLED_SERVER = """
import json, sys, threading, trio
from mcpipe.kinds import _pyworker
from mcpipe._sandbox import SANDBOX, Shape
from mcpipe._workerpool import WorkerPool

async def main():
    pool = WorkerPool("python", _pyworker._SPAWNER, size=2, reuse=False, spares=1)
    shape = _pyworker.python_shape(True, True)
    starter = threading.Thread(target=SANDBOX._current)  # as Trio's cache would, a thread that then ends
    starter.start()
    starter.join()
    pool.prefork(1, key=shape)
    worker, _ = pool._checkout(shape)
    await worker.start()
    pool.prefork(1, key=shape)  # a spare besides, forked and waiting
    spare = next(w for w in pool._idle if w is not worker)
    await spare.start()
    print(json.dumps([SANDBOX._zygote.proc.pid, worker.pid, worker.worker.cwd, spare.worker.cwd]), flush=True)
    sys.stdin.read()

trio.run(main)
"""


async def test_the_fork_server_and_its_workers_end_when_the_server_is_killed_their_directories_removed():
    import signal
    import subprocess
    import sys

    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", KILLED_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some()
                assert chunk, "the server ended before it had a worker"
                line += chunk
            zygote_pid, worker_pid, *dirs = json.loads(line)
            zygote, worker = os.pidfd_open(zygote_pid), os.pidfd_open(worker_pid)  # both alive
            assert all([await trio.Path(d).is_dir() for d in dirs])
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        await _ended(zygote)
        await _ended(worker)
        left = [(d, sorted(os.listdir(d))) for d in dirs if await trio.Path(d).exists()]
        assert not left, (left, zygote_pid)  # removed before the fork server ended


@pytest.mark.parametrize(
    "code",
    [
        "import os\nresult = os.getcwd()",
        "import os\nopen('left.txt', 'w').write('x')\nos.mkdir('d')\nresult = os.getcwd()",
    ],
    ids=["left-empty", "left-files"],
)
async def test_a_workers_directory_is_removed_once_it_ended_empty_or_not(code):
    step = compiled({"kind": "python", "code": code}, StepPolicy(python=PythonPolicy(timeout_ms=20_000)))
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
        assert out.ok, out.error
        cwd = trio.Path(out.output)
        assert cwd.name.startswith("mcpipe-py-")
        while await cwd.exists():  # noqa: ASYNC110 (the reaper thread removes it: no event to wait on)
            await trio.sleep(0.01)


CLAIM = """
import sys
from mcpipe._sandbox import claim_uid_base
print(claim_uid_base(sys.argv[1])[0], flush=True)
"""


def test_two_servers_on_one_host_claim_different_uid_blocks_and_a_block_is_free_again_when_its_server_ends(
    tmp_path,
):
    import subprocess
    import sys

    from mcpipe._sandbox import UID_BASE, UID_BLOCK, claim_uid_base

    locks = str(tmp_path / "uids")
    base, fd = claim_uid_base(locks)
    assert (base, fd is not None) == (UID_BASE, True)
    try:
        other = subprocess.run([sys.executable, "-c", CLAIM, locks], capture_output=True, text=True, check=True)
        assert int(other.stdout) == UID_BASE + UID_BLOCK  # while this one holds the first
    finally:
        assert fd is not None
        os.close(fd)
    again = subprocess.run([sys.executable, "-c", CLAIM, locks], capture_output=True, text=True, check=True)
    assert int(again.stdout) == UID_BASE


def test_a_uid_lock_directory_another_user_could_write_is_not_trusted(tmp_path):
    from mcpipe._sandbox import UID_BASE, UID_BLOCK, UID_BLOCKS, claim_uid_base

    locks = tmp_path / "uids"
    locks.mkdir(mode=0o777)
    locks.chmod(0o777)
    base, fd = claim_uid_base(str(locks))
    assert fd is None and base == UID_BASE + (os.getpid() % UID_BLOCKS) * UID_BLOCK
    assert not list(locks.iterdir())


TESTS = str(Path(__file__).resolve().parents[1])

WORKER_UID = """
import trio
from kit.declared import compiled, env
from mcpipe.declared import StepPolicy
from mcpipe.kinds import PythonPolicy
from mcpipe.tools._base import ToolContext

async def main():
    step = compiled({"kind": "python", "code": "import os; result = os.getuid()"},
                    StepPolicy(python=PythonPolicy(timeout_ms=20_000)))
    out = await step.execute(env(), ToolContext())
    print(out.output, flush=True)

trio.run(main)
"""


async def test_another_server_on_the_host_runs_its_workers_under_other_uids():
    # A worker's end kills every process of its uid (when it has no PID namespace of its own): two servers
    # handing out the same uids would kill each other's workers, and their workers could signal each other.
    import subprocess
    import sys

    iso = await isolation()
    if not iso.uid:
        pytest.skip("workers keep the server's uid here (the server is not root)")
    step = compiled({"kind": "python", "code": "import os; result = os.getuid()"}, StepPolicy(python=PythonPolicy()))
    with trio.fail_after(30):
        ours = await step.execute(env(), ToolContext())
    theirs = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", WORKER_UID],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": TESTS},
        )
    )
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    assert ours.ok and int(theirs.stdout) != ours.output


WARMTH_ROLE = """\
import json, os

WARMED = []


def warm():  # the walk ahead of a request (``_zygote._rehearse``, for a role without a SAMPLE)
    WARMED.append(True)
    os.close(os.open(os.path.join(MARKS, str(os.getpid())), os.O_CREAT | os.O_WRONLY, 0o600))


def handle(header, body):
    with open("/proc/self/sched") as f:  # (Linux 6.12+ shows the slice it asked for: sched_runtime)
        slices = [int(line.split(":")[1]) for line in f if line.startswith("se.slice")]
    return json.dumps({"warmed": bool(WARMED), "slice_ns": slices[0] if slices else None}).encode()
"""


async def test_a_worker_forked_while_the_cores_are_busy_with_steps_neither_walks_ahead_nor_takes_the_short_slice(
    tmp_path,
):
    from mcpipe._sandbox import BUSY_AT, SLICE_US, Output, Sandbox, Shape, exchange, request_frame

    marks = tmp_path / "marks"
    marks.mkdir()
    role = tmp_path / "warmth_role.py"
    role.write_text(f"MARKS = {str(marks)!r}\n" + WARMTH_ROLE)
    sandbox = Sandbox()  # of its own: the role is not registered with the server's
    sandbox.register_role("warmth", str(role))
    shape = Shape("warmth", separate_uid=False, namespaces=False)

    async def ask(worker) -> dict[str, object]:
        got = await exchange(worker, request_frame(b"{}", b"{}"), Output(1000), 1000)
        assert got.reply is not None
        return json.loads(got.reply)

    try:
        with trio.fail_after(30):
            idle = await sandbox.take(shape)  # forked with no other worker in use
            for _ in range(3000):  # until it has walked (a file it makes then)
                if (marks / str(idle.pid)).exists():
                    break
                await trio.sleep(0.01)
            calm = await ask(idle)
            sandbox.release(idle)

            held = [await sandbox.take(shape) for _ in range(BUSY_AT)]  # as many steps as cores
            busy_worker = await sandbox.take(shape)
            await trio.sleep(0.5)  # far longer than a walk takes: had it walked, it would have by now
            busy = await ask(busy_worker)
            assert not (marks / str(busy_worker.pid)).exists()
            for worker in [*held, busy_worker]:
                sandbox.release(worker)
    finally:
        sandbox.stop()
    assert calm["warmed"] and not busy["warmed"]
    if calm["slice_ns"] == SLICE_US * 1000:  # (a kernel that takes a slice: Linux 6.12+, this machine and CI)
        assert busy["slice_ns"] != calm["slice_ns"], busy


def test_the_sandboxs_system_calls_say_which_call_failed_and_why():
    import errno

    from mcpipe import _core

    cases = [
        (lambda: _core.sys_prctl(99_999, 0), errno.EINVAL, "prctl(99999): Invalid argument"),
        (lambda: _core.sys_setns(-1, 0), errno.EBADF, "setns: Bad file descriptor"),
        (lambda: _core.sys_unshare(-1), errno.EINVAL, "unshare: Invalid argument"),
        (lambda: _core.sys_mount(None, "/no/such/dir", None, 0), errno.ENOENT, "mount /no/such/dir: No such file"),
    ]
    for call, code, said in cases:
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == code and str(e.value.strerror).startswith(said), e.value
    with pytest.raises(ValueError, match="NUL"):
        _core.sys_mount(None, "/tmp\0x", None, 0)


def test_the_fork_server_says_why_it_cannot_start_a_worker_and_goes_on_serving(tmp_path):
    import socket
    import subprocess
    import sys

    from mcpipe._sandbox import _LAUNCH, _SCRIPT, fork_server_env
    from mcpipe.kinds import _pyexec

    work = tmp_path / "work"
    work.mkdir()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    config = {"uid_base": 0, "roles": {"python": _pyexec.__file__}, "slice_us": 0, "tmp": str(work)}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", _LAUNCH, _SCRIPT, str(theirs.fileno()), json.dumps(config)],
        pass_fds=(theirs.fileno(),),
        env=fork_server_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    theirs.close()
    ours.settimeout(30)

    def spawn() -> tuple[dict[str, object], socket.socket, socket.socket]:
        st, st_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        io, io_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = {"op": "spawn", "role": "python", "uid": None, "separate_uid": False, "pidns": True}
        socket.send_fds(ours, [json.dumps(request).encode()], [st_theirs.fileno(), io_theirs.fileno(), out_w, err_w])
        for fd in (out_r, out_w, err_r, err_w):  # (the worker prints nothing)
            os.close(fd)
        st_theirs.close()
        io_theirs.close()
        st.settimeout(30)
        answer, fds, _, _ = socket.recv_fds(st, 65536, 1)
        for fd in fds:
            os.close(fd)
        return json.loads(answer), st, io

    try:
        assert "hello" in json.loads(ours.recv(1 << 20))
        work.rmdir()  # where its workers' directories go, gone
        answer, st, io = spawn()
        assert str(answer["error"]).startswith("cannot start a worker: [Errno 2]"), answer
        assert str(work) in str(answer["error"])
        st.close()
        io.close()

        work.mkdir()  # back: the next request gets a worker
        answer, st, io = spawn()
        assert answer["loops"] is False and Path(str(answer["cwd"])).parent == work, answer
        assert Path(str(answer["cwd"])).is_dir()
        io.close()  # the end of its requests: it ends, and the fork server says so once its directory is gone
        assert json.loads(st.recv(65536)) == {"exit": 0}
        assert not Path(str(answer["cwd"])).exists()
        st.close()
    finally:
        ours.close()  # the server gone: the fork server ends
        assert proc.wait(30) == 0
