"""The flow controller: requests wait here, on their ext_proc stream, until they may be scheduled.

After llm-d's ``FlowController`` (``llm-d/llm-d-router: pkg/epp/flowcontrol/controller/``, the
dispatch rule in ``controller/internal/processor.go``): one queue per flow ``(fairness id,
priority)``; the highest non-empty band dispatches first, its fairness policy picks a flow and the
flow's ordering policy a request; a band is gated while the pool's saturation is at or above its
ceiling (the usage-limit policy), and the first gated band stops the cycle. Requests over a band's
or the global request/byte limit are rejected (429, or 503 with no endpoints); a request waits at
most its TTL (429 ``rejected-ttl-expired``; 503 ``rejected-no-endpoints`` when the pool is empty);
a client that goes away leaves its queue at once (its awaiting task is cancelled).

Where this differs from llm-d, on purpose:

* **In-flight credit.** Requests routed to an endpoint since its metrics were scraped, less those
  that finished there since, are added to its waiting queue when saturation is computed, and
  requests dispatched but not routed yet are spread over the pool: a burst between two scrapes
  cannot overshoot, and completions free their capacity before the next scrape shows it
  (``inflightCredit``; llm-d dispatches every 1 ms against 50 ms-old metrics).
* **No band starves.** While saturation is below 1.0 and below a band's ceiling, a band with
  queued requests waits at most ``bandStarvationLimit`` dispatches of other bands before one of its
  own goes: it gets at least ``1 / (limit + 1)`` of the dispatches while it is open and has work
  (0: llm-d's strict priority). A band its usage limit holds back is not owed a turn.
* Not-saturated fast path: a request whose band and every higher band are empty, and whose band
  is open, dispatches without being queued (no future, no timer).

Single event loop: nothing here locks.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from ppc_extproc.errors import RequestError
from ppc_extproc.flowcontrol.config import FlowControlSpec
from ppc_extproc.flowcontrol.outcomes import Outcome, dropped
from ppc_extproc.flowcontrol.pressure import Pressure
from ppc_extproc.flowcontrol.queues import Band, Flow
from ppc_extproc.flowcontrol.stats import FlowStats
from ppc_extproc.flowcontrol.types import (
    FairnessPolicy,
    FlowItem,
    OrderingPolicy,
    SaturationDetector,
    UsageLimitPolicy,
)
from ppc_extproc.ids import EndpointId

__all__ = ["FlowController", "FlowPolicies", "Ticket"]

log = structlog.get_logger(__name__)

#: While requests are queued, saturation is re-read this often (engine metrics change on scrape).
POLL_SECONDS = 0.005
#: Dispatches per cycle before yielding to the event loop.
MAX_PER_CYCLE = 256


@dataclass(frozen=True, slots=True)
class FlowPolicies:
    """The resolved plugins flow control runs with."""

    detector: SaturationDetector
    usage_limit: UsageLimitPolicy
    fairness: Mapping[str, FairnessPolicy]
    ordering: Mapping[str, OrderingPolicy]
    default_fairness: FairnessPolicy
    default_ordering: OrderingPolicy


class Ticket:
    """A dispatched request's link back to flow control: where it went and when it ended."""

    __slots__ = ("_controller", "_endpoint", "_state", "item")

    def __init__(self, controller: FlowController, item: FlowItem) -> None:
        self._controller = controller
        self.item = item
        self._endpoint = EndpointId("")
        self._state = 0  # 0 dispatched, 1 routed, 2 done

    def routed(self, endpoint: EndpointId, uncached_tokens: int) -> None:
        """Scheduling picked ``endpoint``; the request costs ``uncached_tokens`` of prefill."""
        if self._state == 0:
            self._state = 1
            self._endpoint = endpoint
            self._controller._routed(self.item, endpoint, uncached_tokens)

    def abandon(self) -> None:
        """Scheduling failed: the request never reached an engine."""
        if self._state == 0:
            self._state = 2
            self._controller._unplaced_done()

    def finished(self, prompt_tokens: int | None = None, output_tokens: int | None = None) -> None:
        """The response ended (or the stream closed): capacity may have freed."""
        state, self._state = self._state, 2
        if state == 0:
            self._controller._unplaced_done()
        elif state == 1:
            self._controller._finished(self.item, self._endpoint, prompt_tokens, output_tokens)


