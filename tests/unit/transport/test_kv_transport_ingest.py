"""Sequence tracking and replay decisions of the ingestor, without sockets.

The replay side is a recording stand-in for ``ReplayManager`` (the socket part is covered by
the integration tests); the applier and index are real.
"""

from __future__ import annotations

import msgpack
import structlog

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.frames import ReplayReply
from ppc_extproc.events.transport.ingest import Ingestor
from ppc_extproc.events.transport.policy import ReplayPolicy
from ppc_extproc.events.transport.ratelimit import RateLimitedLog
from ppc_extproc.events.transport.replay import Action, ReplaySession
from ppc_extproc.events.transport.source import ReplayKind, Source
from ppc_extproc.index import InMemoryIndex

EP = "10.0.0.5:8000"
TOPIC = b"kv@10.0.0.5:8000@m"


def stored(first_hash: int, first_token: int, parent: int | None = None) -> bytes:
    """One batch storing one 16-token block."""
    tokens = list(range(first_token, first_token + 16))
    event = ["BlockStored", [first_hash], parent, tokens, 16, None, "GPU"]
    return bytes(msgpack.packb([1700000000.0, [event], 0]))


def tokens(first_token: int) -> list[int]:
    return list(range(first_token, first_token + 16))


class FakeReplays:
    """Records requests; the test plays the ROUTER by calling the ingestor's callbacks."""

    def __init__(self) -> None:
        self.policy = ReplayPolicy(cooldown_seconds=30.0)
        self.sessions: list[ReplaySession] = []
        self.cancelled: list[ReplaySession] = []
        self.busy = False

    def request(self, source: Source, kind: ReplayKind, start: int) -> ReplaySession:
        session = ReplaySession(source, kind, start)
        source.replay = session
        source.state.replaying = True
        self.sessions.append(session)
        return session

    def cancel(self, session: ReplaySession) -> None:
        self.cancelled.append(session)
        session.source.replay = None


class Harness:
    def __init__(self, replay: bool, queue_size: int = 100) -> None:
        self.now = 0.0
        self.stats = IngestStats()
        self.applier = EventApplier(InMemoryIndex(size=10_000), TokenProcessor(), self.stats)
        self.ingest = Ingestor(
            self.applier,
            self.stats,
            engine_type="vllm",
            queue_size=queue_size,
            warn=RateLimitedLog(structlog.get_logger(), 0.0),
            clock=lambda: self.now,
        )
        self.replays = FakeReplays()
        if replay:
            self.ingest.replays = self.replays
        self.src = Source(EP, self.stats.source(EP), "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5559" if replay else "")

    def live(self, seq: int, payload: bytes) -> None:
        self.ingest.live(self.src, TOPIC, seq, payload)

    def reply(self, seq: int, payload: bytes, topic: bytes | None = TOPIC) -> Action:
        session = self.src.replay
        assert session is not None
        session.replies += 1
        return self.ingest.replay_reply(session, ReplayReply(topic, seq, payload))

    def end(self) -> Action:
        session = self.src.replay
        assert session is not None
        action = self.ingest.replay_end(session)
        if action is Action.FINISH:
            self.src.replay = None
            self.ingest.replay_finished(session, ok=True)
        return action

    def fail(self) -> None:
        session = self.src.replay
        assert session is not None
        self.src.replay = None
        self.ingest.replay_finished(session, ok=False)

    def holds(self, first_token: int) -> bool:
        keys = self.applier.processor.keys(tokens(first_token), "m")
        return bool(self.applier.index.lookup(keys, [EP]))

    def count(self, name: str) -> int:
        return int(self.stats.transport.get((EP, name), 0))


def test_in_order_messages_are_applied_and_tracked() -> None:
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    assert h.holds(100) and h.holds(200)
    assert h.src.last_seq == 1 and h.src.state.last_seq == 1
    assert h.count("batches") == 2 and h.count("gaps") == 0


def test_gap_without_replay_is_counted() -> None:
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(5, stored(2, 200))
    assert h.count("gaps") == 1 and h.count("gap_messages") == 4
    assert h.holds(200) and h.src.last_seq == 5


def test_regression_without_replay_clears_then_applies() -> None:
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.live(0, stored(3, 300))
    assert not h.holds(100) and not h.holds(200) and h.holds(300)
    assert h.count("restarts_detected") == 1 and h.src.last_seq == 0


