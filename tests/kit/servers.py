"""Servers for the tests: configs, apps in memory, real HTTP servers on 127.0.0.1, server processes."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from kit.tools import test_tools
from mcpipe.config import Config, parse_config
from mcpipe.gateway import AuditLog
from mcpipe.server import App, open_app, serve_http

DOWNSTREAM = str(Path(__file__).with_name("downstream_server.py"))
EVERYTHING = str(Path(__file__).parent.parent / "conformance" / "everything_server.py")
"""The conformance suite's everything-server, written with the SDK (resources, prompts, logging, ...)."""
ERAS = ["2026-07-28", "legacy"]
"""The two protocol eras: a modern version pin (stateless), and the 2025-11-25 initialize handshake."""


def make_config(environ: dict[str, str] | None = None, **doc: Any) -> Config:
    """A config from keyword sections; no audit file unless ``audit`` is given."""
    doc.setdefault("audit", {"enabled": False})
    return parse_config(json.dumps(doc), "json", environ=environ or {})


async def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (valid a day) and its key, made by openssl in ``directory``: for the tests'
    HTTPS servers."""
    cert, key = directory / "server.crt", directory / "server.key"
    await trio.run_process(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        capture_stdout=True, capture_stderr=True,
    )  # fmt: skip
    return cert, key


def stdio_downstream(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [DOWNSTREAM], **extra}


def everything_downstream(**extra: Any) -> dict[str, Any]:
    """The everything-server as a stdio downstream."""
    return {"command": sys.executable, "args": [EVERYTHING], **extra}


@asynccontextmanager
async def running(config: Config | None = None, audit: AuditLog | None = None, **kw: Any) -> AsyncIterator[App]:
    """An app with the test tools beside the built-ins."""
    async with open_app(config or make_config(), extra_sources=[test_tools], audit=audit, **kw) as app:
        yield app


@asynccontextmanager
async def http_server(app: App, **kw: Any) -> AsyncIterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1; yields the MCP URL; stops gracefully on exit."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait, **kw))
        try:
            yield url
        finally:
            stop.set()


async def start_process(
    args: list[str], env: dict[str, str] | None = None, marker: str = "serving MCP at ", stream: str = "stderr"
) -> tuple[trio.Process, str]:
    """Start a server process and read its ``stream`` up to the line that names its URL (after ``marker``)."""
    import os
    import subprocess

    env = {**os.environ, **(env or {})}
    pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    pipes[stream] = subprocess.PIPE
    proc = await trio.lowlevel.open_process(args, env=env, **pipes)
    buf = b""
    out = proc.stderr if stream == "stderr" else proc.stdout
    assert out is not None
    needle = marker.encode() or b"\n"
    while needle not in buf:
        chunk = await out.receive_some()
        if not chunk:
            raise RuntimeError(f"server exited before listening: {buf.decode(errors='replace')}")
        buf += chunk
    line = (buf.split(needle, 1)[1] if marker else buf).split(b"\n", 1)[0]
    return proc, line.decode().strip()