class FlowController:
    """Admission queue in front of scheduling (one per service)."""

    def __init__(
        self,
        spec: FlowControlSpec,
        policies: FlowPolicies,
        endpoints: Callable[[], Sequence[EndpointId]],
        *,
        stats: FlowStats | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.policies = policies
        self._endpoints = endpoints
        self.stats = stats or FlowStats()
        self.clock = clock
        self._bands: dict[int, Band] = {}
        #: Band priorities, highest first.
        self._order: list[int] = []
        self.queued = 0
        self.queued_bytes = 0
        #: The pool's saturation as dispatch reads it, with the in-flight credit.
        self.pressure = Pressure(policies.detector, endpoints, self.stats, credit=spec.inflight_credit, clock=clock)
        self._seq = 0
        self._wake: asyncio.TimerHandle | asyncio.Handle | None = None
        self._wake_soon = False
        #: The last cycle stopped on a gate (not on its per-cycle bound).
        self._gated_last = False
        self._closed = False

    # --- admission ------------------------------------------------------------------------------

    async def admit(self, item: FlowItem) -> Ticket:
        """Wait until ``item`` may be scheduled; raises ``RequestError`` when it is dropped (and
        ``CancelledError`` when its client went away: it has left the queue by then)."""
        if self._closed:
            raise self._drop(item, Outcome.REJECTED_OTHER, dropped("rejected-shutting-down"))
        band = self._band(item.priority)
        endpoints = self.pressure.endpoints()
        if self._may_skip_queue(band, endpoints):
            self._dispatched_now(band)
            self.stats.finished(item, Outcome.DISPATCHED, 0.0)
            return Ticket(self, item)
        started = time.perf_counter()
        self._check_capacity(band, item, endpoints)
        self._enqueue(band, item)
        self.stats.enqueued(item, time.perf_counter() - started)
        future = item.future
        assert future is not None
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._unplaced_done()  # dispatched in the same tick the client left
            elif not item.dead:
                self._remove(item)
                self.stats.finished(item, Outcome.EVICTED_CONTEXT_CANCELLED, self.clock() - item.enqueued)
            raise
        return Ticket(self, item)

    def _may_skip_queue(self, band: Band, endpoints: Sequence[EndpointId]) -> bool:
        if not endpoints:
            return False
        for priority in self._order:
            if priority < band.priority:
                break
            if self._bands[priority].requests:
                return False
        saturation = self.pressure.saturation()
        ceilings = self.policies.usage_limit.ceilings(saturation, self._order)
        limit = self.spec.band_starvation_limit
        if limit and self.queued and saturation < 1.0 and any(
            b.requests and b.skipped >= limit and saturation < ceilings[self._order.index(p)]
            for p, b in self._bands.items()
        ):
            return False  # an open lower band is owed this turn
        return saturation < ceilings[self._order.index(band.priority)]

    def _dispatched_now(self, band: Band) -> None:
        self.pressure.dispatched()
        if self.queued:
            for other in self._bands.values():
                if other is not band and other.requests:
                    other.skipped += 1

    def _check_capacity(self, band: Band, item: FlowItem, endpoints: Sequence[EndpointId]) -> None:
        spec, size = self.spec, item.byte_size
        full = (
            band.requests + 1 > band.spec.max_requests or band.bytes + size > band.spec.max_bytes
            or (spec.max_requests and self.queued + 1 > spec.max_requests)
            or (spec.max_bytes and self.queued_bytes + size > spec.max_bytes)
        )  # fmt: skip
        if not full:
            return
        if not endpoints:
            raise self._drop(item, Outcome.REJECTED_NO_ENDPOINTS, dropped("rejected-no-endpoints"))
        raise self._drop(item, Outcome.REJECTED_CAPACITY, dropped("rejected-saturated"))

    def _drop(self, item: FlowItem, outcome: Outcome, error: RequestError) -> RequestError:
        self.stats.finished(item, outcome, max(0.0, self.clock() - item.enqueued))
        return error

    def _enqueue(self, band: Band, item: FlowItem) -> None:
        loop = asyncio.get_running_loop()
        self._seq += 1
        item.seq = self._seq
        item.future = loop.create_future()
        flow = band.flows.get(item.flow_id)
        if flow is None:
            flow = band.flows[item.flow_id] = Flow(item.flow_id)
        heapq.heappush(flow.heap, (band.ordering.key(item), item.seq, item))
        flow.live += 1
        flow.bytes += item.byte_size
        band.requests += 1
        band.bytes += item.byte_size
        self.queued += 1
        self.queued_bytes += item.byte_size
        self.stats.queue_changed(item, +1)
        ttl = item.ttl if self.pressure.endpoints() else self.spec.no_endpoint_ttl
        if ttl > 0:
            item.timer = loop.call_later(ttl, self._expire, item)
        self._schedule(0.0)

    def _remove(self, item: FlowItem) -> None:
        """Take a queued item out (not dispatched)."""
        item.dead = True
        if item.timer is not None:
            item.timer.cancel()
        band = self._bands[item.priority]
        flow = band.flows[item.flow_id]
        flow.live -= 1
        flow.bytes -= item.byte_size
        band.requests -= 1
        band.bytes -= item.byte_size
        self.queued -= 1
        self.queued_bytes -= item.byte_size
        self.stats.queue_changed(item, -1)
        if not flow.live:
            del band.flows[item.flow_id]
        else:
            flow.compact()
        if not band.requests:
            band.skipped = 0

    def _expire(self, item: FlowItem) -> None:
        if item.dead or item.future is None or item.future.done():
            return
        self._remove(item)
        waited = self.clock() - item.enqueued
        if self.pressure.endpoints():
            self.stats.finished(item, Outcome.EVICTED_TTL, waited)
            error = dropped("rejected-ttl-expired")
        else:
            self.stats.finished(item, Outcome.EVICTED_NO_ENDPOINTS, waited)
            error = dropped("rejected-no-endpoints", timed_out=True)
        item.future.set_exception(error)

    # --- dispatch ------------------------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        """Run a dispatch cycle now (an event) or after ``delay`` (polling while gated)."""
        if self._closed:
            return
        if self._wake is not None:
            if delay > 0 or self._wake_soon:
                return
            self._wake.cancel()  # an event beats the pending poll
        loop = asyncio.get_running_loop()
        self._wake_soon = delay <= 0
        self._wake = loop.call_soon(self._cycle) if delay <= 0 else loop.call_later(delay, self._cycle)

    def _cycle(self) -> None:
        self._wake = None
        if not self.queued:
            return
        started = time.perf_counter()
        try:
            for _ in range(MAX_PER_CYCLE):
                if not self.queued or not self._dispatch_one():
                    break
        except Exception:
            log.exception("flow_control_dispatch_failed")
        self.stats.cycle(time.perf_counter() - started)
        if self.queued:
            self._schedule(POLL_SECONDS if self._gated_last else 0.0)

    def _dispatch_one(self) -> bool:
        if not self.pressure.endpoints():
            self._gated_last = True
            return False
        saturation = self.pressure.saturation()
        ceilings = self.policies.usage_limit.ceilings(saturation, self._order)
        chosen: Band | None = None
        limit = self.spec.band_starvation_limit
        if limit and saturation < 1.0:
            # the guard reorders open bands; a band its usage limit holds back stays held back
            open_ = {p for i, p in enumerate(self._order) if saturation < ceilings[i]}
            owed = [b for b in self._bands.values() if b.requests and b.skipped >= limit and b.priority in open_]
            if owed:
                chosen = max(owed, key=lambda b: (b.skipped, -b.priority))
        if chosen is None:
            for i, priority in enumerate(self._order):
                band = self._bands[priority]
                if not band.requests:
                    continue
                if saturation >= ceilings[i]:
                    break  # llm-d: the first gated band ends the cycle
                chosen = band
                break
        if chosen is None:
            self._gated_last = True
            return False
        self._gated_last = False
        flows = list(chosen.flows.values())
        picked = chosen.fairness.pick(chosen.priority, flows, chosen.ordering)
        flow = chosen.flows[picked.flow_id]
        item = flow.pop()
        self._remove(item)
        assert item.future is not None
        if item.future.done():  # its client left in this tick: the waiter's cleanup has not run yet
            self.stats.finished(item, Outcome.EVICTED_CONTEXT_CANCELLED, self.clock() - item.enqueued)
            return True
        for other in self._bands.values():
            if other is not chosen and other.requests:
                other.skipped += 1
        chosen.skipped = 0
        chosen.fairness.dispatched(item)
        self.pressure.dispatched()
        self.stats.finished(item, Outcome.DISPATCHED, self.clock() - item.enqueued)
        item.future.set_result(None)
        return True

    @property
    def unplaced(self) -> int:
        """Requests dispatched and not routed yet."""
        return self.pressure.unplaced

    def saturation(self) -> float:
        """The pool's saturation as dispatch reads it."""
        return self.pressure.saturation()

    # --- ticket callbacks ------------------------------------------------------------------------

    def _routed(self, item: FlowItem, endpoint: EndpointId, uncached_tokens: int) -> None:
        self.pressure.routed(endpoint)
        self._band(item.priority).fairness.charged(item.flow_id, item.priority, uncached_tokens)
        if self.queued:
            self._schedule(0.0)

    def _unplaced_done(self) -> None:
        self.pressure.abandoned(bool(self.queued))
        if self.queued:
            self._schedule(0.0)

    def _finished(self, item: FlowItem, endpoint: EndpointId, prompt_tokens: int | None,
                  output_tokens: int | None) -> None:  # fmt: skip
        self.pressure.finished(endpoint, bool(self.queued))
        self._band(item.priority).fairness.completed(item.flow_id, item.priority, prompt_tokens, output_tokens)
        if self.queued:
            self._schedule(0.0)

    # --- bands ------------------------------------------------------------------------------------

    def _band(self, priority: int) -> Band:
        band = self._bands.get(priority)
        if band is None:
            spec = self.spec.band_for(priority)
            p = self.policies
            band = Band(spec, p.fairness.get(spec.fairness_ref, p.default_fairness),
                         p.ordering.get(spec.ordering_ref, p.default_ordering))  # fmt: skip
            self._bands[priority] = band
            self._order = sorted(self._bands, reverse=True)
            self.stats.band_added(band.spec)
        return band

    def band_usage(self) -> dict[int, tuple[int, int, int, int]]:
        """priority → (queued requests, queued bytes, max requests, max bytes)."""
        return {p: (b.requests, b.bytes, b.spec.max_requests, b.spec.max_bytes) for p, b in self._bands.items()}

    def close(self) -> None:
        """Shutting down: every queued request is dropped with 503 ``rejected-shutting-down``."""
        self._closed = True
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        for band in list(self._bands.values()):
            for flow in list(band.flows.values()):
                for _, _, item in list(flow.heap):
                    if item.dead or item.future is None:
                        continue
                    self._remove(item)
                    if item.future.done():  # cancelled, its waiter not yet run
                        continue
                    self.stats.finished(item, Outcome.EVICTED_OTHER, self.clock() - item.enqueued)
                    item.future.set_exception(dropped("rejected-shutting-down"))
