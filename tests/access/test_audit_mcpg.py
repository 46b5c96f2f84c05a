"""mcpg's audit format (its ``dev.mcpg.builtin.audit.local-file`` sink): every call's events over real HTTP,
the SHA-256 chain over the lines as written, a rotated file followed, a restart continuing the chain."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import httpx2

from kit.servers import http_server, make_config, running
from mcpipe.formats.mcpg._audit import McpgAuditLog
from mcpipe.tools import Identity, Request, ToolContext

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


async def _call(http: httpx2.AsyncClient, url: str, name: str, args: dict, token: str) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": args, "_meta": META},
    }
    h = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": name,
        "authorization": f"Bearer {token}",
    }
    return (await http.post(url, json=body, headers=h)).json()["result"]


def _chain_holds(raw: bytes) -> list[dict]:
    """The events of a file, after checking each line's ``prev_event_hash`` is the SHA-256 of the line before."""
    lines = raw.rstrip(b"\n").split(b"\n")
    events = [json.loads(line) for line in lines]
    for before, (line, event) in zip([None, *lines], zip(lines, events, strict=True), strict=False):
        expected = hashlib.sha256(before).hexdigest() if before is not None else None
        assert event.get("prev_event_hash") == expected, (line, expected)
    return events


async def test_every_call_writes_mcpg_events_whose_hash_chain_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("T_ALICE", "alice-secret")
    path = tmp_path / "mcpg-audit.log"
    gates = [
        {
            "kind": "cedar",
            "name": "authz",
            "policies": 'permit(principal, action, resource);\nforbid(principal, action, resource == Tool::"now");',
        }
    ]
    config = make_config(
        {"T_ALICE": "alice-secret"},
        auth={"tokens": [{"env": "T_ALICE", "principal": "alice", "tools": ["echo", "now", "fail"]}]},
        access={"gates": gates},
        audit={"path": str(path), "format": "mcpg"},
    )
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        await _call(http, url, "echo", {"x": 1}, "alice-secret")
        await _call(http, url, "now", {}, "alice-secret")
        await _call(http, url, "nope", {}, "alice-secret")
        await _call(http, url, "hang", {}, "alice-secret")  # not granted to alice
    events = _chain_holds(path.read_bytes())
    assert [(e["action"], e["resource"], e["outcome"]) for e in events] == [
        ("mcpg.tool.call.allowed", "tool://echo", "success"),
        ("mcpg.tool.call.completed", "tool://echo", "success"),
        ("mcpg.tool.call.denied", "tool://now", "denied"),
        ("mcpg.tool.call.unknown", "tool://nope", "failure"),
        ("mcpg.tool.call.access_denied", "tool://hang", "denied"),
    ]
    allowed = events[0]
    assert allowed["actor"] == {
        "kind": "verified",
        "trust_level": "verified",
        "subject_id": "alice",
        "auth_provider": "token",
        "issuer": None,
    }
    assert (
        allowed["details"]["chain"][0]["plugin_id"] == "authz" and allowed["details"]["chain"][0]["decision"] == "allow"
    )
    assert events[2]["details"]["plugin_id"] == "authz" and "prev_event_hash" not in events[0]
    assert all(len(e["event_id"]) == 36 and e["event_id"][14] == "7" for e in events)  # UUIDv7
    assert "alice-secret" not in path.read_text()


def _ctx(subject: str = "alice") -> ToolContext:
    return ToolContext(
        request_id="r1",
        request=Request(identity=Identity(subject, provider="oidc", issuer="https://idp", groups=("ops",))),
    )


def _record(tool: str = "echo", ok: bool = True) -> dict:
    return {
        "ts": "2026-01-01T00:00:00.000Z",
        "tool": tool,
        "ok": ok,
        "error_code": None if ok else "TOOL_FAILED",
        "duration_ms": 1.5,
    }


def test_a_restart_continues_the_chain_and_a_rotated_file_is_reopened(tmp_path):
    path = tmp_path / "audit.log"
    log = McpgAuditLog(str(path))
    log.write(_record(), _ctx())
    log.close()
    log = McpgAuditLog(str(path))  # a restart: the chain goes on from the file's last line
    log.write(_record(), _ctx())
    os.rename(path, tmp_path / "audit.log.1")  # logrotate's default: rename, then the sink writes a new file
    log.write(_record("now", ok=False), _ctx())
    log.close()
    old, new = (tmp_path / "audit.log.1").read_bytes(), path.read_bytes()
    events = _chain_holds(old + new)  # the chain spans the rotation
    assert len(events) == 3 and events[2]["action"] == "mcpg.backend.failed"
    assert events[0]["actor"]["groups"] == ["ops"] and events[0]["actor"]["auth_provider"] == "https://idp"
    assert Path(path).read_bytes().count(b"\n") == 1


def test_the_events_it_writes_can_be_narrowed_to_refusals():
    log = McpgAuditLog(None, keep=True, allowed=False, completed=False)
    log.allowed(_ctx(), "echo", [])
    log.write(_record(), _ctx())
    log.write({**_record(), "ok": False, "error_code": "FORBIDDEN", "gate": "g"}, _ctx())
    assert [e["action"] for e in log.records or []] == ["mcpg.tool.call.denied"]
