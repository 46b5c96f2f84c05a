"""The ``[openapi.NAME]`` section: one OpenAPI document served as tools (``docs/openapi.md``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from mcpipe._struct import Strict
from mcpipe.errors import ErrorCode, Problem

__all__ = ["OpenApiAuth", "OpenApiConfig", "OpenApiFilter", "check_openapi"]

_MiB = 1024 * 1024

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class OpenApiFilter(Strict):
    """Which operations a filter matches: any of its lists matching is a match (``*`` globs).

    Attributes:
        tags: the operation's tags.
        paths: the path template (``/repos/{owner}/{repo}/issues``, ``/repos/*``).
        operations: the ``operationId``, the tool's name, or ``METHOD /path`` (``GET /pets/{id}``).
        methods: HTTP methods (``GET``, ``DELETE``).
    """

    tags: list[str] = []
    paths: list[str] = []
    operations: list[str] = []
    methods: list[str] = []


class OpenApiAuth(Strict):
    """How mcpipe satisfies one of the document's security schemes (keyed by the scheme's name).

    Attributes:
        credential: a ``[credentials.NAME]`` whose token is presented the way the scheme says (an API key's
            header, query parameter or cookie; ``Authorization: Bearer``; ``Basic`` with ``user:password``).
        forward_bearer: present the caller's own bearer token (the one the HTTP front verified), for an
            API that accepts the same tokens as this server.
    """

    credential: str | None = None
    forward_bearer: bool = False


class OpenApiConfig(Strict):
    """One OpenAPI document (3.0, 3.1 or Swagger 2.0) whose operations are served as tools.

    Attributes:
        spec: the document: a path (relative to the config file), a ``file://`` URI, an ``http(s)://`` URL
            (fetched at start under the outbound policy), or the document itself inline.
        base_url: where the API is (default: the document's first server, or Swagger 2.0's
            ``schemes``/``host``/``basePath``).
        server_variables: values of the chosen server's variables (default: their defaults).
        prefix: tool names are ``PREFIX.NAME`` (default: the section's name; ``""``: bare names).
        names: tool names chosen by the operator, keyed by ``operationId`` or ``METHOD /path``.
        include: serve only the operations this matches (default: every one).
        exclude: leave out the operations this matches.
        auth: how each security scheme is satisfied, by the scheme's name.
        headers: headers sent with every request (``${VAR}`` read from the environment at load).
        allowed_hosts: more hosts calls and ``$ref`` fetches may reach, besides the API's own and the
            document URL's (``[outbound] http.allowed_hosts`` are allowed too).
        allow_private: let the API's host resolve to a private or loopback address.
        verify: TLS verification (True, False, or a CA bundle path).
        timeout_ms: the deadline of one call.
        max_response_bytes: a larger response body fails the call.
        max_spec_bytes: the largest document read (each file of a split document).
        max_operations: a document with more operations is refused.
        max_schema_bytes: a tool whose input schema, ``$ref``s resolved, is larger is refused (located).
        max_description: descriptions are cut to this many characters.
        validate: check the document with openapi-spec-validator at load (its problems are warnings; one in
            an operation's parameters or request body refuses that operation).
    """

    spec: str | dict[str, Any]
    base_url: str | None = None
    server_variables: dict[str, str] = {}
    prefix: str | None = None
    names: dict[str, str] = {}
    include: OpenApiFilter | None = None
    exclude: OpenApiFilter | None = None
    auth: dict[str, OpenApiAuth] = {}
    headers: dict[str, str] = {}
    allowed_hosts: list[str] = []
    allow_private: bool = False
    verify: bool | str = True
    timeout_ms: PositiveInt = 30_000
    max_response_bytes: PositiveInt = 10 * _MiB
    max_spec_bytes: PositiveInt = 64 * _MiB
    max_operations: PositiveInt = 10_000
    max_schema_bytes: PositiveInt = 512 * 1024
    max_description: PositiveInt = 2000
    validate: bool = True
    answer: Literal["body", "full"] = "body"
    """The structured answer: the response body (``body``), or ``{status, headers, body}`` (``full``)."""


def check_openapi(sections: Mapping[str, OpenApiConfig], credentials: Mapping[str, Any]) -> list[Problem]:
    """The sections' own problems (before any document is read): names, auth, URLs."""
    problems: list[Problem] = []
    for name, cfg in sections.items():
        base = f"openapi.{name}"
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            problems.append(
                Problem(base, ErrorCode.INVALID_CONFIG, "section names use letters, digits, `_` and `-` (at most 64)")
            )
        if cfg.prefix is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{0,64}", cfg.prefix):
            problems.append(
                Problem(f"{base}.prefix", ErrorCode.INVALID_CONFIG, "a prefix uses letters, digits, `_`, `-` and `.`")
            )
        if cfg.base_url is not None and not cfg.base_url.startswith(("http://", "https://")):
            problems.append(Problem(f"{base}.base_url", ErrorCode.INVALID_CONFIG, "must be an http:// or https:// URL"))
        if isinstance(cfg.spec, str) and not cfg.spec:
            problems.append(
                Problem(
                    f"{base}.spec", ErrorCode.INVALID_CONFIG, "a path, a file:// URI, an http(s) URL or the document"
                )
            )
        for scheme, auth in cfg.auth.items():
            where = f"{base}.auth.{scheme}"
            if (auth.credential is None) == (not auth.forward_bearer):
                problems.append(
                    Problem(where, ErrorCode.INVALID_CONFIG, "set one of `credential` or `forward_bearer = true`")
                )
            elif auth.credential is not None and auth.credential not in credentials:
                problems.append(
                    Problem(
                        f"{where}.credential",
                        ErrorCode.INVALID_CONFIG,
                        f"no credential `{auth.credential}` in [credentials]",
                    )
                )
    return problems
