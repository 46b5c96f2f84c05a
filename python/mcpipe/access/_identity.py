"""Who is calling: bearer tokens, JWTs of OIDC issuers, client certificates forwarded by a proxy.

:class:`Authenticator` resolves one request's headers to an :class:`~mcpipe.tools.Identity`, trying in
order: the static tokens of ``[auth] tokens``, the ``[[auth.oidc]]`` issuers, ``[auth.mtls]``. A credential
that is presented but does not verify is refused (:class:`Rejected`: the HTTP front answers 401), never
downgraded to a lesser identity; a request presenting none resolves to None.

JWT verification follows mcpg's ``dev.mcpg.identity.oidc``: the token's algorithm must be one the provider
allows (``none`` never), its signature must verify with a key of the issuer's JWK Set (chosen by ``kid``),
``exp`` and ``iss`` are required, ``aud`` must name one of ``audiences``, ``exp``/``nbf`` are checked with
``clock_skew_s`` of leeway, and the subject comes from ``subject_claim`` (dotted paths reach nested claims).
With several issuers the token's (unverified) ``iss`` picks the provider that verifies it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
import trio

from mcpipe.access._claims import identity_from_claims
from mcpipe.access._config import IntrospectionProvider, MtlsConfig, OidcProvider
from mcpipe.access._fetch import FetchError, get_json
from mcpipe.access._introspect import Introspection, Unavailable
from mcpipe.tools import Identity

if TYPE_CHECKING:
    import jwt

__all__ = ["Authenticator", "JwksCache", "Rejected", "mtls_identity"]

_log = logging.getLogger("mcpipe.access")

UNKNOWN_KID_REFRESH_S = 60.0
"""A token naming a key the cache lacks refetches the JWK Set at most this often (a caller cycling random
``kid`` values must not drive one fetch per request)."""

FAILED_FETCH_RETRY_S = 5.0
"""After a failed fetch of the JWK Set, the next is tried no sooner than this: meanwhile tokens are checked
with the cached keys (when they may still serve) or refused at once, instead of each request waiting for a
fetch of its own (a JWK Set server that hangs held every caller of the issuer in line, ``timeout_ms`` each)."""

MAX_KEYS = 100
"""The most keys of one JWK Set kept (the rest are left out, said in the log)."""

VERDICT_TTL_S = 60.0
"""How long a verified JWT is answered from memory (never past its ``exp``): a token is verified once a minute,
not on every request, and a key withdrawn from the JWK Set stops its tokens within a minute."""
MAX_VERDICTS = 10_000
"""The most verified tokens remembered (least recently used go first)."""

Headers = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A credential was presented and did not verify (answered 401, ``error="invalid_token"``; ``reason`` is
    for the log), or could not be checked now (``status`` 503: an introspection endpoint busy or down)."""

    reason: str
    status: int = 401


def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def _header(headers: Headers, name: bytes) -> bytes | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


