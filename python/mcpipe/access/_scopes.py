"""The OAuth scopes tools, prompts and resources need (``[[auth.scopes]]``).

A name needs the scope of every rule whose globs match it (``*``, ``?``), in the rules' order. The gateway
adds the ``required_scopes`` of the trust rule of the name (mcpg's) and, for a tool that runs a pipeline (a
declared pipeline, a playbook), the scopes of every tool it reaches: one rule, whichever path a call takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mcpipe._util import glob_matcher
from mcpipe.access._config import ScopeRule

__all__ = ["INSUFFICIENT_SCOPE", "Scopes", "missing_scopes", "scope_message"]

INSUFFICIENT_SCOPE = -32003
"""The JSON-RPC error of a prompt, resource or completion a caller's scopes do not allow, off the HTTP front's
403 (in memory, over stdio, a static token's call): in the implementation-defined band the SDK leaves servers
(-32000..-32019; -32020 and up are the spec's), the code mcpg answers a trust rule's missing scope with."""

MAX_CACHED = 65_536
"""The most names whose needed scopes are remembered (a caller naming random tools cannot grow it past)."""


class Scopes:
    """The compiled ``[[auth.scopes]]`` rules."""

    def __init__(self, rules: Sequence[ScopeRule]) -> None:
        self.tools = [(glob_matcher(r.tools), r.scope) for r in rules if r.tools]
        self.prompts = [(glob_matcher(r.prompts), r.scope) for r in rules if r.prompts]
        self.resources = [(glob_matcher(r.resources), r.scope) for r in rules if r.resources]
        self.supported: tuple[str, ...] = tuple(dict.fromkeys(r.scope for r in rules))
        """Every scope the rules name, in their order."""
        self._cache: dict[tuple[str, str], tuple[str, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self.supported)

    def needed(self, kind: str, name: str) -> tuple[str, ...]:
        """The scopes a ``tool``, ``prompt`` or ``resource`` (by URI) needs, by these rules alone."""
        key = (kind, name)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        rules = self.tools if kind == "tool" else self.prompts if kind == "prompt" else self.resources
        found = tuple(dict.fromkeys(scope for matches, scope in rules if matches(name)))
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = found
        return found


def scope_message(kind: str, name: str, missing: Sequence[str]) -> str:
    """Why a call of the ``tool``, ``prompt`` or ``resource`` ``name`` is refused: the scopes it lacks."""
    plural = "scopes" if len(missing) > 1 else "scope"
    return f"{kind} '{name}' needs the OAuth {plural} {' '.join(missing)}, which the caller's token does not carry"


def missing_scopes(needed: Iterable[str], have: Iterable[str]) -> tuple[str, ...]:
    """The scopes of ``needed`` that ``have`` lacks, in ``needed``'s order."""
    held = set(have)
    return tuple(s for s in needed if s not in held)
