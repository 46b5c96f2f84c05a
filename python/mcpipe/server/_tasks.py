"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) on the run queue.

A client that declares the extension (in ``initialize``, or per request in
``_meta["io.modelcontextprotocol/clientCapabilities"]``) and calls a task-supporting tool (``mcp_pipe``, a
declared pipeline) gets a ``CreateTaskResult`` at once: the call was queued as a background run
(:mod:`mcpipe.runs`), and the task id is the run id. ``tasks/get`` answers the task (the result inlined
once it is done), ``tasks/cancel`` cancels the run wherever it runs. A client that did not declare the
extension gets a normal synchronous call, except for a tool whose task support is ``required``: that is
JSON-RPC -32021 naming the extension.

Statuses: a queued or running run is ``working``; a finished one is ``completed`` with the tool's result
(a tool error too: ``result.isError``); a run whose tool raised (a protocol-level failure) is ``failed``
with a JSON-RPC ``error``; a cancelled one is ``cancelled``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from functools import wraps
from typing import TYPE_CHECKING, Any, Literal

from mcpipe import _mcp
from mcpipe._mcp import INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcpipe._util import PIPE_TOOL
from mcpipe.runs import Runs
from mcpipe.server._context import RequestContext
from mcpipe.store import RunInfo, StoreUnavailable
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.lowlevel.server import Server
    from mcp.shared.exceptions import MCPError

    from mcpipe.server._taskparams import TaskParams, UpdateParams

__all__ = ["TASKS", "TaskSupport", "Tasks", "declares_tasks", "store_unavailable"]

_log = logging.getLogger("mcpipe.server")

TASKS = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 500

TaskSupport = Literal["optional", "required"]


def declares_tasks(capabilities: types.ClientCapabilities | dict[str, object] | None) -> bool:
    """Whether client capabilities (the SDK's model, or wire JSON) declare the tasks extension."""
    if capabilities is None:
        return False
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else capabilities.extensions
    return isinstance(extensions, dict) and TASKS in extensions


