"""The example's one command: Redis (Debian's redis-server) on a free 127.0.0.1 port, ``mcpipe serve
--workers 2`` sharing it, and the MCP SDK's client: fresh connections until both workers have answered, a
background run started through one connection and its result read through others, and the keys it left in
Redis. Prints what it saw; stops both servers.

    python examples/redis-workers/run.py
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import trio
from mcp import Client

HERE = Path(__file__).parent
WAIT_S = 60
PIPELINE = {
    "background": True,
    "steps": [
        {"id": "a", "tool": "echo", "args": {"text": "queued in Redis"}},
        {
            "id": "b",
            "tool": "text_join",
            "args": {"items": ["${steps.a.structured.text}", "run by a worker"], "sep": ", "},
        },
    ],
    "return": "${steps.b.structured.text}",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def started(args: list[str], env: dict[str, str], marker: bytes) -> trio.Process:
    """A process whose output says ``marker`` once it serves (its output read on, unseen, after)."""
    proc = await trio.lowlevel.open_process(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen = b""
    while seen.count(marker) < (3 if b"MCP" in marker else 1):  # mcpipe: the supervisor and both workers
        chunk = await proc.stdout.receive_some()
        if not chunk:
            sys.exit(f"{args[0]} exited: {seen.decode()}")
        seen += chunk
    return proc


async def drain(proc: trio.Process) -> None:
    assert proc.stdout is not None
    async for _ in proc.stdout:
        pass


async def main() -> dict[str, object]:
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        sys.exit("run.py: redis-server is not installed (apt-get install redis-server)")
    redis_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp, trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            redis = await started(
                [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", tmp, "--save", ""],
                dict(os.environ),
                b"Ready to accept connections",
            )
            nursery.start_soon(drain, redis)
            env = {
                **os.environ,
                "MCPIPE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "MCPIPE_STATE_KEY": os.urandom(32).hex(),
            }
            mcpipe = str(Path(sys.executable).parent / "mcpipe")
            args = [mcpipe, "serve", "--config", str(HERE / "mcpipe.toml"), "--workers", "2"]
            server = await started([*args, "--http", f"127.0.0.1:{port}"], env, b"serving MCP at")
            nursery.start_soon(drain, server)
            url = f"http://127.0.0.1:{port}/mcp"

            pids, connections = set(), 0
            while len(pids) < 2 and connections < 200:  # the kernel hands each connection to either worker
                async with Client(url) as client:
                    pids.add((await client.call_tool("worker", {})).structured_content["pid"])
                connections += 1
            async with Client(url) as client:
                queued = (await client.call_tool("mcp_pipe", PIPELINE)).structured_content["result"]
            async with Client(url) as client:  # another connection, maybe another worker
                done = await client.call_tool("pipe_result", {"run_id": queued["run_id"], "wait_ms": 30000})
            scan = ["redis-cli", "-p", str(redis_port), "--scan", "--pattern", "example:*"]
            keys = (await trio.run_process(scan, capture_stdout=True)).stdout.decode().split()
            server.terminate()  # SIGTERM: both workers finish, the supervisor exits 0
            redis.terminate()
            stopped = await server.wait()
            await redis.wait()
    answer = done.structured_content or {}
    return {
        "workers_that_answered": len(pids),
        "queued": queued["status"],
        "run": {"ok": answer.get("ok"), "result": answer.get("result")},
        "redis_keys": sorted({key.split(":")[1] for key in keys}),
        "server_exit_status": stopped,
    }


print(json.dumps(trio.run(main), indent=2))
