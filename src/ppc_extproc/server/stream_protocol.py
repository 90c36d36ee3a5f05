"""The ext_proc protocol facts one stream reads: Envoy's body modes, the stream's options, and
header and metadata values as plain Python (``envoy/extensions/filters/http/ext_proc/v3/
processing_mode.proto``, ``envoy/service/ext_proc/v3/external_processor.proto``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from envoy.config.core.v3.base_pb2 import HeaderValue, Metadata

from ppc_extproc.errors import ProtocolConfigError
from ppc_extproc.flowcontrol.admission import Admission
from ppc_extproc.observability.tracing import RequestTracer
from ppc_extproc.scheduling.objectives import ModelRewrites, Objectives
from ppc_extproc.scheduling.saturation import SaturationDetector

__all__ = [
    "MAX_REQUEST_ID_CHARS",
    "SERVED_KEY",
    "STREAMING_THRESHOLD_BYTES",
    "SUBSET_KEY",
    "SUBSET_NAMESPACE",
    "BodyMode",
    "StreamOptions",
    "body_mode",
    "header_value",
    "struct_value",
]

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
#: Bodies that arrive in several messages are parsed and hashed while they stream in once they
#: reach this size; smaller ones are parsed whole at the end (cheaper for them).
STREAMING_THRESHOLD_BYTES = 64 * 1024


class BodyMode(enum.IntEnum):
    """Envoy's ``ProcessingMode.BodySendMode`` values."""

    NONE = 0
    STREAMED = 1
    BUFFERED = 2
    BUFFERED_PARTIAL = 3
    FULL_DUPLEX_STREAMED = 4


@dataclass(frozen=True, slots=True)
class StreamOptions:
    #: Request bodies above this size get 413.
    max_body_bytes: int = 16 * 1024 * 1024
    #: Mode assumed when Envoy does not send ``protocol_config``.
    default_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    #: Error bodies as OpenAI's JSON envelope instead of llm-d's plain text.
    json_errors: bool = False
    #: Share of responses whose body is asked for (``mode_override``) when Envoy is configured not
    #: to send response bodies; their usage feeds the usage and cached-tokens metrics.
    usage_sample_rate: float = 0.01
    #: Honour Envoy's ``envoy.lb.subset_hint`` (llm-d's ``--disable-endpoint-subset-filter`` clears it).
    honour_subset: bool = True
    #: InferenceModelRewrite rules (a rewrite header, when present, wins over them).
    rewrites: ModelRewrites | None = None
    #: InferenceObjective priorities, and the saturation that sheds negative ones (llm-d's legacy
    #: admission, ``pkg/epp/requestcontrol/admission.go``).
    objectives: Objectives | None = None
    saturation: SaturationDetector | None = None
    #: Admitters and flow control (replaces ``saturation`` when set): may hold the request.
    admission: Admission | None = None
    #: OpenTelemetry spans per request (``--tracing``); None: no per-request work.
    tracer: RequestTracer | None = None



#: Longest request id (and model name) kept in logs and recent decisions; longer ones are cut.
MAX_REQUEST_ID_CHARS = 256


def body_mode(field: str, value: int) -> BodyMode:
    """Envoy's body mode, or a clean error naming the field for a value this service does not know."""
    try:
        return BodyMode(value)
    except ValueError:
        raise ProtocolConfigError(
            f"protocol_config.{field} {value} is not a body mode this endpoint picker supports "
            f"({', '.join(f'{m.value} {m.name}' for m in BodyMode)})"
        ) from None


def header_value(header: HeaderValue) -> str:
    return str(header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value)


def struct_value(struct: Metadata | None, namespace: str, key: str) -> str | list[str] | None:
    """A value from ``metadata_context.filter_metadata[namespace][key]`` as plain Python."""
    if struct is None or namespace not in struct.filter_metadata:
        return None
    fields = struct.filter_metadata[namespace].fields
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "list_value":
        return [str(v.string_value) for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    return None
