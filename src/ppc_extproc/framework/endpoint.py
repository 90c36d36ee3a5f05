"""The domain ``Endpoint`` and the lifecycle events discovery publishes about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ppc_extproc.ids import EndpointId, endpoint_id

__all__ = ["Endpoint", "EndpointEvent", "EndpointEventKind"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One serving endpoint: a vLLM pod, or one data-parallel rank of it."""

    address: str
    port: int
    name: str = ""
    #: Data-parallel rank index: KV events come from ``socketPort + rank``.
    rank: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    #: ``ip:port`` (IPv6 unbracketed): the endpoint's key in the index and in every score map.
    id: EndpointId = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", endpoint_id(self.address, self.port))

    def label(self, key: str) -> str | None:
        """The value of label ``key``, or None when the endpoint does not carry it."""
        for name, value in self.labels:
            if name == key:
                return value
        return None


class EndpointEventKind(enum.Enum):
    ADDED = "add"
    UPDATED = "update"
    DELETED = "delete"


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """Discovery's news about one endpoint, delivered by the endpoint pool to its subscribers."""

    kind: EndpointEventKind
    endpoint: Endpoint
    #: For UPDATED: the endpoint as it was before.
    previous: Endpoint | None = None
