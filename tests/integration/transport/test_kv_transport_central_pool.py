"""Central mode accepts only the pool's endpoints (issue #11 F5): anyone who can reach the bound
port can publish, so topics naming anything else are counted and dropped, and keep no state —
no source, no per-pod counter, no metric label."""

from __future__ import annotations

from typing import Any

import zmq
from kv_transport_helpers import MODEL, Publisher, free_port, holds, wait_until
from kv_transport_wire import MAP_STORED_H0_H1, TOKENS_1_32

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.framework import Endpoint


def labels(applier: EventApplier) -> set[str]:
    """Every endpoint label the ingest counters (and so /metrics) carry."""
    stats = applier.stats
    return {ep for table in (stats.events, stats.dropped, stats.transport) for ep, _ in table} | set(stats.sources)


def test_a_flood_of_foreign_topics_keeps_no_state_and_locks_nobody_out(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    port = free_port()
    transport = make_transport(central=f"tcp://127.0.0.1:{port}")
    real = Endpoint("10.3.0.1", 8000)
    transport.add_endpoint(real).result(5)
    attacker = Publisher(zctx, "10.3.9.9", topic=b"kv@x@m", connect=f"tcp://127.0.0.1:{port}")
    attacker.wait_subscribed()
    # More bogus pod ids than the 4,096-entry topic table, then 100 pod ids of 64 KiB each.
    for i in range(4200):
        attacker.send_raw([f"kv@172.{16 + i // 250}.{i % 250}.1:8000@{MODEL}".encode(), i.to_bytes(8, "big"), MAP_STORED_H0_H1])
    for i in range(100):
        attacker.send_raw([b"kv@" + str(i).encode() * 65536 + b"@m", b"\x00" * 8, MAP_STORED_H0_H1])
    wait_until(
        lambda: applier.stats.transport[("unknown", "topic_not_in_pool")] == 4300,
        timeout=30,
        what="every foreign topic counted",
        context=lambda: dict(applier.stats.transport),
    )
    engine = Publisher(zctx, "10.3.0.1", connect=f"tcp://127.0.0.1:{port}")  # topic kv@10.3.0.1:8000@…
    engine.wait_subscribed()
    engine.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, real.id, TOKENS_1_32) == 2, what="the pool's engine is indexed")
    assert [s.endpoint for s in transport.sources()] == [real.id]
    assert labels(applier) == {"unknown", real.id}
    assert len(applier.index.registry) == 1  # one entry bit: the real engine's gpu tier
    attacker.close()
    engine.close()


def test_an_endpoint_added_later_is_accepted_from_then_on(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    port = free_port()
    transport = make_transport(central=f"tcp://127.0.0.1:{port}")
    engine = Publisher(zctx, "10.3.1.1", connect=f"tcp://127.0.0.1:{port}")
    engine.wait_subscribed()
    engine.send(MAP_STORED_H0_H1)
    wait_until(lambda: applier.stats.transport[("unknown", "topic_not_in_pool")] == 1, what="not yet in the pool")
    transport.add_endpoint(Endpoint("10.3.1.1", 8000)).result(5)
    engine.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "10.3.1.1:8000", TOKENS_1_32) == 2, what="accepted once in the pool")
    engine.close()
