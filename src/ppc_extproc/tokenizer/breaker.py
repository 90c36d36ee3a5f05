"""Circuit breaker for the render service: a slow or dead server costs one timeout, not one per request.

States::

    CLOSED ──timeout / transport error / 502-504──► OPEN ──open_seconds──► HALF_OPEN ──probe ok──► CLOSED
       │                                              ▲                        │
       └──oldest call unanswered for stall_seconds──► SUSPECT ──probe fails────┘ (probe fails ⇒ OPEN)

* CLOSED admits every call.
* SUSPECT: the oldest in-flight call has waited ``stall_seconds`` without an answer. It becomes
  the probe and keeps waiting (up to its timeout); every *other* in-flight call is released at
  once and new calls are refused, so they are routed by load instead of waiting too.
* OPEN refuses every call until ``open_seconds`` have passed; then HALF_OPEN admits exactly one
  probe (the breaker is SUSPECT while it runs). A probe's answer closes the breaker; its failure
  reopens it.

When a failure opens the breaker, the other in-flight calls are released too. Hence at most one
call waits for the full timeout per outage. Single event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["BreakerState", "CircuitBreaker", "Ticket"]


class BreakerState(enum.Enum):
    CLOSED = "closed"
    SUSPECT = "suspect"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted call."""

    id: int
    started: float
    probe: bool
    #: Set when the breaker releases this call early (it should stop waiting).
    released: asyncio.Event = field(default_factory=asyncio.Event)


class CircuitBreaker:
    """See the module docstring."""

    def __init__(
        self, *, stall_seconds: float, open_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if stall_seconds <= 0 or open_seconds < 0:
            raise ValueError("stall_seconds must be > 0 and open_seconds >= 0")
        self.stall_seconds = stall_seconds
        self.open_seconds = open_seconds
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._inflight: dict[int, Ticket] = {}
        self._ids = itertools.count()
        self._probe: Ticket | None = None
        #: Times the breaker opened (for metrics and tests).
        self.trips = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_seconds:
            return BreakerState.HALF_OPEN
        return self._state

    def admit(self) -> Ticket | None:
        """A ticket for a new call, or None if the call must not be made."""
        state = self.state
        if state is BreakerState.CLOSED:
            probe = False
        elif state is BreakerState.HALF_OPEN:
            probe = True
        else:
            return None
        ticket = Ticket(next(self._ids), self._clock(), probe)
        if probe:  # one probe in flight: everyone else is refused until it answers
            self._probe = ticket
            self._state = BreakerState.SUSPECT
        self._inflight[ticket.id] = ticket
        return ticket

    def stalled(self, ticket: Ticket) -> None:
        """``ticket`` has waited ``stall_seconds`` unanswered: if it is the oldest, it becomes the probe."""
        if self._state is not BreakerState.CLOSED or ticket.id not in self._inflight:
            return
        if min(self._inflight) != ticket.id:
            return  # an older call is (or will be) the probe
        self._state = BreakerState.SUSPECT
        self._probe = ticket
        ticket.probe = True
        self._release_others(ticket)

    def success(self, ticket: Ticket) -> None:
        """The server answered (any HTTP status that is not a gateway failure)."""
        self._inflight.pop(ticket.id, None)
        if ticket.probe or self._state is BreakerState.CLOSED:
            self._state = BreakerState.CLOSED
            self._probe = None

    def failure(self, ticket: Ticket) -> None:
        """Timeout, transport error or gateway failure: open and release everyone else."""
        self._inflight.pop(ticket.id, None)
        if ticket.released.is_set():
            return  # released by an earlier trip: its error says nothing new
        if self._state is not BreakerState.OPEN:
            self.trips += 1
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._probe = None
        self._release_others(ticket)

    def done(self, ticket: Ticket) -> None:
        """The call ended without news about the server (released, cancelled)."""
        self._inflight.pop(ticket.id, None)
        if self._probe is ticket:
            self._probe = None
            if self._state is BreakerState.SUSPECT:
                self._state = BreakerState.OPEN
                self._opened_at = self._clock() - self.open_seconds  # let the next call probe

    def _release_others(self, keep: Ticket) -> None:
        for t in list(self._inflight.values()):
            if t is not keep:
                t.released.set()
                del self._inflight[t.id]
