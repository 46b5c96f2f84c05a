"""Who may call what, by how far the caller's identity is established: the ``trust`` section (mcpg's trust
levels, ``docs/formats/mcpg.md``).

A caller is ``verified`` (a credential the server checked: a bearer token, a verified JWT), ``header_asserted``
(no credential, but an identity a trusted proxy set in a header) or ``unauthenticated`` (no identity). Each
tool, prompt or resource needs a level (its rule's ``minimum_trust``, else ``trust.default_minimum_trust``);
the caller's scopes must cover its rule's ``required_scopes``; the global ``allow_if`` and then the rule's own
(CEL over the caller) must hold. The first check that fails refuses the call with mcpg's JSON-RPC error
(:class:`TrustDenied`: code and message), in mcpg's order (``runtime/policy.rs``).

The caller's identity is ``ctx.identity`` (:class:`mcpipe.tools.Identity`: a bearer token, a verified JWT,
a forwarded client certificate, or the subject header the operator trusts, ``trust.subject_header``); a call
with none is ``unauthenticated``.
"""

from __future__ import annotations

from mcpipe.config import TRUST_ROOTS, TrustConfig, TrustRule
from mcpipe.errors import ErrorCode, MCPipeError
from mcpipe.expr import CelExpr, ExpressionError
from mcpipe.tools import ToolContext

__all__ = ["TRUST_LEVELS", "Trust", "TrustDenied", "trust_of"]

TRUST_LEVELS = ("unauthenticated", "header_asserted", "verified")
_RANK = {name: i for i, name in enumerate(TRUST_LEVELS)}
_DEBUG_NAMES = {"unauthenticated": "Unauthenticated", "header_asserted": "HeaderAsserted", "verified": "Verified"}

TRUST_DENIED = -32003
ALLOW_IF_DENIED = -32022
RULE_ALLOW_IF_DENIED = -32005
POLICY_FAILED = -32603


class TrustDenied(MCPipeError):
    """A call the trust rules refuse: the JSON-RPC error code and message to answer with."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, rpc_code: int, message: str) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code


def trust_of(ctx: ToolContext) -> str:
    """The caller's trust level."""
    identity = ctx.identity
    if identity is not None:
        level = getattr(identity, "trust", None)
        return level if level in _RANK else "unauthenticated"
    return "unauthenticated"


class _Rule:
    __slots__ = ("allow_if", "minimum_trust", "required_scopes")

    def __init__(self, minimum_trust: str, allow_if: CelExpr | None, required_scopes: tuple[str, ...]) -> None:
        self.minimum_trust = minimum_trust
        self.allow_if = allow_if
        self.required_scopes = required_scopes


class Trust:
    """The compiled ``trust`` section."""

    def __init__(self, config: TrustConfig) -> None:
        self.subject_header = config.subject_header.lower() if config.subject_header else None
        self.default_minimum_trust = config.default_minimum_trust
        self.allow_if = _compile(config.allow_if)
        self.rules = {
            name: _Rule(
                rule.minimum_trust or config.default_minimum_trust,
                _compile(rule.allow_if),
                tuple(rule.required_scopes),
            )
            for name, rule in config.tools.items()
        }

        self.patterns = sorted(
            ((name[:-1], rule) for name, rule in self.rules.items() if name.endswith("*")),
            key=lambda p: len(p[0]),
            reverse=True,
        )
        """``prefix*`` rules, longest prefix first."""

    def set_rule(self, name: str, rule: TrustRule) -> None:
        """Add (or replace) the rule of ``name`` (a ``prefix*`` pattern too): a registry's server."""
        self.rules[name] = _Rule(
            rule.minimum_trust or self.default_minimum_trust, _compile(rule.allow_if), tuple(rule.required_scopes)
        )
        self._index()

    def drop_rule(self, name: str) -> None:
        """Remove the rule of ``name``."""
        if self.rules.pop(name, None) is not None:
            self._index()

    def _index(self) -> None:
        self.patterns = sorted(
            ((n[:-1], r) for n, r in self.rules.items() if n.endswith("*")), key=lambda p: len(p[0]), reverse=True
        )

    def rule(self, name: str) -> _Rule | None:
        """The rule of ``name``: its own, else the longest ``prefix*`` it begins with, else None."""
        rule = self.rules.get(name)
        if rule is not None:
            return rule
        return next((r for prefix, r in self.patterns if name.startswith(prefix)), None)

    def required_trust(self, name: str) -> str:
        rule = self.rule(name)
        return rule.minimum_trust if rule is not None else self.default_minimum_trust

    def visible(self, name: str, ctx: ToolContext) -> bool:
        """Whether the caller may see ``name`` listed (it could call it)."""
        try:
            self.check(name, ctx)
        except TrustDenied:
            return False
        return True

    def check(self, name: str, ctx: ToolContext) -> None:
        """Refuse a call of ``name`` the caller may not make.

        Raises:
            TrustDenied: the caller's trust is too low, a scope is missing, or an ``allow_if`` does not hold
                (or fails to evaluate).
        """
        trust = trust_of(ctx)
        need = self.required_trust(name)
        if _RANK[trust] < _RANK[need]:
            raise TrustDenied(
                TRUST_DENIED,
                f"tool {name} requires trust level {_DEBUG_NAMES[need]}, current trust is {_DEBUG_NAMES[trust]}",
            )
        identity = ctx.identity
        rule = self.rule(name)
        if rule is not None and rule.required_scopes:
            have = set(getattr(identity, "scopes", ()) or ())
            missing = [s for s in rule.required_scopes if s not in have]
            if missing:
                raise TrustDenied(
                    TRUST_DENIED,
                    f"tool {name} requires OAuth scope(s) {' '.join(missing)} not present on the caller's credential",
                )
        if self.allow_if is not None and not _holds(self.allow_if, name, ctx, trust):
            raise TrustDenied(ALLOW_IF_DENIED, f"tool {name} was denied by CEL allow_if policy")
        if rule is not None and rule.allow_if is not None and not _holds(rule.allow_if, name, ctx, trust):
            raise TrustDenied(RULE_ALLOW_IF_DENIED, f"tool {name} was denied by per-tool CEL allow_if policy")


def _compile(source: str | None) -> CelExpr | None:
    return None if source is None else CelExpr.compile(source, extra_roots=TRUST_ROOTS)


def _holds(expr: CelExpr, name: str, ctx: ToolContext, trust: str) -> bool:
    identity = ctx.identity
    subject = getattr(identity, "subject", None) if identity is not None else ctx.principal
    provider = getattr(identity, "provider", None)
    kind = "anonymous" if trust == "unauthenticated" else ("http_header" if trust == "header_asserted" else "verified")
    env = {
        "tool_name": name,
        "trust_level": trust,
        "principal_id": subject,
        "auth_provider": provider,
        "identity_kind": kind,
        "identity": {
            "kind": kind,
            "trust_level": trust,
            "subject_id": subject,
            "auth_provider": provider,
            "issuer": getattr(identity, "issuer", None),
            "roles": list(getattr(identity, "roles", ()) or ()),
            "groups": list(getattr(identity, "groups", ()) or ()),
            "scopes": list(getattr(identity, "scopes", ()) or ()),
            "attributes": dict(getattr(identity, "attributes", {}) or {}),
        },
    }
    try:
        verdict = expr.evaluate(env)
    except ExpressionError:
        raise TrustDenied(POLICY_FAILED, "tool access policy evaluation failed") from None
    if not isinstance(verdict, bool):
        raise TrustDenied(POLICY_FAILED, "tool access policy evaluation failed")
    return verdict
