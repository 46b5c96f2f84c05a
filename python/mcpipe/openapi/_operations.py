"""The operations of a document, each made a tool's plan: its name, its input schema (parameters and request
body), how its arguments become a request, the security it needs; or refused, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import urljoin

import orjson
from referencing.exceptions import Unresolvable

from mcpipe._util import glob_matcher
from mcpipe.errors import ErrorCode, Problem
from mcpipe.openapi._config import OpenApiConfig, OpenApiFilter
from mcpipe.openapi._document import Document
from mcpipe.openapi._schema import Bundler, SchemaProblem

__all__ = ["Body", "Operation", "Param", "Refused", "SecurityScheme", "operations"]

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
Location = Literal["path", "query", "header", "cookie"]
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_JSON = re.compile(r"^application/([a-z0-9.+-]*\+)?json(;.*)?$|^\*/\*$")


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter: where it goes, the argument it comes from, how it is written."""

    name: str
    location: Location
    arg: str
    required: bool
    style: str
    explode: bool
    as_json: bool = False
    """A 3.x parameter described by ``content: application/json``: its value is sent as JSON text."""


@dataclass(frozen=True, slots=True)
class Body:
    """The request body: the argument holding it and how it is encoded."""

    arg: str
    media: str
    required: bool
    encoding: Literal["json", "form", "multipart", "text"]
    fields: tuple[str, ...] = ()
    """Swagger 2.0's ``formData`` parameters: the body is these arguments (not one ``body`` object)."""
    styles: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """A form's per-property ``encoding`` (style, explode)."""


@dataclass(frozen=True, slots=True)
class SecurityScheme:
    """How one scheme presents a secret: a header, query parameter or cookie named ``name``, with a prefix."""

    name: str
    kind: Literal["apiKey", "bearer", "basic"]
    location: Location = "header"
    param: str = "Authorization"


@dataclass(slots=True)
class Operation:
    """One operation made a tool."""

    tool: str
    method: str
    path: str
    operation_id: str | None
    location: str
    summary: str
    description: str
    tags: tuple[str, ...]
    params: list[Param]
    body: Body | None
    input_schema: dict[str, Any]
    security: list[dict[str, list[str]]]
    servers: list[str]
    deprecated: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """An operation not served, and why (located in the config's section and the document)."""

    location: str
    reason: str

    def problem(self, where: str) -> Problem:
        return Problem(f"{where}: {self.location}", ErrorCode.INVALID_CONFIG, self.reason)


class _Refusal(Exception):
    pass


def _matches(f: OpenApiFilter | None, op: dict[str, Any], method: str, path: str, names: tuple[str, ...]) -> bool:
    if f is None:
        return False
    if f.tags and any(glob_matcher(f.tags)(t) for t in op.get("tags") or () if isinstance(t, str)):
        return True
    if f.paths and glob_matcher(f.paths)(path):
        return True
    if f.methods and method.upper() in {m.upper() for m in f.methods}:
        return True
    return bool(f.operations) and any(glob_matcher(f.operations)(n) for n in names)


def tool_name(raw: str) -> str:
    """A tool name from an ``operationId`` or a derived one: letters, digits, ``_``, ``-``, ``.``."""
    return _TOOL_NAME.sub("_", raw).strip("_") or "operation"


def _derived(method: str, path: str) -> str:
    parts = [p.strip("{}") for p in path.split("/") if p]
    return tool_name("_".join([method, *parts]))


def security_schemes(doc: Document) -> dict[str, SecurityScheme | str]:
    """The document's security schemes by name: how each is presented, or why mcpipe cannot present it."""
    root = doc.root
    raw = (
        root.get("securityDefinitions")
        if doc.version == "2.0"
        else (root.get("components") or {}).get("securitySchemes")
    ) or {}
    out: dict[str, SecurityScheme | str] = {}
    if not isinstance(raw, dict):
        return out
    for name, scheme in raw.items():
        if isinstance(scheme, dict) and "$ref" in scheme:
            try:
                scheme = doc.resolver.lookup(scheme["$ref"]).contents
            except Unresolvable:
                out[name] = "its `$ref` does not resolve"
                continue
        if not isinstance(scheme, dict):
            continue
        kind = scheme.get("type")
        if kind == "apiKey":
            where = scheme.get("in")
            if where in ("header", "query", "cookie") and isinstance(scheme.get("name"), str):
                out[name] = SecurityScheme(name, "apiKey", where, scheme["name"])
            else:
                out[name] = "an apiKey scheme names where its key goes (`in`, `name`)"
        elif kind == "basic" or (kind == "http" and str(scheme.get("scheme", "")).lower() == "basic"):
            out[name] = SecurityScheme(name, "basic")
        elif kind == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
            out[name] = SecurityScheme(name, "bearer")
        elif kind in ("oauth2", "openIdConnect"):
            out[name] = SecurityScheme(name, "bearer")  # the token an OAuth flow issues, as a bearer
        else:
            out[name] = f"a `{kind}` scheme ({scheme.get('scheme', '')}) is not presented by mcpipe".replace(" ()", "")
    return out


