"""Real servers for the tests, started on free 127.0.0.1 ports in temporary directories and stopped after.

PostgreSQL (Debian's ``postgresql``: ``initdb`` and ``pg_ctl``, run as the ``postgres`` user when the tests
run as root, since PostgreSQL refuses root) and NATS (Debian's ``nats-server``). A test that needs one
skips only when the binaries are absent; CI installs them (``.ci/run``).

Kafka: the tests' own Kafka-protocol broker (``kafkabroker.py``), or with ``MCPIPE_KAFKA=tansu`` tansu, an
Apache-2.0 Kafka-compatible broker (the Rust crate ``tansu``; ``make kafka-tansu`` builds it and runs the Kafka
tests against it): the binary named by ``MCPIPE_TANSU``, else ``tansu`` on PATH.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "free_port",
    "kafka_broker",
    "kafka_kind",
    "listening",
    "nats_server",
    "postgres_server",
    "tansu_broker",
    "wait_for_port",
]


def free_port() -> int:
    """A 127.0.0.1 port free now; another process may take it before the caller binds it (see ``PORT_TRIES``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT_TRIES = 3
"""How many free ports a server of its own is started on before its start is a failure: a port picked free can
be taken (a client's outgoing port, another job's server) before the server binds it, and the server then exits
without listening."""


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 20.0) -> None:
    """Block until something accepts connections on 127.0.0.1:port (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server of its own; yields its URL (user ``postgres``, trust auth, database ``postgres``)."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (Debian's postgresql) are not installed")
    tmp = Path(tempfile.mkdtemp(prefix="mcpipe-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = tmp / "data"

    def run(*argv: str) -> None:
        subprocess.run([*as_user, *argv], check=True, capture_output=True, timeout=120)

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        for attempt in range(PORT_TRIES):
            port = free_port()
            options = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
            try:
                run(
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(tmp / "log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
                break
            except subprocess.CalledProcessError:
                if attempt == PORT_TRIES - 1:
                    raise
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def nats_server(*, jetstream: bool = False) -> Iterator[str]:
    """A ``nats-server`` of its own; yields its URL (``nats://127.0.0.1:PORT``). ``jetstream``: with JetStream
    on (``-js``), its store in a temporary directory removed after."""
    binary = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
    )
    if binary is None:
        pytest.skip("nats-server (Debian's nats-server) is not installed")
    store = Path(tempfile.mkdtemp(prefix="mcpipe-js-")) if jetstream else None
    extra = ["-js", "-sd", str(store)] if store is not None else []
    try:
        with listening(
            lambda port: [binary, "-a", "127.0.0.1", "-p", str(port), *extra], stderr=subprocess.DEVNULL
        ) as port:
            yield f"nats://127.0.0.1:{port}"
    finally:
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)


KAFKA_KINDS = ("python", "tansu")


def kafka_kind() -> str:
    """Which Kafka broker the tests run: ``MCPIPE_KAFKA`` (``python``, the default, or ``tansu``)."""
    kind = os.environ.get("MCPIPE_KAFKA", "").strip() or "python"
    if kind not in KAFKA_KINDS:
        pytest.fail(f"MCPIPE_KAFKA is python or tansu, got {kind!r}", pytrace=False)
    return kind


@contextmanager
def kafka_broker(topics: Sequence[str] = ()) -> Iterator[str]:
    """A Kafka-protocol broker in a process of its own; yields ``127.0.0.1:PORT``.

    The tests' broker (``kafkabroker.py``, which creates a topic on first use), or tansu when
    ``MCPIPE_KAFKA=tansu``: it creates none, so ``topics`` are created first (two partitions each, as the
    tests' broker has)."""
    if kafka_kind() == "tansu":
        with tansu_broker(topics) as bootstrap:
            yield bootstrap
        return
    import sys

    script = Path(__file__).with_name("kafkabroker.py")
    with listening(lambda port: [sys.executable, str(script), str(port)]) as port:
        yield f"127.0.0.1:{port}"


def _tansu_binary() -> str:
    named = os.environ.get("MCPIPE_TANSU", "").strip()
    binary = named or shutil.which("tansu")
    if not binary or not os.access(binary, os.X_OK):
        where = f"MCPIPE_TANSU={named!r} is not an executable" if named else "no tansu on PATH and no MCPIPE_TANSU"
        pytest.fail(f"MCPIPE_KAFKA=tansu: {where} (`make kafka-tansu` installs tansu into .tansu/)", pytrace=False)
    return os.path.abspath(binary)  # it runs in a temporary directory


@contextmanager
def tansu_broker(topics: Sequence[str] = (), partitions: int = 2) -> Iterator[str]:
    """tansu (``tansu broker``) with in-memory storage, listening and advertised on a free 127.0.0.1 port, run
    in a temporary directory; ``topics`` created with ``tansu topic create``. Yields ``127.0.0.1:PORT``; its
    output is kept in the directory's ``log`` and shown if it fails to start or to create a topic."""
    binary = _tansu_binary()
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="mcpipe-tansu-"))
    argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
    argv += ["--storage-engine", "memory://tansu/"]
    try:
        with (tmp / "log").open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
            try:
                try:
                    wait_for_port(port, proc)
                except (RuntimeError, TimeoutError) as e:
                    said = (tmp / "log").read_text(errors="replace").strip()[-2000:]
                    pytest.fail(f"tansu did not start: {e}\n{said}", pytrace=False)
                for topic in topics:
                    create = [binary, "topic", "create", topic, "--broker", url, "--partitions", str(partitions)]
                    done = subprocess.run(create, capture_output=True, timeout=60, cwd=tmp)
                    if done.returncode != 0:
                        said = (done.stderr or done.stdout).decode(errors="replace").strip()
                        pytest.fail(f"tansu did not create topic {topic!r}: {said}", pytrace=False)
                yield f"127.0.0.1:{port}"
            finally:
                _stop(proc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def listening(argv_of: Callable[[int], list[str]], **popen: Any) -> Iterator[int]:
    """Run ``argv_of(port)`` on a free port until the block ends, once it listens there; then stop it (``_stop``).
    Yields the port; a server that exits before it listens (its port taken meanwhile) is started again on another
    (``PORT_TRIES``)."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    for attempt in range(PORT_TRIES):
        port = free_port()
        proc = subprocess.Popen(argv_of(port), **popen)
        try:
            wait_for_port(port, proc)
            break
        except RuntimeError:  # it exited before it listened
            _stop(proc)
            if attempt == PORT_TRIES - 1:
                raise
        except BaseException:
            _stop(proc)
            raise
    try:
        yield port
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc``, killed if it has not ended after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
