"""The config sections of access control and outbound credentials, as msgspec Structs (``docs/access.md``).

``[auth]``'s identity sources (``oidc``, ``mtls``), ``[[access.gates]]`` (Cedar policies, rate limits,
client-address allowlists, in the order they run) and ``[credentials.NAME]`` (outbound OAuth tokens and
secrets). Decoding is the config's; :func:`check_access` and :func:`check_credentials` add the checks that
span fields, each problem located.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

from mcpipe._struct import Strict
from mcpipe.errors import UNSET_ENV, ErrorCode, Problem

__all__ = [
    "AccessConfig",
    "CedarGate",
    "ClientCredentials",
    "CredentialConfig",
    "EnvCredential",
    "IdJag",
    "IntrospectionProvider",
    "IpAllowlistGate",
    "MtlsConfig",
    "MtlsIdentity",
    "MtlsSource",
    "OidcProvider",
    "RateLimitGate",
    "RateRule",
    "ResourceConfig",
    "ResourceType",
    "ScopeRule",
    "TokenExchange",
    "check_access",
    "check_credentials",
    "check_introspection",
    "check_mtls",
    "check_oidc",
    "check_resource",
    "check_scopes",
]

CODE = ErrorCode.INVALID_CONFIG

MAX_CLOCK_SKEW_S = 300
"""A larger leeway is a replay window, not clock-drift tolerance (mcpg's bound)."""
MAX_STALENESS_S = 86_400
"""Past a day a stale JWK Set stops covering an IdP outage and keeps revoked keys alive (mcpg's bound)."""
ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "EdDSA",
    "HS256",
    "HS384",
    "HS512",
)


# -- identity ---------------------------------------------------------------------------------------------


class OidcProvider(Strict):
    """One issuer whose JWT bearer tokens identify callers (``[[auth.oidc]]``).

    Keys come from ``jwks`` (a JWK Set, inline), else ``jwks_url``, else the issuer's discovery document
    (``discovery_url``, by default ``<issuer>/.well-known/openid-configuration``), fetched on first use and
    cached for ``refresh_s``; a token naming an unknown ``kid`` refetches at most once a minute, and a failed
    refetch keeps serving the cached keys for ``max_staleness_s``.
    """

    issuer: str
    audiences: list[str] = []
    any_audience: bool = False
    """Accept tokens without checking ``aud`` (only for an issuer that sets none)."""
    jwks: str | None = None
    jwks_url: str | None = None
    discovery_url: str | None = None
    algorithms: list[str] = msgspec.field(default_factory=lambda: ["RS256"])
    allow_hmac: bool = False
    clock_skew_s: Annotated[int, msgspec.Meta(ge=0)] = 60
    refresh_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    max_staleness_s: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=60_000)] = 2000
    allow_private: bool = False
    """Let the discovery and key fetches reach private and loopback addresses (an in-house IdP, tests)."""
    subject_claim: str = "sub"
    group_claims: list[str] = []
    role_claims: list[str] = []
    scope_claims: list[str] = msgspec.field(default_factory=lambda: ["scope", "scp"])
    attributes: dict[str, str] = {}
    """Claim path -> attribute name (``{"tenant_id" = "tenant"}``)."""
    header: str = "authorization"
    prefix: str = "Bearer "


class IntrospectionProvider(Strict):
    """An authorization server whose opaque access tokens are checked by RFC 7662 introspection
    (``[[auth.introspection]]``).

    mcpipe posts each token it does not know to ``endpoint`` (else the ``introspection_endpoint`` of the
    issuer's RFC 8414 metadata), authenticated as ``client_id``; an ``active`` answer whose ``aud`` names an
    accepted audience identifies the caller. Answers are cached no longer than the token lives (``exp``) nor
    than ``cache_s``, at most ``max_per_principal`` tokens per principal and ``max_cached`` in all.
    """

    issuer: str
    client_id: str
    endpoint: str | None = None
    metadata_url: str | None = None
    """Where the issuer's metadata is (default ``<issuer>/.well-known/oauth-authorization-server``, then
    ``openid-configuration``); read only when ``endpoint`` is unset."""
    client_secret: str | None = None
    client_secret_env: str | None = None
    auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    audiences: list[str] = []
    """The ``aud`` values accepted (empty: this resource's URL, ``auth.resource.url``)."""
    any_audience: bool = False
    cache_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 300.0
    max_cached: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    max_per_principal: Annotated[int, msgspec.Meta(ge=1)] = 16
    max_in_flight: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 16
    """The most introspection requests at once; a token arriving past it is answered 503 (not queued)."""
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=60_000)] = 2000
    allow_private: bool = False
    subject_claim: str = "sub"
    group_claims: list[str] = []
    role_claims: list[str] = []
    scope_claims: list[str] = msgspec.field(default_factory=lambda: ["scope"])
    attributes: dict[str, str] = {}


