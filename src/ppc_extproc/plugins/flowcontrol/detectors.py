"""Saturation detectors: the pool's saturation for flow control (1.0 = at the set point), and a
filter that keeps scheduling off endpoints past their limits
(``llm-d/llm-d-router: pkg/epp/framework/plugins/flowcontrol/saturationdetector/``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ppc_extproc.enginemetrics import EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.flowcontrol.types import SaturationDetector
from ppc_extproc.framework import ENGINE_METRICS, Consumes, DataConsumer, Endpoint, Filter, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.inflight import InflightTracker

__all__ = ["ConcurrencyDetector", "UtilizationDetector"]


@dataclass(frozen=True, slots=True)
class UtilizationConfig:
    queue_depth_threshold: int = 5
    kv_cache_util_threshold: float = 0.8
    staleness_seconds: float = 0.2
    headroom: float = 0.0
    #: ``inflight`` (ppc-extproc): a stale endpoint is read from in-flight accounting;
    #: ``saturated`` (llm-d): it counts as 1.0.
    stale_metrics: str = "inflight"
    #: In-flight requests an endpoint never seen with fresh metrics is assumed to take.
    stale_fallback_concurrency: int = 100


@register("utilization-detector")
class UtilizationDetector(Filter, SaturationDetector, DataConsumer):
    """``utilization-detector``: saturation from the engines' waiting queues and KV-cache use.

    Type        ``utilization-detector`` (flow-control saturation detector, and a filter; injected
                as ``flowControl.saturationDetector`` when none is named)
    Formula     per endpoint ``max(waiting / queueDepthThreshold, kvUsage / kvCacheUtilThreshold,
                inFlight / (mostSeenRunning + queueDepthThreshold))``;
                the pool's saturation is the mean over endpoints; an empty pool is 1.0. With flow
                control's in-flight credit, requests routed to an endpoint since its metrics were
                scraped, less those finished there since, count as waiting there (never below 0),
                and requests dispatched but not yet routed are spread over the pool
    Stale       metrics older than ``metricsStalenessThreshold`` (or missing): with
                ``staleMetrics: inflight`` (default, ppc-extproc) the endpoint's saturation is its
                in-flight requests over its capacity — the most requests it was seen running plus
                ``queueDepthThreshold`` (``staleFallbackConcurrency`` before any fresh scrape) — so a
                stalled ``/metrics`` slows dispatch instead of halting it; ``staleMetrics: saturated``
                is llm-d's fail-closed 1.0
    Filter      drops endpoints that are stale or above ``queueDepthThreshold × (1 + headroom)``
                waiting or ``min(1, kvCacheUtilThreshold × (1 + headroom))`` KV use, or whose
                in-flight requests reach the most it was seen running plus that many waiting (the
                scrape lags what was routed since); all dropped ⇒ all kept
    Parameters  ``queueDepthThreshold`` [5] (> 0), ``kvCacheUtilThreshold`` [0.8] (in (0, 1]),
                ``metricsStalenessThreshold`` [200ms] (> 0), ``headroom`` [0.0] (≥ 0),
                ``staleMetrics`` [inflight] (``inflight`` | ``saturated``),
                ``staleFallbackConcurrency`` [100] (> 0)

        plugins:
        - type: utilization-detector
          parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 200ms}
        flowControl:
          saturationDetector: {pluginRef: utilization-detector}
    """

    type_name = "utilization-detector"
    reads_polled_metrics = True

    def __init__(self, name: str, config: UtilizationConfig, metrics: EngineMetricsStore, inflight: InflightTracker,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.name = name
        self.config = config
        self._metrics = metrics
        self._inflight = inflight
        self.clock = clock
        #: endpoint → most requests seen running with fresh metrics, plus the queue threshold
        self._capacity: dict[EndpointId, int] = {}
        self._stale = 0

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> UtilizationDetector:
        queue = params.integer("queueDepthThreshold", 5)
        if queue <= 0:
            raise ConfigError(params.child_path("queueDepthThreshold"), f"must be > 0, got {queue}")
        kv = params.number("kvCacheUtilThreshold", 0.8)
        if not 0.0 < kv <= 1.0:
            raise ConfigError(params.child_path("kvCacheUtilThreshold"), f"must be in (0.0, 1.0], got {kv}")
        staleness = params.duration("metricsStalenessThreshold", "200ms")
        if staleness <= 0:
            raise ConfigError(params.child_path("metricsStalenessThreshold"), "must be > 0")
        config = UtilizationConfig(
            queue, kv, staleness, params.number("headroom", 0.0, minimum=0.0),
            params.string("staleMetrics", "inflight", choices=("inflight", "saturated")),
            params.integer("staleFallbackConcurrency", 100, minimum=1),
        )  # fmt: skip
        return cls(name, config, services.engine_metrics, services.inflight, services.clock)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(ENGINE_METRICS),)

    def _fresh(self, endpoint: EndpointId, now: float) -> tuple[int | None, float | None] | None:
        m = self._metrics.snapshot(endpoint)
        if m is None or now - m.updated_at > self.config.staleness_seconds:
            return None
        if m.running is not None:
            seen = m.running + self.config.queue_depth_threshold
            if seen > self._capacity.get(endpoint, 0):
                self._capacity[endpoint] = seen
        return m.waiting, m.kv_usage

    def metrics_time(self, endpoint: EndpointId) -> float | None:
        m = self._metrics.snapshot(endpoint)
        if m is None or self.clock() - m.updated_at > self.config.staleness_seconds:
            return None
        return m.updated_at

    def saturation(self, endpoints: Iterable[EndpointId], extra: Mapping[EndpointId, int], unplaced: int) -> float:
        endpoints = list(endpoints)
        if not endpoints:
            self._stale = 0
            return 1.0
        share = unplaced / len(endpoints)
        now = self.clock()
        c = self.config
        total, stale = 0.0, 0
        for endpoint in endpoints:
            fresh = self._fresh(endpoint, now)
            if fresh is None:
                stale += 1
                if c.stale_metrics == "saturated":
                    total += 1.0
                else:
                    capacity = self._capacity.get(endpoint, c.stale_fallback_concurrency)
                    total += (self._inflight.requests(endpoint) + share) / capacity
                continue
            waiting, kv = fresh
            queue = max(0.0, (waiting or 0) + extra.get(endpoint, 0) + share)
            # the gauges lag the engine by a step: in-flight requests over what it holds (the most
            # seen running plus the threshold) catch what was routed between its snapshot and the scrape
            held = (self._inflight.requests(endpoint) + share) / self._capacity.get(endpoint, c.stale_fallback_concurrency)
            total += max(queue / c.queue_depth_threshold, (kv or 0.0) / c.kv_cache_util_threshold, held)
        self._stale = stale
        if len(self._capacity) > 2 * len(endpoints) + 64:
            keep = set(endpoints)
            self._capacity = {e: v for e, v in self._capacity.items() if e in keep}
        return total / len(endpoints)

    def stale_endpoints(self) -> int:
        return self._stale

    def dispatch_weight(self, endpoints: int) -> float:
        # one more waiting request on one endpoint (a stale endpoint's capacity is ≥ the threshold)
        return 1.0 / (max(1, endpoints) * self.config.queue_depth_threshold)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        c = self.config
        now = self.clock()
        max_queue = c.queue_depth_threshold * (1 + c.headroom)
        max_kv = min(1.0, c.kv_cache_util_threshold * (1 + c.headroom))
        kept = []
        for endpoint in endpoints:
            fresh = self._fresh(endpoint.id, now)
            if fresh is None or (fresh[0] or 0) > max_queue or (fresh[1] or 0.0) > max_kv:
                continue
            # the scrape lags the requests routed since: in-flight ≥ most seen running + threshold
            # means its waiting queue is full now
            room = self._capacity.get(endpoint.id, 0) + c.queue_depth_threshold * c.headroom
            if self._inflight.requests(endpoint.id) < room:
                kept.append(endpoint)
        return kept or list(endpoints)


@register("concurrency-detector")
class ConcurrencyDetector(Filter, SaturationDetector):
    """``concurrency-detector``: saturation from this service's in-flight accounting.

    Type        ``concurrency-detector`` (flow-control saturation detector, and a filter)
    Formula     ``requests``: in-flight requests (plus those dispatched, not yet routed) over
                ``endpoints × maxConcurrency``; ``tokens``: in-flight uncached prompt tokens over
                ``endpoints × maxTokenConcurrency``; ``hybrid``: the mean over endpoints of the larger
                of the two ratios. Reacts at once (no scrape lag) but is blind to the engines' KV use
    Filter      drops endpoints whose in-flight load reaches ``limit × (1 + headroom)`` (either
                dimension in ``hybrid``); all dropped ⇒ all kept
    Parameters  ``concurrencyMode`` [requests] (``requests`` | ``tokens`` | ``hybrid``),
                ``maxConcurrency`` [100] (> 0), ``maxTokenConcurrency`` [1000000] (> 0),
                ``headroom`` [0.0] (≥ 0)

        plugins:
        - type: concurrency-detector
          parameters: {concurrencyMode: requests, maxConcurrency: 32}
        flowControl:
          saturationDetector: {pluginRef: concurrency-detector}
    """

    type_name = "concurrency-detector"
    reads_polled_metrics = False

    def __init__(self, name: str, inflight: InflightTracker, mode: str = "requests", max_concurrency: int = 100,
                 max_tokens: int = 1_000_000, headroom: float = 0.0) -> None:  # fmt: skip
        self.name = name
        self._inflight = inflight
        self.mode, self.max_concurrency, self.max_tokens, self.headroom = mode, max_concurrency, max_tokens, headroom

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> ConcurrencyDetector:
        mode = params.string("concurrencyMode", "requests", choices=("requests", "tokens", "hybrid"))
        limits = []
        for key, default in (("maxConcurrency", 100), ("maxTokenConcurrency", 1_000_000)):
            value = params.integer(key, default)
            if value <= 0:
                raise ConfigError(params.child_path(key), f"must be > 0, got {value}")
            limits.append(value)
        return cls(name, services.inflight, mode, limits[0], limits[1], params.number("headroom", 0.0, minimum=0.0))

    def metrics_time(self, endpoint: EndpointId) -> float | None:
        return None  # in-flight counts change at once: nothing dispatched goes unseen

    def stale_endpoints(self) -> int:
        return 0

    def dispatch_weight(self, endpoints: int) -> float:
        return 0.0 if self.mode == "tokens" else 1.0 / (max(1, endpoints) * self.max_concurrency)

    def saturation(self, endpoints: Iterable[EndpointId], extra: Mapping[EndpointId, int], unplaced: int) -> float:
        endpoints = list(endpoints)
        if not endpoints:
            return 1.0
        n = len(endpoints)
        inflight = self._inflight
        if self.mode == "requests":
            return (sum(inflight.requests(e) for e in endpoints) + unplaced) / (n * self.max_concurrency)
        if self.mode == "tokens":
            return sum(inflight.tokens(e) for e in endpoints) / (n * self.max_tokens)
        total = sum(max(inflight.requests(e) / self.max_concurrency, inflight.tokens(e) / self.max_tokens)
                    for e in endpoints)  # fmt: skip
        return total / n + unplaced / (n * self.max_concurrency)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        scale = 1 + self.headroom
        kept = []
        for endpoint in endpoints:
            over_requests = self._inflight.requests(endpoint.id) >= self.max_concurrency * scale
            over_tokens = self._inflight.tokens(endpoint.id) >= self.max_tokens * scale
            over = {"requests": over_requests, "tokens": over_tokens}.get(self.mode, over_requests or over_tokens)
            if not over:
                kept.append(endpoint)
        return kept or list(endpoints)
