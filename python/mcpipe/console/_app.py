"""The console's HTTP side: its pages (``/console/...``), its JSON API (``/api/v1/...``) and their event streams,
served by the HTTP front of ``mcpipe serve`` on the MCP endpoint's listener (``docs/console.md``).

Each page is a Jinja template (autoescaped: every value a caller controls is escaped by the engine) over the
same data its API route answers, so a page shows everything with JavaScript off; the little JavaScript there is
(``static/console.js``) follows event streams (server-sent events) to update a page as things happen, and builds
what it adds with DOM calls, never HTML text. Every response says ``Content-Security-Policy: default-src 'none'``
with the console's own scripts, styles and connections allowed (no ``unsafe-inline``), and nothing is fetched
from anywhere else: the assets are files of the package.

Who is looking is decided as for ``/mcp``: the front's identity (a bearer token, an OIDC JWT, a client
certificate, a trusted subject header), else the console's session cookie (:mod:`mcpipe.console._session`); on a
server without auth everyone is the anonymous caller. Forms post with a CSRF token bound to the session, and
every request must name this server (the Host and Origin checks of ``/mcp``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode

import orjson
import trio

from mcpipe.access import Rejected
from mcpipe.console._api import API_VERSION, ApiError, ConsoleData, Served, Viewer, iso
from mcpipe.console._charts import bars, line, timeline
from mcpipe.console._session import Session, Signer, cookie_header, read_cookie, token_digest
from mcpipe.store import TERMINAL, StoreUnavailable
from mcpipe.tools import Identity

if TYPE_CHECKING:
    import jinja2

    from mcpipe.config import Config

__all__ = ["API_PREFIX", "CONSOLE_PREFIX", "Console", "signer_for"]

_log = logging.getLogger("mcpipe.console")

CONSOLE_PREFIX = "/console"
API_PREFIX = "/api/"
HERE = Path(__file__).parent
STATIC = HERE / "static"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
_TYPES = {".css": b"text/css; charset=utf-8", ".js": b"text/javascript; charset=utf-8", ".txt": b"text/plain"}
MAX_FORM = 16 * 1024
STREAM_WAIT_S = 15.0
"""How long an event stream waits for news before it sends a keep-alive comment."""
STREAM_GATHER_S = 0.25
"""After sending a run's events, how long its stream lets more gather before it reads again: a busy run's page
reads the queue a few times a second, however many events the run writes (a person sees no difference)."""
LIST_PERIOD_S = 2.0
"""How often a runs list's stream looks at the first page again (only while one is open)."""
METRICS_PERIOD_S = 2.0

Identify = Callable[[list[tuple[bytes, bytes]]], Awaitable["Identity | Rejected | None"]]
Known = Callable[[dict[str, Any]], bool]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def signer_for(config: Config) -> Signer:
    """The session signer: keyed by the state key when its variable is set (so every worker and a restarted
    server accept the same cookies), else random per process."""
    env = config.interaction.state_key_env
    secret = os.environ.get(env) if env else None
    return Signer(secret.encode() if secret else None)


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return ""
    if n < 1024:
        return f"{int(n)} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} kB"
    return f"{n / (1024 * 1024):.1f} MB"


def _duration(ms: Any) -> str:
    if not isinstance(ms, (int, float)):
        return ""
    if ms >= 60_000:
        return f"{ms / 60_000:.1f} min"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.1f} ms"


def _environment() -> jinja2.Environment:
    import jinja2  # with the console, not with every server

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["size"] = _size
    env.filters["duration"] = _duration
    env.filters["iso"] = iso
    env.filters["json"] = lambda v: orjson.dumps(v).decode()
    return env


