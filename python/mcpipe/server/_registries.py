"""MCP registries whose servers are served as downstream servers, kept in step with them (``registries``).

Every ``interval_s`` each registry's server list is read from its ``/v0.1/servers`` API (``version=latest``,
deleted entries included, cursor-paginated: at most 200 pages and 20 000 entries, each answer at most 5 MiB,
read as it comes and given up past that, within 10 s) and turned into the set of servers to serve; the servers
that joined are connected, the ones that left (deleted in the registry, deprecated under ``deprecated:
exclude``, filtered out, no longer latest) are closed, and connected clients are told the lists changed. A
crawl that fails changes nothing. This is mcpg's registry sync (``src/runtime/registry_sync``), its rules kept:

- an entry is served when it is latest, not deleted (nor deprecated under ``exclude``), admitted by
  ``namespaces`` (the part of its name before ``/``), ``include`` and ``exclude`` (exact names, or ending with
  ``*``), not disabled in ``servers``, and has a ``streamable-http`` remote; packages-only entries are not;
- a server pinned to a ``version`` (``servers.<name>.version``) is fetched at that version;
- its URL's ``{variables}`` and its declared headers take the operator's values (``servers.<name>``), else the
  registry's value or default; one left without a value (a required header, a URL variable) leaves the server
  out, logged;
- the registry never relaxes transport security: only ``https://`` servers, and at a private or loopback
  address only with ``allow_private_servers``; the registry itself is reached over ``https`` unless
  ``allow_http``, at a private address only with ``allow_private``;
- at most ``max_servers`` (by name), the rest left out, logged;
- each is served as ``<registry>--<name>`` with the prefix of its dotted name (``com.acme/crm`` ->
  ``com.acme.crm.<tool>``), ``expose`` (tools, resources, templates, prompts), ``forward_bearer``, and its
  ``credential`` (``{server}`` in the name standing for the server's registry name; a name no credential has
  reads a static secret from the environment variable ``credential_env`` names, ``{server}`` there upper-cased
  with every other character ``_``); the registry's ``trust`` rule guards its ``<prefix>.*`` names;
- ``oauth_discovery``: a server is served once its OAuth metadata is found (RFC 9728 protected-resource metadata
  at its URL, whose ``resource`` is that URL exactly, then RFC 8414 metadata of its first authorization server,
  whose ``issuer`` round-trips): a per-caller credential (token exchange, ID-JAG) is then issued for it with the
  discovered ``audience``/``resource`` and token endpoint; the last metadata found is reused when discovery fails.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import msgspec
import orjson
import trio

from mcpipe._util import read_capped
from mcpipe.access import Credentials, EnvCredential
from mcpipe.config import McpServerConfig, RegistrySourceConfig
from mcpipe.downstream import Downstreams
from mcpipe.kinds import HttpPolicy
from mcpipe.kinds.http import guarded_client

__all__ = ["RegistrySync", "Skipped"]

_log = logging.getLogger("mcpipe.registries")

REQUEST_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 5 * 1024 * 1024
PAGE_LIMIT = 100
MAX_PAGES = 200
MAX_ENTRIES = MAX_PAGES * PAGE_LIMIT
"""Entries one crawl keeps, all pages together (a registry may ignore ``limit``)."""
OFFICIAL = "io.modelcontextprotocol.registry/official"


class RegistryError(Exception):
    """A registry that cannot be read (one line: why)."""


async def _capped_get(http: Any, url: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``url``: its status and body, read as it comes and given up past :data:`MAX_RESPONSE_BYTES` (the
    connection closed there, nothing more read).

    Raises:
        RegistryError: the body is larger.
    """
    async with http.stream("GET", url, headers=dict(headers or {})) as response:
        body, larger = await read_capped(response, MAX_RESPONSE_BYTES)
        if larger:
            raise RegistryError(f"{url}: the answer is larger than {MAX_RESPONSE_BYTES} bytes")
        return response.status_code, body


class Skipped(Exception):
    """A registry entry that is not served: ``reason`` (``filtered``, ``missing_input``, ...) and ``detail``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class _Entry:
    server: dict[str, Any]
    status: str
    latest: bool


@dataclass(slots=True)
class _Served:
    name: str
    prefix: str
    config: McpServerConfig
    digest: bytes


@dataclass(slots=True)
class _State:
    served: dict[str, _Served] = field(default_factory=dict)
    """registry server name -> what is served for it"""
    discovered: dict[str, dict[str, str]] = field(default_factory=dict)
    """registry server name -> its last OAuth metadata found (``audience``, ``resource``, ``redeem_token_url``)"""


def _glob(pattern: str, name: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else pattern == name


def _admitted(reg: RegistrySourceConfig, name: str) -> bool:
    if reg.namespaces and name.split("/", 1)[0] not in reg.namespaces:
        return False
    if any(_glob(p, name) for p in reg.exclude):
        return False
    return any(_glob(p, name) for p in reg.include)


def _provided(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return None
    got = value.get("value") if value.get("value") is not None else value.get("default")
    return str(got) if got is not None else None


def _public(host: str) -> bool:
    """Whether every address ``host`` resolves to is public (blocking: call in a thread)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        if not address.is_global:
            return False
    return bool(infos)


