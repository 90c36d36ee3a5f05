"""The frame fuzzer over real ZMQ sockets on loopback, in both subscription modes: invalid
messages from a publisher — malformed frames and payloads, and real-looking batches under
implausible sequence frames — change nothing in the index, every one is counted, the ingestion
thread stays up, and the engine's next real batch is applied. The session summary prints
"index changed by invalid input" per mode."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fault_tally as tally
import pytest
import zmq
from fault_frames import MODEL, implausible_seq_messages, invalid_messages, valid_chain, why
from hypothesis import given
from hypothesis import strategies as st
from integration.transport.kv_transport_helpers import FAST, Publisher, free_port, wait_until

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig, PodDiscoveryConfig
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport import ZmqTransport
from ppc_extproc.framework import Endpoint
from ppc_extproc.index import InMemoryIndex

pytestmark = pytest.mark.integration

IP = "127.0.9.1"
POD = f"{IP}:8000"
TOPIC = f"kv@{POD}@{MODEL}".encode()
#: Counters that one received message increments exactly once, whatever happens to it next.
RECEIVED = ("messages", "bad_frames", "bad_seq", "bad_topic", "topic_not_in_pool")


@dataclass
class Rig:
    transport: ZmqTransport
    applier: EventApplier
    publisher: Publisher
    mode: str
    sent: int = 0

    def received(self) -> int:
        stats = self.applier.stats.transport
        first = sum(n for (_, name), n in list(stats.items()) if name in RECEIVED)
        # A central message whose topic is foreign or broken is counted once as such, never as "messages".
        return first

    def settle(self) -> None:
        wait_until(lambda: self.received() >= self.sent, timeout=30, what="every message received",
                   context=lambda: dict(self.applier.stats.transport))
        assert self.transport.wait_idle(10)


@pytest.fixture(scope="module", params=["per-endpoint", "central"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    context: zmq.Context[Any] = zmq.Context()
    applier = EventApplier(InMemoryIndex(size=100_000), TokenProcessor(), IngestStats())
    central = request.param == "central"
    publisher = None
    transport = None
    try:
        if central:
            port = free_port()
            config = KVEventsConfig(zmq_endpoint=f"tcp://127.0.0.1:{port}", topic_filter="", discover_pods=False)
            transport = ZmqTransport(config, applier, applier.stats, FAST)
            transport.start()
            transport.add_endpoint(Endpoint(IP, 8000)).result(5)
            publisher = Publisher(context, IP, topic=TOPIC, connect=f"tcp://127.0.0.1:{port}")
        else:
            publisher = Publisher(context, IP, topic=TOPIC)
            assert publisher.port is not None
            config = KVEventsConfig(topic_filter="", pod_discovery=PodDiscoveryConfig(socket_port=publisher.port))
            transport = ZmqTransport(config, applier, applier.stats, FAST)
            transport.start()
            transport.add_endpoint(Endpoint(IP, 8000)).result(5)
        publisher.wait_subscribed()
        rig = Rig(transport, applier, publisher, request.param)
        for seq in range(3):
            publisher.send(valid_chain(0x100 * (seq + 1), 1000 * (seq + 1))[0], seq=seq)
            rig.sent += 1
        rig.settle()
        assert len(applier.index) == 6
        yield rig
    finally:
        if transport is not None:
            transport.stop(5)
            assert not transport.running
        if publisher is not None:
            publisher.close()
        context.destroy(linger=0)


@tally.campaign(40)
@given(messages=st.lists(invalid_messages(POD) | implausible_seq_messages(POD), min_size=1, max_size=20))
def test_invalid_messages_over_sockets_leave_the_index_unchanged(rig: Rig, messages: list[list[bytes]]) -> None:
    index = rig.applier.index
    before = index.snapshot()
    explained = why(rig.applier.stats)
    for frames in messages:
        rig.publisher.send_raw(frames)
    rig.sent += len(messages)
    rig.settle()
    assert rig.transport.running
    assert index.snapshot() == before
    assert why(rig.applier.stats) - explained >= len(messages)
    assert rig.applier.stats.transport.get((POD, "restarts_detected"), 0) == 0
    assert rig.applier.stats.transport.get(("unknown", "internal_errors"), 0) == 0
    assert rig.applier.stats.transport.get((POD, "internal_errors"), 0) == 0
    tally.add(f"KV frames, ZMQ {rig.mode}: invalid messages", len(messages))
    tally.add(f"KV frames, ZMQ {rig.mode}: index changed by invalid input", 0)


def test_the_engine_is_still_indexed_after_the_fuzzing(rig: Rig) -> None:
    payload, tokens = valid_chain(0x900, 9000)
    rig.publisher.send(payload, seq=3)
    rig.sent += 1
    rig.settle()
    keys = rig.applier.processor.keys(tokens, MODEL)
    assert len(rig.applier.index.lookup(keys, [POD])) == 2
    assert [s.last_seq for s in rig.transport.sources()] == [3]
