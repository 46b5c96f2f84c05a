"""Streamable HTTP: the SDK's session manager behind a small ASGI front, served by hypercorn's trio worker.

The front does three things before a request reaches the SDK: ``/healthz``, ``/metrics`` and ``/workflow``;
bearer-token auth (the token's principal goes into the ASGI scope, where the tool handlers read it, and into
``scope["user"]``, so the SDK binds each 2025-11-25 session to the credential that opened it); and 404 for
every other path. Both protocol eras are the session manager's: a 2026-07-28 request
(``MCP-Protocol-Version`` header) is served statelessly, anything else through ``initialize`` and a session.

Every route gets the same front checks as MCP: DNS-rebinding protection (the Host header must name this
server, a browser's Origin too: on by default; a POST must be ``application/json``, so a cross-site form or
``text/plain`` post cannot reach a route), and a request body must arrive within ``body_timeout_s``.
``/healthz`` answers any Host (a load balancer's probe names the address it dialled), but says only
``{"ok": true}`` to a Host it does not know. Connections are bounded below the descriptor limit
(:mod:`mcpipe.server._listen`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import orjson
import trio
from hypercorn.config import Config as HypercornConfig
from starlette.types import Receive, Scope, Send

from mcpipe._jsonschema import warm
from mcpipe.access import Authenticator, Rejected, missing_scopes, principal_key
from mcpipe.config import Config, RegistryConfig
from mcpipe.console import API_PREFIX, CONSOLE_PREFIX
from mcpipe.formats import serves_workflow
from mcpipe.server._app import App
from mcpipe.server._core import ADDRESSES_SCOPE_KEY, IDENTITY_SCOPE_KEY, PRINCIPAL_SCOPE_KEY
from mcpipe.server._early import EarlyAnswers, HostCheck, allowed, replaying
from mcpipe.server._listen import default_max_connections, serve_bounded
from mcpipe.server._resource import ResourceServer, call_target, is_pipe
from mcpipe.telemetry import current as current_telemetry
from mcpipe.telemetry import metrics_text
from mcpipe.tools import Identity

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from mcpipe.server._fast import FastToolCall

__all__ = ["HttpFront", "security_settings", "serve_http", "signalled", "tokens_from_env"]

_log = logging.getLogger("mcpipe.http")


GRACEFUL_TIMEOUT_S = 2.0
"""How long in-flight requests and open streams get after SIGINT/SIGTERM before they are cancelled."""

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def tokens_from_env(config: Config, environ: dict[str, str] | None = None) -> dict[bytes, str]:
    """token digest -> principal, for every configured token whose variable is set.

    Tokens are kept only as SHA-256 digests: the lookup compares digests, so neither a log line nor a
    timing difference can give a token away.
    """
    env = os.environ if environ is None else environ
    out: dict[bytes, str] = {}
    for t in config.auth.tokens:
        value = env.get(t.env)
        if value:
            out[_digest(value)] = t.principal
        else:
            _log.warning("auth token variable %s is not set; that principal cannot log in", t.env)
    return out


def _secret(value: str | None, env: str | None) -> str:
    if env is not None:
        return os.environ.get(env, "")
    return value or ""


def security_settings(config: Config, host: str) -> HostCheck:
    """DNS-rebinding protection: the Host header must name this server, and a browser Origin too.

    Defaults allow the loopback names on any port, plus the bound host when it is not a wildcard;
    behind a proxy, list the public names in ``http.allowed_hosts`` / ``http.allowed_origins``.
    """
    h = config.http
    if not h.dns_rebinding_protection:
        return HostCheck(enable_dns_rebinding_protection=False)
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    if host not in _LOOPBACK and host not in ("0.0.0.0", "::", ""):
        name = f"[{host}]" if ":" in host else host
        hosts.append(f"{name}:*")
        origins += [f"http://{name}:*", f"https://{name}:*"]
    if h.allowed_hosts is not None:
        hosts = list(h.allowed_hosts)
    if h.allowed_origins is not None:
        origins = list(h.allowed_origins)
    return HostCheck(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    extra = headers or []
    typed = any(k == b"content-type" for k, _ in extra)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": ([] if typed else [(b"content-type", b"application/json")])
            + [(b"content-length", str(len(body)).encode())]
            + extra,
        }
    )
    await send({"type": "http.response.body", "body": body})


REGISTRY_PATH = "/v0.1/servers/"
"""The MCP registry API's servers (``registry``)."""


