"""EngineMetricsSource with an in-memory fetch (no sockets): pool following, staleness, slow and
dead engines, bounded concurrency, lifecycle."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from ppc_extproc.enginemetrics import EngineMetricsOptions, EngineMetricsSource
from ppc_extproc.plugins.registry import Services
from ppc_extproc.scheduling import Endpoint
from ppc_extproc.scheduling.pool import EndpointPool

T = TypeVar("T")
A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("fd00::3", 8000)
FAST = EngineMetricsOptions(interval_seconds=0.005, timeout_seconds=0.05, max_backoff_seconds=0.02)


def body(waiting: int) -> bytes:
    return f"vllm:num_requests_waiting {waiting}\nvllm:kv_cache_usage_perc 0.5\n".encode()


def run(factory: Callable[[], Awaitable[T]], timeout: float = 20.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(main())


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.002)


class FakeEngines:
    """url → behaviour; counts calls and concurrency."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.hang: set[str] = set()
        self.fail: set[str] = set()
        self.calls: dict[str, int] = {}
        self.active = 0
        self.max_active = 0
        self.release = asyncio.Event()

    async def __call__(self, url: str) -> bytes:
        self.calls[url] = self.calls.get(url, 0) + 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if url in self.hang:
                await self.release.wait()
            if url in self.fail:
                raise ConnectionRefusedError("connection refused")
            return self.bodies.get(url, body(0))
        finally:
            self.active -= 1


def url(endpoint: Endpoint) -> str:
    host = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
    return f"http://{host}:{endpoint.port}/metrics"


def test_follows_the_pool_and_serves_snapshots() -> None:
    async def main() -> None:
        engines = FakeEngines()
        engines.bodies[url(A)] = body(3)
        source = EngineMetricsSource(FAST, fetch=engines)
        pool = EndpointPool()
        pool.replace([A])  # known before attach: scraped once started
        source.attach(pool)
        assert source.snapshot(A.id) is None
        await source.start()
        try:
            await until(lambda: source.snapshot(A.id) is not None)
            assert source.snapshot(A.id).waiting == 3  # type: ignore[union-attr]
            pool.replace([A, C])  # IPv6 endpoint: bracketed URL
            await until(lambda: source.snapshot(C.id) is not None)
            assert url(C) in engines.calls
            engines.bodies[url(A)] = body(9)
            await until(lambda: source.snapshot(A.id).waiting == 9)  # type: ignore[union-attr]
            pool.replace([C])
            assert source.snapshot(A.id) is None and source.endpoints() == [C.id]
            calls = engines.calls[url(A)]
            await until(lambda: engines.calls[url(C)] > calls + 5)
            assert engines.calls[url(A)] <= calls + 1  # no more scrapes of a deleted endpoint
        finally:
            await source.stop()
        assert not source.running and source.snapshot(C.id) is not None  # readable after stop

    run(main)


def test_stale_after_n_intervals_without_a_successful_scrape() -> None:
    async def main() -> None:
        now = [100.0]
        engines = FakeEngines()
        options = EngineMetricsOptions(interval_seconds=0.005, stale_after_intervals=10, max_backoff_seconds=0.01)
        source = EngineMetricsSource(options, clock=lambda: now[0], fetch=engines)
        source.add_endpoint(A)
        await source.start()
        try:
            await until(lambda: source.snapshot(A.id) is not None)
            engines.fail.add(url(A))
            await until(lambda: source.state()[A.id]["consecutiveFailures"] >= 2)
            now[0] += 0.05  # exactly 10 intervals: still fresh
            assert source.snapshot(A.id).stale is False  # type: ignore[union-attr]
            now[0] += 0.001
            snap = source.snapshot(A.id)
            assert snap is not None and snap.stale and snap.waiting == 0
            assert "ConnectionRefusedError" in source.state()[A.id]["lastError"]
            engines.fail.clear()
            await until(lambda: not source.snapshot(A.id).stale)  # type: ignore[union-attr]
        finally:
            await source.stop()

    run(main)