class Console:
    """The console of one served app (made again when the config is reloaded).

    Args:
        app: the running server.
        identify: the HTTP front's identity of a request's headers (as ``/mcp`` resolves it).
        known: whether a request names this server (its Host, and Origin if any).
        require_auth: whether ``/mcp`` needs an identity (then so does the console).
        tokens: the bearer tokens' digests the front knows (a token session ends when its token goes).
        signer: signs the session cookies (:func:`signer_for`).
        config_path: the served config file (the servers page shows its check's warnings).
    """

    def __init__(
        self,
        app: Served,
        *,
        identify: Identify,
        known: Known,
        require_auth: bool,
        tokens: dict[bytes, str],
        signer: Signer,
        config_path: str | None = None,
    ) -> None:
        cfg = app.config.console
        self.cfg = cfg
        self.data = ConsoleData(
            app,
            operators=tuple(cfg.operators),
            operator_roles=tuple(cfg.operator_roles),
            config_path=config_path,
            page_size=cfg.page_size,
        )
        self.identify = identify
        self.known = known
        self.require_auth = require_auth
        self.token_digests = {d.hex() for d in tokens}
        self.signer = signer
        self.env = _environment()
        self.streams = 0
        resource = app.config.auth.resource
        self.public_https = resource is not None and (resource.url or "").lower().startswith("https://")
        """The server's public URL (``auth.resource.url``) is https: the browser reaches it over HTTPS."""

    # --- the front ---

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        api = path.startswith(API_PREFIX)
        if not self.known(scope):
            await self._plain(send, 421, b"this server is not named by the request's Host or Origin", api)
            return
        if path.startswith(CONSOLE_PREFIX + "/static/") and method == "GET":
            await self._static(send, path[len(CONSOLE_PREFIX + "/static/") :])
            return
        found = await self.identify(scope["headers"])
        if isinstance(found, Rejected):
            _log.info("console: refused a credential: %s", found.reason)
            await self._answer(send, 401, {"error": "unauthorized", "message": "the credential does not verify"})
            return
        session, fresh = self._session(scope)
        viewer: Viewer | None
        by_header = found is not None
        if found is not None:
            viewer = self.data.viewer(found)
        elif session.identity is not None:
            viewer = self.data.viewer(session.identity)
        elif not self.require_auth:
            viewer = self.data.viewer(None)
        else:
            viewer = None
        cookie = cookie_header(self.signer.dump(session), secure=self._secure(scope), max_age=None) if fresh else None
        try:
            if api:
                await self._api(scope, receive, send, viewer, session, by_header)
            else:
                await self._page(_Exchange(scope, receive, send, session, cookie), viewer)
            return
        except ApiError as exc:
            err = exc
        except StoreUnavailable as exc:
            err = ApiError(503, "STORE_UNAVAILABLE", str(exc))
        except trio.Cancelled:
            raise
        except Exception:
            _log.exception("console: %s %s failed", method, path)
            err = ApiError(500, "INTERNAL", "the console failed on this request (the server's log says why)")
        if api:
            await self._answer(send, err.status, err.body())
        else:
            await self._html(send, err.status, "error.html", {"error": err, "viewer": viewer}, cookie)

    def _session(self, scope: dict[str, Any]) -> tuple[Session, bool]:
        """The request's session (a new one when it has none or a bad one: then it is sent), a token session
        whose token the config no longer has signed out."""
        value = read_cookie(scope["headers"])
        session = self.signer.load(value) if value else None
        if session is None:
            return self.signer.new(), True
        if session.identity is not None and session.token_digest and session.token_digest not in self.token_digests:
            return Session(session.sid), True
        return session, False

    def _secure(self, scope: dict[str, Any]) -> bool:
        """Whether the session cookie is ``Secure``: over mcpipe's own HTTPS always; else as ``[console]
        secure_cookies`` says (unset: when the public URL is https or the request came to a proxy over HTTPS;
        a forged header only makes a cookie its own sender's browser will not send back over plain HTTP)."""
        if scope.get("scheme") == "https" or self.cfg.secure_cookies:
            return True
        if self.cfg.secure_cookies is False:
            return False
        if self.public_https:
            return True
        proto = (_header(scope, b"x-forwarded-proto") or "").split(",", 1)[0].strip().lower()
        return proto == "https" or (_header(scope, b"origin") or "").lower().startswith("https://")

    # --- the API ---

    async def _api(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        viewer: Viewer | None,
        session: Session,
        by_header: bool,
    ) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        prefix = f"{API_PREFIX}{API_VERSION}"
        if path in (prefix, prefix + "/") and method == "GET":
            await self._answer(send, 200, _index())
            return
        if not path.startswith(prefix + "/"):
            raise ApiError(404, "NOT_FOUND", f"no such API: the console's is {prefix}")
        if viewer is None:
            await self._answer(
                send,
                401,
                {"error": "unauthorized", "message": "a valid bearer token is required"},
                [(b"www-authenticate", b'Bearer realm="mcpipe"')],
            )
            return
        rest = path[len(prefix) + 1 :].strip("/")
        parts = rest.split("/") if rest else []
        query = _query(scope)
        if method == "POST":
            await self._posted(scope, receive, session, needs_token=not by_header)
            if len(parts) == 3 and parts[0] == "runs" and parts[2] in ("cancel", "retry"):
                act = self.data.cancel if parts[2] == "cancel" else self.data.retry
                await self._answer(send, 200, await act(viewer, parts[1]))
                return
            raise ApiError(404, "NOT_FOUND", f"no POST route {path}")
        if method != "GET":
            raise ApiError(405, "METHOD_NOT_ALLOWED", f"{method} is not served at {path}")
        if parts == ["runs"]:
            await self._answer(send, 200, await self.data.runs(viewer, query))
        elif len(parts) == 2 and parts[0] == "runs":
            await self._answer(send, 200, await self.data.run(viewer, parts[1]))
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "events":
            try:
                limit = int(query.get("limit") or 1000)
            except ValueError:
                raise ApiError(400, "INVALID_ARGUMENTS", "limit: expected a number from 1 to 1000") from None
            await self._answer(send, 200, await self.data.events(viewer, parts[1], query.get("after"), limit))
        elif parts == ["servers"]:
            await self._answer(send, 200, self.data.servers(viewer))
        elif parts == ["metrics"]:
            await self._answer(send, 200, self.data.metrics(viewer))
        elif parts == ["streams", "runs"]:
            await self._stream(scope, receive, send, self._runs_stream(viewer, query))
        elif len(parts) == 3 and parts[:2] == ["streams", "runs"]:
            await self.data.events(viewer, parts[2], None, 1)  # 404 before the stream starts
            after = query.get("after") or _header(scope, b"last-event-id")
            await self._stream(scope, receive, send, self._run_stream(viewer, parts[2], after))
        elif parts == ["streams", "metrics"]:
            await self._stream(scope, receive, send, self._metrics_stream(viewer))
        else:
            raise ApiError(404, "NOT_FOUND", f"no route {path}")

    async def _posted(
        self, scope: dict[str, Any], receive: Receive, session: Session, *, needs_token: bool
    ) -> dict[str, str]:
        """A POST's form (or JSON object), read within its bounds; a browser's (cookie) request must carry its
        session's CSRF token (the ``csrf`` field, or the ``X-CSRF-Token`` header)."""
        body = await _read(receive)
        kind = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
        form: dict[str, str] = {}
        if kind == "application/json":
            try:
                raw = orjson.loads(body or b"{}")
            except orjson.JSONDecodeError:
                raise ApiError(400, "INVALID_ARGUMENTS", "the body is not JSON") from None
            if isinstance(raw, dict):
                form = {str(k): str(v) for k, v in raw.items() if isinstance(v, (str, int, float, bool))}
        elif kind in ("application/x-www-form-urlencoded", ""):
            form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        else:
            raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", f"a form or JSON is expected, not {kind}")
        if needs_token:
            token = form.get("csrf") or _header(scope, b"x-csrf-token") or ""
            if not self.signer.csrf_ok(session, token):
                raise ApiError(403, "CSRF", "the form's CSRF token is missing or stale: load the page again")
        return form

    # --- pages ---

    async def _page(self, ex: _Exchange, viewer: Viewer | None) -> None:
        scope, receive, send, session, cookie = ex.scope, ex.receive, ex.send, ex.session, ex.cookie
        path: str = scope["path"].rstrip("/") or "/"
        method: str = scope["method"]
        query = _query(scope)
        if path == CONSOLE_PREFIX + "/login":
            await self._login(ex, viewer)
            return
        if viewer is None:
            back = scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
            await self._redirect(send, f"{CONSOLE_PREFIX}/login?next={quote(back)}", cookie)
            return
        if path == CONSOLE_PREFIX + "/logout" and method == "POST":
            await self._posted(scope, receive, session, needs_token=True)
            out = cookie_header(self.signer.dump(self.signer.new()), secure=self._secure(scope), max_age=None)
            await self._redirect(send, f"{CONSOLE_PREFIX}/login", out)
            return
        if method == "POST":
            parts = path[len(CONSOLE_PREFIX) + 1 :].split("/")
            if len(parts) == 3 and parts[0] == "runs" and parts[2] in ("cancel", "retry"):
                await self._posted(scope, receive, session, needs_token=True)
                if parts[2] == "cancel":
                    await self.data.cancel(viewer, parts[1])
                    await self._redirect(send, f"{CONSOLE_PREFIX}/runs/{quote(parts[1])}", cookie)
                else:
                    new = await self.data.retry(viewer, parts[1])
                    await self._redirect(send, f"{CONSOLE_PREFIX}/runs/{quote(new['run']['run_id'])}", cookie)
                return
            raise ApiError(404, "NOT_FOUND", f"no POST route {path}")
        if method != "GET":
            raise ApiError(405, "METHOD_NOT_ALLOWED", f"{method} is not served at {path}")
        common = {"viewer": viewer, "csrf": self.signer.csrf(session), "query": query}
        if path in (CONSOLE_PREFIX, CONSOLE_PREFIX + "/runs"):
            data = await self.data.runs(viewer, query)
            keep = {k: v for k, v in query.items() if k != "before" and v}
            more = f"{CONSOLE_PREFIX}/runs?{urlencode({**keep, 'before': data['next']})}" if data["next"] else None
            stream = f"{API_PREFIX}{API_VERSION}/streams/runs?{urlencode(keep)}" if not query.get("before") else None
            twin = f"{API_PREFIX}{API_VERSION}/runs" + (f"?{urlencode(query)}" if query else "")
            await self._html(
                send, 200, "runs.html", {**common, "data": data, "more": more, "stream": stream, "twin": twin},
                cookie,
            )  # fmt: skip
        elif path.startswith(CONSOLE_PREFIX + "/runs/"):
            run_id = path[len(CONSOLE_PREFIX + "/runs/") :]
            data = await self.data.run(viewer, run_id)
            stream = None
            if data["run"]["status"] not in TERMINAL:
                after = f"?after={quote(data['next'])}" if data["next"] else ""
                stream = f"{API_PREFIX}{API_VERSION}/streams/runs/{quote(run_id)}{after}"
            charts = {"timeline": timeline(data["timeline"], f"timeline of run {run_id}")}
            twin = f"{API_PREFIX}{API_VERSION}/runs/{quote(run_id)}"
            await self._html(
                send, 200, "run.html", {**common, "data": data, "stream": stream, "charts": charts, "twin": twin},
                cookie,
            )  # fmt: skip
        elif path == CONSOLE_PREFIX + "/servers":
            data = self.data.servers(viewer)
            await self._html(
                send, 200, "servers.html", {**common, "data": data, "twin": f"{API_PREFIX}{API_VERSION}/servers"},
                cookie,
            )  # fmt: skip
        elif path == CONSOLE_PREFIX + "/metrics":
            data = self.data.metrics(viewer)
            charts = {
                "rate": line(data["series"], "calls per second"),
                "tools": bars(data["tools"], "tool", "calls", "calls by tool"),
                "p99": bars(data["tools"], "tool", "p99_ms", "p99 latency by tool", " ms"),
                "principals": bars(data["principals"], "principal", "calls", "calls by principal"),
            }
            await self._html(
                send, 200, "metrics.html",
                {**common, "data": data, "charts": charts, "twin": f"{API_PREFIX}{API_VERSION}/metrics",
                 "stream": f"{API_PREFIX}{API_VERSION}/streams/metrics"},
                cookie,
            )  # fmt: skip
        else:
            raise ApiError(404, "NOT_FOUND", f"no page {path}")

    async def _login(self, ex: _Exchange, viewer: Viewer | None) -> None:
        scope, send, session, cookie = ex.scope, ex.send, ex.session, ex.cookie
        nxt = _into_console(_query(scope).get("next"))
        if scope["method"] == "POST":
            form = await self._posted(scope, ex.receive, session, needs_token=True)
            token = (form.get("token") or "").strip()
            nxt = _into_console(form.get("next") or nxt)
            found = (
                await self.identify([(b"authorization", f"Bearer {token}".encode("latin-1", "replace"))])
                if token
                else None
            )
            if found is None or isinstance(found, Rejected):
                ctx = {"viewer": None, "csrf": self.signer.csrf(session), "next": nxt,
                       "failed": "that credential does not verify" if token else "a credential is needed",
                       "needed": self.require_auth, "ttl": self._ttl()}  # fmt: skip
                await self._html(send, 401, "login.html", ctx, cookie)
                return
            expires = time.time() + self.cfg.session_ttl_s
            exp = found.claims.get("exp") if found.claims else None
            if isinstance(exp, (int, float)):
                expires = min(expires, float(exp))
            digest = token_digest(token) if found.provider == "token" else None
            signed = Session(os.urandom(16).hex(), found, expires, digest)
            age = int(max(1, expires - time.time()))
            out = cookie_header(self.signer.dump(signed), secure=self._secure(scope), max_age=age)
            await self._redirect(send, nxt, out)
            return
        page: dict[str, Any] = {"viewer": viewer, "csrf": self.signer.csrf(session), "next": nxt, "failed": None,
                                "needed": self.require_auth, "ttl": self._ttl()}  # fmt: skip
        await self._html(send, 200, "login.html", page, cookie)

    def _ttl(self) -> str:
        hours = self.cfg.session_ttl_s / 3600
        return f"{hours:g} hours" if hours >= 1 else f"{self.cfg.session_ttl_s // 60} minutes"

    # --- event streams ---

    async def _runs_stream(self, viewer: Viewer, query: dict[str, str]) -> Any:
        """The runs list's first page, again whenever it changed (looked at every couple of seconds)."""
        last = b""
        while True:
            data = await self.data.runs(viewer, {k: v for k, v in query.items() if k != "before"})
            blob = orjson.dumps(data["runs"])
            if blob != last:
                last = blob
                yield [("runs", None, orjson.dumps(data))]
            await trio.sleep(LIST_PERIOD_S)

    async def _run_stream(self, viewer: Viewer, run_id: str, after: str | None) -> Any:
        """A run's events as they are written (the queue's own wait, no polling of the page), then ``end``."""
        queue = self.data.queue
        cursor = after
        while True:
            batch = await queue.events(run_id, after=cursor, limit=500, wait_s=STREAM_WAIT_S)
            out: list[tuple[str | None, str | None, bytes]] = []
            for event in batch:
                cursor = event.cursor
                out.append(("run-event", event.cursor, orjson.dumps(event.to_dict())))
                if event.type in TERMINAL:
                    out.append(("end", None, b"{}"))
                    yield out
                    return
            if batch:
                yield out  # one write for the batch
                await trio.sleep(STREAM_GATHER_S)
            else:
                info = await queue.get(run_id)
                if info is None or info.done:
                    yield [("end", None, b"{}")]
                    return
                yield [(None, None, b"")]  # a keep-alive comment

    async def _metrics_stream(self, viewer: Viewer) -> Any:
        while True:
            yield [("metrics", None, orjson.dumps(self.data.metrics(viewer)))]
            await trio.sleep(METRICS_PERIOD_S)

    async def _stream(self, scope: Mapping[str, object], receive: Receive, send: Send, events: Any) -> None:
        """Serve ``events`` (batches of ``(type, id, data)``, each batch one write) as server-sent events until
        they end or the client goes."""
        if self.streams >= self.cfg.max_streams:
            raise ApiError(
                503, "LIMIT_EXCEEDED", f"{self.cfg.max_streams} event streams are open ([console] max_streams)"
            )
        self.streams += 1
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"x-accel-buffering", b"no"),
                        *_SECURITY,
                    ],
                }
            )
            async with trio.open_nursery() as nursery:

                async def gone() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(gone)
                async with _closing(events) as stream:
                    async for batch in stream:
                        chunks = []
                        for kind, ident, data in batch:
                            if kind is None:
                                chunks.append(b": keep-alive\n\n")
                                continue
                            chunks.append(f"event: {kind}\n".encode())
                            if ident is not None:
                                chunks.append(f"id: {ident}\n".encode())
                            chunks.append(b"data: " + data + b"\n\n")
                        await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                nursery.cancel_scope.cancel()
        finally:
            self.streams -= 1

    # --- responses ---

    async def _answer(
        self, send: Send, status: int, body: Mapping[str, object], extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        data = orjson.dumps(body, default=_default)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *_SECURITY]
        await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
        await send({"type": "http.response.body", "body": data})

    async def _plain(self, send: Send, status: int, text: bytes, api: bool) -> None:
        if api:
            await self._answer(send, status, {"error": "misdirected", "message": text.decode()})
            return
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(text)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers + _SECURITY})
        await send({"type": "http.response.body", "body": text})

    async def _html(self, send: Send, status: int, name: str, ctx: Mapping[str, object], cookie: bytes | None) -> None:
        page = self.env.get_template(name).render(
            prefix=CONSOLE_PREFIX, api=f"{API_PREFIX}{API_VERSION}", name_of_server=self.data.app.config.name, **ctx
        )
        data = page.encode()
        headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(data)).encode())]
        if cookie is not None:
            headers.append((b"set-cookie", cookie))
        await send({"type": "http.response.start", "status": status, "headers": headers + _SECURITY})
        await send({"type": "http.response.body", "body": data})

    async def _redirect(self, send: Send, to: str, cookie: bytes | None) -> None:
        headers = [(b"location", to.encode()), (b"content-length", b"0"), *_SECURITY]
        if cookie is not None:
            headers.append((b"set-cookie", cookie))
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _static(self, send: Send, name: str) -> None:
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            await self._plain(send, 404, b"not found", False)
            return
        data = path.read_bytes()
        kind = _TYPES.get(path.suffix, b"application/octet-stream")
        headers = [(b"content-type", kind), (b"content-length", str(len(data)).encode())]
        headers += [h for h in _SECURITY if h[0] != b"cache-control"] + [(b"cache-control", b"max-age=3600")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})


