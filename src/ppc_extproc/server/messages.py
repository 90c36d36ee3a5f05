"""Builders for the ext_proc ``ProcessingResponse`` messages the endpoint picker sends.

The shapes are the endpoint picker protocol's (``kubernetes-sigs/gateway-api-inference-extension:
docs/proposals/004-endpoint-picker-protocol``) as llm-d's EPP builds them
(``llm-d/llm-d-router: pkg/epp/handlers/response.go``, ``request.go``): the destination header
and the same value in ``envoy.lb`` dynamic metadata, body chunks echoed in full-duplex mode,
immediate responses for errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    CommonResponse,
    HeaderMutation,
    ImmediateResponse,
    ProcessingResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus

from ppc_extproc.errors import RequestError

__all__ = [
    "DESTINATION_HEADER",
    "DROPPED_REASON_HEADER",
    "MAX_CHUNK_BYTES",
    "body_chunks",
    "buffered_route_response",
    "continue_body",
    "continue_headers",
    "continue_headers_with_response_body",
    "continue_trailers",
    "error_response",
    "replace_body",
    "response_headers_for_rewrite",
    "route_headers_response",
    "streamed_chunk",
]

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
METADATA_NAMESPACE = "envoy.lb"
#: Body chunks sent back to Envoy stay at or under this size (llm-d's bodyByteLimit, under gRPC's
#: default message size with headroom).
MAX_CHUNK_BYTES = 62_000


def _header(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=key, raw_value=value.encode()))


def _set_route(
    common: CommonResponse, destination: str, extra: Sequence[tuple[str, str]], remove: Sequence[str] = ()
) -> None:
    common.clear_route_cache = True
    if remove:  # applied before the sets: envoyproxy/envoy source/extensions/filters/http/ext_proc/mutation_utils.cc
        common.header_mutation.remove_headers.extend(remove)
    headers = common.header_mutation.set_headers
    header = headers.add().header
    header.key = DESTINATION_HEADER
    header.raw_value = destination.encode()
    for key, value in extra:
        header = headers.add().header
        header.key = key
        header.raw_value = value.encode()


def _set_metadata(reply: ProcessingResponse, destination: str) -> None:
    reply.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields[DESTINATION_HEADER].string_value = destination


# Messages are filled in place: nested constructors would copy every sub-message once more.


def route_headers_response(
    destination: str, extra_headers: Sequence[tuple[str, str]] = (), remove_headers: Sequence[str] = ()
) -> ProcessingResponse:
    """The request-headers reply that routes: destination header (+ extras such as
    ``Content-Length``), ``clear_route_cache``, and the same destination in ``envoy.lb``;
    ``remove_headers`` are dropped from the request first."""
    reply = ProcessingResponse()
    _set_route(reply.request_headers.response, destination, extra_headers, remove_headers)
    _set_metadata(reply, destination)
    return reply


def buffered_route_response(
    destination: str,
    extra_headers: Sequence[tuple[str, str]] = (),
    new_body: bytes | None = None,
    remove_headers: Sequence[str] = (),
) -> ProcessingResponse:
    """BUFFERED mode: the destination rides on the request-body reply (headers are still held by
    Envoy there); the body is replaced only when it was rewritten."""
    reply = ProcessingResponse()
    common = reply.request_body.response
    _set_route(common, destination, extra_headers, remove_headers)
    if new_body is not None:
        common.body_mutation.body = new_body
    _set_metadata(reply, destination)
    return reply


def streamed_chunk(body: bytes, end_of_stream: bool, *, response: bool = False) -> ProcessingResponse:
    """One ``streamed_response`` body chunk (FULL_DUPLEX_STREAMED), request or response side."""
    reply = ProcessingResponse()
    streamed = (reply.response_body if response else reply.request_body).response.body_mutation.streamed_response
    streamed.body = body
    streamed.end_of_stream = end_of_stream
    return reply


def body_chunks(body: bytes, end_of_stream: bool = True, *, response: bool = False) -> Iterator[ProcessingResponse]:
    """The body as ≤ 62,000-byte streamed chunks; the last carries ``end_of_stream``. An empty
    body is one empty chunk."""
    if not body:
        yield streamed_chunk(b"", end_of_stream, response=response)
        return
    for start in range(0, len(body), MAX_CHUNK_BYTES):
        chunk = body[start : start + MAX_CHUNK_BYTES]
        yield streamed_chunk(chunk, end_of_stream and start + MAX_CHUNK_BYTES >= len(body), response=response)


def continue_headers(*, response: bool = False) -> ProcessingResponse:
    reply = ProcessingResponse()
    (reply.response_headers if response else reply.request_headers).response.SetInParent()
    return reply


def continue_headers_with_response_body() -> ProcessingResponse:
    """The response-headers reply of a sampled request: continue, and switch this response's body
    mode to STREAMED (``ProcessingResponse.mode_override``; Envoy needs ``allow_mode_override``).
    The trailer mode stays SEND, so the stream still ends with the response."""
    reply = ProcessingResponse()
    reply.response_headers.response.SetInParent()
    reply.mode_override.response_body_mode = ProcessingMode.STREAMED
    reply.mode_override.response_trailer_mode = ProcessingMode.SEND
    return reply


def response_headers_for_rewrite(*, ask_for_body: bool, drop_length: bool) -> ProcessingResponse:
    """The response-headers reply of a response whose body will be rewritten: drop
    ``content-length`` when the rewrite changes the length (Envoy then frames the body itself),
    and, when Envoy is configured to send no response body, ask for it (STREAMED, as
    ``continue_headers_with_response_body``)."""
    reply = continue_headers_with_response_body() if ask_for_body else continue_headers(response=True)
    if drop_length:
        reply.response_headers.response.header_mutation.remove_headers.append("content-length")
    return reply


def replace_body(body: bytes, *, response: bool = False) -> ProcessingResponse:
    """A STREAMED/BUFFERED body reply that replaces this chunk with ``body``."""
    reply = ProcessingResponse()
    (reply.response_body if response else reply.request_body).response.body_mutation.body = body
    return reply


def continue_body(*, response: bool = False) -> ProcessingResponse:
    reply = ProcessingResponse()
    (reply.response_body if response else reply.request_body).response.SetInParent()
    return reply


def continue_trailers(*, response: bool = False) -> ProcessingResponse:
    reply = ProcessingResponse()
    (reply.response_trailers if response else reply.request_trailers).SetInParent()
    return reply


def error_response(error: RequestError, *, json_body: bool = False) -> ProcessingResponse:
    """An ``ImmediateResponse`` with the error's status, the drop-reason header when it has one,
    and a short body saying what was wrong (plain text as llm-d, or OpenAI's error envelope)."""
    headers = []
    if error.dropped_reason:
        headers.append(_header(DROPPED_REASON_HEADER, error.dropped_reason))
    if json_body:
        import orjson

        kind = {400: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}.get(
            error.status, "server_error"
        )
        body = orjson.dumps({"error": {"message": error.message, "type": kind, "code": error.status}})
        headers.append(_header("content-type", "application/json"))
    else:
        body = f"inference error: {error.error_class} - {error.message}".encode()
        headers.append(_header("content-type", "text/plain; charset=utf-8"))
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=error.status), headers=HeaderMutation(set_headers=headers), body=body,
            details=error.error_class,
        )
    )
