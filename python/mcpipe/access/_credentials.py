"""Outbound credentials (``[credentials.NAME]``): the tokens ``http`` steps and downstream servers present.

- ``client_credentials`` (RFC 6749 §4.4): one machine token for every caller, cached until
  ``refresh_buffer_ms`` before it expires, one refresh at a time; when a refresh fails, the old token is
  served until five minutes past its expiry (mcpg's grace).
- ``token_exchange`` (RFC 8693): the caller's own bearer (a verified identity's) exchanged for a token the
  upstream takes; per caller, cached until it expires.
- ``id_jag``: Cross-App Access: the caller's bearer exchanged at the IdP for an ID-JAG
  (``requested_token_type=urn:ietf:params:oauth:token-type:id-jag``, which the answer's ``issued_token_type``
  must be), then redeemed at the upstream's authorization server as a JWT bearer grant (RFC 7523).
- ``env``: a static secret from the environment.

Every request is a form POST with the client's id and secret in the body, as mcpg's issuers send them.
Tokens are never logged, and a refusal keeps only the endpoint's RFC 6749 ``error`` code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

from mcpipe.access._config import ClientCredentials, CredentialConfig, EnvCredential, IdJag, TokenExchange
from mcpipe.access._fetch import FetchError, post_form
from mcpipe.errors import ErrorCode, MCPipeError
from mcpipe.tools import Identity

__all__ = ["CredentialError", "Credentials", "Issued"]

_log = logging.getLogger("mcpipe.access.credentials")

STALE_GRACE_S = 300.0
GRANT_CLIENT_CREDENTIALS = "client_credentials"
GRANT_TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
GRANT_JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_TYPE_ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"
DEFAULT_EXPIRES_S = 3600
MAX_PER_CALLER = 10_000
"""The most per-caller tokens a ``token_exchange``/``id_jag`` credential keeps (least recently used go)."""


class CredentialError(MCPipeError):
    """A credential could not be issued (the step or downstream call fails with ``TOOL_FAILED``)."""

    code: str = ErrorCode.TOOL_FAILED


@dataclass(frozen=True, slots=True)
class Issued:
    """A token and its type (``Bearer``); ``expires_at`` on the issuer's clock."""

    token: str = ""
    token_type: str = "Bearer"
    expires_at: float = float("inf")

    def __repr__(self) -> str:
        return f"Issued(token=***, token_type={self.token_type!r})"

    def authorization(self) -> str:
        """The ``Authorization`` header value (``Bearer <token>``)."""
        kind = "Bearer" if self.token_type.lower() == "bearer" else self.token_type
        return f"{kind} {self.token}"


def _secret(value: str | None, env: str | None) -> str | None:
    if env is not None:
        return os.environ.get(env) or None
    return value or None


_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")
"""What a token (and its type) may hold to be sent in a header: visible ASCII (RFC 6750's b64token is a
subset). A token endpoint's `tok€n` was cached for its hour and failed every call with a traceback (httpx
encodes header values as ASCII), one with CR LF would have written a header of its own."""


def _token(doc: Mapping[str, object], now: float, what: str) -> Issued:
    token = doc.get("access_token")
    if not isinstance(token, str) or not token:
        raise CredentialError(f"{what} answered no `access_token`")
    if not _HEADER_SAFE.fullmatch(token):
        raise CredentialError(f"{what} answered an `access_token` that is not visible ASCII (it cannot be sent)")
    kind = doc.get("token_type")
    if isinstance(kind, str) and kind and not _HEADER_SAFE.fullmatch(kind):
        raise CredentialError(f"{what} answered a `token_type` that is not visible ASCII (it cannot be sent)")
    expires = doc.get("expires_in")
    seconds = (
        float(expires) if isinstance(expires, (int, float)) and not isinstance(expires, bool) else DEFAULT_EXPIRES_S
    )
    return Issued(token, kind if isinstance(kind, str) and kind else "Bearer", now + seconds)


class _Issuer:
    name: str
    per_caller: bool = False

    async def issue(self, identity: Identity | None) -> Issued:
        raise NotImplementedError


class _Env(_Issuer):
    def __init__(self, name: str, cfg: EnvCredential) -> None:
        self.name = name
        self.value = os.environ.get(cfg.env, "")

    async def issue(self, identity: Identity | None) -> Issued:
        if not self.value:
            raise CredentialError(f"credential `{self.name}`: its environment variable is not set")
        return Issued(self.value, "Bearer")


