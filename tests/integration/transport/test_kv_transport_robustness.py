"""Bad input and busy sources: the thread survives, counts, and stays fair."""

from __future__ import annotations

import os
import threading
from typing import Any

import msgpack
import zmq
from kv_transport_helpers import MODEL, Publisher, free_port, holds, wait_until
from kv_transport_wire import MAP_STORED_H0_H1, TOKENS_1_32, batch, chain, stored

from ppc_extproc.events.apply import EventApplier

#: Payloads that must each be dropped as a whole (counted as ``bad_payload``).
BAD_PAYLOADS = [
    b"",
    b"\xc1",  # never-used msgpack byte
    os.urandom(64) + b"\xc1",
    msgpack.packb({"ts": 1.0, "events": []}),  # a map, not an array
    msgpack.packb([1.0]),  # too short
    msgpack.packb(["yesterday", []]),  # ts not a number
    msgpack.packb([1.0, {"not": "a list"}]),
    msgpack.packb([1.0, [], -1]),  # negative rank
    b"\xdd\xff\xff\xff\xff" + b"\x00" * 16,  # array32 claiming 4 billion elements, truncated
    b"\x93\xcb" + b"\x00" * 3,  # truncated float
]
#: Batches whose events are all skipped (unknown tag, wrong types): applied as empty.
SKIPPED_EVENTS = [
    msgpack.packb([1.0, [["BlockExploded", [1, 2]]], 0]),
    msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": "nope", "token_ids": [], "block_size": 16}], 0]),
    msgpack.packb([1.0, [["BlockStored", [1], None, ["x"] * 16, 16]], 0]),
    msgpack.packb([1.0, [42, None, "str"], 0]),
    msgpack.packb([1.0, [["BlockRemoved", [b""]]], 0]),
]


def test_garbage_flood_leaves_the_thread_alive_and_the_index_unchanged(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    pub = Publisher(zctx, "127.0.5.1")
    transport = make_transport(socket_port=pub.port, tuning=_quiet())
    transport.add_endpoint(pub.endpoint)
    pub.wait_subscribed()
    pub.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, pub.endpoint_id, TOKENS_1_32) == 2, what="baseline")
    size = len(applier.index)

    rounds = 200
    for _ in range(rounds):
        for frames in (
            [pub.topic],  # 1 frame
            [pub.topic, b"\x00" * 8],  # 2 frames
            [pub.topic, b"\x00" * 8, b"x", b"y"],  # 4 frames
            [pub.topic, b"\x01\x02", MAP_STORED_H0_H1],  # short seq frame
            [pub.topic, b"123456789", MAP_STORED_H0_H1],  # long seq frame (llm-d would read 8 bytes)
        ):
            pub.send_raw(frames)
        for payload in BAD_PAYLOADS + SKIPPED_EVENTS:
            pub.send(payload)  # consecutive seqs, only bad content
    last, tokens = chain(0x77, 2, 9000)
    pub.send(last)
    wait_until(lambda: holds(applier, pub.endpoint_id, tokens) == 2, what="a good batch after the flood")

    endpoint = pub.endpoint_id
    transport_counts = applier.stats.transport
    assert transport.running
    assert len(applier.index) == size + 2
    assert holds(applier, endpoint, TOKENS_1_32) == 2
    assert transport_counts[(endpoint, "bad_frames")] == 3 * rounds
    assert transport_counts[(endpoint, "bad_seq")] == 2 * rounds
    assert transport_counts[(endpoint, "bad_payload")] == len(BAD_PAYLOADS) * rounds
    assert transport_counts[(endpoint, "no_usable_events")] == len(SKIPPED_EVENTS) * rounds
    # The garbage moved nothing: the good batch after it is a gap over every garbage seq.
    assert transport_counts[(endpoint, "gaps")] == 1
    assert transport_counts[(endpoint, "gap_messages")] == (len(BAD_PAYLOADS) + len(SKIPPED_EVENTS)) * rounds
    assert transport_counts[(endpoint, "restarts_detected")] == 0
    assert transport_counts.get((endpoint, "internal_errors"), 0) == 0
    dropped = applier.stats.dropped
    assert dropped[(endpoint, "unknown_event_tag")] == rounds
    assert dropped[(endpoint, "bad_msgpack")] >= rounds
    assert (
        sum(n for (ep, _), n in dropped.items() if ep == endpoint) >= (len(BAD_PAYLOADS) + len(SKIPPED_EVENTS)) * rounds
    )
    assert transport.sources()[0].last_seq == (len(BAD_PAYLOADS) + len(SKIPPED_EVENTS)) * rounds + 1
    pub.close()


