"""The gates every tool call passes before it runs, in the operator's order (``[[access.gates]]``).

- ``cedar``: Cedar policies (:mod:`mcpipe.access._cedar`).
- ``rate_limit``: token buckets, as mcpg's ``dev.mcpg.rate-limit``: a call draws one token from the bucket
  of the first rule whose tool globs match (else the defaults, per principal); buckets refill continuously
  at ``limit / window`` and hold ``burst`` (else ``limit``); a fresh bucket is full.
- ``ip_allowlist``: the caller's address (:class:`AddressSource`: the TCP peer's, or a header a trusted proxy
  sets) must fall in one of the networks.

A gate refuses by raising :class:`GateRefusal` (its ``code``: ``FORBIDDEN`` or ``LIMIT_EXCEEDED``); the gateway
audits and answers it like any refused call. A gate with ``enforce = false`` only logs what it would refuse.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mcpipe.access._cedar import CedarEngine, load_cedar
from mcpipe.access._config import AccessConfig, CedarGate, IpAllowlistGate, RateLimitGate, RateRule
from mcpipe.errors import ErrorCode, MCPipeError
from mcpipe.tools import ToolContext

__all__ = ["AddressSource", "Gate", "GateDenied", "GateRefusal", "Gates", "build_gates", "client_ip", "tool_globs"]

_log = logging.getLogger("mcpipe.access")


class GateRefusal(MCPipeError):
    """A gate refused a call (``code``: ``FORBIDDEN``, ``LIMIT_EXCEEDED``). ``rpc_code``, ``rpc_message`` and
    ``data`` are the JSON-RPC error mcpg's plugin of the same kind answers (``[access] refusals = "error"``)."""

    def __init__(
        self, gate: str, code: str, message: str, rpc: tuple[int, str] = (-32603, ""), data: object = None
    ) -> None:
        super().__init__(message)
        self.gate = gate
        self.code = code
        self.rpc_code, self.rpc_message = rpc[0], rpc[1] or message
        self.data = data


class GateDenied(MCPipeError):
    """A gate's refusal answered as a JSON-RPC error (``[access] refusals = "error"``, mcpg's way)."""

    def __init__(self, refusal: GateRefusal) -> None:
        super().__init__(refusal.rpc_message)
        self.code = refusal.code
        self.rpc_code = refusal.rpc_code
        self.data = refusal.data