def test_reconnect_without_replay_keeps_the_index_and_still_sees_a_restart() -> None:
    """llm-d keeps applying after a reconnect; vLLM does not re-emit the blocks it still holds,
    so clearing on a reconnect after lost messages would drop hot prefixes (issue #11 F11)."""
    h = Harness(replay=False)
    h.ingest.connected(h.src)
    h.live(0, stored(1, 100))
    h.ingest.disconnected(h.src)
    h.ingest.connected(h.src)
    h.live(1, stored(2, 200))  # the same stream continues
    assert h.holds(100) and h.count("restarts_detected") == 0
    h.ingest.disconnected(h.src)
    h.ingest.connected(h.src)
    h.live(9, stored(3, 300))  # messages were lost while disconnected: a gap, the index stays
    assert h.holds(100) and h.holds(200) and h.holds(300)
    assert h.count("restarts_detected") == 0 and h.count("gaps") == 1
    h.ingest.disconnected(h.src)
    h.ingest.connected(h.src)
    h.live(0, stored(4, 400))  # the counter went back: a restart
    assert not h.holds(100) and not h.holds(300) and h.holds(400) and h.count("restarts_detected") == 1


def test_bad_payload_is_counted_and_moves_nothing() -> None:
    h = Harness(replay=False)
    h.live(0, b"\xc1")
    assert h.src.last_seq is None
    h.live(1, stored(1, 100))
    assert h.count("bad_payload") == 1 and h.stats.dropped[(EP, "bad_msgpack")] == 1
    assert h.count("gaps") == 0 and h.holds(100)


def test_bad_topic_in_per_endpoint_mode_is_counted_per_message() -> None:
    h = Harness(replay=False)
    h.ingest.live(h.src, b"kv@no-model", 0, stored(1, 100))
    h.ingest.live(h.src, b"kv@no-model", 1, stored(2, 200))
    assert h.count("bad_topic") == 2
    assert not h.holds(100)  # indexed under model "" (as llm-d): never matches a request


def test_gap_with_replay_holds_live_messages_and_dedupes() -> None:
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(2, stored(3, 300, parent=2))
    (session,) = h.replays.sessions
    assert (session.kind, session.start) == (ReplayKind.GAP, 1)
    h.live(3, stored(4, 400, parent=3))
    assert len(h.src.held) == 2 and h.src.state.queue_depth == 2
    assert h.reply(1, stored(2, 200, parent=1)) is Action.CONTINUE
    assert h.reply(2, stored(3, 300, parent=2)) is Action.CONTINUE
    assert h.end() is Action.FINISH
    assert h.src.last_seq == 3 and not h.src.held
    assert h.count("held_duplicates") == 1 and h.count("replayed") == 2
    assert h.stats.dropped.get((EP, "unknown_parent"), 0) == 0


def test_first_contact_mid_stream_replays_from_zero() -> None:
    h = Harness(replay=True)
    h.live(7, stored(8, 800))
    (session,) = h.replays.sessions
    assert (session.kind, session.start) == (ReplayKind.FULL, 0)


def test_regression_with_replay_is_verified_then_clears_and_replays_from_zero() -> None:
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.live(0, stored(9, 900))
    # One frame proves nothing: the replay decides.
    assert h.holds(100) and h.count("restarts_detected") == 0
    (session,) = h.replays.sessions
    assert (session.kind, session.start) == (ReplayKind.VERIFY, 1)
    h.reply(0, stored(9, 900))  # the restarted engine's buffer starts at 0, not at our seq 1
    assert not h.holds(100) and h.count("restarts_detected") == 1
    h.end()
    assert h.holds(900) and h.src.last_seq == 0 and h.count("held_duplicates") == 1


def test_regression_refuted_by_the_replay_changes_nothing() -> None:
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.live(0, stored(9, 900))  # not this publisher's: it still has seq 1 with the same payload
    h.reply(1, stored(2, 200))
    h.end()
    assert h.holds(100) and h.holds(200) and not h.holds(900)
    assert h.count("restarts_detected") == 0 and h.src.last_seq == 1
    h.live(2, stored(3, 300))
    assert h.holds(300) and h.src.last_seq == 2


def test_implausible_jump_with_replay_is_verified_and_dropped() -> None:
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(2**62, stored(9, 900))
    (session,) = h.replays.sessions
    assert (session.kind, session.start) == (ReplayKind.VERIFY, 0)
    h.reply(0, stored(1, 100))
    h.end()
    assert not h.holds(900) and h.src.last_seq == 0
    assert h.stats.dropped[(EP, "seq_implausible")] == 1
    h.live(1, stored(2, 200))
    assert h.holds(100) and h.holds(200) and h.count("restarts_detected") == 0


