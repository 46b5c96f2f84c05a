#!/usr/bin/env python3
"""Stand-in for the public HTTP APIs the corpus playbooks call, on 127.0.0.1 only.

Copied from the noetl-oracle kit's ``httpd.py`` (``../shared/noetl-oracle/``; this paragraph added, formatted by
ruff, behaviour unchanged): the golden playbooks of ``golden/`` ran against it under the real NoETL, so mcpipe
runs them against the same server. ``test_goldens.py`` starts it on a free port.

    httpd.py [PORT] [TTL_S]      defaults: 18080, 0 (= run until killed)

Point a playbook at it by rewriting its base URL (httpbin.org, jsonplaceholder,
a cluster address, ...) to http://127.0.0.1:PORT. Routes:
  /status/N   answers with HTTP status N
  /api/health {"status": "ok"}
  /users/1    one jsonplaceholder-like user
  /posts      two jsonplaceholder-like posts
  anything else: an httpbin-like echo {"args", "headers", "method", "url", "data"}
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 18080
TTL = int(sys.argv[2]) if len(sys.argv) > 2 else 0


class Handler(BaseHTTPRequestHandler):
    def _send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def _handle(self, method):
        u = urlparse(self.path)
        args = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(u.query).items()}
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        p = u.path
        if p.startswith("/status/"):
            code = int(p.split("/")[2])
            return self._send(code, {"status": code})
        if p == "/api/health":
            return self._send(200, {"status": "ok"})
        if p == "/users/1":
            return self._send(200, {"id": 1, "name": "Leanne Graham", "username": "Bret"})
        if p == "/posts":
            return self._send(200, [{"userId": 1, "id": 1, "title": "t1"}, {"userId": 1, "id": 2, "title": "t2"}])
        self._send(
            200,
            {
                "args": args,
                "headers": dict(self.headers.items()),
                "method": method,
                "url": f"http://127.0.0.1:{PORT}{self.path}",
                "data": body,
            },
        )

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    def log_message(self, fmt, *a):
        sys.stderr.write("[httpd] " + (fmt % a) + "\n")


srv = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
if TTL > 0:
    threading.Timer(TTL, srv.shutdown).start()
srv.serve_forever()
