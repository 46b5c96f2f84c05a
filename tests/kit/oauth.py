"""A small OpenID provider and OAuth authorization server on 127.0.0.1, for the access tests (``kit.oauth``).

It signs JWTs with its own RSA keys and serves them as a JWK Set (through OIDC discovery), and its token
endpoint checks each grant's parameters as the RFCs say:

- ``client_credentials`` (RFC 6749 §4.4): a registered client id and secret (in the body, as mcpg sends them);
- ``urn:ietf:params:oauth:grant-type:token-exchange`` (RFC 8693): ``subject_token`` (a JWT this server signed,
  unexpired) and ``subject_token_type`` required; ``requested_token_type`` either an access token (answered
  with a JWT for the caller's ``sub``, its ``aud`` the requested ``audience``) or an ID-JAG
  (``urn:ietf:params:oauth:token-type:id-jag``: ``audience`` required, answered with a JWT assertion and that
  ``issued_token_type``);
- ``urn:ietf:params:oauth:grant-type:jwt-bearer`` (RFC 7523): ``assertion`` a JWT this server signed whose
  ``aud`` is this server (or one of ``redeem_audiences``), answered with a JWT for its ``sub`` (``aud``: the
  assertion's ``resource``).

Refusals are RFC 6749 §5.2 errors (``invalid_client`` 401, ``invalid_request``/``invalid_grant``/
``unsupported_grant_type`` 400). Every token request is kept in ``requests``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from kit.llm import _answer, _body, lifespan, serving

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"


@dataclass
class OAuthServer:
    """The provider; ``url`` (its issuer) is set once it serves."""

    url: str = ""
    clients: dict[str, str] = field(default_factory=lambda: {"mcpipe": "s3cret"})
    expires_in: int = 3600
    keys: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, str]] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    issued: int = 0
    redeem_audiences: set[str] = field(default_factory=set)
    """Audiences besides its own URL a JWT bearer assertion may name (resources it redeems grants for)."""

    def __post_init__(self) -> None:
        self.rotate("k1")

    def rotate(self, kid: str) -> None:
        """Add a signing key (the newest signs; the JWK Set lists them all)."""
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = kid

    def mint(self, sub: str, *, aud: Any = "mcpipe", exp_in: float = 300, kid: str | None = None, **claims: Any) -> str:
        """A JWT this provider signed (``iss`` its URL)."""
        now = int(time.time())
        payload = {"iss": self.url, "sub": sub, "aud": aud, "iat": now, "exp": now + int(exp_in), **claims}
        kid = kid or self.kid
        return jwt.encode(payload, self.keys[kid], algorithm="RS256", headers={"kid": kid})

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid, key in self.keys.items():
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def claims(self, token: str) -> dict[str, Any] | None:
        """The claims of a token this server signed (any audience), or None."""
        return self._verify(token, None)

    def _verify(self, token: str, audience: str | None) -> dict[str, Any] | None:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = self.keys[kid].public_key()
            options = {"verify_aud": audience is not None}
            return jwt.decode(token, key, algorithms=["RS256"], audience=audience, issuer=self.url, options=options)
        except (jwt.PyJWTError, KeyError):
            return None

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        grant = form.get("grant_type")
        if grant == "client_credentials":
            cid, secret = form.get("client_id"), form.get("client_secret")
            if cid not in self.clients or self.clients[cid] != secret:
                return 401, {"error": "invalid_client"}
            self.issued += 1
            return 200, {
                "access_token": f"cc-{cid}-{self.issued}",
                "token_type": "Bearer",
                "expires_in": self.expires_in,
                "scope": form.get("scope", ""),
            }
        if grant == TOKEN_EXCHANGE:
            if form.get("client_id") not in self.clients:
                return 401, {"error": "invalid_client"}
            subject, kind = form.get("subject_token"), form.get("subject_token_type")
            if not subject or not kind:
                return 400, {"error": "invalid_request"}
            if kind != ACCESS_TOKEN:
                return 400, {"error": "invalid_request"}
            claims = self._verify(subject, None)
            if claims is None:
                return 400, {"error": "invalid_grant"}
            wanted = form.get("requested_token_type", ACCESS_TOKEN)
            if wanted == ID_JAG:
                audience = form.get("audience")
                if not audience:
                    return 400, {"error": "invalid_request"}
                assertion = self.mint(claims["sub"], aud=audience, exp_in=120, resource=form.get("resource", ""))
                return 200, {
                    "access_token": assertion,
                    "issued_token_type": ID_JAG,
                    "token_type": "N_A",
                    "expires_in": 120,
                }
            if wanted != ACCESS_TOKEN:
                return 400, {"error": "invalid_request"}
            self.issued += 1
            token = self.mint(
                claims["sub"], aud=form.get("audience") or "exchanged", exp_in=self.expires_in, grant="exchanged"
            )
            return 200, {
                "access_token": token,
                "issued_token_type": ACCESS_TOKEN,
                "token_type": "Bearer",
                "expires_in": self.expires_in,
            }
        if grant == JWT_BEARER:
            assertion = form.get("assertion")
            claims = None
            for audience in (self.url, *self.redeem_audiences) if assertion else ():
                claims = claims or self._verify(assertion, audience)
            if claims is None:
                return 400, {"error": "invalid_grant"}
            self.issued += 1
            token = self.mint(
                claims["sub"], aud=claims.get("resource") or "redeemed", exp_in=self.expires_in, grant="redeemed"
            )
            return 200, {
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": self.expires_in,
            }
        return 400, {"error": "unsupported_grant_type"}

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            path = scope["path"]
            self.hits[path] = self.hits.get(path, 0) + 1
            if path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):  # RFC 8414
                doc = {"issuer": self.url, "jwks_uri": self.url + "/jwks", "token_endpoint": self.url + "/token"}
                await _answer(send, 200, doc)
            elif path == "/jwks":
                await _answer(send, 200, self.jwks())
            elif path == "/token" and scope["method"] == "POST":
                form = dict(parse_qsl((await _body(receive)).decode(), keep_blank_values=True))
                self.requests.append(form)
                status, doc = self.token(form)
                await _answer(send, status, doc)
            else:
                await _answer(send, 404, {"error": "not found"})

        return app


@asynccontextmanager
async def oauth_server(**kw: Any) -> AsyncIterator[OAuthServer]:
    """An :class:`OAuthServer` on a free port of 127.0.0.1."""
    server = OAuthServer(**kw)
    async with serving(server.app()) as base:
        server.url = base
        yield server


@dataclass
class EchoApi:
    """An HTTP API that answers what it was sent: method, path, query, the ``authorization`` header, body."""

    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            got = {
                "method": scope["method"],
                "path": scope["path"],
                "raw_path": (scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
                "query": scope["query_string"].decode(),
                "authorization": headers.get("authorization"),
                "body": (await _body(receive)).decode(),
            }
            self.seen.append(got)
            await _answer(send, 200, got)

        return app


@asynccontextmanager
async def echo_api() -> AsyncIterator[EchoApi]:
    api = EchoApi()
    async with serving(api.app()) as base:
        api.url = base
        yield api
