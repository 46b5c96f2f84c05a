"""mcpipe as an OAuth client of the downstream servers that require it (``mcpServers.NAME.oauth``;
``docs/access.md``), as the MCP authorization spec has a client do it:

1. **Discovery**, once per server (kept an hour): a request without a token, whose 401 names the protected
   resource metadata (RFC 9728; else the path-aware and root well-known URIs); the metadata's ``resource``
   must be the server's URL (RFC 8707); then the authorization server's metadata (RFC 8414, path-aware, then
   OpenID discovery), whose ``issuer`` must be the one named (RFC 8414 §3.3). The server's own URL is the
   operator's; every URL learned from metadata is held to ``allow_private`` (metadata pointing at a private or
   link-local address is refused).
2. **The client**, once per server for every principal: the configured one (pre-registration), else mcpipe's
   client id metadata document (``[oauth] client_metadata_url``, where the server supports them), else
   dynamic registration (RFC 7591), kept in the store.
3. **Sign-in**, per principal: an authorization URL with PKCE (S256), ``resource``, the scope (the server's
   challenge, else its ``scopes_supported``), and a ``state`` that names a pending sign-in kept in the store,
   bound to the principal and the request, used once, expiring with ``sign_in_timeout_s``. The callback
   (``[oauth] callback_path``) takes the state back, checks ``iss`` (RFC 9207), exchanges the code and keeps
   the tokens under the principal who started it, never another.
4. **Tokens**, sealed in the store per server and principal, refreshed ``refresh_before_s`` before they
   expire (one refresh at a time per principal), revocable (``mcpipe auth revoke``).

Bounds: ``max_pending_per_principal`` sign-ins under way per principal (the oldest is dropped), ``max_pending``
in this process; a principal asking 10 000 times registers nothing more and holds a handful of entries.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

import orjson
import trio

from mcpipe.access import FetchError, fetch
from mcpipe.errors import ErrorCode, MCPipeError
from mcpipe.store.tokens import TokenStore, Vault, VaultError, principal_key

if TYPE_CHECKING:
    from mcpipe.config import Config, DownstreamOAuth

__all__ = ["OPERATOR", "OAuthClients", "ServerAuth", "SignInError", "SignInRequired"]

_log = logging.getLogger("mcpipe.oauth")

OPERATOR = "_operator"
"""The principal of the operator's shared account (``mcpipe auth login SERVER``), and of local callers."""

DISCOVERY_TTL_S = 3600.0
MCP_PROTOCOL = "2025-11-25"


class SignInError(MCPipeError):
    """A sign-in or a token request failed (the call fails with ``TOOL_FAILED``, the reason said)."""

    code: str = ErrorCode.TOOL_FAILED


class SignInRequired(SignInError):
    """The caller must sign in to a server first, and cannot be asked here (no URL-mode elicitation): the
    elicitation it is to open (answered as JSON-RPC -32042 to a direct call)."""

    def __init__(self, server: str, url: str, elicitation_id: str) -> None:
        super().__init__(f"sign in to MCP server '{server}' first: open {url}")
        self.server, self.url, self.elicitation_id = server, url, elicitation_id

    def elicitation(self) -> dict[str, str]:
        return {
            "mode": "url",
            "elicitationId": self.elicitation_id,
            "url": self.url,
            "message": f"Sign in to {self.server} to continue.",
        }


@dataclass(frozen=True, slots=True)
class Discovered:
    """What a server's metadata said."""

    resource: str
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None
    revocation_endpoint: str | None
    scope: str | None
    cimd: bool
    iss_supported: bool
    auth_methods: tuple[str, ...]
    at: float


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _challenge_field(header: str, name: str) -> str | None:
    import re

    m = re.search(rf'{name}=(?:"([^"]*)"|([^\s,]+))', header)
    return (m.group(1) or m.group(2)) if m else None


