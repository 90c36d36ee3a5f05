"""``topology-extractor``: each endpoint's place in the cluster (host, rack, zone, region).

Type        ``topology-extractor`` (producer)
Produces    ``Topology/<name>`` per candidate endpoint: ``Topology(hostname, rack, zone, region)``
            read from the endpoint's labels (Kubernetes pod labels, or ``labels`` of a
            file-discovery entry); an endpoint carrying none of them gets no value
Parameters  the label to read for each level:
            ``hostname`` [``kubernetes.io/hostname``], ``rack`` [``topology.kubernetes.io/rack``],
            ``zone`` [``topology.kubernetes.io/zone``], ``region`` [``topology.kubernetes.io/region``]

    plugins:
    - type: topology-extractor
    - type: topology-affinity-filter
      parameters: {minAffinity: host}
    - type: topology-affinity-scorer

llm-d also takes the hostname from the pod's ``spec.hostname`` when no label carries it; discovery
here reads labels only. ``compare`` ranks two topologies: the tightest level they share (host <
rack < zone < region < none), as ``llm-d/llm-d-router:
pkg/epp/framework/plugins/scheduling/util/topology/level.go``. Follows
``pkg/epp/framework/plugins/datalayer/extractor/topology/extractor.go``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Consumes, DataKey, DataProducer, DataType, SchedulingContext
from ppc_extproc.framework.params import Section, decode, param
from ppc_extproc.plugins.registry import Services, register

__all__ = [
    "TOPOLOGY",
    "TOPOLOGY_EXTRACTOR",
    "Level",
    "Topology",
    "TopologyExtractor",
    "compare",
    "parse_level",
]

TOPOLOGY_EXTRACTOR = "topology-extractor"


@dataclass(frozen=True, slots=True)
class Topology:
    """Where an endpoint runs; an empty string is unknown at that level."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


#: Per-endpoint topology (``SchedulingContext.endpoint_value``), by the extractor's name.
TOPOLOGY: DataType[Topology] = DataType("Topology")


class Level(enum.IntEnum):
    """How close two endpoints are: lower is closer."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4


def parse_level(value: str, path: str) -> Level:
    """``host``, ``rack``, ``zone`` or ``region``; ``ConfigError`` at ``path`` otherwise."""
    for level in (Level.HOST, Level.RACK, Level.ZONE, Level.REGION):
        if level.name.lower() == value:
            return level
    raise ConfigError(path, f"invalid topology level {value!r}, must be one of host, rack, zone, region")


def compare(peer: Topology | None, candidate: Topology | None) -> Level:
    """The tightest level ``peer`` and ``candidate`` share (an unknown value never matches)."""
    if peer is None or candidate is None:
        return Level.NONE
    for level, a, b in (
        (Level.HOST, peer.hostname, candidate.hostname),
        (Level.RACK, peer.rack, candidate.rack),
        (Level.ZONE, peer.zone, candidate.zone),
        (Level.REGION, peer.region, candidate.region),
    ):
        if a and a == b:
            return level
    return Level.NONE


@dataclass(frozen=True, slots=True)
class TopologyExtractorConfig:
    """The label read for each level."""

    hostname: str = param("hostname", "kubernetes.io/hostname")
    rack: str = param("rack", "topology.kubernetes.io/rack")
    zone: str = param("zone", "topology.kubernetes.io/zone")
    region: str = param("region", "topology.kubernetes.io/region")


@register(TOPOLOGY_EXTRACTOR)
class TopologyExtractor(DataProducer):
    def __init__(self, name: str = TOPOLOGY_EXTRACTOR, config: TopologyExtractorConfig | None = None) -> None:
        self.name = name
        self.config = config or TopologyExtractorConfig()
        self.key = TOPOLOGY.of(name)

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> TopologyExtractor:
        config = decode(params, TopologyExtractorConfig)
        # An empty label name means the default, as llm-d's factory fills unset fields.
        defaults = TopologyExtractorConfig()
        config = TopologyExtractorConfig(
            config.hostname or defaults.hostname, config.rack or defaults.rack,
            config.zone or defaults.zone, config.region or defaults.region,
        )  # fmt: skip
        return cls(name, config)

    def consumes(self) -> tuple[Consumes[object], ...]:
        return ()

    def produces(self) -> frozenset[DataKey[object]]:
        return frozenset({self.key})

    def produce(self, ctx: SchedulingContext) -> None:
        c = self.config
        for endpoint in ctx.candidates:
            if not endpoint.labels:
                continue
            topology = Topology(
                endpoint.label(c.hostname) or "", endpoint.label(c.rack) or "",
                endpoint.label(c.zone) or "", endpoint.label(c.region) or "",
            )  # fmt: skip
            if topology != _UNKNOWN:
                ctx.put_endpoint_value(endpoint.id, self.key, topology)


_UNKNOWN = Topology()
