"""Who is calling: the identity the HTTP front resolved for a request (``docs/access.md``).

A bearer token of ``[auth] tokens``, a JWT verified against an OIDC issuer (``[[auth.oidc]]``), or the
client certificate a TLS-terminating proxy forwarded (``[auth.mtls]``) each resolve to one
:class:`Identity`. Its ``subject`` is the call's principal; the rest is what policies (Cedar), rate limits,
audit records and outbound credentials (token exchange) read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Identity", "TrustLevel"]

TrustLevel = Literal["verified", "header_asserted"]
"""How far the identity can be trusted: ``verified`` (a secret or a signature was checked), or
``header_asserted`` (a header set by a proxy mcpipe trusts, such as a forwarded client certificate)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The caller of one request, as the HTTP front resolved it.

    Attributes:
        subject: the principal (a token's configured principal, a JWT's subject claim, a certificate's CN).
        trust: how it was established.
        provider: what established it: ``token``, ``oidc`` or ``mtls``.
        issuer: the JWT issuer, when there is one.
        roles, groups, scopes: what the claim mappings extracted.
        attributes: mapped claims (``{"tenant": "acme"}``).
        claims: every claim of a verified JWT (empty otherwise).
        token: the bearer the caller presented (OAuth token exchange sends it on); never logged or shown.
    """

    subject: str
    trust: TrustLevel = "verified"
    provider: str = "token"
    issuer: str | None = None
    roles: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)
    claims: Mapping[str, Any] = field(default_factory=dict, repr=False)
    token: str | None = field(default=None, repr=False)

    def facts(self) -> dict[str, Any]:
        """What pipelines see as ``context.identity`` (never the token)."""
        return {
            "subject_id": self.subject,
            "trust_level": self.trust,
            "auth_provider": self.provider,
            "issuer": self.issuer,
            "roles": list(self.roles),
            "groups": list(self.groups),
            "scopes": list(self.scopes),
            "attributes": dict(self.attributes),
        }
