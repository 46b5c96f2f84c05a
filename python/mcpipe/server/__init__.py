"""Serving mcpipe over MCP: the SDK server, HTTP (hypercorn's trio worker) and stdio, and ``attach``.

Wiring
------

`open_app` builds the app from factories, without patching objects afterwards: `tool_sources(config)` (built-ins,
`python_tools`, extra sources, then the declared pipelines checked against them), `pipeline_store(config)`
(`open_store(url)`: in memory by default, Redis for `redis://` URLs; a store plugs in by registering its URL
scheme), `run_queue(config)`
(`open_queue`: the SQLite file of `[runs] path`, an in-memory SQLite database of the process without it, or Redis
Streams), the `Gateway`, and `ToolHandlers(gateway, pipe_runner, interactions=Interactions.from_config(...),
downstreams=..., runs=..., tasks=...)` (which builds the `Passthrough` of the downstream servers' resources,
prompts, completion and logging). Background work (the store's sweeper, the run queue, the worker, downstream
servers) starts in the app's nursery with `nursery.start`.

The server and the one call path
--------------------------------

The server is the SDK's low-level `Server` (both protocol eras), served by hypercorn's trio worker for streamable
HTTP (its accept loop mcpipe's own, `server/_listen.py`, which keeps the connections below the descriptor limit
and answers the overflow at once) and by the SDK's stdio transport (`python/mcpipe/server/`). Every tool call,
whether a client made it directly or a pipeline step made it, goes through one object, the `Gateway`
(`python/mcpipe/gateway.py`): it answers `in`, `get`, `allows` and `call`, and on each call checks the
principal's permission, runs the `[access]` gates (Cedar policies, rate limits, address allowlists; a refusal is
audited with the gate's name and answered `FORBIDDEN` or `LIMIT_EXCEEDED`), writes one audit record (principal,
tool, ok, error code, duration, cost, the pipeline and step it belonged to) and accounts the cost. The scheduler
is handed the gateway as its registry, so `mcp_pipe` steps are authorized, gated, audited and billed exactly like
direct calls (contract section 8); an `mcp_pipe` call itself passes the gates too (`Gateway.admit`). The audit
log is mcpipe's records (`AuditLog`) or mcpg's hash-chained events (`McpgAuditLog`, `[audit] format = "mcpg"`,
which also writes `mcpg.tool.call.allowed` before a call runs). The HTTP front resolves the caller's identity
before anything else (`access.Authenticator`: a presented credential that does not verify is `401`, never a
lesser identity) and leaves it in the ASGI scope, where the SDK path and the lean path both read it into the
call's `Request`. Outbound credentials reach their services two ways: an `http` step puts its credential's token
in a header before it sends; a downstream server with a shared credential gets it on every request of its session
(an `httpx2.Auth`), and one with a per-caller credential gets each caller's token on that caller's tool calls
only, as a per-message header (the SDK session's stamp is wrapped to add the headers a context variable holds for
the call being sent).

Tools come from several sources behind the gateway: Python `ToolRegistry`s (`python_tools`), declared pipelines
(`pipelines:`, `python/mcpipe/declared/`), downstream MCP servers (`mcpServers`), OpenAPI documents
(`[openapi.NAME]`) and the formats' own (playbooks, piraeus's tools and flows, discord's `mcp_pipeline`). Each
downstream server is owned by one long-lived Trio task (`python/mcpipe/downstream/_server.py`) started with
`nursery.start`: it connects, lists tools, reconnects with backoff, and answers "unavailable" at once while the
server is down. A forwarded call runs in the caller's task, so cancelling the caller cancels the downstream request.

Resumable streams
-----------------

(`server/_events.py`, `downstream/_polling.py`). 2025-11-25 SSE streams open with a priming event and are kept in
a bounded in-memory event store, one view per session (the SDK's stream ids are request ids, which sessions
share), so a client reconnecting with `Last-Event-ID` gets what it missed. A downstream that closes a call's
stream to make its client poll is noticed on the downstream HTTP client's hooks (the call's `_meta` token, its
SSE event ids, the reconnecting `GET`), and mcpipe closes its caller's stream of that request too. A stdio
downstream cannot close a stream: with its `sse_poll_ms`, `StreamWatch.polled` runs the call in the caller's task
beside a timer task that closes the caller's stream at 1x, 2x, 4x, ... the interval, and ends with the call.

Asyncio hosts (attach)
----------------------

The runtime is written for Trio, and Trio stays the native loop: `mcpipe serve` and Trio hosts run pipelines with
no indirection. A host on asyncio (the SDK's default: `app.run()` over stdio, an in-memory `Client(app)` under
asyncio) gets `mcp_pipe` through Trio's guest mode (`server/_guest.py`): one Trio guest run per asyncio loop,
started by the first `mcp_pipe` call and stopped when the loop shuts down (the run keeps an async generator,
which `asyncio.run`/`anyio.run` finalize), runs each pipeline in its own task and cancel scope; the host's tools,
progress and log are called back as asyncio tasks in the host's context, and a Trio cancellation (a step
deadline, a failed sibling) cancels that task and waits for it. When the host cancels the call, the Trio side is
cancelled and waited for before the cancellation goes on. We chose this over porting the runtime to anyio because
it leaves the Trio path untouched (the scheduler benchmarks are unchanged, see performance.md) and keeps one set
of semantics (Trio's cancel scopes, `CapacityLimiter`, `fail_after`) for both hosts; anyio would put a wrapper
under every nursery, scope and limiter of the hot path, and every module (declared kinds, interaction, downstream
actors) would have had to move with it. The cost is on asyncio only: a host call crosses the loop boundary (a
Trio checkpoint and an asyncio task, about 0.1-0.3 ms), and the guest's I/O waits use Trio's worker thread. Trio
allows one run per thread, hence one guest run per loop rather than one per call (starting a run costs about 3
ms).

Shutting down
-------------

SIGINT/SIGTERM cancels every tool call in flight through one cancel scope per call (`ToolHandlers.shut_down`):
each answers `CANCELLED` at once, inside hypercorn's graceful period (HTTP) or before the stdio streams close,
instead of losing its connection.

The lean path
-------------

The SDK's request pipeline costs about as much CPU as the transport itself. For the commonest request, a
stateless (2026-07-28) `tools/call` with no progress token, `server/_fast.py` runs the SDK's own checks, calls
the handler directly and encodes the answer once with orjson; everything else goes through the SDK unchanged, and
a test checks the two paths answer byte for byte alike. A call that can yield
runs beside a task watching for the client leaving (which cancels it) and keeping a long answer alive with pings;
a call that cannot runs inline, without it: a synchronous Python tool, and a declared pipeline whose steps are
only plain tool calls of such tools (`mcpipe.runtime.inline_tool_calls`).

Scale-out
---------

(docs/deployment.md). `mcpipe serve --workers N` is a supervisor (`server/_workers.py`) that listens and runs N
worker processes on the inherited socket; workers serve 2025-11-25 statelessly, and share one run queue (without
Redis or `[runs] path`, a SQLite file the supervisor makes in a private temporary directory and passes as
`--runs-path`). A socket systemd passes (socket activation, `_workers.activated_socket`) is served in place of
binding, by one process or by the workers. What deploys mcpipe lives in `deploy/` (`container/`, `compose/`,
`systemd/`, `kubernetes/`), checked by `scripts/check_deploy.py` in `make lint`; runnable examples per format in
`examples/`, run by `tests/test_examples.py`. The pipeline store is chosen by URL
(`mcpipe.store.open_pipeline_store`: `memory://`, or Redis through coredis on Trio). The lean path also serves
2025-11-25 `tools/call` on a session the SDK has already served once (the SDK's checks, then the handler, then
the SDK's own result surface for the answer), leaving calls that could ask the client to the SDK. Telemetry
(`mcpipe/telemetry/__init__.py`) is one process-wide object, or None: the call path (`ToolHandlers.call`), the
scheduler (steps by kind and outcome), the gateway (a span per step's tool call) and downstream calls (a client
span, `traceparent` carried on in `_meta`) each test it once. With an OpenTelemetry SDK tracer whose span
processors only look at ended spans (the SDK's batch and simple processors: the exporters' path),
`mcpipe.telemetry._tracing.Recorder` records the spans itself: the SDK's ids, sampling decision, trace flags,
resource, scope and limits, and an SDK `ReadableSpan` handed to the same processors' `on_end`, for a quarter of
the SDK span's cost (a pipeline makes a span per step). A function tool's step span is only noted when the step
ends (nothing needs it while it runs: a tuple of step, tool, times and outcome under its parent span), and
recorded with the others when the parent ends, in one loop; a step that may make traced calls of its own (a
downstream tool) gets its span at the start, made the current one. Any other processor (one that watches span
starts), a disabled tracer, or a tracer that is not the SDK's: the SDK or that tracer makes the spans, as before.

"""

from typing import TYPE_CHECKING

from mcpipe._lazy import lazy_names

if TYPE_CHECKING:
    from mcpipe.server._app import App, open_app
    from mcpipe.server._attach import attach
    from mcpipe.server._core import PipeRunner, ToolHandlers, build_server
    from mcpipe.server._http import serve_http
    from mcpipe.server._stdio import serve_stdio

# Each name on first use: the server's command line (`mcpipe.server.cli`, which `mcpipe check --config` runs) is
# inside this package, and what it imports every command through it pays for; attaching to a host's server
# imports the SDK's high-level MCPServer, stdio its stdio transport, HTTP hypercorn.
__getattr__ = lazy_names(
    __name__,
    {
        **dict.fromkeys(["App", "open_app"], "._app"),
        "attach": "._attach",
        **dict.fromkeys(["PipeRunner", "ToolHandlers", "build_server"], "._core"),
        "serve_http": "._http",
        "serve_stdio": "._stdio",
    },
)

__all__ = ["App", "PipeRunner", "ToolHandlers", "attach", "build_server", "open_app", "serve_http", "serve_stdio"]
