"""Ordering and sequence tracking without replay: interleaved endpoints, gaps, engine restarts."""

from __future__ import annotations

from typing import Any

import pytest
import zmq
from kv_transport_helpers import Publisher, bad_frames, holds, wait_until
from kv_transport_wire import chain

from ppc_extproc.events.apply import EventApplier


def test_interleaved_endpoints_are_each_applied_in_order(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """Each batch's parent is the previous batch's last block: one batch applied out of order
    would drop every later block of that endpoint (unknown parent)."""
    first = Publisher(zctx, "127.0.1.1")
    pubs = [first] + [Publisher(zctx, f"127.0.1.{i}", first.port) for i in range(2, 6)]
    transport = make_transport(socket_port=first.port)
    for pub in pubs:
        transport.add_endpoint(pub.endpoint)
    for pub in pubs:
        pub.wait_subscribed()
    n_batches, per_batch = 150, 3
    tokens: dict[str, list[int]] = {pub.endpoint_id: [] for pub in pubs}
    parents: dict[str, int | None] = {pub.endpoint_id: None for pub in pubs}
    for i in range(n_batches):
        for k, pub in enumerate(pubs):
            first_hash = (k + 1) << 32 | i * per_batch
            payload, toks = chain(first_hash, per_batch, 1 + len(tokens[pub.endpoint_id]), parents[pub.endpoint_id])
            pub.send(payload)
            tokens[pub.endpoint_id] += toks
            parents[pub.endpoint_id] = first_hash + per_batch - 1
    for pub in pubs:
        wait_until(
            lambda: holds(applier, pub.endpoint_id, tokens[pub.endpoint_id]) == n_batches * per_batch,
            what=f"all blocks of {pub.endpoint_id}",
        )
        assert applier.stats.dropped.get((pub.endpoint_id, "unknown_parent"), 0) == 0
        assert applier.stats.transport[(pub.endpoint_id, "gaps")] == 0
    assert {s.endpoint: s.last_seq for s in transport.sources()} == {pub.endpoint_id: n_batches - 1 for pub in pubs}
    for pub in pubs:
        pub.close()


def test_gap_without_replay_is_counted_and_the_stream_continues(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.2.1")
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    a, tokens_a = chain(0xA0, 2, 1)
    lost, _ = chain(0xB0, 2, 1000)
    c, tokens_c = chain(0xC0, 2, 2000)
    pub.send(a)
    pub.skip(lost)  # seq 1 never reaches the subscriber (a PUB HWM drop)
    pub.send(c)
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens_c) == 2, what="batch after the gap")
    endpoint = pub.endpoint_id
    assert holds(applier, endpoint, tokens_a) == 2
    assert applier.stats.transport[(endpoint, "gaps")] == 1
    assert applier.stats.transport[(endpoint, "gap_messages")] == 1
    assert applier.stats.transport[(endpoint, "restarts_detected")] == 0
    assert transport.sources()[0].last_seq == 2
    pub.close()


def test_seq_regression_clears_the_endpoint_even_without_replay(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    """llm-d only notices restarts with replay configured (#2853); we always do."""
    pub = Publisher(zctx, "127.0.2.2")
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    old, old_tokens = chain(0xA0, 3, 1)
    for _ in range(3):
        pub.send(old)
    wait_until(lambda: transport.sources()[0].last_seq == 2, what="seq 2")
    assert holds(applier, pub.endpoint_id, old_tokens) == 3
    new, new_tokens = chain(0xD0, 2, 5000)
    pub.send(new, seq=0)  # same connection, counter back at 0
    wait_until(lambda: holds(applier, pub.endpoint_id, new_tokens) == 2, what="new blocks")
    assert holds(applier, pub.endpoint_id, old_tokens) == 0
    assert applier.stats.transport[(pub.endpoint_id, "restarts_detected")] == 1
    pub.close()


def restarted_after_two_blocks(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any, ip: str
) -> tuple[Publisher, list[int]]:
    """A publisher whose 2 blocks are indexed, then restarted on the same port; returns once the
    SUB has reconnected by itself (probe messages are counted as bad frames)."""
    pub = Publisher(zctx, ip)
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    old, old_tokens = chain(0xA0, 2, 1)
    pub.send(old)
    pub.send(old)
    wait_until(lambda: holds(applier, pub.endpoint_id, old_tokens) == 2, what="old blocks")

    pub.restart()
    pub.probe_until(lambda: bad_frames(applier, pub))
    return pub, old_tokens


def test_restarted_publisher_on_the_same_port_is_detected(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub, old_tokens = restarted_after_two_blocks(zctx, applier, make_transport, "127.0.2.3")
    new, new_tokens = chain(0xD0, 2, 5000)
    pub.send(new)  # seq 0
    wait_until(lambda: holds(applier, pub.endpoint_id, new_tokens) == 2, what="new blocks")
    assert holds(applier, pub.endpoint_id, old_tokens) == 0
    endpoint = pub.endpoint_id
    assert applier.stats.transport[(endpoint, "restarts_detected")] == 1
    assert applier.stats.transport[(endpoint, "reconnects")] == 1
    pub.close()


@pytest.mark.parametrize("lost", [0, 5], ids=["continuous", "lost-messages"])
def test_reconnect_to_the_same_stream_keeps_the_index(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any, lost: int
) -> None:
    """The publisher's socket goes away and comes back on the same port, continuing its seq. Any
    messages it published meanwhile are lost: without replay that is a gap, and the index stays
    (as llm-d keeps it) — vLLM never re-emits the blocks it still holds, so clearing here would
    drop hot prefixes for good (issue #11 F11). A restarted engine whose counter already passed
    ours looks the same as lost messages; only replay can tell them apart."""
    pub = Publisher(zctx, f"127.0.2.{5 + lost}")
    transport = make_transport(socket_port=pub.port)
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    a, tokens_a = chain(0xA0, 2, 1)
    pub.send(a)
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens_a) == 2, what="first blocks")
    pub.restart(keep_seq=True)
    pub.probe_until(lambda: bad_frames(applier, pub))
    for _ in range(lost):
        pub.skip(b"lost")
    b, tokens_b = chain(0xB0, 2, 3000, parent=0xA1)
    pub.send(b)
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens_a + tokens_b) == 4, what="chain continued")
    endpoint = pub.endpoint_id
    assert applier.stats.transport[(endpoint, "restarts_detected")] == 0
    assert applier.stats.transport[(endpoint, "reconnects")] == 1
    assert applier.stats.transport.get((endpoint, "gaps"), 0) == (1 if lost else 0)
    assert applier.stats.transport.get((endpoint, "gap_messages"), 0) == lost
    pub.close()
