"""Tunables of the ZMQ transport: replay limits (llm-d's values) and socket/loop settings."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReplayPolicy", "StreamDensity", "TransportTuning"]


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    """Bounds of replay requests. Defaults are llm-d's (``pkg/kvevents/zmq_subscriber.go``)."""

    #: An attempt fails when no reply message arrives for this long.
    idle_timeout_seconds: float = 2.0
    #: A replay (all attempts) fails after this long.
    total_timeout_seconds: float = 120.0
    #: Attempts in a row without a single reply before the replay fails.
    max_attempts: int = 3
    #: After a failed replay, gaps of that source are only counted for this long.
    cooldown_seconds: float = 30.0
    #: Replays running at once across all sources; more wait (their live messages are held).
    max_concurrent: int = 8
    #: Replay from 0 as soon as a subscriber first connects (llm-d does), not only mid-stream.
    replay_on_connect: bool = True


@dataclass(frozen=True, slots=True)
class TransportTuning:
    """Socket and loop settings of the ingestion thread."""

    replay: ReplayPolicy = field(default_factory=ReplayPolicy)
    #: Messages read from one readable socket before polling again (fairness between sources).
    drain_budget: int = 128
    #: Longest poll wait. Timers (replay deadlines, reconnect retries) end a wait when they are
    #: due, so an idle thread wakes once per this interval (a safety net, not a resolution).
    poll_interval_seconds: float = 1.0
    #: After a round in which fewer than ``coalesce_below`` sockets had input that was already
    #: waiting (a steady stream), pause this long so the next round serves several messages per
    #: wake-up (adds at most this much latency; sparse messages are not paused for).
    coalesce_seconds: float = 0.0005
    coalesce_below: int = 4
    #: A batch window applies only while fewer messages than this arrive per second. A denser
    #: stream is read as it comes: each wake-up finds many messages anyway, and a pause would
    #: only queue them (latency, and the receive high-water mark at high rates).
    dense_messages_per_second: float = 512.0
    #: A batch window applies only while messages average this many payload bytes or fewer:
    #: decode steps (a block or a few, ~200 bytes each). A prompt's prefill (hundreds of blocks
    #: and their tokens per message) is read as it comes: gathering saves little next to its own
    #: apply, and a request's flush would make its decision wait for it.
    small_message_bytes: int = 16384
    #: A request's arrival ends a batch-window pause (``ZmqTransport.flush``) once it has lasted
    #: this long: requests closer together than this share one wake-up of the thread.
    flush_after_seconds: float = 0.02
    #: How long a decision waits for the round a flush started: a few decode-step messages take
    #: well under this. Longer reads (behind a replay or a snapshot) are not waited out.
    flush_wait_seconds: float = 0.001
    #: ZMQ reconnect interval of SUB sockets, doubling up to the maximum. llm-d waits up to 5 s;
    #: a restarted engine is routable again only once its subscriber reconnects, so keep it short
    #: (a refused TCP connect twice a second per dead engine costs nothing).
    reconnect_interval_seconds: float = 0.1
    reconnect_interval_max_seconds: float = 0.5
    #: ZMTP heartbeats: a silent dead peer is noticed (and reconnected) after the timeout.
    heartbeat_interval_seconds: float = 5.0
    heartbeat_timeout_seconds: float = 15.0
    #: Receive high-water mark of replay DEALER sockets (vLLM 0.33's ROUTER: 2 × (buffer + 1)).
    replay_hwm: int = 100_000
    #: Frames above this size make libzmq drop the connection (the decoder refuses 64 MiB anyway).
    max_frame_bytes: int = 64 * 1024 * 1024 + 4096
    #: Central mode: topics whose source is remembered (pool endpoints only; one per model segment).
    #: Beyond, a pool endpoint's new topics are still accepted, just parsed on every message.
    max_central_sources: int = 4096
    #: A repeated warning (same event and endpoint) is logged at most once per interval.
    log_interval_seconds: float = 10.0

    def pause_after(self, active: int, waited: float, *, window: float = 0.0, backlog: bool = False) -> float:
        """How long to pause after a round that served ``active`` sockets and waited ``waited``
        seconds for its input, before reading again, so that what arrives meanwhile is served in
        the same wake-up. Each wake-up after a quiet spell costs ~0.3 ms of CPU on cold caches,
        whatever it then applies (``benchmarks/bench_cold_wake.py``).

        * ``backlog`` (a socket left undrained, a replay running, a caller waiting for the thread
          to go idle): not at all.
        * ``window`` (``kvEventsConfig.batchWindow``) when set, after a round whose input came
          within a window of the previous one (messages denser than the window: the decode steps
          of many streams, one block each). A message after a longer quiet spell is served
          alone: a pause would only add a second wake-up to it. The caller passes 0 while the
          stream is dense (``StreamDensity``).
        * otherwise ``coalesce_seconds``, by the same rule, while fewer than ``coalesce_below``
          sockets had input."""
        if not active or backlog:
            return 0.0
        if window > 0:
            return window if waited < window else 0.0
        if active < self.coalesce_below and waited < self.coalesce_seconds:
            return self.coalesce_seconds
        return 0.0


@dataclass(slots=True)
class StreamDensity:
    """Whether the messages read over the last ``window`` seconds came at fewer than
    ``dense_per_second`` and averaged at most ``small_bytes``: a trickle of decode steps that a
    batch window should gather. Decided once per window, so a dense stream's short gaps do not flip
    it. A window that ended a quiet spell (two windows or more without a decision) says nothing of
    the stream that follows: that stream is read as it comes until a window has measured it, so a
    burst after a quiet spell is never queued."""

    window: float
    dense_per_second: float
    small_bytes: int
    #: The last decision.
    sparse: bool = False
    _since: float = 0.0
    _read_then: int = 0
    _bytes_then: int = 0

    def update(self, now: float, read: int, read_bytes: int) -> bool:
        """``read``, ``read_bytes``: messages and payload bytes read so far in total; returns
        ``sparse``."""
        elapsed = now - self._since
        if elapsed >= self.window:
            count = read - self._read_then
            small = read_bytes - self._bytes_then <= self.small_bytes * count
            self.sparse = elapsed < 2 * self.window and count < self.dense_per_second * elapsed and small
            self._since, self._read_then, self._bytes_then = now, read, read_bytes
        return self.sparse
