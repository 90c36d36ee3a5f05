"""llm-d's flow-control metric families, with their names, types, labels and buckets
(``llm-d/llm-d-router: pkg/epp/metrics/metrics.go`` "Flow Control Metrics" and
``pkg/epp/metrics/llm_d_router_metrics.go``): each of the first six is exported under the
deprecated ``inference_extension_`` name and the ``llm_d_epp_`` name, as llm-d does; the rest
only under ``llm_d_epp_``. ``fairness_id`` values are bounded (``cardinality.go``: 1000, then
``other``). Recording is a dict lookup and a ``bisect``; families are built at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ppc_extproc.flowcontrol.config import BandSpec
from ppc_extproc.flowcontrol.outcomes import Outcome
from ppc_extproc.flowcontrol.types import FlowItem
from ppc_extproc.histogram import BucketCounts

__all__ = ["FlowStats", "FlowStatsCollector"]

QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CYCLE_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
MAX_FAIRNESS_LABEL_VALUES = 1000
OVERFLOW = "other"
#: Model pairs kept as label values (metrics.go ``boundModels``).
MAX_MODEL_LABEL_VALUES = 1000
#: Request identities whose label values are remembered (then forgotten all at once).
MAX_LABEL_SETS = 10_000

_GIE, _LLMD = "inference_extension_", "llm_d_epp_"
_REJECTED = (Outcome.REJECTED_CAPACITY, Outcome.REJECTED_NO_ENDPOINTS, Outcome.REJECTED_OTHER)


class _Bounded:
    """Label values seen, up to a bound; later new values become ``other``."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= self.limit:
            return OVERFLOW
        self.seen.add(value)
        return value


class FlowStats:
    """Flow control's counters, histograms and gauges, read by ``FlowStatsCollector``."""

    def __init__(self) -> None:
        self._fairness = _Bounded(MAX_FAIRNESS_LABEL_VALUES)
        self._models = _Bounded(MAX_MODEL_LABEL_VALUES)
        self._seen: dict[tuple[str, int, str, str], tuple[str, str, str, str]] = {}
        #: (fairness_id, priority, outcome, model, target) → histogram
        self.queue_duration: dict[tuple[str, str, str, str, str], BucketCounts] = {}
        self.enqueue_duration: dict[tuple[str, str, str], BucketCounts] = {}
        self.cycle_duration = BucketCounts(CYCLE_BUCKETS)
        #: (fairness_id, priority, model, target) → [requests, bytes]
        self.queue: dict[tuple[str, str, str, str], list[int]] = {}
        #: (outcome, priority) → count
        self.requests: dict[tuple[str, str], int] = {}
        self.pool_saturation = 0.0
        self.stale = 0
        self.bands: dict[str, BandSpec] = {}

    def _labels(self, item: FlowItem) -> tuple[str, str, str, str]:
        """(fairness_id, priority, model_name, target_model_name), bounded; one dict lookup once seen."""
        key = (item.flow_id, item.priority, item.model, item.target_model)
        labels = self._seen.get(key)
        if labels is None:
            if len(self._seen) >= MAX_LABEL_SETS:
                self._seen.clear()
            pair = self._models(f"{item.model}\x00{item.target_model}")
            model = (OVERFLOW, OVERFLOW) if pair == OVERFLOW else (item.model, item.target_model)
            labels = self._seen[key] = (self._fairness(item.flow_id), str(item.priority), *model)
        return labels

    def _flow(self, item: FlowItem) -> tuple[str, str]:
        labels = self._labels(item)
        return labels[0], labels[1]

    def enqueued(self, item: FlowItem, seconds: float, outcome: str = "NotYetFinalized") -> None:
        key = (*self._flow(item), outcome)
        hist = self.enqueue_duration.get(key)
        if hist is None:
            hist = self.enqueue_duration[key] = BucketCounts(CYCLE_BUCKETS)
        hist.observe(seconds)

    def finished(self, item: FlowItem, outcome: Outcome, waited: float) -> None:
        fairness, priority, model, target = self._labels(item)
        key = (fairness, priority, outcome.value, model, target)
        hist = self.queue_duration.get(key)
        if hist is None:
            hist = self.queue_duration[key] = BucketCounts(QUEUE_BUCKETS)
        hist.observe(waited)
        counted = (outcome.value, priority)
        self.requests[counted] = self.requests.get(counted, 0) + 1
        if outcome in _REJECTED:  # never queued: its enqueue ended with the rejection
            self.enqueued(item, 0.0, outcome.value)

    def queue_changed(self, item: FlowItem, delta: int) -> None:
        key = self._labels(item)
        entry = self.queue.get(key)
        if entry is None:
            entry = self.queue[key] = [0, 0]
        entry[0] += delta
        entry[1] += delta * item.byte_size

    def cycle(self, seconds: float) -> None:
        self.cycle_duration.observe(seconds)

    def saturation(self, value: float, stale: int) -> None:
        self.pool_saturation = value
        self.stale = stale

    def band_added(self, spec: BandSpec) -> None:
        self.bands[str(spec.priority)] = spec


