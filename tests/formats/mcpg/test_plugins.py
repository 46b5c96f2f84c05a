"""mcpg's plugins by id (``mcpipe.formats.mcpg.plugins``), fed the plugin entries, sinks and ``cred://``
references of mcpg's own files (mcpg-dev/mcpg at v0.1.0-beta.16, commit 291b7f7; each case cites its file),
and then the translation parsed as mcpipe's own config: what mcpipe honours loads, the rest is refused
located, and what mcpg refuses is refused for the same reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from mcpipe.config import Config, parse_config
from mcpipe.errors import Problem
from mcpipe.formats.mcpg.plugins import (
    credential_ref,
    env_credential_variable,
    http_credential,
    translate_backend,
    translate_plugins,
    translate_sink,
)

ENV = {
    "NOTION_SECRET": "n-secret",
    "STS_CLIENT_SECRET": "sts",
    "OKTA_MCPG_CLIENT_SECRET": "okta",
    "TWILIO_ACCOUNT_SID": "AC" + "1" * 32,
}


def _plugins(text: str, environ: dict[str, str] | None = None) -> tuple[dict[str, Any], list[Problem]]:
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    translate_plugins(
        yaml.safe_load(text)["plugins"], "plugins", out, problems, environ if environ is not None else ENV
    )
    return out, problems


def _mcpipe(out: dict[str, Any], environ: dict[str, str] | None = None) -> Config:
    """The translation, parsed as mcpipe's own layout (it must load)."""
    return parse_config(json.dumps({"audit": {"enabled": False}, **out}), "json", environ=environ or {})


def _where(problems: list[Problem]) -> list[tuple[str, str]]:
    return [(p.location, p.message) for p in problems]


# examples/deployments/multi-tenant.yaml, lines 64-75
MULTI_TENANT = """
plugins:
  - id: dev.mcpg.rate-limit
    class: tool_gate
    source:
      oci: "ghcr.io/mcpg-dev/source-code/plugins/rate-limit:1.0.0"
    config:
      default_limit: 600
      default_window_ms: 60000
      default_burst: 50
"""


def test_the_multi_tenant_rate_limit_becomes_a_rate_limit_gate_per_principal():
    out, problems = _plugins(MULTI_TENANT)
    assert problems == []
    (gate,) = _mcpipe(out).access.gates
    assert (gate.default_limit, gate.default_window_ms, gate.default_burst, gate.name, gate.enforce) == (
        600,
        60_000,
        50,
        "dev.mcpg.rate-limit",
        True,
    )


# examples/deployments/air-gapped.yaml, lines 74-78 (and air-gapped.README.md, lines 38-50: ip-allowlist, identity.oidc)
AIR_GAPPED = """
plugins:
  - id: dev.mcpg.backend.mock
    class: backend
    source:
      oci: "ghcr.io/mcpg-dev/source-code/plugins/backend-mock:0.0.1-alpha.10"
"""
AIR_GAPPED_README = """
plugins:
  - id: dev.mcpg.ip-allowlist
    class: tool_gate
    source:
      path: "/opt/mcpg/plugins/ip-allowlist-1.0.0.zip"
    signature:
      sha256: "<the digest of ip-allowlist-1.0.0.zip>"
  - id: dev.mcpg.identity.oidc
    class: identity_provider
    source:
      path: "/opt/mcpg/plugins/identity-oidc-1.2.3.zip"
    signature:
      sha256: "<the digest of identity-oidc-1.2.3.zip>"
"""


def test_a_backend_mcpipe_has_built_in_needs_no_plugin():
    out, problems = _plugins(AIR_GAPPED)
    assert problems == [] and out == {}


def test_guarding_plugins_without_their_config_are_refused_as_mcpg_refuses_them_when_they_load():
    out, problems = _plugins(AIR_GAPPED_README)
    assert _where(problems) == [
        (
            "plugins[0].config.allow",
            "ip-allowlist: `allow` (a list of CIDR ranges) is required; mcpg refuses the plugin without it",
        ),
        (
            "plugins[1].config.providers",
            "the OIDC identity plugin `dev.mcpg.identity.oidc` needs at least one provider",
        ),
    ]
    assert "access" not in out and "oidc" not in out.get("auth", {})


