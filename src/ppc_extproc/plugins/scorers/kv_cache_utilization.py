"""``kv-cache-utilization-scorer``: prefer endpoints with free KV-cache blocks.

Type        ``kv-cache-utilization-scorer`` (scorer)
Formula     ``1 − kv_usage``, ``kv_usage`` ∈ [0, 1]; absolute (equal usage ⇒ equal scores)
Inputs      ``vllm:kv_cache_usage_perc`` (older vLLM: ``vllm:gpu_cache_usage_perc``)
Missing     metrics missing or stale ⇒ the mean of the others' scores (``_engine``'s policy)
Parameters  none

    plugins:
    - type: kv-cache-utilization-scorer
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: kv-cache-utilization-scorer, weight: 2}]
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import register
from ppc_extproc.plugins.scorers._engine import EngineMetricsScorer, fresh_metrics, unknown_at_mean

__all__ = ["KVCacheUtilizationScorer"]


@register("kv-cache-utilization-scorer")
class KVCacheUtilizationScorer(EngineMetricsScorer):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        scores: dict[EndpointId, float] = {}
        for endpoint in endpoints:
            metrics = fresh_metrics(self.metrics, endpoint.id)
            if metrics is not None and metrics.kv_usage is not None:
                scores[endpoint.id] = 1.0 - metrics.kv_usage
        return unknown_at_mean(scores, endpoints)
