"""Reading an identity out of claims: a verified JWT's (``[[auth.oidc]]``) or an introspection answer's
(``[[auth.introspection]]``), both configured with the same ``subject_claim``, ``*_claims`` and
``attributes``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcpipe.access._config import IntrospectionProvider, OidcProvider
from mcpipe.tools import Identity

__all__ = ["claim", "claim_strings", "identity_from_claims"]


def claim(claims: object, path: str) -> Any:
    """A claim by dotted path (``realm_access.roles``); None when absent."""
    value = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def claim_strings(claims: object, paths: Sequence[str], limit: int | None = None) -> tuple[str, ...]:
    """Every string the claims at ``paths`` hold: arrays of strings, or space-separated strings (scopes);
    the first ``limit`` of them when one is given."""
    out: list[str] = []
    for path in paths:
        value = claim(claims, path)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, str))
        elif isinstance(value, str):
            out.extend(value.split())
        if limit is not None and len(out) >= limit:
            return tuple(out[:limit])
    return tuple(out)


def identity_from_claims(
    claims: Mapping[str, object],
    cfg: OidcProvider | IntrospectionProvider,
    *,
    provider: str,
    token: str,
    kept: Mapping[str, object],
    limit: int | None = None,
) -> Identity | None:
    """The verified identity ``claims`` name under ``cfg``, or None when they lack a non-empty subject.

    Args:
        claims: the verified claims (a JWT's payload, an introspection answer).
        cfg: the provider, which says where the subject, roles, groups, scopes and attributes are.
        provider: the identity's ``provider`` (``oidc``, ``introspection``).
        token: the bearer, kept on the identity for passing downstream.
        kept: the claims the identity carries.
        limit: the most roles, groups or scopes taken from each set of claims (None: all).
    """
    subject = claim(claims, cfg.subject_claim)
    if not isinstance(subject, str) or not subject.strip():
        return None
    attributes = {}
    for path, name in cfg.attributes.items():
        value = claim(claims, path)
        if isinstance(value, str):
            attributes[name] = value
    return Identity(
        subject=subject,
        trust="verified",
        provider=provider,
        issuer=cfg.issuer,
        roles=claim_strings(claims, cfg.role_claims, limit),
        groups=claim_strings(claims, cfg.group_claims, limit),
        scopes=claim_strings(claims, cfg.scope_claims, limit),
        attributes=attributes,
        claims=kept,
        token=token,
    )