def base_urls(doc: Document, cfg: OpenApiConfig, servers: object, where: str) -> list[str]:
    """The base URLs of a list of ``servers`` (3.x) or the document's (2.0): variables filled in."""
    if doc.version == "2.0":
        host = doc.root.get("host")
        if not isinstance(host, str) or not host:
            return []
        schemes = doc.root.get("schemes") or ["https"]
        scheme = "https" if "https" in schemes else str(schemes[0])
        return [f"{scheme}://{host}{doc.root.get('basePath') or ''}"]
    out = []
    for server in servers if isinstance(servers, list) else []:
        if not isinstance(server, dict) or not isinstance(server.get("url"), str):
            continue
        url = server["url"]
        for var, spec in (server.get("variables") or {}).items():
            value = cfg.server_variables.get(var, spec.get("default", "") if isinstance(spec, dict) else "")
            url = url.replace("{" + var + "}", str(value))
        if not url.startswith(("http://", "https://")):
            if not doc.uri.startswith(("http://", "https://")):
                continue  # relative to a document read from a file: base_url says where
            url = urljoin(doc.uri, url)
        out.append(url.rstrip("/"))
    return out


def operations(doc: Document, cfg: OpenApiConfig, where: str) -> tuple[list[Operation], list[Refused], int]:
    """Every operation the config serves, those refused (located, with the reason), and how many the
    filters left out."""
    paths = doc.root.get("paths") or {}
    if not isinstance(paths, dict):
        return [], [Refused("paths", "`paths` is not an object")], 0
    root_security = doc.root.get("security")
    root_servers = base_urls(doc, cfg, doc.root.get("servers"), where)
    served: list[Operation] = []
    refused: list[Refused] = []
    left_out = 0
    seen: dict[str, str] = {}
    resolver = doc.resolver
    for path, item in paths.items():
        loc_path = f"paths.{path}"
        item_resolver = resolver
        if isinstance(item, dict) and isinstance(item.get("$ref"), str):
            try:
                r = resolver.lookup(item["$ref"])
            except Unresolvable:
                refused.append(Refused(loc_path, f"its `$ref` `{item['$ref']}` does not resolve"))
                continue
            item, item_resolver = r.contents, r.resolver
        if not isinstance(item, dict):
            continue
        item_servers = base_urls(doc, cfg, item.get("servers"), where) if "servers" in item else root_servers
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            location = f"{loc_path}.{method}"
            op_id = op.get("operationId") if isinstance(op.get("operationId"), str) else None
            key = f"{method.upper()} {path}"
            chosen = cfg.names.get(op_id) if op_id is not None else None
            chosen = chosen or cfg.names.get(key)
            name = tool_name(chosen or op_id or _derived(method, path))
            full = f"{cfg.prefix}.{name}" if cfg.prefix else name
            names = tuple(n for n in (op_id, full, name, key) if n)
            if cfg.include is not None and not _matches(cfg.include, op, method, path, names):
                left_out += 1
                continue
            if _matches(cfg.exclude, op, method, path, names):
                left_out += 1
                continue
            if len(full) > 128:
                refused.append(
                    Refused(
                        location, f"its tool name `{full[:40]}...` is longer than 128 characters: name it in `names`"
                    )
                )
                continue
            if full in seen:
                refused.append(
                    Refused(location, f"tool name `{full}` is already {seen[full]}'s: name one of them in `names`")
                )
                continue
            try:
                params, body, schema = _inputs(doc, item, op, item_resolver, cfg)
            except (_Refusal, SchemaProblem) as exc:
                refused.append(Refused(location, str(exc)))
                continue
            size = len(orjson.dumps(schema))
            if size > cfg.max_schema_bytes:
                refused.append(
                    Refused(
                        location,
                        f"its input schema is {size} bytes once its $refs are resolved, "
                        f"more than max_schema_bytes ({cfg.max_schema_bytes})",
                    )
                )
                continue
            servers = base_urls(doc, cfg, op.get("servers"), where) if "servers" in op else item_servers
            security = op.get("security", root_security)
            seen[full] = location
            served.append(
                Operation(
                    tool=full,
                    method=method.upper(),
                    path=path,
                    operation_id=op_id,
                    location=location,
                    summary=_text(op.get("summary")),
                    description=_text(op.get("description")),
                    tags=tuple(t for t in op.get("tags") or () if isinstance(t, str)),
                    params=params,
                    body=body,
                    input_schema=schema,
                    security=[s for s in security if isinstance(s, dict)] if isinstance(security, list) else [],
                    servers=servers,
                    deprecated=op.get("deprecated") is True,
                )
            )
            if len(served) + len(refused) > cfg.max_operations:
                refused.append(
                    Refused("paths", f"the document has more than max_operations ({cfg.max_operations}) operations")
                )
                return served[: cfg.max_operations], refused, left_out
    return served, refused, left_out


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


