"""KV-event transport: ZMQ subscribers feeding the applier on a background thread."""

from __future__ import annotations

from typing import Any

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig
from ppc_extproc.events.stats import IngestStats

__all__ = ["NullTransport", "create_transport"]


class NullTransport:
    """No subscribers: deleted endpoints are cleared at once."""

    def __init__(self, applier: EventApplier) -> None:
        self.applier = applier

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def add_endpoint(self, endpoint: Any) -> None:
        pass

    def remove_endpoint(self, endpoint: Any) -> None:
        self.applier.forget_endpoint(endpoint.id)


def create_transport(config: KVEventsConfig, applier: EventApplier, stats: IngestStats) -> Any:
    """The transport for ``config`` (placeholder until the ZMQ transport lands)."""
    return NullTransport(applier)