def test_without_replay_a_restart_needs_a_second_signal() -> None:
    h = Harness(replay=False)
    for seq in range(5):
        h.live(seq, stored(seq + 1, 100 * (seq + 1)))
    h.live(2, stored(7, 700))  # back, alone: kept aside
    assert h.holds(100) and not h.holds(700) and h.count("restarts_detected") == 0
    h.live(3, stored(8, 800))  # the counter goes on from it: a restart
    assert h.count("restarts_detected") == 1 and not h.holds(100)
    assert h.holds(700) and h.holds(800) and h.src.last_seq == 3
    h.live(0, stored(9, 900))  # back to 0: the engine's counter starting again
    assert h.count("restarts_detected") == 2 and not h.holds(700) and h.holds(900)


def test_without_replay_suspects_are_refuted_by_the_stream_going_on() -> None:
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.live(2**62, stored(8, 800))
    h.live(1, stored(8, 800))
    h.live(2, stored(3, 300))
    assert h.holds(100) and h.holds(200) and h.holds(300) and not h.holds(800)
    assert h.stats.dropped[(EP, "seq_implausible")] == 2 and not h.src.suspects
    assert h.count("restarts_detected") == 0 and h.count("gaps") == 0


def test_a_long_gap_is_taken_once_the_stream_goes_on_from_it() -> None:
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(50_000, stored(5, 500))
    assert not h.holds(500)
    h.live(50_001, stored(6, 600))
    assert h.holds(100) and h.holds(500) and h.holds(600) and h.count("gaps") == 1


def test_a_short_gap_then_the_old_position_going_on_rewinds() -> None:
    """A foreign seq a little ahead is taken as a gap; the engine's own next seq then proves it
    was not the engine's, and nothing is cleared."""
    h = Harness(replay=False)
    h.live(0, stored(1, 100))
    h.live(10, stored(9, 900))
    h.live(1, stored(2, 200))
    h.live(2, stored(3, 300))
    assert h.holds(100) and h.holds(200) and h.holds(300)
    assert h.count("seq_rewound") == 1 and h.count("restarts_detected") == 0 and h.src.last_seq == 2


def test_replay_that_starts_after_the_gap_resynchronises() -> None:
    """The engine no longer retains the missed seqs: clear, then take what it retains."""
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(50, stored(5, 500))
    h.reply(40, stored(4, 400))
    assert h.count("replay_incomplete") == 1 and not h.holds(100) and h.holds(400)


def connected_with_replay(last: bytes) -> Harness:
    """A replaying source past its first contact, whose last applied message is ``last`` at seq 0."""
    h = Harness(replay=True)
    h.ingest.connected(h.src)
    h.replays.sessions.clear()
    h.src.replay = None
    h.live(0, last)
    return h


def test_verify_after_reconnect() -> None:
    last = stored(1, 100)
    h = connected_with_replay(last)
    # Same publisher: its seq 0 is our seq 0.
    h.ingest.connected(h.src)
    session = h.replays.sessions[-1]
    assert (session.kind, session.start) == (ReplayKind.VERIFY, 0)
    assert h.reply(0, last) is Action.CONTINUE and session.kind is ReplayKind.GAP
    h.reply(1, stored(2, 200))
    h.end()
    assert h.holds(100) and h.holds(200) and h.count("resyncs_verified") == 1
    # A different payload at our last seq: restarted, clear and ask from 0.
    h.ingest.connected(h.src)
    session = h.replays.sessions[-1]
    assert h.reply(1, stored(7, 700)) is Action.REREQUEST
    assert (session.kind, session.start) == (ReplayKind.FULL, 0)
    assert not h.holds(100) and h.count("restarts_detected") == 1
    # Nothing at or after our last seq: the new counter is behind ours.
    h.src.replay = None
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.ingest.connected(h.src)
    assert h.end() is Action.REREQUEST and h.count("restarts_detected") == 2


def test_failed_replay_cools_down_and_releases_held_messages() -> None:
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(2, stored(3, 300))
    h.fail()
    assert h.holds(300) and h.src.last_seq == 2
    h.live(5, stored(6, 600))  # cooling down: counted, not replayed
    assert len(h.replays.sessions) == 1 and h.count("gaps") == 2
    h.now = 31.0
    h.live(9, stored(10, 1000))
    assert len(h.replays.sessions) == 2


def test_full_hold_drops_and_resyncs_after_the_replay() -> None:
    h = Harness(replay=True, queue_size=2)
    h.live(0, stored(1, 100))
    h.live(2, stored(3, 300))  # replay from 1; seq 2 held
    h.live(3, stored(4, 400))  # held (2/2)
    h.live(4, stored(5, 500))  # dropped
    assert h.count("queue_overflow") == 1 and h.stats.dropped[(EP, "queue_overflow")] == 1
    h.reply(1, stored(2, 200))
    h.end()
    session = h.replays.sessions[-1]
    assert (session.kind, session.start) == (ReplayKind.GAP, 4)  # the dropped one, at once


