"""Replay requests to engines' ROUTER sockets, driven by the ingestion thread's poller.

One DEALER per attempt sends ``[b"", BE64(start)]`` and reads replies until the end marker, old
(``[b"", seq, payload]``) and new (``[b"", topic, seq, payload]``) forms alike. Bounded like
llm-d: an idle timeout per attempt, a total deadline, a few attempts without progress, and a
limit on replays in flight (others wait in FIFO order). Nothing here blocks: replies are handed
to a ``ReplaySink`` (the ingestor) as they arrive. The protocol is vLLM's replay ROUTER
(``vllm-project/vllm: vllm/distributed/kv_events.py``); the bounds are llm-d's
(``llm-d/llm-d-router: pkg/kvevents/zmq_subscriber.go``).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog
import zmq

from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport.frames import ReplayReply, encode_seq, parse_replay_reply
from ppc_extproc.events.transport.policy import ReplayPolicy
from ppc_extproc.events.transport.reactor import Reactor
from ppc_extproc.events.transport.source import ReplayKind, Source

__all__ = ["Action", "ReplayManager", "ReplaySession", "ReplaySink"]

log = structlog.get_logger(__name__)


class Action(enum.Enum):
    """What the sink wants after a reply or the end marker."""

    CONTINUE = "continue"
    #: Ask again from ``session.start`` on a fresh DEALER (the sink has set kind and start).
    REREQUEST = "rerequest"
    FINISH = "finish"


class ReplaySink(Protocol):
    """Receives replayed batches of a session (implemented by the ingestor)."""

    def replay_reply(self, session: ReplaySession, reply: ReplayReply) -> Action: ...

    def replay_end(self, session: ReplaySession) -> Action: ...

    def replay_finished(self, session: ReplaySession, ok: bool) -> None: ...


@dataclass(slots=True, eq=False)
class ReplaySession:
    """One replay of one source, over one or more attempts."""

    source: Source
    kind: ReplayKind
    #: Start seq of the current attempt.
    start: int
    dealer: zmq.Socket[bytes] | None = None
    deadline: float = 0.0
    idle_deadline: float = 0.0
    #: Attempts in a row that received nothing.
    fruitless: int = 0
    #: Reply messages (not counting the end marker) received in the current attempt.
    replies: int = 0
    total_replies: int = 0
    attempts: int = 0

    @property
    def running(self) -> bool:
        return self.dealer is not None


class ReplayManager:
    """Starts, feeds, retries and bounds replay sessions."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        reactor: Reactor,
        sink: ReplaySink,
        stats: IngestStats,
        policy: ReplayPolicy,
        *,
        hwm: int = 100_000,
        budget: int = 128,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._context = context
        self._reactor = reactor
        self._sink = sink
        self._stats = stats
        self.policy = policy
        self._hwm = hwm
        self._budget = budget
        self._clock = clock
        self._active: list[ReplaySession] = []
        self._pending: deque[ReplaySession] = deque()

    @property
    def busy(self) -> bool:
        return bool(self._active or self._pending)

    def request(self, source: Source, kind: ReplayKind, start: int) -> ReplaySession:
        """Replay ``source`` from ``start``; waits for a free slot if too many run."""
        session = ReplaySession(source, kind, start)
        source.replay = session
        source.state.replaying = True
        self._stats.count(source.endpoint, "replays_started")
        self._stats.count(source.endpoint, f"replays_{kind.value}")
        if len(self._active) < self.policy.max_concurrent:
            self._open(session)
        else:
            self._pending.append(session)
        return session

    def cancel(self, session: ReplaySession) -> None:
        """Abandon ``session`` without telling the sink (source removed, or superseded)."""
        self._close(session)
        if session in self._active:
            self._active.remove(session)
        elif session in self._pending:
            self._pending.remove(session)
        if session.source.replay is session:
            session.source.replay = None
            session.source.state.replaying = False
        self._start_pending()

    def tick(self, now: float) -> None:
        """Time out attempts and sessions; retry or fail them."""
        for session in list(self._active):
            if now >= session.deadline:
                self._fail(session, "deadline")
            elif now >= session.idle_deadline:
                session.fruitless = 0 if session.replies else session.fruitless + 1
                if session.fruitless >= self.policy.max_attempts:
                    self._fail(session, "idle")
                    continue
                source = session.source
                if session.kind is not ReplayKind.VERIFY and source.last_seq is not None:
                    session.start = source.last_seq + 1
                self._stats.count(source.endpoint, "replay_retries")
                self._rerequest(session)
        for session in self._active:  # replies pushed idle deadlines later than the reactor knows
            self._reactor.timer_at(min(session.deadline, session.idle_deadline))

    def close_all(self) -> None:
        for session in [*self._active, *self._pending]:
            self._close(session)
        self._active.clear()
        self._pending.clear()

    # --- internals -----------------------------------------------------------------------------

    def _open(self, session: ReplaySession) -> None:
        self._active.append(session)
        session.deadline = self._clock() + self.policy.total_timeout_seconds
        self._rerequest(session)

    def _rerequest(self, session: ReplaySession) -> None:
        """A fresh DEALER (late replies of an earlier attempt go nowhere) asking from ``start``."""
        self._close(session)
        source = session.source
        session.replies = 0
        session.attempts += 1
        session.idle_deadline = self._clock() + self.policy.idle_timeout_seconds
        self._reactor.timer_at(min(session.deadline, session.idle_deadline))
        dealer = self._context.socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, self._hwm)
            if source.replay_address.startswith("tcp://["):
                dealer.setsockopt(zmq.IPV6, 1)
            dealer.connect(source.replay_address)
            dealer.send_multipart([b"", encode_seq(session.start)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            dealer.close(0)
            self._stats.count(source.endpoint, "socket_errors")
            log.warning("kv_replay_request_failed", endpoint=source.endpoint, error=str(exc))
            return  # the attempt idles out and is retried by ``tick``
        session.dealer = dealer
        self._reactor.add(dealer, lambda: self._on_readable(session))

    def _on_readable(self, session: ReplaySession) -> bool:
        dealer = session.dealer
        if dealer is None:
            return False
        endpoint = session.source.endpoint
        sink = self._sink
        for _ in range(self._budget):
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            reply = parse_replay_reply(frames)
            if reply is None:
                self._stats.count(endpoint, "bad_replay_frames")
                continue
            session.idle_deadline = self._clock() + self.policy.idle_timeout_seconds
            if reply.is_end:
                action = sink.replay_end(session)
            else:
                session.replies += 1
                session.total_replies += 1
                session.fruitless = 0
                action = sink.replay_reply(session, reply)
            if action is Action.REREQUEST:
                self._rerequest(session)
                return False
            if action is Action.FINISH:
                self._stats.count(endpoint, "replays_ok")
                self._finish(session, ok=True)
                return False
        return True

    def _fail(self, session: ReplaySession, why: str) -> None:
        source = session.source
        self._stats.count(source.endpoint, "replays_failed")
        log.warning(
            "kv_replay_failed",
            endpoint=source.endpoint,
            reason=why,
            kind=session.kind.value,
            attempts=session.attempts,
            replies=session.total_replies,
        )
        self._finish(session, ok=False)

    def _finish(self, session: ReplaySession, ok: bool) -> None:
        self._close(session)
        if session in self._active:
            self._active.remove(session)
        source = session.source
        if source.replay is session:
            source.replay = None
            source.state.replaying = False
        self._start_pending()
        self._sink.replay_finished(session, ok)

    def _start_pending(self) -> None:
        while self._pending and len(self._active) < self.policy.max_concurrent:
            self._open(self._pending.popleft())

    def _close(self, session: ReplaySession) -> None:
        if session.dealer is not None:
            self._reactor.remove(session.dealer)
            session.dealer.close(0)
            session.dealer = None
