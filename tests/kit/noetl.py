"""NoETL's vendored playbooks run by mcpipe, and a real HTTP origin on 127.0.0.1 for their ``http`` steps.

:class:`Origin` is an HTTP server (the standard library's, in a thread) on a free port of 127.0.0.1: it
answers like httpbin (``/get``, ``/post``, ``/status/N``), serves ``/users/N`` and ``/posts``,
``/flaky/KEY/N`` answers 503 to the first ``N`` requests of ``KEY`` and 200 after, and
``/api/v1/concurrency/{reset,probe,stats}`` are NoETL's test server's concurrency probe (a probe waits
``delay_seconds``; the stats count probes started, completed, active and the most active at once);
``/api/v1/users`` (offset), ``/api/v1/assessments`` (page), ``/api/v1/events`` (cursor) and ``/api/v1/flaky``
(a page in ``fail_on`` answers 500 the first time) are its paginated API (NoETL's
``tests/fixtures/servers/paginated_api.py``: 35 items, 10 a page); it records every request.
:func:`run_file` loads a vendored playbook as it is and runs it as the served tool runs it.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool
from mcpipe.kinds import CommandPolicy, HttpPolicy, StepPolicy

UPSTREAM = Path(__file__).resolve().parents[1] / "formats" / "noetl" / "upstream"
PAGINATED = ("/api/v1/users", "/api/v1/assessments", "/api/v1/events", "/api/v1/flaky")
PAGINATED_TOTAL = 35


def policy() -> StepPolicy:
    """What an operator allows the vendored playbooks: HTTP to 127.0.0.1 only, ``sh`` for shell steps."""
    return StepPolicy(http=HttpPolicy(allowed_hosts=("127.0.0.1",)), command=CommandPolicy(commands={"sh": "/bin/sh"}))


def load(rel: str) -> NoetlPlaybook:
    """A vendored playbook (``rel`` under ``upstream/``), checked and compiled; it must have no problem."""
    pb, problems = load_playbook(rel, base_dir=str(UPSTREAM), policy=policy())
    assert problems == [], [str(p) for p in problems]
    assert isinstance(pb, NoetlPlaybook), type(pb)
    return pb


async def run_file(rel: str, args: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None) -> Any:
    """Run a vendored playbook; answers the tool's answer (``noetl`` holds the run in NoETL's shape)."""
    tool = playbook_tool(load(rel))
    return await tool.run(args or {}, on_event=events.append if events is not None else None)


PROBE_HOLD_S = 1.0
"""How long the concurrency probe holds every request, the fast ones too (see ``Origin.concurrency``)."""


class Origin:
    """A real HTTP server on 127.0.0.1 (see the module); ``hits`` counts requests by path."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.probes = {"started": 0, "completed": 0, "active": 0, "max_active": 0}
        self.requests: list[dict[str, Any]] = []
        self.flaky: Counter[int] = Counter()
        self._lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with origin._lock:
                    origin.hits[parts.path] += 1
                    count = origin.hits[parts.path]
                    origin.requests.append(
                        {"method": self.command, "path": parts.path, "query": parts.query, "body": body.decode()}
                    )
                status, payload = origin.route(self.command, parts.path, parse_qs(parts.query), body, count)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, method: str, path: str, query: dict[str, list[str]], body: bytes, count: int) -> tuple[int, Any]:
        args = {k: v[0] if len(v) == 1 else v for k, v in query.items()}
        parts = path.strip("/").split("/")
        if path.startswith("/api/v1/concurrency/"):
            return self.concurrency(parts[-1], args)
        if path in PAGINATED:
            return self.paginated(path, args)
        if parts[0] == "status" and len(parts) == 2 and parts[1].isdigit():
            return int(parts[1]), {"status": int(parts[1])}
        if parts[0] == "flaky" and len(parts) == 3 and parts[2].isdigit():
            return (503, {"error": "try again"}) if count <= int(parts[2]) else (200, {"ok": True, "attempt": count})
        if parts[0] == "users" and len(parts) == 2:
            return 200, {"id": int(parts[1]) if parts[1].isdigit() else parts[1], "name": "Leanne Graham"}
        if parts[0] == "posts":
            return 200, [{"id": 1, "userId": int(args.get("userId", 1)), "title": "first"}]
        text = body.decode() if body else ""
        try:
            decoded: Any = json.loads(text) if text else None
        except ValueError:
            decoded = None
        return 200, {"args": args, "json": decoded, "data": text, "url": f"{self.url}{path}", "method": method}

    def paginated(self, path: str, args: dict[str, Any]) -> tuple[int, Any]:
        """NoETL's paginated test API (``tests/fixtures/servers/paginated_api.py``), its answers as it gives them."""
        total = PAGINATED_TOTAL
        if path == "/api/v1/users":
            offset, limit = int(args.get("offset") or 0), int(args.get("limit") or 10)
            users = [{"id": i, "username": f"user{i}", "email": f"user{i}@example.com"} for i in range(1, total + 1)]
            page = users[offset : offset + limit]
            return 200, {
                "users": page,
                "has_more": offset + limit < total,
                "offset": offset,
                "limit": limit,
                "total": total,
            }
        if path == "/api/v1/events":
            cursor, limit = args.get("cursor"), int(args.get("limit") or 10)
            number = int(base64.b64decode(cursor).decode()) if cursor else 1
            start = (number - 1) * limit
            events = [
                {"id": i, "type": "user_action", "timestamp": f"2024-01-{(i % 28) + 1:02d}T12:00:00Z"}
                for i in range(start + 1, min(start + limit, total) + 1)
            ]
            more = start + limit < total
            token = base64.b64encode(str(number + 1).encode()).decode() if more else None
            return 200, {"events": events, "next_cursor": token, "limit": limit}
        number = int(args.get("page") or 1)
        size = int(args.get("pageSize") or 10) if path == "/api/v1/assessments" else 10
        if path == "/api/v1/flaky":
            fail_on = [int(p) for p in str(args.get("fail_on") or "").split(",") if p.strip()]
            with self._lock:
                self.flaky[number] += 1
                first = self.flaky[number] == 1
            if number in fail_on and first:
                return 500, {"detail": "Simulated failure"}
        start, end = (number - 1) * size, number * size
        if path == "/api/v1/assessments":
            items = [
                {"id": i, "name": f"Assessment {i}", "score": 50 + (i % 50)}
                for i in range(start + 1, min(end, total) + 1)
            ]
            paging = {"hasMore": end < total, "page": number, "pageSize": size, "total": total}
        else:
            items = [{"id": i, "value": f"item_{i}"} for i in range(start + 1, min(end, total) + 1)]
            paging = {"hasMore": end < total, "page": number, "pageSize": size}
        return 200, {"data": items, "paging": paging}

    def concurrency(self, what: str, args: dict[str, Any]) -> tuple[int, Any]:
        p = self.probes
        if what == "reset":
            with self._lock:
                p.update(started=0, completed=0, active=0, max_active=0)
            return 200, {"status": "reset"}
        if what == "stats":
            with self._lock:
                return 200, dict(p)
        with self._lock:
            p["started"] += 1
            p["active"] += 1
            p["max_active"] = max(p["max_active"], p["active"])
        # Each probe is held at least PROBE_HOLD_S: requests sent at once then overlap however the loop's
        # items happen to be scheduled (the slow one may reach the server last) and however loaded the host is.
        time.sleep(max(PROBE_HOLD_S, min(float(args.get("delay_seconds") or 0), 5.0)))
        with self._lock:
            p["active"] -= 1
            p["completed"] += 1
        return 200, {"status": "ok", "label": args.get("label")}

    def __enter__(self) -> Origin:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@contextmanager
def origin() -> Iterator[Origin]:
    """An :class:`Origin`, started and stopped."""
    with Origin() as o:
        yield o


def step_order(events: list[dict[str, Any]], kind: str = "step_exit") -> list[str]:
    """The step names of ``kind`` events, in order."""
    return [e["step"] if "step" in e else e["id"] for e in events if e["type"] == kind]
