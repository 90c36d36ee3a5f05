"""Did Envoy reach the engine? Read from what Envoy tells the ext_proc server on the response path.

The ext_proc filter's ``response_attributes`` (``response.code_details``, ``response.flags``) come
with the response-headers message — verified with Envoy 1.40 for BUFFERED request bodies with
response bodies off, FULL_DUPLEX_STREAMED and override-host: an engine's own 503 has
``via_upstream`` and flags 0; a refused connection ``upstream_reset_before_response_started{
remote_connection_failure|…}`` and flags 0x20 (UF); a connection closed before any response byte
``…{connection_termination}`` and 0x40 (UC); a route timeout ``response_timeout`` and 0x4 (UT).
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.struct_pb2 import Struct

__all__ = ["upstream_reached"]

UPSTREAM_TIME = "x-envoy-upstream-service-time"
#: ``ProcessingRequest.attributes`` key of the ext_proc filter's attributes.
ATTRIBUTES = "envoy.filters.http.ext_proc"
#: ``response.flags`` bits of a connection-level failure: UpstreamConnectionFailure (UF) and
#: UpstreamConnectionTermination (UC) (envoy: envoy/stream_info/stream_info.h, the legacy bits).
CONNECTION_FAILURE_FLAGS = 0x20 | 0x40


def upstream_reached(attributes: Mapping[str, Struct], headers: dict[str, str]) -> bool | None:
    """Did Envoy reach the engine? From the ``response.code_details`` / ``response.flags``
    attributes: ``via_upstream`` (the engine answered, a 503 of its own included) → True; a
    connection failure or a connection lost before the response → False; any other reply of
    Envoy's → None. Without the attributes (an Envoy config that does not ask for them) only
    ``x-envoy-upstream-service-time`` tells, which ``suppress_envoy_headers`` removes: None."""
    if ATTRIBUTES in attributes:
        fields = attributes[ATTRIBUTES].fields
        if "response.code_details" in fields and fields["response.code_details"].string_value == "via_upstream":
            return True
        if "response.flags" in fields and int(fields["response.flags"].number_value) & CONNECTION_FAILURE_FLAGS:
            return False
        if "response.code_details" in fields or "response.flags" in fields:
            return None
    return True if UPSTREAM_TIME in headers else None
