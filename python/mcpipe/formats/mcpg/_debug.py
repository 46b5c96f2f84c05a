"""mcpg's debug tools (``feature_flags.debug_tools_enabled`` with ``debug.tools``), as mcpg serves them
(``src/backends/capability_registry.rs``, ``src/runtime/execution/mod.rs``, ``command_adapter.rs``,
``http_adapter.rs``, ``src/runtime/diagnostics.rs``):

- ``mcpg.runtime.snapshot``: the runtime snapshot (service, version, start, uptime, listener, paths, logging,
  readiness checks, plugins);
- ``mcpg.request.echo``: the normalized request (its tool, arguments, request id, identity kind, trust level,
  principal, transport);
- ``mcpg.debug.command_probe``: runs the configured command profile (its ``args``, no shell), stdout and
  stderr each capped at ``max_output_bytes``, killed past ``timeout_ms``;
- ``mcpg.debug.network_probe``: a ``GET`` of the configured network profile's ``url`` with its headers, the
  body capped at ``max_response_bytes``, the status checked against ``expected_status_codes``;
- the prompt ``mcpg_operational_overview`` and the resource ``mcpg://runtime/overview`` (the snapshot, pretty).

Each answers mcpg's ``CallToolResult`` (its text line and structured content); the ``mcpg.debug`` step kind
does the work, the front-end declares the tools (:func:`debug_pipelines`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import orjson

from mcpipe.formats.mcpg._kinds import (
    HttpPolicy,
    _http_call,
    _result,
    _TransportError,
    process_summary,
    status_error,
    transport_error,
)
from mcpipe.kinds import KINDS, Build, CommandPolicy, Kind, StepFields
from mcpipe.kinds.command import run_captured
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["debug_pipelines"]

DEFAULT_COMMAND = {"command": "printf", "args": ["mcpg-debug-command\n"], "timeout_ms": 2000, "max_output_bytes": 4096}
DEFAULT_NETWORK = {
    "url": "http://127.0.0.1:8787/health",
    "timeout_ms": 2000,
    "max_response_bytes": 4096,
    "expected_status_codes": [200],
    "require_json_response": False,
    "headers": {},
}


class DebugFields(StepFields, tag="mcpg.debug", kw_only=True):
    """One of mcpg's debug tools; ``runtime`` is what the snapshot reports of the server."""

    tool: Literal["runtime_snapshot", "request_echo", "command_probe", "network_probe", "overview"]
    tool_name: str
    profile: str = ""
    command: dict[str, Any] = {}
    network: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    allow_private: bool = False


_STARTED = datetime.now(UTC)
_STARTED_MONO = time.monotonic()