# src/config/diagnostics.rs, lines 138-143 (an inline config of mcpg's Rust tests)
DIAGNOSTICS = """
plugins:
  - id: dev.mcpg.identity.oidc
    class: identity_provider
    source:
      path: /nonexistent/oidc.so
"""


def test_an_oidc_plugin_with_no_issuer_is_refused_never_ignored():
    _, problems = _plugins(DIAGNOSTICS)
    assert [p.location for p in problems] == ["plugins[0].config.providers"]


# docs/federation/guide.md, lines 434-445 ("oauth_client_credentials — machine identity") with the `source`
# mcpg requires (the guide's snippet has none: mcpg's config check refuses it, see the next test)
GUIDE_CC = """
plugins:
  - id: dev.mcpg.credential.oauth-client-credentials
    source: { oci: "ghcr.io/mcpg-dev/plugins/credential-oauth-client-credentials:1" }
    config:
      providers:
        notion:
          token_url: https://auth.notion.example.com/oauth/token
          client_id: mcpg-gateway
          client_secret: "${env.NOTION_SECRET}"
          scopes: ["read", "write"]
"""


def test_the_client_credentials_issuer_becomes_one_credential_per_provider_and_cred_refs_name_it():
    out, problems = _plugins(GUIDE_CC)
    name = credential_ref(
        "cred://dev.mcpg.credential.oauth-client-credentials/notion",
        "mcp.federations[0].upstream.auth.credential",
        out,
        problems,
    )
    assert problems == [] and name == "dev.mcpg.credential.oauth-client-credentials/notion"
    cred = _mcpipe(out).credentials[name]
    assert (cred.token_url, cred.client_id, cred.client_secret, cred.scopes) == (
        "https://auth.notion.example.com/oauth/token",
        "mcpg-gateway",
        "n-secret",
        ["read", "write"],
    )


def test_an_entry_without_a_source_is_refused_as_mcpgs_config_check_refuses_it():
    # docs/federation/guide.md, lines 215-224, as written
    text = """
plugins:
  - id: dev.mcpg.credential.oauth-id-jag
    config:
      target_template:
        allowed_targets: ["com.acme/*"]
        idp_token_url: https://idp.acme.example/oauth2/token
        client_id: mcpg-fleet
        client_secret: ${env.IDP_SECRET}
        audience_template: "https://{target}.mcp.acme.internal"
        redeem_token_url_template: "https://{target}.mcp.acme.internal/oauth2/token"
"""
    out, problems = _plugins(text, {"IDP_SECRET": "x"})
    assert _where(problems) == [
        (
            "plugins[0].source",
            "a plugin entry's `source` must specify exactly one of `path` or `oci` (has none); mcpg refuses the entry",
        )
    ]
    assert out == {}


def test_a_fleet_template_is_refused_located_and_an_unset_variable_named():
    text = GUIDE_CC.replace("notion:\n", "notion:\n").replace(
        "providers:", "target_template: {allowed_targets: ['a*']}\n      providers:"
    )
    _, problems = _plugins(text)
    assert [p.location for p in problems] == ["plugins[0].config.target_template"]
    _, unset = _plugins(GUIDE_CC, {})
    assert _where(unset) == [
        (
            "plugins[0].config.providers.notion.client_secret",
            "environment variable `NOTION_SECRET` is not set (the plugin's config reads it)",
        )
    ]


# docs/federation/guide.md, lines 464-474 (token exchange) and 509-519 (ID-JAG), with a source
GUIDE_OBO = """
plugins:
  - id: dev.mcpg.credential.oauth-token-exchange
    source: { path: ./plugins/libmcpg_plugin_credential_oauth_token_exchange.so }
    config:
      providers:
        notion:
          token_url: https://sts.example.com/oauth/token   # the STS
          client_id: mcpg-gateway
          client_secret: "${env.STS_CLIENT_SECRET}"        # optional
          audience: https://notion-mcp.example.com
  - id: dev.mcpg.credential.oauth-id-jag
    source: { path: ./plugins/libmcpg_plugin_credential_oauth_id_jag.so }
    config:
      providers:
        partner:
          idp_token_url: https://acme.okta.com/oauth2/v1/token   # enterprise IdP
          client_id: mcpg-gateway
          client_secret: "${env.OKTA_MCPG_CLIENT_SECRET}"
          audience: https://auth.partner.example                 # upstream's AS issuer
          resource: https://mcp.partner.example                  # upstream MCP server
          scopes: ["tools:invoke"]
          redeem_token_url: https://auth.partner.example/oauth/token
"""


