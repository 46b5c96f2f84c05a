"""``mcpipe serve`` answers before the MCP SDK is imported (``server/_early.py``, ``_serve_sdk``).

A real ``mcpipe serve`` process, whose import of the SDK's server is held at a gate (a named pipe its import
reads) until the test opens it: what the server answers before, it answered without the SDK; what waits is
answered once the gate opens, as the SDK path answers it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpipe.server._early import HostCheck, accepts

WAIT_S = 60
V = "2026-07-28"

LAUNCHER = """
import importlib.abc, importlib.machinery, os, sys


class Gate(importlib.abc.MetaPathFinder):
    # The SDK's low-level server is imported by the thread that loads the SDK: its module waits for the gate
    # (in its loader, where only that module's lock is held, not the import system's).
    def find_spec(self, name, path, target=None):
        if name != "mcp.server.lowlevel":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader

        class Held(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                with open(os.environ["EARLY_GATE"]) as gate:
                    gate.read()
                real.exec_module(module)

        spec.loader = Held()
        return spec


sys.meta_path.insert(0, Gate())
from mcpipe.cli import main
sys.exit(main(sys.argv[1:]))
"""

TOOLS = """
import sys
from mcpipe.tools import ToolRegistry

tools = ToolRegistry()
SDK = ("mcp_types._types", "mcp.server.lowlevel.server", "mcp.shared.exceptions", "pydantic")


@tools.tool
def loaded() -> list[str]:
    return [m for m in SDK if m in sys.modules]


@tools.tool
async def loaded_later() -> list[str]:
    return [m for m in SDK if m in sys.modules]
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    """A ``mcpipe serve`` whose SDK import waits at the gate; (port, gate, process)."""
    (tmp_path / "early_tools.py").write_text(TOOLS)
    (tmp_path / "launch.py").write_text(LAUNCHER)
    config = tmp_path / "mcpipe.json"
    config.write_text(json.dumps({"audit": {"enabled": False}, "python_tools": ["early_tools:tools"]}))
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    port = _free_port()
    env = {**os.environ, "EARLY_GATE": str(gate), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    serve = ["serve", "--config", str(config), "--http", f"127.0.0.1:{port}"]
    argv = [sys.executable, str(tmp_path / "launch.py"), *serve]
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield port, gate, proc
    finally:
        _open(gate)  # never leave the server's thread waiting at the gate
        proc.terminate()
        proc.wait(timeout=WAIT_S)
        assert proc.stderr is not None
        proc.stderr.close()


def _open(gate: Path) -> None:
    """Let a reader waiting at the gate on (an end of file), if one waits."""
    try:
        os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody reads it (yet, or any more)


async def _release(gate: Path) -> None:
    """Open the gate once the SDK's import waits at it."""
    await trio.to_thread.run_sync(gate.write_text, "open", abandon_on_cancel=True)


def _post(port: int, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
    params = {**params, "_meta": meta}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": V,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
        assert answer.status == 200
        out: dict[str, Any] = json.loads(answer.read())
        return out


def _healthz_once(port: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=WAIT_S) as answer:
        assert answer.status == 200


async def _healthz(port: int, proc: subprocess.Popen[bytes]) -> None:
    while True:
        try:
            await trio.to_thread.run_sync(_healthz_once, port)
            return
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            await trio.sleep(0.02)  # the process is starting: nothing to wait on but its port


def _call(port: int, name: str) -> dict[str, Any]:
    return _post(port, "tools/call", {"name": name, "arguments": {}}, name)


async def test_a_clients_tools_list_and_call_are_answered_before_the_sdk_is_imported(gated) -> None:
    port, gate, proc = gated
    with trio.fail_after(WAIT_S):
        await _healthz(port, proc)
        early_list = await trio.to_thread.run_sync(_post, port, "tools/list", {})
        early_call = await trio.to_thread.run_sync(_call, port, "loaded")
        assert early_call["result"]["structuredContent"] == {"result": []}, early_call  # no SDK module loaded
        assert early_call["result"]["isError"] is False
        assert early_call["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcpipe"
        names = [t["name"] for t in early_list["result"]["tools"]]
        assert "loaded" in names and "mcp_pipe" in names

        await _release(gate)
        ready_list = await trio.to_thread.run_sync(_post, port, "tools/list", {})
        ready_call = await trio.to_thread.run_sync(_call, port, "loaded")
    assert ready_call["result"]["structuredContent"]["result"], ready_call  # the SDK is loaded now
    assert early_list == ready_list  # the early answer is the SDK path's
    assert {k: v for k, v in early_call["result"].items() if k != "structuredContent" and k != "content"} == {
        k: v for k, v in ready_call["result"].items() if k != "structuredContent" and k != "content"
    }


async def test_a_call_the_early_path_does_not_serve_waits_for_the_sdk_and_answers_right(gated) -> None:
    port, gate, proc = gated
    answers: dict[str, Any] = {}

    async def ask(method: str, params: dict[str, Any], name: str | None = None) -> None:
        answers[method] = await trio.to_thread.run_sync(_post, port, method, params, name)

    with trio.fail_after(WAIT_S):
        await _healthz(port, proc)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "tools/call", {"name": "loaded_later", "arguments": {}}, "loaded_later")
            nursery.start_soon(ask, "server/discover", {})
            # Both wait for the SDK (an async tool may yield; discover is the SDK's): answered once it loads.
            await _release(gate)
    call = answers["tools/call"]["result"]
    assert call["isError"] is False
    assert "mcp_types._types" in call["structuredContent"]["result"]  # it ran after the SDK was loaded
    discover = answers["server/discover"]["result"]
    assert V in discover["supportedVersions"] and "tools" in discover["capabilities"]


@pytest.mark.parametrize(
    ("headers", "post", "expected"),
    [
        ([(b"host", b"127.0.0.1:9"), (b"content-type", b"application/json")], True, None),
        ([(b"host", b"127.0.0.1:9")], True, (400, b"Invalid Content-Type header")),
        ([(b"host", b"evil.example:9"), (b"content-type", b"application/json")], True, (421, b"Invalid Host header")),
        ([(b"content-type", b"application/json")], True, (421, b"Invalid Host header")),
        ([(b"host", b"localhost:1"), (b"origin", b"http://evil.example")], False, (403, b"Invalid Origin header")),
        ([(b"host", b"localhost:1"), (b"origin", b"http://localhost:5")], False, None),
    ],
)
async def test_the_fronts_host_check_answers_as_the_sdks_transport_security(headers, post, expected) -> None:
    from mcp.server.transport_security import TransportSecurityMiddleware
    from starlette.requests import Request

    check = HostCheck(
        allowed_hosts=["127.0.0.1:*", "localhost:*"], allowed_origins=["http://127.0.0.1:*", "http://localhost:*"]
    )
    assert check.refusal(headers, is_post=post) == expected
    sdk = await TransportSecurityMiddleware(check.sdk()).validate_request(
        Request({"type": "http", "headers": headers, "method": "POST" if post else "GET"}), is_post=post
    )
    assert (None if sdk is None else (sdk.status_code, sdk.body)) == expected


@pytest.mark.parametrize(
    "accept",
    [
        "application/json, text/event-stream",
        "*/*",
        "application/*",
        "text/*;q=0.5",
        "",
        "text/html",
        "APPLICATION/JSON",
    ],
)
def test_the_accept_check_is_the_sdks(accept: str) -> None:
    from mcp.server.streamable_http import check_accept_headers
    from starlette.requests import Request

    request = Request({"type": "http", "headers": [(b"accept", accept.encode())] if accept else []})
    assert accepts({"accept": accept} if accept else {}) == check_accept_headers(request)


def _scope(headers: dict[str, str]) -> dict[str, Any]:
    base = {
        "host": "127.0.0.1:1",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": "echo",
    }
    merged = {k: v for k, v in {**base, **headers}.items() if v is not None}
    return {"method": "POST", "headers": [(k.encode(), v.encode()) for k, v in merged.items()]}


def _body(**changes: Any) -> bytes:
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    msg["params"] = {"name": "echo", "arguments": {"text": "hi"}, "_meta": meta}
    for key, value in changes.items():
        if key == "meta":
            meta.update(value)
        else:
            msg["params"][key] = value
    return json.dumps(msg).encode()


@pytest.mark.parametrize(
    ("headers", "body", "early"),
    [
        ({}, _body(), True),
        ({"mcp-protocol-version": "2025-11-25"}, _body(), False),  # another era: the SDK's session
        ({"mcp-name": "other"}, _body(), False),  # the SDK answers the mismatch
        ({"mcp-method": "tools/list"}, _body(), False),
        ({"accept": "text/event-stream"}, _body(), False),
        ({"host": "evil.example:1"}, _body(), False),  # the SDK refuses it
        ({"mcp-param-text": "hi"}, _body(), False),
        ({}, _body(meta={"progressToken": 1}), False),  # progress: the SDK's stream
        ({}, _body(meta={"io.modelcontextprotocol/protocolVersion": "2026-01-01"}), False),
        ({}, _body(arguments={"n": 10**20}), False),  # an integer orjson would read as a float
        ({}, _body(arguments=None), False),
        ({}, b"{not json", False),
    ],
)
def test_the_early_path_takes_only_requests_it_fully_understands(headers, body, early) -> None:
    from mcpipe.server._early import EarlyAnswers

    check = HostCheck(allowed_hosts=["127.0.0.1:*"], allowed_origins=[])
    no_handlers: Any = None  # the checks read none of them
    answers = EarlyAnswers(no_handlers, check, {"name": "mcpipe", "version": "0"})
    assert (answers._understood(_scope(headers), body) is not None) is early
