"""llm-d's and GIE's metric families, with their names, types, labels and buckets, so llm-d's and
GIE's dashboards and alerts read ppc-extproc (``llm-d/llm-d-router: pkg/epp/metrics/metrics.go``,
``pkg/epp/metrics/llm_d_router_metrics.go``, ``pkg/epp/metrics/collectors/inference_pool.go``,
``pkg/kvcache/metrics/collector.go``).

Each request family is exported twice, as llm-d does: the deprecated GIE name
(``inference_objective_*``, ``inference_extension_*``, labels ``model_name, target_model_name``)
and the ``llm_d_epp_*`` name (labels plus ``fairness_id, priority``). Both are read from one store,
so a request pays once: its series object is found by one dict lookup and every observation is a
``bisect`` into a bucket list (no locks: the service records and scrapes on one event loop).
Pool gauges are computed at scrape time from the pool and the engine metrics store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ppc_extproc.histogram import BucketCounts

__all__ = ["LlmdRequestMetrics", "PoolCollector", "PoolSnapshot", "RequestSeries", "disagg_families", "error_code_for_status",
           "kv_cache_families"]

#: metrics.go ``generalLatencyBuckets``: 5 ms … 1 hour.
LATENCY_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
                   45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
REQUEST_SIZE_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288,
                        1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456,
                        536870912, 1073741824)
RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
INPUT_TOKEN_BUCKETS = (*RESPONSE_SIZE_BUCKETS, 131072, 262144, 524288, 1048576)
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

#: llm-d's request labels beyond the model pair: the fairness id header's value, else llm-d's
#: default flow (``pkg/epp/metadata/consts.go``); priority is its InferenceObjective's (0 without one).
DEFAULT_FAIRNESS_ID = "default-flow"
DEFAULT_PRIORITY = "0"
#: cardinality.go: distinct model names kept as label values before the rest become ``other``.
MAX_MODEL_LABEL_VALUES = 1000
#: cardinality.go ``maxFairnessLabelValues``.
MAX_FAIRNESS_LABEL_VALUES = 1000
OVERFLOW_VALUE = "other"

#: ``plugin_duration_seconds`` labels of the request's parse, which is the service's request
#: assembly (one function for every path), not a configured plugin.
PARSE_KEY = ("RequestParsing", "request-assembly", "request-assembly")
#: Bound on the (extension point, plugin type, plugin name) series: plugins come from the
#: configuration, so this is never reached by a real one.
MAX_PLUGIN_SERIES = 256

_CODES = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 412: "PreconditionFailed",
          413: "BadRequest", 429: "ResourceExhausted", 500: "Internal", 503: "ServiceUnavailable"}


def error_code_for_status(status: int) -> str:
    """llm-d's canonical error code (``pkg/common/error/error.go``) for a status we answered with."""
    return _CODES.get(status, "Internal" if status >= 500 else "Unknown")


