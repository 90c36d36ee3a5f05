"""``EngineMetrics``: one engine's load as last polled; the store extractors write and scorers read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

__all__ = ["DEFAULT_STALE_AFTER_SECONDS", "EngineMetrics", "EngineMetricsReader", "EngineMetricsStore"]

#: 20 polls of llm-d's default 50 ms interval.
DEFAULT_STALE_AFTER_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """Load of one endpoint. A field the engine does not export is None."""

    #: Requests waiting (vLLM ``vllm:num_requests_waiting``), summed over the endpoint's series.
    waiting: int | None
    #: Requests running (``vllm:num_requests_running``), summed.
    running: int | None
    #: KV-cache usage 0..1 (``vllm:kv_cache_usage_perc``), the fullest series.
    kv_usage: float | None
    #: Engine block size (``vllm:cache_config_info{block_size}``).
    block_size: int | None
    #: KV-cache blocks (``vllm:cache_config_info{num_gpu_blocks}``).
    num_gpu_blocks: int | None
    #: Clock time (the store's clock, monotonic by default) of the poll that produced this.
    updated_at: float
    #: True when no poll succeeded for longer than the staleness window.
    stale: bool = False
    #: LoRA adapters running / waiting and the engine's ``max_lora`` (``vllm:lora_requests_info``).
    active_models: tuple[str, ...] = ()
    waiting_models: tuple[str, ...] = ()
    max_active_models: int | None = None
    #: ``customMetrics`` of the extractor's engine config: attribute key → value.
    custom: Mapping[str, float] = field(default_factory=dict)


class EngineMetricsReader(Protocol):
    """What scorers need: the latest metrics of an endpoint, None before its first poll."""

    def snapshot(self, endpoint_id: str) -> EngineMetrics | None: ...


class EngineMetricsStore:
    """Latest ``EngineMetrics`` per endpoint id: metrics extractors write, scorers read.

    ``snapshot`` is a dict lookup (the request path never does I/O); a snapshot older than the
    staleness window comes back with ``stale=True`` (``None`` window: never stale — metrics set by
    hand in tests, or pushed by something else).
    """

    def __init__(
        self,
        initial: Mapping[str, EngineMetrics] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        stale_after_seconds: float | None = DEFAULT_STALE_AFTER_SECONDS,
    ) -> None:
        self.clock = clock
        self.stale_after_seconds = stale_after_seconds
        self._snapshots: dict[str, EngineMetrics] = dict(initial or {})
        #: Stale copies handed out, so a dead engine costs a dict lookup too.
        self._stale: dict[str, EngineMetrics] = {}
        self._lock = threading.Lock()

    def expect_updates_every(self, interval_seconds: float, polls: int = 20) -> None:
        """A poller updates every ``interval_seconds``: stale after ``polls`` missed polls."""
        window = interval_seconds * polls
        if self.stale_after_seconds is not None and window > self.stale_after_seconds:
            self.stale_after_seconds = window

    def set(self, endpoint_id: str, metrics: EngineMetrics | None) -> None:
        with self._lock:
            if metrics is None:
                self._snapshots.pop(endpoint_id, None)
            else:
                self._snapshots[endpoint_id] = metrics
            self._stale.pop(endpoint_id, None)

    def forget(self, endpoint_id: str) -> None:
        self.set(endpoint_id, None)

    def snapshot(self, endpoint_id: str) -> EngineMetrics | None:
        metrics = self._snapshots.get(endpoint_id)
        window = self.stale_after_seconds
        if metrics is None or window is None or self.clock() - metrics.updated_at <= window:
            return metrics
        stale = self._stale.get(endpoint_id)
        if stale is None or stale.updated_at != metrics.updated_at:
            stale = self._stale[endpoint_id] = replace(metrics, stale=True)
        return stale

    def __len__(self) -> int:
        return len(self._snapshots)
