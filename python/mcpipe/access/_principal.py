"""Who a call is for: the principal, namespaced by the identity source that established it (``docs/access.md``).

One subject may come from several sources: the static token an operator named ``alice``, a JWT whose ``sub``
is ``alice`` from one issuer or another, a client certificate whose CN is ``alice``, a proxy's subject header
saying ``alice``. They are different callers, so the principal (what owns runs, what quotas, sessions and
rate limits count, what Cedar policies and audit records name) is the subject *in its source*:

- a token of ``[[auth.tokens]]`` with ``principal = "alice"``: ``alice`` (the name the operator wrote);
- a JWT of the issuer ``https://idp.example``: ``oidc:https://idp.example#alice``;
- a client certificate a proxy forwarded: ``mtls:alice``;
- the trusted subject header (``trust.subject_header``): ``header:alice``.

A token's principal stays the bare name, so what operators write in config keeps naming it (``tools``
grants, Cedar's ``User::"alice"``); every other source has its prefix, which no token principal may take
(:func:`reserved_prefix`). An issuer holds no ``#`` (OpenID Connect forbids a fragment), so the first ``#``
after ``oidc:`` ends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcpipe.tools import Identity

__all__ = ["OAUTH_SOURCES", "SOURCES", "Principal", "oauth_bearer", "principal_key", "reserved_prefix"]

SOURCES = ("oidc", "introspection", "mtls", "header")
"""The identity sources whose principals carry a prefix (``<source>:``); a token's has none."""

OAUTH_SOURCES = frozenset({"oidc", "introspection"})
"""The identity sources whose bearer is an OAuth access token verified for this resource."""


def oauth_bearer(identity: object) -> bool:
    """Whether the caller presented an OAuth access token: a JWT an ``[[auth.oidc]]`` issuer signed, or a token
    an ``[[auth.introspection]]`` endpoint vouched for. Such a token was minted for mcpipe (its audience is
    this resource), so it is never sent on to another server (``forward_bearer``): the MCP authorization spec
    forbids token passthrough, whether or not ``[auth.resource]`` is set. A static token of ``[[auth.tokens]]``
    is the operator's shared secret, not an OAuth token: it may be forwarded."""
    return getattr(identity, "provider", None) in OAUTH_SOURCES and bool(getattr(identity, "token", None))


@dataclass(frozen=True, slots=True)
class Principal:
    """A subject in the namespace of the source that established it.

    Attributes:
        source: ``token``, ``oidc``, ``introspection``, ``mtls``, ``header`` (an
            :class:`~mcpipe.tools.Identity`'s ``provider``).
        subject: the subject in that source.
        issuer: the issuer that vouches for it (a JWT's ``iss``), when there is one.
    """

    source: str
    subject: str
    issuer: str | None = None

    @classmethod
    def of(cls, identity: Identity) -> Principal:
        """The principal of a resolved identity."""
        return cls(identity.provider, identity.subject, identity.issuer)

    @property
    def key(self) -> str:
        """The principal as one string: what runs, quotas, sessions, rate limits, Cedar and audit carry."""
        if self.source == "token":
            return self.subject
        if self.source == "introspection" and self.issuer:
            # An opaque token its issuer vouched for by introspection names the same user as that issuer's JWT:
            # the issuer is the namespace, not how the token was checked.
            return f"oidc:{self.issuer}#{self.subject}"
        if self.issuer:
            return f"{self.source}:{self.issuer}#{self.subject}"
        return f"{self.source}:{self.subject}"

    @classmethod
    def parse(cls, key: str) -> Principal:
        """The principal a :attr:`key` names (a key without a known prefix is a token's)."""
        source, sep, rest = key.partition(":")
        if not sep or source not in SOURCES:
            return cls("token", key)
        if source == "oidc":
            issuer, hash_, subject = rest.partition("#")
            if hash_:
                return cls(source, subject, issuer)
        return cls(source, rest)

    def __str__(self) -> str:
        return self.key


def principal_key(identity: Identity) -> str:
    """The principal of ``identity``, as one string (:attr:`Principal.key`)."""
    return Principal.of(identity).key


def reserved_prefix(name: str) -> str | None:
    """The source prefix a would-be token principal starts with (``oidc:``...), or None: a token principal
    taking one could pass for another source's caller."""
    for source in SOURCES:
        if name.startswith(f"{source}:"):
            return f"{source}:"
    return None