def _missing() -> MCPError:
    return _mcp.MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"the client did not declare the required extension {TASKS!r}",
        data={"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


def store_unavailable(exc: StoreUnavailable) -> MCPError:
    """The answer of a call the run queue (or the pipeline store) cannot serve now: a JSON-RPC internal error
    naming the store (``data.reason = "store_unavailable"``), logged in one line; the client may send the same
    request again once the store is back (``docs/deployment.md``)."""
    _log.warning("%s", exc)
    return _mcp.MCPError(code=INTERNAL_ERROR, message=f"{exc}; try again", data={"reason": "store_unavailable"})


def _serving(
    method: Callable[[Tasks, RequestContext, Any], Awaitable[dict[str, Any]]],
) -> Callable[[Tasks, RequestContext, Any], Awaitable[dict[str, Any]]]:
    """A ``tasks/*`` handler whose queue may be unreachable: that is :func:`store_unavailable`."""

    @wraps(method)
    async def serve(self: Tasks, ctx: RequestContext, params: Any) -> dict[str, Any]:
        try:
            return await method(self, ctx, params)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None

    return serve


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Tasks:
    """Tasks on the run queue: creating them, and the ``tasks/*`` methods.

    Args:
        runs: the run queue's front.
        gateway: the tools (their task support: ``mcp_pipe`` and declared pipelines support tasks).
        pipe: whether ``mcp_pipe`` is served (and so supports tasks).
        ttl_s: how long a finished task stays readable (the queue's retention).
        default_principal: the principal of calls that carry none.
    """

    def __init__(
        self,
        runs: Runs,
        gateway: Any,
        *,
        pipe: bool = True,
        ttl_s: float = 7 * 86400.0,
        default_principal: str | None = None,
    ) -> None:
        self.runs = runs
        self.default_principal = default_principal
        self.gateway = gateway
        self.pipe = pipe
        self.ttl_ms = max(1, int(ttl_s * 1000))

    def support(self, name: str) -> TaskSupport | None:
        """How tool ``name`` supports tasks (None: it runs synchronously only)."""
        if name == PIPE_TOOL:
            return "optional" if self.pipe else None
        tool = self.gateway.get(name)
        support = getattr(tool, "task_support", None)
        return support if support in ("optional", "required") else None

    def install(self, server: Server[Any]) -> None:
        """Advertise the extension and serve ``tasks/get``, ``tasks/cancel`` and ``tasks/update``."""
        from mcpipe.server._taskparams import TaskParams, UpdateParams  # pydantic models: the SDK is loaded here

        server.extensions[TASKS] = {}
        server.add_request_handler("tasks/get", TaskParams, self.get)  # type: ignore[arg-type]
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)  # type: ignore[arg-type]
        server.add_request_handler("tasks/update", UpdateParams, self.update)  # type: ignore[arg-type]

    def envelope(self, info: RunInfo) -> dict[str, Any]:
        """The task's status and metadata (``Task``)."""
        return {
            "taskId": info.id,
            "status": self.status(info),
            "createdAt": _iso(info.created),
            "lastUpdatedAt": _iso(info.updated),
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }

    @staticmethod
    def status(info: RunInfo) -> str:
        if info.status in ("queued", "running"):
            return "working"
        if info.status == "input_required":
            return "input_required"
        if info.status == "failed" and isinstance(info.answer, dict) and "error" in info.answer:
            return "failed"
        return "cancelled" if info.status == "cancelled" else "completed"

    async def create(
        self,
        name: str,
        args: Mapping[str, object],
        tctx: ToolContext,
        capabilities: types.ClientCapabilities | dict[str, object] | None,
        *,
        recorded: Mapping[str, object] | None = None,
        answers: Mapping[str, object] | None = None,
    ) -> dict[str, Any]:
        """Queue the call as a run (with the client's ``capabilities``, so that the run can ask it); answers
        the ``CreateTaskResult`` once it is durably queued.

        ``recorded`` and ``answers``: a call that asked its client before it became a task (its final
        round) hands the task the steps it finished, which the run recalls instead of running, and the
        answers it has not used yet."""
        if capabilities is not None and not isinstance(capabilities, dict):
            capabilities = capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
        meta: dict[str, Any] = {"capabilities": capabilities or {}}
        if recorded:
            meta["recorded"] = recorded
        if answers:
            meta["answers"] = answers
        info = await self.runs.submit(name, args, tctx, meta=meta)
        return {"resultType": "task", **self.envelope(info)}

    async def _task(self, ctx: RequestContext, task_id: str) -> RunInfo:
        if not declares_tasks(ctx.session.client_capabilities):
            raise _missing()
        from mcpipe.server._core import principal_of  # the principal as the call path reads it

        info = await self.runs.queue.get(task_id)
        if info is None or info.principal != principal_of(ctx, self.default_principal):
            raise _mcp.MCPError(code=INVALID_PARAMS, message=f"unknown task {task_id!r}")
        return info

    @_serving
    async def get(self, ctx: RequestContext, params: TaskParams) -> dict[str, Any]:
        info = await self._task(ctx, params.task_id)
        out = self.envelope(info)
        answer = info.answer
        if out["status"] == "input_required":
            out["inputRequests"] = {k: q["request"] for k, q in (info.meta.get("pending") or {}).items()}
        elif out["status"] == "failed":
            out["error"] = answer["error"]
        elif out["status"] == "completed" and isinstance(answer, dict):
            out["result"] = {k: v for k, v in answer.items() if k != "error"}
        return out

    @_serving
    async def cancel(self, ctx: RequestContext, params: TaskParams) -> dict[str, Any]:
        info = await self._task(ctx, params.task_id)
        if not info.done:
            await self.runs.queue.cancel(info.id, by=self.runs.server_id)
        return {}

    @_serving
    async def update(self, ctx: RequestContext, params: UpdateParams) -> dict[str, Any]:
        info = await self._task(ctx, params.task_id)
        if params.input_responses:
            responses = {k: _wire(v) for k, v in params.input_responses.items()}
            await self.runs.queue.answer(info.id, responses, by=self.runs.server_id)
        return {}


def _wire(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(by_alias=True, mode="json", exclude_none=True) if dump is not None else value


def required_error() -> MCPError:
    """-32021 for a tool whose task support is ``required``, called without the extension."""
    return _missing()
