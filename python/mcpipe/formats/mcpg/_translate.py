"""An mcpg config, translated into mcpipe's own layout.

The file is first merged with mcpg's ``MCPG_*`` environment overlay and checked against mcpg's own schema
(:mod:`._schema`), then mcpg's load-time checks that the schema cannot express (unique binding names, their
characters, non-empty descriptions, paths that start with ``/``, ...). Then each section is read with mcpg's
meaning (``docs/formats/mcpg.md`` has the table):

- ``gateway.server`` -> ``http`` (bind address, paths, body limit, origins, access log, the anonymous rate
  limit), ``trust.subject_header`` (``trust_subject_header``), ``outbound.http.allow_private``;
- ``mcp.capabilities.{tools,prompts,resources,resource_templates}`` -> ``pipelines`` (one per binding, its
  ``surface``), their backends as the ``mcpg.*`` step kinds (:mod:`._kinds`) and mcpg's answer shapes
  (:mod:`._answers`); SQL databases -> ``sql``; commands -> ``outbound.commands``;
- ``governance.policy.tool_access`` and each binding's ``governance`` -> ``trust`` (trust levels, CEL);
- ``governance.audit`` -> ``audit``; ``observability`` -> ``telemetry``; ``mcp.federations`` ->
  ``mcpServers``;
- plugins, and the sections that name plugins (audit sinks, metrics and trace sinks, identity providers,
  policy engines, ``cred://`` references): :mod:`.plugins`, by plugin id.

What mcpipe cannot honour is refused, one located line each; nothing that guards access is dropped.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mcpipe._json import JsonObject
from mcpipe.errors import UNSET_ENV, UNSET_ENV_PER_CALL, Problem
from mcpipe.formats import Translation
from mcpipe.formats.mcpg import plugins
from mcpipe.formats.mcpg._names import rename_cel
from mcpipe.formats.mcpg._refusals import reason, set_in
from mcpipe.formats.mcpg._schema import env_overlay, schema_problems
from mcpipe.formats.mcpg._sqlmore import check_list_query
from mcpipe.formats.mcpg._templates import expand_env, expand_env_in

_log = logging.getLogger("mcpipe.formats.mcpg")

__all__ = ["translate"]

CODE = "INVALID_CONFIG"
BUCKETS = ("tools", "prompts", "resources", "resource_templates")
SURFACE = {"tools": "tool", "prompts": "prompt", "resources": "resource", "resource_templates": "resource_template"}
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")

BACKENDS = frozenset({"http", "grpc", "mock", "command", "nats", "kafka", "sql"})
"""mcpg's backends mcpipe has: a binding of kind ``K`` is a step of kind ``mcpg.K``, answering as mcpg's does."""

SUSPENDING = frozenset({"elicitation", "sampling", "roots_list", "gather"})
_STEP_KINDS = frozenset(
    {"transform", "cel_gate", "plugin_transform", "log", "progress", "sql_tx", "sql_await", *SUSPENDING}
)
_DEFAULT_STEP_TIMEOUT = {"http": 2000, "grpc": 2000, "command": 5000, "nats": 2000, "kafka": 10_000}


PIPE_SWITCH = "MCPIPE_MCPG_PIPE"
"""The environment variable that serves ``mcp_pipe`` beside an mcpg file's bindings (``1``, ``true``): mcpg has
no such tool, so an mcpg file serves none unless it is set. Its steps call the bindings as their caller may
(the file's trust rules hold for ``mcp_pipe`` and for each call it makes)."""


class _Out:
    """The mcpipe-layout document being built, the problems, and where each part came from."""

    def __init__(self, source: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        self.source = source
        self.doc: dict[str, Any] = {}
        self.problems: list[Problem] = []
        self.moves: list[tuple[str, str]] = []
        self.environ = environ
        self.raw_plugins: list[Any] = []

    def refuse(self, where: str, why: str) -> None:
        self.problems.append(Problem(where, CODE, why))

    def refuse_set(self, prefix: str) -> None:
        """Each refusal of the table at a plain path under ``prefix`` that the file sets (:func:`.set_in`)."""
        for where, why in set_in(self.source, prefix):
            self.refuse(where, why)

    def unset(self, where: str, name: str) -> None:
        """The file reads the environment variable ``name``, which is not set: ``serve`` refuses the file,
        ``check`` warns (mcpg's ``config check`` does not read the environment)."""
        self.problems.append(Problem(where, UNSET_ENV, f"environment variable `{name}` is not set"))

    def moved(self, new: str, old: str) -> None:
        self.moves.append((new, old))

    def section(self, key: str) -> dict[str, Any]:
        value = self.doc.setdefault(key, {})
        assert isinstance(value, dict)
        return value

    def locate(self, location: str) -> str:
        best: tuple[str, str] | None = None
        for new, old in self.moves:
            inside = location == new or location.startswith((f"{new}.", f"{new}["))
            if inside and (best is None or len(new) > len(best[0])):
                best = (new, old)
        if best is None:
            return location
        return best[1] + location[len(best[0]) :]


def translate(raw: Mapping[str, object], *, base_dir: str, environ: Mapping[str, str]) -> Translation:
    """The mcpg document ``raw`` in mcpipe's layout, with every refusal located in the file."""
    doc = env_overlay(raw, environ)
    out = _Out(doc, environ)
    problems = schema_problems(doc)
    if problems:
        return Translation({}, problems)
    _validate(doc, out)
    if out.problems:
        return Translation({}, out.problems, out.locate)
    # mcpg serves its bindings and nothing else: no mcp_pipe (unless the operator asks for it, PIPE_SWITCH), no
    # built-in tools.
    # mcpg's list results say `ttlMs: 60000`, its reads `30000`, both `cacheScope: private` (caching.rs), on
    # every protocol version; a call naming no tool is the JSON-RPC error -32602 (tools_call.rs).
    out.doc.update(
        name="mcpg",
        builtins=False,
        pipe={"enabled": str(environ.get(PIPE_SWITCH, "")).strip().lower() in ("1", "true", "yes", "on")},
        caching={"every_era": True},
        unknown_tool="error",
    )
    out.raw_plugins = list(doc.get("plugins") or [])
    # plugins first: the credential issuers they configure are what `cred://` references resolve to.
    kafka = _plugins(out.raw_plugins, out)
    gateway = doc.get("gateway") or {}
    _server(gateway.get("server") or {}, out)
    _gateway_rest(gateway, out)
    out.refuse_set("gateway.")
    _governance(doc.get("governance") or {}, out)
    _observability(doc.get("observability") or {}, out)
    schemas = _schema_registry(doc.get("schema_registry") or {}, base_dir, out)
    mcp = doc.get("mcp") or {}
    _capabilities(mcp.get("capabilities") or {}, out, schemas, kafka)
    _configurations(mcp.get("configurations") or {}, out, mcp.get("capabilities") or {})
    _federations(mcp.get("federations") or [], out)
    _registries(mcp.get("registries") or [], out)
    _served_registry(mcp.get("registry") or {}, out)
    _rest(doc, out)
    return Translation(out.doc, out.problems, out.locate, list(out.moves))


def _registry_problem(reg: Mapping[str, Any]) -> str | None:
    """``McpRegistryConfig::validate``: mcpg's message, or None."""
    name = str(reg.get("name", ""))
    path = f"mcp.registries[{name}]"
    if not name.strip():
        return "mcp.registries[]: every registry needs a non-empty `name`"
    if not re.fullmatch(r"[a-z0-9-]+", name):
        return f"{path}: `name` must be lowercase alphanumeric + '-'"
    url = str(reg.get("url", ""))
    if not url.startswith(("https://", "http://")):
        return f"{path}.url must be an http(s) URL"
    if url.startswith("http://") and not (reg.get("registry_safety") or {}).get("allow_insecure_http"):
        return f"{path}.url uses http://; set registry_safety.allow_insecure_http: true to permit it"
    auth = reg.get("auth") or {}
    mode = auth.get("mode", "none")
    if mode == "bearer" and not auth.get("token"):
        return f"{path}.auth: mode `bearer` requires a non-empty `token`"
    if mode == "headers" and not auth.get("headers"):
        return f"{path}.auth: mode `headers` requires at least one header"
    if mode == "cred" and not re.fullmatch(r"cred://[^/]+/.+", str(auth.get("credential") or "")):
        return f"{path}.auth: mode `cred` requires `credential` as a cred://<plugin_id>/<target> URI"
    sync = reg.get("sync") or {}
    if int(sync.get("interval_secs", 300)) < 30:
        return f"{path}.sync.interval_secs must be at least 30"
    for key in ("max_servers", "full_resync_hours"):
        if sync.get(key, 1) == 0:
            return f"{path}.sync.{key} must be greater than zero"
    if not _exposed((reg.get("defaults") or {}).get("import"), True):
        return f"{path}.import: at least one of tools, resources, resource_templates, prompts must be true"
    for server in reg.get("servers") or {}:
        if not str(server).strip():
            return f"{path}.servers: server keys must be non-empty registry names"
    return None


def _exposed(switches: Mapping[str, object] | None, everything: bool) -> list[str]:
    """What a registry's servers (``everything``: by default, all of it) or a federation's server (by default,
    its tools) serve, by their ``import`` switches."""
    on = {"tools": True, "resources": everything, "resource_templates": everything, "prompts": everything}
    on.update({k: bool(v) for k, v in (switches or {}).items() if k in on})
    return [k for k, v in on.items() if v]


def _registries(registries: list[Any], out: _Out) -> None:
    """``mcp.registries``: mcpg's registry sync as mcpipe's ``registries`` (``docs/server.md``): the registry's
    servers served as downstream servers, kept in step with it, with each registry's ``defaults`` (its governance
    as their trust rule, what they import, their auth, the private-address opt-in, OAuth discovery)."""
    entries = []
    for i, reg in enumerate(registries):
        where = f"mcp.registries[{i}]"
        problem = _registry_problem(reg)
        if problem is not None:
            out.refuse(where, problem)
            continue
        auth = reg.get("auth") or {}
        headers: dict[str, str] = {}
        if auth.get("mode") == "bearer":
            headers["Authorization"] = f"Bearer {auth['token']}"
        elif auth.get("mode") == "headers":
            headers.update({str(k): str(v) for k, v in auth["headers"].items()})
        elif auth.get("mode") == "cred":
            out.refuse(f"{where}.auth.mode", reason("registry_cred"))
            continue
        headers, missing = _expand_all(headers, out)
        if missing:
            out.unset(f"{where}.auth", missing[0])
            continue
        safety, sync, flt, defaults = (reg.get(k) or {} for k in ("registry_safety", "sync", "filter", "defaults"))
        entry: dict[str, Any] = {
            "name": reg["name"],
            "url": reg["url"],
            "headers": headers,
            "allow_private": bool(safety.get("allow_private_registry")),
            "allow_http": bool(safety.get("allow_insecure_http")),
            "interval_s": int(sync.get("interval_secs", 300)),
            "max_servers": int(sync.get("max_servers", 100)),
            "include": list(flt.get("include", ["*"])),
            "exclude": list(flt.get("exclude") or []),
            "namespaces": list(flt.get("namespaces") or []),
            "deprecated": "exclude" if reg.get("on_deprecated") == "exclude" else "serve",
            "allow_private_servers": bool((defaults.get("upstream_safety") or {}).get("allow_private_backends")),
            "oauth_discovery": bool((defaults.get("oauth_discovery") or {}).get("enabled")),
        }
        entry["trust"] = _trust_rule(defaults)
        entry["expose"] = _exposed(defaults.get("import"), True)
        if not _registry_auth(defaults.get("auth") or {}, entry, f"{where}.defaults.auth", out):
            continue
        servers: dict[str, Any] = {}
        for name, over in (reg.get("servers") or {}).items():
            at = f"{where}.servers.{name}"
            if (over or {}).get("auth") is not None:
                out.refuse(f"{at}.auth", reason("registry_server_auth"))
                break
            given, missing = _expand_all({str(k): str(v) for k, v in ((over or {}).get("headers") or {}).items()}, out)
            if missing:
                out.unset(f"{at}.headers", missing[0])
                break
            servers[name] = {
                "enabled": bool((over or {}).get("enabled", True)),
                "variables": {str(k): str(v) for k, v in ((over or {}).get("variables") or {}).items()},
                "headers": given,
            }
            if (over or {}).get("version") is not None:
                servers[name]["version"] = str(over["version"])
        else:
            entry["servers"] = servers
            entries.append(entry)
            out.moved(f"registries[{len(entries) - 1}]", where)
    if entries:
        out.doc["registries"] = entries


def _expand_all(values: Mapping[str, str], out: _Out) -> tuple[dict[str, str], list[str]]:
    missing: list[str] = []
    expanded = expand_env_in(values, "", out.environ, lambda _, name: missing.append(name))
    return expanded, missing


def _registry_auth(auth: Mapping[str, object], entry: JsonObject, where: str, out: _Out) -> bool:
    """A registry's ``defaults.auth`` for its servers: ``pass_through`` forwards the caller's bearer; the OAuth
    modes present a credential (``{server}`` in its target: one per server, the target named by the server)."""
    mode = auth.get("mode", "none")
    if mode == "none":
        return True
    if mode == "pass_through":
        entry["forward_bearer"] = True
        return True
    if mode not in ("oauth_client_credentials", "oauth_impersonation"):
        out.refuse(f"{where}.mode", reason("registry_auth", mode=str(mode)))
        return False
    uri = str(auth.get("credential") or "").strip()
    if uri.startswith("${") and uri.endswith("}"):
        uri = uri[2:-1].strip()
    m = re.fullmatch(r"cred://([^/\s]+)/([^#\s]+)", uri)
    if m is None:
        out.refuse(f"{where}.credential", f"`{uri}` is not a cred://<plugin_id>/<target> reference")
        return False
    plugin, target = m.groups()
    if "{server}" in target:
        entry["credential"] = f"{plugin}/{target}"
        entry["credential_env"] = plugins.env_credential_variable(plugin, "").rstrip("_") + "_" + target
        return True
    name = plugins.credential_ref(uri, f"{where}.credential", out.doc, out.problems, out.environ)
    if name is None:
        return False
    entry["credential"] = name
    return True


def _served_registry(registry: Mapping[str, object], out: _Out) -> None:
    """``mcp.registry``: this gateway as an MCP registry's one entry (``ServedRegistryConfig``)."""
    if not registry.get("enabled"):
        return
    name = str(registry.get("name") or "")
    namespace, sep, rest = name.partition("/")
    if not sep:
        out.refuse(
            "mcp.registry.name",
            "mcp.registry.name must be reverse-DNS namespaced (`<namespace>/<name>`, e.g. `com.acme/gateway`)",
        )
        return
    if not namespace.strip() or not rest.strip():
        out.refuse("mcp.registry.name", "mcp.registry.name must be `<namespace>/<name>` with both parts non-empty")
        return
    url = registry.get("url")
    if url is not None and not str(url).startswith(("https://", "http://")):
        out.refuse("mcp.registry.url", "mcp.registry.url must be an http(s) URL")
        return
    out.doc["registry"] = {k: registry[k] for k in ("enabled", "name", "description", "url") if k in registry}
    out.moved("registry", "mcp.registry")


# --- mcpg's own load-time checks ------------------------------------------------------------------


def _validate(doc: Mapping[str, Any], out: _Out) -> None:
    server = ((doc.get("gateway") or {}).get("server")) or {}
    where = "gateway.server"
    if not str(server.get("bind_address", "127.0.0.1:8787")).strip():
        out.refuse(f"{where}.bind_address", "gateway.server.bind_address must not be empty")
    for key, default in (("health_path", "/health"), ("mcp_path", "/mcp")):
        if not str(server.get(key, default)).startswith("/"):
            out.refuse(f"{where}.{key}", f"gateway.server.{key} must start with '/'")
    for key in ("replay_window_limit", "session_idle_timeout_ms", "shutdown_timeout_ms", "request_timeout_ms"):
        if key in server and server[key] == 0:
            out.refuse(f"{where}.{key}", f"gateway.server.{key} must be greater than zero")
    for i, origin in enumerate(server.get("allowed_origins") or []):
        if not str(origin).strip():
            out.refuse(f"{where}.allowed_origins[{i}]", "gateway.server.allowed_origins entries must not be empty")
    caps = ((doc.get("mcp") or {}).get("capabilities")) or {}
    seen: dict[str, str] = {}
    index = 0
    for bucket in BUCKETS:
        for j, b in enumerate(caps.get(bucket) or []):
            loc = f"mcp.capabilities.{bucket}[{j}]"
            path = f"bindings[{index}]"
            index += 1
            for field, why in _binding_problems(b, seen, loc):
                at = "backend.kind" if field == "kind" else field  # mcpg's message names the binding's kind
                out.refuse(f"{loc}.{at}", f"{path}.{field} {why}")
    rules = (((doc.get("governance") or {}).get("policy") or {}).get("tool_access") or {}).get("rules") or []
    rule_names: set[str] = set()
    for i, rule in enumerate(rules):
        loc = f"governance.policy.tool_access.rules[{i}]"
        name = rule.get("tool_name", "")
        if not str(name).strip():
            out.refuse(f"{loc}.tool_name", "policy.tool_access.rules[].tool_name must not be empty")
        elif name in rule_names:
            out.refuse(f"{loc}.tool_name", f"policy.tool_access.rules has a duplicate rule for '{name}'")
        elif name in seen:
            out.refuse(
                f"{loc}.tool_name",
                f"policy.tool_access.rules must not configure '{name}' directly; use the binding's "
                "governance.minimum_trust and governance.allow_if instead",
            )
        rule_names.add(name)
        if rule.get("cel_allow_if") is not None and not str(rule["cel_allow_if"]).strip():
            out.refuse(f"{loc}.cel_allow_if", "policy.tool_access.rules[].cel_allow_if must not be empty")


def _binding_problems(b: Mapping[str, Any], seen: dict[str, str], loc: str) -> Iterator[tuple[str, str]]:
    """mcpg's load-time checks of the binding at ``loc`` (``seen``: the names before it): (field, why)."""
    name = b.get("name", "")
    if not name.strip():
        yield "name", "must not be empty"
    elif len(name) > 128:
        yield "name", f"'{name}' exceeds the MCP 128-character guidance"
    elif not _NAME.fullmatch(name):
        yield "name", f"'{name}' contains characters outside the MCP tool-name guidance ([A-Za-z0-9_.-])"
    elif name in seen:
        yield "name", f"'{name}' is duplicated; binding names must be unique"
    else:
        seen[name] = loc
    if not str(b.get("description", "")).strip():
        yield "description", "must not be empty"
    if b.get("title") is not None and not str(b["title"]).strip():
        yield "title", "must not be whitespace-only when provided"
    kind = (b.get("backend") or {}).get("kind", "")
    if not str(kind).strip():
        yield "kind", "must not be empty"
    retry = b.get("retry")
    if retry is not None and kind in ("mock", "pipeline", "command", "sql"):
        yield "retry", f"is not supported for {kind} bindings"
    elif isinstance(retry, Mapping):
        if retry.get("max_attempts", 3) == 0:
            yield "retry.max_attempts", "must be greater than 0"
        elif retry.get("max_attempts", 3) > 10:
            yield "retry.max_attempts", "must not exceed 10"
        if retry.get("initial_backoff_ms", 200) == 0:
            yield "retry.initial_backoff_ms", "must be greater than 0"
    for k, icon in enumerate(b.get("icons") or []):
        if not str((icon or {}).get("src", "")).strip().lower().startswith(("https://", "data:")):
            yield f"icons[{k}].src", "must be an https:// URL or a data: URI"
    for field in ("input_schema", "output_schema"):
        if b.get(field) is not None and not isinstance(b[field], Mapping):
            yield field, "must be a JSON object when provided"


# --- gateway -----------------------------------------------------------------------------------------


def _bind(address: str) -> tuple[str, int] | None:
    m = re.fullmatch(r"\[?([^\]]*?)\]?:(\d{1,5})", address.strip())
    if m is None:
        return None
    return m.group(1), int(m.group(2))


def _server(server: Mapping[str, Any], out: _Out) -> None:
    http = out.section("http")
    where = "gateway.server"
    bind = _bind(str(server.get("bind_address", "127.0.0.1:8787")))
    if bind is None:
        out.refuse(f"{where}.bind_address", "not a host:port address")
    else:
        http["host"], http["port"] = bind
        out.moved("http.host", f"{where}.bind_address")
        out.moved("http.port", f"{where}.bind_address")
    http["path"] = server.get("mcp_path", "/mcp")
    out.moved("http.path", f"{where}.mcp_path")
    http["health_path"] = server.get("health_path", "/health")
    out.moved("http.health_path", f"{where}.health_path")
    http["max_body_bytes"] = int(server.get("max_request_body_mb", 4)) * 1024 * 1024
    out.moved("http.max_body_bytes", f"{where}.max_request_body_mb")
    if server.get("allowed_origins"):
        http["allowed_origins"] = list(server["allowed_origins"])
        out.moved("http.allowed_origins", f"{where}.allowed_origins")
    http["session_idle_timeout_s"] = int(server.get("session_idle_timeout_ms", 900_000)) / 1000
    http["access_log"] = bool(server.get("access_log", True))
    http["anonymous_rate_limit_per_min"] = int(server.get("anonymous_rate_limit_per_min", 600))
    http["anonymous_rate_limit_burst"] = int(server.get("anonymous_rate_limit_burst", 100))
    out.moved("http.anonymous_rate_limit_per_min", f"{where}.anonymous_rate_limit_per_min")
    if server.get("request_timeout_ms") is not None:
        out.section("pipe")["timeout_ms"] = int(server["request_timeout_ms"])
        out.moved("pipe.timeout_ms", f"{where}.request_timeout_ms")
    if server.get("trust_subject_header"):
        out.section("trust")["subject_header"] = "x-mcpg-subject-id"
    outbound_http = out.section("outbound").setdefault("http", {})
    outbound_http["allowed_hosts"] = ["*"]  # mcpg reaches any host; the address guard below still applies
    outbound_http["allow_private"] = bool(server.get("allow_private_backends", False))
    if server.get("tls"):
        _tls(server["tls"], f"{where}.tls", out)
    if server.get("max_sessions_per_tenant"):  # 0: unlimited
        http["max_sessions_per_tenant"] = int(server["max_sessions_per_tenant"])
        out.moved("http.max_sessions_per_tenant", f"{where}.max_sessions_per_tenant")


def _tls(tls: Mapping[str, object], where: str, out: _Out) -> None:
    """``gateway.server.tls`` (``TlsConfig``, checked as mcpg checks it) as mcpipe's ``http.tls``."""
    cert, key = str(tls.get("cert_path", "")), str(tls.get("key_path", ""))
    version = str(tls.get("min_tls_version", "1.2")).strip()
    mode = str(tls.get("client_cert_required", "none"))
    ca = tls.get("client_ca_certs_path")
    if not cert.strip():
        out.refuse(f"{where}.cert_path", "server.tls.cert_path must not be empty")
    elif not key.strip():
        out.refuse(f"{where}.key_path", "server.tls.key_path must not be empty")
    elif version not in ("1.2", "1.3"):
        out.refuse(f"{where}.min_tls_version", f'server.tls.min_tls_version must be "1.2" or "1.3", got "{version}"')
    elif mode == "none" and ca is not None:
        out.refuse(
            f"{where}.client_ca_certs_path",
            "server.tls.client_ca_certs_path must be unset when client_cert_required is `none`",
        )
    elif mode != "none" and not str(ca or "").strip():
        out.refuse(
            f"{where}.client_ca_certs_path",
            "server.tls.client_ca_certs_path must be set (PEM bundle of CA certs) when client_cert_required is "
            "`optional` or `mandatory`",
        )
    else:
        entry: dict[str, Any] = {"cert_file": cert, "key_file": key, "min_version": version}
        if mode != "none":
            entry["client_ca_file"] = str(ca)
            entry["client_cert"] = "required" if mode == "mandatory" else "optional"
        out.section("http")["tls"] = entry
        out.moved("http.tls", where)


def _gateway_rest(gateway: Mapping[str, Any], out: _Out) -> None:
    watch = gateway.get("config_watch") or {}
    if watch.get("enabled"):
        # SHA-256 of the file every poll_interval_ms, floored at 1 s (config_watch.rs); SIGHUP reloads too.
        out.doc["reload"] = {"watch": True, "poll_ms": max(int(watch.get("poll_interval_ms", 5000)), 1000)}
        out.moved("reload", "gateway.config_watch")


# --- governance ---------------------------------------------------------------------------------------


def _governance(gov: Mapping[str, Any], out: _Out) -> None:
    access = out.section("trust")
    policy = gov.get("policy") or {}
    tool_access = policy.get("tool_access") or {}
    access["default_minimum_trust"] = tool_access.get("default_minimum_trust", "header_asserted")
    out.moved("trust.default_minimum_trust", "governance.policy.tool_access.default_minimum_trust")
    if tool_access.get("cel_allow_if"):
        access["allow_if"] = tool_access["cel_allow_if"]
        out.moved("trust.allow_if", "governance.policy.tool_access.cel_allow_if")
    rules = access.setdefault("tools", {})
    for i, rule in enumerate(tool_access.get("rules") or []):
        rules[rule["tool_name"]] = _rule(rule, "cel_allow_if")
        out.moved(f"trust.tools.{rule['tool_name']}", f"governance.policy.tool_access.rules[{i}]")
    loaded = {
        str(p.get(k))
        for p in (out.raw_plugins or [])
        if isinstance(p, Mapping) and not p.get("disabled")
        for k in ("id", "ref")
        if p.get(k)
    }
    for i, engine in enumerate(policy.get("engine") or []):
        kind = engine.get("kind")
        if kind not in loaded:
            # mcpg's config check resolves the engine among the plugins[] entries (resolve_kind).
            out.refuse(f"governance.policy.engine[{i}].kind", f"no plugin `{kind}` in plugins[] is a policy engine")
    acc = gov.get("access") or {}
    if acc.get("jwks"):
        _jwks(acc["jwks"], "governance.access.jwks", out)
    if acc.get("oidc_oauth"):
        plugins.translate_oidc(acc["oidc_oauth"], "governance.access.oidc_oauth", out.doc, out.problems)
    out.refuse_set("governance.access.")
    _audit(gov.get("audit") or {}, out)
    out.refuse_set("governance.quotas.")
    approvals = gov.get("approvals") or {}
    if approvals.get("callback_base_url") or approvals.get("signing_key_env"):
        out.refuse("governance.approvals", reason("approvals"))


_SINK_NAMESPACE = {"audit": "audit", "metrics": "observability", "traces": "observability", "logs": "observability"}
_SINK_KEYWORDS = frozenset({"builtin", "in-process", "memory", "file", "stderr", "stdout"})


def _sinks(signal: str, section: Mapping[str, Any], where: str, out: _Out) -> None:
    """The ``sinks`` of ``section`` (at ``where``), each read by :func:`.plugins.translate_sink`; a sink whose
    ``kind`` is a short alias (``prometheus``) with the plugin id mcpg expands it to
    (``dev.mcpg.observability.prometheus``: ``resolve_kind``'s rule 3, ``config/wiring.rs``)."""
    for i, sink in enumerate(section.get("sinks") or []):
        kind = sink.get("kind") if isinstance(sink, Mapping) else None
        if signal == "logs" and kind in ("stderr", "dev.mcpg.builtin.log.stderr-json"):
            continue  # mcpg's own stderr sink
        if isinstance(kind, str) and kind.strip() and "." not in kind and kind.strip() not in _SINK_KEYWORDS:
            sink = {**sink, "kind": f"dev.mcpg.{_SINK_NAMESPACE[signal]}.{kind.strip()}"}
        plugins.translate_sink(signal, sink, f"{where}.sinks[{i}]", out.doc, out.problems)


def _audit(audit: Mapping[str, Any], out: _Out) -> None:
    enabled = bool(audit.get("enabled", True))
    section = out.section("audit")
    section["enabled"] = enabled
    out.moved("audit.enabled", "governance.audit.enabled")
    if enabled:
        _sinks("audit", audit, "governance.audit", out)


# --- observability --------------------------------------------------------------------------------


def _observability(obs: Mapping[str, Any], out: _Out) -> None:
    telemetry = out.section("telemetry")
    on = bool(obs.get("enabled", True))
    metrics = obs.get("metrics") or {}
    telemetry["metrics"] = on and bool(metrics.get("enabled", True))
    if telemetry["metrics"]:
        _sinks("metrics", metrics, "observability.metrics", out)
    traces = obs.get("traces") or {}
    if on and traces.get("enabled"):
        _sinks("traces", traces, "observability.traces", out)
        if traces.get("service_name") and "service_name" not in telemetry:
            telemetry["service_name"] = traces["service_name"]
    elif traces.get("propagate_context", True):
        telemetry.setdefault("traces", "propagate")
    _sinks("logs", obs.get("logs") or {}, "observability.logs", out)


def _jwks(jwks: Mapping[str, object], loc: str, out: _Out) -> None:
    """mcpg's built-in JWKS verification: an ``[[auth.oidc]]`` issuer with its keys (inline or at ``url``)."""
    if not jwks.get("issuer"):
        out.refuse(f"{loc}.issuer", "mcpipe checks the issuer of every JWT: give governance.access.jwks.issuer")
        return
    provider: dict[str, Any] = {
        "issuer": jwks["issuer"],
        "header": str(jwks.get("header_name", "authorization")).lower(),
        "prefix": jwks.get("header_prefix", "Bearer "),
    }
    if jwks.get("audience"):
        provider["audiences"] = [jwks["audience"]]
    elif jwks.get("allow_missing_audience"):
        provider["any_audience"] = True
    if jwks.get("keys_json"):
        provider["jwks"] = jwks["keys_json"]
    elif jwks.get("url"):
        provider["jwks_url"] = jwks["url"]
    out.doc.setdefault("auth", {}).setdefault("oidc", []).append(provider)
    at = f"auth.oidc[{len(out.doc['auth']['oidc']) - 1}]"
    for new, old in (("", ""), (".jwks", ".keys_json"), (".jwks_url", ".url"), (".audiences", ".audience")):
        out.moved(f"{at}{new}", f"{loc}{old}")


# --- plugins --------------------------------------------------------------------------------------


def _plugins(entries: Sequence[Mapping[str, Any]], out: _Out) -> dict[str, Any]:
    """The ``plugins[]`` entries, read by :mod:`.plugins` (each id's meaning, or a located refusal). Answers
    the Kafka plugin's connection config (``bootstrap_servers``, ``group_id``): mcpg hands it to the plugin
    when it builds it, and mcpipe's kafka steps take it from there."""
    kafka: dict[str, Any] = {}
    given = []
    for entry in entries:  # objects, as mcpg's schema says
        if (entry.get("ref") or entry.get("id")) == "dev.mcpg.backend.kafka":
            config = entry.get("config")
            if isinstance(config, Mapping) and not entry.get("disabled"):
                kafka = dict(config)
            entry = {k: v for k, v in entry.items() if k != "config"}
        given.append(entry)
    plugins.translate_plugins(given, "plugins", out.doc, out.problems, out.environ)
    out.doc.pop("plugins", None)  # JSONata (the one transform plugin) is built into mcpipe's plugin_transform
    return kafka


# --- schema registry ------------------------------------------------------------------------------


def _schema_registry(registry: Mapping[str, Any], base_dir: str, out: _Out) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for name, entry in registry.items():
        where = f"schema_registry.{name}"
        if entry.get("inline") is not None:
            schemas[name] = entry["inline"]
        elif entry.get("file"):
            path = Path(base_dir, entry["file"])
            try:
                schemas[name] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                out.refuse(f"{where}.file", f"cannot read the schema '{path}': {e}")
        elif entry.get("url"):
            out.refuse(f"{where}.url", reason("schema_url"))
    return schemas


# --- bindings -------------------------------------------------------------------------------------


class _Binding:
    """What translating one binding needs: where it is, its name, and the document being built."""

    def __init__(
        self, out: _Out, loc: str, name: str, schemas: Mapping[str, object], kafka: Mapping[str, object]
    ) -> None:
        self.out = out
        self.loc = loc
        self.name = name
        self.schemas = schemas
        self.kafka = kafka
        self.sql_names: dict[str, str] = {}
        self.sql_bindings: dict[str, Any] = {}
        self.unset: list[str] = []

    def env(self, value: object, where: str) -> Any:
        """``${env.NAME}`` resolved in every string of ``value``, as mcpg does when it starts (a variable that is
        not set is noted in ``unset``, and is a located warning of ``mcpipe check``: mcpg's config check passes
        it, its start fails, mcpipe serves the binding failing each call). ``${cred://…}`` tokens stay: an http
        header's become the step's credential (:func:`.plugins.http_credential`)."""

        def unset(at: str, name: str) -> None:
            self.unset.append(name)
            self.out.problems.append(Problem(at, UNSET_ENV_PER_CALL, f"environment variable `{name}` is not set"))

        return expand_env_in(value, where, self.out.environ, unset)

    def schema(self, value: object, where: str) -> Any:
        if isinstance(value, Mapping) and "$schema_ref" in value:
            ref = value["$schema_ref"]
            if ref not in self.schemas:
                self.out.refuse(where, f"no schema `{ref}` in schema_registry")
                return None
            return self.schemas[ref]
        return value


def _capabilities(
    caps: Mapping[str, Any], out: _Out, schemas: Mapping[str, object], kafka: Mapping[str, object]
) -> None:
    pipelines: list[dict[str, Any]] = out.doc.setdefault("pipelines", [])
    access = out.section("trust").setdefault("tools", {})
    sql_backends: dict[str, str] = {}
    # sql_tx and sql_await steps name a sql binding: its database is known before any pipeline is read.
    sql_bindings = {
        b["name"]: b["backend"]
        for bucket in BUCKETS
        for b in caps.get(bucket) or []
        if (b.get("backend") or {}).get("kind") == "sql"
    }
    for bucket in BUCKETS:
        for j, binding in enumerate(caps.get(bucket) or []):
            loc = f"mcp.capabilities.{bucket}[{j}]"
            b = _Binding(out, loc, binding["name"], schemas, kafka)
            b.sql_names = sql_backends
            b.sql_bindings = sql_bindings
            if (binding.get("backend") or {}).get("kind") == "openapi":
                _openapi_binding(b, binding, SURFACE[bucket])
                continue
            entry = _binding(b, binding, SURFACE[bucket])
            if entry is None:
                continue
            pipelines.append(entry)
            out.moved(f"pipelines.{b.name}", loc)
            access[b.name] = _trust_rule(binding)
            out.moved(f"trust.tools.{b.name}", f"{loc}.governance")
    # mcpg lists tools and prompts by name, resources by URI, templates by URI template (capability_registry.rs)
    order = {"tool": 0, "prompt": 1, "resource": 2, "resource_template": 3, "hidden": 4}
    pipelines.sort(key=lambda e: (order[e["surface"]], e.get("uri") or e.get("uri_template") or e["name"]))
    tasks = caps.get("tasks") or {}
    if tasks.get("store") and (tasks["store"] or {}).get("kind") not in (None, "memory", "cluster"):
        out.refuse("mcp.capabilities.tasks.store", reason("store", kind=str((tasks["store"] or {}).get("kind"))))


def _trust_rule(binding: Mapping[str, Any]) -> dict[str, Any]:
    """A binding's (a federation's, a registry's defaults') ``governance`` as its ``[trust.tools.NAME]`` rule."""
    return _rule(binding.get("governance") or {}, "allow_if")


def _rule(gov: Mapping[str, Any], allow_if: str) -> dict[str, Any]:
    """A ``governance`` block, or a ``tool_access`` rule (its CEL in ``cel_allow_if``), as a trust rule."""
    rule: dict[str, Any] = {"minimum_trust": gov.get("minimum_trust", "header_asserted")}
    if gov.get(allow_if):
        rule["allow_if"] = gov[allow_if]
    if gov.get("required_scopes"):
        rule["required_scopes"] = list(gov["required_scopes"])
    return rule


_ANNOTATIONS = {
    "read_only": "readOnlyHint",
    "destructive": "destructiveHint",
    "idempotent": "idempotentHint",
    "open_world": "openWorldHint",
}


def _hints(binding: Mapping[str, Any]) -> dict[str, object]:
    """A binding's ``annotations`` as MCP's tool hints."""
    given = binding.get("annotations") or {}
    return {_ANNOTATIONS[k]: v for k, v in given.items() if k in _ANNOTATIONS and v is not None}


def _openapi_binding(b: _Binding, binding: Mapping[str, Any], surface: str) -> None:
    """An ``openapi`` binding: the operation its source's document describes, served as the binding's tool (a
    reshaped tool over the operation's, which it hides): the schema is the operation's, as mcpg derives it."""
    out, loc = b.out, b.loc
    backend = dict(binding["backend"])
    where = f"{loc}.backend"
    if surface != "tool":
        out.refuse(loc, "an openapi binding is served as a tool (mcpipe derives no resource from an operation)")
        return
    unknown = sorted(set(backend) - {"kind", "source", "operation"})
    if unknown:
        out.refuse(f"{where}.{unknown[0]}", f"an openapi binding takes `source` and `operation`, not `{unknown[0]}`")
        return
    sections = out.doc.get("openapi") or {}
    source, operation = backend.get("source"), backend.get("operation")
    if not isinstance(source, str) or source not in sections:
        known = ", ".join(sorted(sections)) or "none: add the dev.mcpg.backend.openapi plugin"
        out.refuse(f"{where}.source", f"no openapi source `{source}` in the plugin's config.sources ({known})")
        return
    if not isinstance(operation, str) or not operation:
        out.refuse(f"{where}.operation", "an openapi binding names its operation's operationId")
        return
    from mcpipe.openapi import tool_name

    section = sections[source]
    include = section.get("include")
    if isinstance(include, dict) and operation not in include.setdefault("operations", []):
        include["operations"].append(operation)
    shape: dict[str, Any] = {"tool": f"{section['prefix']}.{tool_name(operation)}", "hide_original": True}
    shape.update({k: binding[k] for k in ("description", "title") if binding.get(k)})
    if hints := _hints(binding):
        shape["annotations"] = hints
    out.section("tools").setdefault("reshape", {})[b.name] = shape
    out.moved(f"tools.reshape.{b.name}", loc)
    out.section("trust").setdefault("tools", {})[b.name] = _trust_rule(binding)


def _binding(b: _Binding, binding: Mapping[str, Any], surface: str) -> dict[str, Any] | None:
    loc = b.loc
    out = b.out
    # mcpg checks the arguments against the input schema and passes them as sent (no defaults filled in).
    entry: dict[str, Any] = {
        "name": b.name,
        "description": binding["description"],
        "surface": surface,
        "fill_defaults": False,
        "check_formats": False,  # the jsonschema crate's default
    }
    if binding.get("title"):
        entry["title"] = binding["title"]
    schema = b.schema(binding.get("input_schema"), f"{loc}.input_schema")
    if surface == "tool":
        entry["input_schema"] = schema if schema is not None else {"type": "object", "additionalProperties": True}
        out.moved(f"pipelines.{b.name}.input_schema", f"{loc}.input_schema")
        output = b.schema(binding.get("output_schema"), f"{loc}.output_schema")
        if output is not None:
            entry["output_schema"] = output
        if hints := _hints(binding):
            entry["annotations"] = hints
        # mcpg runs a binding as a task only when it says so
        support = binding.get("task_support")
        entry["task_support"] = support if support in ("optional", "required", "forbidden") else "forbidden"
    elif surface == "prompt":
        args = []
        for arg in binding.get("prompt_arguments") or []:
            a = {"name": arg["name"], "required": bool(arg.get("required", False))}
            if arg.get("description"):
                a["description"] = arg["description"]
            args.append(a)
        entry["arguments"] = args
    elif surface == "resource":
        entry["uri"] = binding.get("uri") or f"mcpg://resources/{b.name}"
    else:
        if not binding.get("uri_template"):
            out.refuse(f"{loc}.uri_template", "a resource template needs `uri_template`")
            return None
        if not re.search(r"\{[^}]+\}", binding["uri_template"]):
            out.refuse(f"{loc}.uri_template", "a resource template needs at least one `{variable}`")
            return None
        entry["uri_template"] = binding["uri_template"]
    if surface in ("resource", "resource_template") and binding.get("mime_type"):
        entry["mime_type"] = binding["mime_type"]
    meta = binding.get("descriptor_meta")
    if isinstance(meta, Mapping) and meta:
        entry["meta"] = dict(meta)
    for key, why in (
        ("quotas", reason("quota_ref")),
        ("content_storage", reason("content_storage")),
        ("mcp_app_url", reason("app_url")),
    ):
        if binding.get(key):
            out.refuse(f"{loc}.{key}", why)
    if binding.get("watch") and surface == "resource" and binding.get("uri"):
        # mcpg watches a binding's concrete `uri` only (build_watch_configs skips templates and URI-less ones).
        watch = _watch(binding["watch"], f"{loc}.watch", out)
        if watch is not None:
            entry["watch"] = watch
            out.moved(f"pipelines.{b.name}.watch", f"{loc}.watch")
    cache = binding.get("cache")
    if cache and cache.get("kind") != "disabled":
        out.refuse(f"{loc}.cache", reason("cache"))
    completions: dict[str, Any] = {}
    for arg in binding.get("prompt_arguments") or []:
        if arg.get("completions"):
            completions[arg["name"]] = [str(v) for v in arg["completions"]]
    for var, spec in (binding.get("variable_completions") or {}).items():
        if isinstance(spec, list):
            completions[var] = [str(v) for v in spec]
        elif isinstance(spec, Mapping) and spec.get("kind") == "static":
            completions[var] = [str(v) for v in spec.get("values") or []]
        else:
            completions[var] = _dynamic_completion(b, var, spec, f"{loc}.variable_completions.{var}")
    if completions:
        entry["completions"] = completions
    backend = dict(binding["backend"])
    kind = backend.pop("kind")
    if kind == "pipeline":
        return _pipeline(b, entry, backend, f"{loc}.backend")
    list_query = backend.pop("list_query", None) if kind == "sql" else None
    step = _backend_step(b, kind, backend, f"{loc}.backend", answer="result", step_id="call", profile=b.name)
    if step is None:
        return None
    if list_query and surface in ("resource", "resource_template") and step.get("kind") == "mcpg.sql":
        # (a database URL naming an unset variable leaves no database to list from: the binding fails per call)
        # mcpg lists the rows of a sql resource's (or template's) list_query after the fixed resources.
        problem = check_list_query(list_query)
        if problem is not None:
            out.refuse(f"{loc}.backend.list_query", problem)
            return None
        hidden = f"mcpg.list.{b.name}"
        fields = {k: list_query[k] for k in ("mode", "cursor_column", "page_size") if list_query.get(k) is not None}
        lister = {"kind": "mcpg.sql_list", "id": "list", "backend": step["backend"], "sql": list_query["sql"]}
        _hidden(out, hidden, [{**lister, **fields, "name": b.name}], f"{loc}.backend.list_query")
        entry["listing"] = hidden
    if binding.get("retry") is not None:
        if not str(step.get("kind", "")).startswith("mcpg."):
            out.refuse(f"{loc}.retry", reason("retry", kind=kind))
        else:
            step["retry"] = dict(binding["retry"])
            out.moved(f"pipelines.{b.name}.steps[0].retry", f"{loc}.retry")
    entry["answer"] = "mcpg.payload" if step.pop("mcpg_answer", None) is not None else "mcpg.binding"
    entry["steps"] = [step]
    out.moved(f"pipelines.{b.name}.steps[0]", f"{loc}.backend")
    return entry


def _hidden(out: _Out, name: str, steps: list[dict[str, object]], where: str) -> None:
    """A pipeline the server runs itself (a completion source, a listing), declared after the bindings."""
    out.doc.setdefault("pipelines", []).append(
        {"name": name, "description": f"{where} (run by the server)", "surface": "hidden", "steps": steps}
    )
    out.moved(f"pipelines.{name}.steps[0]", where)


def _dynamic_completion(b: _Binding, var: str, spec: object, where: str) -> Any:
    """A ``kind: dynamic`` variable completion: a lookup on the backend of the binding it names (mcpg's
    ``complete_template_variable``). The SQL plugin is the one backend that answers it; a binding of any other
    kind, or none of that name, offers nothing (mcpg logs it and answers an empty completion)."""
    target = spec.get("backend") if isinstance(spec, Mapping) else None
    config = (spec.get("config") if isinstance(spec, Mapping) else None) or {}
    backend = _sql_backend_of(b, target, where)
    if backend is None or not isinstance(config, Mapping) or not isinstance(config.get("query"), str):
        return []
    name = f"mcpg.complete.{b.name}.{var}"
    step = {"kind": "mcpg.sql_complete", "id": "complete", "backend": backend, "query": config["query"]}
    if isinstance(config.get("max_results"), int):
        step["max_results"] = config["max_results"]
    _hidden(b.out, name, [step], f"{where}.config")
    return {"pipeline": name}


_POLL_FLOOR_MS = 10_000
"""mcpg polls a watched resource at most every 10 s (``watch_engine.rs`` ``poll_interval``)."""


def _watch(watch: Mapping[str, Any], where: str, out: _Out) -> dict[str, Any] | None:
    """A binding's ``watch`` (``ResourceWatchConfig``) as mcpipe's: mcpg's poll strategy (SHA-256 of the read's
    first text, floored at 10 s) and webhook strategy (``POST /webhooks/resource-updated/{token}``); the
    notification filter's ``expression`` scope as ``notify_if``. The ``subject_id`` and ``session_id`` scopes
    fall back to every subscriber for these strategies' events (they carry no user or session), as in mcpg."""
    strategy = dict(watch.get("strategy") or {"type": "poll"})
    kind = strategy.get("type", "poll")
    entry: dict[str, Any] = {}
    if kind == "poll":
        entry["poll_ms"] = max(int(strategy.get("interval_ms", 60_000)), _POLL_FLOOR_MS)
    elif kind == "webhook":
        token, missing = expand_env(str(strategy.get("token") or ""), out.environ)
        if missing:
            out.unset(f"{where}.strategy.token", missing[0])
            return None
        if not token:
            import uuid

            token = str(uuid.uuid4())  # mcpg draws a random token at start when the file gives none
        entry["webhook_tokens"] = [token, *(str(t) for t in strategy.get("previous_tokens") or [] if t)]
    else:
        out.refuse(f"{where}.strategy.type", reason("watch_strategy", kind=str(kind)))
        return None
    flt = watch.get("notification_filter") or {}
    if flt.get("scope") == "expression":
        entry["notify_if"] = str(flt.get("expression", ""))
    return entry


def _backend_step(
    b: _Binding, kind: str, spec: JsonObject, where: str, *, answer: str, step_id: str, profile: str
) -> dict[str, Any] | None:
    out = b.out
    if kind == "twilio":
        # A plugin backend mcpipe has: its step, whose output is the plugin's reply.
        fields = plugins.translate_backend(
            {"kind": kind, **b.env(spec, where)}, where, out.doc, out.problems, out.environ
        )
        if fields is None:
            return None
        fields.pop("kind", None)
        return {"kind": "twilio", "id": step_id, **fields, "mcpg_answer": answer}
    if kind not in BACKENDS:
        out.refuse(f"{where}.kind", reason("backend_kind", kind=kind))
        return None
    step: dict[str, Any] = {
        "kind": f"mcpg.{kind}",
        "id": step_id,
        "answer": answer,
        "tool_name": b.name,
        "profile": profile,
    }
    if kind == "mock":
        for key in ("response", "delay_ms", "error", "error_message", "passthrough"):
            if key in spec:
                step[key] = spec.pop(key)
    else:
        before = len(b.unset)
        spec = b.env(spec, where)
        if len(b.unset) > before:
            # mcpg refuses to start without the variable; mcpipe serves the binding, which fails saying so.
            return {**step, **_unset_step(b, before, kind)}
    if kind in ("http", "grpc") and "headers" in spec:
        spec["headers"], fields = plugins.http_credential(
            spec["headers"], f"{where}.headers", out.doc, out.problems, out.environ
        )
        step.update(fields)
    if not _no_credentials(spec, where, out):
        return None
    if kind == "http":
        _http_spec(b, spec, step, where)
    elif kind == "grpc":
        _copy(spec, step, ("url", "service", "method", "headers", "max_response_bytes", "allow_private_backends"))
        step["allow_private_backends"] = bool(step.get("allow_private_backends")) or _allow_private(out)
    elif kind == "command":
        _copy(spec, step, ("command", "args", "max_output_bytes", "require_json_stdout"))
        commands = out.section("outbound").setdefault("commands", {})
        if isinstance(step.get("command"), str):
            commands.setdefault(Path(step["command"]).name or step["command"], step["command"])
    elif kind == "nats":
        step["url"] = spec.pop("url", None) or "nats://127.0.0.1:4222"
        _copy(spec, step, ("subject", "max_response_bytes"))
        for key in ("credentials_path", "auth_token"):
            if spec.pop(key, None):
                out.refuse(f"{where}.{key}", reason("nats_credentials"))
    elif kind == "kafka":
        servers = spec.pop("bootstrap_servers", None) or b.kafka.get("bootstrap_servers")
        if not servers:
            out.refuse(
                where,
                "a kafka binding needs `bootstrap_servers` (here, or in the dev.mcpg.backend.kafka plugin's config)",
            )
            return None
        step["bootstrap_servers"] = servers
        spec.pop("group_id", None)
        _copy(spec, step, ("request_topic", "response_topic", "max_response_bytes"))
        for key in ("sasl_username", "sasl_password", "security_protocol", "sasl_mechanism"):
            if spec.pop(key, None):
                out.refuse(f"{where}.{key}", reason("kafka_security"))
    elif kind == "sql" and not _sql_spec(b, spec, step, where):
        return None
    if "timeout_ms" in spec:
        step["timeout_ms"] = spec.pop("timeout_ms")
    elif kind in _DEFAULT_STEP_TIMEOUT:
        step["timeout_ms"] = _DEFAULT_STEP_TIMEOUT[kind]
    for key in spec:
        if key != "allow_private_backends":
            out.refuse(f"{where}.{key}", reason("backend_field", kind=kind, field=key))
    return step


def _no_credentials(value: object, where: str, out: _Out) -> bool:
    """A ``${cred://…}`` left outside the one header that may present a credential: refused, located."""
    if isinstance(value, str):
        if "${cred://" in value:
            out.refuse(where, "mcpipe presents one credential per request: one `${cred://...}` in one header")
            return False
        return True
    if isinstance(value, Mapping):
        return all([_no_credentials(v, f"{where}.{k}", out) for k, v in value.items()])
    if isinstance(value, list):
        return all([_no_credentials(v, f"{where}[{i}]", out) for i, v in enumerate(value)])
    return True


def _allow_private(out: _Out) -> bool:
    return bool(((out.doc.get("outbound") or {}).get("http") or {}).get("allow_private"))


def _copy(spec: JsonObject, step: JsonObject, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in spec:
            step[key] = spec.pop(key)


def _http_spec(b: _Binding, spec: JsonObject, step: JsonObject, where: str) -> None:
    _copy(spec, step, ("url", "headers", "expected_status_codes", "require_json_response", "max_response_bytes"))
    method = spec.pop("method", "post")
    step["method"] = str(method).lower()
    if step["method"] not in ("get", "post"):
        b.out.refuse(f"{where}.method", reason("http_method", method=str(method)))
    step["allow_private_backends"] = bool(spec.pop("allow_private_backends", False)) or _allow_private(b.out)


def _sql_url(url: str) -> str | None:
    """An sqlx database URL as mcpipe's ``[sql.NAME] url``; None when mcpipe has no such driver."""
    base = url.split("?", 1)[0]
    if base.startswith(("postgres://", "postgresql://")):
        return url
    if base.startswith("sqlite:"):
        rest = base[len("sqlite:") :]
        if rest in (":memory:", "//:memory:", ""):
            return "sqlite://"
        rest = rest[2:] if rest.startswith("//") else rest
        return "sqlite:////" + rest.lstrip("/") if rest.startswith("/") else "sqlite:///" + rest
    return None


def _sql_entry(b: _Binding, url: str, binding_name: str) -> str:
    """The ``sql`` backend (one per database URL) named after the first binding that uses it."""
    name = b.sql_names.get(url)
    if name is None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", binding_name)
        b.sql_names[url] = name
        b.out.section("sql")[name] = {"url": url}
    return name


def _sql_spec(b: _Binding, spec: dict[str, Any], step: JsonObject, where: str) -> bool:
    out = b.out
    url = spec.pop("url", "")
    driver = spec.pop("driver", "")
    mcpipe_url = _sql_url(str(url))
    if mcpipe_url is None:
        out.refuse(f"{where}.url", reason("sql_driver", driver=str(driver or url)))
        return False
    name = _sql_entry(b, mcpipe_url, b.name)
    out.moved(f"sql.{name}", f"{where}.url")
    sql = out.section("sql")
    pool = spec.pop("pool", None) or {}
    if pool.get("max_connections"):
        sql[name]["pool_size"] = int(pool["max_connections"])
    block = spec.pop("await", None)
    if block is not None:
        # Fire-and-wait: the binding answers the row its block waits for (the mcpg.sql kind runs it).
        step["await"] = {k: block[k] for k in _AWAIT_KEYS if k in block}
        for key in block:
            if key not in _AWAIT_KEYS:
                out.refuse(f"{where}.await.{key}", reason("backend_field", kind="sql", field=f"await.{key}"))
    step["backend"] = name
    query = spec.pop("query", None) or {}
    for key in ("sql_file", "procedure"):
        if query.get(key):
            out.refuse(f"{where}.query.{key}", reason("sql_query_source", what=key))
            return False
    if not query.get("sql"):
        out.refuse(f"{where}.query.sql", "a sql binding needs `query.sql`")
        return False
    step["sql"] = query["sql"]
    if query.get("params"):
        step["params"] = list(query["params"])
    if query.get("param_exprs"):
        step["param_exprs"] = {k: rename_cel(v) for k, v in query["param_exprs"].items()}
    mode = query.get("row_mode", "many")
    if mode not in ("single", "many", "scalar", "affected_rows", "resource_contents", "stream"):
        out.refuse(f"{where}.query.row_mode", reason("row_mode", mode=str(mode)))
        return False
    step["row_mode"] = mode
    why = _stream_problem(query, mode)
    if why is not None:
        out.refuse(f"{where}.query.stream", why)
        return False
    if mode == "stream":
        stream = dict(query["stream"])
        if isinstance(stream.get("signing_key"), str):
            stream["signing_key"], missing = expand_env(stream["signing_key"], out.environ)
            if missing:
                out.unset(f"{where}.query.stream.signing_key", missing[0])
                return False
        step["stream"] = stream
    for key in ("max_rows", "timeout_ms"):
        if query.get(key):
            step[key] = query[key]
    for key in ("schema", "list_query", "cache"):
        value = spec.pop(key, None)
        if value and key == "cache":
            out.refuse(f"{where}.{key}", reason("sql_extra", what=key))
    vars_ = spec.pop("session_vars", None)
    if vars_:
        step["session_vars"] = {str(k): str(v) for k, v in vars_.items()}
    return True


_AWAIT_KEYS = ("trigger", "check", "predicate", "poll_interval_ms", "timeout_ms")
"""mcpg's ``AwaitConfig`` (its predicate is CEL over ``row`` and ``arguments`` alone, kept as written)."""


def _stream_problem(query: Mapping[str, object], mode: str) -> str | None:
    """Why mcpg's SQL plugin refuses a binding's ``stream`` block (``SqlBackendConfig::validate``), or None."""
    stream = query.get("stream")
    if mode != "stream":
        return (
            "query.stream is only valid when row_mode is `stream` — remove the block or set row_mode: stream."
            if stream is not None
            else None
        )
    if not isinstance(stream, Mapping):
        return "row_mode: stream requires a `stream:` block declaring cursor_columns"
    columns = list(stream.get("cursor_columns") or [])
    if not columns:
        return "stream.cursor_columns must not be empty when row_mode is stream"
    for col in columns:
        if not re.fullmatch(r"[A-Za-z0-9_]+", str(col)):
            return f"stream.cursor_columns: '{col}' is not a safe column name (allowed: ASCII letters, digits, `_`)"
    for key in stream.get("initial") or {}:
        if key not in columns:
            return f"stream.initial['{key}'] is not a declared cursor column (cursor_columns: {columns})"
    for col in columns:
        if f":_after_{col}" not in str(query.get("sql", "")):
            return (
                f"row_mode: stream — query.sql must reference placeholder `:_after_{col}` (one per declared "
                "stream.cursor_columns column). The plugin binds last-row keyset values to these placeholders for "
                "continuation calls."
            )
    return None


# --- pipelines ------------------------------------------------------------------------------------


def _undecodable(steps: object, where: str) -> str | None:
    """Where mcpg's ``PipelineBackendConfig`` does not decode the steps, and why (None: it does). mcpg's config
    check passes a pipeline binding whatever its steps hold; at boot a pipeline that does not decode is left
    unregistered, without a word, and each call answers ``pipeline '<name>' not found``
    (``runtime/execution/mod.rs``, ``pipeline.rs``). Checked here: what a gather input requires
    (``GatherInputConfig``)."""
    if not isinstance(steps, list):
        return None
    for i, step in enumerate(steps):
        if not isinstance(step, Mapping) or step.get("kind") != "gather":
            continue
        for k, item in enumerate(step.get("inputs") or []):
            at = f"{where}.steps[{i}].inputs[{k}]"
            if not isinstance(item, Mapping) or item.get("kind") not in ("elicitation", "sampling", "roots"):
                return f"{at}.kind: a gather input is elicitation, sampling or roots"
            if not isinstance(item.get("correlation_token"), str):
                return f"{at}.correlation_token: missing field `correlation_token`"
            if item["kind"] == "elicitation" and not isinstance(item.get("message"), str):
                return f"{at}.message: missing field `message`"
            if item["kind"] == "sampling" and not isinstance(item.get("messages"), list):
                return f"{at}.messages: missing field `messages`"
    return None


def _pipeline(b: _Binding, entry: dict[str, Any], spec: dict[str, Any], where: str) -> dict[str, Any] | None:
    out = b.out
    steps_raw = spec.get("steps") or []
    undecodable = _undecodable(steps_raw, where)
    if undecodable is not None:
        # Served as mcpg serves it: every call fails (mcpg boots and says nothing; mcpipe says why, once).
        _log.warning("%s: mcpg does not register this pipeline (every call fails): %s", b.name, undecodable)
        entry["steps"] = [{"kind": "mcpg.fail", "id": "call", "message": f"pipeline '{b.name}' not found"}]
        entry["answer"] = "mcpg.binding"
        return entry
    entry["timeout_ms"] = int(spec.get("pipeline_timeout_ms", 30_000))
    out.moved(f"pipelines.{b.name}.timeout_ms", f"{where}.pipeline_timeout_ms")
    ids: set[str] = set()
    steps: list[dict[str, Any]] = []
    suspending = False
    for i, raw in enumerate(steps_raw):
        at = f"{where}.steps[{i}]"
        sid = raw.get("id")
        if not isinstance(sid, str) or not sid:
            out.refuse(f"{at}.id", "a pipeline step needs an `id`")
            continue
        if sid in ids:
            out.refuse(f"{at}.id", f"duplicate step id '{sid}' in pipeline '{b.name}'")
            continue
        ids.add(sid)
        step = _pipeline_step(b, dict(raw), at)
        if step is None:
            continue
        suspending |= raw.get("kind") in SUSPENDING
        out.moved(f"pipelines.{b.name}.steps[{len(steps)}]", at)
        steps.append(step)
    if len(steps) < len(steps_raw):  # a step was refused
        return None
    entry["steps"] = steps
    entry["answer"] = "mcpg.pipeline_suspending" if suspending else "mcpg.pipeline"
    return entry


def _pipeline_step(b: _Binding, raw: dict[str, Any], at: str) -> dict[str, Any] | None:
    out = b.out
    kind = raw.pop("kind", None)
    sid = raw.pop("id")
    if not _STEP_ID.fullmatch(sid):
        out.refuse(f"{at}.id", f"step id '{sid}' must be letters, digits, `_` and `-`, starting with a letter or `_`")
        return None
    transform = raw.pop("input_transform", None)
    if kind in BACKENDS or (kind not in _STEP_KINDS and kind is not None and kind != "pipeline"):
        step = _backend_step(b, kind, raw, at, answer="step", step_id=sid, profile=f"{b.name}._step_.{sid}")
    elif kind in _STEP_KINDS:
        step = _mcpipe_step(b, kind, sid, raw, at)
    else:
        out.refuse(f"{at}.kind", f"a pipeline step of kind `{kind}` is not in mcpg's step reference")
        return None
    if step is None:
        return None
    step.pop("mcpg_answer", None)  # a plugin backend step (twilio) says how a binding answers, not a step
    if transform is not None:
        step["input_transform"] = rename_cel(transform)
    return step


def _literal(value: object) -> Any:
    return {"$literal": value} if isinstance(value, (str, dict, list)) else value


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    """A sampling request's ``messages``, each one's content as written."""
    return [{"role": m.get("role"), "content": _literal(m.get("content", ""))} for m in messages]


_IGNORED_FIELDS = {
    "elicitation": ("timeout_ms", "correlation_token", "elicitation_id", "presentation_hint", "meta", "url"),
    "sampling": ("timeout_ms", "correlation_token", "meta"),
    "roots_list": ("timeout_ms", "correlation_token"),
    **dict.fromkeys(("transform", "cel_gate", "log", "progress", "plugin_transform", "gather"), ("timeout_ms",)),
}
"""The fields of mcpg's steps that mcpipe takes and reads nothing from; any other field it does not read is
refused."""


def _mcpipe_step(b: _Binding, kind: str, sid: str, raw: dict[str, Any], at: str) -> dict[str, Any] | None:
    out = b.out
    step: dict[str, Any] = {"kind": kind, "id": sid}
    if kind in ("transform", "cel_gate"):
        step["expression"] = rename_cel(raw.pop("expression", ""), tool_name=b.name)
        if kind == "cel_gate":
            step["error_message"] = raw.pop("error_message", None) or f"pipeline gate failed at step {sid}"
    elif kind == "plugin_transform":
        plugin = raw.pop("plugin", None)
        config = dict(raw.pop("config", None) or {})
        if plugin != "dev.mcpg.transform.jsonata":
            out.refuse(f"{at}.plugin", reason("transform_plugin", plugin=str(plugin)))
            return None
        # mcpg's plugin reads its config on each call (`JsonataConfig`, serde, unknown fields denied) and
        # evaluates the expression over the step context as its own document: mcpg's kind, not mcpipe's.
        step.update(kind="mcpg.jsonata", plugin=plugin, tool_name=b.name)
        unknown = [k for k in config if k not in ("expression", "phase", "max_output_bytes")]
        if unknown:
            step["config_error"] = (
                f"unknown field `{unknown[0]}`, expected one of `expression`, `phase`, `max_output_bytes`"
            )
        elif not isinstance(config.get("expression"), str):
            step["config_error"] = "missing field `expression`"
        else:
            step["expression"] = config["expression"]
            if isinstance(config.get("max_output_bytes"), int):
                step["max_output_bytes"] = config["max_output_bytes"]
    elif kind == "log":
        data = raw.pop("data", None)
        step["level"] = raw.pop("level", "info")
        step["logger"] = raw.pop("logger", None) or b.name
        if "${" in json.dumps(data):  # interpolated over the pipeline context, as mcpg's pipelines doc shows
            step.update(kind="mcpg.log", data=data, tool_name=b.name)
        else:
            step["data"] = _literal(data)
    elif kind == "progress":
        for key in ("progress", "total", "message"):
            if (value := raw.pop(key, None)) is not None:
                step[key] = _literal(value)
    elif kind == "elicitation":
        mode = raw.pop("mode", "form")
        if mode != "form":
            out.refuse(f"{at}.mode", reason("url_elicitation"))
            return None
        step["message"] = _literal(raw.pop("message", ""))
        if raw.get("requested_schema") is not None:
            step["requested_schema"] = _literal(raw.pop("requested_schema"))
        step["skip_if_unsupported"] = bool(raw.pop("skip_if_unsupported", False))
    elif kind == "sampling":
        step["messages"] = _messages(raw.pop("messages", []))
        step["max_tokens"] = raw.pop("max_tokens", 1000)
        for key in ("system_prompt", "temperature", "model_preferences"):
            if raw.get(key) is not None:
                step[key] = _literal(raw.pop(key))
        step["skip_if_unsupported"] = bool(raw.pop("skip_if_unsupported", False))
        step["with_text"] = False  # mcpg's output is the client's result as it is
        for key in ("tools", "tool_choice", "include_context", "stop_sequences", "metadata"):
            if raw.pop(key, None):
                out.refuse(f"{at}.{key}", reason("sampling_field", what=key))
                return None
    elif kind == "roots_list":
        step["skip_if_unsupported"] = bool(raw.pop("skip_if_unsupported", False))
    elif kind == "gather":
        inputs = []
        for item in raw.pop("inputs", []):  # each one elicitation, sampling or roots (_undecodable)
            entry: dict[str, Any] = {"kind": item["kind"], "correlation_token": item["correlation_token"]}
            if item["kind"] == "elicitation":
                entry["message"] = _literal(item.get("message", ""))
                if item.get("requested_schema") is not None:
                    entry["requested_schema"] = _literal(item["requested_schema"])
            elif item["kind"] == "sampling":
                entry["messages"] = _messages(item.get("messages", []))
                entry["max_tokens"] = item.get("max_tokens", 1000)
            inputs.append(entry)
        step["inputs"] = inputs
        step["with_text"] = False
    elif kind == "sql_await":
        # `execute_sql_await_step`: the named sql binding called with the step's input, as a direct call would
        # run it (its `await` block, if it has one); its answer is the step's output.
        target = raw.pop("backend", None)
        spec = b.sql_bindings.get(target) if isinstance(target, str) else None
        if spec is None:
            out.refuse(f"{at}.backend", f"no sql binding named `{target}` to run this step's statements on")
            return None
        binding = {k: v for k, v in spec.items() if k != "kind"}
        awaited = _backend_step(b, "sql", binding, f"{at}.backend", answer="step", step_id=sid, profile=target)
        if awaited is None:
            return None
        awaited["await_step"] = sid
        step = awaited
    elif kind == "sql_tx":
        target = raw.pop("backend", None)
        before = len(b.unset)
        name = _sql_backend_of(b, target, f"{at}.backend")
        if name is None:
            out.refuse(f"{at}.backend", f"no sql binding named `{target}` to run this step's statements on")
            return None
        if len(b.unset) > before:  # its database's URL reads a variable that is not set: each call fails
            return {"id": sid, "answer": "step", "tool_name": b.name, **_unset_step(b, before, "sql")}
        step["backend"] = name
        # mcpg's transaction answers its statements shaped by mcpg's row modes: its own kind.
        step["kind"] = "mcpg.sql_tx"
        step["steps"] = [
            {k: v for k, v in s.items() if k in ("id", "sql", "params", "row_mode") and v is not None}
            for s in raw.pop("steps", [])
        ]
    for key in raw:
        if key not in _IGNORED_FIELDS.get(kind, ()):
            out.refuse(f"{at}.{key}", reason("step_field", kind=str(kind), field=key))
    return step


def _unset_step(b: _Binding, before: int, backend: str) -> dict[str, Any]:
    """What a step that read the variables ``b.unset[before:]`` (not set) is: one that fails each call saying so
    (mcpg refuses to start)."""
    names = ", ".join(f"'{n}'" for n in dict.fromkeys(b.unset[before:]))
    return {
        "kind": "mcpg.unset",
        "backend": backend,
        "message": f"CEL env-var resolution failed: environment variable {names} is not set",
    }


def _sql_backend_of(b: _Binding, binding_name: Any, where: str) -> str | None:
    """The mcpipe ``sql`` backend of the database of the sql binding named ``binding_name`` (declared before
    or after this pipeline); ``where`` names the part of this binding that uses it."""
    spec = b.sql_bindings.get(binding_name) if isinstance(binding_name, str) else None
    if spec is None:
        return None
    url = _sql_url(str(b.env(spec.get("url", ""), where)))
    if url is None:
        return None
    return _sql_entry(b, url, binding_name)


# --- the rest ---------------------------------------------------------------------------------------


def _configurations(conf: Mapping[str, Any], out: _Out, caps: Mapping[str, object]) -> None:
    for key in ("sessions", "pipelines", "subscriptions"):
        store = (conf.get(key) or {}).get("store")
        if store and store.get("kind") not in ("memory", "cluster"):
            out.refuse(f"mcp.configurations.{key}.store", reason("store", kind=str(store.get("kind"))))
    for key in ("delivery", "cancellation"):
        bus = (conf.get(key) or {}).get("bus")
        if bus and bus.get("kind") not in ("memory", "cluster"):
            out.refuse(f"mcp.configurations.{key}.bus", reason("bus", kind=str(bus.get("kind"))))
    state_key = (conf.get("request_state") or {}).get("encryption_key")
    if state_key:
        m = re.fullmatch(r"\$\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}", str(state_key))
        if m is not None:  # one key shared by every instance, from the environment
            out.section("interaction")["state_key_env"] = m.group(1)
        # A key written in the file seals nothing in mcpipe: it seals requestState with the key ring of
        # MCPIPE_STATE_KEY, or a random key of the process (docs/formats/mcpg.md).
    _apps(conf.get("apps") or {}, caps, out)


def _apps(apps: Mapping[str, Any], caps: Mapping[str, Any], out: _Out) -> None:
    """MCP Apps (SEP-1865): the extension advertised and every ``_meta.ui`` held to the policy when enabled
    (mcpipe's ``apps`` section), and the templated apps of ``registry`` served as ``ui://mcpg/<id>`` resources.
    Disabled, ``_meta.ui`` passes through unchanged, as in mcpg."""
    from mcpipe.formats.mcpg._apps import apps_section, compile_app, registry_problem

    problem = registry_problem(apps)
    if problem is not None:
        out.refuse(*problem)
        return
    if not apps.get("enabled"):
        return
    out.doc["apps"] = apps_section(apps)
    out.moved("apps", "mcp.configurations.apps")
    tools = {
        str(b.get("name")): {"input": b.get("input_schema"), "output": b.get("output_schema")}
        for b in caps.get("tools") or []
        if isinstance(b, Mapping)
    }
    names = {str(b.get("name")) for bucket in BUCKETS for b in caps.get(bucket) or [] if isinstance(b, Mapping)}
    pipelines = out.doc.setdefault("pipelines", [])
    for i, app in enumerate(apps.get("registry") or []):
        if app["id"] in names:
            out.refuse(f"mcp.configurations.apps.registry[{i}].id", f"a binding is named `{app['id']}` too")
            continue
        pipelines.append(compile_app(app, tools))
        out.moved(f"pipelines.{app['id']}", f"mcp.configurations.apps.registry[{i}]")


_RANK = {"unauthenticated": 0, "header_asserted": 1, "verified": 2}


def _federations(feds: list[Any], out: _Out) -> None:
    servers = out.section("mcpServers") if feds else {}
    for i, fed in enumerate(feds):
        where = f"mcp.federations[{i}]"
        up = fed.get("upstream") or {}
        name = re.sub(r"[^A-Za-z0-9_-]", "_", fed["name"])[:64]
        entry: dict[str, Any] = {}
        if up.get("transport", "streamable_http") == "stdio":
            entry["command"] = up.get("command")
            entry["args"] = list(up.get("args") or [])
            if up.get("env"):
                entry["env"] = dict(up["env"])
        else:
            url = str(up.get("url", ""))
            if url.startswith("tunnel://"):
                out.refuse(f"{where}.upstream.url", reason("tunnel_upstream"))
                continue
            entry["url"] = url
            if up.get("headers"):
                entry["headers"] = dict(up["headers"])
        auth = up.get("auth") or {}
        mode = auth.get("mode", "none")
        if mode in ("oauth_client_credentials", "oauth_impersonation"):
            cred = plugins.credential_ref(
                str(auth.get("credential", "")), f"{where}.upstream.auth.credential", out.doc, out.problems, out.environ
            )
            if cred is None:
                continue
            entry["credential"] = cred
        elif mode != "none":
            out.refuse(f"{where}.upstream.auth.mode", reason("upstream_auth"))
            continue
        prefix = (fed.get("naming") or {}).get("tool_prefix") or ""
        if prefix and not prefix.endswith("."):
            out.refuse(f"{where}.naming.tool_prefix", reason("tool_prefix"))
            continue
        entry["prefix"] = prefix[:-1] if prefix else ""
        # The federation's governance (default: a binding's, header_asserted) covers every capability it
        # imports (federation/engine.rs governance_rule): a trust rule for its `<prefix>.*` names.
        if prefix:
            out.section("trust").setdefault("tools", {})[f"{prefix}*"] = _trust_rule(fed)
            out.moved(f"trust.tools.{prefix}*", f"{where}.governance")
        elif fed.get("governance") or _RANK.get(str(out.section("trust").get("default_minimum_trust")), 0) < 1:
            out.refuse(f"{where}.governance", reason("fed_governance"))
            continue
        entry["expose"] = _exposed(fed.get("import"), False)
        flt = fed.get("filter") or {}
        if flt.get("include_tools") and flt["include_tools"] != ["*"]:
            entry["include"] = list(flt["include_tools"])
        if flt.get("exclude_tools"):
            entry["exclude"] = list(flt["exclude_tools"])
        servers[name] = entry
        out.moved(f"mcpServers.{name}", where)


_PLAINTEXT = {
    "redis": "the redis `url` uses the plaintext `redis://` scheme (use `rediss://`)",
    "consul": "the consul `address` uses the plaintext `http://` scheme (use `https://`)",
    "etcd": "an etcd `endpoint` is not an `https://` URL (a plaintext `http://` or scheme-less `host:port` "
    "endpoint connects in clear; use `https://`)",
    "nats": "nats `tls.require_tls` is set to `false` (plaintext)",
}


def _plaintext(kind: str, cluster: Mapping[str, object]) -> bool:
    """``ClusterConfig::validate_transport_security``: the coordinator's link would be plaintext."""
    if kind in ("redis", "consul"):
        field, scheme = ("url", "redis://") if kind == "redis" else ("address", "http://")
        value = cluster.get(field)
        return isinstance(value, str) and value.lstrip().startswith(scheme)
    if kind == "etcd":
        eps = cluster.get("endpoints")
        return isinstance(eps, list) and any(isinstance(e, str) and not e.lstrip().startswith("https://") for e in eps)
    if kind == "nats":
        tls = cluster.get("tls")
        return isinstance(tls, Mapping) and tls.get("require_tls") is False
    return False


def _cluster(cluster: Mapping[str, Any], out: _Out) -> None:
    """mcpg's cluster coordinator. ``single_node`` is mcpipe's one process; a ``redis`` coordinator becomes
    mcpipe's shared store (``store.url``: suspended pipelines, used-state claims and queued runs shared by
    every instance); any other coordinator is refused."""
    kind = str(cluster.get("kind", "single_node"))
    if kind == "single_node":
        return
    if _plaintext(kind, cluster) and not cluster.get("allow_insecure_transport"):
        out.refuse(
            "cluster.kind",
            f"cluster.kind='{kind}': {_PLAINTEXT[kind]}. The cluster coordinator carries all shared state "
            "(sessions, credential-cache events, delivery payloads) — a plaintext transport exposes them across "
            "the deployment. Use a TLS scheme, or set `cluster.allow_insecure_transport: true` to accept "
            "plaintext (local/dev only).",
        )
        return
    if kind != "redis":
        out.refuse("cluster.kind", reason("cluster", kind=kind))
        return
    url = cluster.get("url")
    if not isinstance(url, str) or not url.strip():
        out.refuse("cluster.url", reason("cluster_url"))
        return
    if cluster.get("state_encryption_key_env"):
        out.refuse("cluster.state_encryption_key_env", reason("state_encryption"))
        return
    text, missing = expand_env(url.strip(), out.environ)
    password = cluster.get("password")
    if isinstance(password, str) and password:
        secret, more = expand_env(password, out.environ)
        missing += more
        scheme, sep, rest = text.partition("://")
        if sep and "@" not in rest.split("/", 1)[0]:
            from urllib.parse import quote

            text = f"{scheme}://:{quote(secret, safe='')}@{rest}"
    if missing:
        out.unset("cluster.url", missing[0])
        return
    store = out.section("store")
    store["url"] = text
    out.moved("store.url", "cluster.url")
    prefix = str(cluster.get("key_prefix") or "").rstrip(":")
    segment = cluster.get("tenant_segment")
    if prefix or segment:
        store["prefix"] = ":".join(p for p in (prefix or "mcpipe", segment) if p)


# mcpg's licence gate (``license_gate.rs``, ``mcpg-control-plane-license`` v0.1.0-beta.14 ``license.rs``): a
# standalone gateway without a licence token runs under the community plan, which does not license these.
_PLAN_FEATURES = {
    "identity.saml": "sso.saml",
    "identity.kerberos": "sso.kerberos",
    "tool-gate.dlp": "dlp",
    "tool-gate.field-crypto": "field_crypto",
    "audit.s3-worm": "audit.worm",
    "tool-gate-slack-approval": "approvals.hitl",
    "guardrails": "guardrails",
    **dict.fromkeys(
        (
            "credential.vault-dynamic-db",
            "credential.aws-sts",
            "credential.gcp-impersonation",
            "credential.azure-identity",
            "credential.oauth-token-exchange",
            "credential.oauth-id-jag",
        ),
        "secrets.dynamic",
    ),
    **dict.fromkeys(
        ("backend.grpc", "backend.soap", "backend.kafka", "backend.mssql", "backend.oracle", "backend.ldap"),
        "backend.enterprise",
    ),
    **dict.fromkeys(("identity.ldap", "identity.paseto", "identity.workload"), "identity.advanced"),
}
_PAID_NAMESPACES = ("payment.", "policy.", "cluster.", "secret.")
_COMMUNITY = (
    "core.", "identity.", "transform.", "transport.", "cache.", "reliability.", "observability.", "metrics.",
    "log.", "watch.", "integration.", "storage.", "catalog.", "audit.", "tool-gate.", "credential.",
)  # fmt: skip
_COMMUNITY_EXACT = frozenset((
    "audit", "call-logger", "webhook", "circuit-breaker", "rate-limit", "response-cache", "ip-allowlist",
    "tool-gate-slack-approval", "guardrails",
))  # fmt: skip


def _licence_gate(entries: Sequence[object], out: _Out) -> None:
    """``enforce_plugin_license_gate`` under the community plan: each enabled plugin (by its ``ref``, else its
    id) that is entitlement-gated and not admitted is refused, as mcpg refuses to boot."""
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or entry.get("disabled") is True:
            continue
        pid = str(entry.get("ref") or entry.get("id") or "")
        short = pid.removeprefix("dev.mcpg.")
        feature = _PLAN_FEATURES.get(short)
        if feature is None and not short.startswith(_PAID_NAMESPACES):
            continue
        if not (short.startswith(_COMMUNITY) or short in _COMMUNITY_EXACT):
            why = f"plugin `{pid}` is not entitled by this license"
        else:
            why = f"plugin `{pid}` requires the `{feature}` plan feature, which this license does not grant"
        out.refuse(
            f"plugins[{i}]",
            f"license gate: plan `community` does not license this plugin ({why}): install an entitling "
            "license (`license.token` / `license.token_file` + `license.pubkey_pem`), declare a non-production "
            "deployment (`license.non_production_use: true`), or remove the plugin",
        )


def _rest(doc: Mapping[str, Any], out: _Out) -> None:
    _cluster(doc.get("cluster") or {}, out)
    out.refuse_set("credentials.")
    _storage(doc.get("storage") or {}, out)
    out.refuse_set("license.")
    lic = doc.get("license") or {}
    if not any(lic.get(k) for k in ("token", "token_file")) and not lic.get("non_production_use"):
        _licence_gate(doc.get("plugins") or [], out)
    flags = doc.get("feature_flags") or {}
    if flags.get("debug_tools_enabled"):
        _debug_tools(doc, out)


_STORE_FIELDS = {"in_process": {"max_bytes"}, "file_system": {"root", "max_bytes"}}


def _storage(storage: Mapping[str, Any], out: _Out) -> None:
    """``storage``: mcpg's content stores (``storage_wiring.rs``), served at ``mcpg-resource://<id>/<resource>``.
    Without providers mcpg keeps one in-process store, ``default``; so does mcpipe."""
    providers = list(storage.get("providers") or []) or [{"id": "default", "kind": "in_process"}]
    stores: dict[str, Any] = {}
    for i, provider in enumerate(providers):
        where, pid, kind = f"storage.providers[{i}]", str(provider.get("id")), str(provider.get("kind"))
        config = provider.get("config") or {}
        if kind not in _STORE_FIELDS:
            out.refuse(where, reason("storage", kind=kind))
            return
        unknown = sorted(set(config) - _STORE_FIELDS[kind])
        if unknown or (kind == "file_system" and "root" not in config):
            what = f"unknown field `{unknown[0]}`" if unknown else "missing field `root`"
            out.refuse(f"{where}.config", f"build storage provider '{pid}' (kind {kind}): invalid {kind} spec: {what}")
            return
        if pid in stores:
            out.refuse(f"{where}.id", f"duplicate storage provider id '{pid}' in `storage.providers: [...]`")
            return
        store: dict[str, Any] = {"kind": "memory" if kind == "in_process" else "file_system"}
        if config.get("root") is not None:
            store["root"] = str(config["root"])
        if config.get("max_bytes") is not None:
            store["max_bytes"] = int(config["max_bytes"])
        stores[pid] = store
        out.moved(f"content.stores.{pid}", where)
    default = str(storage.get("default") or "default")
    if default not in stores:
        out.refuse(
            "storage.default",
            f"`storage.default: {default}` does not match any provider id in `storage.providers: [...]`",
        )
        return
    out.doc["content"] = {"stores": stores, "default": default, "scheme": "mcpg-resource"}


def debug_exposure(tools: Mapping[str, Any]) -> dict[str, Any]:
    """``debug.tools.exposure`` with mcpg's defaults where it says nothing."""
    return {
        "command_probe": True,
        "network_probe": True,
        "network_json_call": False,
        "operational_overview_prompt": True,
        "runtime_overview_resource": True,
        **(tools.get("exposure") or {}),
    }


def _debug_problems(tools: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``DebugToolsConfig::validate`` with debug enabled: (where, what is wrong there), in mcpg's order (its
    message is ``<where> <what>``)."""
    commands, networks = tools.get("command_profiles") or {}, tools.get("network_profiles") or {}
    for key, profiles in (("command_profiles", commands), ("network_profiles", networks)):
        default = "default_command_probe" if key == "command_profiles" else "default_network_probe"
        if default not in profiles:
            yield f"debug.tools.{key}", f"must contain '{default}' when debug is enabled"
    if not any(debug_exposure(tools).values()):
        yield "debug.tools.exposure", "must enable at least one built-in debug capability when debug is enabled"
    bindings = {
        "command_probe_profile": "default_command_probe",
        "network_probe_profile": "default_network_probe",
        "network_json_call_profile": "default_network_probe",
        **(tools.get("bindings") or {}),
    }
    for key, value in bindings.items():
        if not str(value).strip():
            yield f"debug.tools.bindings.{key}", "must not be empty when debug is enabled"
        known, what = (commands, "command") if key == "command_probe_profile" else (networks, "network")
        if value not in known:
            yield f"debug.tools.bindings.{key}", f"must reference an existing {what} profile"
    for name, c in commands.items():
        at = f"debug.tools.command_profiles.{name}"
        if not str(c.get("command", "printf")).strip():
            yield f"{at}.command", "must not be empty when debug is enabled"
        for key in ("timeout_ms", "max_output_bytes"):
            if c.get(key, 1) == 0:
                yield f"{at}.{key}", "must be greater than 0 when debug is enabled"
    for name, n in networks.items():
        at = f"debug.tools.network_profiles.{name}"
        if not str(n.get("url", "http://127.0.0.1:8787/health")).startswith("http://"):
            yield f"{at}.url", "must start with 'http://' when debug is enabled"
        for key in ("timeout_ms", "max_response_bytes"):
            if n.get(key, 1) == 0:
                yield f"{at}.{key}", "must be greater than 0 when debug is enabled"
        codes = n.get("expected_status_codes", [200])
        if not codes:
            yield f"{at}.expected_status_codes", "must not be empty when debug is enabled"
        if any(not 100 <= int(c) <= 599 for c in codes):
            yield f"{at}.expected_status_codes", "entries must be valid HTTP status codes when debug is enabled"
        for header, value in (n.get("headers") or {}).items():
            if not str(header).strip():
                yield f"{at}.headers", "keys must not be empty when debug is enabled"
            if any(c in str(header) for c in "\r\n"):
                yield f"{at}.headers", "keys must not contain CR or LF characters when debug is enabled"
            if any(c in str(value) for c in "\r\n"):
                yield f"{at}.headers", "values must not contain CR or LF characters when debug is enabled"


_DEBUG_DEFAULTS: dict[str, Any] = {
    "command_profiles": {"default_command_probe": {}},
    "network_profiles": {"default_network_probe": {}},
}


def _debug_tools(doc: Mapping[str, Any], out: _Out) -> None:
    """``feature_flags.debug_tools_enabled``: mcpg's debug tools, prompt and resource (:mod:`._debug`)."""
    from mcpipe._version import __version__
    from mcpipe.formats.mcpg._debug import debug_pipelines

    debug = doc.get("debug") or {}
    tools = debug["tools"] if isinstance(debug.get("tools"), Mapping) else _DEBUG_DEFAULTS
    for where, what in _debug_problems(tools):
        out.refuse(where, f"{where} {what}")
        return  # mcpg stops at its first
    server = (doc.get("gateway") or {}).get("server") or {}
    logs = (doc.get("observability") or {}).get("logs") or {}
    runtime = {
        "service": "mcpipe",
        "version": __version__,
        "bind_address": str(server.get("bind_address", "127.0.0.1:8787")),
        "health_path": str(server.get("health_path", "/health")),
        "mcp_path": str(server.get("mcp_path", "/mcp")),
        "log_level": str(logs.get("level", "info")),
        "log_sinks": [str(s.get("kind")) for s in logs.get("sinks") or [] if isinstance(s, Mapping)] or ["stderr"],
        "plugins": [
            {"id": str(p.get("id")), "plugin_class": str(p.get("class", "tool_gate")), "state": "active"}
            for p in out.raw_plugins
            if isinstance(p, Mapping) and not p.get("disabled")
        ],
    }
    caps = (doc.get("mcp") or {}).get("capabilities") or {}
    counts = (len(caps.get("tools") or []), len(caps.get("prompts") or []), len(caps.get("resources") or []))
    pipelines, refused = debug_pipelines(tools, runtime, _allow_private(out), counts)
    if refused is not None:
        out.refuse(refused, reason("debug_json_call"))
        return
    out.doc.setdefault("pipelines", []).extend(pipelines)
    for p in pipelines:
        out.moved(f"pipelines.{p['name']}", "feature_flags.debug_tools_enabled")
