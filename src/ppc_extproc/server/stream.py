"""One ext_proc stream (one HTTP request) as a state machine: ProcessingRequest in, replies out.

FULL_DUPLEX_STREAMED: request headers are held until the body's end of stream; then one headers
reply routes (destination header, ``Content-Length``, ``clear_route_cache``, ``envoy.lb``
metadata) and the body goes back in ≤ 62,000-byte chunks. BUFFERED: headers are answered at once;
the body reply carries the destination. Header-only requests are routed at once. Errors are
immediate responses, after which the stream closes cleanly. The response path echoes the body
(FULL_DUPLEX_STREAMED) and records usage; when Envoy sends no response body (``envoy.yaml``) a
sample of responses asks for theirs with ``mode_override``, and the request ends when the stream
does (Envoy ends it with the response). This is the Gateway API Inference Extension's endpoint
picker protocol (``kubernetes-sigs/gateway-api-inference-extension:
docs/proposals/004-endpoint-picker-protocol``)
as llm-d's EPP implements it (``llm-d/llm-d-router: pkg/epp/handlers/``).

No I/O here: the gRPC servicer feeds messages and sends what comes back, so the whole protocol is
testable without a network. The request is built by ``assembly``; body modes and metadata values
are ``stream_protocol``'s; what a decision and a response record is ``stream_record``'s.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from envoy.config.core.v3.base_pb2 import Metadata
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
)
from google.protobuf.struct_pb2 import Struct

from ppc_extproc.errors import PayloadTooLargeError, RequestError
from ppc_extproc.flowcontrol.admission import fairness_id
from ppc_extproc.flowcontrol.controller import Ticket
from ppc_extproc.flowcontrol.types import DEFAULT_FLOW
from ppc_extproc.framework import PREFILL_FALLBACK_HEADER, ResponseInfo
from ppc_extproc.ids import EndpointId, destination_host_port, endpoint_id
from ppc_extproc.observability.llmd_metrics import RequestSeries, error_code_for_status
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.scheduling.objectives import OBJECTIVE_HEADERS
from ppc_extproc.scheduling.router import Decision, Router
from ppc_extproc.server import messages
from ppc_extproc.server.assembly import assemble_request, streaming_prompt
from ppc_extproc.server.flow import admit_and_route
from ppc_extproc.server.model_name import ModelNameRewriter
from ppc_extproc.server.stream_protocol import (
    MAX_REQUEST_ID_CHARS,
    SERVED_KEY,
    STREAMING_THRESHOLD_BYTES,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    BodyMode,
    StreamOptions,
    body_mode,
    header_value,
    struct_value,
)
from ppc_extproc.server.stream_record import record_completion, record_decision
from ppc_extproc.server.upstream import upstream_reached
from ppc_extproc.server.usage import UsageParser, UsageSampler
from ppc_extproc.tokens.streaming import StreamingPrompt

__all__ = ["BodyMode", "ExtProcStream", "StreamOptions"]

log = structlog.get_logger(__name__)


class _Phase(enum.Enum):
    START = "start"
    BODY = "body"
    ROUTED = "routed"
    DONE = "done"


class ExtProcStream:
    """Protocol state of one stream. ``handle`` returns the replies to send and whether to close."""

    def __init__(
        self,
        router: Router,
        options: StreamOptions,
        metrics: Metrics,
        recorder: Callable[[dict[str, Any]], None] | None = None,
        sampler: UsageSampler | None = None,
        *,
        defer_records: bool = False,
    ) -> None:
        self.router = router
        self.options = options
        self.metrics = metrics
        #: Receives a summary of every routing decision (the admin API's recent decisions).
        self.recorder = recorder
        #: Picks the responses whose bodies are asked for when Envoy sends none by default.
        self.sampler = sampler
        #: This response's body was asked for with ``mode_override``.
        self.usage_sampled = False
        self.phase = _Phase.START
        self.request_mode = options.default_body_mode
        self.response_mode: BodyMode | None = None
        self.headers: dict[str, str] = {}
        self.request_id = ""
        self.generated_request_id = False
        self.body = bytearray()
        #: The body when it came in one message (BUFFERED): used as is, never copied.
        self._whole: bytes | None = None
        self.metadata: Metadata | None = None
        self.prompt: StreamingPrompt | None = None
        self.decision: Decision | None = None
        self.stream_flag = False
        self.usage: UsageParser | None = None
        #: Set when the router rewrote the model: the response gets the client's name back.
        self.model_back: ModelNameRewriter | None = None
        self._tokens_released = False
        self.served: str | None = None
        self.status = 0
        #: None until response headers tell whether the engine itself answered.
        self.reached: bool | None = None
        self.prefill_fallback: str | None = None
        self._completed = False
        self._mode_known = False
        #: llm-d's request families: this request's series, its arrival and its response size.
        self._series: RequestSeries | None = None
        #: (model, target model, priority) once the body is parsed: the labels of an early rejection.
        self._labels: tuple[str, str, int, str] | None = None
        self._received = 0.0
        #: Set when flow control dispatched this request: told where it went and when it ended.
        self._ticket: Ticket | None = None
        self._response_bytes = 0
        self._sized = False
        #: Records are left to ``run_deferred`` (the servicer calls it once the reply is sent).
        self._defer_records = defer_records
        self._deferred: Callable[[], None] | None = None

    # --- entry points ----------------------------------------------------------------------------

    async def handle(self, message: ProcessingRequest) -> tuple[list[ProcessingResponse], bool]:
        """Replies for one inbound message, and True when the stream should now close."""
        if message.HasField("metadata_context"):
            self.metadata = message.metadata_context
        kind = message.WhichOneof("request")
        try:
            if not self._mode_known:
                self._learn_mode(message)
            if kind == "request_headers":
                return self._request_headers(message.request_headers)
            if kind == "request_body":
                return await self._request_body(message.request_body)
            if kind == "request_trailers":
                return await self._request_trailers()
            if kind == "response_headers":
                return self._response_headers(message.response_headers, message.attributes), False
            if kind == "response_body":
                return self._response_body(message.response_body), False
            if kind == "response_trailers":
                self._complete()
                return [messages.continue_trailers(response=True)], False
        except RequestError as error:
            return self._fail(error), True
        except Exception:
            log.exception("extproc_stream_failed", request_id=self.request_id)
            return self._fail(RequestError("internal error while routing the request")), True
        self.metrics.anomalies.labels("empty_message").inc()
        return [], False

    def run_deferred(self) -> None:
        """Record what the last replies decided (metrics, recent decisions): work that does not
        change a reply, done after it was sent when ``defer_records``."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            try:
                deferred()
            except Exception:
                log.exception("record_decision_failed", request_id=self.request_id)

    def close(self, *, cancelled: bool = False) -> None:
        """The stream ended (normally, by client disconnect or by an Envoy reset): release state."""
        self.run_deferred()
        if cancelled and not self._completed and self.decision is not None:
            self.metrics.anomalies.labels("cancelled").inc()
        self._complete(cancelled=cancelled)

    # --- request phase ---------------------------------------------------------------------------

    def _learn_mode(self, message: ProcessingRequest) -> None:
        self._mode_known = True
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self.request_mode = body_mode("request_body_mode", config.request_body_mode)
            self.response_mode = body_mode("response_body_mode", config.response_body_mode)

    @property
    def _full_duplex(self) -> bool:
        return self.request_mode == BodyMode.FULL_DUPLEX_STREAMED

    def _request_headers(self, headers: HttpHeaders) -> tuple[list[ProcessingResponse], bool]:
        if self.phase is not _Phase.START:
            self.metrics.anomalies.labels("out_of_order").inc()
            return [messages.continue_headers()], False
        self._received = time.perf_counter()
        self.headers = {h.key.lower(): header_value(h) for h in headers.headers.headers}
        # Kept in logs and in the recent decisions: a client's megabyte of header must not be.
        self.request_id = self.headers.get("x-request-id", "")[:MAX_REQUEST_ID_CHARS]
        if not self.request_id:
            self.request_id = str(uuid.uuid4())
            self.generated_request_id = True
        structlog.contextvars.bind_contextvars(request_id=self.request_id)
        if headers.end_of_stream:
            return self._route_header_only(), False
        self.phase = _Phase.BODY
        self.router.request_arrived()
        if self._full_duplex:
            return [], False  # held until the body's end of stream
        return [messages.continue_headers()], False

    @property
    def path(self) -> str:
        return self.headers.get(":path", "/v1/completions")

    def _route_header_only(self) -> list[ProcessingResponse]:
        self.phase = _Phase.ROUTED
        endpoint = self.router.route_header_only(self._subset())
        self.metrics.count_request("header_only", 200)
        destination = destination_host_port(endpoint.id)
        return [messages.route_headers_response(destination, self._id_header())]

    def _id_header(self) -> list[tuple[str, str]]:
        return [("x-request-id", self.request_id)] if self.generated_request_id else []

    def _traced(self, started: float, parse_done: float) -> list[tuple[str, str]]:
        decision, tracer = self.decision, self.options.tracer
        assert decision is not None and tracer is not None
        stages = {"parse": parse_done - started, **decision.ctx.timings, **decision.timings}
        attributes = {"gen_ai.request.model": decision.ctx.request.model, "ppc_extproc.request_id": self.request_id,
                      "ppc_extproc.destination": decision.destination}
        traceparent = tracer.record(self.headers, self._received, started, stages, attributes)
        return [("traceparent", traceparent)] if traceparent else []

    def _priority(self) -> int:
        objectives = self.options.objectives
        if objectives is None:
            return 0
        return objectives.priority(next((self.headers[h] for h in OBJECTIVE_HEADERS if self.headers.get(h)), None))

    def _subset(self) -> list[str] | None:
        if not self.options.honour_subset:
            return None
        value = struct_value(self.metadata, SUBSET_NAMESPACE, SUBSET_KEY)
        if value is None:
            return None
        return [value] if isinstance(value, str) else list(value)

    async def _request_body(self, body: HttpBody) -> tuple[list[ProcessingResponse], bool]:
        if self.phase is _Phase.START:  # body without headers: route it with default headers
            self.metrics.anomalies.labels("out_of_order").inc()
            self.phase = _Phase.BODY
            self.request_id = str(uuid.uuid4())
        if self.phase is not _Phase.BODY:
            self.metrics.anomalies.labels("out_of_order").inc()
            return [messages.continue_body()], False
        chunk = body.body
        if len(self.body) + len(chunk) > self.options.max_body_bytes:
            raise PayloadTooLargeError(
                f"request body exceeds the limit of {self.options.max_body_bytes} bytes"
            )
        if body.end_of_stream and not self.body:
            self._whole = chunk
        else:
            self.body += chunk
        if not body.end_of_stream and len(self.body) >= STREAMING_THRESHOLD_BYTES:
            if self.prompt is None:
                self.prompt = streaming_prompt(self.router.pipeline, self.path)
            if self.prompt is not None:
                self.prompt.feed(self.body)
        if body.end_of_stream:
            return await self._route_body(end_of_stream=True), False
        if self._full_duplex:
            return [], False
        return [messages.continue_body()], False  # BUFFERED_PARTIAL / STREAMED: one reply per chunk

    async def _request_trailers(self) -> tuple[list[ProcessingResponse], bool]:
        if self.phase is _Phase.BODY:  # trailers end the body (llm-d ignores them and times out)
            replies = await self._route_body(end_of_stream=False)
            return [*replies, messages.continue_trailers()], False
        return [messages.continue_trailers()], False

    async def _route_body(self, *, end_of_stream: bool) -> list[ProcessingResponse]:
        started = time.perf_counter()
        body = self._whole if self._whole is not None else bytes(self.body)
        assembled = assemble_request(self.router.pipeline, self.request_id, self.path, self.headers, body, self.prompt,
                                     self.options.rewrites)
        parse_done = time.perf_counter()
        request = assembled.request
        self.stream_flag = assembled.stream
        forwarded = request.body
        if assembled.rewritten and assembled.body_model:
            self.model_back = ModelNameRewriter(request.model, assembled.body_model)
        priority = self._priority()
        self._labels = (assembled.body_model, request.model, priority, fairness_id(self.headers))
        self.decision, self._ticket = await admit_and_route(
            self.router, self.options, request, self._subset(), self.headers, priority, len(body),
            assembled.body_model, started - self._received)  # fmt: skip
        self.phase = _Phase.ROUTED
        self._series = self.metrics.llmd.series(*self._labels)
        extra = [*self._id_header(), *self.decision.result.headers]
        if self.options.tracer is not None:
            extra.extend(self._traced(started, parse_done))
        if self._full_duplex:
            if forwarded:
                extra.append(("Content-Length", str(len(forwarded))))
            replies = [messages.route_headers_response(self.decision.destination, extra,
                                                       self.decision.result.remove_headers)]
            replies.extend(messages.body_chunks(forwarded, end_of_stream))
        else:
            new_body = forwarded if assembled.rewritten else None
            if new_body is not None:
                extra.append(("Content-Length", str(len(new_body))))
            replies = [messages.buffered_route_response(self.decision.destination, extra, new_body,
                                                        self.decision.result.remove_headers)]
        decision, series, decided = self.decision, self._series, time.perf_counter()

        def record() -> None:
            record_decision(self.metrics, self.recorder, self.request_id, decision, series, len(self.body),
                            started, parse_done, decided)

        if self._defer_records:
            self._deferred = record
        else:
            record()
        return replies

    def _fail(self, error: RequestError) -> list[ProcessingResponse]:
        self.phase = _Phase.DONE
        outcome = "error" if error.status >= 500 and error.dropped_reason is None else "rejected"
        self.metrics.count_request(outcome, error.status)
        series = self._series or self.metrics.llmd.series(*(self._labels or ("", "", 0, DEFAULT_FLOW)))
        self.metrics.llmd.failed(series, error_code_for_status(error.status), running=self._series is not None)
        self._series = None  # counted: the stream's end records nothing more
        level = log.warning if error.status >= 500 else log.info
        level("request_rejected", status=error.status, reason=error.message, path=self.path)
        return [messages.error_response(error, json_body=self.options.json_errors)]

    # --- response phase --------------------------------------------------------------------------

    def _response_headers(self, headers: HttpHeaders, attributes: Mapping[str, Struct]) -> list[ProcessingResponse]:
        replies = self._response_headers_reply(headers, attributes)
        if self.decision is not None and self.router.pipeline.response_headers:
            served = self.decision.primary.id
            if self.served:
                host, _, port = self.served.split(",")[0].rpartition(":")
                served = endpoint_id(host, port)
            extra = self.router.response_headers(self.decision, served)
            if extra:
                messages.set_response_headers(replies[0], extra)
        return replies

    def _response_headers_reply(self, headers: HttpHeaders, attributes: Mapping[str, Struct]) -> list[ProcessingResponse]:
        values = {h.key.lower(): header_value(h) for h in headers.headers.headers}
        try:
            self.status = int(values.get(":status", "0"))
        except ValueError:
            self.status = 0
        length = values.get("content-length", "")
        self._sized = length.isdigit()  # else the body chunks are counted (when Envoy sends them)
        self._response_bytes = int(length) if self._sized else 0
        served = struct_value(self.metadata, "envoy.lb", SERVED_KEY)
        self.served = served if isinstance(served, str) else None
        self.reached = upstream_reached(attributes, values)
        self.prefill_fallback = values.get(PREFILL_FALLBACK_HEADER)
        streaming = self.stream_flag or "text/event-stream" in values.get("content-type", "")
        self.usage = UsageParser(streaming)
        self._first_byte()
        if headers.end_of_stream:
            self._complete()
            return [messages.continue_headers(response=True)]
        if self.model_back is not None:
            ask = self._response_bodies_off
            self.usage_sampled = ask
            return [messages.response_headers_for_rewrite(ask_for_body=ask, drop_length=self.model_back.length_changes)]
        if self._response_bodies_off and self.sampler is not None and self.sampler.sample():
            self.usage_sampled = True
            return [messages.continue_headers_with_response_body()]
        return [messages.continue_headers(response=True)]

    @property
    def _response_bodies_off(self) -> bool:
        """Envoy sends no response body and would honour ``mode_override`` (it ignores it with a
        FULL_DUPLEX_STREAMED request body: ``envoy.yaml``'s notes)."""
        return self.response_mode == BodyMode.NONE and not self._full_duplex

    def _first_byte(self) -> None:
        """The response started: the engine has done the prefill (llm-d releases at
        ``StartOfStream``)."""
        if not self._tokens_released and self.decision is not None:
            self._tokens_released = True
            self.router.response_started(self.request_id)

    def _response_body(self, body: HttpBody) -> list[ProcessingResponse]:
        if self.usage is None:
            self.usage = UsageParser(self.stream_flag)
        self.usage.feed(body.body)
        if not self._sized:
            self._response_bytes += len(body.body)
        if not self._tokens_released:
            self._first_byte()
        if body.end_of_stream:
            self._complete()
        mode = self.response_mode if self.response_mode is not None else self.request_mode
        chunk = body.body
        data = chunk if self.model_back is None else self.model_back.feed(chunk, body.end_of_stream)
        if mode == BodyMode.FULL_DUPLEX_STREAMED:
            return [messages.streamed_chunk(data, body.end_of_stream, response=True)]
        if data is not chunk and data != chunk:
            return [messages.replace_body(data, response=True)]
        return [messages.continue_body(response=True)]

    def _complete(self, *, cancelled: bool = False) -> None:
        """Finalise once: usage metrics, predicted-vs-reported cache hit, in-flight release."""
        if self._completed:
            return
        self._completed = True
        decision = self.decision
        if decision is None:
            return

        self.metrics.count_request(self._outcome(cancelled), self.status or "none")
        usage = self.usage.finish() if self.usage is not None else None
        if self._ticket is not None:
            self._ticket.finished(usage.prompt_tokens if usage else None, usage.completion_tokens if usage else None)
        endpoint = self._served_endpoint(decision)
        record_completion(self.metrics, self._series, self.status, usage, decision.ctx.match_info(endpoint),
                          time.perf_counter() - self._received, self._response_bytes)
        self.router.response_complete(
            decision.ctx,
            ResponseInfo(
                self.request_id, endpoint, self.status,
                usage.prompt_tokens if usage else None,
                usage.cached_tokens if usage else None,
                usage.completion_tokens if usage else None,
                self.reached,
                cancelled,
                self.prefill_fallback,
            ),
        )

    def _outcome(self, cancelled: bool) -> str:
        """``requests_total``'s outcome of a routed request, from what the response path saw."""
        if self.reached is False:
            return "upstream_unreached"  # Envoy answered in the engine's place
        if self.status == 0 and cancelled:
            return "cancelled"
        return "routed"

    def _served_endpoint(self, decision: Decision) -> EndpointId:
        """The target that served: from the served-endpoint metadata (a destination, which a
        data-parallel handler rewrites, mapped back to its target), else the primary target."""
        if not self.served:
            return decision.primary.id
        served = self.served.split(",")[0]
        for target, destination in zip(decision.targets, decision.result.destinations):
            if served in (target.id, destination_host_port(destination), destination):
                if target is not decision.primary:
                    self.metrics.anomalies.labels("served_elsewhere").inc()
                return target.id
        self.metrics.anomalies.labels("served_elsewhere").inc()
        host, _, port = served.rpartition(":")
        return endpoint_id(host, port)

