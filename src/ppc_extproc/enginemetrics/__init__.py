"""Engine metrics: vLLM load gauges per endpoint, scraped in the background for the load scorers.

``EngineMetricsSource`` scrapes; ``EngineMetrics`` is one snapshot; ``EngineMetricsReader`` is what
scorers depend on (``StaticEngineMetrics`` for tests); ``parse_vllm_metrics`` reads an exposition.
Importing this package starts nothing.
"""

from __future__ import annotations

from ppc_extproc.enginemetrics.parse import parse_vllm_metrics
from ppc_extproc.enginemetrics.source import EngineMetricsOptions, EngineMetricsSource
from ppc_extproc.enginemetrics.types import EngineMetrics, EngineMetricsReader, StaticEngineMetrics

__all__ = [
    "EngineMetrics",
    "EngineMetricsOptions",
    "EngineMetricsReader",
    "EngineMetricsSource",
    "StaticEngineMetrics",
    "parse_vllm_metrics",
]