def _version() -> str:
    from mcpipe._version import __version__

    return __version__


def registry_entry(cfg: RegistryConfig) -> dict[str, Any] | None:
    """The registry entry this server publishes (None without its ``url``)."""
    if not cfg.url:
        return None
    server: dict[str, Any] = {
        "name": cfg.name,
        "version": _version(),
        "remotes": [{"type": "streamable-http", "url": cfg.url}],
    }
    if cfg.description is not None:
        server["description"] = cfg.description
    return {
        "server": server,
        "_meta": {"io.modelcontextprotocol.registry/official": {"status": "active", "isLatest": True}},
    }


WEBHOOK_PATH = "/webhooks/resource-updated/"
"""Where third parties tell mcpipe a watched resource changed (``<path><token>``, mcpg's route)."""
_UNKNOWN_TOKEN = orjson.dumps({"error": "unknown webhook token"})
_FORBIDDEN_ORIGIN = orjson.dumps({"error": "forbidden", "error_description": "this origin may not call the server"})
_UNAUTHORIZED = orjson.dumps({"error": "unauthorized", "error_description": "a valid bearer token is required"})
_INVALID_TOKEN = orjson.dumps(
    {"error": "invalid_token", "error_description": "the access token is invalid, expired or not for this resource"}
)
_UNAVAILABLE = orjson.dumps(
    {"error": "temporarily_unavailable", "error_description": "the access token cannot be checked now"}
)
_REJECTED_KEY = "mcpipe.rejected"
_HTML = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),
]
_NOT_FOUND = orjson.dumps({"error": "not found"})


class Body(NamedTuple):
    """A request body as read: ``more`` when it went on past the limit, ``gone`` when the client left."""

    data: bytes
    more: bool
    gone: bool = False


async def read_body(receive: Receive, *, max_bytes: int, timeout_s: float) -> Body | None:
    """Read a request body within ``timeout_s`` in all (a client trickling its body cannot hold a request
    open), stopping once past ``max_bytes``; None when the deadline passed."""
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout_s):
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return Body(b"", False, gone=True)
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
            if size > max_bytes:
                break
        return Body(b"".join(chunks), more)
    return None


_BOM = b"\xef\xbb\xbf"


def _drop_length(scope: Scope) -> None:
    """Forget the request's ``content-length`` once its body was changed (the body is replayed whole)."""
    scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]


