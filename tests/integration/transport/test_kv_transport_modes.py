"""Both subscription modes over real sockets: the spec's exact bytes reach the index."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zmq
from kv_transport_helpers import MODEL, Publisher, free_port, holds, wait_until
from kv_transport_wire import (
    ARRAY_STORED_H0_H1,
    H1,
    MAP_CLEARED,
    MAP_STORED_H0_H1,
    SGLANG_BATCH,
    TOKENS_1_32,
    batch,
    chain,
    removed,
)

from ppc_extproc.events.apply import EventApplier

#: BlockRemoved(h1) of the same eras: map (group 0, as §9.3's store) and 0.10.2–0.19 array (§9.6).
MAP_REMOVED_H1 = batch([removed([H1])])
ARRAY_REMOVED_H1 = msgpack.packb([1700000001.0, [["BlockRemoved", [H1], "GPU"]], 0])


@pytest.mark.parametrize(
    ("payload", "remove"),
    [(MAP_STORED_H0_H1, MAP_REMOVED_H1), (ARRAY_STORED_H0_H1, ARRAY_REMOVED_H1)],
    ids=["map", "array"],
)
def test_per_endpoint_spec_bytes_reach_the_index(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any, payload: bytes, remove: bytes
) -> None:
    pub = Publisher(zctx, "127.0.0.2")
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint).result(5)
    pub.wait_subscribed()

    pub.send(payload)
    wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 2, what="2 blocks indexed")
    state = next(s for s in transport.sources() if s.endpoint == pub.endpoint_id)
    assert state.last_seq == 0 and state.connected and state.queue_depth == 0
    assert state.address == f"tcp://127.0.0.2:{pub.port}"
    assert state.lag_seconds is not None  # ts 1700000000.5: a large but measured lag

    # BlockRemoved of the second block, then AllBlocksCleared.
    pub.send(remove)
    wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 1, what="block 1 removed")
    pub.send(MAP_CLEARED)
    wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 0, what="cleared")
    assert applier.stats.transport[(pub.endpoint_id, "messages")] == 3
    assert applier.stats.transport[(pub.endpoint_id, "gaps")] == 0
    pub.close()


def test_per_endpoint_attributes_events_to_the_endpoint_not_the_topic(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """The topic's pod id (here without a port) is ignored; the model segment is used."""
    pub = Publisher(zctx, "127.0.0.3", topic=f"kv@10.9.9.9@{MODEL}".encode())
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    pub.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "127.0.0.3:8000", TOKENS_1_32) == 2, what="indexed")
    assert holds(applier, "10.9.9.9", TOKENS_1_32) == 0
    pub.close()


