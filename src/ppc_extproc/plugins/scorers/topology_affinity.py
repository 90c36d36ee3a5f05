"""``topology-affinity-scorer``: prefer prefill candidates close to the endpoint already picked.

Type        ``topology-affinity-scorer`` (scorer)
Formula     by the tightest level a candidate shares with the peer endpoint (the decode pick a
            P/D handler publishes): host 1.0, rack 0.2, zone 0.05, region 0.02, none 0; no peer,
            or no topology on either side ⇒ 0
Consumes    ``Topology/<topologyProducerName>`` (optional)
Parameters  ``topologyProducerName`` [``topology-extractor``]

    plugins:
    - type: topology-extractor
    - type: topology-affinity-scorer
    schedulingProfiles:
    - name: prefill
      plugins: [{pluginRef: prefill-filter}, {pluginRef: topology-affinity-scorer, weight: 1}]

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/scorer/topologyaffinity/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import Consumes, DataConsumer, Endpoint, SchedulingContext, Scorer
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.filters.topology_affinity import peer_topology
from ppc_extproc.plugins.producers.topology_extractor import TOPOLOGY, TOPOLOGY_EXTRACTOR, Level, compare
from ppc_extproc.plugins.registry import Services, register

__all__ = ["LEVEL_SCORES", "TopologyAffinityScorer"]

LEVEL_SCORES = {Level.HOST: 1.0, Level.RACK: 0.2, Level.ZONE: 0.05, Level.REGION: 0.02, Level.NONE: 0.0}


@dataclass(frozen=True, slots=True)
class TopologyAffinityScorerConfig:
    producer: str = param("topologyProducerName", "")


@register("topology-affinity-scorer")
class TopologyAffinityScorer(Scorer, DataConsumer):
    def __init__(self, name: str = "topology-affinity-scorer", producer: str = "") -> None:
        self.name = name
        self.producer = producer or TOPOLOGY_EXTRACTOR
        self.key = TOPOLOGY.of(self.producer)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> TopologyAffinityScorer:
        return cls(name, decode(params, TopologyAffinityScorerConfig).producer)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(TOPOLOGY, self.producer, required=False),)

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        peer = peer_topology(ctx, self.producer)
        if peer is None:
            return {e.id: 0.0 for e in endpoints}
        return {e.id: LEVEL_SCORES[compare(peer, ctx.endpoint_value(e.id, self.key))] for e in endpoints}