def test_the_per_caller_issuers_become_token_exchange_and_id_jag_credentials():
    out, problems = _plugins(GUIDE_OBO)
    obo = credential_ref("cred://dev.mcpg.credential.oauth-token-exchange/notion", "a", out, problems)
    jag = credential_ref("cred://dev.mcpg.credential.oauth-id-jag/partner", "b", out, problems)
    missing = credential_ref("cred://dev.mcpg.credential.oauth-id-jag/drive", "c", out, problems)
    assert missing is None and _where(problems) == [
        (
            "c",
            "'cred://dev.mcpg.credential.oauth-id-jag/drive': plugin `dev.mcpg.credential.oauth-id-jag` "
            "has no provider `drive`",
        )
    ]
    creds = _mcpipe(out).credentials
    assert type(creds[obo]).__name__ == "TokenExchange" and creds[obo].audience == "https://notion-mcp.example.com"
    assert (
        type(creds[jag]).__name__ == "IdJag"
        and creds[jag].resource == "https://mcp.partner.example"
        and creds[jag].client_secret == "okta"
    )


# docs/string-interpolation.md, lines 9-16 and 103-112: an http binding's header carrying a credential
def test_a_credential_in_an_http_header_becomes_the_steps_credential_fields():
    out, problems = _plugins(GUIDE_CC)
    headers = {
        "Authorization": "Bearer ${cred://dev.mcpg.credential.oauth-client-credentials/notion}",
        "X-Region": "eu",
    }
    kept, fields = http_credential(headers, "mcp.capabilities.tools[0].backend.headers", out, problems)
    assert problems == [] and kept == {"X-Region": "eu"}
    assert fields == {
        "credential": "dev.mcpg.credential.oauth-client-credentials/notion",
        "credential_header": "Authorization",
        "credential_prefix": "Bearer ",
        "credential_suffix": "",
    }
    two = {"A": "${cred://env/A}", "B": "${cred://env/B}"}
    _, first_only = http_credential(two, "h", out, problems, {"A": "1", "B": "2"})
    assert [p.location for p in problems] == ["h.B"] and first_only["credential"] == "env/A"


# examples/31-twilio-sms-voice/config.yaml, lines 33-96 (the plugin entry) and 119-133 (a binding)
TWILIO = """
plugins:
  - id: dev.mcpg.backend.twilio
    class: backend
    source: { oci: "oci://ghcr.io/mcpg-dev/plugins/backend-twilio:protocol-1" }
    config:
      account_sid: "${env.TWILIO_ACCOUNT_SID}"
      auth_token: "cred://dev.mcpg.backend.twilio/auth_token"
      public_base_url: "https://mcpg.example.com"
      validate_signature: true
      max_body_bytes: 65536
      inbound_sms:
        auto_reply: "Thanks — an agent will follow up shortly."
      inbound_voice:
        handler_tool: "twilio.voice_brain"
        default_twiml_verbs:
          - { say: { text: "Please hold while we connect you.", voice: "Polly.Joanna" } }
          - { pause: { length: 1 } }
          - { say: { text: "All agents are busy. Goodbye." } }
      handler_timeout_ms: 8000
"""
TWILIO_BINDING = {
    "kind": "twilio",
    "operation": "send_sms",
    "account_sid": "AC" + "1" * 32,
    "api_key_sid": "SK" + "2" * 32,
    "api_key_secret": "cred://dev.mcpg.backend.twilio/api_key_secret",
    "from": "+14155550100",
}