def _canonical(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{path}"


class ServerAuth:
    """One downstream server's OAuth (see the module docstring).

    Args:
        name: the server's name in ``mcpServers``.
        url: its MCP endpoint.
        cfg: its ``oauth`` table.
        clients: the machinery it belongs to (store, vault, callback, bounds).
    """

    def __init__(self, name: str, url: str, cfg: DownstreamOAuth, clients: OAuthClients) -> None:
        self.name, self.url, self.cfg, self.clients = name, url, cfg, clients
        self._discovered: Discovered | None = None
        self._lock = trio.Lock()
        self._refreshing: dict[str, trio.Lock] = {}
        self.signed_in: dict[str, trio.Event] = {}
        """principal -> an event set when its sign-in completes in this process."""
        self.wanted: dict[str, str] = {}
        """principal -> the scopes its next sign-in asks for (granted ones, and what a 403 challenged)."""

    @property
    def per_user(self) -> bool:
        return bool(self.cfg.per_user)

    async def _get(self, url: str, what: str) -> Any:
        got = await fetch(
            "GET",
            url,
            timeout_ms=self.clients.timeout_ms,
            allow_private=self.cfg.allow_private,
            headers={"mcp-protocol-version": MCP_PROTOCOL},
        )
        if got.status != 200:
            return None
        try:
            doc = orjson.loads(got.body)
        except orjson.JSONDecodeError:
            raise FetchError(f"{what} at {url} is not JSON") from None
        return doc if isinstance(doc, dict) else None

    # -- discovery -----------------------------------------------------------------------------------

    async def discover(self) -> Discovered:
        """The server's metadata (fetched once an hour, one fetch at a time).

        Raises:
            SignInError: the server does not say how to sign in, or says so wrongly.
        """
        hit = self._discovered
        if hit is not None and time.time() - hit.at < DISCOVERY_TTL_S:
            return hit
        async with self._lock:
            hit = self._discovered
            if hit is not None and time.time() - hit.at < DISCOVERY_TTL_S:
                return hit
            try:
                found = await self._discover()
            except FetchError as exc:
                raise SignInError(f"MCP server '{self.name}': OAuth discovery failed: {exc}") from None
            self._discovered = found
            return found

    async def _discover(self) -> Discovered:
        where = f"MCP server '{self.name}'"
        # The server's URL is the operator's: its probe may reach a private address; what it names may not.
        probe = await fetch(
            "POST",
            self.url,
            timeout_ms=self.clients.timeout_ms,
            allow_private=True,
            json={"jsonrpc": "2.0", "id": 0, "method": "ping"},
            headers={"accept": "application/json, text/event-stream", "mcp-protocol-version": MCP_PROTOCOL},
        )
        challenge = probe.headers.get("www-authenticate", "") if probe.status in (401, 403) else ""
        metadata_url = _challenge_field(challenge, "resource_metadata")
        challenged_scope = _challenge_field(challenge, "scope")
        parts = urlsplit(self.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        candidates = [metadata_url] if metadata_url else []
        if parts.path and parts.path != "/":
            candidates.append(f"{origin}/.well-known/oauth-protected-resource{parts.path.rstrip('/')}")
        candidates.append(f"{origin}/.well-known/oauth-protected-resource")
        prm = None
        for i, candidate in enumerate(candidates):
            # The challenge's URL is the server's word; the well-known ones are on the operator's server.
            allow = self.cfg.allow_private or (i > 0 or metadata_url is None) or _same_origin(candidate, self.url)
            got = await fetch(
                "GET",
                candidate,
                timeout_ms=self.clients.timeout_ms,
                allow_private=allow,
                headers={"mcp-protocol-version": MCP_PROTOCOL},
            )
            if got.status == 200:
                try:
                    prm = orjson.loads(got.body)
                except orjson.JSONDecodeError:
                    prm = None
                if isinstance(prm, dict):
                    break
                prm = None
        if prm is None:
            raise FetchError(f"{where} publishes no protected resource metadata (RFC 9728)")
        resource = prm.get("resource")
        if not isinstance(resource, str) or not _within(self.url, resource):
            raise FetchError(f"its protected resource metadata names resource {resource!r}, not {self.url!r}")
        servers = prm.get("authorization_servers")
        if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
            raise FetchError("its protected resource metadata names no authorization server")
        issuer = servers[0]
        if not issuer.startswith(("https://", "http://")):
            raise FetchError(f"authorization server {issuer!r} is not an http(s) URL")
        asm = None
        for candidate in _as_metadata_urls(issuer):
            asm = await self._get(candidate, "the authorization server's metadata")
            if asm is not None:
                break
        if asm is None:
            raise FetchError(f"authorization server {issuer} publishes no metadata (RFC 8414)")
        if asm.get("issuer") != issuer:
            raise FetchError(f"the authorization server's metadata names issuer {asm.get('issuer')!r}, not {issuer!r}")
        endpoints = {}
        for key in ("authorization_endpoint", "token_endpoint", "registration_endpoint", "revocation_endpoint"):
            value = asm.get(key)
            if value is not None and (not isinstance(value, str) or not value.startswith(("https://", "http://"))):
                raise FetchError(f"the authorization server's `{key}` is not an http(s) URL")
            endpoints[key] = value
        if endpoints["authorization_endpoint"] is None or endpoints["token_endpoint"] is None:
            raise FetchError("the authorization server's metadata has no authorization or token endpoint")
        methods = asm.get("code_challenge_methods_supported")
        if isinstance(methods, list) and "S256" not in methods:
            raise FetchError("the authorization server does not support PKCE with S256")
        scope = challenged_scope
        supported = prm.get("scopes_supported")
        if scope is None and isinstance(supported, list):
            scope = " ".join(s for s in supported if isinstance(s, str)) or None
        auth_methods = asm.get("token_endpoint_auth_methods_supported")
        return Discovered(
            resource=resource,
            issuer=issuer,
            authorization_endpoint=endpoints["authorization_endpoint"],
            token_endpoint=endpoints["token_endpoint"],
            registration_endpoint=endpoints["registration_endpoint"],
            revocation_endpoint=endpoints["revocation_endpoint"],
            scope=scope,
            cimd=asm.get("client_id_metadata_document_supported") is True,
            iss_supported=asm.get("authorization_response_iss_parameter_supported") is True,
            auth_methods=tuple(m for m in auth_methods if isinstance(m, str))
            if isinstance(auth_methods, list)
            else ("client_secret_basic",),
            at=time.time(),
        )

    # -- the client ----------------------------------------------------------------------------------

    async def client(self, found: Discovered) -> dict[str, Any]:
        """mcpipe's client at the server's authorization server: ``client_id``, ``client_secret``, ``method``."""
        cfg = self.cfg
        if cfg.client_id:
            secret = self.clients.secret(cfg.client_secret, cfg.client_secret_env)
            method = cfg.token_endpoint_auth_method or ("client_secret_basic" if secret else "none")
            return {"client_id": cfg.client_id, "client_secret": secret, "method": method}
        metadata_url = self.clients.client_metadata_url
        if metadata_url is not None and found.cimd:
            return {"client_id": metadata_url, "client_secret": None, "method": "none"}
        key = f"client:{self.name}"
        async with self._lock:
            known = await self.clients.load(key)
            if known is not None and known.get("issuer") == found.issuer:
                return known
            if found.registration_endpoint is None:
                raise SignInError(
                    f"MCP server '{self.name}': its authorization server takes no registrations; configure "
                    f"`mcpServers.{self.name}.oauth.client_id`"
                )
            method = (
                "client_secret_basic"
                if "client_secret_basic" in found.auth_methods
                else ("client_secret_post" if "client_secret_post" in found.auth_methods else "none")
            )
            request = {
                "client_name": self.clients.client_name,
                "application_type": "web",  # SEP-837: a server-side client, its redirect URI its own
                "redirect_uris": [self.clients.callback_url],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": method,
            }
            if found.scope:
                request["scope"] = found.scope
            try:
                got = await fetch(
                    "POST",
                    found.registration_endpoint,
                    timeout_ms=self.clients.timeout_ms,
                    allow_private=self.cfg.allow_private,
                    json=request,
                )
                doc = orjson.loads(got.body) if got.status in (200, 201) else None
            except (FetchError, orjson.JSONDecodeError) as exc:
                raise SignInError(f"MCP server '{self.name}': client registration failed: {exc}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("client_id"), str):
                raise SignInError(f"MCP server '{self.name}': client registration answered HTTP {got.status}")
            registered = {
                "client_id": doc["client_id"],
                "client_secret": doc.get("client_secret") if isinstance(doc.get("client_secret"), str) else None,
                "method": doc.get("token_endpoint_auth_method") or method,
                "issuer": found.issuer,
            }
            await self.clients.save(key, registered)
            return registered

    def _client_auth(self, client: Mapping[str, Any], form: dict[str, str], issuer: str = "") -> dict[str, str]:
        headers: dict[str, str] = {}
        method, secret = client.get("method"), client.get("client_secret")
        if method == "private_key_jwt":
            import uuid

            import jwt

            key = self.clients.secret(None, self.cfg.private_key_env)
            if not key:
                raise SignInError(f"MCP server '{self.name}': `private_key_env` holds no private key")
            now = int(time.time())
            claims = {
                "iss": client["client_id"],
                "sub": client["client_id"],
                "aud": issuer,
                "iat": now,
                "exp": now + 300,
                "jti": uuid.uuid4().hex,
            }
            try:
                assertion = jwt.encode(claims, key, algorithm=self.cfg.signing_algorithm)
            except (ValueError, TypeError, jwt.PyJWTError) as exc:
                raise SignInError(f"MCP server '{self.name}': cannot sign the client assertion: {exc}") from None
            form["client_id"] = client["client_id"]
            form["client_assertion_type"] = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
            form["client_assertion"] = assertion
        elif method == "client_secret_basic" and secret:
            pair = f"{quote(client['client_id'], safe='')}:{quote(secret, safe='')}"
            headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif method == "client_secret_post" and secret:
            form["client_id"] = client["client_id"]
            form["client_secret"] = secret
        else:
            form["client_id"] = client["client_id"]
        return headers

    # -- sign-in -------------------------------------------------------------------------------------

    async def begin(self, principal: str, request_id: str | None) -> tuple[str, str]:
        """Start a sign-in for ``principal``: the authorization URL and the elicitation id.

        Raises:
            SignInError: discovery, registration, or the bound on sign-ins under way.
        """
        found = await self.discover()
        client = await self.client(found)
        verifier = _b64url(secrets.token_bytes(48))
        state = _b64url(secrets.token_bytes(32))
        elicitation_id = secrets.token_hex(16)
        scope = " ".join(self.cfg.scopes) if self.cfg.scopes else found.scope
        wanted = self.wanted.get(principal)
        if wanted:  # a step-up (SEP-2350): what was granted, and what the server challenged for
            scope = " ".join(dict.fromkeys([*(scope or "").split(), *wanted.split()]))
        pending = {
            "server": self.name,
            "principal": principal,
            "request": request_id,
            "verifier": verifier,
            "issuer": found.issuer,
            "elicitation": elicitation_id,
            "created": time.time(),
        }
        await self.clients.hold(state, principal, pending)
        params = {
            "response_type": "code",
            "client_id": client["client_id"],
            "redirect_uri": self.clients.callback_url,
            "state": state,
            "code_challenge": _b64url(hashlib.sha256(verifier.encode()).digest()),
            "code_challenge_method": "S256",
            "resource": found.resource,
        }
        if scope:
            params["scope"] = scope
        sep = "&" if "?" in found.authorization_endpoint else "?"
        return f"{found.authorization_endpoint}{sep}{urlencode(params)}", elicitation_id

    async def finish(self, pending: Mapping[str, object], code: str, iss: str | None) -> None:
        """Exchange the callback's code for the pending sign-in's principal and keep its tokens.

        Raises:
            SignInError: the issuer is not the one asked, or the token endpoint refused.
        """
        found = await self.discover()
        if pending.get("issuer") != found.issuer:
            raise SignInError("the authorization server changed during the sign-in")
        if iss is not None and iss != found.issuer:
            raise SignInError(f"the authorization response names issuer {iss!r}, not {found.issuer!r} (RFC 9207)")
        if iss is None and found.iss_supported:
            raise SignInError("the authorization response has no `iss`, which its server promised (RFC 9207)")
        client = await self.client(found)
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.clients.callback_url,
            "code_verifier": str(pending["verifier"]),
            "resource": found.resource,
        }
        doc = await self._token_request(found, client, form, "the code exchange")
        principal = str(pending["principal"])
        await self._keep(principal, doc, None)
        event = self.signed_in.pop(principal, None)
        if event is not None:
            event.set()

    async def _token_request(
        self, found: Discovered, client: Mapping[str, object], form: dict[str, str], what: str
    ) -> dict[str, Any]:
        headers = self._client_auth(client, form, found.issuer)
        try:
            got = await fetch(
                "POST",
                found.token_endpoint,
                timeout_ms=self.clients.timeout_ms,
                allow_private=self.cfg.allow_private,
                data=form,
                headers=headers,
            )
            doc = orjson.loads(got.body)
        except (FetchError, orjson.JSONDecodeError) as exc:
            raise SignInError(f"MCP server '{self.name}': {what} failed: {exc}") from None
        if got.status != 200 or not isinstance(doc, dict):
            error = doc.get("error") if isinstance(doc, dict) and isinstance(doc.get("error"), str) else None
            suffix = f" ({error})" if error else ""
            raise SignInError(f"MCP server '{self.name}': {what} answered HTTP {got.status}{suffix}")
        token = doc.get("access_token")
        if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
            raise SignInError(f"MCP server '{self.name}': {what} answered no usable access_token")
        return doc

    async def _keep(
        self, principal: str, doc: Mapping[str, object], previous: Mapping[str, object] | None
    ) -> dict[str, Any]:
        expires_in = doc.get("expires_in")
        seconds = (
            float(expires_in) if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) else 3600.0
        )
        record = {
            "principal": principal,
            "server": self.name,
            "access_token": doc["access_token"],
            "token_type": doc.get("token_type") or "Bearer",
            "refresh_token": doc.get("refresh_token") or (previous or {}).get("refresh_token"),
            "scope": doc.get("scope") or (previous or {}).get("scope"),
            "expires_at": time.time() + seconds,
            "obtained_at": time.time(),
        }
        await self.clients.save(self.clients.token_key(self.name, principal), record)
        return record

    # -- tokens --------------------------------------------------------------------------------------

    def _fresh(self, record: Mapping[str, Any]) -> bool:
        """Whether a token needs no refresh yet: it expires later than ``refresh_before_s`` from now, or than
        half its lifetime (a server issuing 30-second tokens is not asked again on every call)."""
        lifetime = float(record["expires_at"]) - float(record.get("obtained_at") or record["expires_at"])
        margin = min(self.clients.refresh_before_s, max(lifetime, 0.0) / 2)
        return float(record["expires_at"]) - time.time() > margin

    async def token(self, principal: str) -> str | None:
        """The principal's access token, refreshed when it is about to expire; None: it must sign in."""
        if self.cfg.grant == "client_credentials":
            return await self.machine_token()
        key = self.clients.token_key(self.name, principal)
        record = await self.clients.load(key)
        if record is None:
            return None
        if self._fresh(record):
            return str(record["access_token"])
        lock = self._refreshing.setdefault(principal, trio.Lock())
        async with lock:
            record = await self.clients.load(key)
            if record is None:
                return None
            if self._fresh(record):
                return str(record["access_token"])
            refresh = record.get("refresh_token")
            if not refresh:
                if record["expires_at"] > time.time():
                    return str(record["access_token"])
                await self.clients.store.delete(key)
                return None
            try:
                found = await self.discover()
                client = await self.client(found)
                form = {"grant_type": "refresh_token", "refresh_token": str(refresh), "resource": found.resource}
                doc = await self._token_request(found, client, form, "the token refresh")
            except SignInError as exc:
                _log.warning("%s; the principal signs in again", exc)
                await self.clients.store.delete(key)
                return None
            finally:
                if not lock.statistics().tasks_waiting:
                    self._refreshing.pop(principal, None)
            record = await self._keep(principal, doc, record)
            return str(record["access_token"])

    async def forget(self, principal: str) -> bool:
        """Drop the principal's tokens (``mcpipe auth revoke``)."""
        return await self.clients.store.delete(self.clients.token_key(self.name, principal))

    async def rejected(self, principal: str, status: int, challenge: str) -> None:
        """The server refused the principal's token: 401 (revoked, expired early, or another authorization
        server now: discovery is done again), or 403 ``insufficient_scope`` (the next sign-in asks for the
        challenged scope beside what was granted). The token is dropped: the principal signs in again."""
        key = self.clients.token_key(self.name, principal)
        record = await self.clients.load(key)
        if status == 403:
            if _challenge_field(challenge, "error") != "insufficient_scope":
                return
            granted = (record or {}).get("scope") or ""
            challenged = _challenge_field(challenge, "scope") or ""
            self.wanted[principal] = " ".join(dict.fromkeys([*granted.split(), *challenged.split()]))
            if len(self.wanted) > 100_000:
                self.wanted.pop(next(iter(self.wanted)))
        else:
            self._discovered = None  # the server may have moved to another authorization server (SEP-2352)
        await self.clients.store.delete(key)

    async def machine_token(self) -> str:
        """mcpipe's own token (``grant = "client_credentials"``), requested again shortly before it expires.

        Raises:
            SignInError: the token endpoint refused, or the server's metadata is wrong.
        """
        key = self.clients.token_key(self.name, OPERATOR)
        record = await self.clients.load(key)
        if record is not None and self._fresh(record):
            return str(record["access_token"])
        lock = self._refreshing.setdefault(OPERATOR, trio.Lock())
        async with lock:
            record = await self.clients.load(key)
            if record is not None and self._fresh(record):
                return str(record["access_token"])
            found = await self.discover()
            cfg = self.cfg
            secret = self.clients.secret(cfg.client_secret, cfg.client_secret_env)
            method = cfg.token_endpoint_auth_method or (
                "private_key_jwt" if cfg.private_key_env else "client_secret_basic" if secret else "none"
            )
            client = {"client_id": cfg.client_id, "client_secret": secret, "method": method}
            form = {"grant_type": "client_credentials", "resource": found.resource}
            scope = " ".join(cfg.scopes) if cfg.scopes else found.scope
            if scope:
                form["scope"] = scope
            doc = await self._token_request(found, client, form, "the client credentials grant")
            record = await self._keep(OPERATOR, doc, None)
            return str(record["access_token"])

    async def wait_signed_in(self, principal: str, timeout_s: float) -> bool:
        """Wait until the principal's sign-in completes (here, or on another instance sharing the store)."""
        with trio.move_on_after(timeout_s):
            while await self.clients.load(self.clients.token_key(self.name, principal)) is None:
                event = self.signed_in.setdefault(principal, trio.Event())
                with trio.move_on_after(1.0):  # another instance may take the callback: look at the store again
                    await event.wait()
            return True
        return False


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.netloc) == (pb.scheme, pb.netloc)


