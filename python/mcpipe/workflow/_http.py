"""``POST /workflow`` on the HTTP server: the seed's endpoint, answered through the gateway (the caller's
bearer token, the tool grants and the audit apply as to an MCP call of the ``workflow`` tool).

200 with the ``WorkflowResponse`` (a failed stage is ``status: "error"`` in a 200, as in the seed); 422 with
``detail`` for invalid arguments; 400 for a body that is not JSON; 403 when the caller may not call
``workflow``; 404 when the config has no workflow; 405 for another method; 413 for a body over the limit.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from typing import Any

import orjson

from mcpipe.errors import MCPipeError
from mcpipe.tools import ToolContext

__all__ = ["PATH", "workflow_endpoint"]

PATH = "/workflow"

Send = Any
Receive = Any


async def _respond(send: Send, status: int, payload: object, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            return None
        chunks.append(part)
        if not message.get("more_body"):
            return b"".join(chunks)


async def workflow_endpoint(
    gateway: Any, scope: MutableMapping[str, Any], receive: Receive, send: Send, *, principal: str | None, max_body: int
) -> None:
    """Serve one ``/workflow`` request."""
    if scope["method"] != "POST":
        await _respond(send, 405, {"error": "method not allowed: use POST"}, [(b"allow", b"POST")])
        return
    if gateway.get("workflow") is None:
        await _respond(send, 404, {"error": "no workflow is configured"})
        return
    body = await _read(receive, max_body)
    if body is None:
        await _respond(send, 413, {"error": f"the body is larger than {max_body} bytes"})
        return
    try:
        args = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        await _respond(send, 400, {"error": f"the body is not JSON: {e}"})
        return
    if not isinstance(args, dict):
        await _respond(send, 422, {"detail": ["the body must be a JSON object"]})
        return
    ctx = ToolContext(request_id=uuid.uuid4().hex, client={"name": "http", "version": None}, principal=principal)
    try:
        result = await gateway.call("workflow", args, ctx)
    except MCPipeError as e:  # the gateway's refusals (CallError): not allowed, or unknown
        status = 403 if getattr(e, "code", None) == "FORBIDDEN" else 404
        await _respond(send, status, {"error": str(e)})
        return
    if result.structured is None:
        text = result.joined_text()
        detail = text.split(": ", 1)[1] if text.startswith("invalid arguments") else text
        await _respond(send, 422, {"detail": detail.split("; ")})
        return
    await _respond(send, 200, result.structured)
