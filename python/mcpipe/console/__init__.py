"""The web console of ``mcpipe serve``: runs (live, filtered, paged), a run (its plan drawn and marked, its
timeline, steps, errors and events, cancel and retry), servers and tools, and metrics at a glance, as plain
server-rendered pages over a versioned JSON API (``/api/v1``), on the MCP endpoint's listener and behind its auth
(``docs/console.md``). The HTTP front (:mod:`mcpipe.server._http`) routes ``/console`` and ``/api/`` here."""

from mcpipe.console._api import API_VERSION, ApiError, ConsoleData, Viewer
from mcpipe.console._app import API_PREFIX, CONSOLE_PREFIX, Console, signer_for

__all__ = ["API_PREFIX", "API_VERSION", "CONSOLE_PREFIX", "ApiError", "Console", "ConsoleData", "Viewer", "signer_for"]
