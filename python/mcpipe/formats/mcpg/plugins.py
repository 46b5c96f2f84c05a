"""mcpg's plugins by their ids, given their mcpg meaning in mcpipe (``docs/formats/mcpg-plugins.md``).

The mcpg front-end (``mcpipe.formats.mcpg``) hands this module what of a file names plugins:

- :func:`translate_plugins`: the top-level ``plugins:`` entries (call it before the others: the credential
  issuers it reads are what :func:`credential_ref` resolves against);
- :func:`credential_ref`: each ``cred://<plugin_id>/<target>`` a binding, a federation or a registry makes;
- :func:`http_credential`: an ``http`` binding's ``headers``, where ``${cred://...}`` tokens sit;
- :func:`translate_sink`: each ``observability.{metrics,traces,logs}.sinks[]`` and
  ``governance.audit.sinks[]`` entry whose ``kind`` is a plugin id;
- :func:`translate_backend`: a binding whose ``backend.kind`` is a plugin backend mcpipe has (``twilio``).

Each plugin mcpipe can honour becomes sections of mcpipe's own layout in ``out`` (``auth``, ``access``,
``credentials``, ``audit``, ``telemetry``, ``plugins``); any other is refused, located, naming the plugin and
why. A plugin that guards access (identity, policy, rate limits, address allowlists) is never dropped: it is
enforced, or the file is refused. What mcpg itself refuses when it loads a plugin (a config its plugin does
not parse) is refused for the same reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcpipe._json import JsonObject
from mcpipe.errors import UNSET_ENV, Problem
from mcpipe.formats.mcpg._templates import expand_env_in

__all__ = [
    "PLUGIN_CLASSES",
    "credential_ref",
    "env_credential_variable",
    "http_credential",
    "translate_backend",
    "translate_oidc",
    "translate_plugins",
    "translate_sink",
]

_CODE = "INVALID_CONFIG"

PLUGIN_CLASSES = frozenset(
    {
        "tool_gate",
        "transform",
        "identity_provider",
        "backend",
        "watch_strategy",
        "http_route",
        "audit_sink",
        "log_sink",
        "telemetry_sink",
        "metrics_sink",
        "store",
        "cache",
        "secret_provider",
        "config_provider",
        "policy_engine",
        "cluster",
        "transport",
        "catalog_provider",
        "credential_issuer",
        "approval_notifier",
        "content_store",
    }
)
"""mcpg's ``PluginClass`` values (``mcpg_plugin_protocol::abi::ALL_KINDS``)."""

_REVERSE_DNS = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)+$")

PROMETHEUS = "dev.mcpg.observability.prometheus"
OTLP = "dev.mcpg.observability.otlp"
AUDIT_FILE = "dev.mcpg.builtin.audit.local-file"
CLIENT_CREDENTIALS = "dev.mcpg.credential.oauth-client-credentials"
TOKEN_EXCHANGE = "dev.mcpg.credential.oauth-token-exchange"
ID_JAG = "dev.mcpg.credential.oauth-id-jag"
TWILIO = "dev.mcpg.backend.twilio"
OPENAPI = "dev.mcpg.backend.openapi"
_BUILT_IN_BACKENDS = {
    "dev.mcpg.backend.http": "http",
    "dev.mcpg.backend.mock": "mock",
    "dev.mcpg.backend.nats": "nats",
    "dev.mcpg.backend.kafka": "kafka",
    "dev.mcpg.backend.sql": "sql",
    "dev.mcpg.backend.grpc": "grpc",
    "dev.mcpg.backend.graphql": "graphql",
    "dev.mcpg.backend.command": "command",
}
_JSONATA = "dev.mcpg.transform.jsonata"


# -- small helpers ----------------------------------------------------------------------------------------


def _problem(problems: list[Problem], loc: str, message: str, code: str = _CODE) -> None:
    problems.append(Problem(loc, code, message))


def _config(
    entry: Mapping[str, object], loc: str, problems: list[Problem], pid: str, known: frozenset[str] | None = None
) -> dict[str, Any] | None:
    """The entry's ``config`` as an object (absent or null: empty); None, with a problem, when it is not one, or
    when it has a field not in ``known`` (:func:`_fields`)."""
    cfg = entry.get("config")
    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping):
        _problem(problems, f"{loc}.config", f"the config of `{pid}` must be an object, got {type(cfg).__name__}")
        return None
    if known is not None and not _fields(cfg, known, f"{loc}.config", problems, pid):
        return None
    return dict(cfg)


def _fields(cfg: Mapping[str, object], known: frozenset[str], loc: str, problems: list[Problem], pid: str) -> bool:
    """mcpg's plugins refuse unknown config fields (``deny_unknown_fields``) when they load: so does mcpipe."""
    unknown = [key for key in cfg if key not in known]
    for key in unknown:
        _problem(
            problems,
            f"{loc}.{key}",
            f"`{pid}` has no config field `{key}` (its fields: {', '.join(sorted(known))}); mcpg refuses the "
            "plugin when it loads",
        )
    return not unknown


def _str(value: object, loc: str, problems: list[Problem], *, required: bool = False, what: str = "") -> str | None:
    if value is None:
        if required:
            _problem(problems, loc, f"{what or 'this field'} is required")
        return None
    if not isinstance(value, str):
        _problem(problems, loc, f"must be a string, got {type(value).__name__}")
        return None
    if required and not value.strip():
        _problem(problems, loc, f"{what or 'this field'} must not be empty")
        return None
    return value


