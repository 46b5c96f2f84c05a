"""Reading an OpenAPI document: the file, URL or inline value, every file its ``$ref``s name, its version, and
the problems openapi-spec-validator finds in it.

``$ref``s are resolved by ``referencing`` (the library jsonschema, jsonschema-path and openapi-core resolve
with): every document the root names is read first (a local document may name local files and URLs, a
fetched one only URLs, each URL under the outbound policy), then registered, so resolving never reads
anything itself. OpenAPI 3.1 schemas are JSON Schema 2020-12 resources: their ``$id``s and ``$anchor``s are
registered too.
"""

from __future__ import annotations

import gzip
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.request import url2pathname

import orjson
import trio
from referencing import Registry, Resource, Specification
from referencing.jsonschema import DRAFT202012

from mcpipe._yaml import load_yaml
from mcpipe.errors import ErrorCode, MCPipeError, Problem

__all__ = ["Document", "DocumentError", "Version", "read_document", "spec_problems"]

Version = Literal["2.0", "3.0", "3.1"]

MAX_DOCUMENTS = 256
"""The most files one document may pull in through its ``$ref``s."""

OPAQUE: Specification[Any] = Specification.OPAQUE


class DocumentError(MCPipeError):
    """A document that cannot be read or is not an OpenAPI document (located)."""

    code: str = ErrorCode.INVALID_CONFIG


Fetch = Callable[[str, int], Awaitable[bytes]]
"""Reads an ``http(s)`` URL (bounded, under the outbound policy): ``fetch(url, max_bytes)``."""


@dataclass
class Document:
    """One OpenAPI document, its ``$ref``s resolvable.

    Attributes:
        root: the parsed document.
        uri: its URI (``file:///...``, ``https://...``, or ``urn:mcpipe:openapi:NAME`` for an inline one).
        version: ``2.0``, ``3.0`` or ``3.1`` (3.2 is read as 3.1).
        registry: every file it names, registered by URI (3.1: its schemas' ``$id``s too).
        files: the URIs read besides the root.
        unread: the files named that could not be read, with why.
    """

    root: dict[str, Any]
    uri: str
    version: Version
    registry: Registry[Any]
    files: dict[str, Any] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)
    """The files its ``$ref``s name that could not be read, with why."""

    @property
    def resolver(self) -> Any:
        return self.registry.resolver(self.uri)


def _parse(data: bytes, where: str, uri: str) -> Any:
    if uri.endswith(".gz") or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DocumentError(f"{where}: not a gzip file: {exc}") from None
    head = data.lstrip()[:1]
    try:
        if head in (b"{", b"["):
            return orjson.loads(data)
        return load_yaml(data, timestamps=False)
    except orjson.JSONDecodeError as exc:
        raise DocumentError(f"{where}: not valid JSON: {exc}") from None
    except Exception as exc:  # yaml's errors (and the alias bound's)
        text = " ".join(str(exc).split())
        raise DocumentError(f"{where}: not valid YAML: {text}") from None


def _version(root: object, where: str) -> Version:
    if not isinstance(root, dict):
        raise DocumentError(f"{where}: an OpenAPI document is an object, not {type(root).__name__}")
    swagger, openapi = root.get("swagger"), root.get("openapi")
    if swagger is not None:
        if str(swagger) != "2.0":
            raise DocumentError(f"{where}: Swagger {swagger} is not read (2.0 is)")
        return "2.0"
    if not isinstance(openapi, str):
        raise DocumentError(f"{where}: neither `openapi` (3.x) nor `swagger` (2.0) says what this document is")
    if openapi.startswith("3.0"):
        return "3.0"
    if openapi.startswith(("3.1", "3.2")):
        return "3.1"
    raise DocumentError(f"{where}: OpenAPI {openapi} is not read (3.0, 3.1 and Swagger 2.0 are)")


_NOT_READ = frozenset({"example", "examples", "enum", "const"})


def _refs(node: object) -> Iterator[str]:
    """Every ``$ref`` string in a document but those in values no tool reads (examples, enums, extensions)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            ref = n.get("$ref")
            if isinstance(ref, str):
                yield ref
            stack.extend(
                v
                for k, v in n.items()
                if isinstance(v, dict | list) and k not in _NOT_READ and not str(k).startswith("x-")
            )
        elif isinstance(n, list):
            stack.extend(v for v in n if isinstance(v, dict | list))


def _schema_ids(root: dict[str, Any], base: str) -> list[tuple[str, Resource[Any]]]:
    """3.1: the 2020-12 resources among the document's schemas (those with a ``$id``), by their URI."""
    out: list[tuple[str, Resource[Any]]] = []
    schemas = (root.get("components") or {}).get("schemas") or {}
    if not isinstance(schemas, dict):
        return out
    for schema in schemas.values():
        if isinstance(schema, dict) and isinstance(schema.get("$id"), str):
            resource = DRAFT202012.create_resource(schema)
            out.append((urljoin(base, schema["$id"]), resource))
    return out