@dataclass(frozen=True, slots=True)
class _Exchange:
    """One page request: its ASGI scope and channels, its session, and the cookie to set (None: none)."""

    scope: dict[str, Any]
    receive: Receive
    send: Send
    session: Session
    cookie: bytes | None


def _into_console(nxt: str | None) -> str:
    """Where sign-in sends a browser back: a console page, never elsewhere (an open redirect)."""
    if not nxt or not nxt.startswith(CONSOLE_PREFIX) or "//" in nxt or "\\" in nxt:
        return f"{CONSOLE_PREFIX}/runs"
    return nxt


class _closing:
    """``async with _closing(agen) as agen``: the generator is closed however the block ends."""

    def __init__(self, agen: Any) -> None:
        self.agen = agen

    async def __aenter__(self) -> Any:
        return self.agen

    async def __aexit__(self, *exc: object) -> None:
        await self.agen.aclose()


def _default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _query(scope: dict[str, Any]) -> dict[str, str]:
    raw = scope.get("query_string") or b""
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=False)) if raw else {}


async def _read(receive: Receive, max_bytes: int = MAX_FORM, timeout_s: float = 10.0) -> bytes:
    """A POST body of at most ``max_bytes``, within ``timeout_s``.

    Raises:
        ApiError: larger (413), or slower (408).
    """
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout_s):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                raise ApiError(413, "TOO_LARGE", f"a console form holds at most {max_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    raise ApiError(408, "REQUEST_TIMEOUT", f"the form did not arrive within {timeout_s:g} s")


def _index() -> dict[str, Any]:
    """``GET /api/v1``: the routes, for whoever explores the API."""
    v = f"{API_PREFIX}{API_VERSION}"
    return {
        "version": API_VERSION,
        "docs": "docs/console.md",
        "routes": {
            f"GET {v}/runs": "runs, newest first: status, tool, principal (- anonymous), since, until, limit, before",
            f"GET {v}/runs/ID": "one run: its plan (mermaid, svg, states, taken arcs), steps, timeline, errors, events",
            f"GET {v}/runs/ID/events": "the run's events after cursor `after`",
            f"POST {v}/runs/ID/cancel": "cancel the run (as pipe_cancel)",
            f"POST {v}/runs/ID/retry": "run it again, as the caller",
            f"GET {v}/servers": "downstream servers, tools, pipelines, playbooks, formats, the config's warnings",
            f"GET {v}/metrics": "calls/s, p50/p99, errors by code, queue depth, per tool and principal",
            f"GET {v}/streams/runs": "server-sent events: the runs list's first page when it changes",
            f"GET {v}/streams/runs/ID": "server-sent events: the run's events as they are written, then `end`",
            f"GET {v}/streams/metrics": "server-sent events: the metrics every 2 s",
        },
    }
