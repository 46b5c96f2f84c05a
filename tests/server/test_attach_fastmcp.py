"""``attach(FastMCP(...))``: servers written with the released ``fastmcp`` package (``tests/kit/fastmcp_host.py``).

Each step of ``mcp_pipe`` calls the host's tool through FastMCP's own ``tools/call`` handler, so FastMCP's
middleware sees (and may refuse) every step's call, and its per-tool auth decides what a caller's pipeline may
call. In memory on Trio and asyncio, then as real processes: stdio and HTTP (uvicorn on asyncio, hypercorn on
Trio), FastMCP's bearer auth over HTTP.

fastmcp 2 and 3 run on mcp 1.x and cannot be installed beside mcpipe (mcp 2.x): ``attach`` refuses what it
cannot take with a ValueError; ``test_fastmcp3_downstream.py`` puts a fastmcp 3 server behind mcpipe instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from mcp import Client, StdioServerParameters

from kit.clients import bearer_client
from kit.realservers import free_port, wait_for_port
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import attach

fastmcp = pytest.importorskip("fastmcp")

from kit.fastmcp_host import make_app  # noqa: E402 (it needs fastmcp)

HOST = Path(__file__).parents[1] / "kit" / "fastmcp_host.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "python"), *sys.path])}

PARALLEL = {
    "steps": [
        {
            "id": "p",
            "parallel": [
                {"id": "a", "tool": "wait", "args": {"ms": 200, "together": 2}},
                {"id": "b", "tool": "wait", "args": {"ms": 200, "together": 2}},
                {"id": "c", "tool": "forecast", "args": {"city": "Lyon"}},
            ],
        },
        {"id": "s", "tool": "shout", "args": {"text": "${steps.p.children.c.structured.city}"}},
    ],
    "return": {"loud": "{{s.result}}", "met": ["{{p.a.met}}", "{{p.b.met}}"]},
}
REFUSED = {"steps": [{"id": "s", "tool": "shout", "args": {"text": "forbidden"}}], "continue_on_error": True}
SECRET = {"steps": [{"id": "x", "tool": "secret"}], "return": "{{x.result}}"}


async def exercise(client: Any) -> dict[str, Any]:
    """What the tests look at: the listing, a parallel pipeline, a step the middleware refuses, and the calls
    FastMCP's middleware saw."""
    names = [t.name for t in (await client.list_tools()).tools]
    answer = (await client.call_tool(PIPE_TOOL, PARALLEL)).structured_content
    refused = (await client.call_tool(PIPE_TOOL, REFUSED)).structured_content
    seen = (await client.call_tool("calls_seen", {})).structured_content["calls"]
    return {"names": names, "answer": answer, "refused": refused, "seen": seen}


def check(got: dict[str, Any], *, secret_visible: bool = True) -> None:
    expected = ["mcp_pipe", "forecast", "shout", "wait", *(["secret"] if secret_visible else []), "calls_seen"]
    assert got["names"] == expected
    answer = got["answer"]
    assert answer["ok"], answer
    # Each wait stays until both are in (``kit.meeting``): 2 and 2 shows they ran side by side, 1 that they
    # ran one after the other; no timing, however the host schedules the two requests.
    assert answer["result"] == {"loud": "LYON", "met": [2, 2]}
    assert answer["summary"]["succeeded"] == 4
    assert sorted(got["seen"][:3]) == ["forecast", "wait", "wait"], "each step went through FastMCP's middleware"
    assert got["seen"][3:] == ["shout", "shout"]
    refused = got["refused"]
    assert not refused["ok"]
    assert refused["steps"]["s"]["error_code"] == "TOOL_ERROR"
    assert "refused by the host's middleware" in refused["steps"]["s"]["error"]


# --- in memory ---------------------------------------------------------------------------------------


async def test_attach_takes_a_fastmcp_server_on_trio_and_each_step_passes_its_middleware():
    app = make_app()
    async with Client(app._mcp_server) as client:
        check(await exercise(client), secret_visible=False)  # no token in memory: FastMCP hides `secret`


def test_attach_takes_a_fastmcp_server_on_asyncio_with_fastmcps_own_client():
    app = make_app()

    async def main() -> dict[str, Any]:
        async with fastmcp.Client(app) as client:
            names = [t.name for t in await client.list_tools()]
            answer = (await client.call_tool(PIPE_TOOL, PARALLEL)).structured_content
            refused = (await client.call_tool(PIPE_TOOL, REFUSED, raise_on_error=False)).structured_content
            seen = (await client.call_tool("calls_seen", {})).structured_content["calls"]
            return {"names": names, "answer": answer, "refused": refused, "seen": seen}

    check(anyio.run(main, backend="asyncio"), secret_visible=False)


@pytest.mark.parametrize("what, kind", [(object(), "builtins.object"), ("weather", "builtins.str")])
def test_attach_refuses_what_is_not_a_server_with_a_value_error(what, kind):
    with pytest.raises(ValueError) as e:
        attach(what)
    assert (
        str(e.value) == f"attach() takes an MCP server (an SDK MCPServer or Server, or a fastmcp.FastMCP), not {kind}"
    )


def test_attach_refuses_a_second_attach_to_a_fastmcp_server():
    app = make_app()
    with pytest.raises(ValueError, match="already attached"):
        attach(app)


# --- real processes: stdio and HTTP -------------------------------------------------------------------


async def test_a_fastmcp_server_over_stdio_runs_parallel_steps_through_its_middleware():
    # `app.run()`'s default: stdio on asyncio (Trio is covered in memory and over HTTP)
    params = StdioServerParameters(command=sys.executable, args=[str(HOST), "stdio", "asyncio"], env=ENV)
    with trio.fail_after(60):
        async with Client(params) as client:
            check(await exercise(client))


@contextmanager
def http_host(backend: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HOST), "http", backend, str(port)], env=ENV)
    try:
        wait_for_port(port, proc, timeout=60)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_over_http_fastmcps_auth_decides_which_tools_a_callers_pipeline_may_call(backend):
    with http_host(backend) as url, trio.fail_after(60):
        async with bearer_client(url, "reader") as reader:
            check(await exercise(reader), secret_visible=False)
            refused = (await reader.call_tool(PIPE_TOOL, SECRET)).structured_content
            assert not refused["ok"]
            assert refused["error_code"] == "UNKNOWN_TOOL"
            assert refused["problems"][0]["location"] == "steps[0].tool"
        async with bearer_client(url, "admin") as admin:
            answer = (await admin.call_tool(PIPE_TOOL, SECRET)).structured_content
            assert answer["ok"], answer
            assert answer["result"] == "the admin's secret"
