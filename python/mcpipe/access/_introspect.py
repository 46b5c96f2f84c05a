"""Opaque access tokens, checked by RFC 7662 introspection (``[[auth.introspection]]``).

A bearer that no ``[[auth.oidc]]`` issuer verifies is posted to the authorization server's introspection
endpoint (``token=...``, the client authenticated by HTTP Basic or in the body). An ``active`` answer whose
``aud`` names an accepted audience (this resource, RFC 8707), whose ``exp`` is ahead and whose ``iss`` (when
given) is the issuer identifies the caller; anything else is refused.

Bounds, so that neither a hostile caller nor a hostile endpoint can hold mcpipe:

- an answer is cached no longer than the token lives (``exp``) nor than ``cache_s``; at most
  ``max_per_principal`` tokens of one principal and ``max_cached`` in all (least recently used go first), so
  a principal minting tokens cannot fill the cache for the others;
- a refusal is remembered for :data:`NEGATIVE_TTL_S` (at most :data:`MAX_NEGATIVE` of them), so one bad token
  sent again and again costs one request;
- callers presenting the same unknown token share one request (its outcome too);
- at most ``max_in_flight`` requests run at once: a token arriving past that is answered 503 at once, not
  queued behind an endpoint that hangs; each request is bounded by ``timeout_ms`` and its answer by 1 MB.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from urllib.parse import quote

import trio

from mcpipe.access._claims import identity_from_claims
from mcpipe.access._config import IntrospectionProvider
from mcpipe.access._fetch import FetchError, get_json, post_form
from mcpipe.tools import Identity

__all__ = ["MAX_NEGATIVE", "NEGATIVE_TTL_S", "Introspection", "Outcome", "Unavailable"]

_log = logging.getLogger("mcpipe.access")

NEGATIVE_TTL_S = 30.0
"""How long a refused token is answered from memory (an authorization server does not revive tokens)."""
MAX_NEGATIVE = 10_000
"""The most refused tokens remembered."""
MAX_LISTED = 256
"""The most scopes, roles or groups one answer gives an identity (an endpoint answering a million scopes
must not make every call of that caller scan them)."""


class Unavailable:
    """The token could not be checked now (the endpoint is busy, down or slow): answered 503, never cached."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


Outcome = Identity | str | Unavailable
"""An identity, a refusal (its reason), or :class:`Unavailable`."""


class _Pending:
    """One introspection request callers of the same token wait for."""

    __slots__ = ("done", "outcome")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.outcome: Outcome = Unavailable("the token's introspection was cancelled")