class ResourceConfig(Strict):
    """mcpipe as an OAuth 2.1 resource server (``[auth.resource]``, RFC 9728): its protected resource metadata
    and what its 401 and 403 answers name."""

    url: str | None = None
    """Its canonical URL, the ``resource`` clients ask tokens for (RFC 8707): behind a TLS-terminating proxy,
    the public one (``https://mcp.example.com/mcp``). Unset: the request's scheme, ``Host`` and ``http.path``."""
    authorization_servers: list[str] | None = None
    """Default: the issuers of ``[[auth.oidc]]`` and ``[[auth.introspection]]``."""
    scopes_supported: list[str] | None = None
    """Default: every scope ``[[auth.scopes]]`` names."""
    scopes: list[str] | None = None
    """The scopes a 401 challenge asks for (``scope=``); default: ``scopes_supported``."""
    documentation: str | None = None
    """``resource_documentation``: a page for people about this server."""
    name: str | None = None
    """``resource_name`` (default: the config's ``name``)."""


class ScopeRule(Strict):
    """The OAuth scope some tools, prompts and resources need (``[[auth.scopes]]``): a caller whose token
    lacks it does not see them listed and cannot call them, directly or from any pipeline."""

    scope: str

    tools: list[str] = []
    """Tool globs (``files.*``): tools, declared pipelines, playbooks, downstream servers' tools."""
    prompts: list[str] = []
    resources: list[str] = []
    """Resource URI globs (``file:///reports/*``)."""


class MtlsSource(Strict):
    """Where a TLS-terminating proxy puts the client certificate it verified."""

    kind: Literal["xfcc", "dn_string", "custom_header"]
    header: str
    chain_position: Literal["first", "last"] = "first"
    """``xfcc``: which element of the header's list is the client (Envoy appends one per hop)."""
    extraction_hint: Literal["dn", "fingerprint"] | None = None
    """``custom_header``: whether the header holds a subject DN or a SHA-256 fingerprint."""


class MtlsIdentity(Strict):
    roles: list[str] = []
    groups: list[str] = []
    scopes: list[str] = []
    attributes: dict[str, str] = {}


class MtlsConfig(Strict):
    """The client certificate a proxy forwarded, as the caller's identity (``[auth.mtls]``)."""

    sources: list[MtlsSource]
    mode: Literal["subject_cn", "subject_dn", "fingerprint"] = "subject_cn"
    case_sensitive: bool = False
    trust: Literal["verified", "header_asserted"] = "header_asserted"
    """``header_asserted`` unless a proxy that strips clients' own copies of the header sits in front."""
    identities: dict[str, MtlsIdentity] = {}
    """Roles, groups, scopes and attributes by subject."""


# -- gates ------------------------------------------------------------------------------------------------


class ResourceType(Strict):
    decision_point: str = "*"
    resource_type: str = "Tool"
    resource_id: str = "tool"
    """``tool`` (the tool's name), or a JSON pointer into the call's arguments (``/account``)."""


class CedarGate(Strict, tag="cedar", tag_field="kind", kw_only=True):
    """Cedar policies deciding each tool call: principal ``<principal_type>::"<principal>"``, action
    ``<action_namespace>::"tool.call.pre"``, resource per ``resource_types``; a ``forbid`` denies, a
    ``permit`` allows, and when none matches ``default`` decides (``deny``, or ``defer`` to the gates after)."""

    policies: str | None = None
    policy_dir: str | None = None
    schema_path: str | None = None
    entities_path: str | None = None
    principal_type: str = "User"
    principal_id: Literal["principal", "subject"] = "principal"
    """What names the principal: the caller's principal (``alice`` for a token, ``oidc:<issuer>#alice`` for a
    JWT: ``mcpipe.access.Principal``), or its bare ``subject`` (mcpg's rule: the same subject from any source
    is the same Cedar principal)."""
    action_namespace: str = "Action"
    anonymous_principal: str = "anonymous"
    resource_types: list[ResourceType] = msgspec.field(default_factory=lambda: [ResourceType()])
    arguments_as_context: bool = False
    max_context_bytes: Annotated[int, msgspec.Meta(ge=1)] = 65_536
    """With ``arguments_as_context``, the largest arguments (as JSON) handed to Cedar: larger ones are denied
    before Cedar sees them (Cedar evaluates holding the interpreter, about 1 s per MB of arguments)."""
    default: Literal["deny", "defer"] = "deny"
    enforce: bool = True
    """False: shadow mode, a deny is logged and the call goes on."""
    name: str | None = None


