"""A stand-in for the API an OpenAPI document describes: a real HTTP server on 127.0.0.1 that checks every
request against the document with a maintained validator (openapi-core's request validation for OpenAPI
3.0 and 3.1, bravado-core's for Swagger 2.0) and answers a canned body, or an echo of what it received.

Every request is recorded (``StandIn.seen``) with the validator's verdict, so a test asserts that mcpipe's
requests were all valid, not only that they got an answer.
"""

from __future__ import annotations

import copy
import gzip
import re
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import orjson
import yaml
from werkzeug.datastructures import Headers, ImmutableMultiDict

from kit.llm import _body, lifespan, serving

DOCUMENTS = Path(__file__).resolve().parents[1] / "openapi" / "documents"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_HOST = "http://standin.invalid"


def read(name: str) -> dict[str, Any]:
    """A vendored document, parsed (``.gz`` decompressed)."""
    data = (DOCUMENTS / name).read_bytes()
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    return orjson.loads(data) if data.lstrip()[:1] == b"{" else yaml.safe_load(data)


@dataclass
class Seen:
    method: str
    path: str
    operation: str | None
    errors: list[str]
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class _Req:
    """openapi-core's ``Request`` protocol over what the ASGI server received."""

    host_url: str
    path: str
    method: str
    body: bytes | None
    content_type: str
    parameters: Any


class _Bravado:
    """bravado-core's ``IncomingRequest`` over what the ASGI server received."""

    def __init__(
        self, path: dict[str, str], query: list[tuple[str, str]], headers: Headers, form: dict[str, Any], raw: bytes
    ) -> None:
        grouped: dict[str, Any] = {}
        for k, v in query:
            grouped.setdefault(k, []).append(v)
        self.path = path
        self.query = {k: v[0] if len(v) == 1 else v for k, v in grouped.items()}
        self.headers = headers
        self.form = form
        self.files: dict[str, Any] = {}
        self._raw = raw

    def json(self, **kwargs: Any) -> Any:
        return orjson.loads(self._raw)


def _deep_objects(node: Any) -> None:
    """openapi-core deserializes ``style: deepObject`` for object schemas only, and fails on any other even when
    the request leaves the parameter out; Stripe's document writes it on arrays and ``anyOf``s too. Those are read
    as ``form`` here (the tests send none of them)."""
    found: list[tuple[dict[str, Any], Any]] = []
    if isinstance(node, list):
        found = [(p, p.get("schema")) for p in node if isinstance(p, dict)]
    elif isinstance(node, dict):
        for media in (node.get("content") or {}).values():
            props = ((media or {}).get("schema") or {}).get("properties") or {}
            for name, entry in ((media or {}).get("encoding") or {}).items():
                if isinstance(entry, dict):
                    found.append((entry, props.get(name)))
    for entry, schema in found:
        if entry.get("style") == "deepObject" and not (isinstance(schema, dict) and schema.get("type") == "object"):
            entry["style"], entry["explode"] = "form", True


class _Offline:
    """bravado-core's HTTP client, offline: its model discovery walks every schema jsonschema's resolver knows
    (the OAS 3.1 meta-schemas openapi-core registers included) and would download them; they are empty here."""

    class _Answer:
        headers: dict[str, str] = {}

        def json(self) -> Any:
            return {}

        def result(self) -> Any:
            return self

    def request(self, params: Any) -> Any:
        return self._Answer()