def _resolved(node: Any, resolver: Any, what: str) -> tuple[Any, Any]:
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        try:
            r = resolver.lookup(node["$ref"])
        except Unresolvable:
            raise _Refusal(f"{what}'s `$ref` `{node['$ref']}` does not resolve") from None
        return _resolved(r.contents, r.resolver, what)
    return node, resolver


_PARAM_SCHEMA_KEYS = (
    "type",
    "format",
    "items",
    "enum",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "multipleOf",
    "x-nullable",
)


def _inputs(
    doc: Document, item: dict[str, Any], op: dict[str, Any], resolver: object, cfg: OpenApiConfig
) -> tuple[list[Param], Body | None, dict[str, Any]]:
    bundler = Bundler(doc.version)
    raw: dict[tuple[str, str], tuple[dict[str, Any], Any]] = {}
    for source in (item.get("parameters") or [], op.get("parameters") or []):
        for i, p in enumerate(source if isinstance(source, list) else []):
            p, r = _resolved(p, resolver, f"parameter {i}")
            if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not isinstance(p.get("in"), str):
                raise _Refusal(f"parameter {i} has no `name` or `in`")
            raw[(p["name"], p["in"])] = (p, r)  # an operation's parameter overrides its path item's
    props: dict[str, Any] = {}
    required: list[str] = []
    params: list[Param] = []
    body: Body | None = None
    form_fields: list[str] = []
    taken = {name for name, _ in raw}
    for (name, where), (p, r) in raw.items():
        if where == "body":  # Swagger 2.0
            arg = _free(name, taken - {name}, props)
            props[arg] = _described(bundler.schema(p.get("schema", {}), r), p)
            if p.get("required"):
                required.append(arg)
            media = _media(op.get("consumes") or doc.root.get("consumes") or ["application/json"])
            body = Body(arg, media or "application/json", bool(p.get("required")), "json")
            continue
        if where == "formData":
            arg = _free(name, taken - {name}, props)
            props[arg] = _described(bundler.schema({k: v for k, v in p.items() if k in _PARAM_SCHEMA_KEYS}, r), p)
            if p.get("required"):
                required.append(arg)
            form_fields.append(arg)
            continue
        if where not in ("path", "query", "header", "cookie"):
            raise _Refusal(f"parameter `{name}` is in `{where}`, which is not a parameter location")
        arg = name if name not in props and name != "body" else _free(f"{name}_{where}", taken, props)
        as_json = False
        if doc.version == "2.0":
            schema = bundler.schema({k: v for k, v in p.items() if k in _PARAM_SCHEMA_KEYS}, r)
            fmt = p.get("collectionFormat", "csv")
            style, explode = {
                "csv": ("form" if where == "query" else "simple", False),
                "multi": ("form", True),
                "ssv": ("spaceDelimited", False),
                "pipes": ("pipeDelimited", False),
                "tsv": ("tabDelimited", False),
            }.get(fmt, ("form", False))
        else:
            if "schema" in p:
                schema = bundler.schema(p["schema"], r)
            elif isinstance(p.get("content"), dict) and p["content"]:
                media, entry = next(iter(p["content"].items()))
                schema = bundler.schema((entry or {}).get("schema", {}), r)
                as_json = bool(_JSON.match(media))
            else:
                schema = {}
            style = p.get("style") or ("form" if where in ("query", "cookie") else "simple")
            explode = p.get("explode", style == "form")
        if where == "path" or p.get("required") is True:
            required.append(arg)
        props[arg] = _described(schema, p)
        params.append(
            Param(
                name,
                cast(Location, where),
                arg,
                where == "path" or p.get("required") is True,
                str(style),
                bool(explode),
                as_json,
            )
        )
    if form_fields:
        consumes = op.get("consumes") or doc.root.get("consumes") or []
        multipart = "multipart/form-data" in consumes or any(
            (raw.get((f, "formData"), ({}, None))[0].get("type") == "file") for f in form_fields
        )
        body = Body(
            "",
            "multipart/form-data" if multipart else "application/x-www-form-urlencoded",
            False,
            "multipart" if multipart else "form",
            tuple(form_fields),
        )
    request = op.get("requestBody")
    if request is not None and doc.version != "2.0":
        request, r = _resolved(request, resolver, "the request body")
        content = request.get("content") if isinstance(request, dict) else None
        if not isinstance(content, dict) or not content:
            raise _Refusal("its request body has no `content`")
        media = _pick(content)
        if media is None:
            kinds = ", ".join(sorted(content))
            raise _Refusal(f"its request body is {kinds}, none of which mcpipe sends (JSON, form, text)")
        entry = content[media] or {}
        arg = _free("body", taken, props)
        schema = bundler.schema(entry.get("schema", {}), r) if isinstance(entry, dict) else {}
        props[arg] = _described(schema, request)
        if request.get("required") is True:
            required.append(arg)
        encoding = _encoding_of(media)
        styles: dict[str, tuple[str, bool]] = {}
        for prop, enc in (entry.get("encoding") or {}).items() if isinstance(entry, dict) else ():
            if isinstance(enc, dict):
                style = str(enc.get("style", "form"))
                styles[prop] = (style, bool(enc.get("explode", style == "form")))
        body = Body(arg, media, request.get("required") is True, encoding, (), styles)
    tool_schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        tool_schema["required"] = list(dict.fromkeys(required))
    tool_schema["additionalProperties"] = False
    if bundler.defs:
        tool_schema["$defs"] = bundler.defs
    return params, body, tool_schema


