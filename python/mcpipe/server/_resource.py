"""mcpipe as an OAuth 2.1 resource server, as the MCP authorization spec has it (``docs/access.md``).

- **Protected resource metadata** (RFC 9728) at the path-aware well-known URI of the MCP endpoint
  (``/.well-known/oauth-protected-resource/mcp``) and at the root one: ``resource`` (the canonical URL:
  ``auth.resource.url``, else the request's scheme, ``Host`` and ``http.path``), ``authorization_servers``
  (the ``[[auth.oidc]]`` and ``[[auth.introspection]]`` issuers), ``scopes_supported``,
  ``bearer_methods_supported``, ``resource_documentation``.
- **Challenges**: a request without a credential is answered 401 ``WWW-Authenticate: Bearer
  resource_metadata="...", scope="..."``; one whose token does not verify (expired, another resource's,
  revoked) 401 with ``error="invalid_token"``; a call whose tool, prompt or resource needs a scope the token
  lacks 403 ``error="insufficient_scope"`` naming every scope the call needs, so the client can step up.

Metadata is served whenever an OAuth issuer is configured (``[[auth.oidc]]`` or ``[[auth.introspection]]``)
or ``[auth.resource]`` is set; with static bearer tokens alone mcpipe is no resource server, and its 401 says
``Bearer realm="mcpipe"`` as before.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.types import Scope

from mcpipe._util import PIPE_TOOL
from mcpipe.access import Rejected, ResourceConfig
from mcpipe.config import Config

__all__ = ["PRM_PATH", "ResourceServer"]

PRM_PATH = "/.well-known/oauth-protected-resource"
"""RFC 9728's well-known path; the path-aware form appends the resource's path."""

_REALM = b'Bearer realm="mcpipe"'
_CORS = [(b"access-control-allow-origin", b"*"), (b"access-control-allow-methods", b"GET, OPTIONS")]


def _quoted(value: str) -> str:
    """An RFC 7235 quoted-string (the values here are URLs, scope tokens and fixed sentences)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ResourceServer:
    """What the HTTP front answers as a resource server (see the module docstring).

    Args:
        config: the served config.
        scopes_supported: the scopes the gateway's rules name (``[[auth.scopes]]``, the trust rules'
            ``required_scopes``), the default of ``scopes_supported``.
    """

    def __init__(self, config: Config, scopes_supported: tuple[str, ...] = ()) -> None:
        auth = config.auth
        self.enabled = bool(auth.oidc) or bool(auth.introspection) or auth.resource is not None
        cfg = auth.resource if auth.resource is not None else ResourceConfig()
        self.cfg = cfg
        self.mcp_path = config.http.path
        self.url = cfg.url.rstrip("/") if cfg.url is not None and urlsplit(cfg.url).path not in ("", "/") else cfg.url
        servers = cfg.authorization_servers
        if servers is None:
            servers = list(dict.fromkeys([p.issuer for p in auth.oidc] + [p.issuer for p in auth.introspection]))
        self.authorization_servers = servers
        self.scopes_supported = list(cfg.scopes_supported if cfg.scopes_supported is not None else scopes_supported)
        self.challenge_scopes = list(cfg.scopes if cfg.scopes is not None else self.scopes_supported)
        self.name = cfg.name or config.name
        paths = {PRM_PATH, PRM_PATH + self.mcp_path.rstrip("/")}
        if self.url is not None:
            own = urlsplit(self.url).path.rstrip("/")
            if own:
                paths.add(PRM_PATH + own)
        self.paths = frozenset(paths)
        """Where the metadata is served: the root well-known URI, and the path-aware ones of ``http.path`` and
        of the configured resource's path (a proxy may serve mcpipe under a prefix)."""

    # -- where things are ------------------------------------------------------------------------------------

    def resource(self, scope: Scope) -> str:
        """The canonical URL of this resource for a request (RFC 8707 §2: no fragment, no trailing slash)."""
        if self.url is not None:
            return self.url
        host = ""
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
                break
        if not host:
            server = scope.get("server") or ("127.0.0.1", 80)
            host = f"{server[0]}:{server[1]}"
        return f"{scope.get('scheme', 'http')}://{host.lower()}{self.mcp_path.rstrip('/') or ''}"

    def metadata_url(self, scope: Scope) -> str:
        """The path-aware URL of the metadata (what a challenge's ``resource_metadata`` names)."""
        parts = urlsplit(self.resource(scope))
        return f"{parts.scheme}://{parts.netloc}{PRM_PATH}{parts.path.rstrip('/')}"

    def document(self, scope: Scope) -> dict[str, Any]:
        """The protected resource metadata (RFC 9728 §2)."""
        doc: dict[str, Any] = {
            "resource": self.resource(scope),
            "authorization_servers": list(self.authorization_servers),
            "bearer_methods_supported": ["header"],
            "resource_name": self.name,
        }
        if self.scopes_supported:
            doc["scopes_supported"] = list(self.scopes_supported)
        if self.cfg.documentation is not None:
            doc["resource_documentation"] = self.cfg.documentation
        return doc

    def metadata_response(self, scope: Scope) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """The answer to a request of the metadata (any origin may read it: it is public, RFC 9728 §3)."""
        if scope["method"] == "OPTIONS":
            return 204, b"", [*_CORS, (b"access-control-allow-headers", b"mcp-protocol-version")]
        if scope["method"] not in ("GET", "HEAD"):
            return 405, orjson.dumps({"error": "method not allowed"}), [(b"allow", b"GET, OPTIONS")]
        return 200, orjson.dumps(self.document(scope)), [*_CORS, (b"cache-control", b"max-age=3600")]

    # -- challenges ----------------------------------------------------------------------------------------

    def unauthorized(self, scope: Scope, rejected: Rejected | None) -> bytes:
        """The ``WWW-Authenticate`` value of a 401 (no credential, or ``rejected``)."""
        if not self.enabled:
            return _REALM
        parts = []
        if rejected is not None:
            parts.append('error="invalid_token"')
            parts.append('error_description="the access token is invalid, expired or not for this resource"')
        parts.append(f"resource_metadata={_quoted(self.metadata_url(scope))}")
        if self.challenge_scopes:
            parts.append(f"scope={_quoted(' '.join(self.challenge_scopes))}")
        return ("Bearer " + ", ".join(parts)).encode()

    def insufficient(self, scope: Scope, needed: tuple[str, ...], missing: tuple[str, ...]) -> bytes:
        """The ``WWW-Authenticate`` value of a 403 step-up challenge: every scope the call needs."""
        description = f"the call needs the scope {' '.join(missing)}"
        parts = [
            'error="insufficient_scope"',
            f"scope={_quoted(' '.join(needed))}",
            f"resource_metadata={_quoted(self.metadata_url(scope))}",
            f"error_description={_quoted(description)}",
        ]
        return ("Bearer " + ", ".join(parts)).encode()


def call_target(body: bytes) -> tuple[str, str, Any] | None:
    """``(kind, name, arguments)`` of a JSON-RPC request whose target a scope may guard: ``tools/call``
    (``tool``), ``prompts/get`` (``prompt``), ``resources/read`` and ``resources/subscribe`` (``resource``, by
    URI); None for anything else."""
    if b'"method"' not in body:
        return None
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(msg, dict):
        return None
    method, params = msg.get("method"), msg.get("params")
    if not isinstance(params, dict):
        return None
    if method == "tools/call":
        name = params.get("name")
        return ("tool", name, params.get("arguments")) if isinstance(name, str) else None
    if method == "prompts/get":
        name = params.get("name")
        return ("prompt", name, None) if isinstance(name, str) else None
    if method in ("resources/read", "resources/subscribe"):
        uri = params.get("uri")
        return ("resource", uri, None) if isinstance(uri, str) else None
    return None


def is_pipe(kind: str, name: str) -> bool:
    return kind == "tool" and name == PIPE_TOOL
