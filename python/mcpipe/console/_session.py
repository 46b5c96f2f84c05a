"""The console's browser sessions: a signed cookie naming who signed in, and the CSRF token of its forms.

A browser cannot send the ``Authorization`` header the MCP endpoint reads, so the console's sign-in page takes
the same credential (a bearer token, an OIDC issuer's JWT), resolves it with the HTTP front's
:class:`~mcpipe.access.Authenticator` exactly as ``/mcp`` would, and answers a cookie holding the identity it
found (subject, roles, groups, scopes; never the credential): signed with HMAC-SHA256, ``HttpOnly``,
``SameSite=Strict``, ``Secure`` over HTTPS (behind an HTTPS proxy too: ``[console] secure_cookies``), and
expiring after ``[console] session_ttl_s`` (or when the JWT does). A token session also keeps the token's
SHA-256 digest, so removing the token from the config (a reload) ends its sessions.

The signing key comes from the state key (``[interaction] state_key_env``) when it is set, so the workers of
``--workers N`` and a restarted server accept each other's cookies; else it is random per process (sessions end
with it). Each session has a random id; a form's CSRF token is an HMAC of it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from mcpipe.tools import Identity

__all__ = ["COOKIE", "Session", "Signer"]

COOKIE = "mcpipe_console"
MAX_COOKIE = 3800
"""The most a session cookie may hold (browsers keep 4 KB a cookie): an identity with more roles is cut."""


@dataclass(frozen=True, slots=True)
class Session:
    """One browser's session: ``sid`` (random), the identity signed in (None: nobody yet), its expiry (Unix s),
    and the digest of the bearer token it signed in with (None: another kind of credential)."""

    sid: str
    identity: Identity | None = None
    expires: float = 0.0
    token_digest: str | None = None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and checks session cookies and CSRF tokens.

    Args:
        secret: the state key's bytes (None: a random key of this process).
    """

    def __init__(self, secret: bytes | None = None) -> None:
        base = secret if secret else os.urandom(32)
        self.key = hmac.new(base, b"mcpipe console sessions v1", hashlib.sha256).digest()

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self.key, data, hashlib.sha256).digest()

    def new(self) -> Session:
        """A session nobody signed in to yet (its CSRF token guards the sign-in form)."""
        return Session(_b64(os.urandom(16)))

    def csrf(self, session: Session) -> str:
        """The CSRF token of ``session``'s forms."""
        return _b64(self._mac(b"csrf:" + session.sid.encode()))[:32]

    def csrf_ok(self, session: Session, token: str) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(session), token)

    def dump(self, session: Session) -> str:
        """The cookie's value: the session's JSON and its MAC."""
        body: dict[str, Any] = {"sid": session.sid, "exp": round(session.expires)}
        who = session.identity
        if who is not None:
            body["who"] = {
                "sub": who.subject,
                "trust": who.trust,
                "provider": who.provider,
                "issuer": who.issuer,
                "roles": list(who.roles),
                "groups": list(who.groups),
                "scopes": list(who.scopes),
                "attributes": dict(who.attributes),
            }
            if session.token_digest:
                body["tok"] = session.token_digest
        data = orjson.dumps(body)
        if len(data) > MAX_COOKIE and who is not None:
            body["who"]["groups"], body["who"]["scopes"], body["who"]["attributes"] = [], [], {}
            data = orjson.dumps(body)
        return f"{_b64(data)}.{_b64(self._mac(data))}"

    def load(self, value: str, *, now: float | None = None) -> Session | None:
        """The session a cookie value holds, or None when it is forged, malformed or expired."""
        body, _, mac = value.partition(".")
        try:
            data, sig = _unb64(body), _unb64(mac)
        except (ValueError, TypeError):
            return None
        if not hmac.compare_digest(self._mac(data), sig):
            return None
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("sid"), str):
            return None
        expires = float(raw.get("exp") or 0)
        who = raw.get("who")
        if not isinstance(who, dict):
            return Session(raw["sid"])
        if expires < (time.time() if now is None else now):
            return Session(raw["sid"])  # signed in once: signed out now, the session id kept
        identity = Identity(
            subject=str(who.get("sub")),
            trust="header_asserted" if who.get("trust") == "header_asserted" else "verified",
            provider=str(who.get("provider") or "token"),
            issuer=who.get("issuer") if isinstance(who.get("issuer"), str) else None,
            roles=tuple(str(r) for r in who.get("roles") or ()),
            groups=tuple(str(g) for g in who.get("groups") or ()),
            scopes=tuple(str(s) for s in who.get("scopes") or ()),
            attributes={str(k): str(v) for k, v in (who.get("attributes") or {}).items()},
        )
        tok = raw.get("tok")
        return Session(raw["sid"], identity, expires, tok if isinstance(tok, str) else None)


def token_digest(token: str) -> str:
    """The hex SHA-256 of a bearer token (what the HTTP front keeps of it)."""
    return hashlib.sha256(token.encode()).hexdigest()


def cookie_header(value: str, *, secure: bool, max_age: int | None) -> bytes:
    """A ``Set-Cookie`` header value for the session cookie."""
    parts = [f"{COOKIE}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return "; ".join(parts).encode()


def read_cookie(headers: Mapping[bytes, bytes] | list[tuple[bytes, bytes]]) -> str | None:
    """The session cookie's value among a request's headers, or None."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in items:
        if name.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, _, val = part.strip().partition("=")
            if key == COOKIE and val:
                return val
    return None