class Introspection:
    """One authorization server's introspection, with its bounded cache.

    Args:
        cfg: the provider.
        audiences: the audiences accepted (its own, else this resource's URL).
        secret: the client secret (read when the config was loaded).
        clock: monotonic seconds (tests pass their own).
        wall: Unix seconds, what ``exp`` is compared with.
    """

    def __init__(
        self,
        cfg: IntrospectionProvider,
        audiences: list[str],
        secret: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.audiences = frozenset(audiences)
        self.secret = secret
        self.clock, self.wall = clock, wall
        self._cache: OrderedDict[bytes, tuple[Identity, float]] = OrderedDict()
        self._by_principal: dict[str, OrderedDict[bytes, None]] = {}
        self._refused: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._inflight: dict[bytes, _Pending] = {}
        self._limiter = trio.CapacityLimiter(cfg.max_in_flight)
        self._endpoint: str | None = cfg.endpoint
        self.requests = 0
        """How many introspection requests were made (tests and metrics read it)."""

    # -- the cache -------------------------------------------------------------------------------------

    def cached(self) -> int:
        """How many verdicts are cached (identities and refusals)."""
        return len(self._cache) + len(self._refused)

    def _lookup(self, key: bytes) -> Outcome | None:
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None:
            identity, until = hit
            if now < until:
                self._cache.move_to_end(key)
                return identity
            self._forget(key)
        refused = self._refused.get(key)
        if refused is not None:
            if now < refused[1]:
                return refused[0]
            del self._refused[key]
        return None

    def _forget(self, key: bytes) -> None:
        hit = self._cache.pop(key, None)
        if hit is None:
            return
        tokens = self._by_principal.get(hit[0].subject)
        if tokens is not None:
            tokens.pop(key, None)
            if not tokens:
                del self._by_principal[hit[0].subject]

    def _keep(self, key: bytes, identity: Identity, until: float) -> None:
        tokens = self._by_principal.setdefault(identity.subject, OrderedDict())
        tokens[key] = None
        tokens.move_to_end(key)
        while len(tokens) > self.cfg.max_per_principal:
            oldest = next(iter(tokens))
            self._forget(oldest)
            tokens = self._by_principal.setdefault(identity.subject, tokens)
        self._cache[key] = (identity, until)
        self._by_principal[identity.subject] = tokens
        while len(self._cache) > self.cfg.max_cached:
            self._forget(next(iter(self._cache)))

    def _refuse(self, key: bytes, reason: str) -> str:
        self._refused[key] = (reason, self.clock() + NEGATIVE_TTL_S)
        while len(self._refused) > MAX_NEGATIVE:
            self._refused.popitem(last=False)
        return reason

    # -- checking a token ----------------------------------------------------------------------------------

    async def check(self, token: str) -> Outcome:
        """The caller ``token`` identifies, a refusal, or :class:`Unavailable`."""
        key = hashlib.sha256(token.encode()).digest()
        known = self._lookup(key)
        if known is not None:
            return known
        waiting = self._inflight.get(key)
        if waiting is not None:  # someone is asking about this very token: share its answer
            await waiting.done.wait()
            return waiting.outcome
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            return Unavailable(f"introspection at {self.cfg.issuer} is busy ({self.cfg.max_in_flight} in flight)")
        pending = self._inflight[key] = _Pending()
        try:
            pending.outcome = await self._introspect(key, token)
            return pending.outcome
        finally:
            self._limiter.release()
            del self._inflight[key]
            pending.done.set()

    async def _introspect(self, key: bytes, token: str) -> Outcome:
        cfg = self.cfg
        try:
            endpoint = await self._endpoint_url()
            form = {"token": token, "token_type_hint": "access_token"}
            headers: dict[str, str] = {}
            if cfg.auth_method == "client_secret_post":
                form |= {"client_id": cfg.client_id, "client_secret": self.secret}
            else:
                pair = f"{quote(cfg.client_id, safe='')}:{quote(self.secret, safe='')}"
                headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
            self.requests += 1
            doc = await post_form(
                endpoint,
                form,
                timeout_ms=cfg.timeout_ms,
                allow_private=cfg.allow_private,
                what="the introspection endpoint",
                headers=headers,
            )
        except FetchError as exc:
            _log.warning("introspection at %s failed: %s", cfg.issuer, exc)
            return Unavailable(f"introspection at {cfg.issuer} failed: {exc}")
        return self._verdict(key, token, doc)

    async def _endpoint_url(self) -> str:
        if self._endpoint is not None:
            return self._endpoint
        cfg = self.cfg
        base = cfg.issuer.rstrip("/")
        urls = (
            [cfg.metadata_url]
            if cfg.metadata_url
            else [
                base + "/.well-known/oauth-authorization-server",
                base + "/.well-known/openid-configuration",
            ]
        )
        last: FetchError | None = None
        for url in urls:
            try:
                doc = await get_json(
                    url, timeout_ms=cfg.timeout_ms, allow_private=cfg.allow_private, what="the issuer's metadata"
                )
            except FetchError as exc:
                last = exc
                continue
            if not isinstance(doc, dict) or doc.get("issuer") != cfg.issuer:
                got = doc.get("issuer") if isinstance(doc, dict) else None
                raise FetchError(f"the metadata at {url} names issuer {got!r}, not {cfg.issuer!r}")
            endpoint = doc.get("introspection_endpoint")
            if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
                raise FetchError(f"the metadata at {url} has no `introspection_endpoint`")
            self._endpoint = endpoint
            return endpoint
        raise last or FetchError("no metadata")

    def _verdict(self, key: bytes, token: str, doc: Mapping[str, object]) -> Outcome:
        cfg = self.cfg
        if doc.get("active") is not True:
            return self._refuse(key, "the token is not active")
        now = self.wall()
        exp = doc.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            return self._refuse(key, "the introspection answer has no `exp`")
        if exp <= now:
            return self._refuse(key, "the token has expired")
        nbf = doc.get("nbf")
        if isinstance(nbf, int | float) and not isinstance(nbf, bool) and nbf > now + 60:
            return self._refuse(key, "the token is not yet valid")
        iss = doc.get("iss")
        if iss is not None and iss != cfg.issuer:
            return self._refuse(key, f"the token was issued by {iss!r}, not {cfg.issuer!r}")
        if not cfg.any_audience:
            aud = doc.get("aud")
            listed = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
            if not any(isinstance(a, str) and a in self.audiences for a in listed):
                return self._refuse(key, "the token's audience is not this resource")
        identity = identity_from_claims(
            doc,
            cfg,
            provider="introspection",
            token=token,
            kept={k: v for k, v in doc.items() if k != "active"},
            limit=MAX_LISTED,
        )
        if identity is None:
            return self._refuse(key, f"the introspection answer has no `{cfg.subject_claim}`")
        until = self.clock() + min(cfg.cache_s, exp - now)
        self._keep(key, identity, until)
        return identity
