"""No invalid KV-event message changes the index, and the counters say why each was dropped —
through the real frame split, sequence tracking, decoder and applier (no sockets here; the
ZMQ variant is ``test_kv_frame_fuzz_sockets.py``)."""

from __future__ import annotations

import fault_tally as tally
import structlog
from fault_frames import MODEL, invalid_messages, valid_chain, why
from hypothesis import given
from hypothesis import strategies as st

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.frames import split_message
from ppc_extproc.events.transport.ingest import Ingestor
from ppc_extproc.events.transport.policy import ReplayPolicy
from ppc_extproc.events.transport.ratelimit import RateLimitedLog
from ppc_extproc.events.transport.replay import ReplaySession
from ppc_extproc.events.transport.source import ReplayKind, Source
from ppc_extproc.index import InMemoryIndex

POD = "10.0.0.5:8000"
TOPIC = f"kv@{POD}@{MODEL}".encode()


class Replays:
    """Stands in for the replay sockets: records requests (no invalid message may cause one)."""

    def __init__(self) -> None:
        self.policy = ReplayPolicy()
        self.requests: list[tuple[ReplayKind, int]] = []
        self.busy = False

    def request(self, source: Source, kind: ReplayKind, start: int) -> ReplaySession:
        self.requests.append((kind, start))
        session = ReplaySession(source, kind, start)
        source.replay = session
        return session

    def cancel(self, session: ReplaySession) -> None:
        session.source.replay = None


class Engine:
    """One endpoint's ingestion as the subscriber drives it, after three indexed batches."""

    def __init__(self, replay: bool) -> None:
        self.stats = IngestStats()
        self.applier = EventApplier(InMemoryIndex(size=100_000), TokenProcessor(), self.stats)
        self.ingest = Ingestor(
            self.applier, self.stats, engine_type="vllm", queue_size=100, warn=RateLimitedLog(structlog.get_logger(), 1e9)
        )
        self.replays = Replays()
        if replay:
            self.ingest.replays = self.replays  # type: ignore[assignment]
        self.src = Source(POD, self.stats.source(POD), "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5559" if replay else "")
        self.src.connected_once = True
        for seq in range(3):
            self.receive([TOPIC, seq.to_bytes(8, "big"), valid_chain(0x100 * (seq + 1), 1000 * (seq + 1))[0]])

    def receive(self, frames: list[bytes]) -> None:
        """What ``Subscribers._drain_sub`` does with one message."""
        message = split_message(frames)
        if isinstance(message, str):
            self.stats.count(POD, message)
            return
        self.stats.count(POD, "messages")
        self.ingest.live(self.src, *message)


@tally.campaign(150)
@given(messages=st.lists(invalid_messages(POD), min_size=1, max_size=12), replay=st.booleans())
def test_invalid_messages_leave_the_index_exactly_unchanged(messages: list[list[bytes]], replay: bool) -> None:
    engine = Engine(replay)
    index = engine.applier.index
    before = index.snapshot()
    requests = len(engine.replays.requests)
    for frames in messages:
        explained = why(engine.stats)
        engine.receive(frames)
        assert index.snapshot() == before, frames[:3]
        assert why(engine.stats) > explained, f"dropped without a reason: {frames!r:.300}"
        assert engine.src.last_seq == 2 and not engine.src.held
        tally.add("KV frames, no sockets: invalid messages")
        tally.add("KV frames, no sockets: index changed by invalid input", 0)
    assert len(engine.replays.requests) == requests
    assert engine.stats.transport.get((POD, "restarts_detected"), 0) == 0
    # The engine's own next batch is still in line and indexed.
    payload, tokens = valid_chain(0x900, 9000)
    engine.receive([TOPIC, (3).to_bytes(8, "big"), payload])
    keys = engine.applier.processor.keys(tokens, MODEL)
    assert len(index.lookup(keys, [POD])) == 2 and engine.src.last_seq == 3
