"""MCP Apps (SEP-1865, the ``io.modelcontextprotocol/ui`` extension): what mcpipe advertises, and the policy every
``_meta.ui`` it serves is held to (the ``apps`` section, :class:`mcpipe.config.AppsConfig`).

An app is a ``ui://`` resource of type ``text/html;profile=mcp-app`` that a host renders in a sandboxed iframe;
its ``_meta.ui`` says what the iframe may reach (``csp``: connect, resource, frame and base-URI domains),
which permissions it asks for (``permissions``: camera, microphone, geolocation, clipboard writes) and which
sandbox origin it wants (``domain``). Whatever a resource (the config's own, or a downstream server's) says,
mcpipe narrows it to the operator's policy before it reaches the client: each CSP axis intersected (tighten
only), permissions outside the allow-list stripped, a domain outside the allow-list dropped; with ``strict``
such a response is refused instead. As mcpg does it (``mcpg-mcp-wire`` ``shared/apps.rs``,
``src/runtime/apps.rs``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

from mcpipe.config import AppsConfig

__all__ = ["EXTENSION_ID", "UI_MIME_TYPE", "AppsPolicy"]

_log = logging.getLogger("mcpipe.server")

EXTENSION_ID = "io.modelcontextprotocol/ui"
UI_MIME_TYPE = "text/html;profile=mcp-app"
_CSP_AXES = ("connectDomains", "resourceDomains", "frameDomains", "baseUriDomains")
_OPENAI_CSP = "openai/widgetCSP"
_OPENAI_AXES = (
    ("connect_domains", "connectDomains"),
    ("resource_domains", "resourceDomains"),
    ("frame_domains", "frameDomains"),
    ("redirect_domains", "redirectDomains"),
)
_OPENAI_KEYS = frozenset(alias for alias, _ in _OPENAI_AXES)
_OPENAI_DOMAIN = "openai/widgetDomain"
_OPENAI_TEMPLATE = "openai/outputTemplate"
_FLAT_RESOURCE_URI = "ui/resourceUri"  # the extension's earlier, flat spelling of ``ui.resourceUri``
_VISIBILITY = frozenset({"model", "app"})
UI_SCHEME = "ui://"


def _intersect(upstream: list[str], operator: list[str]) -> list[str]:
    if "*" in operator:
        return upstream
    if "*" in upstream:
        return list(operator)
    return [d for d in upstream if d in operator]


class AppsPolicy:
    """The ``apps`` section, compiled."""

    def __init__(self, config: AppsConfig) -> None:
        p = config.csp_policy
        self.axes = {
            "connectDomains": p.connect_domains,
            "resourceDomains": p.resource_domains,
            "frameDomains": p.frame_domains,
            "baseUriDomains": p.base_uri_domains,
            "redirectDomains": p.redirect_domains,
        }
        self.permissions = list(config.allowed_permissions)
        self.domains = config.allowed_domains
        self.strict = config.strict

    @staticmethod
    def capability() -> dict[str, Any]:
        """The extension's advertisement (``capabilities.extensions``)."""
        return {"mimeTypes": [UI_MIME_TYPE]}

    def clamp(self, meta: object) -> list[str]:
        """Narrow one ``_meta`` (its ``ui``, and the ``openai/widget*`` aliases) in place; the violations.

        Fail closed where mcpg trusts the shape: a policy field of the wrong type (an axis that is not a list,
        an entry of one that is not a string, a ``csp``, ``permissions`` or ``openai/widgetCSP`` that is not an
        object, a ``domain`` that is not a string) is removed and counted as a violation, never passed on (a
        host's ``connectDomains.join(" ")`` flattens a nested ``["https://evil"]`` into the policy); so is a
        ``csp`` key that is none of the axes the policy bounds."""
        violations: list[str] = []
        if not isinstance(meta, dict):
            return violations
        if _OPENAI_CSP in meta:
            widget = meta[_OPENAI_CSP]
            if not isinstance(widget, dict):
                violations.append(f"{_OPENAI_CSP} dropped (not an object)")
                del meta[_OPENAI_CSP]
            else:
                for key in [k for k in widget if k not in _OPENAI_KEYS]:
                    violations.append(f"{_OPENAI_CSP}.{key} dropped (no such axis in the policy)")
                    del widget[key]
                for alias, axis in _OPENAI_AXES:
                    self._axis(widget, alias, axis, f"{_OPENAI_CSP}.{alias}", violations)
        if _OPENAI_DOMAIN in meta:
            self._domain(meta, _OPENAI_DOMAIN, _OPENAI_DOMAIN, violations)
        ui = meta.get("ui")
        if not isinstance(ui, dict):
            return violations
        if "csp" in ui:
            csp = ui["csp"]
            if not isinstance(csp, dict):
                violations.append("csp dropped (not an object)")
                del ui["csp"]
            else:
                for key in [k for k in csp if k not in _CSP_AXES]:
                    violations.append(f"csp.{key} dropped (no such axis in the policy)")
                    del csp[key]
                for axis in _CSP_AXES:
                    self._axis(csp, axis, axis, f"csp.{axis}", violations)
        if "permissions" in ui:
            perms = ui["permissions"]
            if not isinstance(perms, dict):
                violations.append("permissions dropped (not an object)")
                del ui["permissions"]
            else:
                for key in [k for k in perms if k not in self.permissions]:
                    del perms[key]
                    violations.append(f"permission '{key}' stripped (not in allow-list)")
        if "domain" in ui:
            self._domain(ui, "domain", "domain", violations)
        return violations

    def _domain(self, holder: dict[str, Any], key: str, where: str, violations: list[str]) -> None:
        domain = holder[key]
        if not isinstance(domain, str):
            del holder[key]
            violations.append(f"{where} dropped (not a string)")
        elif self.domains is not None and domain not in self.domains:
            del holder[key]
            violations.append(f"{where} '{domain}' dropped (outside allow-list)")

    def _axis(self, csp: dict[str, Any], key: str, axis: str, where: str, violations: list[str]) -> None:
        if key not in csp:
            return  # an axis left out keeps the host's restrictive default
        upstream = csp[key]
        if not isinstance(upstream, list):
            del csp[key]  # left out: the host's restrictive default
            violations.append(f"{where} dropped (not a list)")
            return
        values = [v for v in upstream if isinstance(v, str)]
        if len(values) != len(upstream):
            violations.append(f"{where} dropped {len(upstream) - len(values)} entries that are not strings")
        narrowed = _intersect(values, self.axes[axis])
        dropped = [d for d in values if d not in narrowed]
        if dropped:
            violations.append(f"{where} dropped {dropped} (outside operator allow-list)")
        if narrowed != upstream:
            csp[key] = narrowed

    def clamp_tool(self, meta: object) -> list[str]:
        """Narrow one tool's ``_meta`` in place (a downstream's, as listed); the violations.

        What :meth:`clamp` holds a resource's ``_meta`` to, and the tool's own fields of the extension held to
        their types: ``ui`` an object, ``ui.resourceUri`` (and the flat ``ui/resourceUri``,
        ``openai/outputTemplate``) a ``ui://`` URI, ``ui.visibility`` a list of ``"model"`` and ``"app"``;
        an ill-typed one is removed (an entry of ``visibility`` outside the two, left out)."""
        violations = self.clamp(meta)
        if not isinstance(meta, dict):
            return violations
        for key in (_FLAT_RESOURCE_URI, _OPENAI_TEMPLATE):
            if key in meta:
                self._ui_uri(meta, key, key, violations)
        if "ui" not in meta:
            return violations
        ui = meta["ui"]
        if not isinstance(ui, dict):
            del meta["ui"]
            violations.append("ui dropped (not an object)")
            return violations
        if "resourceUri" in ui:
            self._ui_uri(ui, "resourceUri", "ui.resourceUri", violations)
        if "visibility" in ui:
            seen = ui["visibility"]
            if not isinstance(seen, list):
                del ui["visibility"]  # left out: visible to both, the extension's default
                violations.append("ui.visibility dropped (not a list)")
            else:
                kept = [v for v in seen if isinstance(v, str) and v in _VISIBILITY]
                if len(kept) != len(seen):
                    violations.append(f"ui.visibility dropped {len(seen) - len(kept)} entries not 'model' or 'app'")
                    ui["visibility"] = kept
        return violations

    @staticmethod
    def _ui_uri(holder: dict[str, Any], key: str, where: str, violations: list[str]) -> None:
        uri = holder[key]
        if not isinstance(uri, str) or not uri.startswith(UI_SCHEME):
            del holder[key]
            violations.append(f"{where} dropped (not a {UI_SCHEME} URI)")

    def apply_tool(self, entry: dict[str, Any]) -> str | None:
        """Clamp a listed tool's ``_meta`` (a copy: never the downstream's own); in ``strict`` mode, the refusal
        when it went beyond the policy (None: served, narrowed)."""
        if "_meta" not in entry:
            return None
        entry["_meta"] = meta = copy.deepcopy(entry["_meta"])
        found = self.clamp_tool(meta)
        if not found:
            return None
        name = entry.get("name")
        _log.debug("mcp-apps: narrowed _meta of tool %s to the policy: %s", name, found)
        if self.strict:
            return f"MCP Apps strict mode: tool '{name}' _meta.ui escaped operator policy (apps.strict = true)"
        return None

    def apply(self, items: Sequence[object], uri: str) -> str | None:
        """Clamp the ``_meta`` of each listed entry or read content; in ``strict`` mode, the refusal when any
        went beyond the policy (None: served, narrowed)."""
        violated = False
        for item in items:
            if isinstance(item, dict) and "_meta" in item:
                item["_meta"] = copy.deepcopy(item["_meta"])  # never the config's own
                found = self.clamp(item["_meta"])
                if found:
                    violated = True
                    _log.debug("mcp-apps: narrowed _meta.ui of %s to the policy: %s", uri, found)
        if self.strict and violated:
            return f"MCP Apps strict mode: '{uri}' _meta.ui escaped operator policy (apps.strict = true)"
        return None
