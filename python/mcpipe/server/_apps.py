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
_OPENAI_DOMAIN = "openai/widgetDomain"


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

    def clamp(self, meta: Any) -> list[str]:
        """Narrow one ``_meta`` (its ``ui``, and the ``openai/widget*`` aliases) in place; the violations."""
        violations: list[str] = []
        if not isinstance(meta, dict):
            return violations
        widget = meta.get(_OPENAI_CSP)
        if isinstance(widget, dict):
            for alias, axis in _OPENAI_AXES:
                self._axis(widget, alias, axis, f"{_OPENAI_CSP}.{alias}", violations)
        domain = meta.get(_OPENAI_DOMAIN)
        if self.domains is not None and isinstance(domain, str) and domain not in self.domains:
            violations.append(f"{_OPENAI_DOMAIN} '{meta.pop(_OPENAI_DOMAIN)}' dropped (outside allow-list)")
        ui = meta.get("ui")
        if not isinstance(ui, dict):
            return violations
        csp = ui.get("csp")
        if isinstance(csp, dict):
            for axis in _CSP_AXES:
                self._axis(csp, axis, axis, f"csp.{axis}", violations)
        perms = ui.get("permissions")
        if isinstance(perms, dict):
            for key in [k for k in perms if k not in self.permissions]:
                del perms[key]
                violations.append(f"permission '{key}' stripped (not in allow-list)")
        if self.domains is not None and isinstance(ui.get("domain"), str) and ui["domain"] not in self.domains:
            violations.append(f"domain '{ui.pop('domain')}' dropped (outside allow-list)")
        return violations

    def _axis(self, csp: dict[str, Any], key: str, axis: str, where: str, violations: list[str]) -> None:
        upstream = csp.get(key)
        if not isinstance(upstream, list):
            return  # an axis left out keeps the host's restrictive default
        values = [v for v in upstream if isinstance(v, str)]
        narrowed = _intersect(values, self.axes[axis])
        if narrowed != values:
            dropped = [d for d in values if d not in narrowed]
            if dropped:
                violations.append(f"{where} dropped {dropped} (outside operator allow-list)")
            csp[key] = narrowed

    def apply(self, items: list[Any], uri: str) -> str | None:
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