def _strings(value: object, loc: str, problems: list[Problem]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _problem(problems, loc, "must be a list of strings")
        return []
    return list(value)


def _int(value: object, loc: str, problems: list[Problem], lo: int, hi: int | None = None) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        bound = f"{lo}..={hi}" if hi is not None else f">= {lo}"
        _problem(problems, loc, f"must be an integer {bound}, got {value!r}")
        return None
    return value


def _section(out: JsonObject, key: str) -> dict[str, Any]:
    value = out.setdefault(key, {})
    assert isinstance(value, dict)
    return value


def _section_list(out: JsonObject, key: str) -> list[Any]:
    value = out.setdefault(key, [])
    assert isinstance(value, list)
    return value


def _ints(lo: int, hi: int | None = None) -> Callable[[object, str, list[Problem]], int | None]:
    """:func:`_int` with its bounds, as a field reader of :func:`_copy`."""
    return lambda value, loc, problems: _int(value, loc, problems, lo, hi)


def _copy(
    src: Mapping[str, object],
    loc: str,
    problems: list[Problem],
    out: dict[str, Any],
    fields: Sequence[tuple[str, str, Callable[[object, str, list[Problem]], object]]],
) -> bool:
    """Each ``(key, target, read)`` of ``fields`` that ``src`` sets, read and put in ``out`` as ``target``;
    False when a reader refused one (its problem appended)."""
    ok = True
    for key, target, read in fields:
        if src.get(key) is not None:
            value = read(src[key], f"{loc}.{key}", problems)
            if value is None:
                ok = False
            else:
                out[target] = value
    return ok


@dataclass(frozen=True, slots=True)
class _Entry:
    """A loaded ``plugins:`` entry, as its plugin's translation (:data:`_PLUGINS`) reads it."""

    alias: str
    pid: str
    at: str
    enforce: bool
    out: JsonObject
    problems: list[Problem]
    environ: Mapping[str, str]

    @property
    def loc(self) -> str:
        """Where the entry's ``config`` is."""
        return f"{self.at}.config"


# -- plugins: -------------------------------------------------------------------------------------------


def translate_plugins(
    entries: Sequence[Mapping[str, Any]], loc: str, out: JsonObject, problems: list[Problem], environ: Mapping[str, str]
) -> None:
    """Read mcpg's ``plugins:`` list (at ``loc``): each plugin's meaning added to ``out`` (a config document
    in mcpipe's layout, being built), or a located problem appended to ``problems``.

    The list's shape (objects, their keys and types) is mcpg's schema's, checked before (:mod:`._schema`);
    mcpg's own checks of the list come first (an alias, unique; a reverse-DNS ``ref``; ``kind`` native or
    wasm; a known ``class``; exactly one of ``source.path``/``source.oci``). An entry with ``disabled: true`` is
    checked and not loaded, as in mcpg; ``enforce: false`` puts a gate in shadow mode.
    """
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        at = f"{loc}[{i}]"
        if not _entry_ok(entry, at, problems, seen, i):
            continue
        if entry.get("disabled") is True:
            continue
        alias = str(entry["id"])
        ref = entry.get("ref")
        pid = ref if isinstance(ref, str) else alias
        if "config" in entry:
            before = len(problems)
            config = _env(entry["config"], f"{at}.config", problems, environ)
            if len(problems) > before:
                continue
            entry = {**entry, "config": config}
        if pid == _JSONATA:
            continue  # JSONata is built in (plugin_transform steps)
        if pid not in _PLUGINS:
            _problem(problems, at, _unsupported(pid, entry.get("class", "tool_gate")))
            continue
        known, translate = _PLUGINS[pid]
        cfg = _config(entry, at, problems, pid, known)
        if cfg is not None:
            translate(cfg, _Entry(alias, pid, at, entry.get("enforce", True) is not False, out, problems, environ))


_ENV = re.compile(r"\$\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}")


def _env(value: object, loc: str, problems: list[Problem], environ: Mapping[str, str]) -> Any:
    """``${env.NAME}`` in a plugin's config, read from the environment when the file is loaded, as mcpg does
    (an unset variable is an error)."""

    def unset(where: str, name: str) -> None:
        _problem(problems, where, f"environment variable `{name}` is not set (the plugin's config reads it)", UNSET_ENV)

    return expand_env_in(value, loc, environ, unset, _ENV)


def _entry_ok(entry: Mapping[str, Any], at: str, problems: list[Problem], seen: dict[str, int], i: int) -> bool:
    """mcpg's ``validate_plugins``, and its entry shape (``deny_unknown_fields``)."""
    ok = True
    alias = entry["id"]
    if not alias.strip():
        _problem(problems, f"{at}.id", "the plugin alias (`id`) must not be empty")
        return False
    if alias in seen:
        _problem(
            problems, f"{at}.id", f"alias `{alias}` is duplicated (also plugins[{seen[alias]}]); aliases are unique"
        )
        ok = False
    seen.setdefault(alias, i)
    ref = entry.get("ref")
    if ref is not None and (not isinstance(ref, str) or not _REVERSE_DNS.match(ref)):
        _problem(problems, f"{at}.ref", f"`{ref}` must be a reverse-DNS manifest id (e.g. dev.mcpg.policy.cedar)")
        ok = False
    kind = entry.get("kind", "native")
    if kind not in ("native", "wasm"):
        _problem(problems, f"{at}.kind", f"must be `native` or `wasm`, got {kind!r}")
        ok = False
    cls = entry.get("class", "tool_gate")
    if cls not in PLUGIN_CLASSES:
        _problem(problems, f"{at}.class", f"`{cls}` is not a plugin class ({', '.join(sorted(PLUGIN_CLASSES))})")
        ok = False
    source = entry.get("source")
    if not isinstance(source, Mapping):
        what = "has none" if source is None else f"got {type(source).__name__}"
        _problem(
            problems,
            f"{at}.source",
            f"a plugin entry's `source` must specify exactly one of `path` or `oci` ({what}); mcpg refuses the entry",
        )
        ok = False
    elif (source.get("path") is None) == (source.get("oci") is None):
        _problem(
            problems,
            f"{at}.source",
            "a plugin entry's `source` must specify exactly one of `path` or `oci`; mcpg refuses it",
        )
        ok = False
    return ok


_WHY_CLASS = {
    "tool_gate": "a tool gate guards every call, so the file is refused rather than served without it",
    "identity_provider": "it would decide who the callers are, so the file is refused rather than served without it",
    "policy_engine": "it would decide what callers may do, so the file is refused rather than served without it",
    "transform": "it would change arguments or results",
    "credential_issuer": "the credentials it issues could not be presented",
    "audit_sink": "its audit records would be lost",
}


_OPENAPI_SOURCE_KEYS = frozenset({"name", "spec", "base_url", "auth", "expose", "filter", "tool_prefix"})


def _openapi(cfg: dict[str, Any], e: _Entry) -> None:
    """mcpg's OpenAPI backend plugin (``config.sources[]``): each source an ``[openapi.NAME]`` section.

    A source serves the operations its bindings name (``backend: {kind: openapi, source, operation}``, made
    reshaped tools by the binding translation), or, with ``expose.tools: true``, every operation its ``filter``
    (``allow``/``deny``, operationId globs) lets through, named ``tool_prefix`` + operationId. ``spec`` is a
    ``file://`` URI or ``{inline: {...}}``; each ``auth`` entry, keyed by the document's security scheme, is a
    ``${cred://...}`` reference (:func:`credential_ref`)."""
    out, problems = e.out, e.problems
    sources = cfg.get("sources")
    if not isinstance(sources, list) or not sources:
        _problem(problems, f"{e.loc}.sources", "the openapi plugin's `sources` is a non-empty list")
        return
    sections = _section(out, "openapi")
    for i, src in enumerate(sources):
        where = f"{e.loc}.sources[{i}]"
        if not isinstance(src, Mapping) or not _fields(src, _OPENAPI_SOURCE_KEYS, where, problems, OPENAPI):
            continue
        name = _str(src.get("name"), f"{where}.name", problems, required=True, what="a source's name")
        if name is None:
            continue
        if name in sections:
            _problem(problems, f"{where}.name", f"a second source named `{name}`")
            continue
        spec = src.get("spec")
        section: dict[str, Any] = {}
        if isinstance(spec, str) and spec.startswith("file://"):
            section["spec"] = spec
        elif isinstance(spec, Mapping) and isinstance(spec.get("inline"), Mapping) and len(spec) == 1:
            section["spec"] = dict(spec["inline"])
        else:
            _problem(problems, f"{where}.spec", "a source's `spec` is a file:// URI or `{inline: {...}}`")
            continue
        _copy(src, where, problems, section, [("base_url", "base_url", _str)])
        auth: dict[str, Any] = {}
        for scheme, ref in (src.get("auth") or {}).items():
            credential = credential_ref(str(ref), f"{where}.auth.{scheme}", out, problems, e.environ)
            if credential is not None:
                auth[str(scheme)] = {"credential": credential}
        if auth:
            section["auth"] = auth
        expose = src.get("expose") or {}
        prefix = src.get("tool_prefix")
        section["prefix"] = str(prefix).rstrip(".") if isinstance(prefix, str) else f"mcpg.openapi.{name}"
        if isinstance(expose, Mapping) and expose.get("tools") is True:
            rules = src.get("filter") or {}
            if isinstance(rules, Mapping) and rules.get("allow"):
                section["include"] = {"operations": _strings(rules["allow"], f"{where}.filter.allow", problems)}
            if isinstance(rules, Mapping) and rules.get("deny"):
                section["exclude"] = {"operations": _strings(rules["deny"], f"{where}.filter.deny", problems)}
        else:
            section["include"] = {"operations": []}  # the operations its bindings name (added by each binding)
        sections[name] = section


def _unsupported(pid: str, cls: object) -> str:
    if pid.startswith("dev.mcpg.backend."):
        return f"mcpg's plugin `{pid}` is not supported by mcpipe: it has no step kind for that backend"
    why = _WHY_CLASS.get(cls if isinstance(cls, str) else "", "mcpipe has no implementation of it")
    return f"mcpg's plugin `{pid}` is not supported by mcpipe: {why}"


# -- identity ---------------------------------------------------------------------------------------------

_OIDC = "dev.mcpg.identity.oidc"
_OIDC_KEYS = frozenset({"token_source", "providers"})
_PROVIDER_KEYS = frozenset(
    {
        "issuer",
        "discovery_uri",
        "audiences",
        "verification",
        "claim_mappings",
        "clock_skew_secs",
        "allowed_issuer_hosts",
        "allow_private_issuer",
        "allow_any_audience",
    }
)
_JWKS_KEYS = frozenset(
    {"kind", "allowed_algs", "refresh_interval_secs", "timeout_ms", "max_staleness_secs", "allow_hmac"}
)
_CLAIM_KEYS = frozenset(
    {"subject_claim", "group_claim_paths", "role_claim_paths", "scope_claim_paths", "attribute_claim_mappings"}
)


def translate_oidc(cfg: Mapping[str, object], loc: str, out: JsonObject, problems: list[Problem]) -> None:
    """mcpg's OIDC/OAuth identity config (the ``dev.mcpg.identity.oidc`` plugin's, and
    ``governance.access.oidc_oauth``'s: one schema) as ``[[auth.oidc]]`` issuers."""
    pid = _OIDC
    if not _fields(cfg, _OIDC_KEYS, loc, problems, pid):
        return
    header, prefix = "authorization", "Bearer "
    source = cfg.get("token_source")
    if source is not None:
        if not isinstance(source, Mapping):
            _problem(problems, f"{loc}.token_source", "must be an object")
            return
        if not _fields(
            source, frozenset({"kind", "header_name", "header_prefix"}), f"{loc}.token_source", problems, pid
        ):
            return
        kind = source.get("kind", "authorization_bearer")
        if kind == "custom_header":
            header = _str(source.get("header_name"), f"{loc}.token_source.header_name", problems) or "authorization"
            prefix = ""
        elif kind != "authorization_bearer":
            _problem(
                problems,
                f"{loc}.token_source.kind",
                f"`{kind}` is not a token source (authorization_bearer, custom_header)",
            )
            return
        if source.get("header_prefix") is not None:
            prefix = _str(source.get("header_prefix"), f"{loc}.token_source.header_prefix", problems) or ""
    providers = cfg.get("providers")
    if not isinstance(providers, list) or not providers:
        _problem(
            problems,
            f"{loc}.providers",
            "the OIDC identity plugin `dev.mcpg.identity.oidc` needs at least one provider",
        )
        return
    for j, p in enumerate(providers):
        at = f"{loc}.providers[{j}]"
        if not isinstance(p, Mapping):
            _problem(problems, at, "a provider is an object")
            continue
        provider = _oidc_provider(p, at, problems)
        if provider is not None:
            provider["header"], provider["prefix"] = header, prefix
            _section_list(_section(out, "auth"), "oidc").append(provider)


def _true(value: object, loc: str, problems: list[Problem]) -> bool | None:
    """A flag :func:`_copy` sets only when it is ``true``."""
    return True if value is True else None


def _oidc_provider(p: Mapping[str, object], at: str, problems: list[Problem]) -> dict[str, Any] | None:
    if not _fields(p, _PROVIDER_KEYS, at, problems, _OIDC):
        return None
    issuer = _str(p.get("issuer"), f"{at}.issuer", problems, required=True, what="issuer")
    if issuer is None:
        return None
    out: dict[str, Any] = {"issuer": issuer, "audiences": _strings(p.get("audiences"), f"{at}.audiences", problems)}
    _copy(p, at, problems, out, [("allow_any_audience", "any_audience", _true)])
    if p.get("discovery_uri") is not None:
        out["discovery_url"] = _str(p.get("discovery_uri"), f"{at}.discovery_uri", problems)
    _copy(p, at, problems, out, _PROVIDER_FIELDS)
    hosts = _strings(p.get("allowed_issuer_hosts"), f"{at}.allowed_issuer_hosts", problems)
    if hosts:
        _problem(
            problems,
            f"{at}.allowed_issuer_hosts",
            "a hostname allowlist for the discovery and key fetches is not supported by mcpipe (it fetches only the "
            "issuer's configured URLs)",
        )
    verification = p.get("verification")
    if not isinstance(verification, Mapping):
        _problem(problems, f"{at}.verification", "is required: an object with `kind: oidc_jwks`")
        return None
    kind = verification.get("kind")
    if kind in ("oauth_introspection", "hybrid"):
        _problem(
            problems,
            f"{at}.verification.kind",
            f"`{kind}` verifies opaque tokens by RFC 7662 introspection, which mcpipe does not support (only "
            "`oidc_jwks`: JWTs checked against the issuer's keys)",
        )
        return None
    if kind != "oidc_jwks":
        _problem(
            problems,
            f"{at}.verification.kind",
            f"`{kind}` is not a verification kind (oidc_jwks, oauth_introspection, hybrid)",
        )
        return None
    if not _fields(verification, _JWKS_KEYS, f"{at}.verification", problems, _OIDC):
        return None
    _copy(verification, f"{at}.verification", problems, out, _VERIFICATION_FIELDS)
    claims = p.get("claim_mappings")
    if claims is not None:
        where = f"{at}.claim_mappings"
        if not isinstance(claims, Mapping) or not _fields(claims, _CLAIM_KEYS, where, problems, _OIDC):
            return None
        if claims.get("subject_claim") is not None:
            out["subject_claim"] = _str(claims.get("subject_claim"), f"{where}.subject_claim", problems)
        _copy(claims, where, problems, out, _CLAIM_FIELDS)
        attrs = claims.get("attribute_claim_mappings")
        if attrs is not None:
            if not isinstance(attrs, Mapping) or not all(isinstance(v, str) for v in attrs.values()):
                _problem(problems, f"{where}.attribute_claim_mappings", "must map claim paths to attribute names")
            else:
                out["attributes"] = dict(attrs)
    return out


_PROVIDER_FIELDS = [("allow_private_issuer", "allow_private", _true), ("clock_skew_secs", "clock_skew_s", _ints(0))]
_VERIFICATION_FIELDS = [
    ("allowed_algs", "algorithms", _strings),
    ("allow_hmac", "allow_hmac", _true),
    ("refresh_interval_secs", "refresh_s", _ints(0)),
    ("max_staleness_secs", "max_staleness_s", _ints(0)),
    ("timeout_ms", "timeout_ms", _ints(1, 60_000)),
]
_CLAIM_FIELDS = [
    ("group_claim_paths", "group_claims", _strings),
    ("role_claim_paths", "role_claims", _strings),
    ("scope_claim_paths", "scope_claims", _strings),
]


_MTLS_KEYS = frozenset({"sources", "extraction", "identities", "resolution"})


_MTLS_SOURCES = {
    "xfcc": frozenset({"kind", "header", "chain_position"}),
    "dn_string": frozenset({"kind", "header"}),
    "custom_header": frozenset({"kind", "header", "extraction_hint"}),
}


def _mtls(cfg: dict[str, Any], e: _Entry) -> None:
    pid, loc, problems = e.pid, e.loc, e.problems
    sources = cfg.get("sources")
    if not isinstance(sources, list) or not sources:
        _problem(problems, f"{loc}.sources", "identity.mtls: `sources` must be non-empty")
        return
    mtls: dict[str, Any] = {"sources": []}
    for j, s in enumerate(sources):
        where = f"{loc}.sources[{j}]"
        if not isinstance(s, Mapping):
            _problem(problems, where, "a source is an object with a `kind`")
            return
        kind = s.get("kind")
        if kind not in _MTLS_SOURCES:
            if kind == "direct_mtls":
                why = (
                    "a client certificate mcpipe terminates itself: its HTTP server (hypercorn) does not tell the "
                    "application which certificate a client presented; terminate TLS in a proxy and use an `xfcc` "
                    "or `dn_string` source"
                )
                _problem(problems, f"{where}.kind", f"`direct_mtls` is not supported by mcpipe: {why}")
            else:
                _problem(problems, f"{where}.kind", f"`{kind}` is not a source kind (xfcc, dn_string, custom_header)")
            return
        if not _fields(s, _MTLS_SOURCES[kind], where, problems, pid):
            return
        header = _str(s.get("header"), f"{where}.header", problems, required=True, what="header")
        if header is None:
            return
        item: dict[str, Any] = {"kind": kind, "header": header}
        if kind == "xfcc" and s.get("chain_position") is not None:
            item["chain_position"] = s["chain_position"]
        if kind == "custom_header":
            item["extraction_hint"] = s.get("extraction_hint")
        mtls["sources"].append(item)
    extraction = cfg.get("extraction")
    if not isinstance(extraction, Mapping) or extraction.get("mode") not in ("subject_cn", "subject_dn", "fingerprint"):
        _problem(problems, f"{loc}.extraction", "is required: `{mode: subject_cn | subject_dn | fingerprint}`")
        return
    if not _fields(extraction, frozenset({"mode", "case_sensitive"}), f"{loc}.extraction", problems, pid):
        return
    mtls["mode"] = extraction["mode"]
    if extraction.get("case_sensitive") is True:
        mtls["case_sensitive"] = True
    resolution = cfg.get("resolution") or {}
    if not isinstance(resolution, Mapping) or not _fields(
        resolution, frozenset({"trust_level", "auth_provider_label"}), f"{loc}.resolution", problems, pid
    ):
        return
    trust = resolution.get("trust_level", "header_asserted")
    if trust not in ("verified", "header_asserted"):
        _problem(
            problems,
            f"{loc}.resolution.trust_level",
            f"identity.mtls: invalid trust_level `{trust}` (allowed: verified | header_asserted)",
        )
        return
    mtls["trust"] = trust
    identities = cfg.get("identities") or {}
    if not isinstance(identities, Mapping):
        _problem(problems, f"{loc}.identities", "must map subjects to roles, groups, scopes and attributes")
        return
    mtls["identities"] = {}
    for subject, meta in identities.items():
        where = f"{loc}.identities.{subject}"
        if not isinstance(meta, Mapping) or not _fields(
            meta, frozenset({"roles", "groups", "scopes", "attributes"}), where, problems, pid
        ):
            return
        mtls["identities"][str(subject)] = {
            k: meta[k] for k in ("roles", "groups", "scopes", "attributes") if k in meta
        }
    auth = _section(e.out, "auth")
    if "mtls" in auth:
        _problem(problems, e.at, "a second `dev.mcpg.identity.mtls` entry: mcpipe reads client certificates one way")
        return
    auth["mtls"] = mtls


# -- gates ------------------------------------------------------------------------------------------------

_CEDAR_KEYS = frozenset(
    {"policy_dir", "translation", "evaluation", "reload", "schema_path", "entities_path", "include_input_as_context"}
)


def _gate(out: JsonObject, gate: Mapping[str, object]) -> None:
    access = _section(out, "access")
    access["refusals"] = "error"  # answered as mcpg's plugins answer: their JSON-RPC errors
    _section_list(access, "gates").append(gate)


def _cedar(cfg: dict[str, Any], e: _Entry) -> None:
    pid, loc, problems = e.pid, e.loc, e.problems
    policy_dir = cfg.get("policy_dir")
    if not isinstance(policy_dir, str) or not policy_dir.strip():
        _problem(
            problems,
            f"{loc}.policy_dir",
            "policy.cedar: policy_dir is required (a directory of .cedar files); mcpg refuses the plugin without it",
        )
        return
    translation = cfg.get("translation")
    if not isinstance(translation, Mapping):
        _problem(
            problems,
            f"{loc}.translation",
            "policy.cedar: `translation` is required (principal_type, action_namespace, resource_types)",
        )
        return
    tkeys = frozenset({"principal_type", "action_namespace", "resource_types", "anonymous_principal_id"})
    if not _fields(translation, tkeys, f"{loc}.translation", problems, pid):
        return
    # mcpg's Cedar principal is `context.identity.subject_id`, the bare subject, whatever its source.
    gate: dict[str, Any] = {
        "kind": "cedar",
        "name": e.alias,
        "policy_dir": policy_dir,
        "enforce": e.enforce,
        "principal_id": "subject",
    }
    for key in ("principal_type", "action_namespace"):
        value = _str(
            translation.get(key), f"{loc}.translation.{key}", problems, required=True, what=f"translation.{key}"
        )
        if value is None:
            return
        gate[key] = value
    if translation.get("anonymous_principal_id") is not None:
        gate["anonymous_principal"] = translation["anonymous_principal_id"]
    types = translation.get("resource_types")
    if not isinstance(types, list) or not types:
        _problem(
            problems, f"{loc}.translation.resource_types", "policy.cedar: translation.resource_types must be non-empty"
        )
        return
    gate["resource_types"] = []
    for j, rt in enumerate(types):
        where = f"{loc}.translation.resource_types[{j}]"
        if not isinstance(rt, Mapping) or not _fields(
            rt, frozenset({"decision_point", "resource_type", "resource_id_path"}), where, problems, pid
        ):
            return
        point = _str(
            rt.get("decision_point"), f"{where}.decision_point", problems, required=True, what="decision_point"
        )
        rtype = _str(rt.get("resource_type"), f"{where}.resource_type", problems, required=True, what="resource_type")
        if point is None or rtype is None:
            return
        # mcpg reads the resource id by JSON pointer into the call's arguments ("" -> "unspecified").
        gate["resource_types"].append(
            {"decision_point": point, "resource_type": rtype, "resource_id": str(rt.get("resource_id_path") or "")}
        )
    evaluation = cfg.get("evaluation") or {}
    if not isinstance(evaluation, Mapping) or not _fields(
        evaluation, frozenset({"on_default_deny"}), f"{loc}.evaluation", problems, pid
    ):
        return
    mode = evaluation.get("on_default_deny", "not_applicable")
    if mode not in ("not_applicable", "deny"):
        _problem(problems, f"{loc}.evaluation.on_default_deny", f"must be `not_applicable` or `deny`, got {mode!r}")
        return
    gate["default"] = "defer" if mode == "not_applicable" else "deny"
    reload = cfg.get("reload") or {}
    if isinstance(reload, Mapping) and reload.get("enabled") is True:
        _problem(
            problems,
            f"{loc}.reload.enabled",
            "reloading the policies while serving is not supported by mcpipe (it reads them at start): a change, a "
            "revocation included, would not take effect",
        )
        return
    for key in ("schema_path", "entities_path"):
        if cfg.get(key) is not None:
            gate[key] = cfg[key]
    if cfg.get("include_input_as_context") is True:
        gate["arguments_as_context"] = True
    _gate(e.out, gate)


_RATE_KEYS = frozenset({"default_limit", "default_window_ms", "default_burst", "cleanup_interval_ms", "rules"})
_RULE_KEYS = frozenset({"tools", "scope", "limit", "window_ms", "burst"})
_SCOPES = ("per_principal", "per_tool", "per_principal_tool", "per_session", "global")


def _rate_limit(cfg: dict[str, Any], e: _Entry) -> None:
    loc, problems = e.loc, e.problems
    gate: dict[str, Any] = {"kind": "rate_limit", "name": e.alias, "enforce": e.enforce}
    bad = not _copy(cfg, loc, problems, gate, _RATE_FIELDS)
    rules = cfg.get("rules") or []
    if not isinstance(rules, list):
        _problem(problems, f"{loc}.rules", "must be a list of rules")
        return
    gate["rules"] = []
    for j, r in enumerate(rules):
        where = f"{loc}.rules[{j}]"
        if not isinstance(r, Mapping) or not _fields(r, _RULE_KEYS, where, problems, e.pid):
            bad = True
            continue
        tools = _strings(r.get("tools"), f"{where}.tools", problems)
        limit = _int(r.get("limit"), f"{where}.limit", problems, 1)
        if not tools or limit is None:
            if not tools:
                _problem(problems, f"{where}.tools", "a rule needs tool globs")
            if r.get("limit") is None:
                _problem(problems, f"{where}.limit", "a rule needs a `limit`")
            bad = True
            continue
        rule: dict[str, Any] = {"tools": tools, "limit": limit}
        scope = r.get("scope", "per_principal")
        if scope not in _SCOPES:
            _problem(problems, f"{where}.scope", f"`{scope}` is not a scope ({', '.join(_SCOPES)})")
            bad = True
            continue
        rule["scope"] = scope
        bad |= not _copy(r, where, problems, rule, [("window_ms", "window_ms", _ints(1)), ("burst", "burst", _ints(1))])
        gate["rules"].append(rule)
    if not bad:
        _gate(e.out, gate)


_RATE_FIELDS = [
    *((key, key, _ints(1)) for key in ("default_limit", "default_window_ms", "default_burst")),
    ("cleanup_interval_ms", "cleanup_interval_ms", _ints(0)),
]


def _ip_allowlist(cfg: dict[str, Any], e: _Entry) -> None:
    loc, problems = e.loc, e.problems
    allow = cfg.get("allow")
    if not isinstance(allow, list) or not allow:
        _problem(
            problems,
            f"{loc}.allow",
            "ip-allowlist: `allow` (a list of CIDR ranges) is required; mcpg refuses the plugin without it",
        )
        return
    _str(cfg.get("ip_header"), f"{loc}.ip_header", problems)  # checked, not used: see below
    gate: dict[str, Any] = {
        "kind": "ip_allowlist",
        "name": e.alias,
        "enforce": e.enforce,
        "allow": _strings(allow, f"{loc}.allow", problems),
        # mcpg's plugin reads `ip_header` from a `_request_headers` map its gateway never fills (v0.1.0-beta.16),
        # so no header a client sends reaches it. mcpipe judges the TCP peer, which a client cannot forge: a
        # header is believed only from an mcpipe `ip_allowlist` gate naming `trusted_proxies`.
        "tools": _strings(cfg.get("tools"), f"{loc}.tools", problems),
    }
    _gate(e.out, gate)


# -- credentials ------------------------------------------------------------------------------------------

_OAUTH_KEYS = frozenset({"client_id", "client_secret", "scopes", "timeout_ms"})
"""The fields every credential issuer's provider has."""
_CC_KEYS = _OAUTH_KEYS | {"token_url", "grant_type", "refresh_buffer_ms"}
_TE_KEYS = _OAUTH_KEYS | {"token_url", "subject_token_type", "requested_token_type", "audience", "resource"}
_JAG_KEYS = _OAUTH_KEYS | {
    "idp_token_url",
    "audience",
    "resource",
    "subject_token_type",
    "redeem_token_url",
    "redeem_client_id",
    "redeem_client_secret",
}


def _issuer(cfg: dict[str, Any], e: _Entry) -> None:
    pid, loc, problems = e.pid, e.loc, e.problems
    if cfg.get("target_template") is not None:
        _problem(
            problems,
            f"{loc}.target_template",
            "a fleet template (`target_template`) is not supported by mcpipe: list each target under `providers`",
        )
        return
    providers = cfg.get("providers")
    if not isinstance(providers, Mapping) or not providers:
        _problem(
            problems, f"{loc}.providers", f"`{pid}`: providers must be non-empty; mcpg refuses the plugin without them"
        )
        return
    creds = _section(e.out, "credentials")
    for name, p in providers.items():
        where = f"{loc}.providers.{name}"
        if not isinstance(p, Mapping):
            _problem(problems, where, "a provider is an object")
            continue
        made = _provider(pid, p, where, problems)
        if made is not None:
            creds[f"{e.alias}/{name}"] = made


_ISSUERS = {
    CLIENT_CREDENTIALS: ("client_credentials", _CC_KEYS, ("token_url", "client_id")),
    TOKEN_EXCHANGE: ("token_exchange", _TE_KEYS, ("token_url", "client_id")),
    ID_JAG: ("id_jag", _JAG_KEYS, ("idp_token_url", "client_id", "audience", "redeem_token_url")),
}
"""Each credential issuer plugin: the ``kind`` of its credentials, its provider's fields, those required."""
_ISSUER_TEXTS = (
    "client_secret",
    "audience",
    "resource",
    "subject_token_type",
    "requested_token_type",
    "redeem_client_id",
    "redeem_client_secret",
)


def _provider(pid: str, p: Mapping[str, object], at: str, problems: list[Problem]) -> dict[str, Any] | None:
    kind, keys, required = _ISSUERS[pid]
    # The tokens are requested from the operator's own URLs: private and loopback addresses are allowed, as mcpg
    # (whose issuers guard none) reaches them.
    out: dict[str, Any] = {"allow_private": True}
    if not _fields(p, keys, at, problems, pid) or not _copy(p, at, problems, out, _TIMEOUT_FIELD):
        return None
    scopes = _strings(p.get("scopes"), f"{at}.scopes", problems)
    if scopes:
        out["scopes"] = scopes
    for key in required:
        value = _str(p.get(key), f"{at}.{key}", problems, required=True, what=key)
        if value is None:
            return None
        out[key] = value
    for key in _ISSUER_TEXTS:
        if key in keys and key not in out and p.get(key) is not None:
            value = _str(p.get(key), f"{at}.{key}", problems)
            if value is None:
                return None
            out[key] = value
    if pid == CLIENT_CREDENTIALS:
        if not out.get("client_secret"):
            _problem(problems, f"{at}.client_secret", "oauth-client-credentials: client_secret is empty")
            return None
        grant = p.get("grant_type", "client_credentials")
        if grant != "client_credentials":
            _problem(problems, f"{at}.grant_type", f"grant_type `{grant}` is not supported (only `client_credentials`)")
            return None
        if not _copy(p, at, problems, out, [("refresh_buffer_ms", "refresh_buffer_ms", _ints(0, 600_000))]):
            return None
    elif pid == ID_JAG and out.get("redeem_client_secret") and not out.get("redeem_client_id"):
        _problem(problems, f"{at}.redeem_client_secret", "oauth-id-jag: redeem_client_secret requires redeem_client_id")
        return None
    out["kind"] = kind
    return out


_TIMEOUT_FIELD = [("timeout_ms", "timeout_ms", _ints(100, 60_000))]


_CRED = re.compile(r"\$\{\s*(cred://[^}\s]+)\s*\}")


def env_credential_variable(plugin: str, target: str) -> str:
    """The environment variable mcpipe reads a ``cred://<plugin>/<target>`` from when no credential issuer
    plugin of that id is configured: ``MCPG_CRED_`` and the two, upper-cased, every other character ``_``."""
    return "MCPG_CRED_" + re.sub(r"[^A-Za-z0-9]", "_", f"{plugin}_{target}").upper()


def credential_ref(
    uri: str, loc: str, out: JsonObject, problems: list[Problem], environ: Mapping[str, str] | None = None
) -> str | None:
    """The name of mcpipe's outbound credential that a ``cred://<plugin_id>/<target>`` reference (at
    ``loc``) stands for, or None (a located problem appended).

    - ``cred://<issuer>/<provider>`` of a configured ``oauth-client-credentials``, ``oauth-token-exchange`` or
      ``oauth-id-jag`` entry: that provider's credential (``<issuer>/<provider>``);
    - ``cred://env/NAME``: the environment variable ``NAME``;
    - any other plugin id (no issuer of that id is configured): a secret from the environment variable
      :func:`env_credential_variable` names, which must be set.

    ``#access_token`` selects the token (the only part an OAuth issuer's credential has that mcpipe presents).
    """
    text = uri.strip()
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1].strip()
    if not text.startswith("cred://"):
        _problem(problems, loc, f"{uri!r} is not a cred:// reference")
        return None
    path, sep, part = text[len("cred://") :].partition("#")
    plugin, slash, target = path.partition("/")
    if not plugin or not slash or not target or (sep and not part):
        _problem(problems, loc, f"{uri!r} is not a `cred://<plugin_id>/<target>[#part]` reference")
        return None
    if part and part != "access_token":
        _problem(
            problems,
            loc,
            f"{uri!r}: mcpipe presents a credential's token only (`#access_token`), not its part `{part}`",
        )
        return None
    creds = _section(out, "credentials")
    name = f"{plugin}/{target}"
    if name in creds and creds[name].get("kind") != "env":
        return name
    if any(k.startswith(f"{plugin}/") and v.get("kind") != "env" for k, v in creds.items()):
        _problem(problems, loc, f"{uri!r}: plugin `{plugin}` has no provider `{target}`")
        return None
    env = environ if environ is not None else {}
    variable = target if plugin == "env" else env_credential_variable(plugin, target)
    if environ is not None and not env.get(variable):
        if plugin == "env":
            _problem(problems, loc, f"{uri!r}: environment variable `{variable}` is not set", UNSET_ENV)
        else:
            _problem(
                problems,
                loc,
                f"{uri!r}: no credential issuer `{plugin}` is configured; mcpipe reads this secret from the "
                "environment "
                f"variable `{variable}`, which is not set",
                UNSET_ENV,
            )
        return None
    creds[name] = {"kind": "env", "env": variable}
    return name


