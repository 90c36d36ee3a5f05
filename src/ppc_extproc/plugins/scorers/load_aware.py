"""``load-aware-scorer``: an empty queue is good, a queue at the threshold is as bad as it gets.

Type        ``load-aware-scorer`` (scorer)
Formula     ``q == 0`` ⇒ 0.5; else ``0.5 × (1 − min(q, threshold) / threshold)``; at most 0.5
            (room above 0.5 is reserved upstream for "spare capacity"); absolute, not normalised
Inputs      ``vllm:num_requests_waiting`` from the engine metrics source
Missing     metrics missing or stale ⇒ the mean of the others' scores. llm-d reads a missing
            queue as 0 and scores it 0.5, the best value: an engine that never reports would win.
Parameters  ``threshold`` (int, default 128; ≤ 0 falls back to 128 with a warning, as llm-d's
            ``NewLoadAware`` does)

    plugins:
    - type: load-aware-scorer
      parameters: {threshold: 128}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.enginemetrics import EngineMetricsReader
from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.plugins.scorers._engine import EngineMetricsScorer, fresh_metrics, unknown_at_mean

__all__ = ["LoadAwareConfig", "LoadAwareScorer"]


@dataclass(frozen=True, slots=True)
class LoadAwareConfig:
    """The scorer's parameters (≤ 0 falls back to the default with a warning, as llm-d)."""

    threshold: int = param("threshold", 128)


@register("load-aware-scorer")
class LoadAwareScorer(EngineMetricsScorer):
    def __init__(self, name: str, metrics: EngineMetricsReader, threshold: int = 128) -> None:
        super().__init__(name, metrics)
        self.threshold = threshold

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> LoadAwareScorer:
        threshold = decode(params, LoadAwareConfig).threshold
        if threshold <= 0:
            params.warn("threshold", f"{threshold} should be positive; using the default 128 (as llm-d)")
            threshold = 128
        return cls(name, services.engine_metrics, threshold)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        scores: dict[EndpointId, float] = {}
        for endpoint in endpoints:
            metrics = fresh_metrics(self.metrics, endpoint.id)
            if metrics is None or metrics.waiting is None:
                continue
            q = metrics.waiting
            scores[endpoint.id] = 0.5 if q <= 0 else 0.5 * (1.0 - min(q, self.threshold) / self.threshold)
        return unknown_at_mean(scores, endpoints)