def test_the_twilio_example_is_refused_where_mcpgs_plugin_refuses_its_webhook_config():
    _, problems = _plugins(TWILIO)
    assert [p.location for p in problems] == ["plugins[0].config.inbound_voice.default_twiml_verbs[0]"]
    assert "missing field `verb`" in problems[0].message and "mcpg refuses the plugin" in problems[0].message


def test_a_valid_twilio_webhook_config_is_still_refused_naming_the_routes_mcpipe_does_not_serve():
    text = TWILIO.replace(
        '{ say: { text: "Please hold while we connect you.", voice: "Polly.Joanna" } }', '{ verb: say, text: "hold" }'
    )
    text = text.replace("{ pause: { length: 1 } }", "{ verb: pause, length: 1 }").replace(
        '{ say: { text: "All agents are busy. Goodbye." } }', "{ verb: hangup }"
    )
    _, problems = _plugins(text)
    assert [p.location for p in problems] == ["plugins[0]"] and "inbound webhooks" in problems[0].message


def test_a_twilio_binding_becomes_a_twilio_step_its_secret_read_from_the_environment():
    variable = env_credential_variable("dev.mcpg.backend.twilio", "api_key_secret")
    assert variable == "MCPG_CRED_DEV_MCPG_BACKEND_TWILIO_API_KEY_SECRET"
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    step = translate_backend(
        TWILIO_BINDING, "mcp.capabilities.tools[0].backend", out, problems, {variable: "key-secret"}
    )
    assert problems == [] and step is not None
    assert (
        step["api_key_secret_credential"] == "dev.mcpg.backend.twilio/api_key_secret" and "api_key_secret" not in step
    )
    doc = {
        **out,
        "outbound": {"http": {"allowed_hosts": ["api.twilio.com"]}},
        "pipelines": [{"name": "twilio.send_sms", "steps": [{"id": "op", **step}]}],
    }
    config = _mcpipe(doc, {variable: "key-secret"})
    assert config.credentials[step["api_key_secret_credential"]].env == variable
    unset: list[Problem] = []
    assert translate_backend(TWILIO_BINDING, "b", {}, unset, {}) is None
    assert _where(unset) == [
        (
            "b.api_key_secret",
            f"'cred://dev.mcpg.backend.twilio/api_key_secret': no credential issuer `dev.mcpg.backend.twilio` is "
            f"configured; mcpipe reads this secret from the environment variable `{variable}`, which is not set",
        )
    ]


# docs/observability/sink-redirection.yaml, lines 52-131: per-plugin observability overrides only
SINK_REDIRECTION = """
plugins:
  - id: dev.mcpg.policy.cedar
    observability:
      logs: { enabled: true, level: info, mode: replace, sinks: [dev.acme.siem] }
  - id: dev.mcpg.backend.kafka
    observability:
      traces: { enabled: false }
  - id: dev.mcpg.backend.llm.openai
    observability:
      logs: { enabled: true, level: debug }
  - id: dev.mcpg.guardrails
    observability:
      logs: { enabled: true, mode: tee, sinks: [dev.acme.debug-archive] }
  - id: dev.mcpg.rate-limit
    observability:
      metrics: { enabled: false }
"""


def test_the_sink_redirection_snippet_is_refused_as_mcpg_refuses_entries_without_a_source():
    _, problems = _plugins(SINK_REDIRECTION)
    assert {p.location for p in problems} == {f"plugins[{i}].source" for i in range(5)}