def http_credential(
    headers: object, loc: str, out: JsonObject, problems: list[Problem], environ: Mapping[str, str] | None = None
) -> tuple[Any, dict[str, Any]]:
    """An ``http`` binding's ``headers`` with its ``${cred://...}`` header taken out, and the step fields that
    present that credential instead (``credential``, ``credential_header``, ``credential_prefix``,
    ``credential_suffix``). One header may hold one credential; a ``${cred://...}`` anywhere else (two
    headers, a URL) is refused, located."""
    if not isinstance(headers, Mapping):
        return headers, {}
    kept: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for key, value in headers.items():
        found = list(_CRED.finditer(value)) if isinstance(value, str) else []
        if not found:
            kept[key] = value
            continue
        where = f"{loc}.{key}"
        if len(found) > 1 or fields:
            _problem(problems, where, "mcpipe presents one credential per request: one `${cred://...}` in one header")
            continue
        m = found[0]
        name = credential_ref(m.group(1), where, out, problems, environ)
        if name is None:
            continue
        fields = {
            "credential": name,
            "credential_header": str(key),
            "credential_prefix": value[: m.start()],
            "credential_suffix": value[m.end() :],
        }
    return kept, fields


# -- sinks ------------------------------------------------------------------------------------------------


def translate_sink(signal: str, sink: object, loc: str, out: JsonObject, problems: list[Problem]) -> None:
    """One ``observability.<signal>.sinks[]`` entry (``signal``: ``metrics``, ``traces``, ``logs``) or
    ``governance.audit.sinks[]`` entry (``signal``: ``audit``) whose ``kind`` is a plugin id, at ``loc``.

    - metrics ``dev.mcpg.observability.prometheus``: ``GET <path>`` (``/metrics``) serves mcpipe's metrics;
    - traces ``dev.mcpg.observability.otlp``: spans go to ``url`` over OTLP/gRPC, as ``service_name``;
    - audit ``dev.mcpg.builtin.audit.local-file``: mcpg's hash-chained audit events in ``path``;
    - any other: refused, naming it.
    """
    if not isinstance(sink, Mapping) or not isinstance(sink.get("kind"), str):
        _problem(problems, loc, "a sink is an object with a `kind`")
        return
    kind = sink["kind"]
    cfg = sink.get("config") or {}
    if not isinstance(cfg, Mapping):
        _problem(problems, f"{loc}.config", "must be an object")
        return
    extra = [k for k in sink if k not in ("kind", "config", "level")]
    if extra:
        _problem(
            problems, f"{loc}.{extra[0]}", f"unknown key `{extra[0]}` of a sink (kind, config, level); mcpg refuses it"
        )
        return
    if signal == "metrics" and kind == PROMETHEUS:
        _prometheus(cfg, f"{loc}.config", out, problems)
    elif signal == "traces" and kind == OTLP:
        _otlp(cfg, f"{loc}.config", out, problems, enable=True)
    elif signal == "audit" and kind == AUDIT_FILE:
        _audit_file(cfg, f"{loc}.config", out, problems)
    elif signal == "logs" and kind in ("file", "stdout"):
        _log_sink(kind, cfg, f"{loc}.config", out, problems)
    else:
        what = {"metrics": "metrics sink", "traces": "trace sink", "logs": "log sink", "audit": "audit sink"}[signal]
        lost = ": its audit records would be lost" if signal == "audit" else ""
        _problem(problems, f"{loc}.kind", f"the {what} plugin `{kind}` is not supported by mcpipe{lost}")


