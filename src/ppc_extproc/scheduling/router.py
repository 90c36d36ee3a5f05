"""The router: one request in, a decision out — the pure core the ext_proc servicer adapts.

    candidates (pool ∩ subset hint)
    → producers, in data-dependency order (token ids, then match info)
    → scheduler (profile handler → profiles: filters, scorers, picker)
    → cross-replica syncer, when configured (the prefix's claim across replicas)
    → destination header value → pre-request hooks (speculative entries, LRUs)
    … response_complete hooks when the response ends
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.errors import NoEndpointsError, RequestError
from ppc_extproc.framework import (
    AsyncDataProducer,
    AsyncPreRequest,
    CrossReplicaSyncer,
    DataKey,
    DataProducer,
    Endpoint,
    LLMRequest,
    PreRequest,
    RequestArrival,
    RequestParser,
    ResponseComplete,
    ResponseHeaderProcessor,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
    StreamedKeys,
    StreamingKeyProducer,
)
from ppc_extproc.ids import EndpointId, RequestKey, destination_host_port
from ppc_extproc.scheduling.health import EndpointHealth
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.scheduler import Scheduler

__all__ = ["AsyncProducerStep", "Decision", "Pipeline", "ProducerStep", "Router", "StreamingHasher"]

log = structlog.get_logger(__name__)

#: llm-d's extension point names (``llm-d/llm-d-router: pkg/epp/requestcontrol/plugin_executor.go``,
#: ``director.go``).
DATA_PRODUCER, PRE_REQUEST = "DataProducer", "PreRequest"


@dataclass(frozen=True, slots=True)
class ProducerStep:
    """One producer in run order, with the data it must not run without."""

    producer: DataProducer
    #: Required inputs: when the producer of one of them failed for this request, skip this one.
    requires: frozenset[DataKey[object]] = frozenset()


@dataclass(frozen=True, slots=True)
class AsyncProducerStep:
    """A producer that waits on I/O, awaited under its own timeout."""

    producer: AsyncDataProducer
    requires: frozenset[DataKey[object]] = frozenset()


@dataclass
class Pipeline:
    """Everything the router runs, typed by role (built by the configuration loader)."""

    producers: list[ProducerStep | AsyncProducerStep]
    scheduler: Scheduler
    #: Told when a request's headers arrive, before its body (the KV-event thread's flush).
    request_arrival: list[RequestArrival] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    #: Awaited after ``pre_request``, before the destination is answered (shared session bindings).
    pre_request_async: list[AsyncPreRequest] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    #: Plugins adding headers to the client's response (session tokens).
    response_headers: list[ResponseHeaderProcessor] = field(default_factory=list)
    #: The producer whose block keys are computed while a large body streams in.
    streaming: StreamingKeyProducer | None = None
    #: ``requestHandler.parsers``; None: every path is handled.
    parsers: list[RequestParser] | None = None
    #: ``dataLayer.crossReplicaSyncerPluginRef``: consulted after the pick (fails open).
    cross_replica: CrossReplicaSyncer | None = None

    def streaming_hasher(self) -> StreamingHasher | None:
        """How block keys are computed while a large token-id body streams in, or None when no
        producer of this pipeline precomputes them."""
        if self.streaming is None:
            return None
        return StreamingHasher(self.streaming.name, self.streaming.streaming_processor)


@dataclass(frozen=True, slots=True)
class StreamingHasher:
    """The pipeline's streamed hashing: the producer the keys are for, and its block hasher."""

    owner: str
    hasher: TokenProcessor

    def streamed_keys(self, model: str, keys: list[RequestKey]) -> StreamedKeys:
        """Keys hashed while the body streamed in, as the owning producer looks them up."""
        return StreamedKeys(self.owner, model, keys)


@dataclass(slots=True)
class Decision:
    """Where a request goes and why."""

    targets: list[Endpoint]
    #: ``x-gateway-destination-endpoint`` value: ``ip:port`` or a comma-separated fallback list.
    destination: str
    ctx: SchedulingContext
    result: SchedulingResult
    #: stage → seconds: produce, filter, score, pick, pre_request
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def primary(self) -> Endpoint:
        return self.targets[0]


