"""What the operator allows declared steps to reach: outbound hosts, commands, plugins.

The config builds one :class:`StepPolicy` and hands it to the compiler; compiled steps keep the policy
they were compiled under, so a running step never consults global state.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

import trio

from mcpipe.access import Credentials
from mcpipe.backends import Connections
from mcpipe.errors import ErrorCode
from mcpipe.results import StepFailure

__all__ = ["CommandPolicy", "DuckdbPolicy", "ForbiddenError", "HttpPolicy", "PythonPolicy", "StepPolicy"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class ForbiddenError(StepFailure):
    """A step tried to reach something the policy does not allow (error code ``FORBIDDEN``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.FORBIDDEN)


@dataclass(frozen=True)
class HttpPolicy:
    """Where ``http`` and ``graphql`` steps may connect.

    A request is allowed when its host matches ``allowed_hosts`` *and* every address the host resolves
    to is public. Private, loopback, link-local, shared, reserved, multicast and unspecified addresses
    are refused unless ``allow_private`` is set, or the URL names that address literally and the literal
    is listed in ``allowed_hosts`` (``http://127.0.0.1:8080/`` with ``"127.0.0.1"`` listed). Every hop of
    a redirect is checked the same way, and the connection goes to the address that was checked, so a
    name that resolves differently a second time (DNS rebinding) cannot slip through.

    Attributes:
        allowed_hosts: host patterns: ``"api.example.com"``, ``"*.example.com"`` (any subdomain, not the
            domain itself), an IP literal (``"127.0.0.1"``, ``"::1"``), or ``"*"`` (any host; the address
            check still applies). Empty: no host is allowed.
        allow_private: allow non-public addresses for every allowed host.
        max_response_bytes: a larger response body fails the step.
        verify: TLS verification: True (the system's CA store), False, or a CA bundle path.
        timeout_ms: the deadline of a step that sets no ``timeout_ms`` (None: only the pipeline's).
        insecure_hosts: host patterns (as ``allowed_hosts``) a step may reach with TLS verification off when
            it asks (NoETL's ``verify_ssl: false``); such a step reaches only these hosts (:meth:`insecure`).
        allow_hint: what a refused host's message says to do (where the operator allows a host).
    """

    allowed_hosts: Sequence[str] = ()
    allow_private: bool = False
    max_response_bytes: int = 10 * 1024 * 1024
    verify: bool | str = True
    timeout_ms: float | None = 30_000
    insecure_hosts: Sequence[str] = ()
    allow_hint: str = "list it in outbound.http.allowed_hosts"

    def insecure(self) -> HttpPolicy:
        """The policy of a step that turns TLS verification off: only the ``insecure_hosts``, unverified."""
        return replace(
            self,
            allowed_hosts=tuple(self.insecure_hosts),
            verify=False,
            insecure_hosts=(),
            allow_hint="list it in outbound.http.insecure_hosts (a step with TLS verification off reaches only those)",
        )

    @cached_property
    def _patterns(self) -> tuple[frozenset[str], tuple[str, ...], bool]:
        exact: set[str] = set()
        suffixes: list[str] = []
        anything = False
        for pattern in self.allowed_hosts:
            p = pattern.strip().lower().rstrip(".")
            if p.startswith("[") and p.endswith("]"):
                p = p[1:-1]
            if p == "*":
                anything = True
            elif p.startswith("*."):
                suffixes.append(p[1:])
            elif p:
                exact.add(_canonical_ip(p) or p)
        return frozenset(exact), tuple(suffixes), anything

    @cached_property
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context every request shares (building one per request costs milliseconds)."""
        if self.verify is False:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        if isinstance(self.verify, str):
            return ssl.create_default_context(cafile=self.verify)
        return ssl.create_default_context()

    def host_allowed(self, host: str) -> bool:
        """Does ``host`` (a name or an IP literal, as in a URL) match ``allowed_hosts``?"""
        exact, suffixes, anything = self._patterns
        h = host.lower().rstrip(".")
        if h.startswith("[") and h.endswith("]"):
            h = h[1:-1]
        h = _canonical_ip(h) or h
        return anything or h in exact or any(h.endswith(s) for s in suffixes)

    def host_refused(self, host: str) -> str:
        """The message for a ``host`` that :meth:`host_allowed` refuses: it says where to allow it."""
        return f"host '{host}' is not in the allowed hosts ({self.allow_hint})"

    def address_allowed(self, host: str, address: IPAddress) -> bool:
        """May a request for ``host`` connect to ``address``?"""
        if self.allow_private or _is_public(address):
            return True
        literal = _canonical_ip(host.strip("[]"))
        return literal is not None and literal == str(address) and literal in self._patterns[0]

    async def resolve(self, host: str, port: int) -> str:
        """Check ``host`` and resolve it; answer the address to connect to.

        Raises:
            ForbiddenError: the host is not allowed, or one of its addresses is not.
            OSError: the name does not resolve.
        """
        if not self.host_allowed(host):
            raise ForbiddenError(self.host_refused(host))
        bare = host.strip("[]")
        literal = _canonical_ip(bare)
        if literal is not None:
            addresses = [ipaddress.ip_address(literal)]
        else:
            infos = await trio.socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)
            addresses = [_unmapped(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in infos]
            if not addresses:
                raise OSError(f"'{host}' does not resolve")
        for address in addresses:
            if not self.address_allowed(host, address):
                raise ForbiddenError(
                    f"host '{host}' resolves to {address}, a {_describe(address)} address, which is not allowed"
                )
        return str(addresses[0])


def _canonical_ip(text: str) -> str | None:
    try:
        return str(_unmapped(ipaddress.ip_address(text)))
    except ValueError:
        return None


def _unmapped(address: IPAddress) -> IPAddress:
    """``::ffff:127.0.0.1`` is 127.0.0.1: judge IPv4-mapped IPv6 addresses by their IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64, 6to4, IPv4-compatible or IPv4-translated IPv6 address leads to."""
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or address in _IPV4_COMPATIBLE or address in _IPV4_TRANSLATED:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        # Judged by where they lead, whatever this Python's ipaddress tables say about the prefix.
        if address.is_site_local or address in _NAT64_LOCAL:
            return False
        embedded = _embedded_ipv4(address)
        if embedded is not None and not _is_public(embedded):
            return False
    return address.is_global and not address.is_multicast


def _describe(address: IPAddress) -> str:
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    return "non-public"


def _default_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")
    return {k: os.environ[k] for k in keep if k in os.environ}


@dataclass(frozen=True)
class CommandPolicy:
    """Which executables ``command`` steps may run, and how.

    Attributes:
        commands: name -> executable path, or name -> argv prefix (``["/usr/bin/jq", "-c"]``). A step's
            ``command`` must be one of these names; its ``args`` are appended. Nothing runs through a shell.
        env: the environment every command starts from (a step's ``env`` is laid over it). Default: the
            server's ``PATH``, ``LANG``, ``LC_ALL``, ``TZ`` and ``HOME`` only, so secrets in the server's
            environment do not leak to commands.
        max_output_bytes: stdout or stderr past this size fails the step (the process is killed).
        kill_grace_ms: on timeout or cancellation the process group gets SIGTERM, then SIGKILL after this.
        timeout_ms: the deadline of a step that sets no ``timeout_ms`` (None: only the pipeline's).
    """

    commands: Mapping[str, str | Sequence[str]] = field(default_factory=dict)
    env: Mapping[str, str] | None = None
    max_output_bytes: int = 10 * 1024 * 1024
    kill_grace_ms: float = 1000
    timeout_ms: float | None = 60_000

    def argv(self, name: str) -> tuple[str, ...] | None:
        """The argv prefix of command ``name``, or None when it is not allowed.

        ``name`` is a name of :attr:`commands`, or the path of one that is a bare executable (mcpg's steps
        name commands by path: ``command: /usr/bin/jq`` runs when some name maps to ``/usr/bin/jq``).
        """
        target = self.commands.get(name)
        if target is None:
            if name.startswith("/"):
                for t in self.commands.values():
                    if t == name or (not isinstance(t, str) and list(t) == [name]):
                        return (name,)
            return None
        return (target,) if isinstance(target, str) else tuple(target)

    def base_env(self) -> dict[str, str]:
        """The environment a command starts from."""
        return dict(self.env) if self.env is not None else _default_env()


@dataclass(frozen=True)
class PythonPolicy:
    """How ``python`` steps run: each in a sandbox worker of its own, within these limits
    (``mcpipe.kinds.python``; what the isolation promises: docs/declared-pipelines.md).

    Attributes:
        workers: at most this many python steps run at once; more wait for one to end.
        prefork: how many workers are kept forked and waiting (0: each step waits for its own fork).
        fork_server: kept for older configs; false is ``prefork: 0`` (a step's worker is always forked by
            the sandbox's fork server).
        memory_mb: the address-space limit of a step's process (``RLIMIT_AS``, soft = hard): past it,
            allocations fail and the step fails with ``LIMIT_EXCEEDED``.
        max_file_mb: the largest file a step's process may write (``RLIMIT_FSIZE``): past it, the write
            fails (``OSError: File too large``).
        max_processes: the processes (and threads) a step may have at once (``RLIMIT_NPROC``, counted for
            its own uid; applied only where it has one).
        max_open_files: the files a step's process may have open at once (``RLIMIT_NOFILE``).
        separate_uid: run each step as a uid of its own when the server runs as root.
        namespaces: give each step a PID namespace (and a ``/proc``) of its own where the kernel allows.
        timeout_ms: the deadline of a step that sets no ``timeout_ms``; past it the process is killed and
            the step fails with ``TIMEOUT``.
        max_output_bytes: of what the code prints, the first this many bytes of stdout and of stderr are
            kept (the rest is counted, not kept).
        max_result_bytes: a larger result (as JSON) fails the step with ``OUTPUT_TOO_LARGE``.
        env: the environment the code starts from (a step's ``env`` is laid over it). Default: the server's
            ``PATH``, ``LANG``, ``LC_ALL``, ``TZ`` and ``HOME`` only.
        reuse: ``step`` (the default): a fresh worker for every step. ``run``: a worker that answered is kept
            for the later python steps of the same run and principal (each in fresh globals, under its own
            deadline), and killed when the run ends; what a step leaves in its process (imported modules,
            threads, files in its directory) the run's later steps may see (docs/declared-pipelines.md).
    """

    workers: int = 4
    prefork: int = 2
    fork_server: bool = True
    memory_mb: int = 1024
    max_file_mb: int = 64
    max_processes: int = 64
    max_open_files: int = 256
    separate_uid: bool = True
    namespaces: bool = True
    timeout_ms: float = 60_000
    max_output_bytes: int = 1024 * 1024
    max_result_bytes: int = 10 * 1024 * 1024
    env: Mapping[str, str] | None = None
    reuse: Literal["step", "run"] = "step"

    def base_env(self) -> dict[str, str]:
        """The environment a step's code starts from."""
        return dict(self.env) if self.env is not None else _default_env()

    def spares(self) -> int:
        """Warm workers to keep (``fork_server: false`` keeps none)."""
        return self.prefork if self.fork_server else 0


@dataclass(frozen=True)
class DuckdbPolicy:
    """How ``duckdb`` steps run: in worker threads, within these limits (``mcpipe.kinds.duckdb``).

    Attributes:
        workers: at most this many duckdb steps run at once; more wait.
        memory_mb: DuckDB's ``memory_limit`` for a step's database.
        threads: DuckDB's ``threads`` for a step's database.
        timeout_ms: the deadline of a step that sets none; past it the statement is interrupted.
        max_rows: a statement that returns more rows fails the step.
        autoinstall_extensions: let DuckDB download an extension it knows when a statement needs it; off,
            statements load only extensions installed ahead (an explicit ``INSTALL`` is the SQL's own).
        external_access: let the statements reach what is outside their database: files (``read_csv``,
            ``read_text``, ``COPY ... TO``, ``ATTACH``), URLs and buckets, extensions to load. Off (the
            default), DuckDB runs with ``enable_external_access = false`` and its configuration locked (the
            statements cannot ``SET`` anything, the memory limit included); a step's ``secrets`` are created
            (their extensions loaded) before that.
        allowed_directories: with ``external_access`` off, the directories the statements may still read and
            write files in (DuckDB's ``allowed_directories``).
    """

    workers: int = 4
    memory_mb: int = 1024
    threads: int = 2
    timeout_ms: float = 60_000
    max_rows: int = 10_000
    autoinstall_extensions: bool = False
    external_access: bool = False
    allowed_directories: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepPolicy:
    """Everything the operator's config decides about declared steps.

    Attributes:
        http: outbound HTTP (``http`` and ``graphql`` steps).
        command: runnable commands (``command`` steps).
        python: the limits of ``python`` steps.
        duckdb: the limits of ``duckdb`` steps.
        plugins: extra ``plugin_transform`` plugins by name (the JSONata plugin is always there).
        expression_max_ms: how long one JSONata evaluation may run.
        sql: the named SQL backends (``[sql.NAME]``) ``sql``, ``sql_tx`` and ``sql_await`` steps may use,
            :class:`mcpipe.backends.sql.SqlBackend` by name.
    """

    http: HttpPolicy = field(default_factory=HttpPolicy)
    command: CommandPolicy = field(default_factory=CommandPolicy)
    python: PythonPolicy = field(default_factory=PythonPolicy)
    duckdb: DuckdbPolicy = field(default_factory=DuckdbPolicy)
    plugins: Mapping[str, Any] = field(default_factory=dict)
    expression_max_ms: int = 1000
    sql: Mapping[str, Any] = field(default_factory=dict)
    connections: Connections = field(default_factory=Connections)
    """The shared connections of ``nats``, ``grpc`` and ``kafka`` steps (the server runs them)."""
    base_dir: str = "."
    """What relative paths in steps (a ``grpc`` step's ``descriptor_set``) are relative to."""
    credentials: Credentials = field(default_factory=Credentials)
    """The outbound credentials (``[credentials.NAME]``) ``http`` steps present (``credential = "NAME"``)."""
    content: Any = None
    """The content stores ``store_content`` steps write to (:class:`mcpipe.store.content.ContentStores`)."""

    async def aclose(self) -> None:
        """Close the connections the steps opened (the server calls this when it stops)."""
        for backend in self.sql.values():
            if backend is not None:
                await backend.aclose()