def test_old_form_reply_before_any_topic_is_not_indexed() -> None:
    h = Harness(replay=True)
    h.ingest.connected(h.src)
    assert h.reply(0, stored(1, 100), topic=None) is Action.FINISH
    assert h.count("replay_topic_unknown") == 1 and not h.holds(100)


def test_remove_discards_held_messages_before_forgetting() -> None:
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(2, stored(3, 300))
    h.live(3, stored(4, 400))
    h.ingest.forget(h.src)
    assert h.replays.cancelled and h.count("discarded_on_remove") == 2
    assert not h.holds(100) and EP not in h.stats.sources


def test_gap_in_held_stream_after_replay() -> None:
    """Held messages are re-checked in order after the replay: a later gap starts another."""
    h = Harness(replay=True)
    h.live(0, stored(1, 100))
    h.live(2, stored(3, 300))
    h.live(5, stored(6, 600))
    h.reply(1, stored(2, 200))
    h.reply(2, stored(3, 300))
    h.end()
    session = h.replays.sessions[-1]
    assert (session.kind, session.start) == (ReplayKind.GAP, 3)
    assert [seq for _, seq, _ in h.src.held] == [5]


def test_live_copies_of_replayed_seqs_are_duplicates_not_a_restart() -> None:
    """The replay (DEALER) can overtake the live stream (SUB): copies of what it delivered that
    arrive afterwards are dropped; once the live stream passes them, going back is a restart."""
    h = Harness(replay=True)
    h.ingest.connected(h.src)  # replay from 0 on connect
    h.reply(0, stored(1, 100))
    h.reply(1, stored(2, 200))
    h.end()
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    assert h.count("live_duplicates") == 2 and h.count("restarts_detected") == 0
    h.live(2, stored(3, 300))
    assert h.holds(300) and h.src.last_seq == 2
    h.live(1, stored(9, 900))  # now a regression: verified from our last seq
    assert (h.src.replay is not None and h.src.replay.kind, h.src.replay.start) == (ReplayKind.VERIFY, 2)
    assert h.end() is Action.REREQUEST  # nothing from seq 2 on: the engine's counter is behind ours
    assert h.count("restarts_detected") == 1 and not h.holds(100)


def suspended(h: Harness) -> bool:
    return EP in h.stats.suspended and h.src.state.suspended


def test_a_disconnect_suspends_the_entries_until_the_stream_goes_on() -> None:
    h = Harness(replay=False)
    h.ingest.connected(h.src)
    h.live(0, stored(1, 100))
    assert not suspended(h)
    h.ingest.disconnected(h.src)
    assert suspended(h) and h.holds(100)  # kept, not trusted
    h.ingest.connected(h.src)
    assert suspended(h)  # a handshake proves nothing about the entries
    h.live(1, b"\xc1")
    assert suspended(h)  # nor does garbage
    h.live(1, stored(2, 200))
    assert not suspended(h) and h.holds(100) and h.holds(200)
    assert h.count("suspensions") == 1


def test_a_message_of_the_lost_connection_read_after_the_disconnect_does_not_lift_the_suspension() -> None:
    h = Harness(replay=False)
    h.ingest.connected(h.src)
    h.live(0, stored(1, 100))
    h.ingest.disconnected(h.src)
    h.live(1, stored(2, 200))  # queued before the connection dropped, read after (the batch window)
    assert suspended(h) and h.holds(200)
    h.ingest.connected(h.src)
    h.live(2, stored(3, 300))
    assert not suspended(h) and h.holds(300)


def test_a_restart_after_a_disconnect_clears_and_lifts_the_suspension() -> None:
    h = Harness(replay=False)
    h.ingest.connected(h.src)
    h.live(0, stored(1, 100))
    h.live(1, stored(2, 200))
    h.ingest.disconnected(h.src)
    h.ingest.connected(h.src)
    h.live(0, stored(3, 300))  # the restarted engine's first message
    assert not suspended(h) and not h.holds(100) and h.holds(300)


def test_a_verified_reconnect_lifts_the_suspension_a_mismatch_clears() -> None:
    last = stored(1, 100)
    h = connected_with_replay(last)
    h.ingest.disconnected(h.src)
    h.ingest.connected(h.src)
    assert suspended(h)
    h.reply(0, last)
    assert not suspended(h) and h.holds(100)
    h.end()
    h.ingest.disconnected(h.src)
    h.ingest.connected(h.src)
    h.reply(0, stored(7, 700))
    assert not suspended(h) and not h.holds(100)


def test_forgetting_an_endpoint_drops_its_suspension() -> None:
    h = Harness(replay=False)
    h.ingest.connected(h.src)
    h.live(0, stored(1, 100))
    h.ingest.disconnected(h.src)
    h.ingest.forget(h.src)
    assert EP not in h.stats.suspended
