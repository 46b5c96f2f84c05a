"""deploy/compose/compose.yaml brought up with podman-compose, as docs/deployment.md says: mcpipe with two
workers, Redis with a password as their store and run queue, and the inventory server downstream. A real MCP
client with the agents' token calls the downstream through ``mcp_pipe``, starts a background run that lands
in Redis and reads its result through another connection; then every service stops on SIGTERM with status 0.

Like test_image.py this needs the image (``MCPIPE_IMAGE``) and a Redis image (``MCPIPE_REDIS_IMAGE``: the
public one where it can be pulled, else ``DEBIAN_INCLUDE=redis-server deploy/container/debian-base.sh
localhost/mcpipe-redis:trixie``); ``make image-test`` gives both.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from kit.clients import bearer_client
from kit.containers import exec_in, image_or_skip, logged, podman_flags
from kit.realservers import free_port

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),  # the SDK client's SSE reader
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "deploy/compose/compose.yaml"
WAIT_S = 180


def _compose() -> list[str]:
    exe = Path(sys.executable).parent / "podman-compose"
    if not exe.exists() and shutil.which("podman-compose") is None:
        pytest.fail("podman-compose is not installed (pip install podman-compose; make setup installs it)")
    flags = podman_flags()
    runtime = [f for i, f in enumerate(flags) if f == "--runtime" or (i and flags[i - 1] == "--runtime")]
    run = [f for f in flags if f not in runtime]
    # no pod (podman's pause image cannot be pulled here either); this host's runtime and limits
    options = ["--in-pod", "false", "--podman-args", shlex.join(runtime), "--podman-run-args", shlex.join(run)]
    return [str(exe) if exe.exists() else "podman-compose", *options, "-f", str(COMPOSE)]


@asynccontextmanager
async def composed(project: str, env: dict[str, str]) -> AsyncIterator[None]:
    compose = [*_compose(), "-p", project]
    full = {**os.environ, **env}
    await trio.run_process([*compose, "up", "-d"], env=full, capture_stdout=True, capture_stderr=True)
    try:
        yield
    finally:
        with trio.move_on_after(WAIT_S):
            await trio.run_process([*compose, "down", "-v"], env=full, check=False, capture_stdout=True)


async def test_compose_serves_the_downstream_through_two_workers_with_redis_and_stops_cleanly() -> None:
    image = image_or_skip()
    redis_image = os.environ.get("MCPIPE_REDIS_IMAGE", "docker.io/library/redis:7.4")
    port = free_port()
    project = f"mcpipe-test-{port}"
    token = os.urandom(16).hex()
    env = {
        "MCPIPE_IMAGE": image,
        "REDIS_IMAGE": redis_image,
        "MCPIPE_PORT": str(port),
        "MCPIPE_STATE_KEY": os.urandom(32).hex(),
        "MCPIPE_TOKEN_AGENT": token,
        "REDIS_PASSWORD": os.urandom(16).hex(),
    }
    url = f"http://127.0.0.1:{port}/mcp"
    with trio.fail_after(WAIT_S):
        async with composed(project, env):
            await logged(f"{project}_mcpipe_1", "serving MCP at", 3)  # the supervisor and both workers
            await logged(f"{project}_inventory_1", "Running on http://0.0.0.0:9001")
            async with bearer_client(url, token) as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                stock = await client.call_tool(
                    "mcp_pipe",
                    {
                        "steps": [{"id": "s", "tool": "inventory.stock", "args": {"sku": "SKU-1"}}],
                        "return": "${steps.s.structured}",
                    },
                )
                queued = await client.call_tool(
                    "mcp_pipe",
                    {
                        "background": True,
                        "steps": [{"id": "s", "tool": "inventory.stock", "args": {"sku": "SKU-2"}}],
                        "return": "${steps.s.structured.name}",
                    },
                )
            assert "inventory.stock" in names
            assert stock.structured_content is not None
            assert stock.structured_content["result"] == {"sku": "SKU-1", "name": "kettle", "on_hand": 12}
            assert queued.structured_content is not None
            run_id = queued.structured_content["result"]["run_id"]
            async with bearer_client(url, token) as client:
                done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 30000})
            assert done.structured_content is not None
            assert (done.structured_content["ok"], done.structured_content["result"]) == (True, "teapot")
            keys = await exec_in(
                f"{project}_redis_1", "sh", "-c", 'redis-cli -a "$REDIS_PASSWORD" --no-auth-warning --scan'
            )
            assert any(key.startswith("mcpipe:run") for key in keys.stdout.split()), keys.stdout

            stop = [*_compose(), "-p", project, "stop"]
            await trio.run_process(stop, env={**os.environ, **env}, capture_stdout=True, capture_stderr=True)
            for service in ("mcpipe", "redis"):
                status = await trio.run_process(
                    ["podman", "inspect", f"{project}_{service}_1", "--format", "{{.State.ExitCode}}"],
                    capture_stdout=True,
                )
                assert status.stdout.decode().strip() == "0", service  # SIGTERM: a clean exit