def _log_sink(kind: str, cfg: Mapping[str, object], loc: str, out: JsonObject, problems: list[Problem]) -> None:
    """mcpg's built-in ``file`` log sink (``path``, ``format``): mcpipe's ``[logs] file``; ``stdout``: refused
    (mcpipe's log goes to stderr, and stdout may be the MCP channel)."""
    if kind == "stdout":
        _problem(
            problems,
            loc[: -len(".config")] + ".kind",
            "logging to stdout is not supported by mcpipe (its log goes to stderr)",
        )
        return
    if not _fields(cfg, frozenset({"path", "format"}), loc, problems, "the file log sink"):
        return
    path = _str(cfg.get("path"), f"{loc}.path", problems, required=True, what="the log file's `path`")
    if path is None:
        return
    logs = _section(out, "logs")
    if logs.get("file") not in (None, path):
        _problem(problems, loc, f"a second log file: mcpipe writes one (`{logs['file']}`)")
        return
    fmt = cfg.get("format", "json")
    logs.update(file=path, format="text" if fmt == "pretty" else "json")


def _prometheus(cfg: Mapping[str, object], loc: str, out: JsonObject, problems: list[Problem]) -> None:
    """mcpg serves the exporter at the sink's ``path``; ``bind`` is read by nothing in mcpg (the metrics share
    the gateway's listener), nor in mcpipe."""
    if not _fields(cfg, frozenset({"path", "bind", "namespace", "global_labels"}), loc, problems, PROMETHEUS):
        return
    tel = _section(out, "telemetry")
    tel["metrics"] = True
    path = _str(cfg.get("path"), f"{loc}.path", problems)
    if path is not None:
        tel["metrics_path"] = path
    _prometheus_labels(cfg, loc, problems)