class RegistrySync:
    """Keeps the servers of ``registries`` served.

    Args:
        registries: the config's ``registries``.
        downstreams: the downstream servers they are added to.
        credentials: the outbound credentials (a registry server's is looked up, or added, there).
        trust: the trust rules (each served server's ``<prefix>.*`` rule is set there), or None.
        changed: told after each sync that changed the servers (the clients are told the lists changed).
    """

    def __init__(
        self,
        registries: list[RegistrySourceConfig],
        downstreams: Downstreams,
        credentials: Credentials,
        trust: Any,
        changed: Callable[[], Awaitable[None]] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        import os

        self.registries = registries
        self.downstreams = downstreams
        self.credentials = credentials
        self.trust = trust
        self.changed = changed
        self.environ = dict(os.environ) if environ is None else dict(environ)
        self.state = {r.name: _State() for r in registries}
        self.synced = trio.Event()
        """Set once every registry was read once (whether or not it answered)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sync each registry now and every ``interval_s`` after, until cancelled."""
        async with trio.open_nursery() as nursery:
            first = [trio.Event() for _ in self.registries]
            for reg, done in zip(self.registries, first, strict=True):
                nursery.start_soon(self._loop, reg, done)
            task_status.started()
            for done in first:
                await done.wait()
            self.synced.set()

    async def _loop(self, reg: RegistrySourceConfig, first: trio.Event) -> None:
        while True:
            try:
                await self.sync(reg)
            except RegistryError as exc:
                _log.warning("registry %s: %s; its servers are kept as they were", reg.name, exc)
            first.set()
            await trio.sleep(reg.interval_s)

    # -- one sync -------------------------------------------------------------------------------------

    async def sync(self, reg: RegistrySourceConfig) -> dict[str, str]:
        """Read ``reg`` once and serve what it lists; answers the servers left out, with why.

        Raises:
            RegistryError: the registry could not be read (nothing changed).
        """
        async with self._client(reg) as http:
            entries = await self._crawl(reg, http)
            for name, over in reg.servers.items():
                if over.version is not None and over.enabled:
                    pinned = await self._version(reg, http, name, over.version)
                    if pinned is not None:
                        entries = [e for e in entries if e.server.get("name") != name] + [pinned]
        state = self.state[reg.name]
        wanted: dict[str, _Served] = {}
        skipped: dict[str, str] = {}
        for entry in sorted(entries, key=lambda e: str(e.server.get("name"))):
            name = str(entry.server.get("name", ""))
            try:
                served = await self._serve(reg, entry, state)
            except Skipped as why:
                if why.reason != "filtered":
                    skipped[name] = str(why)
                continue
            if len(wanted) >= reg.max_servers:
                skipped[name] = f"max_servers: {reg.max_servers} servers are served from this registry"
                continue
            wanted[name] = served
        for name, reason in skipped.items():
            _log.info("registry %s: %s is not served (%s)", reg.name, name, reason)
        changed = await self._apply(reg, state, wanted)
        if changed and self.changed is not None:
            await self.changed()
        return skipped

    async def _apply(self, reg: RegistrySourceConfig, state: _State, wanted: dict[str, _Served]) -> bool:
        changed = False
        for name, served in list(state.served.items()):
            if name not in wanted or wanted[name].digest != served.digest:
                await self.downstreams.remove(served.name)
                if self.trust is not None:
                    self.trust.drop_rule(f"{served.prefix}.*")
                del state.served[name]
                changed = True
                _log.info("registry %s: %s is no longer served", reg.name, name)
        for name, served in wanted.items():
            if name in state.served:
                continue
            if self.trust is not None and reg.trust is not None:
                self.trust.set_rule(f"{served.prefix}.*", reg.trust)
            await self.downstreams.add(served.name, served.config)
            state.served[name] = served
            changed = True
            _log.info("registry %s: serving %s as %s (%s.*)", reg.name, name, served.name, served.prefix)
        return changed

    # -- reading the registry ---------------------------------------------------------------------------

    def _client(self, reg: RegistrySourceConfig) -> Any:
        if not reg.url.startswith("https://") and not (reg.allow_http and reg.url.startswith("http://")):
            raise RegistryError(f"{reg.url} is not https (allow_http lets a plain http registry be read)")
        policy = HttpPolicy(
            allowed_hosts=("*",), allow_private=reg.allow_private, max_response_bytes=MAX_RESPONSE_BYTES
        )
        return guarded_client(policy)

    async def _get(self, reg: RegistrySourceConfig, http: Any, url: str) -> Any:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                status, body = await _capped_get(http, url, reg.headers)
        except trio.TooSlowError:
            raise RegistryError(f"{url}: no answer within {REQUEST_TIMEOUT_S:g} s") from None
        except RegistryError:
            raise
        except Exception as exc:  # the client's errors (refused, unreachable, a private address)
            raise RegistryError(f"{url}: {exc}") from None
        if status == 404:
            return None
        if status != 200:
            raise RegistryError(f"{url}: the registry answered HTTP {status}")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RegistryError(f"{url}: not JSON ({exc})") from None

    async def _crawl(self, reg: RegistrySourceConfig, http: Any) -> list[_Entry]:
        base = reg.url.rstrip("/")
        entries: list[_Entry] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            url = f"{base}/v0.1/servers?limit={PAGE_LIMIT}&version=latest&include_deleted=true"
            if cursor:
                url += f"&cursor={quote(cursor, safe='')}"
            page = await self._get(reg, http, url)
            if not isinstance(page, Mapping) or not isinstance(page.get("servers"), list):
                raise RegistryError(f"{url}: not a registry list (no `servers`)")
            if len(entries) + len(page["servers"]) > MAX_ENTRIES:
                raise RegistryError(f"the registry lists more than {MAX_ENTRIES} entries")
            entries += [e for e in map(_entry, page["servers"]) if e is not None]
            meta: Mapping[str, Any] = page["metadata"] if isinstance(page.get("metadata"), Mapping) else {}
            cursor = meta.get("nextCursor") or meta.get("next_cursor")
            if not cursor:
                return entries
        raise RegistryError(f"cursor pagination did not end within {MAX_PAGES} pages")

    async def _version(self, reg: RegistrySourceConfig, http: Any, name: str, version: str) -> _Entry | None:
        base = reg.url.rstrip("/")
        url = f"{base}/v0.1/servers/{quote(name, safe='')}/versions/{quote(version, safe='')}"
        got = await self._get(reg, http, url)
        entry = _entry(got) if got is not None else None
        if entry is None:
            _log.warning("registry %s: %s has no version %s", reg.name, name, version)
            return None
        entry.latest = True  # the operator's pin stands for the latest
        return entry

    # -- one entry ----------------------------------------------------------------------------------------

    async def _serve(self, reg: RegistrySourceConfig, entry: _Entry, state: _State) -> _Served:
        server = entry.server
        name = str(server.get("name", ""))
        if entry.status == "deleted":
            raise Skipped("deleted")
        if entry.status == "deprecated" and reg.deprecated == "exclude":
            raise Skipped("deprecated")
        over = reg.servers.get(name)
        if not entry.latest or not name or not _admitted(reg, name) or (over is not None and not over.enabled):
            raise Skipped("filtered")
        if entry.status == "deprecated":
            _log.warning("registry %s: %s is deprecated (served: deprecated = serve)", reg.name, name)
        remote = next(
            (r for r in server.get("remotes") or [] if isinstance(r, Mapping) and r.get("type") == "streamable-http"),
            None,
        )
        if remote is None:
            raise Skipped("no_usable_remote", "no streamable-http remote")
        url = _remote_url(remote, over)
        headers = _remote_headers(remote, over)
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise Skipped("no_usable_remote", f"{url} is not an https URL")
        if not reg.allow_private_servers and not await trio.to_thread.run_sync(_public, parts.hostname):
            raise Skipped("private_address", f"{parts.hostname} is not a public address (allow_private_servers)")
        credential = None
        template = (over.credential if over is not None and over.credential else None) or reg.credential
        if template is not None:
            credential = self._credential(reg, template, name)
        if reg.oauth_discovery:
            found = await self._discover(reg, url)
            if found is not None:
                state.discovered[name] = found
            found = state.discovered.get(name)
            if found is None:
                raise Skipped("oauth_discovery", "no OAuth metadata found for it")
            if credential is not None:
                credential = self._discovered_credential(credential, name, found)
        prefix = name.replace("/", ".")
        config = McpServerConfig(
            url=url,
            headers=headers,
            prefix=prefix,
            expose=list(reg.expose),
            forward_bearer=reg.forward_bearer,
            credential=credential,
        )
        local = re.sub(r"[^A-Za-z0-9_-]", "_", f"{reg.name}--{name.replace('/', '--')}")[:64]
        return _Served(local, prefix, config, msgspec.json.encode(config))

    def _credential(self, reg: RegistrySourceConfig, template: str, server: str) -> str:
        name = template.replace("{server}", server)
        if name in self.credentials:
            return name
        if reg.credential_env is None:
            raise Skipped("credential", f"no credential `{name}`")
        variable = reg.credential_env.replace("{server}", re.sub(r"[^A-Za-z0-9]", "_", server).upper())
        if not self.environ.get(variable):
            raise Skipped("credential", f"no credential `{name}`, and the environment variable {variable} is not set")
        self.credentials.add(name, EnvCredential(env=variable))
        return name

    def _discovered_credential(self, name: str, server: str, found: Mapping[str, str]) -> str:
        """A per-caller credential issued for this server with what discovery found (``audience``, ``resource``,
        the token endpoint); a static one is kept as it is."""
        from mcpipe.access import IdJag, TokenExchange

        cfg = self.credentials.configs.get(name)
        if isinstance(cfg, IdJag):
            derived: Any = msgspec.structs.replace(
                cfg, audience=found["audience"], resource=found["resource"], redeem_token_url=found["redeem_token_url"]
            )
        elif isinstance(cfg, TokenExchange):
            derived = msgspec.structs.replace(cfg, audience=found["audience"], resource=found["resource"])
        else:
            return name
        own = f"{name}@{server}"
        self.credentials.add(own, derived)
        return own

    async def _discover(self, reg: RegistrySourceConfig, url: str) -> dict[str, str] | None:
        """RFC 9728 then RFC 8414 metadata of the server at ``url`` (None: not found, logged)."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        policy = HttpPolicy(allowed_hosts=("*",), allow_private=reg.allow_private_servers)
        try:
            async with guarded_client(policy) as http:
                prm = await self._metadata(http, f"{origin}/.well-known/oauth-protected-resource{parts.path}")
                if prm.get("resource") != url:
                    raise RegistryError(f"its protected-resource metadata names `{prm.get('resource')}`, not {url}")
                servers = prm.get("authorization_servers") or []
                if not servers or not isinstance(servers[0], str):
                    raise RegistryError("its protected-resource metadata names no authorization server")
                issuer = servers[0]
                ip = urlsplit(issuer)
                meta = await self._metadata(
                    http, f"{ip.scheme}://{ip.netloc}/.well-known/oauth-authorization-server{ip.path.rstrip('/')}"
                )
                if meta.get("issuer") != issuer:
                    raise RegistryError(f"its authorization server's metadata names issuer `{meta.get('issuer')}`")
                if not isinstance(meta.get("token_endpoint"), str):
                    raise RegistryError("its authorization server's metadata has no token_endpoint")
        except RegistryError as exc:
            _log.warning("registry %s: OAuth discovery of %s failed: %s", reg.name, url, exc)
            return None
        return {"audience": url, "resource": url, "redeem_token_url": meta["token_endpoint"]}

    async def _metadata(self, http: Any, url: str) -> Mapping[str, Any]:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                status, body = await _capped_get(http, url)
        except RegistryError:
            raise
        except Exception as exc:
            raise RegistryError(f"{url}: {exc or 'timed out'}") from None
        if status != 200:
            raise RegistryError(f"{url}: HTTP {status}")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RegistryError(f"{url}: not JSON") from None
        if not isinstance(doc, Mapping):
            raise RegistryError(f"{url}: not a JSON object")
        return doc


def _entry(envelope: Any) -> _Entry | None:
    if not isinstance(envelope, Mapping) or not isinstance(envelope.get("server"), Mapping):
        return None
    meta: Mapping[str, Any] = envelope["_meta"] if isinstance(envelope.get("_meta"), Mapping) else {}
    official: Mapping[str, Any] = meta[OFFICIAL] if isinstance(meta.get(OFFICIAL), Mapping) else {}
    status = official.get("status")
    latest = official.get("isLatest")
    return _Entry(
        dict(envelope["server"]),
        status if status in ("deprecated", "deleted") else "active",
        latest if isinstance(latest, bool) else True,
    )


def _remote_url(remote: Mapping[str, Any], over: Any) -> str:
    url = str(remote.get("url", ""))
    variables: Mapping[str, Any] = remote["variables"] if isinstance(remote.get("variables"), Mapping) else {}
    for name, spec in variables.items():
        token = "{" + str(name) + "}"
        if token not in url:
            continue
        value = (over.variables.get(name) if over is not None else None) or _provided(spec)
        if value is None:
            raise Skipped("missing_input", f"variable `{name}`")
        url = url.replace(token, value)
    start = url.find("{")
    if start >= 0 and "}" in url:
        raise Skipped("missing_input", f"undeclared URL variable near `{url[start : start + 32]}`")
    return url


def _remote_headers(remote: Mapping[str, Any], over: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for header in remote.get("headers") or []:
        if not isinstance(header, Mapping) or not header.get("name"):
            continue
        name = str(header["name"])
        value = (over.headers.get(name) if over is not None else None) or _provided(header)
        if value is not None:
            headers[name] = value
        elif header.get("isRequired"):
            raise Skipped("missing_input", f"header `{name}`")
    return headers
