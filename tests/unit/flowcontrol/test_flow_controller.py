"""The flow controller: fast path, queueing by band and flow, gating, limits, TTL, cancellation,
in-flight credit and the band starvation guarantee. Policies are the real plugins; saturation
comes from the real utilization detector over an engine-metrics store set by hand (or, where only
the gate matters, a fixed value)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import pytest

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.errors import RequestError
from ppc_extproc.flowcontrol.config import BandSpec, FlowControlSpec
from ppc_extproc.flowcontrol.controller import FlowController, FlowPolicies, Ticket
from ppc_extproc.flowcontrol.types import FlowItem, SaturationDetector
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.flowcontrol.detectors import UtilizationConfig, UtilizationDetector
from ppc_extproc.plugins.flowcontrol.fairness import GlobalStrictFairness, RoundRobinFairness
from ppc_extproc.plugins.flowcontrol.ordering import FcfsOrdering
from ppc_extproc.plugins.flowcontrol.usage_limits import HoldbackConfig, PriorityHoldbackPolicy, StaticUsageLimitPolicy
from ppc_extproc.scheduling.inflight import InflightTracker

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


class FixedSaturation(SaturationDetector):
    """A pool whose saturation the test sets."""

    name = type_name = "fixed"

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def saturation(self, endpoints: Iterable[EndpointId], extra: Mapping[EndpointId, int], unplaced: int) -> float:
        return self.value

    def stale_endpoints(self) -> int:
        return 0

    def metrics_time(self, endpoint: EndpointId) -> float | None:
        return None

    reads_polled_metrics = True

    def dispatch_weight(self, endpoints: int) -> float:
        return 0.0


def controller(detector: SaturationDetector, spec: FlowControlSpec | None = None, *, round_robin: bool = False,
               endpoints: Sequence[EndpointId] = (A,), clock: list[float] | None = None) -> FlowController:
    fairness = RoundRobinFairness("rr") if round_robin else GlobalStrictFairness("gs")
    policies = FlowPolicies(detector, StaticUsageLimitPolicy("static"), {}, {}, fairness, FcfsOrdering("fcfs"))
    now = clock or [0.0]
    return FlowController(spec or FlowControlSpec(), policies, lambda: list(endpoints), clock=lambda: now[0])


def item(request_id: str, *, priority: int = 0, flow: str = "default-flow", size: int = 100, ttl: float = 60.0,
         now: float = 0.0) -> FlowItem:
    return FlowItem(request_id, flow, priority, size, now, now, ttl)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_not_saturated_dispatches_without_queueing() -> None:
    async def run() -> None:
        fc = controller(FixedSaturation(0.2))
        ticket = await fc.admit(item("r1"))
        assert isinstance(ticket, Ticket) and fc.queued == 0 and fc.unplaced == 1
        ticket.routed(A, 50)
        assert fc.unplaced == 0
        assert fc.stats.requests == {("Dispatched", "0"): 1}

    asyncio.run(run())


def test_saturated_requests_wait_and_dispatch_in_arrival_order_when_capacity_frees() -> None:
    async def run() -> None:
        detector = FixedSaturation(1.0)
        fc = controller(detector)
        order: list[str] = []

        async def one(rid: str) -> None:
            await fc.admit(item(rid))
            order.append(rid)

        tasks = [asyncio.create_task(one(f"r{i}")) for i in range(3)]
        await settle()
        assert fc.queued == 3 and order == []
        detector.value = 0.5
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == ["r0", "r1", "r2"] and fc.queued == 0

    asyncio.run(run())


def test_higher_band_dispatches_first() -> None:
    async def run() -> None:
        detector = FixedSaturation(1.0)
        fc = controller(detector, FlowControlSpec(band_starvation_limit=0))
        order: list[str] = []

        async def one(rid: str, priority: int) -> None:
            await fc.admit(item(rid, priority=priority))
            order.append(rid)

        tasks = [asyncio.create_task(one("low", -1)), asyncio.create_task(one("high", 5)),
                 asyncio.create_task(one("mid", 0))]
        await settle()
        detector.value = 0.0
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == ["high", "mid", "low"]

    asyncio.run(run())


def test_a_request_does_not_skip_queued_requests_of_its_band() -> None:
    async def run() -> None:
        detector = FixedSaturation(1.0)
        fc = controller(detector)
        first = asyncio.create_task(fc.admit(item("first")))
        await settle()
        detector.value = 0.0  # open, but 'first' is still queued until the next cycle runs
        second = asyncio.create_task(fc.admit(item("second")))
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert fc.stats.requests[("Dispatched", "0")] == 2

    asyncio.run(run())


def test_band_request_and_byte_limits_reject_with_429() -> None:
    async def run() -> None:
        spec = FlowControlSpec(default_band=BandSpec(max_requests=2, max_bytes=1000))
        fc = controller(FixedSaturation(1.0), spec)
        waiting = [asyncio.create_task(fc.admit(item(f"r{i}"))) for i in range(2)]
        await settle()
        with pytest.raises(RequestError) as full:
            await fc.admit(item("r3"))
        assert (full.value.status, full.value.dropped_reason) == (429, "rejected-saturated")
        assert fc.stats.requests[("RejectedCapacity", "0")] == 1
        fc.close()
        for task in waiting:
            with pytest.raises(RequestError) as closed:
                await task
            assert (closed.value.status, closed.value.dropped_reason) == (503, "rejected-shutting-down")
        fc2 = controller(FixedSaturation(1.0), FlowControlSpec(default_band=BandSpec(max_bytes=150)))
        queued = asyncio.create_task(fc2.admit(item("a", size=100)))
        await settle()
        with pytest.raises(RequestError):
            await fc2.admit(item("b", size=100))  # 200 bytes > 150
        assert fc2.queued_bytes == 100
        fc2.close()
        with pytest.raises(RequestError):
            await queued

    asyncio.run(run())


def test_global_limit_counts_every_band() -> None:
    async def run() -> None:
        fc = controller(FixedSaturation(1.0), FlowControlSpec(max_requests=2))
        tasks = [asyncio.create_task(fc.admit(item("a", priority=1))), asyncio.create_task(fc.admit(item("b", priority=-1)))]
        await settle()
        with pytest.raises(RequestError) as full:
            await fc.admit(item("c", priority=7))
        assert full.value.status == 429
        fc.close()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())


def test_ttl_expiry_is_429_ttl_expired_and_503_without_endpoints() -> None:
    async def run() -> None:
        fc = controller(FixedSaturation(1.0))
        with pytest.raises(RequestError) as expired:
            await asyncio.wait_for(fc.admit(item("r1", ttl=0.02)), 5)
        assert (expired.value.status, expired.value.dropped_reason) == (429, "rejected-ttl-expired")
        assert fc.queued == 0 and fc.stats.requests[("EvictedTTL", "0")] == 1
        empty = controller(FixedSaturation(0.0), FlowControlSpec(no_endpoint_ttl=0.02), endpoints=())
        with pytest.raises(RequestError) as none:
            await asyncio.wait_for(empty.admit(item("r2")), 5)
        assert (none.value.status, none.value.dropped_reason) == (503, "rejected-no-endpoints")

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_the_queue_at_once() -> None:
    async def run() -> None:
        detector = FixedSaturation(1.0)
        fc = controller(detector)
        gone = asyncio.create_task(fc.admit(item("gone", size=300)))
        stays = asyncio.create_task(fc.admit(item("stays")))
        await settle()
        assert fc.queued == 2
        gone.cancel()
        await settle()
        assert (fc.queued, fc.queued_bytes) == (1, 100)
        assert fc.stats.requests[("EvictedContextCancelled", "0")] == 1
        detector.value = 0.0
        ticket = await asyncio.wait_for(stays, 5)
        assert ticket.item.request_id == "stays" and fc.unplaced == 1  # the cancelled one never dispatched

    asyncio.run(run())


def test_round_robin_alternates_flows() -> None:
    async def run() -> None:
        detector = FixedSaturation(1.0)
        fc = controller(detector, round_robin=True)
        order: list[str] = []

        async def one(rid: str, flow: str) -> None:
            await fc.admit(item(rid, flow=flow))
            order.append(rid)

        tasks = [asyncio.create_task(one(f"a{i}", "tenant-a")) for i in range(3)]
        tasks += [asyncio.create_task(one(f"b{i}", "tenant-b")) for i in range(3)]
        await settle()
        detector.value = 0.0
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]

    asyncio.run(run())


def test_no_band_starves_under_sustained_higher_priority_load() -> None:
    """With bandStarvationLimit N, a queued low-priority request waits at most N dispatches of
    other bands; with 0 (llm-d's strict priority) it waits for every high-priority request."""

    async def dispatched_before_low(limit: int) -> int:
        detector = FixedSaturation(1.0)
        fc = controller(detector, FlowControlSpec(band_starvation_limit=limit))
        order: list[str] = []

        async def one(rid: str, priority: int) -> None:
            await fc.admit(item(rid, priority=priority))
            order.append(rid)

        tasks = [asyncio.create_task(one("low", -1))]
        tasks += [asyncio.create_task(one(f"high{i}", 0)) for i in range(30)]
        await settle()
        detector.value = 0.5
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return order.index("low")

    assert asyncio.run(dispatched_before_low(5)) == 5
    assert asyncio.run(dispatched_before_low(0)) == 30


def test_the_starvation_guard_does_not_open_a_band_its_usage_limit_holds_back() -> None:
    """Holdback ceiling 0.5 for band −1: at saturation 0.6 the guard (limit 2) owes band −1 a turn
    after two band-0 dispatches, but its ceiling keeps it queued and band 0 goes on; below the
    ceiling the guard gives it its turn."""

    async def low_position(saturation: float) -> int | None:
        detector = FixedSaturation(1.0)
        holdback = PriorityHoldbackPolicy("h", HoldbackConfig(min_ceiling=0.5))
        policies = FlowPolicies(detector, holdback, {}, {}, GlobalStrictFairness("gs"), FcfsOrdering("fcfs"))
        fc = FlowController(FlowControlSpec(band_starvation_limit=2), policies, lambda: [A], clock=lambda: 0.0)
        order: list[str] = []

        async def one(rid: str, priority: int) -> None:
            await fc.admit(item(rid, priority=priority))
            order.append(rid)

        low = asyncio.create_task(one("low", -1))
        highs = [asyncio.create_task(one(f"high{i}", 0)) for i in range(6)]
        await settle()
        detector.value = saturation
        await asyncio.wait_for(asyncio.gather(*highs), 5)
        # band 0 arriving now, with band −1 still queued and owed, skips the queue only if band −1 is held back
        late = await asyncio.wait_for(fc.admit(item("late", priority=0)), 5)
        assert late is not None
        await settle()
        if not low.done():
            low.cancel()
            await asyncio.gather(low, return_exceptions=True)
            return None
        return order.index("low")

    assert asyncio.run(low_position(0.6)) is None  # held back: never dispatched by the guard
    assert asyncio.run(low_position(0.3)) == 2


def test_in_flight_credit_bounds_a_burst_between_scrapes() -> None:
    """Metrics say the engine is idle; without credit every queued request dispatches at once,
    with it only ``queueDepthThreshold`` per endpoint until the next scrape shows them."""

    async def burst(credit: bool) -> int:
        now = [100.0]
        store = EngineMetricsStore(clock=lambda: now[0], stale_after_seconds=None)
        store.set(A, EngineMetrics(0, 0, 0.0, None, None, updated_at=now[0]))
        detector = UtilizationDetector("u", UtilizationConfig(staleness_seconds=10.0), store, InflightTracker(),
                                       clock=lambda: now[0])
        fc = controller(detector, FlowControlSpec(inflight_credit=credit), clock=now)
        routed = 0

        async def one(rid: str) -> None:
            nonlocal routed
            now[0] += 0.001
            ticket = await fc.admit(item(rid, now=now[0]))
            ticket.routed(A, 10)
            routed += 1

        tasks = [asyncio.create_task(one(f"r{i}")) for i in range(20)]
        await asyncio.sleep(0.05)
        count = routed
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return count

    assert asyncio.run(burst(credit=False)) == 20
    assert asyncio.run(burst(credit=True)) == 5


def test_completions_since_the_scrape_free_their_credit() -> None:
    """A request that finished since the last scrape gives its place back at once: with 5 routed
    and 3 finished since the scrape, 3 more may dispatch before the next scrape."""

    async def run() -> int:
        now = [100.0]
        store = EngineMetricsStore(clock=lambda: now[0], stale_after_seconds=None)
        store.set(A, EngineMetrics(0, 0, 0.0, None, None, updated_at=now[0]))
        detector = UtilizationDetector("u", UtilizationConfig(staleness_seconds=10.0), store, InflightTracker(),
                                       clock=lambda: now[0])
        fc = controller(detector, clock=now)
        tickets = []
        for i in range(5):
            now[0] += 0.001
            ticket = await fc.admit(item(f"r{i}", now=now[0]))
            ticket.routed(A, 10)
            tickets.append(ticket)
        assert fc.saturation() == pytest.approx(1.0)
        for ticket in tickets[:3]:
            now[0] += 0.001
            ticket.finished(10, 1)
        waiting = [asyncio.create_task(fc.admit(item(f"q{i}", now=now[0]))) for i in range(5)]
        await asyncio.sleep(0.05)
        done = [t for t in waiting if t.done()]
        for task in done:
            task.result().routed(A, 10)
        await asyncio.sleep(0.05)
        dispatched = sum(t.done() for t in waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return dispatched

    assert asyncio.run(run()) == 3


def test_a_client_leaving_in_the_dispatch_tick_is_not_dispatched() -> None:
    """The waiter is cancelled (its future too) and the dispatcher runs before the waiter's
    cleanup: the request is evicted, nothing counts it as dispatched."""

    async def run() -> None:
        detector = FixedSaturation(1.0)
        fc = controller(detector)
        waiter = asyncio.create_task(fc.admit(item("leaving")))
        await settle()
        detector.value = 0.0
        fc.pressure._at = float("-inf")  # the next read recomputes
        waiter.cancel()
        fc._cycle()  # before the waiter runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (fc.queued, fc.unplaced) == (0, 0)
        assert fc.stats.requests.get(("Dispatched", "0"), 0) == 0
        assert fc.stats.requests[("EvictedContextCancelled", "0")] == 1

    asyncio.run(run())
