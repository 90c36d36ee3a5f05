"""Warm restart over real ZMQ sockets without a replay socket: a restored part stays suspended until a
live message proves it (the next seq) or proves a restart (the counter from 0), and a part whose
endpoint never comes back is dropped after its TTL. (With replay: tests/reliability/test_warm_restart.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from kv_transport_helpers import Publisher, holds, wait_until
from kv_transport_wire import chain

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.snapshot_format import write_snapshot
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport import ZmqTransport
from ppc_extproc.events.warm_restart import config_hash, load_snapshot, take_snapshot
from ppc_extproc.index import InMemoryIndex

HASH = config_hash(TokenProcessor().config)


def _subscribed(pub: Publisher) -> None:
    """Wait for a new subscription (skipping the previous subscriber's unsubscription)."""
    while pub.wait_subscribed()[:1] != b"\x01":
        pass


def _fresh() -> EventApplier:
    return EventApplier(InMemoryIndex(size=100_000), TokenProcessor(), IngestStats())


def _snapshot_after_two_batches(
    pub: Publisher, applier: EventApplier, make_transport: Callable[..., ZmqTransport], path: Path
) -> list[int]:
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    b0, t0 = chain(0xA0, 2, 1)
    b1, t1 = chain(0xB0, 2, 1000, parent=0xA1)
    pub.send(b0)
    pub.send(b1)
    wait_until(lambda: holds(applier, pub.endpoint_id, t0 + t1) == 4, what="both batches applied")
    state = transport.on_thread(lambda sources: take_snapshot(applier, sources, HASH)).result(5)
    write_snapshot(path, state, 1 << 20)
    transport.stop(5.0)
    return t0 + t1


def _restarted(pub: Publisher, path: Path, ttl: float = 60.0) -> tuple[EventApplier, ZmqTransport, Any]:
    from kv_transport_helpers import FAST

    from ppc_extproc.events.config import KVEventsConfig, PodDiscoveryConfig

    applier = _fresh()
    config = KVEventsConfig(pod_discovery=PodDiscoveryConfig(socket_port=pub.port or 5557))
    transport = ZmqTransport(config, applier, applier.stats, FAST)
    loaded = load_snapshot(path, 1 << 20, HASH, applier, applier.stats, transport.restored, ttl)
    return applier, transport, loaded


def test_without_replay_the_restored_part_is_suspended_until_the_next_seq_proves_it(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any, tmp_path: Path
) -> None:
    pub = Publisher(zctx, "127.0.4.1")
    path = tmp_path / "snap"
    try:
        tokens = _snapshot_after_two_batches(pub, applier, make_transport, path)
        warm, transport, loaded = _restarted(pub, path)
        assert loaded is not None and loaded.endpoints == 1
        assert holds(warm, pub.endpoint_id, tokens) == 4  # blocks are back…
        assert pub.endpoint_id in warm.stats.suspended  # …but not matched yet
        transport.start()
        try:
            transport.add_endpoint(pub.endpoint)
            _subscribed(pub)
            assert pub.endpoint_id in warm.stats.suspended  # a connection proves nothing
            b2, t2 = chain(0xC0, 1, 2000, parent=0xB1)
            pub.send(b2)  # seq 2 == last_seq + 1: the same stream goes on
            wait_until(lambda: pub.endpoint_id not in warm.stats.suspended, what="part proved")
            assert holds(warm, pub.endpoint_id, tokens + t2) == 5  # chained onto restored blocks
        finally:
            transport.stop(5.0)
    finally:
        pub.close()


def test_without_replay_a_restarted_engine_clears_the_restored_part(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any, tmp_path: Path
) -> None:
    pub = Publisher(zctx, "127.0.4.2")
    path = tmp_path / "snap"
    try:
        tokens = _snapshot_after_two_batches(pub, applier, make_transport, path)
        pub.restart()  # the engine restarted while the service was down: seq from 0
        warm, transport, _ = _restarted(pub, path)
        transport.start()
        try:
            transport.add_endpoint(pub.endpoint)
            _subscribed(pub)
            fresh, t_new = chain(0xD0, 1, 5000)
            pub.send(fresh)  # seq 0: a restart, proven by the counter from zero
            wait_until(lambda: holds(warm, pub.endpoint_id, t_new) == 1, what="new stream applied")
            assert holds(warm, pub.endpoint_id, tokens) == 0  # nothing of the old engine left
            assert pub.endpoint_id not in warm.stats.suspended
        finally:
            transport.stop(5.0)
    finally:
        pub.close()


def test_a_restored_part_whose_endpoint_never_returns_is_dropped_after_its_ttl(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any, tmp_path: Path
) -> None:
    pub = Publisher(zctx, "127.0.4.3")
    path = tmp_path / "snap"
    try:
        tokens = _snapshot_after_two_batches(pub, applier, make_transport, path)
        warm, transport, _ = _restarted(pub, path, ttl=0.2)
        assert holds(warm, pub.endpoint_id, tokens) == 4
        transport.start()
        try:
            wait_until(lambda: holds(warm, pub.endpoint_id, tokens) == 0, what="unclaimed part dropped")
            assert pub.endpoint_id not in warm.stats.suspended
        finally:
            transport.stop(5.0)
    finally:
        pub.close()
