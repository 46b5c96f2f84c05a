"""The image's HEALTHCHECK: GET /healthz on the port mcpipe listens on (MCPIPE_HTTP, else 8765); exit 0 when
it answers 200 with ``"ok": true``, else 1 with one line saying why."""

import json
import os
import sys
import urllib.request

listen = os.environ.get("MCPIPE_HTTP", "0.0.0.0:8765")
host, _, port = listen.rpartition(":")
host = host.strip("[]")
if host in ("", "0.0.0.0", "::"):
    host = "127.0.0.1" if host != "::" else "::1"
url = f"http://[{host}]:{port}/healthz" if ":" in host else f"http://{host}:{port}/healthz"
try:
    with urllib.request.urlopen(url, timeout=2) as reply:
        ok = reply.status == 200 and json.loads(reply.read()).get("ok") is True
except (OSError, ValueError) as exc:
    print(f"healthcheck: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
if not ok:
    print(f"healthcheck: {url} did not answer ok", file=sys.stderr)
sys.exit(0 if ok else 1)
