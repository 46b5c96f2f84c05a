"""``mcpipe serve`` under systemd: the listening socket a service manager passes (socket activation, as
``deploy/systemd/mcpipe.socket`` does), and the options its unit sets through the environment.

systemd's own ``systemd-socket-activate`` stands for the service manager: it binds the address, then execs
mcpipe with the socket as descriptor 3 and ``LISTEN_PID``/``LISTEN_FDS`` set, exactly as PID 1 does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from mcp import Client

from kit.realservers import free_port
from kit.servers import start_process
from mcpipe.server.cli import add_arguments, from_environment

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),  # the SDK client's SSE reader
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 60
TOOLS = str(Path(__file__).parent.parent / "kit")


def _activate() -> str:
    exe = shutil.which("systemd-socket-activate")
    if exe is None:
        pytest.fail("systemd-socket-activate is not installed (apt-get install systemd; .ci/run installs it)")
    return exe


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "mcpipe.json"
    config.write_text(json.dumps({"audit": {"enabled": False}, "python_tools": ["worker_tools:tools"]}))
    return config


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([TOOLS, os.environ.get("PYTHONPATH", "")])}


def _activating(*listen: int) -> list[str]:
    """systemd-socket-activate listening on ``listen``, passing on only the variables it is told to (``-E``),
    as a unit's environment is only what the unit sets."""
    args = [_activate(), *(f"--listen=127.0.0.1:{port}" for port in listen)]
    return [*args, *(f"--setenv={k}={v}" for k, v in _env().items()), sys.executable, "-m", "mcpipe", "serve"]


async def _stop(proc: trio.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(WAIT_S):
        return await proc.wait()


async def test_mcpipe_serves_the_socket_systemd_passes_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    args = [*_activating(port), "--config", str(_config(tmp_path))]
    with trio.fail_after(WAIT_S):
        # systemd-socket-activate starts mcpipe on the first connection, which waits in the socket's backlog
        proc, _ = await start_process(args, marker="Listening on ")
        try:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                who = await client.call_tool("whoami", {})
                assert who.structured_content == {"pid": proc.pid}  # the process systemd exec'd serves
                piped = await client.call_tool("mcp_pipe", {"steps": [{"id": "w", "tool": "whoami", "args": {}}]})
                assert piped.structured_content is not None and piped.structured_content["ok"] is True
        finally:
            status = await _stop(proc)
    assert status == 0


async def test_with_workers_every_worker_serves_the_passed_socket(tmp_path: Path) -> None:
    port = free_port()
    args = [*_activating(port), "--workers", "2", "--config", str(_config(tmp_path))]
    with trio.fail_after(WAIT_S):
        proc, _ = await start_process(args, marker="Listening on ")
        try:
            served = set()
            while len(served) < 2:  # the kernel spreads new connections over both workers
                async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                    result = await client.call_tool("whoami", {})
                    assert result.structured_content is not None
                    served.add(result.structured_content["pid"])
            assert proc.pid not in served  # the supervisor hands the socket on and serves nothing itself
        finally:
            status = await _stop(proc)
    assert status == 0


async def test_several_passed_sockets_are_refused_in_one_line(tmp_path: Path) -> None:
    a, b = free_port(), free_port()
    args = _activating(a, b)
    with trio.fail_after(WAIT_S):
        proc, _ = await start_process(args, marker="Listening on ")
        # the first connection makes systemd-socket-activate exec mcpipe, which refuses the two sockets
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", a))
            assert proc.stderr is not None
            err = b""
            async for chunk in proc.stderr:
                err += chunk
            status = await proc.wait()
    assert status == 2
    lines = err.decode().strip().splitlines()
    assert lines[-1] == "mcpipe serve: error: socket activation passed LISTEN_FDS=2: mcpipe serves one listening socket"
    assert "Traceback" not in err.decode()


async def test_serve_takes_its_config_address_and_log_level_from_the_environment(tmp_path: Path) -> None:
    port = free_port()
    env = {**_env(), "MCPIPE_CONFIG": str(_config(tmp_path)), "MCPIPE_HTTP": f"127.0.0.1:{port}"}
    env["MCPIPE_LOG_LEVEL"] = "Info"  # case-insensitive
    with trio.fail_after(WAIT_S):
        proc, url = await start_process([sys.executable, "-m", "mcpipe", "serve"], env=env)
        try:
            assert url == f"http://127.0.0.1:{port}/mcp"
            async with Client(url) as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
            assert "whoami" in names  # the config MCPIPE_CONFIG names is served
        finally:
            status = await _stop(proc)
    assert status == 0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MCPIPE_HTTP", "here", "MCPIPE_HTTP='here': not HOST:PORT: 'here'"),
        ("MCPIPE_WORKERS", "0", "MCPIPE_WORKERS='0': must be between 1 and 256: 0"),
        ("MCPIPE_WORKERS", "two", "MCPIPE_WORKERS='two': not a number: 'two'"),
        ("MCPIPE_LOG_LEVEL", "loud", "MCPIPE_LOG_LEVEL='loud': not a log level (one of debug, info, warning, error)"),
    ],
)
def test_a_bad_environment_value_is_one_line_naming_the_variable(variable: str, value: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", "serve"],
        env={**os.environ, variable: value},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == f"mcpipe serve: error: {message}\n"


def _options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_an_option_on_the_command_line_wins_over_its_variable() -> None:
    env = {"MCPIPE_HTTP": "0.0.0.0:80", "MCPIPE_WORKERS": "4", "MCPIPE_CONFIG": "/etc/x.toml"}
    ns = _options("--http", "127.0.0.1:9000", "--workers", "2", "--config", "mine.toml")
    assert from_environment(ns, env) is None
    assert (ns.http, ns.workers, ns.config, ns.log_level) == (("127.0.0.1", 9000), 2, "mine.toml", "info")
    ns = _options()
    assert from_environment(ns, {**env, "MCPIPE_LOG_LEVEL": "Debug"}) is None
    assert (ns.http, ns.workers, ns.config, ns.log_level) == (("0.0.0.0", 80), 4, "/etc/x.toml", "debug")


def test_stdio_on_the_command_line_ignores_the_address_variable() -> None:
    ns = _options("--stdio")
    assert from_environment(ns, {"MCPIPE_HTTP": "0.0.0.0:80"}) is None
    assert ns.http is None and ns.stdio


def test_python_tools_that_do_not_import_are_one_located_line_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "mcpipe.json"
    config.write_text(json.dumps({"python_tools": ["no_such_module_here:tools"]}))
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: python_tools[0]: cannot load `no_such_module_here:tools`: "), done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_file_the_server_cannot_write_is_named_not_taken_for_the_port(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    config = tmp_path / "mcpipe.json"
    config.write_text(json.dumps({"audit": {"path": str(tmp_path / "not-a-dir" / "audit.jsonl")}}))
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"mcpipe serve: error: {tmp_path}/not-a-dir/audit.jsonl: not a directory"
    assert "Traceback" not in done.stderr and "cannot listen" not in done.stderr
