"""``EngineMetrics``: one engine's load as last scraped, and the reader protocol scorers use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["EngineMetrics", "EngineMetricsReader", "StaticEngineMetrics"]


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """vLLM gauges of one endpoint. A field the engine does not export is None."""

    #: ``vllm:num_requests_waiting`` (summed over the engines of one endpoint).
    waiting: int | None
    #: ``vllm:num_requests_running`` (summed).
    running: int | None
    #: ``vllm:kv_cache_usage_perc`` or the older ``vllm:gpu_cache_usage_perc``, 0..1 (max).
    kv_usage: float | None
    #: ``vllm:cache_config_info{block_size}``.
    block_size: int | None
    #: ``vllm:cache_config_info{num_gpu_blocks}``.
    num_gpu_blocks: int | None
    #: Clock time (the source's clock, monotonic by default) of the scrape that produced this.
    updated_at: float
    #: True when no scrape succeeded for longer than the staleness window.
    stale: bool = False


@runtime_checkable
class EngineMetricsReader(Protocol):
    """What scorers need: the latest snapshot of an endpoint, None before its first scrape."""

    def snapshot(self, endpoint_id: str) -> EngineMetrics | None: ...


class StaticEngineMetrics:
    """Snapshots set by hand: tests, and deployments where something else pushes metrics."""

    def __init__(self, metrics: dict[str, EngineMetrics] | None = None) -> None:
        self._metrics: dict[str, EngineMetrics] = dict(metrics or {})

    def set(self, endpoint_id: str, metrics: EngineMetrics | None) -> None:
        if metrics is None:
            self._metrics.pop(endpoint_id, None)
        else:
            self._metrics[endpoint_id] = metrics

    def snapshot(self, endpoint_id: str) -> EngineMetrics | None:
        return self._metrics.get(endpoint_id)
