"""Endpoint lifecycle (add/update/remove), bounded stop, and the producer's wiring."""

from __future__ import annotations

import time
from typing import Any

import zmq
from kv_transport_helpers import (
    MODEL,
    Publisher,
    ReplayRouter,
    free_port,
    holds,
    wait_until,
)
from kv_transport_wire import MAP_STORED_H0_H1, TOKENS_1_32, chain

from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig, PodDiscoveryConfig
from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind


def test_remove_closes_the_subscriber_and_clears_the_index(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.4.1")
    other = Publisher(zctx, "127.0.4.2", pub.port)
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    transport.add_endpoint(other.endpoint)
    pub.wait_subscribed()
    other.wait_subscribed()
    pub.send(MAP_STORED_H0_H1)
    other.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 2, what="pod 1")
    wait_until(lambda: holds(applier, other.endpoint_id, TOKENS_1_32) == 2, what="pod 2")

    transport.remove_endpoint(pub.endpoint).result(5)
    assert holds(applier, pub.endpoint_id, TOKENS_1_32) == 0
    assert holds(applier, other.endpoint_id, TOKENS_1_32) == 2
    assert [s.endpoint for s in transport.sources()] == [other.endpoint_id]
    # The SUB is gone: the publisher sees the unsubscription, later messages reach nobody.
    assert pub.sock.poll(5000) and pub.sock.recv() == b"\x00kv@"
    pub.send(MAP_STORED_H0_H1)
    assert transport.wait_idle(5)
    assert holds(applier, pub.endpoint_id, TOKENS_1_32) == 0
    assert applier.stats.transport.get((pub.endpoint_id, "messages")) == 1
    pub.close()
    other.close()


def test_remove_discards_messages_held_for_a_replay(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """llm-d bug B16: entries re-added by still-queued events after the delete."""
    pub = Publisher(zctx, "127.0.4.3")
    replay_port = free_port("127.0.4.3")
    router = ReplayRouter(zctx, pub, replay_port)
    transport = make_transport(socket_port=pub.port, replay_port=replay_port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    wait_until(lambda: applier.stats.transport.get((pub.endpoint_id, "replays_ok")), what="connect replay")
    router.mute = True  # the next replay never ends: live messages stay held
    pub.send(chain(0xA0, 1, 1)[0])
    pub.skip(chain(0xB0, 1, 100)[0])
    for i in range(5):
        pub.send(chain(0xC0 + i, 1, 200 + 16 * i)[0])
    wait_until(lambda: transport.sources()[0].queue_depth == 5, what="5 held")
    transport.remove_endpoint(pub.endpoint).result(5)
    assert applier.stats.transport[(pub.endpoint_id, "discarded_on_remove")] == 5
    assert transport.sources() == []
    assert transport.wait_idle(5)
    assert len(applier.index) == 0
    router.close()
    pub.close()


def test_add_is_idempotent_and_a_changed_rank_recreates_the_subscriber(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    base = free_port("127.0.4.4")
    rank0 = Publisher(zctx, "127.0.4.4", base)
    rank1 = Publisher(zctx, "127.0.4.4", base + 1, topic=f"kv@127.0.4.4:8000@{MODEL}".encode())
    transport = make_transport(socket_port=base)
    endpoint = Endpoint("127.0.4.4", 8000)
    transport.add_endpoint(endpoint)
    transport.add_endpoint(endpoint).result(5)
    rank0.wait_subscribed()
    rank0.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "127.0.4.4:8000", TOKENS_1_32) == 2, what="indexed")
    assert applier.stats.transport.get(("127.0.4.4:8000", "connects")) == 1  # one SUB only

    transport.add_endpoint(Endpoint("127.0.4.4", 8000, rank=1)).result(5)
    assert holds(applier, "127.0.4.4:8000", TOKENS_1_32) == 0  # the old publisher's state is gone
    rank1.wait_subscribed()
    payload, tokens = chain(0x900, 2, 700)
    rank1.send(payload)
    wait_until(lambda: holds(applier, "127.0.4.4:8000", tokens) == 2, what="new publisher")
    assert transport.sources()[0].address == f"tcp://127.0.4.4:{base + 1}"
    rank0.close()
    rank1.close()


def test_stop_is_bounded_and_closes_every_socket(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pubs = [Publisher(zctx, "127.0.4.10")]
    pubs += [Publisher(zctx, f"127.0.4.{i}", pubs[0].port) for i in range(11, 14)]
    transport = make_transport(socket_port=pubs[0].port)
    for pub in pubs:
        transport.add_endpoint(pub.endpoint)
    for pub in pubs:
        pub.wait_subscribed()
    for pub in pubs:
        for _ in range(200):
            pub.send(MAP_STORED_H0_H1)  # a backlog while stopping
    started = time.monotonic()
    transport.stop(2.0)
    assert time.monotonic() - started < 2.0
    assert not transport.running
    for pub in pubs:  # every SUB closed: each publisher sees its subscriber leave
        assert pub.sock.poll(5000) and pub.sock.recv() == b"\x00kv@"
        pub.close()
    # After the thread ended a removal still forgets the endpoint, on the caller's thread.
    transport.remove_endpoint(pubs[0].endpoint).result(1)
    assert holds(applier, pubs[0].endpoint_id, TOKENS_1_32) == 0


def test_producer_drives_the_transport_from_discovery_events(zctx: zmq.Context[Any]) -> None:
    from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
    from ppc_extproc.plugins.producers.precise_prefix_cache_config import (
        PrecisePrefixCacheProducerConfig,
    )

    pub = Publisher(zctx, "127.0.4.20")
    config = PrecisePrefixCacheProducerConfig(
        kv_events=KVEventsConfig(pod_discovery=PodDiscoveryConfig(socket_port=pub.port or 0))
    )
    producer = PrecisePrefixCacheProducer(config=config)
    producer.start_transport()
    try:
        producer.extract(EndpointEvent(EndpointEventKind.ADDED, pub.endpoint))
        pub.wait_subscribed()
        pub.send(MAP_STORED_H0_H1)
        applier = producer.applier
        wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 2, what="indexed")
        producer.extract(EndpointEvent(EndpointEventKind.DELETED, pub.endpoint))
        wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 0, what="cleared on delete")
    finally:
        producer.stop_transport(5.0)
        pub.close()