def tool_globs(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Tool-name globs as mcpg reads them: ``*`` any run of characters, ``?`` exactly one."""
    if not patterns:
        return lambda _name: True
    rx = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return lambda name: rx.match(name) is not None


@dataclass(frozen=True, slots=True)
class Decision:
    """One gate's part in a call's admission, for the audit record (mcpg's ``details.chain`` entries)."""

    gate: str
    decision: str
    latency_ms: float


class Gate:
    """One gate of the chain."""

    name: str
    enforce: bool = True

    def check(self, tool: str, args: object, ctx: ToolContext) -> str:
        """``allow``, ``defer`` (a policy had nothing to say); raises :class:`GateRefusal` to refuse."""
        raise NotImplementedError


class CedarPolicyGate(Gate):
    def __init__(self, cfg: CedarGate, name: str, engine: CedarEngine) -> None:
        self.name, self.enforce, self.engine = name, cfg.enforce, engine
        self.by_subject = cfg.principal_id == "subject"

    def check(self, tool: str, args: object, ctx: ToolContext) -> str:
        identity = ctx.request.identity
        who = identity.subject if self.by_subject and identity is not None else ctx.principal
        verdict = self.engine.decide(tool, args, who)
        if verdict.effect == "deny":
            rpc = (-33000, f"Policy `{self.name}` denied tool '{tool}': {verdict.reason}")
            raise GateRefusal(
                self.name, ErrorCode.FORBIDDEN, f"policy `{self.name}` denied '{tool}': {verdict.reason}", rpc
            )
        return verdict.effect


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class RateLimiter(Gate):
    """Token buckets keyed by the matching rule's scope; bounded in count (least recently used go first)."""

    def __init__(self, cfg: RateLimitGate, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.enforce, self.cfg, self.clock = name, cfg.enforce, cfg, clock
        default = RateRule(
            tools=["*"], limit=cfg.default_limit, window_ms=cfg.default_window_ms, burst=cfg.default_burst
        )
        self.rules = [(tool_globs(r.tools), i, r) for i, r in enumerate(cfg.rules)]
        self.default = default
        self.buckets: OrderedDict[tuple[Any, ...], _Bucket] = OrderedDict()
        self._created = 0

    def _rule(self, tool: str) -> tuple[int, RateRule]:
        for match, i, rule in self.rules:
            if match(tool):
                return i, rule
        return -1, self.default

    def _key(self, index: int, rule: RateRule, tool: str, ctx: ToolContext) -> tuple[Any, ...]:
        session = _session_of(ctx)
        match rule.scope:
            case "per_principal":
                who = ctx.principal or session or "_anon"
                return (index, who)
            case "per_tool":
                return (index, tool)
            case "per_principal_tool":
                return (index, ctx.principal or session or "_anon", tool)
            case "per_session":
                return (index, session or "_no_session")
            case _:
                return (index,)

    def check(self, tool: str, args: object, ctx: ToolContext) -> str:
        index, rule = self._rule(tool)
        key = self._key(index, rule, tool, ctx)
        now = self.clock()
        capacity = float(rule.burst if rule.burst is not None else rule.limit)
        rate = rule.limit / rule.window_ms  # tokens per millisecond
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = _Bucket(capacity, now)
            self.buckets[key] = bucket
            self._created += 1
            self._sweep(now)
        else:
            self.buckets.move_to_end(key)
            bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * 1000 * rate)
            bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return "allow"
        retry_after = max(1, int(-(-(1 - bucket.tokens) // (rate * 1000))))
        data = {"retry_after_secs": retry_after, "limit": rule.limit, "window_ms": rule.window_ms, "remaining": 0}
        raise GateRefusal(
            self.name,
            ErrorCode.LIMIT_EXCEEDED,
            f"rate limit of '{tool}' reached ({rule.limit} calls per {rule.window_ms} ms); retry after {retry_after} s",
            (-32029, "Rate limit exceeded"),
            data,
        )

    def _sweep(self, now: float) -> None:
        """Drop the buckets past ``max_buckets`` and those idle longer than ``cleanup_interval_ms``. The buckets
        are kept least recently used first (each use moves its bucket to the end and stamps it), so both are
        found at the front: the work is what is dropped (a scan of every bucket each 256 new ones cost a
        100 000-bucket limiter about 0.1 ms a call)."""
        while len(self.buckets) > self.cfg.max_buckets:
            self.buckets.popitem(last=False)
        idle = self.cfg.cleanup_interval_ms / 1000
        if idle:
            while self.buckets:
                key = next(iter(self.buckets))
                if now - self.buckets[key].at <= idle:
                    break
                del self.buckets[key]


def _session_of(ctx: ToolContext) -> str | None:
    sdk = ctx.request.sdk_context
    session = getattr(sdk, "session", None)
    sid = getattr(session, "session_id", None) if session is not None else None
    return sid if isinstance(sid, str) else None


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class AddressSource:
    """Where an ``ip_allowlist`` gate reads the caller's address (``docs/access.md``).

    Attributes:
        header: None: the TCP peer (nothing a client sends counts). Else the header a proxy in front sets.
        trusted: the proxies whose ``header`` is believed. Empty: the header's first value is read (the
            operator says the proxy overwrites it). Else the header counts only from a peer in them, and the
            client is the rightmost address of its list that is not one of them (each proxy appends the
            address it was reached from, so what a client wrote itself is further left).
    """

    header: str | None = None
    trusted: tuple[Network, ...] = ()

    @property
    def key(self) -> str | None:
        """The name this source's address goes by in ``Request.client_addresses`` (None: the peer)."""
        if self.header is None:
            return None
        if not self.trusted:
            return self.header.lower()
        return f"{self.header.lower()} via {','.join(str(n) for n in self.trusted)}"

    def resolve(self, headers: Sequence[tuple[bytes, bytes]], peer: object) -> str | None:
        """The caller's address, as text; None when it is not known."""
        peer_text = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None
        if self.header is None:
            return peer_text
        if self.trusted:
            at = _address(peer_text)
            if at is None or not self._is_trusted(at):
                return peer_text
        wanted = self.header.lower().encode()
        values = [raw.decode("latin-1") for name, raw in headers if name.lower() == wanted]
        if not values:
            return None if not self.trusted else peer_text
        hops = [h.strip() for h in ",".join(values).split(",") if h.strip()]
        if not self.trusted:
            return hops[0] if hops else None
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return hop  # not an address: unknown, refused (never skipped to one further left)
            if not self._is_trusted(address):
                return hop
        return hops[0] if hops else peer_text

    def _is_trusted(self, address: Address) -> bool:
        return any(address in n for n in self.trusted)


class IpAllowlist(Gate):
    def __init__(self, cfg: IpAllowlistGate, name: str) -> None:
        self.name, self.enforce = name, cfg.enforce
        self.source = AddressSource(
            cfg.ip_header, tuple(ipaddress.ip_network(c, strict=False) for c in cfg.trusted_proxies)
        )
        self.networks: list[Network] = [ipaddress.ip_network(c, strict=False) for c in cfg.allow]
        self.applies = tool_globs(cfg.tools)

    def check(self, tool: str, args: object, ctx: ToolContext) -> str:
        if not self.applies(tool):
            return "defer"
        address = _address(ctx.request.client_addresses.get(self.source.key))
        if address is None:
            rpc = (-32030, "Access denied: client IP not available")
            raise GateRefusal(
                self.name, ErrorCode.FORBIDDEN, f"'{tool}' refused: the caller's address is not known", rpc
            )
        if not any(address in n for n in self.networks):
            rpc = (-32030, f"Access denied: {address} not in IP allowlist")
            message = f"'{tool}' refused: {address} is not in the allowed networks"
            raise GateRefusal(self.name, ErrorCode.FORBIDDEN, message, rpc, {"client_ip": str(address)})
        return "allow"


def _address(text: str | None) -> Address | None:
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_ip(headers: Sequence[tuple[bytes, bytes]], peer: object, header: str | None) -> str | None:
    """The caller's address as an ``ip_allowlist`` gate without trusted proxies reads it: the first value of
    ``header``, or, when ``header`` is None, the TCP peer's (the ASGI ``client``)."""
    return AddressSource(header).resolve(headers, peer)


class Gates:
    """The chain: each gate in order; the first refusal wins (a gate in shadow mode logs it instead)."""

    def __init__(self, gates: Sequence[Gate] = ()) -> None:
        self.gates = list(gates)
        self.address_sources: tuple[AddressSource, ...] = tuple(
            dict.fromkeys(g.source for g in self.gates if isinstance(g, IpAllowlist))
        )
        """Where the ``ip_allowlist`` gates read the caller's address; the HTTP front puts each in
        ``Request.client_addresses`` under its ``key``."""

    def __bool__(self) -> bool:
        return bool(self.gates)

    def admit(self, tool: str, args: object, ctx: ToolContext) -> list[Decision]:
        """Run the chain for one call; answers each gate's decision (raises :class:`GateRefusal`)."""
        chain: list[Decision] = []
        for gate in self.gates:
            t0 = time.perf_counter()
            try:
                decision = gate.check(tool, args, ctx)
            except GateRefusal as refusal:
                if gate.enforce:
                    raise
                _log.warning("gate %s would refuse (shadow mode): %s", gate.name, refusal)
                decision = "deny (shadow)"
            chain.append(Decision(gate.name, decision, round((time.perf_counter() - t0) * 1000, 3)))
        return chain


def build_gates(cfg: AccessConfig, *, base_dir: str, clock: Callable[[], float] = time.monotonic) -> Gates:
    """The chain of ``[access]`` (its config checked already)."""
    gates: list[Gate] = []
    for i, g in enumerate(cfg.gates):
        name = g.name or f"{type(g).__name__.removesuffix('Gate').lower()}#{i}"
        match g:
            case CedarGate():
                gates.append(CedarPolicyGate(g, g.name or f"cedar#{i}", load_cedar(g, base_dir=base_dir)))
            case RateLimitGate():
                gates.append(RateLimiter(g, g.name or f"rate_limit#{i}", clock))
            case IpAllowlistGate():
                gates.append(IpAllowlist(g, g.name or f"ip_allowlist#{i}"))
            case _:
                raise TypeError(name)
    return Gates(gates)
