"""A real OAuth 2.1 authorization server on 127.0.0.1, built on Authlib (``kit.authserver``).

Authlib's framework-agnostic server (``authlib.oauth2``) does the protocol: the authorization code grant
with PKCE required (S256, RFC 7636), refresh tokens (rotated), dynamic client registration (RFC 7591),
introspection (RFC 7662), RFC 8414 metadata; this module adds what Authlib leaves to its host: an ASGI front,
models in memory, Client ID Metadata Documents (a ``client_id`` that is an https URL is fetched, and its
``client_id`` and ``redirect_uris`` checked), RFC 8707 ``resource`` (bound to the code; the access token's
``aud``), RFC 9207 ``iss`` on the authorization response, and JWT access tokens signed with its RSA key
(JWK Set at ``/jwks``) or opaque ones (``opaque=True``, for introspection).

The authorization endpoint approves at once, for the user the browser names (its ``user`` cookie, else
``default_user``): tests play the browser.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx2
import jwt
from authlib.oauth2 import AuthorizationServer as _AuthlibServer
from authlib.oauth2 import OAuth2Error
from authlib.oauth2.rfc6749 import (
    AuthorizationCodeMixin,
    ClientMixin,
    JsonPayload,
    JsonRequest,
    OAuth2Payload,
    OAuth2Request,
    TokenMixin,
    grants,
)
from authlib.oauth2.rfc7591 import ClientMetadataClaims, ClientRegistrationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc7662 import IntrospectionEndpoint
from cryptography.hazmat.primitives.asymmetric import rsa

from kit.llm import _body, lifespan, serving

__all__ = ["AuthServer", "auth_server"]


@dataclass
class Client(ClientMixin):
    client_id: str
    client_secret: str | None = None
    redirect_uris: list[str] = field(default_factory=list)
    auth_method: str = "none"
    scope: str = ""
    grant_types: list[str] = field(default_factory=lambda: ["authorization_code", "refresh_token"])
    name: str = ""

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return self.redirect_uris[0] if self.redirect_uris else None

    def get_allowed_scope(self, scope: str) -> str:
        if not scope:
            return ""
        if not self.scope:
            return scope
        allowed = set(self.scope.split())
        return " ".join(s for s in scope.split() if s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return self.client_secret is not None and secrets.compare_digest(self.client_secret, client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if endpoint == "token":
            return method == self.auth_method
        return True

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.grant_types


@dataclass
class Code(AuthorizationCodeMixin):
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: str
    resource: str | None
    code_challenge: str | None
    code_challenge_method: str | None
    expires_at: float

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope


@dataclass
class Token(TokenMixin):
    access_token: str
    refresh_token: str | None
    client_id: str
    scope: str
    user: str
    resource: str | None
    issued_at: float
    expires_in: int
    revoked: bool = False

    def check_client(self, client: ClientMixin) -> bool:
        return self.client_id == client.get_client_id()

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return self.expires_in

    def is_expired(self) -> bool:
        return time.time() >= self.issued_at + self.expires_in

    def is_revoked(self) -> bool:
        return self.revoked

    def get_user(self) -> str:
        return self.user

    def get_client(self) -> ClientMixin:
        raise NotImplementedError


class _Payload(OAuth2Payload):
    def __init__(self, data: dict[str, str]) -> None:
        self._data = data

    @property
    def data(self) -> dict[str, str]:
        return self._data

    @property
    def datalist(self) -> Any:
        return {k: [v] for k, v in self._data.items()}


class _Request(OAuth2Request):
    """An ASGI request as Authlib reads it (query for GET, form for POST)."""

    def __init__(self, method: str, uri: str, headers: dict[str, str], query: dict[str, str], form: dict[str, str]):
        super().__init__(method, uri, headers=headers)
        self._query, self._form = query, form
        self.payload = _Payload({**query, **form})

    @property
    def args(self) -> dict[str, str]:
        return self._query

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _JsonPayload(JsonPayload):
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @property
    def data(self) -> dict[str, Any]:
        return self._data


class _JsonRequest(JsonRequest):
    def __init__(self, method: str, uri: str, headers: dict[str, str], data: dict[str, Any]) -> None:
        super().__init__(method, uri, headers)
        self.payload = _JsonPayload(data)


class _Server(_AuthlibServer):
    def __init__(self, owner: AuthServer) -> None:
        super().__init__(scopes_supported=owner.scopes_supported or None)
        self.owner = owner

    def query_client(self, client_id: str) -> Client | None:
        return self.owner.clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        owner = self.owner
        user = request.user if isinstance(request.user, str) else owner.default_user
        resource = owner._resource
        owner.tokens[token["access_token"]] = Token(
            access_token=token["access_token"],
            refresh_token=token.get("refresh_token"),
            client_id=request.client.get_client_id(),
            scope=token.get("scope", ""),
            user=user,
            resource=resource,
            issued_at=time.time(),
            expires_in=int(token.get("expires_in", owner.expires_in)),
        )
        if token.get("refresh_token"):
            owner.refresh[token["refresh_token"]] = owner.tokens[token["access_token"]]

    def create_oauth2_request(self, request: Any) -> OAuth2Request:
        return request  # type: ignore[no-any-return]

    def create_json_request(self, request: Any) -> JsonRequest:
        return request  # type: ignore[no-any-return]

    def handle_response(self, status: int, body: Any, headers: Any) -> tuple[int, Any, list[tuple[str, str]]]:
        return status, body, list(headers)

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass


class _CodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]

    def save_authorization_code(self, code: str, request: OAuth2Request) -> None:
        owner: AuthServer = self.server.owner
        data = request.payload.data
        owner.codes[code] = Code(
            code=code,
            client_id=request.client.get_client_id(),
            redirect_uri=request.payload.redirect_uri,
            scope=request.payload.scope or "",
            user=request.user,
            resource=data.get("resource"),
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
            expires_at=time.time() + 60,
        )

    def query_authorization_code(self, code: str, client: ClientMixin) -> Code | None:
        owner: AuthServer = self.server.owner
        found = owner.codes.get(code)
        if found is None or found.client_id != client.get_client_id() or time.time() > found.expires_at:
            return None
        resource = self.request.payload.data.get("resource")
        if found.resource is not None and resource is not None and resource != found.resource:
            return None  # RFC 8707: the token is for the resource the code was granted for
        owner._resource = found.resource or resource
        return found

    def delete_authorization_code(self, authorization_code: Code) -> None:
        self.server.owner.codes.pop(authorization_code.code, None)
        self.server.owner.used_codes.add(authorization_code.code)

    def authenticate_user(self, authorization_code: Code) -> str:
        return authorization_code.user


class _RefreshGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
        owner: AuthServer = self.server.owner
        found = owner.refresh.get(refresh_token)
        if found is None or found.revoked:
            return None
        owner._resource = found.resource
        return found

    def authenticate_user(self, refresh_token: Token) -> str:
        return refresh_token.user

    def revoke_old_credential(self, refresh_token: Token) -> None:
        refresh_token.revoked = True
        self.server.owner.refresh.pop(refresh_token.refresh_token or "", None)


class _Introspection(IntrospectionEndpoint):
    CLIENT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]

    def query_token(self, token_string: str, token_type_hint: str | None) -> Token | None:
        return self.server.owner.tokens.get(token_string)

    def check_permission(self, token: Token, client: ClientMixin, request: OAuth2Request) -> bool:
        return client.get_client_id() in self.server.owner.resource_servers

    def introspect_token(self, token: Token) -> dict[str, Any]:
        owner: AuthServer = self.server.owner
        return {
            "active": True,
            "client_id": token.client_id,
            "token_type": "Bearer",
            "scope": token.scope,
            "sub": token.user,
            "aud": token.resource,
            "iss": owner.url,
            "exp": int(token.issued_at + token.expires_in),
            "iat": int(token.issued_at),
        }


class _Registration(ClientRegistrationEndpoint):
    def authenticate_token(self, request: Any) -> bool:
        return True  # open registration, as MCP clients expect

    def extract_client_metadata(self, request: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = super().extract_client_metadata(request)
        metadata.setdefault("token_endpoint_auth_method", "client_secret_basic")  # RFC 7591 §2's default, said
        return metadata

    def generate_client_registration_info(self, client: Client, request: Any) -> dict[str, Any]:
        return {} if client.auth_method != "none" else {"client_secret": None}

    def resolve_public_key(self, request: Any) -> None:
        return None

    def get_server_metadata(self) -> dict[str, Any]:
        return self.server.owner.metadata()

    def save_client(self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: Any) -> Client:
        owner: AuthServer = self.server.owner
        method = client_metadata.get("token_endpoint_auth_method", "client_secret_basic")
        client = Client(
            client_id=client_info["client_id"],
            client_secret=client_info["client_secret"] if method != "none" else None,
            redirect_uris=list(client_metadata.get("redirect_uris", [])),
            auth_method=method,
            scope=client_metadata.get("scope", ""),
            grant_types=list(client_metadata.get("grant_types", ["authorization_code", "refresh_token"])),
            name=client_metadata.get("client_name", ""),
        )
        owner.clients[client.client_id] = client
        owner.registrations += 1
        return client


@dataclass
class AuthServer:
    """The server. ``url`` (its issuer) is set once it serves."""

    url: str = ""
    default_user: str = "alice"
    scopes_supported: list[str] = field(default_factory=list)
    expires_in: int = 3600
    opaque: bool = False
    """Issue opaque access tokens (checked by introspection) instead of JWTs."""
    clients: dict[str, Client] = field(default_factory=dict)
    codes: dict[str, Code] = field(default_factory=dict)
    used_codes: set[str] = field(default_factory=set)
    tokens: dict[str, Token] = field(default_factory=dict)
    refresh: dict[str, Token] = field(default_factory=dict)
    resource_servers: set[str] = field(default_factory=set)
    """Client ids allowed to introspect."""
    cimd_verify: Any = True
    """How CIMD documents' https is verified (an ``ssl.SSLContext`` for a test CA)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    registrations: int = 0
    _resource: str | None = None

    def __post_init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "as-1"
        server = _Server(self)
        server.register_grant(_CodeGrant, [CodeChallenge(required=True)])
        server.register_grant(_RefreshGrant)
        server.register_endpoint(_Introspection)
        server.register_endpoint(_Registration(claims_classes=[ClientMetadataClaims]))
        server.register_token_generator("default", self._generate)
        self.server = server

    # -- what it issues ---------------------------------------------------------------------------------

    def mint(self, sub: str, *, aud: str | None, scope: str = "", exp_in: float = 3600, client_id: str = "test") -> str:
        """An access token as this server issues them (a JWT, or opaque and registered for introspection)."""
        now = time.time()
        if self.opaque:
            token = secrets.token_urlsafe(32)
            self.tokens[token] = Token(token, None, client_id, scope, sub, aud, now, int(exp_in))
            return token
        claims = {
            "iss": self.url,
            "sub": sub,
            "aud": aud,
            "scope": scope,
            "client_id": client_id,
            "iat": int(now),
            "exp": int(now + exp_in),
            "jti": uuid.uuid4().hex,
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid, "typ": "at+jwt"})

    def _generate(
        self,
        grant_type: str,
        client: Client,
        user: Any = None,
        scope: str | None = None,
        expires_in: int | None = None,
        include_refresh_token: bool = True,
    ) -> dict[str, Any]:
        expires = expires_in or self.expires_in
        subject = user if isinstance(user, str) else self.default_user
        if self.opaque:
            access = secrets.token_urlsafe(32)
        else:
            access = self.mint(
                subject, aud=self._resource, scope=scope or "", exp_in=expires, client_id=client.client_id
            )
        token: dict[str, Any] = {"token_type": "Bearer", "access_token": access, "expires_in": expires}
        if scope:
            token["scope"] = scope
        if include_refresh_token and client.check_grant_type("refresh_token"):
            token["refresh_token"] = secrets.token_urlsafe(32)
        return token

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def metadata(self) -> dict[str, Any]:
        base = self.url
        doc: dict[str, Any] = {
            "issuer": base,
            "authorization_endpoint": base + "/authorize",
            "token_endpoint": base + "/token",
            "registration_endpoint": base + "/register",
            "introspection_endpoint": base + "/introspect",
            "jwks_uri": base + "/jwks",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "introspection_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "client_id_metadata_document_supported": True,
            "authorization_response_iss_parameter_supported": True,
        }
        if self.scopes_supported:
            doc["scopes_supported"] = list(self.scopes_supported)
        return doc

    def register(
        self, client_id: str, *, secret: str | None = None, redirect_uris: list[str], auth_method: str
    ) -> Client:
        """A pre-registered client."""
        client = Client(client_id, secret, list(redirect_uris), auth_method)
        self.clients[client_id] = client
        return client

    # -- Client ID Metadata Documents ------------------------------------------------------------------------

    async def _cimd(self, client_id: str) -> str | None:
        """Fetch and register the client a URL ``client_id`` names (None), or why it cannot be used."""
        if client_id in self.clients:
            return None
        try:
            async with httpx2.AsyncClient(verify=self.cimd_verify, timeout=5, follow_redirects=False) as http:
                r = await http.get(client_id, headers={"accept": "application/json"})
            doc = r.json()
        except (httpx2.HTTPError, ValueError) as exc:
            return f"cannot fetch the client metadata document: {exc}"
        if r.status_code != 200 or not isinstance(doc, dict) or doc.get("client_id") != client_id:
            return "the client metadata document does not name this client_id"
        uris = doc.get("redirect_uris")
        if not isinstance(uris, list) or not uris:
            return "the client metadata document has no redirect_uris"
        self.clients[client_id] = Client(
            client_id, None, [str(u) for u in uris], "none", name=doc.get("client_name", "")
        )
        return None

    # -- the ASGI front ----------------------------------------------------------------------------------

    def app(self) -> Callable[..., Any]:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            path, method = scope["path"], scope["method"]
            # Authlib reads headers by their canonical names: a case-insensitive mapping.
            headers: Any = httpx2.Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]])
            query = dict(parse_qsl(scope["query_string"].decode()))
            raw = await _body(receive)
            uri = f"{self.url}{path}" + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
            self.requests.append({"path": path, "method": method, "query": query, "headers": dict(headers)})
            if path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
                await _send(send, 200, self.metadata())
                return
            if path == "/jwks":
                await _send(send, 200, self.jwks())
                return
            try:
                if path == "/authorize" and method == "GET":
                    await self._authorize(uri, headers, query, send)
                    return
                if path == "/register" and method == "POST":
                    data = json.loads(raw or b"{}")
                    request = _JsonRequest(method, uri, headers, data if isinstance(data, dict) else {})
                    status, body, out = self.server.create_endpoint_response("client_registration", request)
                    await _send(send, status, body, out)
                    return
                form = dict(parse_qsl(raw.decode()))
                self.requests[-1]["form"] = form
                request = _Request(method, uri, headers, query, form)
                if path == "/token" and method == "POST":
                    self._resource = None
                    status, body, out = self.server.create_token_response(request)
                elif path == "/introspect" and method == "POST":
                    status, body, out = self.server.create_endpoint_response("introspection", request)
                else:
                    status, body, out = 404, {"error": "not_found"}, []
            except OAuth2Error as error:
                status, body, out = error.status_code, dict(error.get_body()), list(error.get_headers())
            await _send(send, status, body, out)

        return app

    async def _authorize(self, uri: str, headers: dict[str, str], query: dict[str, str], send: Any) -> None:
        client_id = query.get("client_id", "")
        if client_id.startswith("https://"):
            why = await self._cimd(client_id)
            if why is not None:
                await _send(send, 400, {"error": "invalid_client", "error_description": why})
                return
        cookie = SimpleCookie(headers.get("cookie", ""))
        user = cookie["user"].value if "user" in cookie else self.default_user
        request = _Request("GET", uri, headers, query, {})
        try:
            grant = self.server.get_consent_grant(request, end_user=user)
        except OAuth2Error as error:
            await _send(send, error.status_code, dict(error.get_body()))
            return
        status, _, out = self.server.create_authorization_response(request, grant_user=user, grant=grant)
        out = [(k, v) for k, v in out]
        for i, (k, v) in enumerate(out):
            if k.lower() == "location" and "code=" in v:
                out[i] = (k, v + "&" + urlencode({"iss": self.url}))  # RFC 9207
        await _send(send, status, b"", out)


async def _send(send: Any, status: int, body: Any, headers: Any = ()) -> None:
    data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    out = [(k.encode() if isinstance(k, str) else k, v.encode() if isinstance(v, str) else v) for k, v in headers]
    if not any(k.lower() == b"content-type" for k, _ in out) and data:
        out.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data})


@asynccontextmanager
async def auth_server(**kw: Any) -> AsyncIterator[AuthServer]:
    """An :class:`AuthServer` on a free port of 127.0.0.1."""
    server = AuthServer(**kw)
    async with serving(server.app()) as base:
        server.url = base
        yield server
