"""The example's one command: mcpg's own example config served by ``mcpipe serve`` (a SQLite file in a
temporary directory), and an MCP client (the SDK's) calling its tools as mcpg's callers do, naming themselves
with ``x-mcpg-subject-id``; prints each call's answer.

    python examples/mcpg/run.py
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

HERE = Path(__file__).parent
CALLS = [
    ("todos.init_schema", {}),
    ("todos.create", {"title": "Buy milk"}),
    ("todos.create", {"title": "Write report"}),
    ("todos.complete", {"id": 1}),
    ("todos.count_open", {}),
    ("todos.list", {}),
]


@asynccontextmanager
async def transport(url: str) -> AsyncIterator[Any]:
    headers = {"x-mcpg-subject-id": "example-user"}  # mcpg's header-asserted caller
    async with create_mcp_http_client(headers=headers) as http, streamable_http_client(url, http_client=http) as s:
        yield s


async def drain(stream: trio.abc.ReceiveStream) -> None:
    async for _ in stream:  # the server's log, not shown
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main() -> None:
    port = free_port()
    mcpipe = Path(sys.executable).parent / "mcpipe"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TODOS_DB_PATH": f"{tmp}/todos.db"}
        # mcpg's own environment override: trust the caller's x-mcpg-subject-id (a header-asserted caller, the
        # trust floor mcpg gives every binding by default), as mcpg's remedy for an anonymous caller says
        env["MCPG_GATEWAY__SERVER__TRUST_SUBJECT_HEADER"] = "true"
        args = [str(mcpipe), "serve", "--config", str(HERE / "todos.yaml"), "--http", f"127.0.0.1:{port}"]
        async with trio.open_nursery() as nursery:
            server = await trio.lowlevel.open_process(args, env=env, stderr=subprocess.PIPE)
            assert server.stderr is not None
            seen = b""
            with trio.fail_after(60):
                while b"serving MCP at" not in seen:  # the server's log says when it listens
                    chunk = await server.stderr.receive_some()
                    if not chunk:
                        sys.exit(f"mcpipe serve exited: {seen.decode()}")
                    seen += chunk
            nursery.start_soon(drain, server.stderr)
            answers = []
            async with Client(transport(f"http://127.0.0.1:{port}/mcp")) as client:
                for name, arguments in CALLS:
                    result = await client.call_tool(name, arguments)
                    answers.append({"tool": name, "is_error": result.is_error, "structured": result.structured_content})
            server.terminate()
            await server.wait()
    print(json.dumps(answers, indent=2))


trio.run(main)
