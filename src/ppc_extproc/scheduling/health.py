"""Endpoint health: which endpoints may receive traffic, from the evidence the service sees.

Evidence, per endpoint (each source reports what it observes):

    KV events   its subscriber was connected and lost the connection ⇒ down; connected again ⇒ up
                (before the first connection nothing is concluded: a wrong port must not empty
                the fleet)
    metrics     ``poll_failures_down`` consecutive failed polls ⇒ down; a good poll ⇒ up
    responses   Envoy answered for it without reaching it — a 503 without
                ``x-envoy-upstream-service-time``, or the stream ended before response headers
                after the upstream was dialled ⇒ down for a backoff (1 s, doubling to 30 s), then
                routable again on probation; any answer from the engine itself ⇒ up

An endpoint is routable unless some source holds it down. The router applies this first: the
candidates of a request are the routable ones, and with none left the request gets 503 at once.
Down endpoints, their reasons and the transitions are in ``/debug/state`` and
``ppc_extproc_endpoint_routable{endpoint}`` / ``ppc_extproc_endpoint_down_total{endpoint,reason}``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind

__all__ = ["DownReason", "EndpointHealth", "HealthOptions"]

log = structlog.get_logger(__name__)


class DownReason:
    """Why an endpoint is held down (metric label values)."""

    KV_DISCONNECTED = "kv_disconnected"
    POLL_FAILURES = "poll_failures"
    UPSTREAM_FAILURE = "upstream_failure"


@dataclass(frozen=True, slots=True)
class HealthOptions:
    #: Consecutive failed metric polls before an endpoint is held down.
    poll_failures_down: int = 3
    #: First hold after an upstream failure; doubles with each failure in a row.
    upstream_backoff_seconds: float = 1.0
    upstream_backoff_max_seconds: float = 30.0


@dataclass(slots=True)
class _State:
    #: reason → since (monotonic seconds)
    down: dict[str, float] = field(default_factory=dict)
    kv_connected_once: bool = False
    poll_failures: int = 0
    upstream_failures: int = 0
    #: An upstream hold ends at this time (then the endpoint is on probation).
    upstream_until: float = 0.0
    #: reason → times it took the endpoint down
    transitions: dict[str, int] = field(default_factory=dict)


class EndpointHealth:
    """Thread-safe: the KV thread, the metrics poller and the request path all report here."""

    def __init__(self, options: HealthOptions | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options or HealthOptions()
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()
        #: Endpoint ids held down right now (the request path reads only this set).
        self._down: frozenset[str] = frozenset()

    # --- request path -----------------------------------------------------------------------------

    def routable(self, candidates: Sequence[Endpoint]) -> list[Endpoint]:
        """The candidates that may receive traffic, in their order."""
        down = self._down
        if not down:
            return list(candidates)
        if any(self._states[e].upstream_until for e in down if e in self._states):
            self._expire_upstream_holds()
            down = self._down
        return [e for e in candidates if e.id not in down]

    # --- evidence ---------------------------------------------------------------------------------

    def kv_connection(self, endpoint_id: str, connected: bool) -> None:
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is None:
                return
            if connected:
                state.kv_connected_once = True
                self._up(endpoint_id, state, DownReason.KV_DISCONNECTED)
            elif state.kv_connected_once:
                self._hold(endpoint_id, state, DownReason.KV_DISCONNECTED)

    def poll(self, endpoint_id: str, ok: bool) -> None:
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is None:
                return
            if ok:
                state.poll_failures = 0
                self._up(endpoint_id, state, DownReason.POLL_FAILURES)
                return
            state.poll_failures += 1
            if state.poll_failures >= self.options.poll_failures_down:
                self._hold(endpoint_id, state, DownReason.POLL_FAILURES)

    def upstream(self, endpoint_id: str, reached: bool) -> None:
        """The response path's verdict: did the request reach the engine?"""
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is None:
                return
            if reached:
                state.upstream_failures = 0
                state.upstream_until = 0.0
                self._up(endpoint_id, state, DownReason.UPSTREAM_FAILURE)
                return
            state.upstream_failures += 1
            hold = min(
                self.options.upstream_backoff_max_seconds,
                self.options.upstream_backoff_seconds * 2 ** (state.upstream_failures - 1),
            )
            state.upstream_until = self.clock() + hold
            self._hold(endpoint_id, state, DownReason.UPSTREAM_FAILURE)

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
        self._expire_upstream_holds()
        with self._lock:
            return {ep: sorted(s.down) for ep, s in self._states.items() if s.down}

    def transitions(self) -> dict[tuple[str, str], int]:
        """(endpoint, reason) → times the endpoint was taken down for it."""
        with self._lock:
            return {(ep, r): n for ep, s in self._states.items() for r, n in s.transitions.items()}

    def endpoints(self) -> list[str]:
        with self._lock:
            return list(self._states)

    # --- internals (lock held) --------------------------------------------------------------------

    def _hold(self, endpoint_id: str, state: _State, reason: str) -> None:
        if reason not in state.down:
            state.down[reason] = self.clock()
            state.transitions[reason] = state.transitions.get(reason, 0) + 1
            log.warning("endpoint_unroutable", endpoint=endpoint_id, reason=reason)
            self._publish()

    def _up(self, endpoint_id: str, state: _State, reason: str) -> None:
        if state.down.pop(reason, None) is not None:
            if not state.down:
                log.info("endpoint_routable", endpoint=endpoint_id, after=reason)
            self._publish()

    def _publish(self) -> None:
        self._down = frozenset(ep for ep, s in self._states.items() if s.down)

    def _expire_upstream_holds(self) -> None:
        now = self.clock()
        with self._lock:
            for endpoint_id, state in self._states.items():
                if state.upstream_until and now >= state.upstream_until:
                    state.upstream_until = 0.0  # probation: routable; the next failure doubles the hold
                    self._up(endpoint_id, state, DownReason.UPSTREAM_FAILURE)