def runtime_snapshot(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """``GatewayRuntime::runtime_snapshot`` of this server."""
    bind, health = str(runtime.get("bind_address", "")), str(runtime.get("health_path", "/health"))
    checks = [
        {"name": "config_valid", "status": "ready", "detail": "application config loaded and validated"},
        {"name": "runtime_initialized", "status": "ready", "detail": "gateway runtime state initialized"},
        {"name": "logging_initialized", "status": "ready", "detail": "structured logging initialized"},
        {
            "name": "http_transport_configured",
            "status": "ready" if bind.strip() and health.startswith("/") else "not_ready",
            "detail": f"bind_address={bind}, health_path={health}",
        },
    ]
    plugins = list(runtime.get("plugins") or [])
    return {
        "service": runtime.get("service", "mcpg"),
        "version": runtime.get("version", ""),
        "started_at": _STARTED.isoformat().replace("+00:00", "Z"),
        "uptime_secs": int(time.monotonic() - _STARTED_MONO),
        "bind_address": bind,
        "health_path": health,
        "mcp_path": runtime.get("mcp_path", "/mcp"),
        "logging": {
            "level": runtime.get("log_level", "info"),
            "sinks": runtime.get("log_sinks", []),
            "initialized": True,
        },
        "readiness": {
            "status": "ready" if all(c["status"] == "ready" for c in checks) else "not_ready",
            "checks": checks,
        },
        "plugins": {"total_count": len(plugins), "loaded": plugins},
    }


def _identity(ctx: ToolContext) -> tuple[str, str, str | None]:
    identity = ctx.identity
    trust = getattr(identity, "trust", None) if identity is not None else None
    if trust == "verified":
        return "verified", "verified", getattr(identity, "subject", None)
    if trust == "header_asserted":
        return "http_header", "header_asserted", getattr(identity, "subject", None)
    return "anonymous", "unauthenticated", None


async def _command_probe(f: DebugFields, policy: CommandPolicy) -> dict[str, Any]:
    c = {**DEFAULT_COMMAND, **f.command}
    limit, timeout_ms = int(c["max_output_bytes"]), int(c["timeout_ms"])
    base = {
        "toolName": f.tool_name,
        "profile": f.profile,
        "command": c["command"],
        "args": list(c["args"]),
        "timeoutMs": timeout_ms,
        "maxOutputBytes": limit,
    }
    path = c["command"] if os.sep in c["command"] else shutil.which(c["command"])
    if path is None:
        failed = {**base, "error": f"No such file or directory (os error 2): {c['command']}"}
        return _result(f"Failed to execute configured debug command for tool {f.tool_name}.", failed, True)
    started = time.perf_counter()
    try:
        run = await run_captured(
            [path, *map(str, c["args"])],
            {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME") if k in os.environ},
            None,
            None,
            policy,
            max_bytes=limit,
            timeout_s=timeout_ms / 1000,
        )
    except StepFailure as e:  # it could not start
        failed = {**base, "error": str(e)}
        return _result(f"Failed to execute configured debug command for tool {f.tool_name}.", failed, True)
    summary = process_summary(run, started)
    structured = {**base, **summary}
    return _result(f"Executed configured debug command for tool {f.tool_name}.", structured, not summary["success"])


async def _network_probe(f: DebugFields, policy: HttpPolicy) -> dict[str, Any]:
    n = {**DEFAULT_NETWORK, **f.network}
    base = {
        "toolName": f.tool_name,
        "profile": f.profile,
        "url": n["url"],
        "timeoutMs": n["timeout_ms"],
        "maxResponseBytes": n["max_response_bytes"],
        "expectedStatusCodes": n["expected_status_codes"],
        "requestHeaders": dict(sorted(n["headers"].items())),
    }
    headers = [("Accept", "*/*"), *((str(k), str(v)) for k, v in sorted(n["headers"].items()))]
    try:
        s = await _http_call(policy, "GET", n["url"], headers, None, int(n["max_response_bytes"]), n["timeout_ms"])
    except _TransportError as e:
        broke = transport_error(str(e), True)
        failed = {**base, "downstreamError": broke, "downstreamErrors": [broke], "error": str(e)}
        return _result(f"Failed to execute configured debug network probe for tool {f.tool_name}.", failed, True)
    error = status_error(list(n["expected_status_codes"]), s, True)
    structured = {
        **base,
        "durationMs": s.duration_ms,
        "statusCode": s.status_code,
        "responseContentType": s.content_type,
        "body": s.body,
        "bodyTruncated": s.body_truncated,
        "downstreamError": error,
        "downstreamErrors": [error] if error is not None else [],
    }
    return _result(f"Executed configured debug network probe for tool {f.tool_name}.", structured, error is not None)


class DebugPlan(NamedTuple):
    http: HttpPolicy
    command: CommandPolicy


def _build(b: Build[DebugFields]) -> DebugPlan:
    from dataclasses import replace

    f = b.decoded()
    policy = b.policy.http
    http = replace(policy, allow_private=policy.allow_private or f.allow_private, allowed_hosts=("*",))
    return DebugPlan(http, b.policy.command)


async def run_debug(
    step: Leaf[DebugFields, DebugPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    f = step.fields
    if f.tool == "runtime_snapshot":
        out = _result(f"Returned current MCPG runtime snapshot for tool {f.tool_name}.", runtime_snapshot(f.runtime))
    elif f.tool == "overview":  # the resource: the snapshot, pretty-printed JSON
        text = orjson.dumps(runtime_snapshot(f.runtime), option=orjson.OPT_INDENT_2).decode()
        out = {"contents": [{"uri": "mcpg://runtime/overview", "mimeType": "application/json", "text": text}]}
    elif f.tool == "request_echo":
        kind, trust, principal = _identity(ctx)
        args = env.get("args")
        structured = {
            "toolName": f.tool_name,
            "arguments": args if isinstance(args, Mapping) else {},
            "request": {
                "requestId": ctx.request_id,
                "upstreamRequestId": None,
                "sessionId": None,
                "identityKind": kind,
                "trustLevel": trust,
                "principalId": principal,
                "transport": "http",
            },
            "runtime": {"service": f.runtime.get("service", "mcpg"), "version": f.runtime.get("version", "")},
        }
        out = _result(
            f"Echoed normalized execution request for tool {f.tool_name} through the adapter-facing seam.", structured
        )
    elif f.tool == "command_probe":
        out = await _command_probe(f, step.built.command)
    else:
        out = await _network_probe(f, step.built.http)
    return StepOutput.of(out)


def _tool(name: str, title: str, description: str, tool: str, closed: bool = False, **fields: object) -> dict[str, Any]:
    return {
        "name": name,
        "title": title,
        "description": description,
        "input_schema": {"type": "object", "additionalProperties": not closed},
        "fill_defaults": False,
        "task_support": "forbidden",
        "answer": "mcpg.binding",
        "steps": [{"kind": "mcpg.debug", "id": "debug", "tool": tool, "tool_name": name, **fields}],
    }


def debug_pipelines(
    tools: Mapping[str, Any], runtime: Mapping[str, object], allow_private: bool, counts: tuple[int, int, int]
) -> tuple[list[dict[str, Any]], str | None]:
    """The debug tools, prompt and resource ``debug.tools`` exposes (mcpg's defaults where it says nothing), and
    the place of what mcpipe cannot serve of them (None: all served)."""
    from mcpipe.formats.mcpg._translate import debug_exposure

    exposure = debug_exposure(tools)
    if exposure["network_json_call"]:
        return [], "debug.tools.exposure.network_json_call"
    bindings = {"command_probe_profile": "default_command_probe", "network_probe_profile": "default_network_probe"}
    bindings.update({k: v for k, v in (tools.get("bindings") or {}).items() if k in bindings})
    commands = tools.get("command_profiles") or {"default_command_probe": {}}
    networks = tools.get("network_profiles") or {"default_network_probe": {}}
    out = [
        _tool(
            "mcpg.runtime.snapshot",
            "MCPG Runtime Snapshot",
            "Return the current MCPG runtime snapshot.",
            "runtime_snapshot",
            closed=True,
            runtime=dict(runtime),
        ),
        _tool(
            "mcpg.request.echo",
            "MCPG Request Echo",
            "Return normalized request and argument details through the adapter-facing execution seam.",
            "request_echo",
            runtime=dict(runtime),
        ),
    ]
    networked = {"allow_private": allow_private}
    probes = [("command", "command", commands, {}), ("network", "network probe", networks, networked)]
    for probe, what, profiles, extra in probes:
        if exposure[f"{probe}_probe"]:
            profile = bindings[f"{probe}_probe_profile"]
            out.append(
                _tool(
                    f"mcpg.debug.{probe}_probe",
                    f"MCPG Debug {probe.title()} Probe",
                    f"Execute the configured debug {what} through the {probe}-based execution path.",
                    f"{probe}_probe",
                    False,
                    profile=profile,
                    **{probe: dict(profiles.get(profile) or {}), **extra},
                )
            )
    if exposure["operational_overview_prompt"]:
        text = (
            f"MCPG {runtime.get('version', '')} is running at {runtime.get('bind_address', '')} with MCP endpoint "
            f"{runtime.get('mcp_path', '/mcp')}. Available tools: {counts[0] + len(out)}. Available prompts: "
            f"{counts[1] + 1}. Available resources: {counts[2] + int(exposure['runtime_overview_resource'])}."
        )
        out.append(
            {
                "name": "mcpg_operational_overview",
                "title": "MCPG Operational Overview",
                "description": "Summarize the current MCPG server posture and capability surface.",
                "surface": "prompt",
                "answer": "mcpg.payload",
                "steps": [
                    {
                        "kind": "mock",
                        "id": "overview",
                        "response": {
                            # mcpg says role `system`, which MCP has not (clients refuse the result): `user`.
                            "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
                        },
                    }
                ],
            }
        )
    if exposure["runtime_overview_resource"]:
        out.append(
            {
                "name": "runtime-overview",
                "title": "MCPG Runtime Overview",
                "description": "Current runtime and readiness details for the gateway.",
                "surface": "resource",
                "uri": "mcpg://runtime/overview",
                "mime_type": "application/json",
                "answer": "mcpg.payload",
                "steps": [
                    {
                        "kind": "mcpg.debug",
                        "id": "debug",
                        "tool": "overview",
                        "tool_name": "runtime-overview",
                        "runtime": dict(runtime),
                    }
                ],
            }
        )
    return out, None


if KINDS.get("mcpg.debug") is None:
    KINDS.register(Kind("mcpg.debug", DebugFields, run_debug, build=_build))
