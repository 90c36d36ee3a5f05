"""``active-request-scorer``: prefer endpoints with fewer requests this service has in flight.

Type        ``active-request-scorer`` (scorer)
Formula     c = in-flight requests on the endpoint (routed by this replica, response not finished);
            c ≤ idleThreshold ⇒ 1.0; else (maxC − c) / maxC × maxBusyScore   (maxC over candidates)
Consumes    ``InFlightLoadDataKey/<inFlightLoadProducerName>`` (no engine metrics: it reacts
            within the same millisecond); the loader adds an ``inflight-load-producer`` when none
            of that name is configured. Without the view (its producer failed) every count is 0.
Parameters  ``idleThreshold`` [0], ``maxBusyScore`` [1.0, in [0, 1]],
            ``inFlightLoadProducerName`` [inflight-load-producer]

    plugins:
    - type: active-request-scorer
      parameters: {idleThreshold: 0, maxBusyScore: 1.0}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import IN_FLIGHT_LOAD, Consumes, DataConsumer, Endpoint, SchedulingContext, Scorer
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.producers.inflight_load import INFLIGHT_LOAD_PRODUCER
from ppc_extproc.plugins.registry import Services, register

__all__ = ["ActiveRequestConfig", "ActiveRequestScorer"]


@dataclass(frozen=True, slots=True)
class ActiveRequestConfig:
    """The scorer's parameters."""

    idle_threshold: int = param("idleThreshold", 0, minimum=0)
    max_busy_score: float = param("maxBusyScore", 1.0, minimum=0.0, maximum=1.0)
    inflight_producer: str = param("inFlightLoadProducerName", "")
    #: Deprecated in llm-d; accepted with a warning.
    request_timeout: str = param("requestTimeout", "")


@register("active-request-scorer")
class ActiveRequestScorer(Scorer, DataConsumer):
    def __init__(
        self,
        name: str,
        idle_threshold: int = 0,
        max_busy_score: float = 1.0,
        inflight_producer: str = "",
    ) -> None:
        self.name = name
        self.load_key = IN_FLIGHT_LOAD.of(inflight_producer or INFLIGHT_LOAD_PRODUCER)
        self.idle_threshold = idle_threshold
        self.max_busy_score = max_busy_score

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> ActiveRequestScorer:
        config = decode(params, ActiveRequestConfig)
        if params.has("requestTimeout"):
            params.warn("requestTimeout", "deprecated and ignored: in-flight tracking ends with each response")
        return cls(name, config.idle_threshold, config.max_busy_score, config.inflight_producer)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(IN_FLIGHT_LOAD, self.load_key.producer),)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        load = ctx.get(self.load_key)
        counts = {e.id: load.requests(e.id) if load is not None else 0 for e in endpoints}
        max_count = max(counts.values(), default=0)
        scores = {}
        for ep, c in counts.items():
            if c <= self.idle_threshold or max_count == 0:
                scores[ep] = 1.0
            else:
                scores[ep] = (max_count - c) / max_count * self.max_busy_score
        return scores
