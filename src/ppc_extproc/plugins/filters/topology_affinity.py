"""``topology-affinity-filter``: keep prefill candidates close to the endpoint already picked.

Type        ``topology-affinity-filter`` (filter)
Rule        with a peer endpoint (the decode pick a P/D handler publishes before the prefill
            profile runs) that has a topology: keep the candidates whose topology shares
            ``minAffinity`` or a tighter level with it (host < rack < zone < region). A candidate
            without topology is dropped. No peer, a peer without topology, or nothing kept ⇒
            every candidate passes (it fails open).
Consumes    ``Topology/<topologyProducerName>`` (optional)
Parameters  ``minAffinity`` [``host``; ``host``, ``rack``, ``zone`` or ``region``]
            ``topologyProducerName`` [``topology-extractor``]

    plugins:
    - type: topology-extractor
    - type: topology-affinity-filter
      parameters: {minAffinity: rack}
    schedulingProfiles:
    - name: prefill
      plugins: [{pluginRef: prefill-filter}, {pluginRef: topology-affinity-filter}]

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/filter/topologyaffinity/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.framework import DISAGG_PEER, Consumes, DataConsumer, Endpoint, Filter, SchedulingContext
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.producers.topology_extractor import (
    TOPOLOGY,
    TOPOLOGY_EXTRACTOR,
    Level,
    Topology,
    compare,
    parse_level,
)
from ppc_extproc.plugins.registry import Services, register

__all__ = ["TopologyAffinityFilter", "peer_topology"]


def peer_topology(ctx: SchedulingContext, producer: str) -> Topology | None:
    """The topology of the endpoint an earlier P/D stage picked, if both are known."""
    peer = ctx.get(DISAGG_PEER)
    return None if peer is None else ctx.endpoint_value(peer.id, TOPOLOGY.of(producer))


@dataclass(frozen=True, slots=True)
class TopologyAffinityFilterConfig:
    min_affinity: str = param("minAffinity", "host")
    producer: str = param("topologyProducerName", "")


@register("topology-affinity-filter")
class TopologyAffinityFilter(Filter, DataConsumer):
    def __init__(self, name: str = "topology-affinity-filter", min_affinity: Level = Level.HOST,
                 producer: str = "") -> None:  # fmt: skip
        self.name = name
        self.min_affinity = min_affinity
        self.producer = producer or TOPOLOGY_EXTRACTOR
        self.key = TOPOLOGY.of(self.producer)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> TopologyAffinityFilter:
        config = decode(params, TopologyAffinityFilterConfig)
        level = parse_level(config.min_affinity or "host", params.child_path("minAffinity"))
        return cls(name, level, config.producer)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return (Consumes(TOPOLOGY, self.producer, required=False),)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        peer = peer_topology(ctx, self.producer)
        if peer is None:
            return list(endpoints)
        kept = [e for e in endpoints if compare(peer, ctx.endpoint_value(e.id, self.key)) <= self.min_affinity]
        return kept or list(endpoints)