def _prometheus_labels(cfg: Mapping[str, object], loc: str, problems: list[Problem]) -> None:
    if cfg.get("namespace"):
        _problem(
            problems,
            f"{loc}.namespace",
            "a metric-name prefix is not supported by mcpipe (its metrics are named mcpipe_*)",
        )
    if cfg.get("global_labels"):
        _problem(problems, f"{loc}.global_labels", "labels added to every series are not supported by mcpipe")


_OTLP_KEYS = frozenset({"url", "service_name", "service_version", "resource_attributes", "batch_export_timeout_ms"})


def _otlp(cfg: Mapping[str, object], loc: str, out: JsonObject, problems: list[Problem], *, enable: bool) -> None:
    if not _fields(cfg, _OTLP_KEYS, loc, problems, OTLP):
        return
    tel = _section(out, "telemetry")
    if enable:
        tel["traces"] = "otlp"
    url = _str(cfg.get("url"), f"{loc}.url", problems)
    if url:
        tel["otlp_endpoint"] = url
        tel["otlp_protocol"] = "grpc"  # mcpg's exporter speaks OTLP over gRPC
    name = _str(cfg.get("service_name"), f"{loc}.service_name", problems)
    if name:
        tel["service_name"] = name
    attrs = dict(tel.get("resource_attributes") or {})
    version = _str(cfg.get("service_version"), f"{loc}.service_version", problems)
    if version:
        attrs["service.version"] = version
    more = cfg.get("resource_attributes")
    if more is not None:
        if not isinstance(more, Mapping) or not all(isinstance(v, str) for v in more.values()):
            _problem(problems, f"{loc}.resource_attributes", "must map names to strings")
        else:
            attrs.update(more)
    if attrs:
        tel["resource_attributes"] = attrs


