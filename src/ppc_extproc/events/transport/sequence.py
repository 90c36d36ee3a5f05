"""Implausible sequence numbers: a restart is proven, never inferred from one frame.

vLLM's publisher numbers its batches from 0, +1 each, and keeps the last ``buffer_steps``
(default 10,000) for replay (``vllm-project/vllm: vllm/distributed/kv_events.py``,
``vllm/config/kv_events.py``). So a seq that goes back (``seq <= last``) or jumps more than
``MAX_SEQ_JUMP`` ahead is a *suspect*: the message is kept aside and nothing is cleared.

* With a replay endpoint, a verify replay from ``last`` decides: the publisher still has ``last``
  with the same payload ⇒ the suspect was not its message (dropped, ``seq_implausible``); else
  it restarted ⇒ clear, replay from 0 (the ingestor's replay callbacks).
* Without one, the suspect is confirmed by the engine's counter starting again from 0 (a seq of
  0) or by the stream going on from it (the next message is ``suspect + 1``): then the endpoint
  is cleared (a restart) or the gap counted (a long gap), and the suspect and its successor are
  applied. The stream going on from ``last`` refutes every suspect (``seq_implausible``).
* A copy of a recently applied batch (same seq, same payload) is a duplicate
  (``seq_duplicates``).
* A forward gap within the bound is taken (lost messages), but the position before it is kept: the
  stream going on above that position proves the messages that opened later gaps were not this
  publisher's (or came early on another connection), and the position goes back
  (``seq_rewound``) instead of the engine being cleared.

Mixed into the ``Ingestor``; ingestion thread only.
"""

from __future__ import annotations

from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.ratelimit import RateLimitedLog
from ppc_extproc.events.transport.source import Held, ReplayKind, Source
from ppc_extproc.events.wire import EventBatch

__all__ = ["MAX_SEQ_JUMP", "MAX_SUSPECTS", "RECENT_MESSAGES", "SequenceChecks", "fingerprint"]

#: Longest forward seq jump taken as lost messages: vLLM's default replay buffer (``buffer_steps``).
MAX_SEQ_JUMP = 10_000
#: Suspect messages, and positions before gaps, kept per source.
MAX_SUSPECTS = 16
#: Applied messages remembered per source, to tell a copy of one from a restarted counter.
RECENT_MESSAGES = 1024


def fingerprint(payload: bytes) -> tuple[int, bytes, bytes]:
    """Cheap identity of a payload: a restarted engine's batch at the same seq differs (its
    timestamp leads the batch, its blocks end it); a copy does not."""
    return len(payload), payload[:32], payload[-32:]


class SequenceChecks:
    """The suspect rules of the module docstring, for the ``Ingestor``."""

    stats: IngestStats
    _warn: RateLimitedLog

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
        raise NotImplementedError

    def _restart(self, src: Source, seq: int, reason: str) -> None:
        raise NotImplementedError

    def _hold_and_replay(self, src: Source, msg: Held, kind: ReplayKind, start: int) -> None:
        raise NotImplementedError

    def _suspect(self, src: Source, msg: Held, batch: EventBatch, replay: bool, went_back: bool) -> None:
        """``msg`` goes back, or jumps beyond the bound, from ``src.last_seq``."""
        topic, seq, payload = msg
        endpoint = src.endpoint
        last = src.last_seq
        assert last is not None
        back = seq <= last or went_back
        if back and src.recent.get(seq) == fingerprint(payload):
            self.stats.count(endpoint, "seq_duplicates")  # a copy of what was applied
            return
        origins = src.before_gaps
        if back and not went_back and origins and origins[0] < seq:
            self.stats.count(endpoint, "seq_rewound")
            self._warn.warning("kv_seq_rewound", endpoint, last_seq=last, seq=seq)
            while origins and origins[-1] >= seq:
                origins.pop()
            self._apply(src, topic, seq, payload, batch)
            return
        if replay and not src.verified:
            self.stats.count(endpoint, "seq_suspects")
            self._hold_and_replay(src, msg, ReplayKind.VERIFY, last)
        elif replay:  # refuted by the verify replay that just ran
            self.stats.drop(endpoint, "seq_implausible")
            self._warn.warning("kv_seq_implausible", endpoint, last_seq=last, seq=seq)
        else:
            self._confirmed(src, msg, back)

    def _confirmed(self, src: Source, msg: Held, back: bool) -> bool:
        """A suspect without replay: applied, with what it proves, when a second signal confirms
        it; else kept aside. True when it was applied."""
        topic, seq, payload = msg
        previous = src.suspects.pop(seq - 1, None)
        if previous is None and not (back and seq == 0):
            if len(src.suspects) >= MAX_SUSPECTS:
                del src.suspects[next(iter(src.suspects))]
                self.stats.drop(src.endpoint, "seq_implausible")
            src.suspects[seq] = msg
            self.stats.count(src.endpoint, "seq_suspects")
            self._warn.warning("kv_seq_suspect", src.endpoint, last_seq=src.last_seq, seq=seq)
            return False
        first = previous or msg
        if back:
            self._restart(src, first[1], "counter_from_zero" if previous is None else "counter_went_on")
        else:
            self._count_gap(src, first[1])
            src.before_gaps.clear()
        self._refute_suspects(src)
        self._apply(src, *first)
        if previous is not None:
            self._apply(src, topic, seq, payload)
        return True

    def _refute_suspects(self, src: Source) -> None:
        """The stream went on without them: the suspects were not this publisher's messages."""
        self.stats.drop(src.endpoint, "seq_implausible", len(src.suspects))
        src.suspects.clear()

    def _count_gap(self, src: Source, seq: int) -> None:
        last = src.last_seq
        assert last is not None
        src.gap_counted_at = seq
        self.stats.count(src.endpoint, "gaps")
        self.stats.count(src.endpoint, "gap_messages", seq - last - 1)

    @staticmethod
    def _note_gap(src: Source, last: int) -> None:
        """A gap from ``last`` was taken; keep the position (the lowest survives the bound)."""
        src.before_gaps.append(last)
        if len(src.before_gaps) > MAX_SUSPECTS:
            del src.before_gaps[1]

    @staticmethod
    def _remember(src: Source, seq: int, payload: bytes) -> None:
        recent = src.recent
        recent[seq] = fingerprint(payload)
        if len(recent) > RECENT_MESSAGES:
            del recent[next(iter(recent))]