class HttpFront:
    """The ASGI app: ``/healthz``, bearer auth, then the SDK's streamable HTTP transport at ``path``.

    Args:
        app: the running mcpipe.
        manager: the SDK session manager (entered with ``manager.run()`` by whoever serves this); None while
            the SDK loads (:meth:`serve_sdk` gives it): until then ``early`` answers what it can and every other
            MCP request waits for it.
        path: where MCP is served (``/mcp``).
        tokens: token digest -> principal. With no ``auth.tokens`` configured there is no auth (every
            caller is the trusted local one); with tokens configured, a request needs one of them.
    """

    def __init__(
        self,
        app: App,
        manager: StreamableHTTPSessionManager | None,
        *,
        path: str,
        tokens: dict[bytes, str],
        fast: FastToolCall | None = None,
        max_body: int = 4 * 1024 * 1024,
        body_timeout_s: float = 30.0,
        security: HostCheck | None = None,
        config_path: str | None = None,
        early: EarlyAnswers | None = None,
    ):
        self.security = security if security is not None else HostCheck(enable_dns_rebinding_protection=False)
        self.early = early
        self._sdk_ready = trio.Event()
        if manager is not None:
            self._sdk_ready.set()
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.manager = manager
        self.fast = fast
        self.paths = {path, path.rstrip("/") + "/"} if path != "/" else {"/"}
        self._slow_body = orjson.dumps(
            {
                "error": "request_timeout",
                "error_description": f"the request body did not arrive within {body_timeout_s:g} s",
            }
        )
        self._users: dict[str, Any] = {}
        """principal -> the SDK's ``AuthenticatedUser`` a 2025-11-25 session is bound to."""
        self.health_path = app.config.http.health_path
        self.config_path = config_path
        self.console: Any = None
        self._signer: Any = None
        self.adopt(app, tokens)

    def adopt(self, app: App, tokens: dict[bytes, str] | None = None) -> None:
        """Serve ``app`` from now on (a reloaded config's): its auth, trust, gates, limits, tools and webhooks;
        the listener, the paths and the sessions stay. ``tokens``: its bearer tokens (default: from the
        environment, as the config names them)."""
        if tokens is None:
            tokens = tokens_from_env(app.config)
        self.app = app
        self.tokens = tokens
        auth = app.config.auth
        resource_url = auth.resource.url if auth.resource is not None else None
        self.auth = Authenticator(
            tokens,
            auth.oidc,
            auth.mtls,
            introspection=[(p, _secret(p.client_secret, p.client_secret_env)) for p in auth.introspection],
            resource=resource_url,
            token_scopes={t.principal: t.scopes for t in auth.tokens if t.scopes},
        )
        gateway = app.gateway
        supported = dict.fromkeys(gateway.scopes.supported if gateway.scopes is not None else ())
        if gateway.trust is not None:
            for rule in gateway.trust.rules.values():
                supported.update(dict.fromkeys(rule.required_scopes))
        self.resource = ResourceServer(app.config, tuple(supported))
        self.oauth = app.oauth
        metadata_url = app.config.oauth.client_metadata_url if app.oauth is not None else None
        self.oauth_metadata_path = urlsplit(metadata_url).path if metadata_url else None
        # Calls are held to their scopes here (a 403 the client can step up from) when there are scopes to need.
        self.scope_guard = self.resource.enabled and (gateway.scopes is not None or gateway.trust is not None)
        # Auth is on when tokens are configured, even if none of their variables is set (then nobody
        # gets in): an unset variable must never turn auth off.
        self.require_auth = (
            bool(tokens) or bool(auth.tokens) or bool(auth.oidc) or bool(auth.introspection) or auth.mtls is not None
        )
        self.metrics = app.config.telemetry.metrics
        self.metrics_path = app.config.telemetry.metrics_path
        gates = app.gateway.gates
        self.address_sources = gates.address_sources if gates is not None else ()
        http = app.config.http
        self.access_log = http.access_log
        self.trust = app.config.trust
        self.subject_header = (
            self.trust.subject_header.lower().encode() if self.trust is not None and self.trust.subject_header else None
        )
        per_min = http.anonymous_rate_limit_per_min
        self.limiter = _RateLimiter(per_min, http.anonymous_rate_limit_burst or per_min) if per_min else None
        passthrough = app.handlers.passthrough
        self.watches = passthrough.watches if passthrough is not None and passthrough.watches.tokens else None
        if self.fast is not None:
            self.fast.handlers = app.handlers
        if self.early is not None:
            self.early.handlers = app.handlers
        self.console = self._console(app) if app.config.console.enabled else None

    def serve_sdk(self, manager: StreamableHTTPSessionManager, fast: FastToolCall | None) -> None:
        """The SDK is up: serve MCP through ``manager`` (and ``fast``) from now on, and let waiting requests on."""
        if fast is not None:
            fast.handlers = self.app.handlers
        self.manager, self.fast = manager, fast
        self._sdk_ready.set()

    def _console(self, app: App) -> Any:
        """The web console of ``app`` (``[console]``), behind this front's auth and checks."""
        from mcpipe.console import Console, signer_for

        if self._signer is None:
            self._signer = signer_for(app.config)  # kept across reloads: the browsers stay signed in
        return Console(
            app,
            identify=self.identity_of,
            known=self._known,
            require_auth=self.require_auth and self.trust is None,
            tokens=self.tokens,
            signer=self._signer,
            config_path=self.config_path,
        )

    async def identity_of(self, headers: list[tuple[bytes, bytes]]) -> Identity | Rejected | None:
        """A request's identity as ``/mcp`` resolves it: a credential (verified, or refused), else with trust
        levels the subject header the operator trusts, else None."""
        found = await self.auth.resolve(headers)
        if found is not None or self.subject_header is None:
            return found
        for name, value in headers:
            if name == self.subject_header and value.strip():
                return Identity(value.decode("latin-1").strip(), trust="header_asserted", provider="header")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self.access_log:
                send = _logged(scope, send)
            path = scope["path"]
            if path in self.paths:
                if self.trust is not None:
                    # Trust levels (mcpg's): a caller without a credential is let in, anonymous or with the
                    # subject header the operator trusts; a credential that does not verify is refused.
                    if not await self._trusted(scope):
                        await self._unauthorized(scope, send)
                        return
                elif self.require_auth and not await self._identify(scope):
                    await self._unauthorized(scope, send)
                    return
                if self.address_sources:
                    headers, peer = scope["headers"], scope.get("client")
                    scope[ADDRESSES_SCOPE_KEY] = {s.key: s.resolve(headers, peer) for s in self.address_sources}
                if (
                    self.limiter is not None
                    and scope.get(IDENTITY_SCOPE_KEY) is None
                    and not self.limiter.take(_client_address(scope))
                ):
                    await _respond(send, 429, _TOO_MANY, [(b"retry-after", b"1")])
                    return
                if scope["method"] == "POST":
                    read = await read_body(receive, max_bytes=self.max_body, timeout_s=self.body_timeout_s)
                    if read is None:
                        await _respond(send, 408, self._slow_body)
                        return
                    if read.gone:
                        return
                    data = read.data
                    if data.startswith(_BOM):
                        # RFC 8259 lets a parser ignore a byte order mark; the SDK's parsers differ by protocol
                        # era (2025-11-25 refused it), so it goes here, before either path reads the body.
                        data = data[len(_BOM) :]
                        _drop_length(scope)
                    receive = replaying(data, read.more, receive)
                    if self.scope_guard and await self._step_up(scope, data, send):
                        return
                if self.manager is None:  # the SDK is loading: answer what needs none of it, the rest waits
                    if self.early is not None and scope["method"] == "POST" and await self.early(scope, data, send):
                        return
                    await self._sdk_ready.wait()
                if self.fast is not None:
                    served, receive = await self.fast(scope, receive, send)
                    if served:
                        return
                assert self.manager is not None
                await self.manager.handle_request(scope, receive, send)
            elif path == self.health_path:
                if self._known(scope):
                    body = orjson.dumps({"ok": True, "servers": self.app.downstreams.status()})
                else:
                    body = orjson.dumps({"ok": True})  # a Host it does not know learns nothing more
                await _respond(send, 200, body)
            elif self.oauth is not None and path == self.oauth.callback_path and scope["method"] == "GET":
                from urllib.parse import parse_qsl

                query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
                status, page = await self.oauth.callback(query)
                await _respond(send, status, page, _HTML)
            elif self.oauth_metadata_path is not None and path == self.oauth_metadata_path:
                assert self.oauth is not None
                await _respond(
                    send, 200, orjson.dumps(self.oauth.client_metadata()), [(b"cache-control", b"max-age=300")]
                )
            elif self.resource.enabled and path in self.resource.paths:
                if self.resource.url is None and not self._known(scope):
                    await _respond(send, 421, _NOT_FOUND)  # the resource would be named after a Host it does not know
                    return
                status, body, headers = self.resource.metadata_response(scope)
                await _respond(send, status, body, headers)
            elif self.watches is not None and path.startswith(WEBHOOK_PATH) and scope["method"] == "POST":
                await self.webhook(scope, receive, send)
            elif self.console is not None and (
                path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/") or path.startswith(API_PREFIX)
            ):
                # The console checks Host and Origin itself: its forms post what a browser posts (CSRF-guarded).
                await self.console(scope, receive, send)
            elif (refusal := await self._refused(scope, post=scope["method"] == "POST")) is not None:
                await refusal(scope, receive, send)
            elif path.startswith(REGISTRY_PATH[:-1]) and self.app.config.registry.enabled and scope["method"] == "GET":
                await self.registry(path, send)
            elif path == self.metrics_path and self.metrics:
                if self.require_auth and not await self._identify(scope):
                    await self._unauthorized(scope, send)
                    return
                body, content_type = metrics_text()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-type", content_type.encode()),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
            elif path == "/workflow" and serves_workflow(self.app.config):
                await self.workflow(scope, receive, send)
            else:
                await _respond(send, 404, _NOT_FOUND)
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def registry(self, path: str, send: Send) -> None:
        """The MCP registry API serving this server as its only entry (``registry``): ``/v0.1/servers`` (the
        list envelope) and ``/v0.1/servers/{name}/versions/{latest|<version>}`` (one entry), as mcpg serves its
        ``mcp.registry`` view (``src/transports/http/discovery.rs``)."""
        cfg = self.app.config.registry
        entry = registry_entry(cfg)
        if path == REGISTRY_PATH.rstrip("/"):
            if entry is None:
                _log.warning("registry.enabled but no registry.url: the entry is not listed")
            await _respond(send, 200, orjson.dumps({"servers": [entry] if entry else [], "metadata": {}}))
            return
        rest = path[len(REGISTRY_PATH) :]
        name, sep, version = rest.rpartition("/versions/")
        if sep and entry is not None and name == cfg.name and version in ("latest", _version()):
            await _respond(send, 200, orjson.dumps(entry))
        else:
            await _respond(send, 404, orjson.dumps({"error": "server or version not found"}))

    async def webhook(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /webhooks/resource-updated/<token>``: a third party says a watched resource changed (mcpg's
        webhook watch strategy). Only the token matters (the body, any, is read and ignored); a browser's request
        from an origin this server does not know is refused before the token is looked at."""
        assert self.watches is not None
        if not self._known(scope):
            await _respond(send, 403, _FORBIDDEN_ORIGIN)
            return
        read = await read_body(receive, max_bytes=self.max_body, timeout_s=self.body_timeout_s)
        if read is None:
            await _respond(send, 408, self._slow_body)
            return
        if read.gone:
            return
        token = scope["path"][len(WEBHOOK_PATH) :]
        uri = await self.watches.webhook(token) if token and "/" not in token else None
        if uri is None:
            _log.debug("webhook: unknown token %s...", token[:8])
            await _respond(send, 404, _UNKNOWN_TOKEN)
            return
        await _respond(send, 200, orjson.dumps({"ok": True, "uri": uri}))

    def _known(self, scope: Scope) -> bool:
        """Whether the request names this server (its Host, and its Origin if any), checked quietly."""
        settings = self.security
        if not settings.enable_dns_rebinding_protection:
            return True
        host = origin = ""
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if not host or not allowed(host, settings.allowed_hosts):
            return False
        return not origin or allowed(origin, settings.allowed_origins)

    async def _refused(self, scope: Scope, *, post: bool) -> Any:
        """The answer to a request the front checks refuse (a Host or Origin this server does not know, a POST
        that is not JSON: the SDK's own checks of ``/mcp``, applied to every route), or None."""
        refused = self.security.refusal(scope["headers"], is_post=post)
        if refused is None:
            return None
        status, body = refused
        return partial(_refuse, status, body)

    async def workflow(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /workflow`` (``docs/workflow.md``), behind the same bearer auth, front checks and body deadline
        as MCP."""
        from mcpipe.workflow._http import workflow_endpoint

        principal = None
        if self.require_auth:
            if not await self._identify(scope):
                await self._unauthorized(scope, send)
                return
            principal = scope[PRINCIPAL_SCOPE_KEY]
        if scope["method"] == "POST":
            read = await read_body(receive, max_bytes=self.max_body, timeout_s=self.body_timeout_s)
            if read is None:
                await _respond(send, 408, self._slow_body)
                return
            if read.gone:
                return
            receive = replaying(read.data, read.more, receive)
        await workflow_endpoint(
            self.app.gateway, scope, receive, send, principal=principal, max_body=self.app.config.http.max_body_bytes
        )

    async def _identify(self, scope: Scope) -> bool:
        """Resolve the caller's identity into the scope (its principal, its identity, and the ``user`` the SDK
        binds a 2025-11-25 session to); False when it has none, or presented one that does not verify."""
        found = await self.auth.resolve(scope["headers"])
        if found is None or isinstance(found, Rejected):
            if found is not None:
                scope[_REJECTED_KEY] = found
                _log.info("refused a credential: %s", found.reason)
            return False
        principal = principal_key(found)  # the subject in its source: another issuer's `alice` is another
        scope[PRINCIPAL_SCOPE_KEY] = principal
        scope[IDENTITY_SCOPE_KEY] = found
        user = self._users.get(principal)
        if user is None:
            from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
            from mcp.server.auth.provider import AccessToken

            user = AuthenticatedUser(AccessToken(token="", client_id=principal, scopes=[]))
            if len(self._users) < 100_000:
                self._users[principal] = user
        scope["user"] = user
        return True

    async def _unauthorized(self, scope: Scope, send: Send) -> None:
        """401 with the challenge (the metadata and scopes to ask for; ``invalid_token`` for a token that did not
        verify), or 503 when the token could not be checked now."""
        rejected = scope.get(_REJECTED_KEY)
        if isinstance(rejected, Rejected) and rejected.status == 503:
            await _respond(send, 503, _UNAVAILABLE, [(b"retry-after", b"1")])
            return
        body = _INVALID_TOKEN if rejected is not None and self.resource.enabled else _UNAUTHORIZED
        await _respond(send, 401, body, [(b"www-authenticate", self.resource.unauthorized(scope, rejected))])

    async def _step_up(self, scope: Scope, body: bytes, send: Send) -> bool:
        """Answer 403 ``insufficient_scope`` (True) to a call whose tool (every tool an ``mcp_pipe`` spec or a
        declared pipeline reaches), prompt or resource needs a scope the caller's token lacks; 401 to a caller
        without a token. False: the call may go on (the gateway checks it again, on every path)."""
        target = call_target(body)
        if target is None:
            return False
        kind, name, args = target
        gateway = self.app.gateway
        if kind == "tool":
            if is_pipe(kind, name):
                pipe = self.app.handlers.pipe
                needed = await pipe.needed_scopes(args) if pipe is not None else None
            else:
                needed = gateway.needed_scopes(name)
        else:
            needed = gateway.scopes.needed(kind, name) if gateway.scopes is not None else ()
        if not needed:
            return False
        identity = scope.get(IDENTITY_SCOPE_KEY)
        missing = missing_scopes(needed, identity.scopes if identity is not None else ())
        if not missing:
            return False
        if identity is None:
            await self._unauthorized(scope, send)
            return True
        body = orjson.dumps(
            {"error": "insufficient_scope", "error_description": f"the call needs the scope {' '.join(missing)}"}
        )
        await _respond(send, 403, body, [(b"www-authenticate", self.resource.insufficient(scope, needed, missing))])
        return True

    async def _trusted(self, scope: Scope) -> bool:
        """Resolve the caller's identity when the config has trust levels: a credential that verifies, else the
        trusted subject header (``header_asserted``), else none; False for a credential that does not verify."""
        found = await self.auth.resolve(scope["headers"])
        if isinstance(found, Rejected):
            scope[_REJECTED_KEY] = found
            _log.info("refused a credential: %s", found.reason)
            return False
        if found is not None:
            return await self._identify(scope)
        if self.subject_header is not None:
            for name, value in scope["headers"]:
                if name == self.subject_header and value.strip():
                    asserted = Identity(value.decode("latin-1").strip(), trust="header_asserted", provider="header")
                    scope[IDENTITY_SCOPE_KEY] = asserted
                    scope[PRINCIPAL_SCOPE_KEY] = principal_key(asserted)
                    return True
        return True


async def _refuse(status: int, body: bytes, scope: Scope, receive: Receive, send: Send) -> None:
    """The SDK's refusal (a Starlette ``Response`` of plain text, without a content type)."""
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def signalled(log: logging.Logger = _log) -> None:
    """Return on the first SIGINT or SIGTERM (a hypercorn ``shutdown_trigger``), logging it on ``log`` (the
    logger of what shuts down: ``mcpipe.http`` by default, ``mcpipe.stdio``, ``mcpipe.runs``)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s: shutting down", signal.Signals(signum).name)
            return


class _TlsConfig(HypercornConfig):
    """hypercorn's settings, its TLS context at the configured least version."""

    def __init__(self, min_version: str) -> None:
        super().__init__()
        self.min_version = min_version

    def create_ssl_context(self) -> Any:
        import ssl

        context = super().create_ssl_context()
        if context is not None and self.min_version == "1.3":
            context.minimum_version = ssl.TLSVersion.TLSv1_3
        return context


def _tls(hc: HypercornConfig, tls: Any, base_dir: str) -> None:
    """HTTPS: the certificate, the key and (``client_cert``) the client certificates asked for."""
    import os.path
    import ssl

    def path(p: str) -> str:
        return p if os.path.isabs(p) else os.path.join(base_dir, p)

    hc.certfile, hc.keyfile = path(tls.cert_file), path(tls.key_file)
    if tls.client_ca_file:
        hc.ca_certs = path(tls.client_ca_file)
        hc.verify_mode = ssl.CERT_REQUIRED if tls.client_cert == "required" else ssl.CERT_OPTIONAL


async def _shutting_down(app: App, trigger: Callable[[], Awaitable[None]]) -> None:
    """The trigger, then every call in flight cancelled: they answer ``CANCELLED`` within the graceful
    period instead of losing their connections."""
    await trigger()
    app.handlers.shut_down()


async def serve_http(
    app: App,
    *,
    host: str | None = None,
    port: int | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    graceful_timeout: float = GRACEFUL_TIMEOUT_S,
    fast_path: bool = True,
    listen_fd: int | None = None,
    activated_fd: int | None = None,
    on_front: Callable[[HttpFront], None] | None = None,
    config_path: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` over streamable HTTP until ``shutdown_trigger`` returns (or forever).

    Reports the URL of the MCP endpoint through ``task_status`` once listening (with the real port
    when ``port`` is 0). ``fast_path=False`` leaves every request to the SDK (see ``_fast``).
    ``listen_fd`` is a listening socket inherited from ``mcpipe serve --workers``' supervisor: this process
    is then one worker of several, and serves 2025-11-25 statelessly (``_workers``). ``activated_fd`` is a
    listening socket systemd passed (socket activation), served as the one process it is. ``on_front`` is given the
    HTTP front once it is built (:class:`mcpipe.server._reload.Reloader` swaps the app it serves).
    ``config_path``: the config file served (the console shows its check's warnings).
    """
    cfg = app.config
    h = cfg.http
    host = h.host if host is None else host
    port = h.port if port is None else port
    tokens = tokens_from_env(cfg)
    if not cfg.auth.tokens and host not in _LOOPBACK:
        _log.warning("serving on %s without auth: anyone who can reach it may call every tool", host)
    if host in ("0.0.0.0", "::", "") and h.dns_rebinding_protection and h.allowed_hosts is None:
        _log.warning(
            "listening on every interface but accepting only loopback Host headers: list the names clients "
            "use in http.allowed_hosts (DNS-rebinding protection answers 421 to the others)"
        )
    security = security_settings(cfg, host)
    early = EarlyAnswers(
        app.handlers, security, _server_info(app), json_response=h.json_response, max_body=h.max_body_bytes
    )
    front = HttpFront(
        app,
        None,  # the SDK's session manager, once the SDK is loaded (_serve_sdk)
        path=h.path,
        tokens=tokens,
        max_body=h.max_body_bytes,
        body_timeout_s=h.body_timeout_s,
        security=security,
        config_path=config_path,
        early=early if fast_path else None,
    )
    if on_front is not None:
        on_front(front)  # a reloader, which makes it serve the next config's app
    hc = _TlsConfig(h.tls.min_version) if h.tls is not None else HypercornConfig()
    if h.tls is not None:
        _tls(hc, h.tls, cfg.base_dir)
    if listen_fd is not None or activated_fd is not None:
        hc.bind = [f"fd://{listen_fd if listen_fd is not None else activated_fd}"]
    else:
        hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    hc.graceful_timeout = graceful_timeout
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.keep_alive_timeout = 75
    stop = trio.Event()
    warming = trio.CancelScope()
    async with trio.open_nursery() as sdk:
        # The SDK loads beside the listener, which answers meanwhile; its session manager runs until the
        # listener has stopped (as it enclosed the listener before).
        sdk.start_soon(partial(_serve_sdk, front, security, listen_fd=listen_fd, fast_path=fast_path, stop=stop))
        if sys.modules.keys() >= _SDK_MODULES:
            # A process that has the SDK already (a host embedding mcpipe, the tests) has nothing to gain from
            # answering before it: it binds once the SDK server is up, and every request takes the one path.
            await front._sdk_ready.wait()
        async with trio.open_nursery() as nursery:
            app_: Any = front  # an ASGI 3 app; hypercorn's annotation spells out its own event types
            trigger = None if shutdown_trigger is None else partial(_shutting_down, app, shutdown_trigger)
            limit = h.max_connections or default_max_connections()
            binds = await nursery.start(
                partial(
                    serve_bounded,
                    app_,
                    hc,
                    max_connections=limit,
                    head_timeout_s=h.head_timeout_s,
                    front=h.front,
                    shutdown_trigger=trigger,
                )
            )
            url = binds[0] + h.path
            _log.info("serving MCP at %s", url)
            if cfg.console.enabled:
                _log.info("serving the console at %s/console", binds[0])
            task_status.started(url)
            # Answering already; what a first call would import on the event loop is imported beside it (not
            # waited for by a shutdown).
            sdk.start_soon(_warm, front, warming)
        stop.set()
        warming.cancel()


def _server_info(app: App) -> dict[str, object]:
    """The ``serverInfo`` the SDK server stamps on 2026-07-28 results (its name and version)."""
    return {"name": app.config.name, "version": _version()}


_SDK_MODULES = frozenset({"mcp.server.lowlevel.server", "mcp.server.streamable_http_manager"})


def _import_sdk() -> None:
    """What the SDK server and its HTTP transport import (run in a thread: about a second of CPU)."""
    import mcp.server.lowlevel.server
    import mcp.server.streamable_http_manager  # noqa: F401

    import mcpipe.server._events
    import mcpipe.server._fast
    import mcpipe.server._sdkserver  # noqa: F401


async def _serve_sdk(
    front: HttpFront, security: HostCheck, *, listen_fd: int | None, fast_path: bool, stop: trio.Event
) -> None:
    """Import the SDK in a thread, build its server and session manager over the front's app, hand them to the
    front (:meth:`HttpFront.serve_sdk`: the requests waiting go on) and run the manager until ``stop``."""
    started = trio.current_time()
    await trio.to_thread.run_sync(_import_sdk)
    from mcpipe.server._events import InMemoryEventStore, ResumableSessionManager
    from mcpipe.server._fast import FastToolCall

    app = front.app
    server = await trio.to_thread.run_sync(lambda: app.server)  # the SDK server, built once
    h = app.config.http
    resumable = h.resumable_streams and not h.json_response
    events = InMemoryEventStore(max_events=h.event_store_max_events, max_bytes=h.event_store_max_bytes)
    manager = ResumableSessionManager(
        app=server,
        json_response=h.json_response,
        security_settings=security.sdk(),
        session_idle_timeout=None if listen_fd is not None else h.session_idle_timeout_s,
        max_request_body_size=h.max_body_bytes,
        stateless=listen_fd is not None,  # a 2025-11-25 session cannot follow its client across workers
        events=events if resumable and listen_fd is None else None,
        retry_interval=h.sse_retry_ms if resumable and listen_fd is None else None,
        max_sessions=h.max_sessions,
        max_sessions_per_principal=h.max_sessions_per_principal,
        max_sessions_per_tenant=h.max_sessions_per_tenant,
    )
    fast = FastToolCall(
        app.handlers,
        security,
        server.server_info_stamp,
        json_response=h.json_response,
        max_body=h.max_body_bytes,
        manager=None if listen_fd is not None else manager,  # stateless workers have no 2025 sessions
    )
    if fast_path and listen_fd is None:
        app.handlers.session_transport = manager._server_instances.get
    async with manager.run():
        front.serve_sdk(manager, fast if fast_path else None)
        _log.info("loaded the MCP SDK in %.0f ms", (trio.current_time() - started) * 1000)
        await stop.wait()


async def _warm(front: HttpFront, scope: trio.CancelScope) -> None:
    """Load what the first call would otherwise import on the event loop (``jsonschema``, the Prometheus
    collectors), in a thread, once the SDK is loaded (two imports at once would share one core); ``scope``
    cancels it when the server stops."""
    with scope:
        await front._sdk_ready.wait()
        started = trio.current_time()
        await trio.to_thread.run_sync(_load_call_path, abandon_on_cancel=True)
        _log.info("loaded the call path in %.0f ms", (trio.current_time() - started) * 1000)


def _load_call_path() -> None:
    warm()
    telemetry = current_telemetry()
    if telemetry is not None and telemetry.metrics is not None:
        telemetry.metrics.build()


_TOO_MANY = orjson.dumps({"error": "rate_limited", "error_description": "too many requests without a credential"})
_access_log = logging.getLogger("mcpipe.access")


def _client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


class _RateLimiter:
    """A token bucket per client address: ``per_min`` requests a minute, at most ``burst`` at once."""

    def __init__(self, per_min: int, burst: int, max_clients: int = 65_536) -> None:
        self.rate = per_min / 60.0
        self.burst = float(max(burst, 1))
        self.max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> bool:
        now = trio.current_time()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if len(self._buckets) >= self.max_clients and key not in self._buckets:
            self._buckets.pop(next(iter(self._buckets)))  # the oldest client goes: memory stays bounded
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True


def _logged(scope: Scope, send: Send) -> Send:
    """``send``, logging one access line when the response starts."""
    started = trio.current_time()

    async def logging_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            _access_log.info(
                "%s %s %s %.1fms",
                scope.get("method"),
                scope.get("path"),
                message.get("status"),
                (trio.current_time() - started) * 1000,
            )
        await send(message)

    return logging_send