def _audit_file(cfg: Mapping[str, object], loc: str, out: JsonObject, problems: list[Problem]) -> None:
    if not _fields(cfg, frozenset({"path", "format"}), loc, problems, AUDIT_FILE):
        return
    if cfg.get("format", "json") not in ("json", "jsonl"):
        _problem(problems, f"{loc}.format", "must be `json` or `jsonl` (both write one JSON event per line)")
        return
    path = _str(cfg.get("path"), f"{loc}.path", problems) or "./mcpg-audit.log"
    audit = _section(out, "audit")
    if audit.get("format") == "mcpg" and audit.get("path") not in (None, path):
        _problem(problems, loc, f"a second local audit file: mcpipe writes one (`{audit['path']}`)")
        return
    audit.update(enabled=True, format="mcpg", path=path)


# -- plugin backends --------------------------------------------------------------------------------------

_TWILIO_WEBHOOK_KEYS = frozenset(
    {
        "account_sid",
        "auth_token",
        "public_base_url",
        "mount_name",
        "validate_signature",
        "max_body_bytes",
        "inbound_sms",
        "inbound_voice",
        "notify_webhook_url",
        "handler_timeout_ms",
    }
)


def _twilio_webhook(cfg: dict[str, Any], e: _Entry) -> None:
    """The twilio plugin entry's config is its inbound-webhook (``http_route``) entity's, which mcpg builds
    whenever the plugin loads: checked as mcpg checks it, then refused (mcpipe does not serve those routes)."""
    from mcpipe.kinds.twilio import TwimlError, render_twiml

    at, loc, problems = e.at, e.loc, e.problems
    before = len(problems)
    if not cfg:
        _problem(
            problems,
            loc,
            "missing twilio webhook config (account_sid, auth_token, public_base_url required); mcpg refuses the "
            "plugin without it",
        )
        return
    if not _fields(cfg, _TWILIO_WEBHOOK_KEYS, loc, problems, TWILIO):
        return
    for key, why in (
        ("account_sid", "account_sid is required"),
        ("auth_token", "auth_token is required (it signs the webhooks)"),
        ("public_base_url", "public_base_url is required"),
    ):
        value = cfg.get(key)
        if not isinstance(value, str) or not value.strip():
            _problem(problems, f"{loc}.{key}", why)
    base = cfg.get("public_base_url")
    if isinstance(base, str) and base.strip() and not base.startswith(("http://", "https://")):
        _problem(problems, f"{loc}.public_base_url", "public_base_url must be an absolute http(s) URL")
    voice = cfg.get("inbound_voice")
    if isinstance(voice, Mapping) and voice.get("default_twiml_verbs") is not None:
        try:
            render_twiml(voice["default_twiml_verbs"], f"{loc}.inbound_voice.default_twiml_verbs")
        except TwimlError as exc:
            where, _, why = str(exc).partition(": ")
            _problem(
                problems,
                where,
                f"invalid twilio webhook config: {why} (a verb is written `{{verb: say, text: ...}}`); mcpg refuses "
                "the plugin",
            )
    if len(problems) == before:
        _problem(
            problems,
            at,
            "the inbound webhooks of `dev.mcpg.backend.twilio` (its http_route entity: signed SMS/voice callbacks "
            "answered with TwiML) are not served by mcpipe; its `twilio` bindings are",
        )


