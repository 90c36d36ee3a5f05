"""Per-source sequence tracking, replay policy and application of batches to the index.

Every message of a source goes through ``live`` (from its SUB) or ``replay_reply`` (from its
replay); batches are decoded and applied strictly in sequence order. The rules follow llm-d's
(``llm-d/llm-d-router: pkg/kvevents/zmq_subscriber.go``), which follow vLLM's publisher (a seq
counter from 0 per engine, a replay ROUTER keeping recent batches):

* ``seq == last + 1``: apply (the fast path).
* first contact with ``seq > 0``: replay from 0 when the source has a replay endpoint, else apply.
* ``last + 1 < seq <= last + 1 + MAX_SEQ_JUMP`` (lost messages): replay from ``last + 1``, else
  count the gap and apply. The bound is vLLM's default replay buffer (``buffer_steps`` 10,000
  batches, ``vllm-project/vllm: vllm/config/kv_events.py``): a longer gap cannot be repaired.
* a restart is proven, never inferred from one frame: a seq that goes back, or jumps beyond the
  bound, is a suspect until a second signal confirms or the stream refutes it (``sequence.py``).
  So one corrupt sequence frame, or a foreign publisher's counter interleaved with the engine's,
  never clears an endpoint; both modes follow the same rules.
* a live message whose payload carries nothing applicable (it does not decode, or every event in
  it was skipped) decides nothing: it is counted and dropped without touching the sequence state.
  So garbage can neither clear an endpoint nor start a replay — nor, sent at ``last + 1``, make the
  engine's own next message look like a restart. (From a replay, the engine's own ROUTER, such a
  message still consumes its seq: replaying it again would not make it applicable.)
* while a replay runs or waits, live messages are held (bounded); they are applied after it,
  those the replay already delivered dropped. A full hold drops the newest, and the source is
  replayed from ``last + 1`` once the current replay ends. Live copies of replayed seqs that
  arrive after the replay (SUB and DEALER are separate channels) are duplicates, not a restart,
  until the live stream passes the replayed range.
* a reconnected subscriber is verified by replaying from ``last``: the same payload at ``last``
  means the same publisher; otherwise it restarted (clear, then everything from 0). Without
  replay (or when the verification fails) the index is kept and the stream goes on by the rules
  above, as llm-d does: a restart is still seen when the seq goes back, and lost messages are a
  gap. (vLLM does not re-emit the blocks it still holds, so clearing on a mere reconnect would
  drop hot prefixes for good. A restarted engine whose counter already passed ours cannot be told
  from lost messages without replay.)
* from the moment an established subscriber disconnects, the endpoint's entries are *suspended*:
  kept, but not matched (``IngestStats.suspended``), until a message proves them — the verify
  replay succeeds, or a live message is applied (the same publisher going on, or a restart that
  cleared the endpoint first). A message of the lost connection read after the disconnect proves
  nothing. A restarted engine therefore never gets traffic on entries its predecessor left,
  however late its subscriber reconnects.

Runs on the ingestion thread only (the applier is not thread-safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from ppc_extproc.errors import WireError
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.frames import ReplayReply, parse_topic
from ppc_extproc.events.transport.ratelimit import RateLimitedLog
from ppc_extproc.events.transport.replay import Action, ReplayManager, ReplaySession
from ppc_extproc.events.transport.restore import RestoreTable
from ppc_extproc.events.transport.sequence import MAX_SEQ_JUMP, SequenceChecks
from ppc_extproc.events.transport.source import ReplayKind, Source
from ppc_extproc.events.wire import EventBatch

__all__ = ["Ingestor"]

log = structlog.get_logger(__name__)


class Ingestor(SequenceChecks):
    """Applies the messages of many sources, each in order, with gap/restart handling."""

    def __init__(
        self,
        applier: EventApplier,
        stats: IngestStats,
        *,
        engine_type: str,
        queue_size: int,
        warn: RateLimitedLog,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.applier = applier
        self.stats = stats
        self.replays: ReplayManager | None = None
        self._engine_type = engine_type
        self._queue_size = max(1, queue_size)
        self._warn = warn
        self._clock = clock
        #: Positions of a loaded warm-restart snapshot, until their sources are added.
        self.restored = RestoreTable()

    # --- live messages -------------------------------------------------------------------------

    def live(self, src: Source, topic: bytes, seq: int, payload: bytes) -> None:
        """One message from ``src``'s subscriber."""
        src.state.last_message_monotonic = self._clock()
        if src.replay is not None:
            self._hold(src, (topic, seq, payload))
            return
        last = src.last_seq
        if last is not None and seq == last + 1:
            if src.replayed_to >= 0:
                src.replayed_to = -1  # the live stream has passed what the replay delivered
            if src.suspects:
                self._refute_suspects(src)
            self._apply(src, topic, seq, payload)
        elif 0 <= seq <= src.replayed_to:
            self.stats.count(src.endpoint, "live_duplicates")  # already applied by the replay
        else:
            self._out_of_line(src, topic, seq, payload)

    def _out_of_line(self, src: Source, topic: bytes, seq: int, payload: bytes, *, went_back: bool = False) -> None:
        """Not the next seq: gap, restart or first contact. ``went_back``: the live stream itself
        went backwards (a restart whatever ``last`` is)."""
        endpoint = src.endpoint
        batch = self._usable(src, seq, payload)
        if batch is None:
            return
        last = src.last_seq
        replay = self._can_replay(src)
        src.replayed_to = -1
        if last is None:
            if seq > 0 and replay:
                self._hold_and_replay(src, (topic, seq, payload), ReplayKind.FULL, 0)
                return
        elif seq <= last or went_back or seq > last + 1 + MAX_SEQ_JUMP:
            self._suspect(src, (topic, seq, payload), batch, replay, went_back)
            return
        elif seq > last + 1:
            if src.gap_counted_at != seq:  # not the held trigger of a failed replay
                self._count_gap(src, seq)
            if replay:
                self._hold_and_replay(src, (topic, seq, payload), ReplayKind.GAP, last + 1)
                return
            self._warn.warning("kv_seq_gap", endpoint, last_seq=last, seq=seq)
            self._note_gap(src, last)
        self._apply(src, topic, seq, payload, batch)

    def _restart(self, src: Source, seq: int, reason: str) -> None:
        self.stats.count(src.endpoint, "restarts_detected")
        log.warning(
            "kv_publisher_restarted",
            endpoint=src.endpoint,
            last_seq=src.last_seq,
            seq=seq,
            reason=reason,
        )
        self._clear(src)

    def _clear(self, src: Source) -> None:
        self.applier.clear_endpoint(src.endpoint)
        self.stats.count(src.endpoint, "clears")
        self.stats.suspend(src.state, False)  # nothing stale is left
        src.replayed_to = -1
        src.last_seq = None
        src.last_payload = b""
        src.before_gaps.clear()
        src.recent.clear()
        src.verified = False
        src.state.last_seq = None

    # --- warm restart ------------------------------------------------------------------------

    def adopt(self, src: Source) -> None:
        """A new source: continue from its restored position when the snapshot has one for the
        same publisher (``restore.py``); drop the restored part when the addresses changed."""
        part = self.restored.take(src.endpoint)
        if part is None:
            return
        if (part.address, part.replay_address) != (src.address, src.replay_address):
            log.info("warm_restart_part_dropped", endpoint=src.endpoint, reason="publisher_changed")
            self._clear(src)
            return
        src.last_seq = part.last_seq
        src.last_payload = part.last_payload
        src.state.last_seq = part.last_seq
        if part.topic:
            self._learn_topic(src, part.topic)
        src.connected_once = True  # the first handshake is then verified like a reconnect
        self.stats.count(src.endpoint, "warm_restored")
        self.stats.suspend(src.state, True)

    def expire_restored(self, now: float) -> None:
        """Drop the restored parts of endpoints that did not come back in time."""
        for endpoint in self.restored.expired(now):
            self.applier.forget_endpoint(endpoint)
            self.stats.forget(endpoint)

    # --- connection events ---------------------------------------------------------------------

    def connected(self, src: Source) -> None:
        """The subscriber completed a handshake with the publisher."""
        first = not src.connected_once
        src.connected_once = True
        src.replayed_to = -1  # a new connection: nothing old can arrive on it
        self.stats.set_connected(src.state, True)
        self.stats.count(src.endpoint, "connects" if first else "reconnects")
        if not first:
            log.info("kv_subscriber_reconnected", endpoint=src.endpoint, last_seq=src.last_seq)
        replays = self.replays
        if replays is None or not self._can_replay(src):
            return  # without replay the stream goes on: its next seq decides (module docstring)
        if src.last_seq is None:
            if src.replay is None and (not first or replays.policy.replay_on_connect):
                replays.request(src, ReplayKind.FULL, 0)
        elif not first:
            if src.replay is not None:
                replays.cancel(src.replay)
            replays.request(src, ReplayKind.VERIFY, src.last_seq)

    def disconnected(self, src: Source) -> None:
        self.stats.set_connected(src.state, False)
        self.stats.count(src.endpoint, "disconnects")
        if not src.state.suspended:
            self.stats.count(src.endpoint, "suspensions")
            self.stats.suspend(src.state, True)
        self._warn.info("kv_subscriber_disconnected", src.endpoint, last_seq=src.last_seq)

    # --- replays -------------------------------------------------------------------------------

    def _can_replay(self, src: Source) -> bool:
        return self.replays is not None and bool(src.replay_address) and self._clock() >= src.cooldown_until

    def _hold_and_replay(self, src: Source, msg: tuple[bytes, int, bytes], kind: ReplayKind, start: int) -> None:
        if src.topic is None:  # old-form replies carry no topic: take the model from this one
            self._learn_topic(src, msg[0])
        src.held.appendleft(msg)  # it precedes anything still held
        src.state.queue_depth = len(src.held)
        assert self.replays is not None
        self.replays.request(src, kind, start)

    def _hold(self, src: Source, msg: tuple[bytes, int, bytes]) -> None:
        if len(src.held) >= self._queue_size:
            src.overflowed = True
            self.stats.count(src.endpoint, "queue_overflow")
            self.stats.drop(src.endpoint, "queue_overflow")
            return
        if src.topic is None:
            self._learn_topic(src, msg[0])
        src.held.append(msg)
        src.state.queue_depth = len(src.held)

    def replay_reply(self, session: ReplaySession, reply: ReplayReply) -> Action:
        src = session.source
        if session.replies == 1:  # first reply of this attempt
            if session.kind is ReplayKind.VERIFY:
                if reply.seq == session.start and src.last_seq == session.start:
                    if reply.payload == src.last_payload:
                        session.kind = ReplayKind.GAP  # same publisher: just catch up
                        src.verified = True
                        self.stats.count(src.endpoint, "resyncs_verified")
                        self.stats.suspend(src.state, False)
                        return Action.CONTINUE
                    self._restart(src, reply.seq, "payload_mismatch")
                    session.kind, session.start = ReplayKind.FULL, 0
                    return Action.REREQUEST
                # ``last`` is no longer retained: the stream is all the publisher still has.
                self._restart(src, reply.seq, "unverifiable")
                session.kind = ReplayKind.FULL
            elif session.start > 0 and reply.seq > session.start:
                # The publisher no longer has what we miss: resynchronise to what it retains.
                self.stats.count(src.endpoint, "replay_incomplete")
                self._warn.warning("kv_replay_incomplete", src.endpoint, wanted=session.start, first=reply.seq)
                self._clear(src)
        last = src.last_seq
        if last is not None and reply.seq <= last:
            self.stats.count(src.endpoint, "replay_duplicates")
            return Action.CONTINUE
        topic = reply.topic if reply.topic is not None else src.topic
        if topic is None:
            # Old-form reply before any live message: the model is unknown, and indexing under a
            # wrong model would poison parent chains. The first live message replays again.
            self.stats.count(src.endpoint, "replay_topic_unknown")
            return Action.FINISH
        self.stats.count(src.endpoint, "replayed")
        self._apply(src, topic, reply.seq, reply.payload, replayed=True)
        src.replayed_to = reply.seq
        return Action.CONTINUE

    def replay_end(self, session: ReplaySession) -> Action:
        src = session.source
        if session.kind is ReplayKind.VERIFY and session.replies == 0:
            # Nothing from ``last`` on: the publisher's counter is below ours, it restarted.
            self._restart(src, -1, "counter_behind")
            session.kind, session.start = ReplayKind.FULL, 0
            return Action.REREQUEST
        return Action.FINISH

    def replay_finished(self, session: ReplaySession, ok: bool) -> None:
        src = session.source
        if not ok:
            src.cooldown_until = self._clock() + (
                self.replays.policy.cooldown_seconds if self.replays is not None else 0.0
            )
        self.release(src)

    def release(self, src: Source) -> None:
        """Apply what was held during a replay, in arrival order, skipping what it delivered."""
        held = src.held
        previous: int | None = None
        while held and src.replay is None:
            topic, seq, payload = held.popleft()
            last = src.last_seq
            if previous is not None and seq <= previous:
                self._out_of_line(src, topic, seq, payload, went_back=True)
            elif last is not None and seq <= last:
                self.stats.count(src.endpoint, "held_duplicates")
            elif last is not None and seq == last + 1:
                self._apply(src, topic, seq, payload)
            else:
                self._out_of_line(src, topic, seq, payload)
            if src.last_seq == seq:  # applied (a refuted suspect does not move the stream)
                previous = seq
        src.state.queue_depth = len(held)
        if src.replay is None and src.overflowed:
            src.overflowed = False
            if src.last_seq is not None and self._can_replay(src):
                assert self.replays is not None
                self.replays.request(src, ReplayKind.GAP, src.last_seq + 1)

    def forget(self, src: Source) -> None:
        """The endpoint is gone: drop its replay and held messages, then its index entries."""
        self._discard(src)
        self.applier.remove_endpoint(src.endpoint)

    def reset(self, src: Source) -> None:
        """The endpoint's publisher changed (new address): start over from an empty index."""
        self._discard(src)
        self._clear(src)

    def _discard(self, src: Source) -> None:
        src.suspects.clear()
        if src.replay is not None and self.replays is not None:
            self.replays.cancel(src.replay)
        if src.held:
            self.stats.count(src.endpoint, "discarded_on_remove", len(src.held))
            src.held.clear()
            src.state.queue_depth = 0

    # --- applying ------------------------------------------------------------------------------

    @staticmethod
    def _learn_topic(src: Source, topic: bytes) -> None:
        src.topic = topic
        parsed = parse_topic(topic)
        src.topic_ok = parsed is not None
        src.model = parsed.model if parsed is not None else ""

    def _model(self, src: Source, topic: bytes) -> str:
        """The model segment of ``topic`` (parsed once per topic change); "" if it is malformed."""
        if topic != src.topic:
            self._learn_topic(src, topic)
        if not src.topic_ok:
            self.stats.count(src.endpoint, "bad_topic")
            self._warn.warning("kv_bad_topic", src.endpoint, topic=topic[:200].hex())
        return src.model

    def _usable(self, src: Source, seq: int, payload: bytes) -> EventBatch | None:
        """The batch of ``payload``; None, counted, when it carries nothing applicable: it does not
        decode (``bad_payload`` and the decoder's reason) or every event was skipped
        (``no_usable_events`` and each event's reason)."""
        endpoint = src.endpoint
        try:
            batch = decode_batch(payload, self._engine_type)
        except WireError as exc:
            self.stats.count(endpoint, "bad_payload")
            self.stats.drop(endpoint, exc.reason)
            self._warn.warning("kv_batch_dropped", endpoint, reason=exc.reason, seq=seq)
            return None
        if batch.skipped and not batch.events:
            self.stats.count(endpoint, "no_usable_events")
            for reason in batch.skipped:
                self.stats.drop(endpoint, reason)
            self._warn.warning("kv_events_skipped", endpoint, reasons=sorted(set(batch.skipped)), seq=seq)
            return None
        return batch

    def _apply(
        self,
        src: Source,
        topic: bytes,
        seq: int,
        payload: bytes,
        batch: EventBatch | None = None,
        *,
        replayed: bool = False,
    ) -> None:
        """Apply the message at ``seq`` (``batch``: its payload, when already decoded). A live
        message with nothing applicable is dropped here, before it can move the stream position."""
        if batch is None:
            batch = self._usable(src, seq, payload)
            if batch is None and not replayed:
                return
        endpoint = src.endpoint
        src.last_seq = seq
        src.last_payload = payload
        if not replayed:
            src.verified = False
        self._remember(src, seq, payload)
        state = src.state
        state.last_seq = seq
        if batch is None:
            return
        model = src.model if topic == src.topic and src.topic_ok else self._model(src, topic)
        self.applier.apply_batch(endpoint, model, batch)
        if state.suspended and (replayed or state.connected):
            # A live message applied while disconnected came over the lost connection (read
            # after the disconnect was handled, e.g. within the batch window): it proves nothing
            # about the publisher there is now.
            self.stats.suspend(state, False)
        self.stats.count(endpoint, "batches")
        state.lag_seconds = time.time() - batch.ts
        if batch.skipped:
            self._warn.warning("kv_events_skipped", endpoint, reasons=sorted(set(batch.skipped)))
