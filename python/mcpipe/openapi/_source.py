"""The ``[openapi.NAME]`` sections as one tool source: each document read, checked and made tools at start."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import trio

from mcpipe._util import read_capped
from mcpipe.access import Credentials
from mcpipe.errors import ConfigError, ErrorCode, Problem
from mcpipe.kinds import ForbiddenError, HttpPolicy
from mcpipe.kinds.http import guarded_client
from mcpipe.openapi._config import OpenApiConfig, check_openapi
from mcpipe.openapi._document import Document, DocumentError, read_document, spec_problems
from mcpipe.openapi._operations import Refused, base_urls, operations, security_schemes
from mcpipe.openapi._tool import Api, OpenApiTool

__all__ = ["LoadedApi", "OpenApiSource", "load_openapi"]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_CODE = ErrorCode.INVALID_CONFIG


@dataclass
class LoadedApi:
    """One document made tools: what was served, what was refused and why, and what its check found.

    Attributes:
        name: the section's name.
        version: the document's version.
        tools: the served tools, by name.
        refused: the operations not served, located, with the reason.
        left_out: operations the filters left out.
        problems: what openapi-spec-validator found (warnings).
    """

    name: str
    version: str
    title: str
    tools: dict[str, OpenApiTool]
    refused: list[Refused]
    left_out: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def operations(self) -> int:
        return len(self.tools) + len(self.refused) + self.left_out


class OpenApiSource:
    """The tools of every ``[openapi.NAME]`` section (a tool source of the gateway)."""

    def __init__(self, apis: Sequence[LoadedApi]) -> None:
        self.apis = list(apis)
        self._tools: dict[str, OpenApiTool] = {}
        for api in self.apis:
            for name, tool in api.tools.items():
                self._tools.setdefault(name, tool)

    def get(self, name: str) -> OpenApiTool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[OpenApiTool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def warnings(self) -> list[Problem]:
        """The refused operations and the documents' problems, located in the config (``openapi.NAME: ...``)."""
        out: list[Problem] = []
        for api in self.apis:
            out.extend(r.problem(f"openapi.{api.name}") for r in api.refused)
            out.extend(api.problems)
        return out


def _host(url: str) -> str | None:
    try:
        return httpx2.URL(url).host or None
    except httpx2.InvalidURL:
        return None


def _expand(value: str, where: str, environ: Mapping[str, str], problems: list[Problem]) -> str:
    def repl(m: re.Match[str]) -> str:
        got = environ.get(m.group(1))
        if got is None:
            if m.group(2) is None:
                problems.append(Problem(where, _CODE, f"environment variable `{m.group(1)}` is not set"))
                return ""
            return m.group(2)
        return got

    return _VAR.sub(repl, value)


