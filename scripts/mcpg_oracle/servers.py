"""Running a server under test for the oracle: the real mcpg binary, or ``mcpipe serve --config``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from kit.mcpg_oracle import mcp_url, wait_http  # noqa: E402

MCPG = ROOT / ".mcpg" / "bin" / "mcpg"
PLUGINS = ROOT / ".mcpg" / "plugins"


class BootFailed(RuntimeError):
    """The server did not come up; ``log`` is what it printed."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCPG_")}
    env.update(extra)
    return env


def _announced(log: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP at (\S+)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"mcpipe serve exited with {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError(f"mcpipe serve did not say where it serves within {timeout} s")


@contextmanager
def serving(which: str, config: Path, port: int, env: dict[str, str], log: Path) -> Iterator[str]:
    """Run ``which`` (``mcpg`` or ``mcpipe``) on ``config`` (it listens on 127.0.0.1:``port``, which the
    config's ``gateway.server.bind_address`` names); yields the MCP URL once its health path answers."""
    text = config.read_text()
    mcp_path, health_path = mcp_url(text)
    if which == "mcpg":
        if not MCPG.exists():
            raise SystemExit(f"{MCPG} is missing: it is built outside this repository (docs/formats/mcpg.md)")
        argv = [str(MCPG)]
        env = _clean_env({**env, "MCPG_CONFIG": str(config), "RUST_LOG": "warn", "NO_COLOR": "1"})
    else:
        argv = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config)]
        env = _clean_env({**env, "PYTHONPATH": str(ROOT / "python")})
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=config.parent)
    try:
        try:
            if which == "mcpg":
                wait_http(f"http://127.0.0.1:{port}{health_path}", 90, alive=lambda: proc.poll() is None)
                url = f"http://127.0.0.1:{port}{mcp_path}"
            else:
                # mcpipe says where it serves (the config's bind_address and mcp_path, if its mcpg
                # front-end honours them; elsewhere otherwise, which the diff then shows).
                url = _announced(log, proc, 90)
        except (RuntimeError, TimeoutError) as e:
            raise BootFailed(str(e), log.read_text(errors="replace")) from None
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
