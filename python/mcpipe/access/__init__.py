"""Access control and outbound credentials (``docs/access.md``).

- who is calling: :class:`Authenticator` (bearer tokens, JWTs of OIDC issuers, client certificates
  forwarded by a proxy) resolves an :class:`~mcpipe.tools.Identity` at the HTTP front, and
  :class:`Principal` names it in its source (``oidc:<issuer>#alice``: what runs, quotas, sessions, rate
  limits, Cedar and audit key on);
- what a call may do: :class:`Gates` (Cedar policies, rate limits, client-address allowlists), run by the
  gateway before every tool call;
- what mcpipe presents upstream: :class:`Credentials` (OAuth client credentials, token exchange, ID-JAG,
  secrets from the environment), used by ``http`` steps and downstream servers.
"""

from typing import TYPE_CHECKING

from mcpipe._lazy import lazy_names

if TYPE_CHECKING:
    from mcpipe.access._config import (
        AccessConfig,
        CedarGate,
        ClientCredentials,
        CredentialConfig,
        EnvCredential,
        IdJag,
        IntrospectionProvider,
        IpAllowlistGate,
        MtlsConfig,
        OidcProvider,
        RateLimitGate,
        ResourceConfig,
        ScopeRule,
        TokenExchange,
        check_access,
        check_credentials,
        check_introspection,
        check_mtls,
        check_oidc,
        check_resource,
        check_scopes,
    )
    from mcpipe.access._credentials import CredentialError, Credentials, Issued
    from mcpipe.access._fetch import FetchError, fetch
    from mcpipe.access._gates import GateDenied, GateRefusal, Gates, build_gates, client_ip
    from mcpipe.access._identity import Authenticator, Rejected
    from mcpipe.access._principal import Principal, oauth_bearer, principal_key, reserved_prefix
    from mcpipe.access._scopes import INSUFFICIENT_SCOPE, Scopes, missing_scopes, scope_message

# Loaded on first use: a step kind's policy holds Credentials (whose module is all it loads), and a command that
# serves nothing needs none of the gates (Cedar), the authenticator (JWTs, introspection) or the config checks.
__getattr__ = lazy_names(
    __name__,
    {
        **dict.fromkeys(
            [
                "AccessConfig",
                "CedarGate",
                "ClientCredentials",
                "CredentialConfig",
                "EnvCredential",
                "IdJag",
                "IntrospectionProvider",
                "IpAllowlistGate",
                "MtlsConfig",
                "OidcProvider",
                "RateLimitGate",
                "ResourceConfig",
                "ScopeRule",
                "TokenExchange",
                "check_access",
                "check_credentials",
                "check_introspection",
                "check_mtls",
                "check_oidc",
                "check_resource",
                "check_scopes",
            ],
            "._config",
        ),
        **dict.fromkeys(["CredentialError", "Credentials", "Issued"], "._credentials"),
        **dict.fromkeys(["FetchError", "fetch"], "._fetch"),
        **dict.fromkeys(["GateDenied", "GateRefusal", "Gates", "build_gates", "client_ip"], "._gates"),
        **dict.fromkeys(["Authenticator", "Rejected"], "._identity"),
        **dict.fromkeys(["Principal", "oauth_bearer", "principal_key", "reserved_prefix"], "._principal"),
        **dict.fromkeys(["INSUFFICIENT_SCOPE", "Scopes", "missing_scopes", "scope_message"], "._scopes"),
    },
)

__all__ = [
    "INSUFFICIENT_SCOPE",
    "AccessConfig",
    "Authenticator",
    "CedarGate",
    "ClientCredentials",
    "CredentialConfig",
    "CredentialError",
    "Credentials",
    "EnvCredential",
    "FetchError",
    "GateDenied",
    "GateRefusal",
    "Gates",
    "IdJag",
    "IntrospectionProvider",
    "IpAllowlistGate",
    "Issued",
    "MtlsConfig",
    "OidcProvider",
    "Principal",
    "RateLimitGate",
    "Rejected",
    "ResourceConfig",
    "ScopeRule",
    "Scopes",
    "TokenExchange",
    "build_gates",
    "check_access",
    "check_credentials",
    "check_introspection",
    "check_mtls",
    "check_oidc",
    "check_resource",
    "check_scopes",
    "client_ip",
    "fetch",
    "missing_scopes",
    "oauth_bearer",
    "principal_key",
    "reserved_prefix",
    "scope_message",
]
