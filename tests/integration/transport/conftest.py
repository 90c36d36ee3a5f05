"""Fixtures of the KV-event transport tests (helpers live in ``kv_transport_helpers.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import zmq
from kv_transport_helpers import FAST

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig, PodDiscoveryConfig
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport import TransportTuning, ZmqTransport
from ppc_extproc.index import InMemoryIndex


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def applier() -> EventApplier:
    return EventApplier(InMemoryIndex(size=1_000_000), TokenProcessor(), IngestStats())


@pytest.fixture
def make_transport(applier: EventApplier) -> Iterator[Callable[..., ZmqTransport]]:
    made: list[ZmqTransport] = []

    def make(
        *,
        socket_port: int = 5557,
        replay_port: int = 0,
        central: str = "",
        queue_size: int = 10_000,
        engine_type: str = "vllm",
        topic_filter: str = "kv@",
        tuning: TransportTuning = FAST,
        batch_window: float | None = None,
    ) -> ZmqTransport:
        config = KVEventsConfig(
            zmq_endpoint=central,
            topic_filter=topic_filter,
            engine_type=engine_type,
            discover_pods=not central,
            pod_discovery=PodDiscoveryConfig(socket_port=socket_port, replay_socket_port=replay_port),
            queue_size=queue_size,
        )
        if batch_window is not None:
            config = replace(config, batch_window_seconds=batch_window)
        transport = ZmqTransport(config, applier, applier.stats, tuning)
        transport.start()
        made.append(transport)
        return transport

    yield make
    for transport in made:
        transport.stop(5.0)
        assert not transport.running
