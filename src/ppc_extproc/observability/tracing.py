"""OpenTelemetry spans of the request path (llm-d's ``--tracing``), exported by OTLP.

The exporter and resource come from the standard ``OTEL_*`` environment, as llm-d's EPP reads it
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, …; the OTLP/gRPC
exporter, the OpenTelemetry SDK's default, unless ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``http/protobuf``). The packages are the optional ``tracing``
extra: without them ``--tracing`` logs one warning and the service runs untraced.

Nothing is done per request while tracing is off: the stream only tests ``tracer is None``. With it
on, one request is one span, ``ppc_extproc.route``, a child of the incoming ``traceparent`` when the
request carries one, with a child span per stage (``parse``, ``produce`` — with ``tokenize``, ``keys``, ``lookup`` under it —,
``filter``, ``score``, ``pick``, ``pre_request``) built after the decision from the stage durations already measured,
laid end to end from the request's start (stages that did not run are absent). The routed request
gets a ``traceparent`` header naming the route span, so the engine's spans join the trace.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import structlog

__all__ = ["RequestTracer", "start_tracing"]

log = structlog.get_logger(__name__)

#: The stage spans, in the order they run; the producers' parts are children of ``produce``.
STAGES = ("parse", "produce", "filter", "score", "pick", "pre_request")
PRODUCE_PARTS = ("tokenize", "keys", "lookup")


class RequestTracer:
    """Records one request's spans after its routing decision."""

    def __init__(self, tracer: Any, propagator: Any, provider: Any) -> None:
        self._tracer, self._propagator, self._provider = tracer, propagator, provider
        from opentelemetry import trace

        self._trace = trace

    def record(self, headers: Mapping[str, str], started_perf: float, stages_perf: float, stages: Mapping[str, float],
               attributes: Mapping[str, Any]) -> str | None:
        """Emit the route span (from ``started_perf``, the request's headers) and its stage spans
        (from ``stages_perf``, the end of the body); return the ``traceparent`` for the engine."""
        now_ns, now_perf = time.time_ns(), time.perf_counter()
        start_ns = now_ns - int((now_perf - started_perf) * 1e9)
        parent = self._propagator.extract(carrier=dict(headers))
        span = self._tracer.start_span("ppc_extproc.route", context=parent, start_time=start_ns,
                                       kind=self._trace.SpanKind.SERVER, attributes=dict(attributes))
        child_context = self._trace.set_span_in_context(span)
        cursor = now_ns - int((now_perf - stages_perf) * 1e9)
        for name in STAGES:
            seconds = stages.get(name)
            if seconds is None:
                continue
            end = cursor + int(seconds * 1e9)
            stage = self._tracer.start_span(name, context=child_context, start_time=cursor)
            if name == "produce":
                inner, part_context = cursor, self._trace.set_span_in_context(stage)
                for part in PRODUCE_PARTS:
                    if (part_seconds := stages.get(part)) is not None:
                        part_end = inner + int(part_seconds * 1e9)
                        self._tracer.start_span(part, context=part_context, start_time=inner).end(end_time=part_end)
                        inner = part_end
            stage.end(end_time=end)
            cursor = end
        span.end(end_time=max(now_ns, cursor))
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=child_context)
        return carrier.get("traceparent")

    def shutdown(self) -> None:
        """Flush the exporter (bounded by the SDK's own timeouts)."""
        self._provider.shutdown()


def _exporter() -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter()


def otlp_proto_shadowed() -> bool:
    """True when ``opentelemetry.proto`` is the old copy ``xds-protos`` also ships (both wheels
    write ``opentelemetry/proto/``; whichever pip installs last wins), which the OTLP exporters
    cannot import (no ``InstrumentationScope``)."""
    try:
        from opentelemetry.proto.common.v1 import common_pb2
    except ImportError:
        return False
    return not hasattr(common_pb2, "InstrumentationScope")


def _missing(exc: ImportError) -> str:
    if otlp_proto_shadowed():
        return ("opentelemetry.proto is xds-protos' older copy: "
                "pip install --force-reinstall --no-deps opentelemetry-proto")
    return f"{exc.name or exc}: install ppc-extproc[tracing]"


def start_tracing(service_name: str = "ppc-extproc") -> RequestTracer | None:
    """A tracer exporting by OTLP from the environment, or None (one warning) without the packages."""
    try:
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        exporter = _exporter()
    except ImportError as exc:
        log.warning("tracing_unavailable", reason=_missing(exc), flag="--tracing")
        return None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}).merge(
        OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER* read by the SDK
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing_started", exporter=type(exporter).__module__)
    return RequestTracer(provider.get_tracer("ppc_extproc"), TraceContextTextMapPropagator(), provider)