def test_per_endpoint_uses_socket_port_plus_rank(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    from ppc_extproc.framework import Endpoint

    base = free_port("127.0.0.4")
    rank1 = Publisher(zctx, "127.0.0.4", base + 1, topic=f"kv@127.0.0.4:8001@{MODEL}".encode())
    transport = make_transport(socket_port=base)
    transport.add_endpoint(Endpoint("127.0.0.4", 8001, rank=1))
    rank1.wait_subscribed()
    rank1.send(batch([], rank=1))  # an empty batch still advances the sequence
    payload, tokens = chain(0x100, 3, 500)
    rank1.send(payload)
    wait_until(lambda: holds(applier, "127.0.0.4:8001", tokens) == 3, what="rank-1 blocks")
    assert transport.sources()[0].address == f"tcp://127.0.0.4:{base + 1}"
    rank1.close()


def test_sglang_payload_over_the_wire(zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any) -> None:
    pub = Publisher(zctx, "127.0.0.5")
    transport = make_transport(socket_port=pub.port, engine_type="sglang")
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    pub.send(SGLANG_BATCH)
    endpoint = pub.endpoint_id
    wait_until(lambda: applier.stats.events.get((endpoint, "AllBlocksCleared")), what="SGLang batch applied")
    assert applier.stats.events[(endpoint, "BlockStored")] == 1
    assert applier.stats.events[(endpoint, "BlockRemoved")] == 1
    assert applier.stats.transport[(endpoint, "bad_payload")] == 0
    pub.close()


def test_central_mode_takes_the_endpoint_from_the_topic(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    from ppc_extproc.framework import Endpoint

    port = free_port()
    transport = make_transport(central=f"tcp://127.0.0.1:{port}")
    for ip in ("10.0.0.5", "10.0.0.6", "10.0.0.7"):
        transport.add_endpoint(Endpoint(ip, 8000)).result(5)  # the pool, as discovery reports it
    a = Publisher(zctx, "10.0.0.5", topic=f"kv@10.0.0.5:8000@{MODEL}".encode(), connect=f"tcp://127.0.0.1:{port}")
    b = Publisher(zctx, "10.0.0.6", topic=f"kv@10.0.0.6:8000@{MODEL}".encode(), connect=f"tcp://127.0.0.1:{port}")
    a.wait_subscribed()
    b.wait_subscribed()
    a.send(MAP_STORED_H0_H1)
    b.send(ARRAY_STORED_H0_H1)
    wait_until(lambda: holds(applier, "10.0.0.5:8000", TOKENS_1_32) == 2, what="pod a")
    wait_until(lambda: holds(applier, "10.0.0.6:8000", TOKENS_1_32) == 2, what="pod b")
    assert {s.endpoint for s in transport.sources()} == {"10.0.0.5:8000", "10.0.0.6:8000"}

    # Malformed topics are counted and dropped, never attributed.
    bad = Publisher(zctx, "10.0.0.7", topic=b"kv@10.0.0.7:8000", connect=f"tcp://127.0.0.1:{port}")
    bad.wait_subscribed()
    bad.send(MAP_STORED_H0_H1)
    extra = Publisher(zctx, "10.0.0.8", topic=b"kv@a@b@c", connect=f"tcp://127.0.0.1:{port}")
    extra.wait_subscribed()
    extra.send(MAP_STORED_H0_H1)
    wait_until(lambda: applier.stats.transport[("unknown", "bad_topic")] == 2, what="bad topics counted")
    assert {s.endpoint for s in transport.sources()} == {"10.0.0.5:8000", "10.0.0.6:8000"}

    # A pod id that is not a pool endpoint (here the old form without a port) is counted and
    # dropped, and leaves no source behind.
    legacy = Publisher(zctx, "10.0.0.9", topic=f"kv@10.0.0.9@{MODEL}".encode(), connect=f"tcp://127.0.0.1:{port}")
    legacy.wait_subscribed()
    legacy.send(MAP_STORED_H0_H1)
    wait_until(lambda: applier.stats.transport[("unknown", "topic_not_in_pool")] == 1, what="foreign pod id dropped")
    assert holds(applier, "10.0.0.9", TOKENS_1_32) == 0
    assert {s.endpoint for s in transport.sources()} == {"10.0.0.5:8000", "10.0.0.6:8000"}
    for pub in (a, b, bad, extra, legacy):
        pub.close()


def test_central_mode_remove_clears_and_ignores_the_pod_until_re_added(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    from ppc_extproc.framework import Endpoint

    port = free_port()
    transport = make_transport(central=f"tcp://127.0.0.1:{port}")
    endpoint = Endpoint("10.0.1.5", 8000)
    transport.add_endpoint(endpoint).result(5)
    pub = Publisher(zctx, "10.0.1.5", topic=f"kv@10.0.1.5:8000@{MODEL}".encode(), connect=f"tcp://127.0.0.1:{port}")
    pub.wait_subscribed()
    pub.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "10.0.1.5:8000", TOKENS_1_32) == 2, what="indexed")
    transport.remove_endpoint(endpoint).result(5)
    assert holds(applier, "10.0.1.5:8000", TOKENS_1_32) == 0
    pub.send(MAP_STORED_H0_H1)
    wait_until(
        lambda: applier.stats.transport[("unknown", "topic_not_in_pool")] == 1,
        what="message of a removed pod dropped",
    )
    assert holds(applier, "10.0.1.5:8000", TOKENS_1_32) == 0
    assert transport.sources() == []
    transport.add_endpoint(endpoint).result(5)
    pub.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "10.0.1.5:8000", TOKENS_1_32) == 2, what="re-added")
    pub.close()
