"""What mcpipe refuses in an mcpg config, and why: one table, used by the front-end for its messages and by
``docs/formats/mcpg.md`` (a test checks the page's table is this one).

A refusal is one located line: the place in the file and the reason below (``{…}`` filled with what the
file says). Plugins are refused by :mod:`.plugins`, by their ids, and are not listed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = ["REFUSALS", "Refusal", "reason", "set_in", "table"]


@dataclass(frozen=True, slots=True)
class Refusal:
    key: str
    section: str
    reason: str
    honoured: str | None = None
    """The one value of the section mcpipe honours (mcpg's default), when the section is not refused as unset."""

    def matches(self, message: str) -> bool:
        pattern = re.escape(self.reason)
        pattern = re.sub(r"\\\{[a-z_]+\\\}", ".*", pattern)
        return re.fullmatch(pattern, message) is not None


REFUSALS: tuple[Refusal, ...] = (
    Refusal("tunnel", "gateway.server.tunnel", "outbound tunnels to a relay are not in mcpipe"),
    Refusal("tunnel_federation", "gateway.server.tunnel_federation", "relay federation ingress is not in mcpipe"),
    Refusal("aauth", "gateway.server.aauth_resource_metadata", "AAuth resource metadata is not in mcpipe"),
    Refusal("transports", "gateway.server.transports", "extra listeners (plugin transports) are not in mcpipe"),
    Refusal(
        "completion_rate", "gateway.server.completion_rate_limit_per_sec", "completion rate limits are not in mcpipe"
    ),
    Refusal(
        "trust_proxy_ip",
        "gateway.server.trust_proxy_ip",
        "mcpipe keys its anonymous rate limit on the connection's address only",
    ),
    Refusal(
        "transport",
        "gateway.server.transport",
        "mcpipe picks its transport on the command line (`mcpipe serve --stdio`)",
        honoured="http",
    ),
    Refusal(
        "modern_meta",
        "gateway.server.enforce_modern_request_meta",
        "mcpipe does not require the 2026-07-28 request _meta",
    ),
    Refusal("admin", "gateway.admin.enabled", "mcpg's admin API is not in mcpipe"),
    Refusal("inspector", "gateway.inspector.enabled", "mcpg's inspector sidecar is not in mcpipe"),
    Refusal("control_plane", "gateway.control_plane", "attaching to an mcpg control plane is not in mcpipe"),
    Refusal("config_overlay", "gateway.config_overlay", "bootstrap config overlays are not in mcpipe"),
    Refusal(
        "oauth_server",
        "governance.access.{resource_metadata,authorization_server}",
        "mcpg's OAuth {what} is not in mcpipe",
    ),
    Refusal("quotas", "governance.quotas.{rate_limits,budgets,concurrency}", "mcpg's quota {what} are not in mcpipe"),
    Refusal("approvals", "governance.approvals", "human approval gates are not in mcpipe"),
    Refusal(
        "registry_cred",
        "mcp.registries[].auth.mode",
        "a registry read with a `cred` issuer's token is not in mcpipe (give it `bearer` or `headers`)",
    ),
    Refusal(
        "registry_auth",
        "mcp.registries[].defaults.auth.mode",
        "a registry's servers authenticated by `{mode}` are not in mcpipe",
    ),
    Refusal(
        "registry_server_auth",
        "mcp.registries[].servers.*.auth",
        "a registry server's own auth is not in mcpipe (its registry's `defaults.auth` applies)",
    ),
    Refusal(
        "store",
        "mcp.configurations.{sessions,pipelines,subscriptions}.store, mcp.capabilities.tasks.store",
        "a `{kind}` store is not in mcpipe (memory only)",
    ),
    Refusal("bus", "mcp.configurations.{delivery,cancellation}.bus", "a `{kind}` bus is not in mcpipe"),
    Refusal("tunnel_upstream", "mcp.federations[].upstream.url", "tunnel:// upstreams are not in mcpipe"),
    Refusal(
        "upstream_auth",
        "mcp.federations[].upstream.auth",
        "authenticating to an upstream server is not in mcpipe's downstream servers",
    ),
    Refusal(
        "fed_governance",
        "mcp.federations[].governance",
        "a federation's trust rule covers its tools by their prefix in mcpipe: give it `naming.tool_prefix`",
    ),
    Refusal(
        "tool_prefix",
        "mcp.federations[].naming.tool_prefix",
        "mcpipe names a server's tools `<prefix>.<tool>`: end the prefix with `.`",
    ),
    Refusal(
        "cluster",
        "cluster.kind",
        "a `{kind}` cluster is not in mcpipe: it shares state through a redis coordinator only (`store.url`)",
    ),
    Refusal("cluster_url", "cluster.url", "a redis coordinator needs its `url` (mcpipe's `store.url`)"),
    Refusal(
        "state_encryption",
        "cluster.state_encryption_key_env",
        "encrypting the shared state is not in mcpipe's store: it would be kept in clear",
    ),
    Refusal("credential_cluster", "credentials.cluster.enabled", "a clustered credential cache is not in mcpipe"),
    Refusal("storage", "storage.providers[]", "a `{kind}` content store is not in mcpipe"),
    Refusal(
        "license", "license.{token,token_file}", "a licence key: mcpipe has no entitlement-gated plugins to unlock"
    ),
    Refusal(
        "debug_json_call",
        "debug.tools.exposure.network_json_call",
        "mcpg's debug network JSON call (`mcpg.debug.network_json_call`) is not in mcpipe",
    ),
    Refusal(
        "schema_url",
        "schema_registry.*.url",
        "mcpipe does not fetch schemas over the network at load: inline it or name a file",
    ),
    Refusal("quota_ref", "<binding>.quotas", "per-binding quotas are not in mcpipe"),
    Refusal("content_storage", "<binding>.content_storage", "content-store routing is not in mcpipe"),
    Refusal("app_url", "<binding>.mcp_app_url", "a binding's MCP App link (`mcp_app_url`) is not in mcpipe"),
    Refusal(
        "watch_strategy",
        "<binding>.watch.strategy.type",
        "the `{kind}` watch strategy is not in mcpipe (it watches by `poll` and `webhook`)",
    ),
    Refusal("cache", "<binding>.cache", "per-binding response caches are not in mcpipe"),
    Refusal("retry", "<binding>.retry", "retrying a `{kind}` binding is not in mcpipe"),
    Refusal(
        "backend_kind",
        "<binding>.backend.kind",
        "mcpg's `{kind}` backend (plugin dev.mcpg.backend.{kind}) has no mcpipe equivalent"
        " (mcpipe has: http, grpc, mock, command, nats, kafka, sql, pipeline)",
    ),
    Refusal("backend_field", "<backend>.<field>", "mcpg's `{kind}` backend field `{field}` is not in mcpipe"),
    Refusal("http_method", "<http backend>.method", "mcpg's http backend sends `get` or `post`, not `{method}`"),
    Refusal(
        "nats_credentials",
        "<nats backend>.{credentials_path,auth_token}",
        "NATS credentials are not in mcpipe's NATS client",
    ),
    Refusal(
        "kafka_security",
        "<kafka backend>.{sasl_*,security_protocol}",
        "Kafka SASL and TLS are not in mcpipe's Kafka client",
    ),
    Refusal(
        "sql_driver",
        "<sql backend>.url",
        "mcpipe's SQL backends are SQLite and PostgreSQL, not `{driver}`",
    ),
    Refusal(
        "sql_query_source",
        "<sql backend>.query.{sql_file,procedure}",
        "mcpg's `query.{what}` is not in mcpipe (write the statement in `sql`)",
    ),
    Refusal("row_mode", "<sql backend>.query.row_mode", "row_mode `{mode}` is not in mcpipe"),
    Refusal("sql_extra", "<sql backend>.cache", "mcpg's sql `{what}` is not in mcpipe"),
    Refusal("step_field", "<step>.<field>", "mcpg's `{kind}` step field `{field}` is not in mcpipe"),
    Refusal("url_elicitation", "<elicitation step>.mode", "URL-mode elicitation is not in mcpipe"),
    Refusal(
        "sampling_field",
        "<sampling step>.{tools,tool_choice,include_context,...}",
        "sampling `{what}` is not in mcpipe's sampling step",
    ),
    Refusal(
        "transform_plugin",
        "<plugin_transform step>.plugin",
        "transform plugin `{plugin}` is not in mcpipe (it has dev.mcpg.transform.jsonata)",
    ),
)
"""Every refusal of the mcpg front-end that is not one of mcpg's own (mcpg refuses those the same way)."""

_BY_KEY = {r.key: r for r in REFUSALS}


def reason(key: str, **fields: str) -> str:
    """The reason of refusal ``key``, its ``{…}`` filled."""
    return _BY_KEY[key].reason.format(**fields)


_PLAIN = re.compile(r"[a-z_.]+(\{[a-z_,]+\})?")
"""A section that is a path in the file (``gateway.server.tunnel``), or paths (``license.{token,token_file}``)."""


def set_in(doc: Mapping[str, object], prefix: str) -> Iterator[tuple[str, str]]:
    """(where, why) of each refusal of a plain section under ``prefix`` that ``doc`` sets, in the table's order
    (``{what}`` filled with the key, in words)."""
    for r in REFUSALS:
        if not r.section.startswith(prefix) or not _PLAIN.fullmatch(r.section):
            continue
        head, brace, keys = r.section.partition("{")
        for key in keys.rstrip("}").split(",") if brace else [""]:
            value: object = doc
            for part in (head + key).split("."):
                value = value.get(part) if isinstance(value, Mapping) else None
            if value and value != r.honoured:
                yield head + key, r.reason.format(what=key.replace("_", " "))


def table() -> str:
    """The Markdown table of :data:`REFUSALS` (as ``docs/formats/mcpg.md`` shows it)."""
    rows = ["| section | why mcpipe refuses it |", "|---|---|"]
    bar = "\\|"
    rows += [f"| `{r.section}` | {r.reason.replace('|', bar)} |" for r in REFUSALS]
    return "\n".join(rows)
