"""A KV-event transport on loopback with one engine publisher, in either subscription mode, for
the adversarial KV-event tests: ``open_rig("per-endpoint" | "central")``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
from integration.transport.kv_transport_helpers import FAST, Publisher, free_port, wait_until

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import KVEventsConfig, PodDiscoveryConfig
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport import ZmqTransport
from ppc_extproc.framework import Endpoint
from ppc_extproc.index import InMemoryIndex

MODEL = "m"
IP = "127.0.9.2"
POD = f"{IP}:8000"
TOPIC = f"kv@{POD}@{MODEL}".encode()
MODES = ["per-endpoint", "central"]
#: Counters that one received message increments exactly once, whatever happens to it next.
RECEIVED = ("messages", "bad_frames", "bad_seq", "bad_topic", "topic_not_in_pool")


def chain(first_hash: int, first_token: int, *, medium: str = "GPU", n_blocks: int = 2) -> tuple[bytes, list[int]]:
    """A batch storing ``n_blocks`` 16-token blocks from the root, and its tokens."""
    tokens = list(range(first_token, first_token + 16 * n_blocks))
    event: list[Any] = ["BlockStored", list(range(first_hash, first_hash + n_blocks)), None, tokens, 16, None, medium]
    return bytes(msgpack.packb([1700000000.0, [event], 0])), tokens


def all_cleared() -> bytes:
    return bytes(msgpack.packb([1700000000.0, [["AllBlocksCleared"]], 0]))


@dataclass
class Rig:
    context: zmq.Context[Any]
    transport: ZmqTransport
    applier: EventApplier
    engine: Publisher
    central_address: str = ""
    sent: int = 0
    extra: list[Publisher] = field(default_factory=list)

    def send(self, payload: bytes, seq: int | None = None) -> int:
        self.sent += 1
        return self.engine.send(payload, seq=seq)

    def send_raw(self, frames: list[bytes], publisher: Publisher | None = None) -> None:
        self.sent += 1
        (publisher or self.engine).send_raw(frames)

    def foreign(self) -> Publisher:
        """A second publisher on the engine's topic (central mode: another connection)."""
        assert self.central_address
        pub = Publisher(self.context, IP, topic=TOPIC, connect=self.central_address)
        self.extra.append(pub)
        pub.wait_subscribed()
        return pub

    def received(self) -> int:
        stats = self.applier.stats.transport
        return sum(n for (_, name), n in list(stats.items()) if name in RECEIVED)

    def settle(self, timeout: float = 60) -> None:
        wait_until(lambda: self.received() >= self.sent, timeout=timeout, what="every message received",
                   context=lambda: dict(self.applier.stats.transport))
        assert self.transport.wait_idle(30)

    def blocks(self, tokens: list[int]) -> int:
        """Leading blocks of ``tokens`` the index holds for the pod."""
        keys = self.applier.processor.keys(tokens, MODEL)
        found = self.applier.index.lookup(keys, [POD])
        n = 0
        while n < len(keys) and keys[n] in found:
            n += 1
        return n

    def count(self, name: str) -> int:
        return int(self.applier.stats.transport.get((POD, name), 0))


@contextmanager
def open_rig(mode: str, *, index_size: int = 1_000_000) -> Iterator[Rig]:
    """The transport in ``mode`` with the engine publisher subscribed; everything closed after."""
    context: zmq.Context[Any] = zmq.Context()
    applier = EventApplier(InMemoryIndex(size=index_size), TokenProcessor(), IngestStats())
    transport = None
    rig = None
    try:
        central = ""
        if mode == "central":
            central = f"tcp://127.0.0.1:{free_port()}"
            config = KVEventsConfig(zmq_endpoint=central, topic_filter="", discover_pods=False)
            transport = ZmqTransport(config, applier, applier.stats, FAST)
            transport.start()
            transport.add_endpoint(Endpoint(IP, 8000)).result(5)
            engine = Publisher(context, IP, topic=TOPIC, connect=central)
        else:
            engine = Publisher(context, IP, topic=TOPIC)
            assert engine.port is not None
            config = KVEventsConfig(topic_filter="", pod_discovery=PodDiscoveryConfig(socket_port=engine.port))
            transport = ZmqTransport(config, applier, applier.stats, FAST)
            transport.start()
            transport.add_endpoint(Endpoint(IP, 8000)).result(5)
        rig = Rig(context, transport, applier, engine, central)
        rig.extra.append(engine)
        engine.wait_subscribed()
        yield rig
    finally:
        if transport is not None:
            transport.stop(5)
            assert not transport.running
        for pub in rig.extra if rig is not None else []:
            pub.close()
        context.destroy(linger=0)
