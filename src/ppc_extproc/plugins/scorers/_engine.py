"""Shared parts of the scorers that read engine metrics (not a plugin).

Policy for every metrics-based scorer: an endpoint whose metrics are missing (no successful poll
yet: SGLang without ``--enable-metrics`` answers 404) or stale (no successful poll within the
staleness window) is **unknown**: it is scored with the mean of the candidates that have fresh
metrics, and min-max scorers leave it out of the min and max. So it keeps a share of the traffic
without attracting all of it, and a stale value cannot stretch the range. A fleet with no metrics
at all is not scored (the scorer does not influence the pick). llm-d scores from the last value
its datastore holds, zeros when it never had one (an engine that never reports looks idle); an
engine that cannot be reached is endpoint health's business, not the scorers'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Self

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsReader
from ppc_extproc.framework import ENGINE_METRICS, Consumes, DataConsumer, Endpoint, Scorer
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services

__all__ = ["EngineMetricsScorer", "fresh_metrics", "min_max_inverse", "unknown_at_mean"]


def fresh_metrics(reader: EngineMetricsReader, endpoint_id: str) -> EngineMetrics | None:
    """The endpoint's metrics, or None when missing or stale."""
    metrics = reader.snapshot(endpoint_id)
    if metrics is None or metrics.stale:
        return None
    return metrics


def unknown_at_mean(scores: dict[EndpointId, float], endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
    """``scores`` with every endpoint that has none given the mean of the others (none scored ⇒ {})."""
    if not scores or len(scores) == len(endpoints):
        return scores
    mean = sum(scores.values()) / len(scores)
    return {e.id: scores.get(e.id, mean) for e in endpoints}


def min_max_inverse(
    reader: EngineMetricsReader,
    endpoints: Sequence[Endpoint],
    value: Callable[[EngineMetrics], int | float | None],
) -> dict[EndpointId, float]:
    """``(max − v) / (max − min)`` over endpoints with a fresh value; all equal ⇒ 1.0; the others
    get the mean."""
    values: dict[EndpointId, float] = {}
    for endpoint in endpoints:
        metrics = fresh_metrics(reader, endpoint.id)
        if metrics is not None and (v := value(metrics)) is not None:
            values[endpoint.id] = float(v)
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    if high == low:
        return unknown_at_mean(dict.fromkeys(values, 1.0), endpoints)
    return unknown_at_mean({ep: (high - v) / (high - low) for ep, v in values.items()}, endpoints)


class EngineMetricsScorer(Scorer, DataConsumer):
    """Base of the scorers that read the engine-metrics store (and nothing else)."""

    def __init__(self, name: str, metrics: EngineMetricsReader) -> None:
        self.name = name
        self.metrics = metrics

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> Self:
        return cls(name, services.engine_metrics)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(ENGINE_METRICS),)