@dataclass
class StandIn:
    """The stand-in of one document. ``prefix``: the path the API sits under (a server URL's path)."""

    document: dict[str, Any]
    prefix: str = ""
    responses: dict[str, Any] = field(default_factory=dict)
    """Canned bodies by operationId (``{"status": 404, "body": ...}`` for a status of its own)."""
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    origin: str | None = None
    """Where a split Swagger 2.0 document lies (``file://...``), for its ``$ref``s to other files."""

    def __post_init__(self) -> None:
        self.version = "2.0" if "swagger" in self.document else "3"
        self._routes: list[tuple[str, re.Pattern[str], str, dict[str, Any]]] = []
        for path, item in (self.document.get("paths") or {}).items():
            if not isinstance(item, dict):
                continue
            pattern = re.compile(
                "^" + re.sub(r"\\\{([^}]+)\\\}", r"(?P<p_\1>[^/]+)", re.escape(path)).replace("(?P<p_", "(?P<p") + "$"
            )
            for method in METHODS:
                if isinstance(item.get(method), dict):
                    self._routes.append((method, pattern, path, item[method]))
        if self.version == "2.0":
            with warnings.catch_warnings():  # bravado-core resolves with jsonschema's RefResolver, deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                from bravado_core.spec import Spec

                doc = copy.deepcopy(self.document)
                doc["host"], doc["schemes"], doc["basePath"] = "standin.invalid", ["http"], self.prefix or "/"
                config = {
                    "validate_requests": True,
                    "validate_responses": False,
                    "use_models": False,
                    "validate_swagger_spec": False,
                }
                # A split document's files are read from where it lies (bravado-core resolves them itself).
                self._spec = Spec.from_dict(
                    doc, origin_url=self.origin or _HOST + "/swagger.json", http_client=_Offline(), config=config
                )
        else:
            from openapi_core import Config, OpenAPI

            doc = copy.deepcopy(self.document)
            doc["servers"] = [{"url": _HOST + self.prefix}]
            for item in (doc.get("paths") or {}).values():
                if isinstance(item, dict):
                    item.pop("servers", None)
                    _deep_objects(item.get("parameters"))
                    for method in METHODS:
                        if isinstance(item.get(method), dict):
                            item[method].pop("servers", None)
                            _deep_objects(item[method].get("parameters"))
                            _deep_objects(item[method].get("requestBody"))
            # The document is checked by mcpipe (the test reads its verdict); the stand-in checks requests only.
            self._api = OpenAPI.from_dict(doc, config=Config(spec_validator_cls=None))

    def _route(self, method: str, path: str) -> tuple[str, dict[str, str], dict[str, Any]] | None:
        """The operation a request is for: the most specific template (fewest parameters) that matches."""
        best = None
        for m, pattern, template, op in self._routes:
            if m != method:
                continue
            hit = pattern.match(path)
            if hit is not None:
                params = {k[1:]: v for k, v in hit.groupdict().items()}
                if best is None or len(params) < len(best[1]):
                    best = (template, params, op)
        return best

    def _check(
        self, method: str, path: str, query: list[tuple[str, str]], headers: Headers, body: bytes
    ) -> tuple[str | None, list[str]]:
        local = path[len(self.prefix) :] if path.startswith(self.prefix) else path
        route = self._route(method, local)
        if route is None:
            return None, [f"no operation {method.upper()} {local} in the document"]
        template, params, op = route
        op_id = op.get("operationId") or f"{method.upper()} {template}"
        ctype = headers.get("content-type", "")
        if self.version == "2.0":
            from urllib.parse import unquote

            from bravado_core.request import unmarshal_request

            operation = self._op2(method, template)
            form = dict(parse_qsl(body.decode())) if "x-www-form-urlencoded" in ctype else {}
            try:
                with warnings.catch_warnings():  # deprecations, and formats it does not know (int-or-string)
                    warnings.simplefilter("ignore")
                    unmarshal_request(
                        _Bravado({k: unquote(v) for k, v in params.items()}, query, headers, form, body), operation
                    )
            except Exception as exc:
                return op_id, [f"{type(exc).__name__}: {exc}"]
            return op_id, []
        cookie = {}
        for part in headers.get("cookie", "").split(";"):
            if "=" in part:
                k, v = part.strip().split("=", 1)
                cookie[k] = v
        from openapi_core.datatypes import RequestParameters

        request = _Req(
            _HOST,
            path,
            method,
            body or None,
            ctype.lower(),
            RequestParameters(query=ImmutableMultiDict(query), header=headers, cookie=ImmutableMultiDict(cookie)),
        )
        try:
            with warnings.catch_warnings():  # openapi-core checks no OAuth 2 scheme (it says so, and passes it)
                warnings.filterwarnings("ignore", "Unsupported scheme type", UserWarning)
                self._api.validate_request(request)
        except Exception as exc:
            causes = [str(c) for c in getattr(exc, "schema_errors", None) or ()]
            inner = exc.__cause__
            detail = f"{type(exc).__name__}: {exc}" + (f" ({type(inner).__name__}: {inner})" if inner else "")
            sub = getattr(inner, "schema_errors", None) or ()
            return op_id, [detail, *causes, *(str(s.message) for s in sub)]
        return op_id, []

    def _op2(self, method: str, template: str) -> Any:
        for resource in self._spec.resources.values():
            for operation in resource.operations.values():
                if operation.path_name == template and operation.http_method == method:
                    return operation
        raise LookupError(f"{method} {template}")

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            body = await _body(receive)
            method = scope["method"].lower()
            path = scope["path"]
            query = parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True)
            headers = Headers([(k.decode(), v.decode()) for k, v in scope["headers"]])
            op_id, errors = self._check(method, path, query, headers, body)
            self.seen.append(Seen(method.upper(), path, op_id, errors, query, dict(headers.items()), body))
            if errors:
                status, payload = 400, {"errors": errors}
            else:
                canned = self.responses.get(op_id or "")
                if isinstance(canned, dict) and "status" in canned and "body" in canned:
                    status, payload = canned["status"], canned["body"]
                elif canned is not None:
                    status, payload = 200, canned
                else:
                    echo = {"operation": op_id, "method": method.upper(), "path": path, "query": query}
                    if body:
                        try:
                            echo["body"] = orjson.loads(body)
                        except orjson.JSONDecodeError:
                            echo["body"] = body.decode(errors="replace")
                    status, payload = 200, echo
            data = orjson.dumps(payload)
            await send(
                {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": data})

        return app

    @property
    def invalid(self) -> list[Seen]:
        return [s for s in self.seen if s.errors]


@asynccontextmanager
async def standin(
    document: dict[str, Any], prefix: str = "", responses: dict[str, Any] | None = None, origin: str | None = None
) -> AsyncIterator[StandIn]:
    """Serve the stand-in of ``document`` on 127.0.0.1 for the block; ``.url`` is its base URL (with ``prefix``)."""
    s = StandIn(document, prefix, responses or {}, origin=origin)
    async with serving(s.app()) as base:
        s.url = base + prefix
        yield s
