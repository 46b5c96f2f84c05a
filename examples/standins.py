"""Stand-ins for what some examples reach beyond this machine, on 127.0.0.1 ports of their own, for as long as
an example's ``run.py`` runs: a model (OpenAI's chat-completions API, answering scripted replies in turn) and
an HTTP JSON API (fixed answers by path). With a real model or API, the examples' READMEs give the command
without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["json_api", "model", "run_and_print"]

Reply = Callable[[dict[str, Any]], Any]


@contextmanager
def _serving(handle: Callable[[str, str, bytes], tuple[int, Any]]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            status, answer = handle(self.command, self.path, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:  # quiet: the example prints only its answer
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def model(*replies: str | Reply) -> Iterator[str]:
    """An OpenAI-compatible ``/v1/chat/completions`` answering ``replies`` in order (a reply may be a function
    of the request, so what the model was asked shows in the answer); yields its base URL."""
    left = list(replies)

    def handle(method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method != "POST" or not path.endswith("/chat/completions") or not left:
            return 404, {"error": {"message": f"the stand-in model has no answer for {method} {path}"}}
        asked = json.loads(body)
        reply = left.pop(0)
        message = {"role": "assistant", "content": reply(asked) if callable(reply) else reply}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return 200, {
            "id": "standin",
            "object": "chat.completion",
            "model": asked.get("model"),
            "choices": [choice],
            "usage": usage,
        }

    with _serving(handle) as url:
        yield f"{url}/v1"


@contextmanager
def json_api(routes: dict[str, Callable[[dict[str, str]], Any]]) -> Iterator[str]:
    """An HTTP API answering each path with the JSON its function makes of the query (None: 400); yields its
    base URL."""
    from urllib.parse import parse_qsl

    def handle(method: str, path: str, body: bytes) -> tuple[int, Any]:
        route, _, query = path.partition("?")
        if route not in routes:
            return 404, {"error": f"no {route}"}
        answer = routes[route](dict(parse_qsl(query)))
        return (400, {"error": f"bad query {query}"}) if answer is None else (200, answer)

    with _serving(handle) as url:
        yield url


def run_and_print(args: list[str], env: dict[str, str]) -> int:
    """Run an mcpipe command (the ``mcpipe`` beside this Python) with ``env`` added; its output is printed."""
    exe = os.path.join(os.path.dirname(sys.executable), "mcpipe")
    done = subprocess.run([exe if os.path.exists(exe) else "mcpipe", *args], env={**os.environ, **env}, check=False)
    return done.returncode