async def load_openapi(
    sections: Mapping[str, OpenApiConfig],
    *,
    base_dir: str = ".",
    credentials: Credentials | None = None,
    allowed_hosts: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> OpenApiSource:
    """Read every section's document and make its operations tools (the heavy work in worker threads).

    Args:
        sections: the ``[openapi.NAME]`` sections.
        base_dir: the config file's directory (relative ``spec`` paths).
        credentials: the ``[credentials]`` security schemes present.
        allowed_hosts: more hosts calls may reach (``[outbound] http.allowed_hosts``).
        environ: where ``${VAR}`` in ``headers`` is read (default: the process's environment).

    Raises:
        ConfigError: a section's problems, or a document that cannot be read (each located).
    """
    creds = credentials if credentials is not None else Credentials()
    problems = check_openapi(sections, creds.configs)
    if problems:
        raise ConfigError(problems)
    env = os.environ if environ is None else environ
    apis: list[LoadedApi] = []
    for name, cfg in sections.items():
        try:
            apis.append(await _load(name, cfg, base_dir, creds, allowed_hosts, env, problems))
        except DocumentError as exc:
            problems.append(Problem(f"openapi.{name}.spec", _CODE, str(exc).split(": ", 1)[-1]))
    if problems:
        raise ConfigError(problems)
    return OpenApiSource(apis)


def _policy(cfg: OpenApiConfig, where: str, hosts: Sequence[str], max_bytes: int) -> HttpPolicy:
    """The outbound policy of one section's requests to ``hosts`` (fetching its document, calling its API)."""
    return HttpPolicy(
        allowed_hosts=tuple(hosts),
        allow_private=cfg.allow_private,
        max_response_bytes=max_bytes,
        verify=cfg.verify,
        timeout_ms=cfg.timeout_ms,
        allow_hint=f"list it in {where}.allowed_hosts",
    )


async def _load(
    name: str,
    cfg: OpenApiConfig,
    base_dir: str,
    credentials: Credentials,
    allowed_hosts: Sequence[str],
    environ: Mapping[str, str],
    problems: list[Problem],
) -> LoadedApi:
    where = f"openapi.{name}"
    hosts = [*cfg.allowed_hosts, *allowed_hosts]
    if isinstance(cfg.spec, str) and cfg.spec.startswith(("http://", "https://")):
        h = _host(cfg.spec)
        hosts += [h] if h else []
    fetch_policy = _policy(cfg, where, hosts, cfg.max_spec_bytes)

    async def fetch(url: str, max_bytes: int) -> bytes:
        return await _fetch(fetch_policy, url, max_bytes, cfg.timeout_ms, where)

    doc: Document = await read_document(
        cfg.spec, where=f"{where}.spec", base_dir=base_dir, max_bytes=cfg.max_spec_bytes, fetch=fetch, name=name
    )
    prefix = name if cfg.prefix is None else cfg.prefix
    section = cfg if cfg.prefix == prefix else _with_prefix(cfg, prefix)
    found: list[Problem] = []
    if cfg.validate:
        found = await trio.to_thread.run_sync(spec_problems, doc, f"{where}: document")
    served, refused, left_out = await trio.to_thread.run_sync(operations, doc, section, where)
    refused += _refused_by_validation(served, found)
    refusing = {r.location for r in refused}
    served = [op for op in served if op.location not in refusing]
    base_url = cfg.base_url
    if base_url is None and not any(op.servers for op in served) and served:
        problems.append(Problem(f"{where}.base_url", _CODE, "the document names no absolute server URL: set base_url"))
    api_hosts = list(hosts)
    for url in [base_url, *base_urls(doc, section, doc.root.get("servers"), where)] + [
        u for op in served for u in op.servers[:1]
    ]:
        h = _host(url) if url else None
        if h and h not in api_hosts:
            api_hosts.append(h)
    call_policy = _policy(cfg, where, api_hosts, cfg.max_response_bytes)
    headers = {k: _expand(v, f"{where}.headers.{k}", environ, problems) for k, v in cfg.headers.items()}
    schemes = security_schemes(doc)
    for scheme in cfg.auth:
        why = schemes.get(scheme)
        if why is None:
            known = ", ".join(sorted(schemes)) or "none"
            problems.append(
                Problem(f"{where}.auth.{scheme}", _CODE, f"the document has no security scheme `{scheme}` ({known})")
            )
        elif isinstance(why, str):
            problems.append(Problem(f"{where}.auth.{scheme}", _CODE, why))
    api = Api(
        name, base_url, call_policy, credentials, dict(cfg.auth), schemes, headers, cfg.answer, cfg.max_description
    )
    tools = {op.tool: OpenApiTool(op, api) for op in served}
    info = doc.root.get("info") or {}
    title = str(info.get("title", "")) if isinstance(info, dict) else ""
    return LoadedApi(name, doc.version, title, tools, refused, left_out, found)


def _with_prefix(cfg: OpenApiConfig, prefix: str) -> OpenApiConfig:
    import msgspec

    return msgspec.structs.replace(cfg, prefix=prefix)


_REQUEST_SIDE = re.compile(
    r"^paths\.(?P<path>/[^:]*?)\.(?P<method>get|put|post|delete|options|head|patch|trace)\.(parameters|requestBody)"
)


def _refused_by_validation(served: list[Any], found: list[Problem]) -> list[Refused]:
    """An operation whose parameters or request body the validator found wrong is refused, with its words."""
    by_location = {op.location: op for op in served}
    out: dict[str, Refused] = {}
    for p in found:
        tail = p.location.split(": document.", 1)[-1]
        m = _REQUEST_SIDE.match(tail)
        if m is None:
            continue
        location = f"paths.{m.group('path')}.{m.group('method')}"
        if location in by_location and location not in out:
            out[location] = Refused(location, f"openapi-spec-validator: {tail}: {p.message}")
    return list(out.values())


async def _fetch(policy: HttpPolicy, url: str, max_bytes: int, timeout_ms: int, where: str) -> bytes:
    with trio.move_on_after(timeout_ms / 1000) as scope:
        try:
            async with guarded_client(policy) as client:
                response = await client.send(client.build_request("GET", url), stream=True)
                try:
                    body, larger = await read_capped(response, max_bytes)
                finally:
                    await response.aclose()
        except ForbiddenError as exc:
            raise DocumentError(f"{where}: {url}: {exc}") from None
        except (httpx2.HTTPError, OSError) as exc:
            raise DocumentError(f"{where}: cannot fetch {url}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:
            if type(exc).__module__.startswith("httpcore"):
                raise DocumentError(f"{where}: cannot fetch {url}: {type(exc).__name__}: {exc}") from None
            raise
        if larger:
            raise DocumentError(f"{where}: {url} is larger than max_spec_bytes ({max_bytes})")
        if response.status_code != 200:
            raise DocumentError(f"{where}: {url} answered HTTP {response.status_code}")
        return body
    assert scope.cancelled_caught
    raise DocumentError(f"{where}: {url} did not answer within {timeout_ms} ms")
