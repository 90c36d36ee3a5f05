"""Engine metrics: engines' load as the data layer polled it, for the load scorers.

``EngineMetrics`` is one endpoint's load; ``EngineMetricsStore`` holds the latest per endpoint
(extractors write it, scorers read it through ``EngineMetricsReader``); ``parse_engine_metrics``
reads an exposition with an ``EngineMapping`` (llm-d's engine configs). The polling itself is the
``metrics-data-source`` plugin, the parsing the ``core-metrics-extractor`` plugin. Importing this
package starts nothing.
"""

from __future__ import annotations

from ppc_extproc.enginemetrics.attributes import (
    CORE_METRICS_EXTRACTOR,
    AttributeStore,
    attribute_key,
    read_scalar,
    resolve_attribute,
)
from ppc_extproc.enginemetrics.parse import (
    BUILTIN_ENGINES,
    VLLM,
    EngineMapping,
    MetricSpec,
    ParsedMetrics,
    family_samples,
    parse_engine_metrics,
    parse_vllm_metrics,
)
from ppc_extproc.enginemetrics.types import (
    DEFAULT_STALE_AFTER_SECONDS,
    EngineMetrics,
    EngineMetricsReader,
    EngineMetricsStore,
)

__all__ = [
    "BUILTIN_ENGINES",
    "CORE_METRICS_EXTRACTOR",
    "DEFAULT_STALE_AFTER_SECONDS",
    "VLLM",
    "AttributeStore",
    "EngineMapping",
    "EngineMetrics",
    "EngineMetricsReader",
    "EngineMetricsStore",
    "MetricSpec",
    "ParsedMetrics",
    "attribute_key",
    "family_samples",
    "parse_engine_metrics",
    "parse_vllm_metrics",
    "read_scalar",
    "resolve_attribute",
]