async def read_document(
    spec: str | dict[str, Any],
    *,
    where: str,
    base_dir: str,
    max_bytes: int,
    fetch: Fetch,
    name: str,
) -> Document:
    """Read a document and every file its ``$ref``s name.

    Args:
        spec: a path (relative to ``base_dir``), a ``file://`` URI, an ``http(s)://`` URL, or the document.
        where: the config location problems name (``openapi.petstore.spec``).
        base_dir: the config file's directory.
        max_bytes: the largest file read.
        fetch: reads an ``http(s)`` URL under the outbound policy.
        name: the section's name (an inline document's URI).

    Raises:
        DocumentError: a file cannot be read or parsed, or is not an OpenAPI document.
    """
    if isinstance(spec, dict):
        uri = f"urn:mcpipe:openapi:{name}"
        root: Any = spec
    else:
        uri = _uri_of(spec, base_dir)
        root = _parse(await _read(uri, where, max_bytes, fetch, local=True), where, uri)
    version = _version(root, where)
    files: dict[str, Any] = {}
    unread: dict[str, str] = {}
    resources: list[tuple[str, Resource[Any]]] = [(uri, OPAQUE.create_resource(root))]
    known: set[str] = {uri}
    if version == "3.1":
        for rid, resource in _schema_ids(root, uri):
            resources.append((rid, resource))
            known.add(rid)
    queue = [(uri, root)]
    while queue:
        doc_uri, doc = queue.pop()
        local = doc_uri.startswith("file:")
        for ref in _refs(doc):
            target, _ = urldefrag(urljoin(doc_uri, ref))
            if not target or target in known:
                continue
            scheme = urlsplit(target).scheme
            if scheme not in ("file", "http", "https") or (scheme == "file" and not local):
                continue  # left unresolvable: the operations that need it are refused, with the reason
            known.add(target)
            if len(files) >= MAX_DOCUMENTS:
                raise DocumentError(f"{where}: its $refs name more than {MAX_DOCUMENTS} files")
            at = f"{where} ($ref `{ref}` of {_short(doc_uri)})"
            try:
                content = _parse(await _read(target, at, max_bytes, fetch, local=local), at, target)
            except DocumentError as exc:
                unread[target] = str(exc)  # the operations that need it are refused, with this reason
                continue
            files[target] = content
            resources.append((target, OPAQUE.create_resource(content)))
            queue.append((target, content))
    registry: Registry[Any] = Registry().with_resources(resources)
    if version == "3.1":
        registry = registry.crawl()
    return Document(root, uri, version, registry, files, unread)


def _short(uri: str) -> str:
    return uri.rsplit("/", 1)[-1] if uri.startswith("file:") else uri


def _uri_of(spec: str, base_dir: str) -> str:
    if spec.startswith(("http://", "https://", "file://")):
        return spec
    return (Path(base_dir) / spec).resolve().as_uri()


async def _read(uri: str, where: str, max_bytes: int, fetch: Fetch, *, local: bool) -> bytes:
    scheme = urlsplit(uri).scheme
    if scheme in ("http", "https"):
        return await fetch(uri, max_bytes)
    if scheme != "file" or not local:
        raise DocumentError(f"{where}: `{uri}` cannot be read (a file, or an http(s) URL)")
    path = trio.Path(url2pathname(urlsplit(uri).path))
    try:
        size = (await path.stat()).st_size
        if size > max_bytes:
            raise DocumentError(f"{where}: `{path}` is {size} bytes, more than max_spec_bytes ({max_bytes})")
        return await path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"{where}: cannot read `{path}`: {exc.strerror or exc}") from None


class _Served(dict[str, Any]):
    """The validator's URL handlers: every scheme answered from the files already read, none fetched."""

    def __init__(self, doc: Document) -> None:
        super().__init__()
        self._doc = doc

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> Callable[[str], Any]:
        return self._serve

    def _serve(self, uri: str) -> Any:
        target, _ = urldefrag(uri)
        if target == self._doc.uri:
            return self._doc.root
        if target in self._doc.files:
            return self._doc.files[target]
        raise LookupError(f"`{target}` was not read")


def spec_problems(doc: Document, where: str, limit: int = 200) -> list[Problem]:
    """What openapi-spec-validator finds wrong in the document, located (``paths./pets.get.parameters[0]``),
    at most ``limit`` of them; the validator failing on the document is one problem."""
    from jsonschema_path import SchemaPath
    from openapi_spec_validator.shortcuts import get_validator_cls
    from openapi_spec_validator.validation.exceptions import ValidatorDetectError

    try:
        cls = get_validator_cls(doc.root)
    except ValidatorDetectError:
        return [Problem(where, ErrorCode.INVALID_CONFIG, "openapi-spec-validator does not know this version")]
    path = SchemaPath.from_dict(doc.root, base_uri=doc.uri, handlers=_Served(doc))
    problems: list[Problem] = []
    try:
        for error in cls(path).iter_errors():
            location = ".".join([where, *(_part(p) for p in error.absolute_path)])
            message = " ".join(str(error.message).split())
            problems.append(Problem(location.replace(".[", "["), ErrorCode.INVALID_CONFIG, message[:300]))
            if len(problems) >= limit:
                break
    except Exception as exc:  # the validator stopping on what it cannot resolve, say
        text = " ".join(str(exc).split())[:300]
        problems.append(
            Problem(where, ErrorCode.INVALID_CONFIG, f"the validator stopped: {type(exc).__name__}: {text}")
        )
    return problems


def _part(p: object) -> str:
    return f"[{p}]" if isinstance(p, int) else str(p)