class RateRule(Strict):
    tools: list[str]
    limit: Annotated[int, msgspec.Meta(ge=1)]
    window_ms: Annotated[int, msgspec.Meta(ge=1)] = 60_000
    burst: Annotated[int, msgspec.Meta(ge=1)] | None = None
    scope: Literal["per_principal", "per_tool", "per_principal_tool", "per_session", "global"] = "per_principal"


class RateLimitGate(Strict, tag="rate_limit", tag_field="kind", kw_only=True):
    """Token buckets: a call takes one token from its bucket (chosen by the first rule whose tools match,
    else the defaults per principal); an empty bucket refuses it with ``LIMIT_EXCEEDED``."""

    default_limit: Annotated[int, msgspec.Meta(ge=1)] = 100
    default_window_ms: Annotated[int, msgspec.Meta(ge=1)] = 60_000
    default_burst: Annotated[int, msgspec.Meta(ge=1)] | None = None
    cleanup_interval_ms: Annotated[int, msgspec.Meta(ge=0)] = 300_000
    max_buckets: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    """The most buckets kept; past it the least recently used go (a refused caller's bucket refills anyway)."""
    rules: list[RateRule] = []
    enforce: bool = True
    name: str | None = None


class IpAllowlistGate(Strict, tag="ip_allowlist", tag_field="kind", kw_only=True):
    """Tool calls only from these networks. The address is the TCP peer's, unless ``ip_header`` names a header a
    proxy in front sets: then, with ``trusted_proxies``, the header is read only from a peer in them, and its
    client is the rightmost address of the list that is not one of them; without, its first value (the proxy
    must overwrite the header, not append to it). A call whose address is unknown is refused."""

    allow: list[str]
    ip_header: str | None = None
    trusted_proxies: list[str] = []
    """The networks of the proxies whose ``ip_header`` is believed (CIDRs)."""
    tools: list[str] = []
    """Tool globs the gate applies to; empty: every tool."""
    enforce: bool = True
    name: str | None = None


Gate = CedarGate | RateLimitGate | IpAllowlistGate


class AccessConfig(Strict):
    """``[access]``: the gates every tool call passes, in order (the first refusal wins)."""

    gates: list[Gate] = []
    refusals: Literal["result", "error"] = "result"
    """How a refused call answers: ``result``, an ``isError`` result (``FORBIDDEN: ...``, ``LIMIT_EXCEEDED: ...``);
    ``error``, the JSON-RPC error mcpg's plugin of that kind answers (``-32029`` rate limited, ``-32030`` not
    in the allowlist, ``-33000`` a policy denied)."""


# -- credentials ------------------------------------------------------------------------------------------


class _Outbound(Strict):
    timeout_ms: Annotated[int, msgspec.Meta(ge=100, le=60_000)] = 5000
    allow_private: bool = False
    """Let the token requests reach private and loopback addresses (an in-house authorization server)."""


class ClientCredentials(_Outbound, tag="client_credentials", tag_field="kind", kw_only=True):
    """A machine token (RFC 6749 §4.4), shared by every caller, cached until ``refresh_buffer_ms`` before it
    expires; a failed refresh serves the old token for up to five minutes past its expiry."""

    token_url: str
    client_id: str
    client_secret: str | None = None
    client_secret_env: str | None = None
    scopes: list[str] = []
    refresh_buffer_ms: Annotated[int, msgspec.Meta(ge=0, le=600_000)] = 60_000


class TokenExchange(_Outbound, tag="token_exchange", tag_field="kind", kw_only=True):
    """The caller's bearer exchanged for one the upstream takes (RFC 8693), per caller, cached until it expires."""

    token_url: str
    client_id: str
    client_secret: str | None = None
    client_secret_env: str | None = None
    scopes: list[str] = []
    subject_token_type: str = "urn:ietf:params:oauth:token-type:access_token"
    requested_token_type: str = "urn:ietf:params:oauth:token-type:access_token"
    audience: str | None = None
    resource: str | None = None