class JwksCache:
    """One issuer's keys: inline, or fetched (through discovery unless ``jwks_url`` is set) and cached."""

    def __init__(self, cfg: OidcProvider, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.keys: list[tuple[str | None, jwt.PyJWK]] | None = None
        self.fetched_at = -1e18
        self._last_kid_refresh = -1e18
        self._failed_at = -1e18
        self._failure: FetchError | None = None
        self._attempts = 0
        self._lock = trio.Lock()
        self._jwks_url: str | None = cfg.jwks_url
        if cfg.jwks is not None:
            self.keys = self._parse(orjson.loads(cfg.jwks))
            self.fetched_at = float("inf")

    @staticmethod
    def _parse(doc: object) -> list[tuple[str | None, jwt.PyJWK]]:
        import jwt  # with the first JWT issuer: a server without one never loads PyJWT

        keys: list[tuple[str | None, jwt.PyJWK]] = []
        listed = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(listed, list):  # `{"keys": 5}` raised TypeError out of the request (issue 20's review)
            return keys
        if len(listed) > MAX_KEYS:
            _log.warning("a JWK Set lists %d keys; the first %d are used", len(listed), MAX_KEYS)
        for raw in listed[:MAX_KEYS]:
            if not isinstance(raw, dict):
                continue
            try:
                key = jwt.PyJWK(raw)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as exc:
                _log.warning("skipping an unusable JWK (kid %s): %s", raw.get("kid"), exc)
                continue
            kid = raw.get("kid")
            keys.append((kid if isinstance(kid, str) else None, key))
        return keys

    async def _fetch(self) -> list[tuple[str | None, jwt.PyJWK]]:
        cfg = self.cfg
        url = self._jwks_url
        if url is None:
            discovery = cfg.discovery_url or cfg.issuer.rstrip("/") + "/.well-known/openid-configuration"
            doc = await get_json(
                discovery, timeout_ms=cfg.timeout_ms, allow_private=cfg.allow_private, what="the discovery document"
            )
            if not isinstance(doc, dict) or doc.get("issuer") != cfg.issuer:
                got = doc.get("issuer") if isinstance(doc, dict) else None
                raise FetchError(f"the discovery document names issuer {got!r}, not {cfg.issuer!r}")
            if not isinstance(doc.get("jwks_uri"), str):
                raise FetchError("the discovery document has no `jwks_uri`")
            url = doc["jwks_uri"]
        jwks = await get_json(url, timeout_ms=cfg.timeout_ms, allow_private=cfg.allow_private, what="the JWK Set")
        keys = self._parse(jwks)
        if not keys:
            raise FetchError("the JWK Set holds no usable key")
        self._jwks_url = url if cfg.jwks_url is not None else None  # discovery is asked again on each refresh
        return keys

    def _usable(self) -> bool:
        """Whether cached keys may still serve (fetched less than ``max_staleness_s`` ago)."""
        return self.keys is not None and self.clock() - self.fetched_at < self.cfg.max_staleness_s

    async def _refresh(self) -> None:
        """Fetch the keys, one fetch at a time for all callers; on failure keep serving cached ones younger
        than ``max_staleness_s``, and try again no sooner than :data:`FAILED_FETCH_RETRY_S`.

        A caller holding usable keys never waits for a fetch another caller is making; a caller without any
        waits for that fetch and shares its outcome (before, each waiting caller fetched again in turn).

        Raises:
            FetchError: there are no usable keys and they could not be fetched (now, or by the last try).
        """
        if self._lock.locked() and self._usable():
            return
        seen = self._attempts
        async with self._lock:
            if self._attempts != seen or self.clock() - self._failed_at < FAILED_FETCH_RETRY_S:
                # A fetch was made while this caller waited (its outcome is this caller's), or failed lately.
                if self._failure is None or self._usable():
                    return
                raise FetchError(str(self._failure))  # a new one: a raised one keeps its traceback
            try:
                keys = await self._fetch()
            except FetchError as exc:
                self._attempts += 1  # counted once done: a caller that came while it ran shares its outcome
                self._failed_at, self._failure = self.clock(), exc
                if self._usable():
                    _log.warning(
                        "JWK Set of %s could not be refreshed (%s); serving the cached keys", self.cfg.issuer, exc
                    )
                    return
                raise
            self._attempts += 1
            self.keys, self.fetched_at = keys, self.clock()
            self._failed_at, self._failure = -1e18, None

    async def candidates(self, kid: str | None) -> list[jwt.PyJWK]:
        """The keys that may have signed a token naming ``kid``.

        Raises:
            FetchError: there are no keys and they could not be fetched.
        """
        if self.cfg.jwks is None and self.clock() - self.fetched_at >= self.cfg.refresh_s:
            await self._refresh()
        keys = self.keys or []
        if kid is None:
            return [k for _, k in keys]
        found = [k for key_id, k in keys if key_id == kid]
        if found or self.cfg.jwks is not None:
            return found
        now = self.clock()
        if now - self._last_kid_refresh < UNKNOWN_KID_REFRESH_S:
            return []
        self._last_kid_refresh = now
        await self._refresh()
        return [k for key_id, k in (self.keys or []) if key_id == kid]


class _Oidc:
    def __init__(self, cfg: OidcProvider, clock: Callable[[], float], resource: str | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.keys = JwksCache(cfg, clock)
        # An issuer naming no audiences accepts the tokens minted for this resource (RFC 8707).
        self.audiences = list(cfg.audiences) if cfg.audiences or resource is None else [resource]
        self._verdicts: OrderedDict[bytes, tuple[Identity, float]] = OrderedDict()

    def cached(self, token: str, key: bytes | None = None) -> Identity | None:
        """The identity of a token verified lately (see :meth:`verify`), or None."""
        key = _digest(token) if key is None else key
        hit = self._verdicts.get(key)
        if hit is not None:
            if self.clock() < hit[1]:
                self._verdicts.move_to_end(key)
                return hit[0]
            del self._verdicts[key]
        return None

    async def verify(self, token: str) -> Identity | Rejected:
        """The token's identity: from the verdict cache (a token verified in the last :data:`VERDICT_TTL_S`
        seconds, and not expired since), else verified (see the module docstring)."""
        key = _digest(token)
        hit = self.cached(token, key)
        if hit is not None:
            await trio.lowlevel.checkpoint()
            return hit
        outcome = await self._verify(token)
        if isinstance(outcome, Identity):
            exp = outcome.claims.get("exp")
            left = float(exp) - time.time() if isinstance(exp, int | float) and not isinstance(exp, bool) else 0.0
            if left > 0:
                self._verdicts[key] = (outcome, self.clock() + min(VERDICT_TTL_S, left))
                while len(self._verdicts) > MAX_VERDICTS:
                    self._verdicts.popitem(last=False)
        return outcome

    async def _verify(self, token: str) -> Identity | Rejected:
        import jwt

        cfg = self.cfg
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            return Rejected(f"not a JWT: {exc}")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in cfg.algorithms:
            return Rejected(f"algorithm {alg!r} is not allowed for issuer {cfg.issuer}")
        kid = header.get("kid")
        try:
            keys = await self.keys.candidates(kid if isinstance(kid, str) else None)
        except FetchError as exc:
            return Rejected(f"no keys for issuer {cfg.issuer}: {exc}")
        if not keys:
            return Rejected(f"no key of issuer {cfg.issuer} matches kid {kid!r}")
        required = ["exp", "iss"] + ([] if cfg.any_audience else ["aud"])
        last = "no key verified it"
        for key in keys:
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    audience=None if cfg.any_audience else self.audiences,
                    issuer=cfg.issuer,
                    leeway=cfg.clock_skew_s,
                    options={"require": required, "verify_aud": not cfg.any_audience},
                )
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError as exc:
                return Rejected(f"{type(exc).__name__}: {exc}")
            return self._identity(claims, token)
        return Rejected(last)

    def _identity(self, claims: Mapping[str, object], token: str) -> Identity | Rejected:
        cfg = self.cfg
        identity = identity_from_claims(claims, cfg, provider="oidc", token=token, kept=claims)
        return Rejected(f"missing or empty `{cfg.subject_claim}` claim") if identity is None else identity


def _unverified_issuer(token: str) -> str | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return None
    iss = payload.get("iss") if isinstance(payload, dict) else None
    return iss if isinstance(iss, str) else None


# -- client certificates forwarded by a proxy ----------------------------------------------------------------

_XFCC_FIELD = re.compile(r'\s*([A-Za-z]+)=("(?:[^"\\]|\\.)*"|[^;,]*)')


def _xfcc_elements(value: str) -> list[dict[str, str]]:
    """Envoy's ``x-forwarded-client-cert``: comma-separated elements of ``Key=value`` pairs split by ``;``,
    values optionally double-quoted (with ``\\"`` escapes)."""
    elements: list[dict[str, str]] = []
    current: dict[str, str] = {}
    pos = 0
    while pos < len(value):
        m = _XFCC_FIELD.match(value, pos)
        if m is None:
            break
        key, raw = m.group(1), m.group(2).strip()
        if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        current[key.lower()] = raw
        pos = m.end()
        sep = value[pos : pos + 1]
        pos += 1
        if sep == "," or pos >= len(value):
            elements.append(current)
            current = {}
    if current:
        elements.append(current)
    return elements


def _cn(dn: str) -> str | None:
    for part in re.split(r"(?<!\\)[,/]", dn):
        key, sep, val = part.strip().partition("=")
        if sep and key.strip().upper() == "CN":
            return val.strip()
    return None


def _normal_dn(dn: str) -> str:
    return ",".join(p.strip() for p in re.split(r"(?<!\\),", dn.strip()) if p.strip())


def mtls_identity(cfg: MtlsConfig, headers: Headers) -> Identity | Rejected | None:
    """The identity of the client certificate the first configured source carries (None: no source has one)."""
    for source in cfg.sources:
        value = _header(headers, source.header.lower().encode())
        if value is None:
            continue
        text = value.decode("latin-1").strip()
        if not text:
            continue
        dn: str | None = None
        fingerprint: str | None = None
        if source.kind == "xfcc":
            elements = _xfcc_elements(text)
            if not elements:
                return Rejected(f"`{source.header}` is not an XFCC value")
            element = elements[0] if source.chain_position == "first" else elements[-1]
            dn = element.get("subject")
            fingerprint = element.get("hash")
        elif source.kind == "dn_string" or source.extraction_hint == "dn":
            dn = text
        else:
            fingerprint = text
        subject = _subject(cfg, dn, fingerprint)
        if subject is None:
            return Rejected(f"`{source.header}` carries no {cfg.mode.replace('_', ' ')}")
        meta = cfg.identities.get(subject)
        return Identity(
            subject=subject,
            trust=cfg.trust,
            provider="mtls",
            roles=tuple(meta.roles) if meta else (),
            groups=tuple(meta.groups) if meta else (),
            scopes=tuple(meta.scopes) if meta else (),
            attributes=dict(meta.attributes) if meta else {},
        )
    return None


def _subject(cfg: MtlsConfig, dn: str | None, fingerprint: str | None) -> str | None:
    if cfg.mode == "fingerprint":
        if not fingerprint:
            return None
        hexed = fingerprint.replace(":", "").lower()
        return hexed if re.fullmatch(r"[0-9a-f]{64}", hexed) else None
    if not dn:
        return None
    if cfg.mode == "subject_dn":
        return _normal_dn(dn)
    cn = _cn(dn)
    if not cn:
        return None
    return cn if cfg.case_sensitive else cn.lower()


class Authenticator:
    """Resolves a request's identity (see the module docstring).

    Args:
        tokens: token digest -> principal (``[auth] tokens``).
        oidc: the issuers whose JWTs identify callers.
        mtls: where a proxy forwards client certificates, or None.
        introspection: the authorization servers whose opaque tokens are introspected (RFC 7662), each with
            its client secret.
        resource: this resource's canonical URL (``auth.resource.url``): the audience of an issuer that names
            none.
        token_scopes: principal of a static token -> the scopes it stands for.
    """

    def __init__(
        self,
        tokens: Mapping[bytes, str],
        oidc: Sequence[OidcProvider] = (),
        mtls: MtlsConfig | None = None,
        *,
        introspection: Sequence[tuple[IntrospectionProvider, str]] = (),
        resource: str | None = None,
        token_scopes: Mapping[str, Sequence[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokens = dict(tokens)
        self.oidc = [_Oidc(p, clock, resource) for p in oidc]
        self.mtls = mtls
        self.introspection = [
            Introspection(
                cfg,
                list(cfg.audiences) if cfg.audiences or resource is None else [resource],
                secret,
                clock=clock,
            )
            for cfg, secret in introspection
        ]
        self.token_scopes = {k: tuple(v) for k, v in (token_scopes or {}).items()}
        self._by_issuer = {p.cfg.issuer: p for p in self.oidc}
        self._sources: dict[tuple[str, str], list[_Oidc]] = {}
        for p in self.oidc:
            self._sources.setdefault((p.cfg.header.lower(), p.cfg.prefix), []).append(p)
        self._plain = set(self._sources) == {("authorization", "Bearer ")}

    @property
    def configured(self) -> bool:
        """Whether any identity source is configured (then a request needs an identity)."""
        return bool(self.tokens) or bool(self.oidc) or bool(self.introspection) or self.mtls is not None

    def _bearer(self, headers: Headers, name: bytes, prefix: str) -> str | None:
        value = _header(headers, name)
        if value is None:
            return None
        text = value.decode("latin-1").strip()
        if prefix:
            if text[: len(prefix)].lower() != prefix.lower():
                return None
            text = text[len(prefix) :].strip()
        return text or None

    async def resolve(self, headers: Headers) -> Identity | Rejected | None:
        """The caller's identity, a refusal of the credential it presented, or None (it presented none)."""
        bearer = self._bearer(headers, b"authorization", "Bearer ")
        if bearer is not None and self.tokens:
            digest = _digest(bearer)
            for known, principal in self.tokens.items():
                if hmac.compare_digest(known, digest):
                    return Identity(
                        subject=principal, provider="token", scopes=self.token_scopes.get(principal, ()), token=bearer
                    )
        if self.oidc:
            outcome = await self._oidc(headers, bearer)
            if outcome is not None:
                return outcome
        if bearer is not None and self.introspection:
            return await self._introspect(bearer)
        if self.mtls is not None:
            found = mtls_identity(self.mtls, headers)
            if found is not None:
                return found
        if bearer is not None and self.tokens:
            return Rejected("unknown bearer token")
        return None

    async def _introspect(self, token: str) -> Identity | Rejected:
        last = "no introspection endpoint knows the token"
        for provider in self.introspection:
            outcome = await provider.check(token)
            if isinstance(outcome, Identity):
                return outcome
            if isinstance(outcome, Unavailable):
                return Rejected(outcome.reason, 503)
            last = outcome
        return Rejected(last)

    async def _oidc(self, headers: Headers, bearer: str | None) -> Identity | Rejected | None:
        if bearer is not None and self._plain:
            # The usual shape (the Authorization header, one or more issuers): a token verified lately is
            # answered before anything of it is parsed again.
            for p in self.oidc:
                hit = p.cached(bearer)
                if hit is not None:
                    return hit
        for (name, prefix), providers in self._sources.items():
            token = (
                bearer
                if (name, prefix) == ("authorization", "Bearer ")
                else self._bearer(headers, name.encode(), prefix)
            )
            if token is None:
                continue
            iss = _unverified_issuer(token)
            chosen = self._by_issuer.get(iss) if iss is not None else None
            if (
                self.introspection
                and (chosen is None or chosen not in providers)
                and (name, prefix.strip().lower()) == ("authorization", "bearer")
            ):
                return None  # not a JWT of these issuers: an opaque token (or another server's JWT), introspected
            if len(providers) == 1:
                return await providers[0].verify(token)
            if chosen is not None and chosen in providers:
                return await chosen.verify(token)
            last: Rejected | None = None
            for p in providers:
                outcome = await p.verify(token)
                if isinstance(outcome, Identity):
                    return outcome
                last = outcome
            return Rejected(f"no issuer verified the token ({last.reason if last else 'none tried'})")
        return None
