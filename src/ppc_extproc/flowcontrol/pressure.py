"""The pool's saturation as flow control's dispatch reads it: the detector's value plus the
in-flight credit, in O(1) per request.

* **In-flight credit.** Requests routed to an endpoint since its metrics were scraped, less those
  that finished there since, are handed to the detector as extra waiting requests on it; requests
  dispatched but not yet routed are spread over the pool.
* **Cheap reads.** The detector runs over every endpoint at most every ``REFRESH_SECONDS`` (and
  at most 2 % of the time when that is slow); in between each dispatch adds one request's worth
  (``SaturationDetector.dispatch_weight``, an upper bound). A completion while requests wait asks
  for an early recomputation (at most every ``EARLY_SECONDS``) rather than subtracting: the
  roofline's ``max()`` can hide it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence

from ppc_extproc.flowcontrol.stats import FlowStats
from ppc_extproc.flowcontrol.types import SaturationDetector
from ppc_extproc.ids import EndpointId

__all__ = ["EARLY_SECONDS", "REFRESH_SECONDS", "Pressure"]

#: Engine metrics are scraped every 50 ms: a new scrape is seen within 20 ms.
REFRESH_SECONDS = 0.02
EARLY_SECONDS = 0.001
#: Routed/finished times kept per endpoint between two scrapes.
MAX_TIMES = 100_000


class Pressure:
    """Saturation with in-flight credit, cached between full computations."""

    def __init__(self, detector: SaturationDetector, endpoints: Callable[[], Sequence[EndpointId]], stats: FlowStats,
                 *, credit: bool = True, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.detector = detector
        self._endpoints = endpoints
        self.stats = stats
        self.credit = credit
        self.clock = clock
        #: Dispatched, not yet routed.
        self.unplaced = 0
        #: Per endpoint, when requests were routed and finished there (pruned at its next scrape).
        self._routed_at: dict[EndpointId, deque[float]] = {}
        self._finished_at: dict[EndpointId, deque[float]] = {}
        self._value = 0.0
        #: ``time.monotonic()`` of the last full computation (real time, whatever ``clock`` says).
        self._at = -math.inf
        self._pool: Sequence[EndpointId] = ()
        #: Dispatches since the last full computation (less completions), each worth ``_weight``.
        self._delta = 0
        self._weight = 0.0
        self._refresh = REFRESH_SECONDS
        self._early = EARLY_SECONDS

    def endpoints(self) -> Sequence[EndpointId]:
        """The pool as of the last full computation."""
        if time.monotonic() - self._at >= self._refresh:
            self._recompute()
        return self._pool

    def saturation(self) -> float:
        if time.monotonic() - self._at >= self._refresh:
            self._recompute()
        return self._value + max(self._delta, 0) * self._weight

    def _recompute(self) -> None:
        started = time.perf_counter()
        pool = self._pool = self._endpoints()
        detector = self.detector
        if self.credit:
            value = detector.saturation(pool, self._credit(pool), self.unplaced)
        else:
            value = detector.saturation(pool, {}, 0)
        self._value, self._delta = value, 0
        # With the credit off only the scraped metrics count (llm-d's rule); a detector reading no
        # scraped metrics (in-flight counts) sees every dispatch at once either way.
        counts = self.credit or not detector.reads_polled_metrics
        self._weight = detector.dispatch_weight(len(pool)) if counts else 0.0
        self.stats.saturation(value, detector.stale_endpoints())
        self._at = time.monotonic()
        cost = time.perf_counter() - started
        self._refresh = max(REFRESH_SECONDS, 50 * cost)
        self._early = max(EARLY_SECONDS, 50 * cost)

    def _credit(self, pool: Sequence[EndpointId]) -> dict[EndpointId, int]:
        """endpoint → requests routed there since its scrape minus those finished there since."""
        credit: dict[EndpointId, int] = {}
        routed, finished = self._routed_at, self._finished_at
        if not routed and not finished:
            return credit
        if len(routed) + len(finished) > 4 * len(pool) + 64:
            keep = set(pool)
            for table in (routed, finished):
                for endpoint in [e for e in table if e not in keep]:
                    del table[endpoint]
        for endpoint in pool:
            started, ended = routed.get(endpoint), finished.get(endpoint)
            if not started and not ended:
                continue
            scraped = self.detector.metrics_time(endpoint)
            if scraped is None:
                continue
            net = 0
            for times, sign in ((started, 1), (ended, -1)):
                if times:
                    while times and times[0] <= scraped:
                        times.popleft()
                    net += sign * len(times)
            if net:
                credit[endpoint] = net
        return credit

    def _record(self, table: dict[EndpointId, deque[float]], endpoint: EndpointId) -> None:
        if self.credit and self.detector.metrics_time(endpoint) is not None:
            times = table.get(endpoint)
            if times is None:
                times = table[endpoint] = deque(maxlen=MAX_TIMES)
            times.append(self.clock())

    def dispatched(self) -> None:
        self.unplaced += 1
        self._delta += 1

    def routed(self, endpoint: EndpointId) -> None:
        """Placed: it moves from ``unplaced`` into the credit (no change in ``_delta``)."""
        self.unplaced = max(0, self.unplaced - 1)
        self._record(self._routed_at, endpoint)

    def abandoned(self, waiting: bool) -> None:
        self.unplaced = max(0, self.unplaced - 1)
        self._freed(waiting)

    def finished(self, endpoint: EndpointId, waiting: bool) -> None:
        self._record(self._finished_at, endpoint)
        self._freed(waiting)

    def _freed(self, waiting: bool) -> None:
        self._delta -= 1
        if waiting and self._delta < 0 and time.monotonic() - self._at >= self._early:
            self._at = -math.inf