def _free(name: str, taken: set[str], props: Mapping[str, object]) -> str:
    candidate, n = name, 2
    while candidate in props or (candidate != name and candidate in taken):
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def _described(schema: object, p: Mapping[str, object]) -> Any:
    text = p.get("description")
    if isinstance(text, str) and text.strip() and isinstance(schema, dict) and "description" not in schema:
        return {**schema, "description": text.strip()}
    return schema


_ORDER = ("json", "form", "text")


def _encoding_of(media: str) -> Literal["json", "form", "multipart", "text"]:
    m = media.split(";", 1)[0].strip().lower()
    if _JSON.match(m):
        return "json"
    if m == "application/x-www-form-urlencoded":
        return "form"
    if m == "multipart/form-data":
        return "multipart"
    return "text"


def _pick(content: Mapping[str, object]) -> str | None:
    """The request body's media type mcpipe sends: JSON first, then a form, then text."""
    ranked = sorted(
        (m for m in content if isinstance(m, str)),
        key=lambda m: {"json": 0, "form": 1, "multipart": 2, "text": 3}[_encoding_of(m)],
    )
    for m in ranked:
        kind = _encoding_of(m)
        base = m.split(";", 1)[0].strip().lower()
        if kind != "text" or base.startswith("text/") or base in ("application/octet-stream", "application/xml"):
            return m
    return None


def _media(consumes: object) -> str | None:
    if not isinstance(consumes, list):
        return None
    for m in consumes:
        if isinstance(m, str) and _JSON.match(m.lower()):
            return m
    return next((m for m in consumes if isinstance(m, str)), None)