@pytest.mark.parametrize(
    ("entry", "where", "says"),
    [
        ({"id": "dev.mcpg.policy.cedar", "config": {}}, "plugins[0].config.policy_dir", "policy_dir is required"),
        (
            {"id": "dev.mcpg.backend.llm.openai", "class": "backend"},
            "plugins[0]",
            "`dev.mcpg.backend.llm.openai` is not supported",
        ),
        ({"id": "dev.mcpg.guardrails"}, "plugins[0]", "a tool gate guards every call, so the file is refused"),
        (
            {"id": "dev.mcpg.identity.api-key", "class": "identity_provider"},
            "plugins[0]",
            "would decide who the callers are",
        ),
        (
            {"id": "dev.mcpg.rate-limit", "config": {"default_limt": 5}},
            "plugins[0].config.default_limt",
            "has no config field",
        ),
        ({"id": "dev.mcpg.rate-limit", "kind": "lua"}, "plugins[0].kind", "`native` or `wasm`"),
        ({"id": "dev.mcpg.rate-limit", "class": "gate"}, "plugins[0].class", "is not a plugin class"),
        ({"id": "x", "ref": "Not.Reverse DNS"}, "plugins[0].ref", "reverse-DNS"),
        (
            {
                "id": "dev.mcpg.identity.oidc",
                "config": {
                    "providers": [
                        {"issuer": "https://i", "audiences": ["a"], "verification": {"kind": "oauth_introspection"}}
                    ]
                },
            },
            "plugins[0].config.providers[0].verification.kind",
            "RFC 7662 introspection",
        ),
        (
            {
                "id": "dev.mcpg.identity.mtls",
                "config": {"sources": [{"kind": "direct_mtls", "header": "x"}], "extraction": {"mode": "subject_cn"}},
            },
            "plugins[0].config.sources[0].kind",
            "hypercorn",
        ),
        (
            {
                "id": "dev.mcpg.policy.cedar",
                "config": {
                    "policy_dir": "p",
                    "translation": {
                        "principal_type": "U",
                        "action_namespace": "A",
                        "resource_types": [{"decision_point": "*", "resource_type": "T"}],
                    },
                    "reload": {"enabled": True},
                },
            },
            "plugins[0].config.reload.enabled",
            "revocation included",
        ),
    ],
)
def test_what_mcpipe_cannot_honour_is_refused_located_naming_the_plugin(entry, where, says):
    entry = {"source": {"path": "./p.so"}, **entry}
    problems: list[Problem] = []
    translate_plugins([entry], "plugins", {}, problems, {})
    assert any(p.location == where and says in p.message for p in problems), problems


def test_a_disabled_entry_is_checked_and_not_loaded_and_a_duplicate_alias_refused():
    entries = [
        {"id": "dev.mcpg.guardrails", "source": {"path": "g.so"}, "disabled": True},
        {"id": "a", "ref": "dev.mcpg.rate-limit", "source": {"path": "r.so"}},
        {"id": "a", "ref": "dev.mcpg.rate-limit", "source": {"path": "r.so"}},
    ]
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    translate_plugins(entries, "plugins", out, problems, {})
    assert _where(problems) == [("plugins[2].id", "alias `a` is duplicated (also plugins[1]); aliases are unique")]
    assert [g["name"] for g in out["access"]["gates"]] == ["a"]


