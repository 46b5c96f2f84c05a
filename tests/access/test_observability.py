"""Metrics served at the configured path, and spans exported over OTLP to real collectors on 127.0.0.1 (a
gRPC one, as mcpg's OTLP exporter speaks, and an HTTP one), with the service name and resource attributes."""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import httpx2
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from kit.servers import http_server, make_config, running

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def test_metrics_are_served_at_the_configured_path_only():
    config = make_config(telemetry={"metrics_path": "/ops/metrics"})
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        base = url.rsplit("/", 1)[0]
        moved = await http.get(base + "/ops/metrics")
        old = await http.get(base + "/metrics")
    assert moved.status_code == 200 and "mcpipe_calls" in moved.text and old.status_code == 404


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _spans(requests: list[Any]) -> list[tuple[dict[str, str], str]]:
    out = []
    for request in requests:
        for rs in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                out.extend((attrs, span.name) for span in ss.spans)
    return out


async def test_spans_reach_an_otlp_grpc_collector_with_the_service_name_and_attributes():
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tel = {
            "traces": "otlp",
            "otlp_endpoint": f"http://127.0.0.1:{port}",
            "otlp_protocol": "grpc",
            "service_name": "mcpg-gateway",
            "resource_attributes": {"deployment.environment": "test"},
        }
        async with running(make_config(telemetry=tel)) as app, http_server(app) as url:
            from mcp import Client

            async with Client(url) as client:
                await client.call_tool("echo", {"x": 1})
        # Leaving the app shuts the provider down, which flushes the batched spans.
    finally:
        server.stop(None)
    spans = _spans(collector.requests)
    assert spans and all(
        a["service.name"] == "mcpg-gateway" and a["deployment.environment"] == "test" for a, _ in spans
    )
    assert any("echo" in name for _, name in spans)


async def test_spans_reach_an_otlp_http_collector_at_v1_traces():
    received: list[Any] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path == "/v1/traces":
                received.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    # Its own thread: the exporter flushes synchronously when the app stops, from the Trio thread.
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        tel = {"traces": "otlp", "otlp_endpoint": f"http://127.0.0.1:{server.server_port}", "service_name": "gw"}
        async with running(make_config(telemetry=tel)) as app, http_server(app) as url:
            from mcp import Client

            async with Client(url) as client:
                await client.call_tool("echo", {})
    finally:
        server.shutdown()
        thread.join()
    spans = _spans(received)
    assert spans and {a["service.name"] for a, _ in spans} == {"gw"}


def test_the_log_is_also_appended_to_the_configured_file_as_json_lines(tmp_path):
    import json
    import logging

    from mcpipe.server.cli import log_to_file

    config = make_config(logs={"file": str(tmp_path / "gateway.log"), "format": "json"})
    handler = log_to_file(config)
    try:
        logging.getLogger("mcpipe.test").warning("served %d calls", 3)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    (line,) = (tmp_path / "gateway.log").read_text().splitlines()
    record = json.loads(line)
    assert (record["level"], record["logger"], record["message"]) == ("warning", "mcpipe.test", "served 3 calls")
