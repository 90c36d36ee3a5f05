"""``lora-affinity-scorer``: prefer endpoints that have the request's LoRA adapter loaded, or room for it.

Type        ``lora-affinity-scorer`` (scorer)
Formula     per endpoint, for the request's model (after any rewrite; a LoRA request names its
            adapter), in this order:
            1.0  the adapter is running there (``running_lora_adapters``)
            0.8  running + waiting adapters < ``max_lora`` (room to load one more)
            0.6  the adapter is waiting to be loaded there (``waiting_lora_adapters``)
            0.0  otherwise (full, or the engine exports no LoRA info)
Inputs      vLLM's ``vllm:lora_requests_info{running_lora_adapters, waiting_lora_adapters,
            max_lora}`` from the engine metrics source (the series with the newest creation time;
            ``loraSpec`` of ``core-metrics-extractor`` renames it)
Missing     metrics missing or stale ⇒ the mean of the others' scores (llm-d scores 0.0)
Parameters  none

    plugins:
    - type: lora-affinity-scorer
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: lora-affinity-scorer, weight: 1}]

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/lora_affinity.go``:
the room test comes before the waiting test, so an adapter waiting on an engine with room scores 0.8.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.enginemetrics import EngineMetrics
from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import register
from ppc_extproc.plugins.scorers._engine import EngineMetricsScorer, fresh_metrics, unknown_at_mean

__all__ = ["LoraAffinityScorer", "lora_score"]


def lora_score(metrics: EngineMetrics, model: str) -> float:
    """llm-d's four levels for ``model`` on one engine."""
    if model in metrics.active_models:
        return 1.0
    loaded = len(metrics.active_models) + len(metrics.waiting_models)
    if loaded < (metrics.max_active_models or 0):
        return 0.8
    if model in metrics.waiting_models:
        return 0.6
    return 0.0


@register("lora-affinity-scorer")
class LoraAffinityScorer(EngineMetricsScorer):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        model = ctx.request.model
        scores: dict[EndpointId, float] = {}
        for endpoint in endpoints:
            metrics = fresh_metrics(self.metrics, endpoint.id)
            if metrics is not None:
                scores[endpoint.id] = lora_score(metrics, model)
        return unknown_at_mean(scores, endpoints)