class IdJag(_Outbound, tag="id_jag", tag_field="kind", kw_only=True):
    """Cross-App Access: the caller's bearer exchanged at the IdP for an identity assertion grant
    (``urn:ietf:params:oauth:token-type:id-jag``, RFC 8693), redeemed at the upstream's authorization server
    as a JWT bearer grant (RFC 7523); per caller, cached until the upstream token expires."""

    idp_token_url: str
    client_id: str
    client_secret: str | None = None
    client_secret_env: str | None = None
    audience: str
    resource: str | None = None
    scopes: list[str] = []
    subject_token_type: str = "urn:ietf:params:oauth:token-type:access_token"
    redeem_token_url: str
    redeem_client_id: str | None = None
    redeem_client_secret: str | None = None
    redeem_client_secret_env: str | None = None


class EnvCredential(Strict, tag="env", tag_field="kind", kw_only=True):
    """A static secret from an environment variable, read when the config is loaded."""

    env: str


CredentialConfig = ClientCredentials | TokenExchange | IdJag | EnvCredential

_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _url(value: str, where: str, problems: list[Problem]) -> None:
    if not value.startswith(("http://", "https://")):
        problems.append(Problem(where, CODE, "must be an http:// or https:// URL"))


def check_oidc(providers: list[OidcProvider], base: str, resource: str | None = None) -> list[Problem]:
    """Every problem of ``[[auth.oidc]]`` beyond its types (``resource``: ``auth.resource.url``, the audience of
    an issuer that names none)."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, p in enumerate(providers):
        at = f"{base}[{i}]"
        if not p.issuer.strip():
            problems.append(Problem(f"{at}.issuer", CODE, "must not be empty"))
        else:
            _url(p.issuer, f"{at}.issuer", problems)
            if "#" in p.issuer or "?" in p.issuer:
                problems.append(Problem(f"{at}.issuer", CODE, "must not hold a query or a fragment (OpenID Connect)"))
        if p.issuer in seen:
            problems.append(
                Problem(f"{at}.issuer", CODE, f"`{p.issuer}` is already the issuer of {base}[{seen[p.issuer]}]")
            )
        seen.setdefault(p.issuer, i)
        if not p.audiences and not p.any_audience and resource is None:
            problems.append(
                Problem(
                    f"{at}.audiences",
                    CODE,
                    "is empty: a token minted for another service would be accepted (name them, or set "
                    "`auth.resource.url`, whose tokens then are this resource's; `any_audience = true` only for an "
                    "issuer that sets no `aud`)",
                )
            )
        if not p.algorithms:
            problems.append(Problem(f"{at}.algorithms", CODE, "must not be empty"))
        for j, alg in enumerate(p.algorithms):
            if alg not in ALGORITHMS:
                problems.append(
                    Problem(f"{at}.algorithms[{j}]", CODE, f"unsupported algorithm `{alg}` ({', '.join(ALGORITHMS)})")
                )
            elif alg.startswith("HS") and not p.allow_hmac:
                problems.append(
                    Problem(
                        f"{at}.algorithms[{j}]",
                        CODE,
                        f"`{alg}` is an HMAC algorithm: set `allow_hmac = true` only if the issuer signs with a "
                        "shared secret",
                    )
                )
        if p.clock_skew_s > MAX_CLOCK_SKEW_S:
            problems.append(
                Problem(
                    f"{at}.clock_skew_s",
                    CODE,
                    f"must be at most {MAX_CLOCK_SKEW_S} (a larger leeway is a replay window)",
                )
            )
        if p.max_staleness_s > MAX_STALENESS_S:
            problems.append(Problem(f"{at}.max_staleness_s", CODE, f"must be at most {MAX_STALENESS_S}"))
        for key in ("jwks_url", "discovery_url"):
            value = getattr(p, key)
            if value is not None:
                _url(value, f"{at}.{key}", problems)
        if p.jwks is not None:
            try:
                keys = msgspec.json.decode(p.jwks)
            except msgspec.DecodeError as exc:
                problems.append(Problem(f"{at}.jwks", CODE, f"is not a JSON JWK Set: {exc}"))
            else:
                if not isinstance(keys, dict) or not isinstance(keys.get("keys"), list):
                    problems.append(Problem(f"{at}.jwks", CODE, 'must be a JWK Set: {"keys": [...]}'))
        if not p.subject_claim:
            problems.append(Problem(f"{at}.subject_claim", CODE, "must not be empty"))
        if not _HEADER.match(p.header):
            problems.append(Problem(f"{at}.header", CODE, f"`{p.header}` is not a header name"))
    return problems


def check_introspection(
    providers: list[IntrospectionProvider], base: str, environ: Mapping[str, str], resource: str | None = None
) -> list[Problem]:
    """Every problem of ``[[auth.introspection]]`` beyond its types."""
    problems: list[Problem] = []
    for i, p in enumerate(providers):
        at = f"{base}[{i}]"
        _url(p.issuer, f"{at}.issuer", problems)
        for key in ("endpoint", "metadata_url"):
            value = getattr(p, key)
            if value is not None:
                _url(value, f"{at}.{key}", problems)
        if not p.client_id.strip():
            problems.append(Problem(f"{at}.client_id", CODE, "must not be empty"))
        _secret(p.client_secret, p.client_secret_env, at, "client_secret", problems, environ, required=True)
        if not p.audiences and not p.any_audience and resource is None:
            problems.append(
                Problem(
                    f"{at}.audiences",
                    CODE,
                    "is empty: name the audiences accepted, or set `auth.resource.url` (a token is then accepted "
                    "only for this resource)",
                )
            )
        if not p.subject_claim:
            problems.append(Problem(f"{at}.subject_claim", CODE, "must not be empty"))
    return problems


def check_resource(cfg: ResourceConfig, base: str) -> list[Problem]:
    """Every problem of ``[auth.resource]`` beyond its types: URLs, and a canonical URL without a fragment."""
    problems: list[Problem] = []
    if cfg.url is not None:
        _url(cfg.url, f"{base}.url", problems)
        if "#" in cfg.url:
            problems.append(Problem(f"{base}.url", CODE, "a resource URL has no fragment (RFC 8707)"))
    for i, server in enumerate(cfg.authorization_servers or ()):
        _url(server, f"{base}.authorization_servers[{i}]", problems)
    if cfg.documentation is not None:
        _url(cfg.documentation, f"{base}.documentation", problems)
    for key, scopes in (("scopes_supported", cfg.scopes_supported), ("scopes", cfg.scopes)):
        for j, scope in enumerate(scopes or ()):
            if not _SCOPE.fullmatch(scope):
                problems.append(Problem(f"{base}.{key}[{j}]", CODE, f"`{scope}` is not an OAuth scope token"))
    return problems


_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
"""An RFC 6749 §3.3 scope token: visible ASCII but `"` and `\\`."""


def check_scopes(rules: list[ScopeRule], base: str) -> list[Problem]:
    """Every problem of ``[[auth.scopes]]`` beyond its types."""
    problems: list[Problem] = []
    for i, rule in enumerate(rules):
        at = f"{base}[{i}]"
        if not _SCOPE.fullmatch(rule.scope):
            problems.append(Problem(f"{at}.scope", CODE, f"`{rule.scope}` is not an OAuth scope token"))
        if not (rule.tools or rule.prompts or rule.resources):
            problems.append(Problem(at, CODE, "names no tools, prompts or resources (the scope would guard nothing)"))
    return problems


def check_mtls(cfg: MtlsConfig, base: str) -> list[Problem]:
    """Every problem of ``[auth.mtls]`` beyond its types."""
    problems: list[Problem] = []
    if not cfg.sources:
        problems.append(Problem(f"{base}.sources", CODE, "must not be empty"))
    for i, s in enumerate(cfg.sources):
        if not s.header.strip() or not _HEADER.match(s.header):
            problems.append(Problem(f"{base}.sources[{i}].header", CODE, f"`{s.header}` is not a header name"))
        if s.kind == "custom_header" and s.extraction_hint is None:
            problems.append(
                Problem(
                    f"{base}.sources[{i}].extraction_hint", CODE, "a custom_header source says `dn` or `fingerprint`"
                )
            )
    return problems


def check_access(cfg: AccessConfig, base: str, *, base_dir: str) -> list[Problem]:
    """Every problem of ``[access]`` beyond its types: CIDRs, globs, Cedar policies (parsed by the Cedar
    engine itself)."""
    from mcpipe.access._cedar import cedar_problems

    problems: list[Problem] = []
    names: dict[str, int] = {}
    for i, gate in enumerate(cfg.gates):
        at = f"{base}.gates[{i}]"
        if gate.name is not None:
            if gate.name in names:
                problems.append(
                    Problem(
                        f"{at}.name", CODE, f"`{gate.name}` is already the name of {base}.gates[{names[gate.name]}]"
                    )
                )
            names.setdefault(gate.name, i)
        match gate:
            case IpAllowlistGate():
                if not gate.allow:
                    problems.append(
                        Problem(
                            f"{at}.allow",
                            CODE,
                            "must list at least one network (an empty allowlist refuses every call)",
                        )
                    )
                for key, cidrs in (("allow", gate.allow), ("trusted_proxies", gate.trusted_proxies)):
                    for j, cidr in enumerate(cidrs):
                        try:
                            ipaddress.ip_network(cidr, strict=False)
                        except ValueError as exc:
                            problems.append(Problem(f"{at}.{key}[{j}]", CODE, f"not a network: {exc}"))
                if gate.ip_header is not None and not _HEADER.match(gate.ip_header):
                    problems.append(Problem(f"{at}.ip_header", CODE, f"`{gate.ip_header}` is not a header name"))
                if gate.trusted_proxies and gate.ip_header is None:
                    problems.append(
                        Problem(
                            f"{at}.trusted_proxies",
                            CODE,
                            "names proxies whose header is believed, but `ip_header` names none (the TCP peer is "
                            "judged without it)",
                        )
                    )
            case RateLimitGate():
                for j, rule in enumerate(gate.rules):
                    if not rule.tools:
                        problems.append(Problem(f"{at}.rules[{j}].tools", CODE, "must list at least one tool glob"))
            case CedarGate():
                problems.extend(cedar_problems(gate, at, base_dir=base_dir))
    return problems


def _secret(
    value: str | None,
    env: str | None,
    where: str,
    key: str,
    problems: list[Problem],
    environ: Mapping[str, str],
    *,
    required: bool,
) -> None:
    if value is not None and env is not None:
        problems.append(Problem(f"{where}.{key}", CODE, f"set `{key}` or `{key}_env`, not both"))
    elif env is not None and not environ.get(env):
        problems.append(Problem(f"{where}.{key}_env", UNSET_ENV, f"environment variable `{env}` is not set or empty"))
    elif required and env is None and not value:
        problems.append(
            Problem(f"{where}.{key}", CODE, f"is required (or name it by environment variable with `{key}_env`)")
        )


def check_credentials(creds: Mapping[str, CredentialConfig], base: str, environ: Mapping[str, str]) -> list[Problem]:
    """Every problem of ``[credentials.NAME]`` beyond its types."""
    problems: list[Problem] = []
    for name, c in creds.items():
        at = f"{base}.{name}"
        if not name:
            problems.append(Problem(base, CODE, "a credential needs a name"))
        match c:
            case ClientCredentials():
                _url(c.token_url, f"{at}.token_url", problems)
                if not c.client_id.strip():
                    problems.append(Problem(f"{at}.client_id", CODE, "must not be empty"))
                _secret(c.client_secret, c.client_secret_env, at, "client_secret", problems, environ, required=True)
            case TokenExchange():
                _url(c.token_url, f"{at}.token_url", problems)
                if not c.client_id.strip():
                    problems.append(Problem(f"{at}.client_id", CODE, "must not be empty"))
                _secret(c.client_secret, c.client_secret_env, at, "client_secret", problems, environ, required=False)
            case IdJag():
                _url(c.idp_token_url, f"{at}.idp_token_url", problems)
                _url(c.redeem_token_url, f"{at}.redeem_token_url", problems)
                if not c.client_id.strip():
                    problems.append(Problem(f"{at}.client_id", CODE, "must not be empty"))
                if not c.audience.strip():
                    problems.append(
                        Problem(f"{at}.audience", CODE, "must not be empty (the upstream authorization server)")
                    )
                _secret(c.client_secret, c.client_secret_env, at, "client_secret", problems, environ, required=False)
                _secret(
                    c.redeem_client_secret,
                    c.redeem_client_secret_env,
                    at,
                    "redeem_client_secret",
                    problems,
                    environ,
                    required=False,
                )
                if (c.redeem_client_secret or c.redeem_client_secret_env) and not c.redeem_client_id:
                    problems.append(Problem(f"{at}.redeem_client_secret", CODE, "needs `redeem_client_id`"))
            case EnvCredential():
                if not environ.get(c.env):
                    problems.append(
                        Problem(f"{at}.env", UNSET_ENV, f"environment variable `{c.env}` is not set or empty")
                    )
    return problems