def test_a_hung_engine_does_not_delay_the_others() -> None:
    async def main() -> None:
        engines = FakeEngines()
        engines.hang.add(url(B))
        source = EngineMetricsSource(FAST, fetch=engines)
        source.add_endpoint(A)
        source.add_endpoint(B)
        await source.start()
        try:
            await until(lambda: source.state()[B.id]["consecutiveFailures"] >= 2)  # timeouts
            before = source.state()[A.id]["scrapes"]
            await until(lambda: source.state()[A.id]["scrapes"] >= before + 10, timeout=2.0)
            assert source.snapshot(B.id) is None
            assert source.state()[B.id]["lastError"] == "TimeoutError"
        finally:
            await source.stop()

    run(main)


def test_concurrency_is_bounded() -> None:
    async def main() -> None:
        engines = FakeEngines()
        endpoints = [Endpoint(f"10.0.1.{i}", 8000) for i in range(6)]
        engines.hang.update(url(e) for e in endpoints)
        options = EngineMetricsOptions(interval_seconds=0.005, timeout_seconds=5.0, max_concurrency=2)
        source = EngineMetricsSource(options, fetch=engines)
        for e in endpoints:
            source.add_endpoint(e)
        await source.start()
        try:
            await until(lambda: engines.active == 2)
            for _ in range(100):  # give a third scrape every chance to start (it must not)
                await asyncio.sleep(0)
            assert engines.max_active == 2
            engines.release.set()
            await until(lambda: all(source.snapshot(e.id) is not None for e in endpoints))
        finally:
            await source.stop()

    run(main)


def test_a_response_without_vllm_gauges_is_a_failure() -> None:
    async def main() -> None:
        engines = FakeEngines()
        engines.bodies[url(A)] = b"# not vLLM\nprocess_cpu_seconds_total 1.0\n"
        source = EngineMetricsSource(FAST, fetch=engines)
        source.add_endpoint(A)
        await source.start()
        try:
            await until(lambda: source.state()[A.id]["consecutiveFailures"] >= 1)
            assert source.snapshot(A.id) is None
            assert "no vLLM gauges" in source.state()[A.id]["lastError"]
        finally:
            await source.stop()

    run(main)


def test_pool_events_from_another_thread_reach_the_loop() -> None:
    async def main() -> None:
        engines = FakeEngines()
        source = EngineMetricsSource(FAST, fetch=engines)
        pool = EndpointPool()
        source.attach(pool)
        await source.start()
        try:
            thread = threading.Thread(target=pool.replace, args=([A, B],))
            thread.start()
            await asyncio.to_thread(thread.join)
            await until(lambda: source.snapshot(A.id) is not None and source.snapshot(B.id) is not None)
            thread = threading.Thread(target=pool.replace, args=([B],))
            thread.start()
            await asyncio.to_thread(thread.join)
            await until(lambda: source.snapshot(A.id) is None)
        finally:
            await source.stop()

    run(main)


def test_start_is_idempotent_and_stop_without_start_is_harmless() -> None:
    async def main() -> None:
        source = EngineMetricsSource(FAST, fetch=FakeEngines())
        await source.stop()
        await source.start()
        await source.start()
        assert source.running
        await source.stop()
        await source.stop()

    run(main)


def test_options_validation_and_services_share_one_source() -> None:
    with pytest.raises(ValueError):
        EngineMetricsOptions(interval_seconds=0)
    with pytest.raises(ValueError):
        EngineMetricsOptions(max_concurrency=0)
    assert EngineMetricsOptions().stale_after_seconds == pytest.approx(1.0)
    services = Services()
    first = services.engine_metrics_source()
    assert isinstance(first, EngineMetricsSource) and services.engine_metrics_source() is first
    assert not first.running  # created, not started
