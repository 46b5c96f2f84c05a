"""Reloading the config while serving over HTTP: SIGHUP, or the file watched (``reload.watch``).

A reload reads the file again (its format, ``${VAR}`` and mcpg's ``MCPG_*`` overlay read from the environment
again), opens a whole new app from it (tool sources, gateway, downstream servers, audit, watches) and only
then swaps it in atomically: the HTTP front serves the new app's auth, trust and gates, the SDK server its
handlers (every open session sees the new tools at its next request, and is told the lists changed). Calls
already running finish on the old app, which is closed once they have. What the listener was built with
stays until a restart (the address, the paths, TLS, the session limits: the ``http`` section) and a reload
that changes it says so in the log.

A file that does not load is not served: the current config keeps serving, and one line says why, located
(``config reload refused: mcpg.yaml: mcp.capabilities.tools[0].backend.kind: ...``); the file is tried again
when it changes (watching) or at the next SIGHUP. This is mcpg's reload (``src/app/config_watch.rs``,
``src/app/reload.rs``): SHA-256 of the file's bytes every ``poll_ms`` (at least 1 s), the old runtime kept on
a bad file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

import trio

from mcpipe.config import Config, ConfigError, Loaded, load
from mcpipe.server._app import App, open_app
from mcpipe.server._heap import thaw

__all__ = ["Reloader"]

_log = logging.getLogger("mcpipe.server")

DRAIN_S = 60.0
"""How long calls still running on a replaced app may take before it is closed under them."""


def _restart_only(config: Config) -> dict[str, object]:
    """The sections a reload cannot change on a running server (the listener, the run queue and the pipeline store
    it opened, the metrics and log sinks it installed), by name: they keep their values until a restart."""
    return {
        "http": config.http,
        "runs": config.runs,
        "store": config.store,
        "telemetry": config.telemetry,
        "logs": config.logs,
        "reload": config.reload,
        "interaction": config.interaction,
    }


def _digest(path: str) -> bytes | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).digest()
    except OSError:
        return None


class Reloader:
    """Serves a config file's app, replacing it by the file's next version on SIGHUP or when it changes.

    Args:
        path: the config file.
        config: its first version, already loaded (a :class:`~mcpipe.config.Loaded`: what it declares compiled
            once, there).
        execute: whether this process executes queued runs (``open_app``'s).
    """

    def __init__(self, path: str, config: Config | Loaded, *, execute: bool | None = None) -> None:
        self.path = path
        self._first = config
        self.config = config.config if isinstance(config, Loaded) else config
        self.execute = execute
        self.app: App | None = None
        """The SDK server the sessions run (the first app's): each reload gives it the new app's handlers."""
        self.front: Any = None
        self.reloads = 0
        """How many reloads were served (for tests and the log)."""
        self._nursery: trio.Nursery | None = None
        self._close: trio.Event | None = None
        self._lock = trio.Lock()
        self._digest = _digest(path)
        self._refused: bytes | None = None
        self.changed = trio.Event()
        """Set (and replaced) after each reload, served or refused."""

    def attach(self, front: object) -> None:
        """The HTTP front serving the app (``serve_http(on_front=...)``)."""
        self.front = front

    async def run(self, *, task_status: trio.TaskStatus[App] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the first app, report it, then reload on SIGHUP and (``reload.watch``) on a change of the file,
        until cancelled (which closes the app being served)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.app, self._close = await nursery.start(self._hold, self._first)
            task_status.started(self.app)
            nursery.start_soon(self._on_sighup)
            if self.config.reload.watch:
                nursery.start_soon(self._watch)

    async def _hold(self, config: Config | Loaded, *, task_status: trio.TaskStatus[tuple[App, trio.Event]]) -> None:
        """One app, open until told to close (then its calls in flight get :data:`DRAIN_S` to finish)."""
        close = trio.Event()
        async with open_app(config, execute=self.execute) as app:
            task_status.started((app, close))
            await close.wait()
            with trio.move_on_after(DRAIN_S):
                await app.handlers.idle()

    async def _on_sighup(self) -> None:
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                await self.reload("sighup")

    async def _watch(self) -> None:
        poll_s = self.config.reload.poll_ms / 1000
        _log.info("watching %s for changes every %g s", self.path, poll_s)
        while True:
            await trio.sleep(poll_s)
            digest = await trio.to_thread.run_sync(_digest, self.path)
            if digest is not None and digest != self._digest and digest != self._refused:
                await self.reload("file_watch", digest)

    async def reload(self, source: str, digest: bytes | None = None) -> bool:
        """Load the file again and serve it; False (one log line, the current app serving on) when it does not
        load. ``source``: what asked (``sighup``, ``file_watch``)."""
        async with self._lock:
            digest = digest if digest is not None else await trio.to_thread.run_sync(_digest, self.path)
            try:
                return await self._reload(source, digest)
            finally:
                event, self.changed = self.changed, trio.Event()
                event.set()

    async def _reload(self, source: str, digest: bytes | None) -> bool:
        assert self._nursery is not None and self.app is not None
        try:
            loaded = await trio.to_thread.run_sync(lambda: load(self.path, environ=dict(os.environ)))
            app, close = await self._nursery.start(self._hold, loaded)
        except ConfigError as exc:
            self._refuse(source, digest, exc.problems[0].location, exc.problems[0].message, len(exc.problems) - 1)
            return False
        except OSError as exc:
            self._refuse(source, digest, self.path, str(exc), 0)  # the app could not open (a port, a file)
            return False
        old, old_close = self.app, self._close
        config = loaded.config
        before = _restart_only(old.config)
        kept = [k for k, value in _restart_only(config).items() if value != before[k]]
        self._swap(old, app)
        thaw()  # the config of the start was frozen with the process (`mcpipe serve`): it may go now
        self.app, self._close, self.config = app, close, config
        self._digest, self._refused = digest, None
        self.reloads += 1
        _log.info("config reloaded (%s): %s", source, self.path)
        if kept:
            _log.warning(
                "config reload: %s keep%s the values the server started with until a restart",
                ", ".join(f"`{k}`" for k in kept),
                "s" if len(kept) == 1 else "",
            )
        await self._announce(app)
        assert old_close is not None
        old_close.set()
        return True

    def _refuse(self, source: str, digest: bytes | None, where: str, why: str, more: int) -> None:
        if digest is not None and digest == self._refused:
            return  # said once for this content
        self._refused = digest
        tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        _log.error("config reload refused (%s): %s: %s%s", source, where, why, tail)

    def _swap(self, old: App, new: App) -> None:
        """Serve ``new`` in place of ``old``: the SDK server's handlers, the HTTP front, and what the old
        handlers knew of the connected clients (their info, log levels, subscriptions)."""
        # The SDK server the session manager serves (None while the SDK loads: the manager, once built, serves
        # the front's app of then, whose server is the one to keep).
        manager = getattr(self.front, "manager", None)
        live = manager.app if manager is not None else None
        if live is not None:
            server = new.server
            live._request_handlers = server._request_handlers
            live._notification_handlers = server._notification_handlers
            live.get_tool_input_schema = server.get_tool_input_schema
            live.extensions = server.extensions
        h_old, h_new = old.handlers, new.handlers
        h_new.legacy_clients = h_old.legacy_clients
        h_new.session_transport = h_old.session_transport
        p_old, p_new = h_old.passthrough, h_new.passthrough
        if p_old is not None and p_new is not None:
            p_new.levels = p_old.levels
            p_new._sessions = p_old._sessions
            p_new._subscribers = p_old._subscribers
            p_new._facts = p_old._facts
            p_new._local_streams = p_old._local_streams
            p_new.bus = p_old.bus  # the listen streams open now hear the new app's events
            for uri in list(p_new._subscribers) + list(p_new._local_streams):
                if p_new.watches.watched(uri):
                    p_new.watches.subscribed(uri)
        if self.front is not None:
            self.front.adopt(new)

    async def _announce(self, app: App) -> None:
        """Tell every connected client that the lists may have changed."""
        p = app.handlers.passthrough
        if p is None:
            return
        from mcp.server.subscriptions import PromptsListChanged, ResourcesListChanged, ToolsListChanged

        for event in (ToolsListChanged(), PromptsListChanged(), ResourcesListChanged()):
            await p.bus.publish(event)
        for session in list(p._sessions.values()):
            try:
                await session.send_tool_list_changed()
                await session.send_prompt_list_changed()
                await session.send_resource_list_changed()
            except Exception as exc:  # a client that went away
                _log.debug("cannot tell a client the lists changed: %s", exc)
