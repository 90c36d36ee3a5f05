"""Prometheus metrics of the service. The registry is injected (tests use a fresh one).

Request path (updated per request):
    ppc_extproc_requests_total{outcome,code}
    ppc_extproc_decision_duration_seconds                      body end of stream → routing reply
    ppc_extproc_decision_stage_duration_seconds{stage}         parse, keys, lookup, score, pick, …
    ppc_extproc_picked_match_ratio                             matchBlocks / totalBlocks of the pick
    ppc_extproc_cached_tokens_error_tokens                     engine cached_tokens − predicted
    ppc_extproc_cached_tokens_total{source}                    predicted / reported
    ppc_extproc_usage_tokens_total{kind}                       prompt / completion / cached, from responses
    ppc_extproc_protocol_anomalies_total{kind}                 out-of-order messages, resets, …
Read at scrape time (``StateCollector``):
    ppc_extproc_inflight_requests{endpoint}, ppc_extproc_inflight_tokens{endpoint}
    ppc_extproc_index_request_keys, ppc_extproc_index_engine_keys, ppc_extproc_index_evictions_total{map}
    ppc_extproc_speculative_pending_requests
    ppc_extproc_kv_events_total{endpoint,kind}, ppc_extproc_kv_events_dropped_total{endpoint,reason}
    ppc_extproc_kv_transport_total{endpoint,name}, ppc_extproc_kv_source_last_seq{endpoint}
    ppc_extproc_kv_source_lag_seconds{endpoint}, ppc_extproc_kv_source_queue_depth{endpoint}
    ppc_extproc_engine_block_size{endpoint}                    the engine's own block, from its BlockStored events
    ppc_extproc_endpoints, ppc_extproc_endpoint_routable{endpoint}, ppc_extproc_endpoint_down_total{endpoint,reason}
    ppc_extproc_health_panic_total                             requests routed among held-down candidates
    ppc_extproc_tokenize_total{producer,backend,outcome}       token producers: ok / passthrough / why not
Also: ``ppc_extproc_build_info{version,python}``, the ``process_*``, ``python_info`` and ``python_gc_*``
collectors, and llm-d's and GIE's families (``llmd_metrics``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from ppc_extproc import __version__
from ppc_extproc.observability.llmd_metrics import LlmdRequestMetrics

if TYPE_CHECKING:
    from ppc_extproc.framework import CrossReplicaStats, PluginState

__all__ = ["DECISION_BUCKETS", "Metrics", "ServiceState", "StateCollector"]

#: 50 µs … 100 ms: the decision is sub-millisecond to a few milliseconds.
DECISION_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 1e-1)
#: parse the body; compute block keys; index lookup + match info; filters, scorers and picker; hooks
_STAGES = ("parse", "keys", "lookup", "score", "pre_request")
_OUTCOMES = (("routed", "200"), ("header_only", "200"), ("rejected", "400"), ("rejected", "413"),
             ("rejected", "429"), ("rejected", "503"), ("error", "500"))


class Metrics:
    """The request-path metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter("ppc_extproc_requests", "Requests by outcome and HTTP code.", ["outcome", "code"], registry=r)
        self.decision = Histogram(
            "ppc_extproc_decision_duration_seconds",
            "Time from the request body's end of stream to the routing reply.",
            buckets=DECISION_BUCKETS, registry=r,
        )
        self.stage = Histogram(
            "ppc_extproc_decision_stage_duration_seconds", "Time per routing stage.", ["stage"],
            buckets=DECISION_BUCKETS, registry=r,
        )
        self.match_ratio = Histogram(
            "ppc_extproc_picked_match_ratio", "matchBlocks / totalBlocks of the picked endpoint.",
            buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0), registry=r,
        )
        self.cached_error = Histogram(
            "ppc_extproc_cached_tokens_error_tokens",
            "Engine-reported cached_tokens minus the cached tokens predicted for the serving endpoint.",
            buckets=(-65536, -8192, -1024, -256, -64, -16, -1, 0, 1, 16, 64, 256, 1024, 8192, 65536), registry=r,
        )
        self.cached_tokens = Counter(
            "ppc_extproc_cached_tokens", "Prompt tokens found cached, as predicted and as the engine reported.",
            ["source"], registry=r,
        )
        self.usage_tokens = Counter(
            "ppc_extproc_usage_tokens", "Tokens reported in responses' usage.", ["kind"], registry=r,
        )
        # llm-d's and GIE's request families (dashboards and alerts read these names).
        self.llmd = LlmdRequestMetrics()
        r.register(self.llmd)
        build = Gauge("ppc_extproc_build_info", "Build information (value 1).", ["version", "python"], registry=r)
        build.labels(__version__, platform.python_version()).set(1)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.anomalies = Counter(
            "ppc_extproc_protocol_anomalies", "ext_proc streams that broke the protocol or ended early.", ["kind"],
            registry=r,
        )
        # Children are bound once: ``labels()`` costs microseconds on every call.
        self._requests = {key: self.requests.labels(*key) for key in _OUTCOMES}
        self._stages = {stage: self.stage.labels(stage) for stage in _STAGES}
        for source in ("predicted", "reported"):
            self.cached_tokens.labels(source)
        for kind in ("prompt", "completion", "cached"):
            self.usage_tokens.labels(kind)

    def count_request(self, outcome: str, code: int | str) -> None:
        child = self._requests.get((outcome, str(code)))
        if child is None:
            child = self._requests[(outcome, str(code))] = self.requests.labels(outcome, str(code))
        child.inc()

    def observe_decision(self, seconds: float, stages: Mapping[str, float]) -> None:
        self.decision.observe(seconds)
        for stage, value in stages.items():
            child = self._stages.get(stage)
            if child is None:
                child = self._stages[stage] = self.stage.labels(stage)
            child.observe(value)

    def observe_cached_tokens(self, predicted: int, reported: int) -> None:
        self.cached_tokens.labels("predicted").inc(predicted)
        self.cached_tokens.labels("reported").inc(reported)
        self.cached_error.observe(reported - predicted)