def test_cedar_identity_and_allowlist_entries_load_as_mcpipes_own_sections(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.cedar").write_text('permit(principal == User::"alice", action, resource);')
    entries = [
        {
            "id": "dev.mcpg.identity.oidc",
            "class": "identity_provider",
            "source": {"path": "o.so"},
            "config": {
                "token_source": {"kind": "authorization_bearer"},
                "providers": [
                    {
                        "issuer": "https://idp.example.com",
                        "audiences": ["mcpg"],
                        "clock_skew_secs": 60,
                        "verification": {
                            "kind": "oidc_jwks",
                            "allowed_algs": ["RS256", "ES256"],
                            "refresh_interval_secs": 300,
                            "timeout_ms": 2000,
                            "max_staleness_secs": 3600,
                        },
                        "claim_mappings": {
                            "subject_claim": "sub",
                            "group_claim_paths": ["groups"],
                            "role_claim_paths": ["realm_access.roles"],
                            "attribute_claim_mappings": {"tenant_id": "tenant"},
                        },
                    }
                ],
            },
        },
        {
            "id": "dev.mcpg.identity.mtls",
            "source": {"path": "m.so"},
            "config": {
                "sources": [{"kind": "xfcc", "header": "x-forwarded-client-cert"}],
                "extraction": {"mode": "subject_cn"},
                "identities": {"svc-a": {"roles": ["deployer"]}},
            },
        },
        {
            "id": "dev.mcpg.policy.cedar",
            "source": {"path": "c.so"},
            "config": {
                "policy_dir": "policies",
                "translation": {
                    "principal_type": "User",
                    "action_namespace": "Action",
                    "resource_types": [{"decision_point": "*", "resource_type": "Tool", "resource_id_path": "/tool"}],
                },
                "evaluation": {"on_default_deny": "deny"},
            },
        },
        {
            "id": "dev.mcpg.ip-allowlist",
            "source": {"path": "i.so"},
            "enforce": False,
            "config": {"allow": ["10.0.0.0/8", "::1/128"], "ip_header": "x-forwarded-for", "tools": []},
        },
    ]
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    translate_plugins(entries, "plugins", out, problems, {})
    assert problems == []
    config = parse_config(json.dumps({"audit": {"enabled": False}, **out}), "json", environ={}, base_dir=str(tmp_path))
    (oidc,) = config.auth.oidc
    assert (oidc.issuer, oidc.algorithms, oidc.role_claims, oidc.attributes) == (
        "https://idp.example.com",
        ["RS256", "ES256"],
        ["realm_access.roles"],
        {"tenant_id": "tenant"},
    )
    assert config.auth.mtls is not None and config.auth.mtls.trust == "header_asserted"
    cedar, allow = config.access.gates
    assert cedar.default == "deny" and cedar.resource_types[0].resource_id == "/tool"
    # mcpg's gateway hands its gate no request headers: mcpipe judges the TCP peer, never a client's header.
    assert allow.enforce is False and allow.ip_header is None and allow.trusted_proxies == []


# examples/deployments/multi-tenant.yaml lines 104-111 and production-nats-cluster.yaml lines 55-97: the sinks
def test_the_deployments_sinks_become_metrics_traces_and_the_mcpg_audit_file():
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    translate_sink(
        "metrics",
        {"kind": "dev.mcpg.observability.prometheus", "config": {"path": "/metrics", "bind": "0.0.0.0:9090"}},
        "observability.metrics.sinks[0]",
        out,
        problems,
    )
    translate_sink(
        "traces",
        {
            "kind": "dev.mcpg.observability.otlp",
            "config": {"url": "http://otel-collector.observability.svc.cluster.local:4318"},
        },
        "observability.traces.sinks[0]",
        out,
        problems,
    )
    translate_sink(
        "audit",
        {"kind": "dev.mcpg.builtin.audit.local-file", "config": {"path": "/var/log/mcpg/audit.log"}},
        "governance.audit.sinks[0]",
        out,
        problems,
    )
    assert problems == []
    config = parse_config(json.dumps(out), "json", environ={})
    t = config.telemetry
    assert (t.metrics, t.metrics_path, t.traces, t.otlp_endpoint, t.otlp_protocol) == (
        True,
        "/metrics",
        "otlp",
        "http://otel-collector.observability.svc.cluster.local:4318",
        "grpc",
    )
    assert (config.audit.format, config.audit.path) == ("mcpg", "/var/log/mcpg/audit.log")


@pytest.mark.parametrize(
    ("signal", "sink", "where", "says"),
    [
        (
            "traces",
            {"kind": "dev.mcpg.observability.otlp", "config": {"endpoint": "https://otel.acme.internal/v1/traces"}},
            "s.config.endpoint",
            "has no config field `endpoint`",
        ),
        (
            "logs",
            {"kind": "dev.mcpg.observability.otlp"},
            "s.kind",
            "the log sink plugin `dev.mcpg.observability.otlp` is not supported",
        ),
        ("audit", {"kind": "dev.acme.cloudtrail", "config": {"arn": "x"}}, "s.kind", "its audit records would be lost"),
        (
            "audit",
            {"kind": "dev.mcpg.builtin.audit.local-file", "routing": {"allow_actions": ["mcpg.payment.*"]}},
            "s.routing",
            "unknown key `routing` of a sink",
        ),
        (
            "metrics",
            {"kind": "dev.mcpg.observability.prometheus", "config": {"namespace": "mcpg"}},
            "s.config.namespace",
            "mcpipe_*",
        ),
    ],
)
def test_sinks_mcpipe_cannot_honour_are_refused_located(signal, sink, where, says):
    problems: list[Problem] = []
    translate_sink(signal, sink, "s", {}, problems)
    assert any(p.location == where and says in p.message for p in problems), problems
