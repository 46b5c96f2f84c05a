"""Time README's first command from a fresh clone: ``make serve`` until ``/healthz`` answers.

Usage: ``python scripts/quickstart_time.py [SOURCE] [--label NAME]``: clones SOURCE (a repository path,
default: this one) into a temporary folder and runs ``make serve`` there with empty caches (a throwaway
``PIP_CACHE_DIR``, ``UV_CACHE_DIR``, ``CARGO_HOME`` and ``CARGO_TARGET_DIR``: crates and wheels are downloaded
again), serving on a free port. Prints the seconds to the first answer, the CPU time of the whole make tree
(user + sys: what the machine's other load does not change much) and the load average before and after, then
stops the server and removes the caches. Each output line of ``make serve`` is kept with its time in
``serve.log`` beside the clone. docs/performance.md ("Quick start") has the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", default=str(Path(__file__).parents[1]))
    parser.add_argument("--label", default="make serve")
    parser.add_argument("--timeout", type=float, default=1200)
    ns = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="mcpipe-quickstart-"))
    clone = base / "fresh"
    subprocess.run(["git", "clone", "-q", ns.source, str(clone)], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caches = {
        "PIP_CACHE_DIR": base / "pip-cache",
        "UV_CACHE_DIR": base / "uv-cache",
        "CARGO_HOME": base / "cargo-home",
        "CARGO_TARGET_DIR": base / "target",
    }
    env = {**os.environ, **{k: str(v) for k, v in caches.items()}, "PIP_FIND_LINKS": ""}
    log = (base / "serve.log").open("w")
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["make", "serve", f"ARGS=--http 127.0.0.1:{port}"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = 0

    def pump() -> None:
        nonlocal lines
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(f"{time.monotonic() - t0:7.1f} {line}")
            log.flush()
            lines += 1

    threading.Thread(target=pump, daemon=True).start()
    ready = None
    while time.monotonic() - t0 < ns.timeout and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    ready = time.monotonic() - t0
                    break
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    load_after = os.getloadavg()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    for path in caches.values():
        shutil.rmtree(path, ignore_errors=True)
    shown = f"{ready:.1f} s" if ready is not None else "never"
    print(
        f"{ns.label}: first answer after {shown}; CPU {usage.ru_utime + usage.ru_stime:.1f} s; "
        f"{lines} lines of progress; load {load_before[0]:.1f} before, {load_after[0]:.1f} after; log {base}/serve.log"
    )
    return 0 if ready is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
