"""vLLM's Prometheus metrics for one mock engine, read from the engine at scrape time.

Exported (labels ``model_name`` and ``engine``, like vLLM V1):

* ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges);
* ``vllm:kv_cache_usage_perc`` — fraction of blocks held by requests, 0..1 (gauge);
* ``vllm:cache_config_info{block_size,num_gpu_blocks,enable_prefix_caching,…} 1``;
* ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` — prompt tokens
  queried and served from the prefix cache (counters);
* ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total`` (counters).

Lag: vLLM sets its gauges from each engine step's ``SchedulerStats``
(``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger.record``), so a scrape sees the state as
of the last step. With ``update_interval_s`` > 0 the running/waiting/KV-usage gauges are a
snapshot taken at most that often (the step time), held in between; 0 reads the engine live.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ppc_extproc_lab.mock_vllm.engine import MockEngine

__all__ = ["EngineCollector", "engine_registry"]

_LABELS = ["model_name", "engine"]


class EngineCollector(Collector):
    """Yields the engine's vLLM metrics on every scrape (no per-request bookkeeping)."""

    def __init__(self, engine: MockEngine, engine_index: int = 0, update_interval_s: float = 0.0) -> None:
        self._engine = engine
        self._values = [engine.config.model, str(engine_index)]
        self.update_interval_s = update_interval_s
        #: (taken at, running, waiting, KV usage): what the gauges show.
        self._snapshot: tuple[float, int, int, float] | None = None

    def gauges(self) -> tuple[int, int, float]:
        """(running, waiting, KV usage) as a scrape now shows them (a held snapshot when lagging)."""
        now = time.monotonic()
        snap = self._snapshot
        if snap is None or now - snap[0] >= self.update_interval_s:
            eng = self._engine
            snap = self._snapshot = (now, eng.num_running, eng.num_waiting, eng.cache.stats().usage)
        return snap[1], snap[2], snap[3]

    def collect(self) -> Iterator[Metric]:
        eng = self._engine
        vals = self._values
        running, waiting, usage = self.gauges()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(vals, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            c.add_metric(vals, value)
            return c

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            running,
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            waiting,
        )
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", *_LABELS],
        )
        info.add_metric(
            [str(eng.config.block_size), str(eng.config.num_blocks), "True", *vals], 1.0
        )
        yield info
        c = eng.counters
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_cache_hits,
        )
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens_total
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            c.generation_tokens_total,
        )


def engine_registry(engine: MockEngine, engine_index: int = 0, collector: EngineCollector | None = None) -> CollectorRegistry:
    """A fresh registry holding only this engine's metrics (``collector``, or a live one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector or EngineCollector(engine, engine_index))
    return registry
