"""Shared parts of the scorers that read engine metrics (not a plugin).

Policy for every metrics-based scorer: an endpoint whose metrics are missing (no successful poll
yet) or stale (no successful poll within the staleness window) is **not scored**. The profile
then counts 0 for it — the worst value of every load scorer — so an engine that stopped answering
can never look attractive, and a fleet with no metrics at all scores 0 everywhere (the scorer does
not influence the pick). Min-max scorers also leave such endpoints out of the min and max.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Self

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsReader
from ppc_extproc.framework import ENGINE_METRICS, Consumes, DataConsumer, Endpoint, Scorer
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services

__all__ = ["EngineMetricsScorer", "fresh_metrics", "min_max_inverse"]


def fresh_metrics(reader: EngineMetricsReader, endpoint_id: str) -> EngineMetrics | None:
    """The endpoint's metrics, or None when missing or stale."""
    metrics = reader.snapshot(endpoint_id)
    if metrics is None or metrics.stale:
        return None
    return metrics


def min_max_inverse(
    reader: EngineMetricsReader,
    endpoints: Sequence[Endpoint],
    value: Callable[[EngineMetrics], int | float | None],
) -> dict[EndpointId, float]:
    """``(max − v) / (max − min)`` over endpoints with a fresh value; all equal ⇒ 1.0."""
    values: dict[EndpointId, float] = {}
    for endpoint in endpoints:
        metrics = fresh_metrics(reader, endpoint.id)
        if metrics is not None and (v := value(metrics)) is not None:
            values[endpoint.id] = float(v)
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    if high == low:
        return dict.fromkeys(values, 1.0)
    return {ep: (high - v) / (high - low) for ep, v in values.items()}


class EngineMetricsScorer(Scorer, DataConsumer):
    """Base of the scorers that read the engine-metrics store (and nothing else)."""

    def __init__(self, name: str, metrics: EngineMetricsReader) -> None:
        self.name = name
        self.metrics = metrics

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> Self:
        return cls(name, services.engine_metrics)

    def consumes(self) -> tuple[Consumes, ...]:
        return (Consumes(ENGINE_METRICS),)