def _built_in(cfg: dict[str, Any], e: _Entry) -> None:
    if cfg:
        _problem(
            e.problems,
            e.loc,
            f"mcpipe's `{_BUILT_IN_BACKENDS[e.pid]}` steps are built in and take their settings from each binding; "
            f"a plugin-level config of `{e.pid}` is not supported",
        )


_PLUGINS: dict[str, tuple[frozenset[str] | None, Callable[[dict[str, Any], _Entry], None]]] = {
    _OIDC: (None, lambda cfg, e: translate_oidc(cfg, e.loc, e.out, e.problems)),
    "dev.mcpg.identity.mtls": (_MTLS_KEYS, _mtls),
    "dev.mcpg.policy.cedar": (_CEDAR_KEYS, _cedar),
    "dev.mcpg.rate-limit": (_RATE_KEYS, _rate_limit),
    "dev.mcpg.ip-allowlist": (frozenset({"allow", "ip_header", "tools"}), _ip_allowlist),
    **dict.fromkeys(_ISSUERS, (frozenset({"providers", "target_template"}), _issuer)),
    PROMETHEUS: (frozenset({"namespace", "global_labels"}), lambda cfg, e: _prometheus_labels(cfg, e.loc, e.problems)),
    OTLP: (None, lambda cfg, e: _otlp(cfg, e.loc, e.out, e.problems, enable=False)),
    AUDIT_FILE: (None, lambda cfg, e: _audit_file(cfg, e.loc, e.out, e.problems)),
    TWILIO: (None, _twilio_webhook),
    OPENAPI: (frozenset({"sources"}), _openapi),
    **dict.fromkeys(_BUILT_IN_BACKENDS, (None, _built_in)),
}
"""The plugins mcpipe honours, by id: the fields their config may have (None: their translation checks), and
their translation (given the config read as an object: :func:`_config`)."""


_TWILIO_SECRETS = ("api_key_secret", "auth_token")


def translate_backend(
    backend: object, loc: str, out: JsonObject, problems: list[Problem], environ: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """A binding's ``backend:`` block whose kind is a plugin backend mcpipe has, as the fields of its step:
    ``twilio`` (``dev.mcpg.backend.twilio``), its ``cred://`` secrets resolved by :func:`credential_ref`.
    None (a located problem appended) for any other kind."""
    if not isinstance(backend, Mapping) or backend.get("kind") != "twilio":
        kind = backend.get("kind") if isinstance(backend, Mapping) else None
        _problem(problems, f"{loc}.kind", f"the backend kind `{kind}` is not a plugin backend mcpipe has")
        return None
    step: dict[str, Any] = {k: v for k, v in backend.items() if k not in _TWILIO_SECRETS}
    for key in _TWILIO_SECRETS:
        value = backend.get(key)
        if value is None:
            continue
        if isinstance(value, str) and "cred://" in value:
            name = credential_ref(value, f"{loc}.{key}", out, problems, environ)
            if name is None:
                return None
            step[f"{key}_credential"] = name
        else:
            step[key] = value
    return step