def test_garbage_in_central_mode_is_counted_unattributed(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    from ppc_extproc.framework import Endpoint

    port = free_port()
    transport = make_transport(central=f"tcp://127.0.0.1:{port}", topic_filter="", tuning=_quiet())
    transport.add_endpoint(Endpoint("10.1.0.1", 8000)).result(5)
    pub = Publisher(zctx, "10.1.0.1", topic=f"kv@10.1.0.1:8000@{MODEL}".encode(), connect=f"tcp://127.0.0.1:{port}")
    pub.wait_subscribed()
    for _ in range(50):
        pub.send_raw([b"\xff\xfe"])  # one frame
        pub.send_raw([b"\xff\xfe", b"\x00" * 8, MAP_STORED_H0_H1])  # topic not UTF-8
        pub.send_raw([b"", b"\x00" * 8, MAP_STORED_H0_H1])  # vLLM's default empty topic
        pub.send_raw([b"kv@@m", b"\x00" * 8, MAP_STORED_H0_H1])  # empty pod id
    pub.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "10.1.0.1:8000", TOKENS_1_32) == 2, what="good message")
    assert transport.running
    assert applier.stats.transport[("unknown", "bad_frames")] == 50
    assert applier.stats.transport[("unknown", "bad_topic")] == 150
    assert [s.endpoint for s in transport.sources()] == ["10.1.0.1:8000"]
    pub.close()


def test_a_flooding_source_does_not_starve_the_others(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    busy = Publisher(zctx, "127.0.5.2")
    quiet = Publisher(zctx, "127.0.5.3", busy.port)
    transport = make_transport(socket_port=busy.port)
    transport.add_endpoint(busy.endpoint)
    transport.add_endpoint(quiet.endpoint)
    busy.wait_subscribed()
    quiet.wait_subscribed()
    # Stall the ingestion thread inside its first batch, so the whole flood queues up first.
    gate, stalled = threading.Event(), threading.Event()
    apply_batch = applier.apply_batch

    def gated(endpoint: str, model: str, events: Any) -> None:
        if not gate.is_set():
            stalled.set()
            gate.wait(10)
        apply_batch(endpoint, model, events)

    applier.apply_batch = gated
    flood = 20_000
    payload = batch([stored([1, 2, 3, 4], list(range(1, 65)))])
    busy.send(payload)
    assert stalled.wait(5)
    for _ in range(flood - 1):
        busy.send(payload)
    quiet.send(MAP_STORED_H0_H1)
    gate.set()
    wait_until(lambda: holds(applier, quiet.endpoint_id, TOKENS_1_32) == 2, what="quiet source served")
    assert applier.stats.transport[(busy.endpoint_id, "messages")] < flood // 2
    wait_until(
        lambda: applier.stats.transport[(busy.endpoint_id, "messages")] == flood,
        timeout=30,
        what="flood drained",
    )
    assert applier.stats.transport[(busy.endpoint_id, "gaps")] == 0
    busy.close()
    quiet.close()


def _quiet() -> Any:
    """The test tuning, with repeated warnings rate-limited as in production."""
    from dataclasses import replace

    from kv_transport_helpers import FAST

    return replace(FAST, log_interval_seconds=10.0)


def test_central_bind_is_retried_with_backoff_until_the_port_is_free(
    zctx: zmq.Context[Any], applier: EventApplier, make_transport: Any
) -> None:
    from ppc_extproc.framework import Endpoint

    squatter = zctx.socket(zmq.PULL)
    port = squatter.bind_to_random_port("tcp://127.0.0.1")
    transport = make_transport(central=f"tcp://127.0.0.1:{port}", tuning=_quiet())
    transport.add_endpoint(Endpoint("10.2.0.1", 8000)).result(5)
    wait_until(lambda: applier.stats.transport.get(("unknown", "socket_errors"), 0) >= 2, what="bind retried")
    assert transport.running
    squatter.close(0)
    # Connect only once the SUB is bound (the wake-up socket plus the central SUB): an engine that
    # connects while the squatter is still closing can lose its first connection attempt.
    wait_until(lambda: transport.diagnostics()["sockets"] >= 2, timeout=10, what="central SUB bound")
    pub = Publisher(zctx, "10.2.0.1", connect=f"tcp://127.0.0.1:{port}")
    pub.wait_subscribed(10)
    pub.send(MAP_STORED_H0_H1)
    wait_until(lambda: holds(applier, "10.2.0.1:8000", TOKENS_1_32) == 2, what="bound and ingesting")
    pub.close()
