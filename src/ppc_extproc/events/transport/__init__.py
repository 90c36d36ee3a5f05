"""KV-event transport: ZMQ subscribers feeding the applier on a background thread.

``create_transport(config, applier, stats)`` returns a ``ZmqTransport`` (central mode when
``zmq_endpoint`` is set, per-endpoint subscribers when ``discover_pods``) or, with neither, a
``NullTransport``. Both satisfy ``EventTransport``.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig
from ppc_extproc.events.stats import IngestStats, SourceState
from ppc_extproc.events.transport.policy import ReplayPolicy, TransportTuning
from ppc_extproc.events.transport.zmq_transport import ZmqTransport

if TYPE_CHECKING:
    from ppc_extproc.events.transport.source import EventEndpoint

__all__ = [
    "EventTransport",
    "NullTransport",
    "ReplayPolicy",
    "TransportTuning",
    "ZmqTransport",
    "create_transport",
]


class EventTransport(Protocol):
    """What the producer drives: lifecycle plus discovery's add/update/delete."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def add_endpoint(self, endpoint: EventEndpoint) -> Future[None]: ...

    def remove_endpoint(self, endpoint: EventEndpoint) -> Future[None]: ...

    def wait_idle(self, timeout: float = 5.0) -> bool: ...

    def sources(self) -> list[SourceState]: ...


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


class NullTransport:
    """No subscribers: deleted endpoints are cleared at once."""

    def __init__(self, applier: EventApplier) -> None:
        self.applier = applier

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def add_endpoint(self, endpoint: EventEndpoint) -> Future[None]:
        return _done()

    def remove_endpoint(self, endpoint: EventEndpoint) -> Future[None]:
        self.applier.forget_endpoint(endpoint.id)
        return _done()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        return True

    def sources(self) -> list[SourceState]:
        return []


def create_transport(
    config: KVEventsConfig,
    applier: EventApplier,
    stats: IngestStats,
    tuning: TransportTuning | None = None,
) -> EventTransport:
    """The transport for ``config``; nothing starts until ``start()``."""
    if not config.zmq_endpoint and not config.discover_pods:
        return NullTransport(applier)
    return ZmqTransport(config, applier, stats, tuning)
