"""Running the image ``make image`` builds (deploy/container/Containerfile) under podman, for the tests.

Two things of this machine's are handled here, as ``make image`` does: crun cannot start a container on a
host with hybrid cgroups (v1 controllers and v2 mounted side by side), so runc is used where it is
installed; and podman's default limits (a million descriptors) are above this machine's hard limits, which
the runtime may not raise, so the container gets the hard limits (at most 65536 descriptors, 4096 tasks).
``MCPIPE_PODMAN_FLAGS`` replaces both (``make image-test`` passes its own ``PODMAN_FLAGS``).
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import subprocess

import pytest

__all__ = ["exec_in", "image_or_skip", "logged", "podman", "podman_flags"]


def podman() -> str:
    exe = shutil.which("podman")
    if exe is None:
        pytest.fail("podman is not installed (apt-get install podman)")
    return exe


def image_or_skip() -> str:
    """The image under test (``MCPIPE_IMAGE``, set by ``make image-test``); the test is skipped without it:
    building it takes minutes, more than the 2-core CI run has for it."""
    image = os.environ.get("MCPIPE_IMAGE", "")
    if not image:
        pytest.skip("MCPIPE_IMAGE is not set: `make image-test` builds the image and runs this test")
    return image


def _limit(which: int, cap: int) -> int:
    _, hard = resource.getrlimit(which)
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def podman_flags() -> list[str]:
    given = os.environ.get("MCPIPE_PODMAN_FLAGS")
    if given is not None:
        return shlex.split(given)
    flags = ["--runtime", "runc"] if shutil.which("runc") else []
    nofile, nproc = _limit(resource.RLIMIT_NOFILE, 65536), _limit(resource.RLIMIT_NPROC, 4096)
    return [*flags, "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


async def exec_in(name: str, *command: str) -> subprocess.CompletedProcess[str]:
    """``podman exec`` in the running container ``name``: its status and output as text."""
    import trio

    done = await trio.run_process([podman(), "exec", name, *command], check=False, capture_stdout=True)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(errors="replace"), "")


async def logged(container: str, needle: str, times: int = 1) -> None:
    """Follow the log of the container ``container`` until it says ``needle`` ``times`` times (the caller
    bounds the wait); fails when the container ends first."""
    import trio

    follow = [podman(), "logs", "-f", container]
    proc = await trio.lowlevel.open_process(follow, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen = b""
    try:
        while seen.count(needle.encode()) < times:
            chunk = await proc.stdout.receive_some()
            assert chunk, f"{container} ended before saying {needle!r}: {seen.decode(errors='replace')}"
            seen += chunk
    finally:
        proc.kill()
        await proc.wait()
