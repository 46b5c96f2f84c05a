"""Real servers for the tests, started on free 127.0.0.1 ports in temporary directories and stopped after.

PostgreSQL (Debian's ``postgresql``: ``initdb`` and ``pg_ctl``, run as the ``postgres`` user when the tests
run as root, since PostgreSQL refuses root) and NATS (Debian's ``nats-server``). A test that needs one
skips only when the binaries are absent; CI installs them (``.ci/run``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = ["free_port", "kafka_broker", "nats_server", "postgres_server", "wait_for_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    port = free_port()

    def run(*argv: str) -> None:
        subprocess.run([*as_user, *argv], check=True, capture_output=True, timeout=120)

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(tmp / "log"), "-w", "-t", "60", "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def nats_server() -> Iterator[str]:
    """A ``nats-server`` of its own; yields its URL (``nats://127.0.0.1:PORT``)."""
    binary = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
    )
    if binary is None:
        pytest.skip("nats-server (Debian's nats-server) is not installed")
    port = free_port()
    with _listening([binary, "-a", "127.0.0.1", "-p", str(port)], port, stderr=subprocess.DEVNULL):
        yield f"nats://127.0.0.1:{port}"


@contextmanager
def kafka_broker() -> Iterator[str]:
    """The tests' Kafka-protocol broker (``kafkabroker.py``) in a process of its own; yields ``127.0.0.1:PORT``."""
    import sys

    port = free_port()
    script = Path(__file__).with_name("kafkabroker.py")
    with _listening([sys.executable, str(script), str(port)], port):
        yield f"127.0.0.1:{port}"


@contextmanager
def _listening(argv: list[str], port: int, **popen: Any) -> Iterator[None]:
    """Run ``argv`` until the block ends, once it listens on ``port``; then terminate it (killed after 10 s)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, **popen)
    try:
        wait_for_port(port, proc)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