class FlowStatsCollector(Collector):
    """The families at scrape time. ``usage()`` gives per-band queued requests/bytes and the global
    totals; ``global_limits`` the configured global bounds (0: unset, no series)."""

    def __init__(self, stats: FlowStats, pool: str, detector: str,
                 usage: Any, global_limits: tuple[int, int]) -> None:  # fmt: skip
        self.stats, self.pool, self.detector, self.usage, self.global_limits = stats, pool, detector, usage, global_limits

    def collect(self) -> Iterator[Any]:
        s, pool = self.stats, self.pool
        for prefix in (_GIE, _LLMD):
            fam = HistogramMetricFamily(
                prefix + "flow_control_request_queue_duration_seconds",
                "Distribution of total time requests spend in the Flow Control layer (from enqueue to final outcome).",
                labels=["fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"])
            for (fid, prio, outcome, model, target), h in s.queue_duration.items():
                fam.add_metric([fid, prio, outcome, pool, model, target], h.buckets(), h.total)
            yield fam
            cycle = HistogramMetricFamily(
                prefix + "flow_control_dispatch_cycle_duration_seconds",
                "Distribution of time taken for each internal dispatch cycle in the Flow Control layer.", labels=[])
            cycle.add_metric([], s.cycle_duration.buckets(), s.cycle_duration.total)
            yield cycle
            enq = HistogramMetricFamily(
                prefix + "flow_control_request_enqueue_duration_seconds",
                "Distribution of time taken to enqueue requests into the Flow Control layer.",
                labels=["fairness_id", "priority", "outcome"])
            for (fid, prio, outcome), h in s.enqueue_duration.items():
                enq.add_metric([fid, prio, outcome], h.buckets(), h.total)
            yield enq
            labels = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]
            size = GaugeMetricFamily(prefix + "flow_control_queue_size",
                                     "Current number of requests actively held in the Flow Control queue.", labels=labels)
            size_bytes = GaugeMetricFamily(prefix + "flow_control_queue_bytes",
                                           "Current total size in bytes of requests actively held in the Flow Control "
                                           "queue.", labels=labels)  # fmt: skip
            for (fid, prio, model, target), (n, nbytes) in s.queue.items():
                size.add_metric([fid, prio, pool, model, target], n)
                size_bytes.add_metric([fid, prio, pool, model, target], nbytes)
            yield size
            yield size_bytes
            sat = GaugeMetricFamily(prefix + "flow_control_pool_saturation",
                                    "Pool saturation signal gating Flow Control dispatch (1.0 is the gating set point).",
                                    labels=["inference_pool", "stage"])  # fmt: skip
            sat.add_metric([pool, "effective"], s.pool_saturation)
            yield sat
        stale = GaugeMetricFamily(_LLMD + "flow_control_stale_endpoints",
                                  "Candidate endpoints whose metrics were missing or stale at the last saturation "
                                  "evaluation.", labels=["detector"])  # fmt: skip
        stale.add_metric([self.detector], s.stale)
        yield stale
        bands, (total_requests, total_bytes) = self.usage()
        util_r = GaugeMetricFamily(_LLMD + "flow_control_capacity_utilization_requests",
                                   "Fraction of a priority band's request-count capacity currently occupied.",
                                   labels=["priority", "inference_pool"])  # fmt: skip
        util_b = GaugeMetricFamily(_LLMD + "flow_control_capacity_utilization_bytes",
                                   "Fraction of a priority band's byte capacity currently occupied.",
                                   labels=["priority", "inference_pool"])  # fmt: skip
        for priority, (n, nbytes, max_n, max_bytes) in sorted(bands.items()):
            util_r.add_metric([str(priority), pool], n / max_n if max_n else 0.0)
            util_b.add_metric([str(priority), pool], nbytes / max_bytes if max_bytes else 0.0)
        yield util_r
        yield util_b
        max_requests, max_bytes = self.global_limits
        if max_requests:
            g = GaugeMetricFamily(_LLMD + "flow_control_global_capacity_utilization_requests",
                                  "Fraction of the global request-count capacity currently occupied.",
                                  labels=["inference_pool"])  # fmt: skip
            g.add_metric([pool], total_requests / max_requests)
            yield g
        if max_bytes:
            g = GaugeMetricFamily(_LLMD + "flow_control_global_capacity_utilization_bytes",
                                  "Fraction of the global byte capacity currently occupied.", labels=["inference_pool"])
            g.add_metric([pool], total_bytes / max_bytes)
            yield g
        total = CounterMetricFamily(_LLMD + "flow_control_requests",
                                    "Requests that left the Flow Control layer, by outcome.",
                                    labels=["outcome", "priority", "inference_pool"])  # fmt: skip
        for (outcome, prio), n in s.requests.items():
            total.add_metric([outcome, prio, pool], n)
        yield total