class RequestSeries:
    """One (model_name, target_model_name)'s request families."""

    __slots__ = (
        "cached_tokens",
        "duration",
        "errors",
        "input_tokens",
        "ntpot",
        "output_tokens",
        "request_size",
        "requests",
        "response_size",
        "running",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.errors: dict[str, int] = {}
        self.running = 0
        self.duration = BucketCounts(LATENCY_BUCKETS)
        self.request_size = BucketCounts(REQUEST_SIZE_BUCKETS)
        self.response_size = BucketCounts(RESPONSE_SIZE_BUCKETS)
        self.input_tokens = BucketCounts(INPUT_TOKEN_BUCKETS)
        self.output_tokens = BucketCounts(OUTPUT_TOKEN_BUCKETS)
        self.cached_tokens = BucketCounts(INPUT_TOKEN_BUCKETS)
        self.ntpot = BucketCounts(NTPOT_BUCKETS)


#: (family suffix, GIE name, llm-d name, help, attribute)
_HISTOGRAMS = (
    ("inference_objective_request_duration_seconds", "llm_d_epp_request_duration_seconds",
     "End-to-end request latency in seconds (request headers to response end).", "duration"),
    ("inference_objective_request_sizes", "llm_d_epp_request_size_bytes", "Request body size in bytes.", "request_size"),
    ("inference_objective_response_sizes", "llm_d_epp_response_size_bytes", "Response body size in bytes.",
     "response_size"),
    ("inference_objective_input_tokens", "llm_d_epp_request_input_tokens", "Prompt tokens from the response usage.",
     "input_tokens"),
    ("inference_objective_output_tokens", "llm_d_epp_request_output_tokens",
     "Completion tokens from the response usage.", "output_tokens"),
    ("inference_objective_prompt_cached_tokens", "llm_d_epp_request_cached_tokens",
     "Prompt tokens the engine reported cached.", "cached_tokens"),
    ("inference_objective_normalized_time_per_output_token_seconds", "llm_d_epp_request_ntpot_seconds",
     "Request latency divided by completion tokens.", "ntpot"),
)


class LlmdRequestMetrics(Collector):
    """Request-path families of llm-d and GIE, recorded per request and collected at scrape time."""

    def __init__(self, namespace: str = "") -> None:
        self._series: dict[tuple[str, str, int, str], RequestSeries] = {}
        self._fairness: set[str] = set()
        self._models: set[str] = set()
        self.namespace = namespace
        self.scheduler_e2e = BucketCounts(SCHEDULER_BUCKETS)
        #: (status, target_model_name, endpoint_name, port) → attempts
        self.attempts: dict[tuple[str, str, str, str], int] = {}
        #: (extension point, plugin type, plugin name) → histogram
        self.plugins: dict[tuple[str, str, str], BucketCounts] = {}

    def _bound(self, model: str) -> str:
        if not model or model in self._models:
            return model
        if len(self._models) >= MAX_MODEL_LABEL_VALUES:
            return OVERFLOW_VALUE
        self._models.add(model)
        return model

    def series(self, model: str, target: str, priority: int = 0, fairness: str = DEFAULT_FAIRNESS_ID) -> RequestSeries:
        """The series of a (model, target model, priority, fairness id), created on first use
        (bounded: 1,000 model names and 1,000 fairness ids, then ``other``)."""
        key = (model, target, priority, fairness)
        found = self._series.get(key)
        if found is None:
            if fairness not in self._fairness:
                if len(self._fairness) >= MAX_FAIRNESS_LABEL_VALUES:
                    fairness = OVERFLOW_VALUE
                else:
                    self._fairness.add(fairness)
            key = (self._bound(model), self._bound(target), priority, fairness)
            found = self._series.get(key)
            if found is None:
                found = self._series[key] = RequestSeries()
        return found

    def scheduled(self, series: RequestSeries, request_bytes: int, target: str, endpoint_name: str, port: int,
                  scheduling_seconds: float, plugins: Sequence[tuple[tuple[str, str, str], float]] = ()) -> None:
        """A request was routed: llm-d counts it, its size and a running request here, the
        scheduling time (filters, scorers, picker) and each plugin call's time."""
        series.requests += 1
        series.running += 1
        series.request_size.observe(request_bytes)
        key = ("success", target, endpoint_name, str(port))
        self.attempts[key] = self.attempts.get(key, 0) + 1
        self.scheduler_e2e.observe(scheduling_seconds)
        histograms = self.plugins
        for plugin, seconds in plugins:
            hist = histograms.get(plugin)
            if hist is None:
                if len(histograms) >= MAX_PLUGIN_SERIES:
                    continue
                hist = histograms[plugin] = BucketCounts(SCHEDULER_BUCKETS)
            hist.observe(seconds)

    def failed(self, series: RequestSeries, code: str, *, running: bool) -> None:
        series.errors[code] = series.errors.get(code, 0) + 1
        if running:
            series.running -= 1

    def completed(self, series: RequestSeries, seconds: float, response_bytes: int, prompt_tokens: int | None,
                  completion_tokens: int | None, cached_tokens: int | None) -> None:
        """A routed request's response ended (or its stream did)."""
        series.running -= 1
        series.duration.observe(seconds)
        series.response_size.observe(response_bytes)
        if prompt_tokens:
            series.input_tokens.observe(prompt_tokens)
        if completion_tokens:
            series.output_tokens.observe(completion_tokens)
            series.ntpot.observe(seconds / completion_tokens)
        if cached_tokens is not None:
            series.cached_tokens.observe(cached_tokens)

    def collect(self) -> Iterator[Any]:
        models = ["model_name", "target_model_name"]
        gie_total = CounterMetricFamily("inference_objective_request", "Requests per model and target model.",
                                        labels=[*models, "priority"])
        llmd_total = CounterMetricFamily("llm_d_epp_request", "Requests per model and target model.",
                                         labels=[*models, "fairness_id", "priority"])
        gie_err = CounterMetricFamily("inference_objective_request_error", "Request errors.",
                                      labels=[*models, "error_code"])
        llmd_err = CounterMetricFamily("llm_d_epp_request_error", "Request errors.",
                                       labels=[*models, "fairness_id", "priority", "error_code"])
        gie_running = GaugeMetricFamily("inference_objective_running_requests", "Running requests per model.",
                                        labels=["model_name"])
        llmd_running = GaugeMetricFamily("llm_d_epp_request_running", "Running requests.",
                                         labels=[*models, "fairness_id", "priority"])
        per_model: dict[str, int] = {}
        hists = [(HistogramMetricFamily(gie, text, labels=models),
                  HistogramMetricFamily(llmd, text, labels=[*models, "fairness_id", "priority"]), attr)
                 for gie, llmd, text, attr in _HISTOGRAMS]
        # GIE's families carry no fairness/priority (histograms, errors): one sample per model pair.
        gie_hists: dict[tuple[str, str, int], BucketCounts] = {}
        gie_errors: dict[tuple[str, str, str], int] = {}
        for (model, target, priority, fairness), s in list(self._series.items()):
            pair = [model, target]
            flow = [fairness, str(priority)]
            gie_total.add_metric([*pair, str(priority)], s.requests)
            llmd_total.add_metric([*pair, *flow], s.requests)
            for code, n in s.errors.items():
                gie_errors[(model, target, code)] = gie_errors.get((model, target, code), 0) + n
                llmd_err.add_metric([*pair, *flow, code], n)
            llmd_running.add_metric([*pair, *flow], s.running)
            if model:
                per_model[model] = per_model.get(model, 0) + s.running
            for i, (_, llmd_family, attr) in enumerate(hists):
                h: BucketCounts = getattr(s, attr)
                llmd_family.add_metric([*pair, *flow], h.buckets(), h.total)
                merged = gie_hists.get((model, target, i))
                if merged is None:
                    merged = gie_hists[(model, target, i)] = BucketCounts(h.bounds)
                merged.counts = [a + b for a, b in zip(merged.counts, h.counts, strict=True)]
                merged.total += h.total
        for (model, target, code), n in gie_errors.items():
            gie_err.add_metric([model, target, code], n)
        for (model, target, i), merged in gie_hists.items():
            hists[i][0].add_metric([model, target], merged.buckets(), merged.total)
        for model, n in per_model.items():
            gie_running.add_metric([model], n)
        yield from (gie_total, llmd_total, gie_err, llmd_err, gie_running, llmd_running)
        for gie_family, llmd_family, _ in hists:
            yield gie_family
            yield llmd_family
        yield from self._scheduler()

    def _scheduler(self) -> Iterator[Any]:
        for prefix in ("inference_extension", "llm_d_epp"):
            e2e = HistogramMetricFamily(f"{prefix}_scheduler_e2e_duration_seconds",
                                        "Scheduling latency (filters, scorers, picker).", labels=[])
            e2e.add_metric([], self.scheduler_e2e.buckets(), self.scheduler_e2e.total)
            yield e2e
            endpoint_label = "pod_name" if prefix == "inference_extension" else "endpoint_name"
            attempts = CounterMetricFamily(f"{prefix}_scheduler_attempts", "Scheduling attempts.",
                                           labels=["status", "target_model_name", endpoint_label, "namespace", "port"])
            for (status, target, name, port), n in list(self.attempts.items()):
                attempts.add_metric([status, target, name, self.namespace, port], n)
            yield attempts
            plugins = HistogramMetricFamily(
                f"{prefix}_plugin_duration_seconds",
                "Plugin processing latency in seconds per extension point, plugin type and plugin name.",
                labels=["extension_point", "plugin_type", "plugin_name"])
            for labels, h in list(self.plugins.items()):
                plugins.add_metric(list(labels), h.buckets(), h.total)
            yield plugins


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """What the pool gauges read at scrape time."""

    name: str
    #: endpoint name (the pod) → (waiting, running, kv usage 0..1), None where unknown
    endpoints: dict[str, tuple[int | None, int | None, float | None]] = field(default_factory=dict)


class PoolCollector(Collector):
    """``inference_pool_*`` and their ``llm_d_epp_*`` twins, plus the KV-event and index families
    of ``pkg/kvcache/metrics/collector.go`` that the service's producers fill."""

    def __init__(self, pool: Callable[[], PoolSnapshot], info: tuple[str, str],
                 kv: Callable[[], Iterator[Any]] | None = None) -> None:
        self._pool = pool
        self._info = info
        self._kv = kv

    def collect(self) -> Iterator[Any]:
        snapshot = self._pool()
        name = [snapshot.name]
        values = list(snapshot.endpoints.values())
        kv = [v[2] for v in values if v[2] is not None]
        waiting = [v[0] for v in values if v[0] is not None]
        running = [v[1] for v in values if v[1] is not None]
        averages = (("average_kv_cache_utilization", "Average KV-cache utilization of the pool.", kv),
                    ("average_queue_size", "Average requests waiting in the pool's model servers.", waiting),
                    ("average_running_requests", "Average running requests in the pool's model servers.", running))
        for prefix in ("inference_pool", "llm_d_epp"):
            for suffix, text, data in averages:
                family = GaugeMetricFamily(f"{prefix}_{suffix}", text, labels=["name"])
                family.add_metric(name, sum(data) / len(data) if data else 0.0)
                yield family
            ready = "ready_pods" if prefix == "inference_pool" else "ready_endpoints"
            family = GaugeMetricFamily(f"{prefix}_{ready}", "Ready pods in the pool.", labels=["name"])
            family.add_metric(name, len(values))
            yield family
        per_pod = GaugeMetricFamily("inference_pool_per_pod_queue_size", "Requests waiting per model server pod.",
                                    labels=["name", "model_server_pod"])
        per_endpoint = GaugeMetricFamily("llm_d_epp_per_endpoint_queue_size", "Requests waiting per endpoint.",
                                         labels=["name", "model_server_endpoint"])
        for endpoint, (queued, _, _) in snapshot.endpoints.items():
            per_pod.add_metric([snapshot.name, endpoint], queued or 0)
            per_endpoint.add_metric([snapshot.name, endpoint], queued or 0)
        yield per_pod
        yield per_endpoint
        for prefix in ("inference_extension", "llm_d_epp"):
            info = GaugeMetricFamily(f"{prefix}_info", "Build information.", labels=["commit", "build_ref"])
            info.add_metric(list(self._info), 1)
            yield info
        if self._kv is not None:
            yield from self._kv()


#: collector.go family (after ``llm_d_epp_kv_cache_``) → our transport counter, per pod.
_KV_PER_POD = (
    ("events_messages_received", "Messages received from ZMQ subscribers.", "messages"),
    ("events_subscriber_reconnections", "ZMQ subscriber reconnection attempts.", "reconnects"),
)


def kv_cache_families(plugins: Sequence[Any]) -> Iterator[Any]:
    """``llm_d_epp_kv_cache_*`` families that precise-prefix producers' KV-event stats fill."""
    stats = [p.kv_events for p in plugins if getattr(p, "kv_events", None) is not None]
    if not stats:
        return
    for suffix, text, name in _KV_PER_POD:
        family = CounterMetricFamily(f"llm_d_epp_kv_cache_{suffix}", text, labels=["pod_identifier"])
        for s in stats:
            for (endpoint, counter), n in list(s.transport.items()):
                if counter == name:
                    family.add_metric([endpoint], n)
        yield family
    errors = CounterMetricFamily("llm_d_epp_kv_cache_events_zmq_errors", "ZMQ subscriber errors.",
                                 labels=["pod_identifier", "operation"])
    admissions = suppressed = 0
    for s in stats:
        for (endpoint, counter), n in list(s.transport.items()):
            if counter == "socket_errors":
                errors.add_metric([endpoint, "socket"], n)
            elif counter == "blocks_stored":
                admissions += n
            elif counter == "removes_suppressed":
                suppressed += n
    yield errors
    yield CounterMetricFamily("llm_d_epp_kv_cache_index_admissions", "KV-block admissions.", value=admissions)
    yield CounterMetricFamily("llm_d_epp_kv_cache_events_dedup_removed_hashes_suppressed",
                              "Block removals suppressed because another announcement still holds the block.",
                              value=suppressed)
    sources = [src for s in stats for src in list(s.sources.values())]
    yield GaugeMetricFamily("llm_d_epp_kv_cache_events_active_subscribers", "KV-event subscribers managed.",
                            value=len(sources))
    yield GaugeMetricFamily("llm_d_epp_kv_cache_events_pool_queue_depth", "KV-event messages queued.",
                            value=sum(src.queue_depth for src in sources))


#: family → (current name, deprecated name, help); ``llm-d/llm-d-router:
#: pkg/epp/framework/plugins/scheduling/profilehandler/disagg/metrics.go``.
_DISAGG = {
    "pd": ("llm_d_epp_pd_decision", "llm_d_inference_scheduler_pd_decision",
           "Total number of P/D disaggregation decisions made"),
    "disagg": ("llm_d_epp_disagg_decision", "llm_d_inference_scheduler_disagg_decision",
               "Total number of disaggregation routing decisions made"),
}


def disagg_families(plugins: Sequence[Any]) -> Iterator[Any]:
    """The P/D decision counters of disaggregation handlers (``PluginState.decisions``): llm-d's
    two families under both names, and ppc-extproc's prefill fallbacks and re-picks."""
    states = [p for p in plugins if getattr(p, "decisions", None) is not None]
    if not states:
        return
    for family, (name, deprecated, text) in _DISAGG.items():
        current = CounterMetricFamily(name, text, labels=["plugin_name", "plugin_type", "model_name", "decision_type"])
        old = CounterMetricFamily(deprecated, f"[Deprecated: Use {name}_total] {text}",
                                  labels=["model_name", "decision_type"])
        merged: dict[tuple[str, str], int] = {}
        for state in states:
            for (kind, model, decision), n in state.decisions.items():
                if kind == family:
                    current.add_metric([state.name, state.type_name, model, decision], n)
                    merged[(model, decision)] = merged.get((model, decision), 0) + n
        for (model, decision), n in merged.items():
            old.add_metric([model, decision], n)
        yield current
        yield old
    fallback = CounterMetricFamily(
        "ppc_extproc_pd_prefill_fallback",
        "Requests the decider sent to P/D that were prefilled on their decode endpoint instead (no healthy prefill endpoint).",
        labels=["plugin_name", "model_name", "reason"])
    repick = CounterMetricFamily(
        "ppc_extproc_pd_prefill_repick",
        "Requests whose prefill pick was unhealthy and replaced by another prefill endpoint.",
        labels=["plugin_name", "model_name"])
    for state in states:
        for (kind, model, decision), n in state.decisions.items():
            if kind == "prefill_fallback":
                fallback.add_metric([state.name, model, decision], n)
            elif kind == "prefill_repick":
                repick.add_metric([state.name, model], n)
    yield fallback
    yield repick
