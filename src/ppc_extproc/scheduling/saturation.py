"""Pool saturation as llm-d's default detector reads it, for shedding sheddable requests.

llm-d's ``utilization-detector`` (``llm-d/llm-d-router: pkg/epp/flowcontrol/saturationdetector/
utilization/``; defaults queue depth 5, KV-cache utilization 0.8): each endpoint's saturation is
``max(waiting / queueDepthThreshold, kvUsage / kvCacheUtilThreshold)``, an endpoint whose metrics are
stale counts as fully saturated (1.0), and the pool's saturation is the mean over its endpoints (an
empty pool is saturated). An endpoint never polled (no metrics data source) is read from this
process's in-flight accounting instead, as llm-d's ``concurrency-detector`` does: in-flight requests
over ``maxConcurrency`` (default 100). The legacy admission rule sheds a request with a negative
priority when the result is at least 1.0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ppc_extproc.enginemetrics.types import EngineMetricsReader
from ppc_extproc.ids import EndpointId
from ppc_extproc.scheduling.inflight import InflightTracker

__all__ = ["SaturationDetector", "SaturationThresholds"]


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    queue_depth: float = 5.0
    kv_cache_utilization: float = 0.8
    max_concurrency: int = 100


class SaturationDetector:
    """The pool's saturation (≥ 1.0: saturated) from polled engine metrics, else in-flight counts."""

    def __init__(self, endpoints: Callable[[], Iterable[EndpointId]], metrics: EngineMetricsReader,
                 inflight: InflightTracker, thresholds: SaturationThresholds | None = None) -> None:
        self._endpoints, self._metrics, self._inflight = endpoints, metrics, inflight
        self.thresholds = thresholds or SaturationThresholds()

    def endpoint_saturation(self, endpoint: EndpointId) -> float:
        t = self.thresholds
        m = self._metrics.snapshot(endpoint)
        if m is None:
            return self._inflight.requests(endpoint) / t.max_concurrency
        if m.stale:
            return 1.0
        return max((m.waiting or 0) / t.queue_depth, (m.kv_usage or 0.0) / t.kv_cache_utilization)

    def saturation(self) -> float:
        values = [self.endpoint_saturation(e) for e in self._endpoints()]
        return sum(values) / len(values) if values else 1.0

    def saturated(self) -> bool:
        return self.saturation() >= 1.0
