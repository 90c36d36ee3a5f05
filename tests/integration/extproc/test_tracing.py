"""``--tracing``: the in-process service with the OTLP/gRPC exporter configured from ``OTEL_*``
sends its spans to a real gRPC trace collector (opentelemetry-proto's TraceService on a loopback
port). A request carrying a ``traceparent`` yields a ``ppc_extproc.route`` span in that trace, a
child of the caller's span, with the stage spans under it; the routed request's header mutation
carries a ``traceparent`` of the same trace naming the route span. Without the packages, one
warning and no tracer (checked by hiding the module)."""

from __future__ import annotations

import queue
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from harness import Client, body, headers, metadata_destination, running_service, set_headers

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from ppc_extproc.observability.tracing import otlp_proto_shadowed, start_tracing

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.spans: queue.Queue[Any] = queue.Queue()

    def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.put(span)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.mark.skipif(otlp_proto_shadowed(), reason="xds-protos' copy of opentelemetry.proto was installed last "
                    "(pip install --force-reinstall --no-deps opentelemetry-proto)")
def test_spans_reach_the_collector_and_traceparent_reaches_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "epp-under-test")
        tracer = start_tracing()
        assert tracer is not None
        with running_service(tmp_path, tracer=tracer) as service:
            client = Client(service.grpc_port)
            try:
                payload = orjson.dumps({"model": "m", "prompt": list(range(64)), "max_tokens": 4})
                extra = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
                reply = client.run([headers(extra=extra), body(payload)])[0]
            finally:
                client.close()
            assert metadata_destination(reply)
            version, trace_id, route_span, flags = set_headers(reply)["traceparent"].split("-")
            assert (version, trace_id, flags) == ("00", TRACE_ID, "01") and route_span != CALLER_SPAN
        # the service stopped: its provider flushed the batch
        spans: dict[str, Any] = {}
        deadline = time.monotonic() + 20
        while "pick" not in spans or "ppc_extproc.route" not in spans:
            assert time.monotonic() < deadline, f"spans received: {sorted(spans)}"
            try:
                span = collector.spans.get(timeout=0.5)
            except queue.Empty:
                continue
            spans[span.name] = span
        route = spans["ppc_extproc.route"]
        assert route.trace_id.hex() == TRACE_ID and route.parent_span_id.hex() == CALLER_SPAN
        assert route.span_id.hex() == route_span
        for stage in ("parse", "produce", "score", "pick"):
            assert spans[stage].parent_span_id == route.span_id, stage
            assert route.start_time_unix_nano <= spans[stage].start_time_unix_nano <= route.end_time_unix_nano
    finally:
        server.stop(0)


def test_without_the_packages_one_warning_and_no_tracer(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # import fails as if not installed
    assert start_tracing() is None
    out = capsys.readouterr()
    assert (out.out + out.err).count("tracing_unavailable") == 1
