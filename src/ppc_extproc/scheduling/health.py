"""Endpoint health: which endpoints may receive traffic. It fails open, as Envoy's panic mode does.

One kind of evidence takes an endpoint out of routing: **Envoy could not reach it**. A request's
response carries Envoy's ``response.flags`` / ``response.code_details`` attributes (the ext_proc
filter's ``response_attributes``), and a connection failure or a connection lost before any
response byte (``UF`` / ``UC``; ``upstream_reset_before_response_started{…}``) holds the endpoint
down for a backoff: 1 s, doubling to 30 s while it keeps failing; after the hold it is routable on
probation, and any answer from the engine itself — a 503 or a 500 included — clears the streak.

Soft signals never take an endpoint out:

    KV events   a lost subscriber connection makes the endpoint's index entries untrusted (the
                ingestion's ``suspended`` set), not the endpoint; it only *corroborates* a
                connection failure seen within ``corroboration_seconds`` of it: the hold then
                lasts until the subscriber reconnects (a dead engine stays out however long it
                is dead, and is back as soon as its publisher is), at most
                ``upstream_backoff_max_seconds``
    metrics     failing polls make the endpoint's metrics stale (scorers treat them as unknown);
                the endpoint stays routable

Panic: when every candidate of a request is held down, the request is routed among all of them
(the hold is evidence about past requests, not a verdict), counted in ``panics`` —
``ppc_extproc_health_panic_total`` and ``/debug/state``. Unlike Envoy's ``healthy_panic_threshold``
(default 50 %) the threshold is 0 %: while one candidate is routable only it gets traffic, because
the only evidence here is an actual failed connection, and with ``ORIGINAL_DST`` routing a request
sent to such an endpoint is lost (there is nothing to retry on).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind

__all__ = ["DownReason", "EndpointHealth", "HealthOptions"]

log = structlog.get_logger(__name__)


class DownReason:
    """Why an endpoint is held down (metric label values)."""

    #: Envoy reported a connection-level failure for a request sent to it.
    UPSTREAM_FAILURE = "upstream_failure"


@dataclass(frozen=True, slots=True)
class HealthOptions:
    #: First hold after a connection failure; doubles with each failure in a row.
    upstream_backoff_seconds: float = 1.0
    upstream_backoff_max_seconds: float = 30.0
    #: A KV subscriber that lost its engine this close (either side) to the first failure of a
    #: streak keeps the hold until it reconnects.
    corroboration_seconds: float = 5.0


@dataclass(slots=True)
class _State:
    #: None until the subscriber first connects (a wrong port concludes nothing).
    kv_connected: bool | None = None
    #: When an established subscriber connection was lost (monotonic seconds).
    kv_lost_at: float | None = None
    upstream_failures: int = 0
    #: The current hold: started at, ends at (0.0: not held).
    held_since: float = 0.0
    held_until: float = 0.0
    #: First failure of the current streak.
    streak_started: float = 0.0
    #: Times a connection failure took the endpoint down.
    transitions: int = 0


class EndpointHealth:
    """Thread-safe: the KV thread and the request path report here; the request path reads."""

    def __init__(self, options: HealthOptions | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options or HealthOptions()
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()
        #: Endpoint ids held down right now (the request path reads only this set).
        self._down: frozenset[str] = frozenset()
        #: Requests routed among all their candidates because every one was held down.
        self.panics = 0
        self._panicking = False

    # --- request path -----------------------------------------------------------------------------

    def routable(self, candidates: Sequence[Endpoint]) -> list[Endpoint]:
        """The candidates that may receive traffic, in their order; all of them when every one is
        held down (panic)."""
        down = self._down
        if not down:
            self._panicking = False
            return list(candidates)
        self._expire_holds()
        down = self._down
        routable = [e for e in candidates if e.id not in down]
        if routable or not candidates:
            self._panicking = False
            return routable
        with self._lock:
            self.panics += 1
            if not self._panicking:
                self._panicking = True
                log.warning("health_panic", candidates=len(candidates), detail="every candidate is held down")
        return list(candidates)

    def suspect(self, endpoint_id: str) -> bool:
        """Held down, or its KV-event subscriber lost the engine: not to be trusted with work
        that has a cheap fallback (a P/D prefill leg: the decode engine can prefill locally)."""
        if endpoint_id in self._down:
            self._expire_holds()
            if endpoint_id in self._down:
                return True
        state = self._states.get(endpoint_id)
        return state is not None and state.kv_connected is False

    # --- evidence ---------------------------------------------------------------------------------

    def upstream(self, endpoint_id: str, reached: bool) -> None:
        """The response path's verdict: did Envoy reach the engine (False: a connection failure)?"""
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is None:
                return
            if reached:
                state.upstream_failures = 0
                self._release(endpoint_id, state, "engine_answered")
                return
            now = self.clock()
            if state.upstream_failures == 0:
                state.streak_started = now
            state.upstream_failures += 1
            hold = min(
                self.options.upstream_backoff_max_seconds,
                self.options.upstream_backoff_seconds * 2 ** (state.upstream_failures - 1),
            )
            if not state.held_until:
                state.held_since = now
                state.transitions += 1
                log.warning("endpoint_unroutable", endpoint=endpoint_id, reason=DownReason.UPSTREAM_FAILURE,
                            hold_seconds=hold)  # fmt: skip
            state.held_until = max(state.held_until, now + hold)
            self._publish()

    def kv_connection(self, endpoint_id: str, connected: bool) -> None:
        """The KV-event subscriber's connection (reported every tick): a soft signal."""
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is None or state.kv_connected is connected:
                return
            if connected:
                was_lost = state.kv_connected is False
                state.kv_connected = True
                state.kv_lost_at = None
                if was_lost and state.held_until:  # its publisher is back: so is the engine
                    state.upstream_failures = 0
                    self._release(endpoint_id, state, "kv_reconnected")
            elif state.kv_connected:
                state.kv_connected = False
                state.kv_lost_at = self.clock()

    # --- endpoint lifecycle -----------------------------------------------------------------------

    def on_endpoint_event(self, event: EndpointEvent) -> None:
        """Pool listener: track the endpoints that exist, forget deleted ones."""
        with self._lock:
            if event.kind is EndpointEventKind.DELETED:
                self._states.pop(event.endpoint.id, None)
            else:
                if event.previous is not None and event.previous.id != event.endpoint.id:
                    self._states.pop(event.previous.id, None)
                self._states.setdefault(event.endpoint.id, _State())
            self._publish()

    # --- views ------------------------------------------------------------------------------------

    def down(self) -> dict[str, list[str]]:
        """endpoint → reasons it is held down."""
        self._expire_holds()
        with self._lock:
            return {ep: [DownReason.UPSTREAM_FAILURE] for ep, s in self._states.items() if s.held_until}

    def kv_disconnected(self) -> list[str]:
        """Endpoints whose KV-event subscriber lost its connection and has not reconnected."""
        with self._lock:
            return sorted(ep for ep, s in self._states.items() if s.kv_connected is False)

    def transitions(self) -> dict[tuple[str, str], int]:
        """(endpoint, reason) → times the endpoint was taken down for it."""
        with self._lock:
            return {(ep, DownReason.UPSTREAM_FAILURE): s.transitions for ep, s in self._states.items() if s.transitions}

    def endpoints(self) -> list[str]:
        with self._lock:
            return list(self._states)

    def view(self) -> dict[str, object]:
        """``/debug/state``'s health section."""
        return {"down": self.down(), "kvDisconnected": self.kv_disconnected(), "panics": self.panics}

    # --- internals --------------------------------------------------------------------------------

    def _release(self, endpoint_id: str, state: _State, why: str) -> None:
        """(Lock held.) End the endpoint's hold, if any."""
        if state.held_until:
            state.held_until = 0.0
            log.info("endpoint_routable", endpoint=endpoint_id, after=why)
            self._publish()

    def _publish(self) -> None:
        self._down = frozenset(ep for ep, s in self._states.items() if s.held_until)

    def _corroborated(self, state: _State, now: float) -> bool:
        """The subscriber lost its engine around the streak's first failure and is still out."""
        lost = state.kv_lost_at
        return (
            state.kv_connected is False
            and lost is not None
            and abs(lost - state.streak_started) <= self.options.corroboration_seconds
            and now - state.held_since < self.options.upstream_backoff_max_seconds
        )

    def _expire_holds(self) -> None:
        now = self.clock()
        if not any(now >= self._states[ep].held_until for ep in self._down if ep in self._states):
            return
        with self._lock:
            for endpoint_id, state in self._states.items():
                if not state.held_until or now < state.held_until:
                    continue
                if self._corroborated(state, now):  # look again a little later
                    state.held_until = min(now + self.options.upstream_backoff_seconds,
                                           state.held_since + self.options.upstream_backoff_max_seconds)  # fmt: skip
                else:  # probation: routable; the next failure doubles the hold
                    self._release(endpoint_id, state, "hold_expired")
