"""``active-request-scorer``: prefer endpoints with fewer requests this service has in flight.

Type        ``active-request-scorer`` (scorer)
Formula     c = in-flight requests on the endpoint (routed by this replica, response not finished);
            c ≤ idleThreshold ⇒ 1.0; else (maxC − c) / maxC × maxBusyScore   (maxC over candidates)
Inputs      the in-flight tracker (no engine metrics: it reacts within the same millisecond)
Parameters  ``idleThreshold`` [0], ``maxBusyScore`` [1.0, in [0, 1]],
            ``inFlightLoadProducerName`` (accepted; in-flight load is tracked by this service)

    plugins:
    - type: active-request-scorer
      parameters: {idleThreshold: 0, maxBusyScore: 1.0}
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, SchedulingContext, Scorer
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.inflight import InflightTracker

__all__ = ["ActiveRequestScorer"]


@register("active-request-scorer")
class ActiveRequestScorer(Scorer):
    def __init__(
        self,
        name: str,
        inflight: InflightTracker,
        idle_threshold: int = 0,
        max_busy_score: float = 1.0,
    ) -> None:
        self.name = name
        self.inflight = inflight
        self.idle_threshold = idle_threshold
        self.max_busy_score = max_busy_score

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> ActiveRequestScorer:
        params.string("inFlightLoadProducerName", "")  # accepted: in-flight load is tracked here
        if params.has("requestTimeout"):
            params.string("requestTimeout", "")
            params.warn("requestTimeout", "deprecated and ignored: in-flight tracking ends with each response")
        return cls(
            name,
            services.inflight,
            params.integer("idleThreshold", 0, minimum=0),
            params.number("maxBusyScore", 1.0, minimum=0.0, maximum=1.0),
        )

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        counts = {e.id: self.inflight.requests(e.id) for e in endpoints}
        max_count = max(counts.values(), default=0)
        scores = {}
        for ep, c in counts.items():
            if c <= self.idle_threshold or max_count == 0:
                scores[ep] = 1.0
            else:
                scores[ep] = (max_count - c) / max_count * self.max_busy_score
        return scores
