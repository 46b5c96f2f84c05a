"""mcpg's config files (seed 003), read as they are: see ``python/mcpipe/formats/__init__.py``.

A document is mcpg's when its top-level keys are mcpg's (``gateway``, ``mcp``, ``governance``,
``observability``, ...), at least one of which mcpipe's own layout does not have. It is translated
into mcpipe's own layout (:mod:`._translate`); its bindings run on the ``mcpg.*`` step kinds
(:mod:`._kinds`) and answer in mcpg's shapes (:mod:`._answers`); ``[audit] format = "mcpg"`` writes mcpg's
audit events (:mod:`._audit`); ``docs/formats/mcpg.md`` maps every section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcpipe.formats import Format, Translation

if TYPE_CHECKING:
    from mcpipe.formats.mcpg._audit import McpgAuditLog

__all__ = ["FORMAT", "McpgFormat"]

_ROOTS = frozenset(
    {
        "cloud",
        "cluster",
        "credentials",
        "debug",
        "feature_flags",
        "gateway",
        "governance",
        "license",
        "mcp",
        "observability",
        "plugins",
        "schema_registry",
        "storage",
        "usage_reporting",
    }
)


_SHARED = frozenset({"credentials"})
"""mcpg's top-level keys that mcpipe's own layout has as well."""


class McpgFormat(Format):
    """mcpg's config layout (``mcpg-dev/mcpg``, v0.1.0-beta.16)."""

    name = "mcpg"

    def detect(self, raw: Mapping[str, object]) -> bool:
        keys = {str(k) for k in raw}
        # `credentials` is a key of mcpipe's own layout too: a document of only that is mcpipe's.
        return keys <= _ROOTS and bool(keys - _SHARED)

    def translate(self, raw: Mapping[str, object], *, base_dir: str, environ: Mapping[str, str]) -> Translation:
        from mcpipe.formats.mcpg import _kinds  # noqa: F401  (the mcpg.* kinds and answer shapes)
        from mcpipe.formats.mcpg._translate import translate

        return translate(raw, base_dir=base_dir, environ=environ)

    def no_pipe_reason(self) -> str:
        from mcpipe.formats.mcpg._translate import PIPE_SWITCH

        return f"an mcpg file serves none, as mcpg does: set {PIPE_SWITCH}=1 to serve it beside the bindings"

    def audit_log(self, path: str | None, audit: Any) -> McpgAuditLog:
        """mcpg's hash-chained audit events (``[audit] format = "mcpg"``)."""
        from mcpipe.formats.mcpg._audit import McpgAuditLog

        return McpgAuditLog(path, allowed=audit.emit_allowed, completed=audit.emit_completed)


FORMAT = McpgFormat()