class _ClientCredentials(_Issuer):
    def __init__(self, name: str, cfg: ClientCredentials, clock: Callable[[], float]) -> None:
        self.name, self.cfg, self.clock = name, cfg, clock
        self.cached: Issued | None = None
        self._lock = trio.Lock()
        self._attempts = 0
        self._outcome: Issued | CredentialError | None = None

    def _fresh(self) -> Issued | None:
        c = self.cached
        if c is not None and self.clock() < c.expires_at - self.cfg.refresh_buffer_ms / 1000:
            return c
        return None

    async def issue(self, identity: Identity | None) -> Issued:
        fresh = self._fresh()
        if fresh is not None:
            return fresh
        seen = self._attempts
        async with self._lock:  # one refresh at a time; the others wait for it and share its outcome
            fresh = self._fresh()
            if fresh is not None:
                return fresh
            if self._attempts != seen and self._outcome is not None:
                # Refreshed while this caller waited: its token (even one the endpoint says expires at once)
                # or its failure, instead of one more request each (a hanging endpoint held every caller
                # in line, timeout_ms each).
                if isinstance(self._outcome, CredentialError):
                    raise CredentialError(str(self._outcome))  # a new one: a raised one keeps its traceback
                return self._outcome
            self._outcome = await self._refresh()
            self._attempts += 1  # counted once done: a caller that came while it ran shares its outcome
            if isinstance(self._outcome, CredentialError):
                raise CredentialError(str(self._outcome))
            return self._outcome

    async def _refresh(self) -> Issued | CredentialError:
        """One request to the token endpoint: the token (kept in ``cached``), the previous token while its
        grace lasts, or the failure."""
        cfg = self.cfg
        form = {
            "grant_type": GRANT_CLIENT_CREDENTIALS,
            "client_id": cfg.client_id,
            "client_secret": _secret(cfg.client_secret, cfg.client_secret_env) or "",
        }
        if cfg.scopes:
            form["scope"] = " ".join(cfg.scopes)
        try:
            doc = await post_form(
                cfg.token_url,
                form,
                timeout_ms=cfg.timeout_ms,
                allow_private=cfg.allow_private,
                what="the token endpoint",
            )
            self.cached = _token(doc, self.clock(), "the token endpoint")
        except (FetchError, CredentialError) as exc:
            old = self.cached
            if old is not None and self.clock() < old.expires_at + STALE_GRACE_S:
                _log.warning("credential %s: refresh failed (%s); serving the previous token", self.name, exc)
                return old
            return CredentialError(f"credential `{self.name}`: {exc}")
        return self.cached


class _PerCaller(_Issuer):
    per_caller = True

    def __init__(self, name: str, clock: Callable[[], float]) -> None:
        self.name, self.clock = name, clock
        self.cache: OrderedDict[bytes, Issued] = OrderedDict()

    def _subject_token(self, identity: Identity | None) -> str:
        if identity is None or identity.trust != "verified":
            trust = "no identity" if identity is None else f"a {identity.trust} identity"
            raise CredentialError(
                f"credential `{self.name}` acts on behalf of the caller: it needs a verified caller, not {trust}"
            )
        if not identity.token:
            raise CredentialError(
                f"credential `{self.name}` needs the caller's bearer token, and the caller presented none"
            )
        return identity.token

    async def issue(self, identity: Identity | None) -> Issued:
        subject = self._subject_token(identity)
        key = hashlib.sha256(subject.encode()).digest()
        cached = self.cache.get(key)
        if cached is not None and self.clock() < cached.expires_at:
            self.cache.move_to_end(key)
            return cached
        try:
            issued = await self._exchange(subject)
        except FetchError as exc:
            raise CredentialError(f"credential `{self.name}`: {exc}") from None
        self.cache[key] = issued
        while len(self.cache) > MAX_PER_CALLER:
            self.cache.popitem(last=False)
        return issued

    async def _exchange(self, subject: str) -> Issued:
        raise NotImplementedError