@dataclass(frozen=True, slots=True)
class ServiceState:
    """What the scrape-time collector reads from the running service."""

    #: endpoint → {"requests": n, "tokens": n}
    inflight: Mapping[str, Mapping[str, int]]
    endpoints: int
    plugins: Sequence[PluginState]
    #: endpoint → whether it may receive traffic
    routable: Mapping[str, bool] = field(default_factory=dict)
    #: (endpoint, reason) → times it was taken down
    down_transitions: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: requests routed among all their candidates because health held every one down
    health_panics: int = 0


class StateCollector(Collector):
    """Gauges and counters read from live objects at scrape time (index, transport, in-flight)."""

    def __init__(self, state: Callable[[], ServiceState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Any]:
        state = self._state()
        inflight = GaugeMetricFamily("ppc_extproc_inflight_requests", "Requests routed and not finished.", labels=["endpoint"])
        inflight_tokens = GaugeMetricFamily(
            "ppc_extproc_inflight_tokens", "Uncached prompt tokens of in-flight requests.", labels=["endpoint"]
        )
        peers = GaugeMetricFamily(
            "ppc_extproc_inflight_peer_requests",
            "Requests the other replicas have in flight, as a cross-replica syncer last heard.", labels=["endpoint"],
        )
        for endpoint, counts in state.inflight.items():
            inflight.add_metric([endpoint], counts["requests"])
            inflight_tokens.add_metric([endpoint], counts["tokens"])
            if "peer_requests" in counts:
                peers.add_metric([endpoint], counts["peer_requests"])
        yield inflight
        yield inflight_tokens
        yield peers
        yield GaugeMetricFamily("ppc_extproc_endpoints", "Endpoints in the pool.", value=state.endpoints)
        routable = GaugeMetricFamily(
            "ppc_extproc_endpoint_routable", "1 when the endpoint may receive traffic, 0 while a connection failure holds it down.",
            labels=["endpoint"],
        )
        for endpoint, ok in state.routable.items():
            routable.add_metric([endpoint], 1.0 if ok else 0.0)
        yield routable
        down = CounterMetricFamily(
            "ppc_extproc_endpoint_down", "Times an endpoint was taken out of routing, by evidence.",
            labels=["endpoint", "reason"],
        )
        for (endpoint, reason), n in state.down_transitions.items():
            down.add_metric([endpoint, reason], n)
        yield down
        yield CounterMetricFamily(
            "ppc_extproc_health_panic",
            "Requests routed among all their candidates because every one was held down (health fails open).",
            value=state.health_panics,
        )
        tokenize = CounterMetricFamily(
            "ppc_extproc_tokenize", "Text requests by token producer backend and outcome (ok, or why no ids).",
            labels=["producer", "backend", "outcome"],
        )
        for plugin in state.plugins:
            if plugin.index is not None:
                yield from self._producer(plugin)
            if plugin.cross_replica is not None:
                yield from self._cross_replica(plugin.name, plugin.cross_replica)
            if plugin.tokenize is not None:
                backend, outcomes = plugin.tokenize
                for outcome, n in outcomes.items():
                    tokenize.add_metric([plugin.name, backend, outcome], n)
        yield tokenize

    @staticmethod
    def _cross_replica(name: str, stats: CrossReplicaStats) -> Iterator[Any]:
        up = GaugeMetricFamily("ppc_extproc_cross_replica_store_up",
                               "1 while the cross-replica store answers (else: routing on local state).", labels=["syncer"])
        up.add_metric([name], 1.0 if stats.up else 0.0)
        yield up
        peers = GaugeMetricFamily("ppc_extproc_cross_replica_peers", "Other replicas heard from within the state TTL.",
                                  labels=["syncer"])
        peers.add_metric([name], stats.peers)
        yield peers
        syncs = CounterMetricFamily("ppc_extproc_cross_replica_sync", "Publishes of this replica's in-flight load.",
                                    labels=["syncer", "outcome"])
        for outcome, n in stats.syncs.items():
            syncs.add_metric([name, outcome], n)
        yield syncs
        claims = CounterMetricFamily(
            "ppc_extproc_cross_replica_claims", "Routing decisions by prefix-claim outcome (adopted: another "
            "replica's endpoint; kept: the local pick; timeout/error/skipped: routed on local state).",
            labels=["syncer", "outcome"])  # fmt: skip
        for outcome, n in stats.claims.items():
            claims.add_metric([name, outcome], n)
        yield claims

    @staticmethod
    def _producer(plugin: PluginState) -> Iterator[Any]:
        names = ["producer"]
        values = [plugin.name]
        index = plugin.index
        assert index is not None
        keys = GaugeMetricFamily("ppc_extproc_index_request_keys", "Request keys in the index.", labels=names)
        keys.add_metric(values, index.request_keys)
        yield keys
        engine = GaugeMetricFamily("ppc_extproc_index_engine_keys", "Engine-key mappings in the index.", labels=names)
        engine.add_metric(values, index.engine_keys)
        yield engine
        evictions = CounterMetricFamily(
            "ppc_extproc_index_evictions", "Keys evicted by the index's size bound.", labels=[*names, "map"]
        )
        evictions.add_metric([*values, "request"], index.evicted_request_keys)
        evictions.add_metric([*values, "engine"], index.evicted_engine_keys)
        yield evictions
        speculative = GaugeMetricFamily(
            "ppc_extproc_speculative_pending_requests", "Requests whose speculative entries await expiry.", labels=names
        )
        speculative.add_metric(values, plugin.speculative_pending or 0)
        yield speculative
        stats = plugin.kv_events
        if stats is None:
            return
        events = CounterMetricFamily("ppc_extproc_kv_events", "KV events applied.", labels=["endpoint", "kind"])
        for (endpoint, kind), n in list(stats.events.items()):
            events.add_metric([endpoint, kind], n)
        yield events
        dropped = CounterMetricFamily(
            "ppc_extproc_kv_events_dropped", "KV messages or events dropped, by reason.", labels=["endpoint", "reason"]
        )
        for (endpoint, reason), n in list(stats.dropped.items()):
            dropped.add_metric([endpoint, reason], n)
        yield dropped
        transport = CounterMetricFamily(
            "ppc_extproc_kv_transport", "KV-event transport counters (messages, gaps, replays, …).",
            labels=["endpoint", "name"],
        )
        for (endpoint, name), n in list(stats.transport.items()):
            transport.add_metric([endpoint, name], n)
        yield transport
        last_seq = GaugeMetricFamily("ppc_extproc_kv_source_last_seq", "Last sequence number applied.", labels=["endpoint"])
        lag = GaugeMetricFamily("ppc_extproc_kv_source_lag_seconds", "Engine timestamp to application.", labels=["endpoint"])
        depth = GaugeMetricFamily("ppc_extproc_kv_source_queue_depth", "Messages queued per source.", labels=["endpoint"])
        for endpoint, source in list(stats.sources.items()):
            if source.last_seq is not None:
                last_seq.add_metric([endpoint], source.last_seq)
            if source.lag_seconds is not None:
                lag.add_metric([endpoint], source.lag_seconds)
            depth.add_metric([endpoint], source.queue_depth)
        yield last_seq
        yield lag
        yield depth
        block_size = GaugeMetricFamily(
            "ppc_extproc_engine_block_size", "Tokens per KV block of each engine's indexed KV-cache group, "
            "learned from its BlockStored events.", labels=["endpoint"],
        )
        for endpoint, size in list(stats.block_sizes.items()):
            block_size.add_metric([endpoint], size)
        yield block_size
