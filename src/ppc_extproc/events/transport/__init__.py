"""KV-event transport: ZMQ subscribers feeding the applier on a background thread.

``create_transport(config, applier, stats)`` returns a ``ZmqTransport`` (central mode when
``zmq_endpoint`` is set, per-endpoint subscribers when ``discover_pods``) or, with neither, a
``NullTransport``. Both satisfy ``EventTransport``.
"""

from __future__ import annotations

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig
from ppc_extproc.events.null_transport import EventTransport, NullTransport
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.policy import ReplayPolicy, TransportTuning
from ppc_extproc.events.transport.zmq_transport import ZmqTransport

__all__ = [
    "EventTransport",
    "NullTransport",
    "ReplayPolicy",
    "TransportTuning",
    "ZmqTransport",
    "create_transport",
]


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
