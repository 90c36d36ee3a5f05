"""``running-requests-size-scorer``: prefer endpoints running fewer requests.

Type        ``running-requests-size-scorer`` (scorer)
Formula     ``(maxR − r) / (maxR − minR)``, min and max over the candidates with fresh metrics;
            all equal (or a single one) ⇒ 1.0
Inputs      ``vllm:num_requests_running`` from the engine metrics source
Missing     metrics missing or stale ⇒ the mean of the others' scores; left out of min/max
Parameters  none

    plugins:
    - type: running-requests-size-scorer
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import register
from ppc_extproc.plugins.scorers._engine import EngineMetricsScorer, min_max_inverse

__all__ = ["RunningRequestsScorer"]


@register("running-requests-size-scorer")
class RunningRequestsScorer(EngineMetricsScorer):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        return min_max_inverse(self.metrics, endpoints, lambda m: m.running)
