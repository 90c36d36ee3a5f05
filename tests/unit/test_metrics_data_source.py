"""metrics-data-source + core-metrics-extractor with an in-memory fetch (no sockets): pool
following, staleness, slow and dead engines, bounded concurrency, lifecycle, parameters."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from polled_metrics import Polled

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.datalayer import CoreMetricsExtractor, MetricsDataSource, PollOptions
from ppc_extproc.plugins.registry import Services, SourceWiring
from ppc_extproc.scheduling.pool import EndpointPool

T = TypeVar("T")
A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("fd00::3", 8000)
FAST = PollOptions(interval_seconds=0.005, timeout_seconds=0.05, max_backoff_seconds=0.02)


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
        polled = Polled(FAST, engines)
        source = polled.source
        pool = EndpointPool()
        pool.replace([A])  # known before subscribing: polled once started
        pool.subscribe(source.on_endpoint_event)
        assert polled.snapshot(A) is None
        await source.start()
        try:
            await until(lambda: polled.snapshot(A) is not None)
            assert polled.snapshot(A).waiting == 3  # type: ignore[union-attr]
            pool.replace([A, C])  # IPv6 endpoint: bracketed URL
            await until(lambda: polled.snapshot(C) is not None)
            assert url(C) in engines.calls
            engines.bodies[url(A)] = body(9)
            await until(lambda: polled.snapshot(A).waiting == 9)  # type: ignore[union-attr]
            pool.replace([C])
            assert polled.snapshot(A) is None and source.endpoints() == [C.id]
            calls = engines.calls[url(A)]
            await until(lambda: engines.calls[url(C)] > calls + 5)
            assert engines.calls[url(A)] <= calls + 1  # no more scrapes of a deleted endpoint
        finally:
            await source.stop()
        assert not source.running and polled.snapshot(C) is not None  # readable after stop

    run(main)


def test_stale_after_n_intervals_without_a_successful_scrape() -> None:
    async def main() -> None:
        now = [100.0]
        engines = FakeEngines()
        options = PollOptions(interval_seconds=0.005, max_backoff_seconds=0.01)
        polled = Polled(options, engines, clock=lambda: now[0], stale_after_seconds=0.05)
        source = polled.source
        polled.add(A)
        await source.start()
        try:
            await until(lambda: polled.snapshot(A) is not None)
            engines.fail.add(url(A))
            await until(lambda: polled.target(A)["consecutiveFailures"] >= 2)
            now[0] += 0.05  # exactly the staleness window: still fresh
            assert polled.snapshot(A).stale is False  # type: ignore[union-attr]
            now[0] += 0.001
            snap = polled.snapshot(A)
            assert snap is not None and snap.stale and snap.waiting == 0
            assert "ConnectionRefusedError" in polled.target(A)["lastError"]
            engines.fail.clear()
            await until(lambda: not polled.snapshot(A).stale)  # type: ignore[union-attr]
        finally:
            await source.stop()

    run(main)


def test_a_hung_engine_does_not_delay_the_others() -> None:
    async def main() -> None:
        engines = FakeEngines()
        engines.hang.add(url(B))
        polled = Polled(FAST, engines)
        source = polled.source
        polled.add(A)
        polled.add(B)
        await source.start()
        try:
            await until(lambda: polled.target(B)["consecutiveFailures"] >= 2)  # timeouts
            before = polled.target(A)["polls"]
            await until(lambda: polled.target(A)["polls"] >= before + 10, timeout=2.0)
            assert polled.snapshot(B) is None
            assert polled.target(B)["lastError"] == "TimeoutError"
        finally:
            await source.stop()

    run(main)


def test_concurrency_is_bounded() -> None:
    async def main() -> None:
        engines = FakeEngines()
        endpoints = [Endpoint(f"10.0.1.{i}", 8000) for i in range(6)]
        engines.hang.update(url(e) for e in endpoints)
        options = PollOptions(interval_seconds=0.005, timeout_seconds=5.0, max_concurrency=2)
        polled = Polled(options, engines)
        source = polled.source
        for e in endpoints:
            polled.add(e)
        await source.start()
        try:
            await until(lambda: engines.active == 2)
            for _ in range(100):  # give a third scrape every chance to start (it must not)
                await asyncio.sleep(0)
            assert engines.max_active == 2
            engines.release.set()
            await until(lambda: all(polled.snapshot(e) is not None for e in endpoints))
        finally:
            await source.stop()

    run(main)


def test_a_response_without_vllm_gauges_is_a_failure() -> None:
    async def main() -> None:
        engines = FakeEngines()
        engines.bodies[url(A)] = b"# not vLLM\nprocess_cpu_seconds_total 1.0\n"
        polled = Polled(FAST, engines)
        source = polled.source
        polled.add(A)
        await source.start()
        try:
            await until(lambda: polled.target(A)["consecutiveFailures"] >= 1)
            assert polled.snapshot(A) is None
            assert "no vllm load metrics" in polled.target(A)["lastError"]
            assert source.extract_errors >= 1 and source.poll_errors == 0
        finally:
            await source.stop()

    run(main)


def test_pool_events_from_another_thread_reach_the_loop() -> None:
    async def main() -> None:
        engines = FakeEngines()
        polled = Polled(FAST, engines)
        source = polled.source
        pool = EndpointPool()
        pool.subscribe(source.on_endpoint_event)
        await source.start()
        try:
            thread = threading.Thread(target=pool.replace, args=([A, B],))
            thread.start()
            await asyncio.to_thread(thread.join)
            await until(lambda: polled.snapshot(A) is not None and polled.snapshot(B) is not None)
            thread = threading.Thread(target=pool.replace, args=([B],))
            thread.start()
            await asyncio.to_thread(thread.join)
            await until(lambda: polled.snapshot(A) is None)
        finally:
            await source.stop()

    run(main)


def test_start_is_idempotent_and_stop_without_start_is_harmless() -> None:
    async def main() -> None:
        source = Polled(FAST, FakeEngines()).source
        await source.stop()
        await source.start()
        await source.start()
        assert source.running
        await source.stop()
        await source.stop()

    run(main)


def test_options_validation() -> None:
    with pytest.raises(ValueError):
        PollOptions(interval_seconds=0)
    with pytest.raises(ValueError):
        PollOptions(max_concurrency=0)


def source_from(params: dict) -> MetricsDataSource:  # type: ignore[type-arg]
    section = Section(params, "plugins[0].parameters", "metrics-data-source")
    source = MetricsDataSource.from_wiring("metrics-data-source", section, Services(), SourceWiring())
    section.finish()
    return source


def test_parameters_with_llm_d_names_defaults_and_interval_rounding() -> None:
    default = source_from({})
    assert default.options.interval_seconds == pytest.approx(0.05) and default.options.path == "/metrics"
    assert default.options.scheme == "http" and default.options.port is None
    assert source_from({"interval": "120ms"}).options.interval_seconds == pytest.approx(0.15)  # a multiple of 50 ms
    assert source_from({"interval": "10ms"}).options.interval_seconds == pytest.approx(0.05)  # at least one tick
    custom = source_from({"scheme": "https", "path": "/m", "port": 9100, "insecureSkipVerify": False})
    assert custom._url(A) == "https://10.0.0.1:9100/m" and not custom.options.insecure_skip_verify
    with pytest.raises(ConfigError, match=r"parameters\.port: invalid port 70000"):
        source_from({"port": 70000})
    with pytest.raises(ConfigError, match="clientCertPath and clientKeyPath go together"):
        source_from({"clientCertPath": "/c.pem"})
    with pytest.raises(ConfigError, match=r"parameters\.scheme"):
        source_from({"scheme": "ftp"})
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        source_from({"bogus": 1})


def test_the_store_goes_stale_after_twenty_polls_of_the_configured_interval() -> None:
    services = Services()
    section = Section({"interval": "200ms"}, "p", "metrics-data-source")
    MetricsDataSource.from_wiring("m", section, services, SourceWiring())
    assert services.engine_metrics.stale_after_seconds == pytest.approx(4.0)


def _adaptive(engines: FakeEngines, inflight: dict[str, int]) -> Polled:
    """A source polling every 5 ms, backing off to 40 ms while the load stands still."""
    options = PollOptions(interval_seconds=0.005, max_interval_seconds=0.04, timeout_seconds=0.05, max_backoff_seconds=0.02)
    polled = Polled(options, engines)

    def load(endpoint_id: str) -> tuple[object, ...] | None:
        m = polled.store.snapshot(endpoint_id)
        return None if m is None else (m.waiting, m.running, m.kv_usage)

    extractor = CoreMetricsExtractor("core-metrics-extractor", polled.store)
    polled.source = MetricsDataSource("metrics-data-source", options, extractors=[extractor], fetch=engines, load=load,
                                      inflight=lambda endpoint_id: inflight.get(endpoint_id, 0))  # fmt: skip
    return polled


def test_adaptive_polling_backs_off_while_the_load_stands_still_and_returns_when_it_moves() -> None:
    async def main() -> None:
        engines, inflight = FakeEngines(), {}
        polled = _adaptive(engines, inflight)
        polled.add(A)
        await polled.source.start()
        try:
            await until(lambda: polled.target(A)["intervalSeconds"] == 0.04)  # 5 → 10 → 20 → 40 ms, no further
            polls = polled.target(A)["polls"]
            await until(lambda: polled.target(A)["polls"] >= polls + 2)
            assert polled.target(A)["intervalSeconds"] == 0.04
            engines.bodies[url(A)] = body(7)  # the load moved: back to the base interval
            await until(lambda: polled.snapshot(A).waiting == 7)  # type: ignore[union-attr]
            await until(lambda: polled.target(A)["intervalSeconds"] == 0.005)
            await until(lambda: polled.target(A)["intervalSeconds"] == 0.04)  # and still again
        finally:
            await polled.source.stop()

    run(main)


def test_adaptive_polling_wakes_when_this_service_routes_to_the_endpoint() -> None:
    async def main() -> None:
        engines, inflight = FakeEngines(), {}
        options = PollOptions(interval_seconds=0.005, max_interval_seconds=30.0, timeout_seconds=0.05)
        polled = _adaptive(engines, inflight)
        polled.source.options = options
        polled.add(A)
        await polled.source.start()
        try:
            await until(lambda: polled.target(A)["intervalSeconds"] >= 1.0)  # backed off far
            polls = polled.target(A)["polls"]
            inflight[A.id] = 1  # a request routed there: polled again within the movement check,
            # then at the base interval again (backing off anew), not after the old 30 s wait
            await until(lambda: polled.target(A)["polls"] >= polls + 3)
        finally:
            await polled.source.stop()

    run(main)


def test_max_interval_parameter_defaults_to_one_second_and_zero_disables_it() -> None:
    services = Services()
    adaptive = MetricsDataSource.from_wiring("m", Section({}, "p", "metrics-data-source"), services, SourceWiring())
    assert adaptive.options.max_interval_seconds == pytest.approx(1.0) and adaptive.adaptive
    assert services.engine_metrics.stale_after_seconds == pytest.approx(3.0)  # 3 × maxInterval
    fixed = MetricsDataSource.from_wiring("m", Section({"maxInterval": "0s"}, "p", "metrics-data-source"), Services(), SourceWiring())
    assert fixed.options.max_interval_seconds is None and not fixed.adaptive
