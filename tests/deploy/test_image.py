"""The container image (deploy/container/Containerfile), started with ``podman run`` as an operator would:
it serves ``mcp_pipe`` to a real MCP client over the published port, runs as a user who is not root, has no
compiler, answers its HEALTHCHECK, takes a mounted config and the environment, and exits 0 on SIGTERM.

``make image-test`` builds the image (``make image``) and runs these with ``MCPIPE_IMAGE`` set; without it
they are skipped (the build takes minutes on 2 cores, see docs/deployment.md).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx2
import pytest
import trio
from mcp import Client

from kit.clients import bearer_client
from kit.containers import exec_in, image_or_skip, podman, podman_flags
from kit.realservers import free_port
from kit.servers import start_process

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),  # the SDK client's SSE reader
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 120
SERVE_MOUNTED = ["serve", "--config", "/etc/mcpipe/mcpipe.toml"]
PIPELINE = {
    "steps": [
        {"id": "a", "tool": "echo", "args": {"text": "from the image"}},
        {"id": "b", "tool": "text_join", "args": {"items": ["${steps.a.structured.text}", "ok"], "sep": ": "}},
    ],
    "return": "${steps.b.structured.text}",
}


def _run(name: str, port: int, *extra: str) -> list[str]:
    return [podman(), "run", "--rm", "--name", name, *podman_flags(), "-p", f"127.0.0.1:{port}:8765", *extra]


async def _workers_serving(proc: trio.Process, workers: int) -> None:
    """Read the log on until each worker says it serves (the supervisor says so before they do)."""
    assert proc.stderr is not None
    seen = b""
    while seen.count(b"serving MCP at ") < workers:
        chunk = await proc.stderr.receive_some()
        assert chunk, seen.decode(errors="replace")
        seen += chunk


async def _sigterm_and_wait(name: str, proc: trio.Process) -> tuple[int, str]:
    """SIGTERM to the container's first process (what `podman stop` and Kubernetes send); its exit status
    (``podman run`` exits with the container's) and the rest of its log."""
    await trio.run_process([podman(), "kill", "--signal", "TERM", name], capture_stdout=True, capture_stderr=True)
    assert proc.stderr is not None
    rest = b""
    async for chunk in proc.stderr:
        rest += chunk
    return await proc.wait(), rest.decode(errors="replace")


async def test_the_image_serves_mcp_pipe_as_a_user_who_is_not_root_and_exits_0_on_sigterm() -> None:
    image = image_or_skip()
    port = free_port()
    name = f"mcpipe-test-{port}"
    with trio.fail_after(WAIT_S):
        proc, url = await start_process(_run(name, port, image))
        try:
            assert url == "http://0.0.0.0:8765/mcp"  # the image's MCPIPE_HTTP: every interface of the container
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                answer = await client.call_tool("mcp_pipe", PIPELINE)
            assert {"mcp_pipe", "echo", "text_join"} <= names  # the embedded default config
            assert answer.structured_content is not None
            assert answer.structured_content["ok"] is True
            assert answer.structured_content["result"] == "from the image: ok"

            status = (await exec_in(name, "cat", "/proc/1/status")).stdout
            uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
            assert set(uids) == {"10001"}, status  # real, effective, saved and filesystem uid: mcpipe's
            assert "mcpipe" in (await exec_in(name, "cat", "/proc/1/cmdline")).stdout
            compilers = await exec_in(name, "sh", "-c", "command -v gcc cc c++ clang rustc cargo pip pip3")
            assert compilers.stdout == "" and compilers.returncode != 0
            health = await trio.run_process([podman(), "healthcheck", "run", name], check=False, capture_stderr=True)
            assert health.returncode == 0, health.stderr
        finally:
            status_code, log = await _sigterm_and_wait(name, proc)
    assert "received SIGTERM: shutting down" in log
    assert "Traceback" not in log, log
    assert status_code == 0


async def test_a_mounted_config_and_the_environment_configure_the_image(tmp_path: Path) -> None:
    image = image_or_skip()
    config = tmp_path / "mcpipe.toml"
    config.write_text(
        'name = "mounted"\nbuiltins = ["echo", "text_join"]\n\n'
        '[audit]\npath = "/var/lib/mcpipe/audit.jsonl"\n\n'
        '[[auth.tokens]]\nenv = "MCPIPE_TOKEN_CI"\nprincipal = "ci"\n'
    )
    config.chmod(0o644)
    port = free_port()
    name = f"mcpipe-test-{port}"
    run = _run(name, port, "-v", f"{config}:/etc/mcpipe/mcpipe.toml:ro", "-e", "MCPIPE_CONFIG=/etc/mcpipe/mcpipe.toml")
    run += ["-e", "MCPIPE_TOKEN_CI=a-token-of-the-ci", "-e", "MCPIPE_WORKERS=2", image]
    with trio.fail_after(WAIT_S):
        proc, url = await start_process(run)
        try:
            assert url.startswith("http://0.0.0.0:8765/mcp (2 workers")
            await _workers_serving(proc, 2)
            async with httpx2.AsyncClient() as http:
                refused = await http.post(
                    f"http://127.0.0.1:{port}/mcp",
                    content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                    headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
                )
            assert refused.status_code == 401  # the mounted config's token is required
            async with bearer_client(f"http://127.0.0.1:{port}/mcp", "a-token-of-the-ci") as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                answer = await client.call_tool("mcp_pipe", PIPELINE)
            assert "text_join" in names and "json_parse" not in names  # the mounted config's built-ins
            assert answer.structured_content is not None and answer.structured_content["ok"] is True
            audit = (await exec_in(name, "cat", "/var/lib/mcpipe/audit.jsonl")).stdout
            assert '"principal":"ci"' in audit.replace(" ", ""), audit
        finally:
            status_code, log = await _sigterm_and_wait(name, proc)
    assert "Traceback" not in log, log
    assert status_code == 0


def test_the_image_runs_the_cli_and_says_its_version() -> None:
    image = image_or_skip()
    done = subprocess.run(
        [podman(), "run", "--rm", *podman_flags(), image, "--version"], capture_output=True, text=True, timeout=WAIT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mcpipe ")


def test_the_image_refuses_a_bad_config_in_one_located_line(tmp_path: Path) -> None:
    image = image_or_skip()
    config = tmp_path / "mcpipe.toml"
    config.write_text("[http]\nprot = 1\n")
    config.chmod(0o644)
    done = subprocess.run(
        [podman(), "run", "--rm", *podman_flags(), "-v", f"{config}:/etc/mcpipe/mcpipe.toml:ro", image, *SERVE_MOUNTED],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 2
    mcpipe_lines = [line for line in done.stderr.splitlines() if not line.startswith("time=")]  # podman's own
    assert mcpipe_lines == ["error: /etc/mcpipe/mcpipe.toml:http.prot: unknown key `prot` (did you mean `port`?)"]


EXTRA_MODULES = {
    "postgres": ["psycopg"],
    "duckdb": ["duckdb"],
    "noetl": ["psycopg", "duckdb"],
    "grpc": ["grpc", "grpc_reflection"],
    "otlp": ["opentelemetry.exporter.otlp.proto.http", "opentelemetry.exporter.otlp.proto.grpc"],
}
BROUGHT = {"otlp": ["grpc"]}  # the OTLP gRPC exporter depends on grpcio


def test_the_extras_chosen_at_build_are_installed_and_no_others() -> None:
    """``--build-arg EXTRAS=...`` (``make image EXTRAS=postgres,otlp``): the image's label says which, their
    modules import, the other extras' do not."""
    image = image_or_skip()
    label = subprocess.run(
        [podman(), "image", "inspect", image, "--format", '{{index .Config.Labels "io.mcpipe.extras"}}'],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    ).stdout.strip()
    chosen = {e for e in label.split(",") if e}
    assert chosen <= set(EXTRA_MODULES), label
    wanted = {m for e in chosen for m in EXTRA_MODULES[e] + BROUGHT.get(e, [])}
    others = {m for e in set(EXTRA_MODULES) - chosen for m in EXTRA_MODULES[e]} - wanted
    probe = (
        "import importlib, sys\n"
        "def has(m):\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError:\n"
        "        return False\n"
        "    return True\n"
        "print(','.join(m for m in sys.argv[1:] if has(m)))\n"
    )
    python = [podman(), "run", "--rm", *podman_flags(), "--entrypoint", "/opt/mcpipe/bin/python", image]
    done = subprocess.run(
        [*python, "-c", probe, *sorted(wanted | others)], capture_output=True, text=True, timeout=WAIT_S
    )
    assert done.returncode == 0, done.stderr
    found = {m for m in done.stdout.strip().split(",") if m}
    assert found == wanted