class _TokenExchange(_PerCaller):
    def __init__(self, name: str, cfg: TokenExchange, clock: Callable[[], float]) -> None:
        super().__init__(name, clock)
        self.cfg = cfg

    async def _exchange(self, subject: str) -> Issued:
        cfg = self.cfg
        form = {
            "grant_type": GRANT_TOKEN_EXCHANGE,
            "subject_token": subject,
            "subject_token_type": cfg.subject_token_type,
            "requested_token_type": cfg.requested_token_type,
            "client_id": cfg.client_id,
        }
        secret = _secret(cfg.client_secret, cfg.client_secret_env)
        if secret:
            form["client_secret"] = secret
        if cfg.scopes:
            form["scope"] = " ".join(cfg.scopes)
        if cfg.audience:
            form["audience"] = cfg.audience
        if cfg.resource:
            form["resource"] = cfg.resource
        doc = await post_form(
            cfg.token_url,
            form,
            timeout_ms=cfg.timeout_ms,
            allow_private=cfg.allow_private,
            what="the token-exchange endpoint",
        )
        return _token(doc, self.clock(), "the token-exchange endpoint")


class _IdJag(_PerCaller):
    def __init__(self, name: str, cfg: IdJag, clock: Callable[[], float]) -> None:
        super().__init__(name, clock)
        self.cfg = cfg

    async def _exchange(self, subject: str) -> Issued:
        cfg = self.cfg
        form = {
            "grant_type": GRANT_TOKEN_EXCHANGE,
            "requested_token_type": TOKEN_TYPE_ID_JAG,
            "audience": cfg.audience,
            "subject_token": subject,
            "subject_token_type": cfg.subject_token_type,
            "client_id": cfg.client_id,
        }
        secret = _secret(cfg.client_secret, cfg.client_secret_env)
        if secret:
            form["client_secret"] = secret
        if cfg.scopes:
            form["scope"] = " ".join(cfg.scopes)
        if cfg.resource:
            form["resource"] = cfg.resource
        grant = await post_form(
            cfg.idp_token_url,
            form,
            timeout_ms=cfg.timeout_ms,
            allow_private=cfg.allow_private,
            what="the IdP (ID-JAG exchange)",
        )
        if grant.get("issued_token_type") != TOKEN_TYPE_ID_JAG:
            raise CredentialError(
                f"credential `{self.name}`: the IdP did not issue an ID-JAG (issued_token_type != {TOKEN_TYPE_ID_JAG})"
            )
        assertion = grant.get("access_token")
        if not isinstance(assertion, str) or not assertion:
            raise CredentialError(f"credential `{self.name}`: the IdP answered no assertion")
        redeem = {"grant_type": GRANT_JWT_BEARER, "assertion": assertion}
        if cfg.redeem_client_id:
            redeem["client_id"] = cfg.redeem_client_id
        redeem_secret = _secret(cfg.redeem_client_secret, cfg.redeem_client_secret_env)
        if redeem_secret:
            redeem["client_secret"] = redeem_secret
        doc = await post_form(
            cfg.redeem_token_url,
            redeem,
            timeout_ms=cfg.timeout_ms,
            allow_private=cfg.allow_private,
            what="the upstream authorization server (ID-JAG redeem)",
        )
        return _token(doc, self.clock(), "the upstream authorization server")


class Credentials:
    """The named outbound credentials of ``[credentials]`` (their config checked already)."""

    def __init__(
        self, configs: Mapping[str, CredentialConfig] | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._issuers: dict[str, _Issuer] = {}
        self.configs: dict[str, CredentialConfig] = {}
        """Each credential's config, by name."""
        self._clock = clock
        for name, cfg in (configs or {}).items():
            self.add(name, cfg)

    def add(self, name: str, cfg: CredentialConfig) -> None:
        """Make credential ``name`` issue as ``cfg`` says (one a registry's server needs: ``mcpipe.server``)."""
        clock = self._clock
        self.configs[name] = cfg
        match cfg:
            case ClientCredentials():
                self._issuers[name] = _ClientCredentials(name, cfg, clock)
            case TokenExchange():
                self._issuers[name] = _TokenExchange(name, cfg, clock)
            case IdJag():
                self._issuers[name] = _IdJag(name, cfg, clock)
            case EnvCredential():
                self._issuers[name] = _Env(name, cfg)

    def __contains__(self, name: object) -> bool:
        return name in self._issuers

    def __bool__(self) -> bool:
        return bool(self._issuers)

    def per_caller(self, name: str) -> bool:
        """Whether the credential is minted per caller (it needs the caller's verified identity)."""
        return self._issuers[name].per_caller

    async def issue(self, name: str, identity: Identity | None) -> Issued:
        """The token of credential ``name`` for the caller ``identity``.

        Raises:
            CredentialError: it is unknown, or could not be issued (the reason carries no secret).
        """
        issuer = self._issuers.get(name)
        if issuer is None:
            raise CredentialError(f"no credential `{name}`")
        return await issuer.issue(identity)