class Router:
    """Runs the pipeline over the endpoint pool."""

    def __init__(
        self,
        pool: EndpointPool,
        pipeline: Pipeline,
        inflight: InflightTracker | None = None,
        health: EndpointHealth | None = None,
    ) -> None:
        self.pool = pool
        self.pipeline = pipeline
        #: Requests routed and not yet answered, per endpoint (read by load scorers).
        self.inflight = inflight if inflight is not None else InflightTracker()
        #: The first filter: endpoints Envoy could not reach are left out, unless that is all of them.
        self.health = health if health is not None else EndpointHealth()

    def candidates(self, subset: Sequence[str] | None) -> list[Endpoint]:
        """The pool's endpoints (those the subset hint names, if any) that may receive traffic;
        every one of them when health holds them all down (it fails open). Raises
        ``NoEndpointsError`` when the pool has none."""
        candidates = self.pool.candidates(subset)
        if not candidates:
            raise NoEndpointsError("failed to find endpoint candidates for serving the request")
        return self.health.routable(candidates)

    async def route(
        self, request: LLMRequest, subset: Sequence[str] | None = None, *, dry_run: bool = False
    ) -> Decision:
        """Pick the destination for ``request``. Raises ``NoEndpointsError`` / ``SaturatedError`` /
        ``SchedulingError``; producer failures never fail the request."""
        candidates = self.candidates(subset)
        ctx = SchedulingContext(request, candidates, dry_run=dry_run)
        t0 = time.perf_counter()
        await self._produce(ctx)
        t1 = time.perf_counter()
        result = self.pipeline.scheduler.schedule(ctx, candidates)
        syncer = self.pipeline.cross_replica
        if syncer is not None and not dry_run:
            tc = time.perf_counter()
            result = await syncer.coordinate(ctx, result)
            ctx.timings["cross_replica"] = time.perf_counter() - tc
        destination = ",".join(destination_host_port(d) for d in result.destinations)
        t2 = time.perf_counter()
        if not dry_run:
            primary = result.targets[0]
            # Under P/D the prefill endpoint computes the prompt: the decode target prefills nothing.
            prefill = ctx.uncached_tokens(primary.id) if result.kv_source is None else 0
            self.inflight.start(request.request_id, primary.id, prefill)
            now = time.perf_counter()
            for hook in self.pipeline.pre_request:
                try:
                    hook.pre_request(ctx, result)
                except Exception:
                    log.exception("pre_request_failed", plugin=hook.name)
                done = time.perf_counter()
                ctx.plugin_time(PRE_REQUEST, hook.type_name, hook.name, done - now)
                now = done
            for async_hook in self.pipeline.pre_request_async:
                try:
                    await async_hook.pre_request_async(ctx, result)
                except Exception:
                    log.exception("pre_request_failed", plugin=async_hook.name)
                except BaseException:  # cancelled with no decision returned: nobody else releases it
                    self.response_complete(ctx, ResponseInfo(request.request_id, primary.id, status=0, reached=None,
                                                             cancelled=True))  # fmt: skip
                    raise
                done = time.perf_counter()
                ctx.plugin_time(PRE_REQUEST, async_hook.type_name, async_hook.name, done - now)
                now = done
        timings = {"produce": t1 - t0, **result.primary.timings, "pre_request": time.perf_counter() - t2}
        return Decision(result.targets, destination, ctx, result, timings)

    async def _produce(self, ctx: SchedulingContext) -> None:
        """Run the producers in order; a failed one's outputs are missing for this request, and the
        producers that require them are skipped (llm-d stops at the first failure)."""
        failed: set[DataKey[object]] = set()
        for step in self.pipeline.producers:
            if failed and not failed.isdisjoint(step.requires):
                failed.update(step.producer.produces())  # missing too: its dependants skip as well
                continue
            started = time.perf_counter()
            try:
                if isinstance(step, AsyncProducerStep):
                    timeout = step.producer.produce_timeout_seconds
                    if timeout is None:
                        await step.producer.produce_async(ctx)
                    else:
                        async with asyncio.timeout(timeout):
                            await step.producer.produce_async(ctx)
                else:
                    step.producer.produce(ctx)
            except RequestError:  # the client's mistake (a malformed chat body): a 4xx naming the field
                raise
            except Exception:  # producer errors never fail the request (prefix score becomes 0)
                log.exception("producer_failed", producer=step.producer.name, request_id=ctx.request.request_id)
                failed.update(step.producer.produces())
            finally:
                ctx.plugin_time(DATA_PRODUCER, step.producer.type_name, step.producer.name,
                                time.perf_counter() - started)

    def request_arrived(self) -> None:
        """A request's headers arrived and its body follows: the plugins start what its decision
        will read."""
        for plugin in self.pipeline.request_arrival:
            try:
                plugin.request_arrived()
            except Exception:
                log.exception("request_arrived_failed", plugin=plugin.name)

    def route_header_only(self, subset: Sequence[str] | None = None) -> Endpoint:
        """A request without a body (``GET /v1/models``): any routable candidate, at random."""
        return random.choice(self.candidates(subset))

    def response_started(self, request_id: str) -> None:
        """The response's first byte arrived: release the request's in-flight prompt tokens."""
        self.inflight.release_tokens(request_id)

    def response_headers(self, decision: Decision, served: EndpointId) -> list[tuple[str, str]]:
        """Headers the plugins add to the client's response (none when no plugin does)."""
        headers: list[tuple[str, str]] = []
        for plugin in self.pipeline.response_headers:
            try:
                headers.extend(plugin.response_headers(decision.ctx, decision.result, served))
            except Exception:
                log.exception("response_headers_failed", plugin=plugin.name)
        return headers

    def response_complete(self, ctx: SchedulingContext, info: ResponseInfo) -> None:
        """The response ended (or the stream died): release per-request state in the plugins, and
        tell endpoint health whether Envoy reached the engine (``reached`` None: no evidence)."""
        self.inflight.finish(ctx.request.request_id)
        if info.reached is not None and not ctx.dry_run:
            self.health.upstream(info.endpoint, info.reached)
        for hook in self.pipeline.response_complete:
            try:
                hook.response_complete(ctx, info)
            except Exception:
                log.exception("response_complete_failed", plugin=hook.name)