def _within(server_url: str, resource: str) -> bool:
    """RFC 8707 / the MCP spec: the metadata's resource is the server's URL, or one of its parents."""
    server, res = _canonical(server_url), _canonical(resource)
    if server == res:
        return True
    return _same_origin(server, res) and server.startswith(res.rstrip("/") + "/")


def _as_metadata_urls(issuer: str) -> list[str]:
    parts = urlsplit(issuer)
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if path:
        return [
            f"{base}/.well-known/oauth-authorization-server{path}",
            f"{base}/.well-known/openid-configuration{path}",
            f"{base}{path}/.well-known/openid-configuration",
        ]
    return [f"{base}/.well-known/oauth-authorization-server", f"{base}/.well-known/openid-configuration"]


_DONE_PAGE = (
    b"<!doctype html><meta charset=utf-8><title>Signed in</title>"
    b"<p>You are signed in. You can close this page and go back to your client.</p>"
)


def _page(message: str) -> bytes:
    import html

    return (
        b"<!doctype html><meta charset=utf-8><title>Sign-in failed</title><p>" + html.escape(message).encode() + b"</p>"
    )


class OAuthClients:
    """Every downstream server's OAuth, one store and vault, the callback (see the module docstring).

    Args:
        config: the config (``[oauth]`` and ``mcpServers``).
        store: where tokens, registrations and sign-ins under way are kept.
        vault: what seals them.
        callback_url: the redirect URI (``[oauth] callback_url`` or its default).
    """

    def __init__(self, config: Config, store: TokenStore, vault: Vault, callback_url: str) -> None:
        o = config.oauth
        self.store, self.vault = store, vault
        self.callback_url = callback_url
        self.callback_path = urlsplit(callback_url).path or o.callback_path
        self.client_name = o.client_name
        self.client_metadata_url = o.client_metadata_url
        self.timeout_ms = o.timeout_ms
        self.sign_in_timeout_s = o.sign_in_timeout_s
        self.max_pending_per_principal = o.max_pending_per_principal
        self.max_pending = o.max_pending
        self.refresh_before_s = o.refresh_before_s
        self.environ: Mapping[str, str] | None = None
        self.servers = {
            name: ServerAuth(name, server.url or "", server.oauth, self)
            for name, server in config.mcpServers.items()
            if server.oauth is not None and server.url
        }
        self._pending: dict[str, float] = {}
        """state hash -> expiry, of the sign-ins this process started (``max_pending`` bounds them)."""

    def secret(self, value: str | None, env: str | None) -> str | None:
        import os

        if env is not None:
            return (self.environ or os.environ).get(env) or None
        return value or None

    @staticmethod
    def token_key(server: str, principal: str) -> str:
        return f"token:{server}:{principal_key(principal)}"

    async def load(self, key: str) -> dict[str, Any] | None:
        sealed = await self.store.get(key)
        if sealed is None:
            return None
        try:
            doc = orjson.loads(self.vault.open(key, sealed))
        except (VaultError, orjson.JSONDecodeError):
            _log.warning("oauth store: the entry %s does not open with this key ring; it is ignored", key.split(":")[0])
            return None
        return doc if isinstance(doc, dict) else None

    async def save(self, key: str, value: Mapping[str, object], expires_at: float | None = None) -> None:
        await self.store.put(key, self.vault.seal(key, orjson.dumps(dict(value))), expires_at)

    # -- sign-ins under way --------------------------------------------------------------------------

    async def hold(self, state: str, principal: str, pending: Mapping[str, object]) -> None:
        """Keep a sign-in under way (bounded: per principal, the oldest goes; in all, a new one is refused)."""
        now = time.time()
        if len(self._pending) >= self.max_pending:
            self._pending = {k: v for k, v in self._pending.items() if v > now}
            if len(self._pending) >= self.max_pending:
                raise SignInError(f"too many sign-ins under way ({self.max_pending}); try again later")
        digest = hashlib.sha256(state.encode()).hexdigest()
        expires = now + self.sign_in_timeout_s
        index = f"pidx:{principal_key(principal)}:"
        mine = await self.store.keys(index)
        if len(mine) >= self.max_pending_per_principal:
            dated = []
            for key in mine:
                entry = await self.load(key)
                dated.append((float(entry["created"]) if entry else 0.0, key))
            dated.sort()
            for _, key in dated[: len(mine) - self.max_pending_per_principal + 1]:
                old = key.rsplit(":", 1)[1]
                await self.store.delete(key)
                await self.store.delete("pending:" + old)
                self._pending.pop(old, None)
        await self.save("pending:" + digest, pending, expires)
        await self.save(index + digest, {"created": pending["created"]}, expires)
        self._pending[digest] = expires

    async def take(self, state: str) -> dict[str, Any] | None:
        """The sign-in a callback's ``state`` names, removed (a state works once); None: unknown or used."""
        digest = hashlib.sha256(state.encode()).hexdigest()
        key = "pending:" + digest
        pending = await self.load(key)
        if pending is None or not await self.store.delete(key):
            return None  # unknown, expired, or another callback took it first
        await self.store.delete(f"pidx:{principal_key(str(pending['principal']))}:{digest}")
        self._pending.pop(digest, None)
        return pending

    async def callback(self, query: Mapping[str, str]) -> tuple[int, bytes]:
        """The redirect URI: ``(status, html)``. The state must name a sign-in under way; the tokens go to
        the principal who started it."""
        state = query.get("state")
        if not state:
            return 400, _page("This sign-in link has no state: start the sign-in again from your client.")
        pending = await self.take(state)
        if pending is None:
            return 400, _page("This sign-in is unknown, expired or already used: start it again from your client.")
        server = self.servers.get(str(pending.get("server")))
        if server is None:
            return 400, _page("This sign-in is for a server that is no longer configured.")
        if "error" in query:
            return 400, _page(f"The authorization server refused the sign-in: {query['error'][:100]}")
        code = query.get("code")
        if not code:
            return 400, _page("The authorization server sent no code.")
        try:
            await server.finish(pending, code, query.get("iss"))
        except SignInError as exc:
            _log.warning("sign-in to %s failed: %s", server.name, exc)
            return 400, _page(f"The sign-in failed: {exc}")
        _log.info("a principal signed in to MCP server %s", server.name)
        return 200, _DONE_PAGE

    def client_metadata(self) -> dict[str, Any]:
        """mcpipe's client id metadata document (served at the path of ``client_metadata_url``)."""
        return {
            "client_id": self.client_metadata_url,
            "client_name": self.client_name,
            "redirect_uris": [self.callback_url],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }

    # -- the operator's commands ---------------------------------------------------------------------

    async def list(self) -> list[dict[str, Any]]:
        """Every principal's tokens per server (never the tokens): ``server``, ``principal``, ``scope``,
        ``expires_at``, ``refreshable``."""
        out = []
        for key in await self.store.keys("token:"):
            record = await self.load(key)
            if record is None:
                continue
            out.append(
                {
                    "server": record.get("server"),
                    "principal": record.get("principal"),
                    "scope": record.get("scope"),
                    "expires_at": record.get("expires_at"),
                    "refreshable": bool(record.get("refresh_token")),
                }
            )
        return sorted(out, key=lambda r: (str(r["server"]), str(r["principal"])))
