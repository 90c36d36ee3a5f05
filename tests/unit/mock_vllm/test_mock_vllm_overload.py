"""What the overload lab relies on: ``/metrics`` gauges that lag like vLLM's (a per-step snapshot),
a log of the real waiting queue at every scrape, a stall switch, and the tenants' arithmetic."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine
from ppc_extproc_lab.mock_vllm.metrics import EngineCollector
from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, serve
from ppc_extproc_lab.workload.overload import OverloadPlan, router_config
from ppc_extproc_lab.workload.tenants import Tenant, jain_index, tenant_arrivals


def _engine() -> MockEngine:
    return MockEngine(EngineConfig(model="m", max_num_seqs=1, decode_ms_per_token=1000.0))


async def _gauges_lag_until_the_next_step() -> None:
    engine = _engine()
    collector = EngineCollector(engine, update_interval_s=3600.0)
    assert collector.gauges() == (0, 0, 0.0)
    for _ in range(3):
        engine.submit([1, 2, 3], max_tokens=8)
    await asyncio.sleep(0)  # the scheduler admits one
    assert (engine.num_running, engine.num_waiting) == (1, 2)
    assert collector.gauges() == (0, 0, 0.0)  # the snapshot of the last step is still served
    collector.update_interval_s = 0.0
    running, waiting, _ = collector.gauges()
    assert (running, waiting) == (1, 2)
    engine.close()


def test_gauges_are_a_snapshot_held_for_the_update_interval() -> None:
    asyncio.run(_gauges_lag_until_the_next_step())


async def _scrape_log_and_stall() -> None:
    options = MockVllmOptions(host="127.0.0.1", port=0, kv_events_endpoint="", max_num_seqs=1,
                              decode_ms_per_token=1000.0, metrics_update_interval_s=3600.0)  # fmt: skip
    async with serve(options) as fleet, aiohttp.ClientSession() as http:
        running = fleet.engines[0]
        url = running.url
        async with http.get(f"{url}/metrics") as response:
            assert response.status == 200
        for _ in range(3):
            running.engine.submit([1, 2, 3], max_tokens=8)
        await asyncio.sleep(0)
        async with http.get(f"{url}/metrics") as response:
            assert "vllm:num_requests_waiting{" in await response.text()
        async with http.get(f"{url}/mock/scrapes?clear=1") as response:
            log = (await response.json())["scrapes"]
        # [t, real waiting, served waiting, running]: the second scrape saw 2 waiting, served 0
        assert [entry[1:] for entry in log] == [[0, 0, 0], [2, 0, 1]]
        async with http.get(f"{url}/mock/scrapes") as response:
            assert (await response.json())["scrapes"] == []
        async with http.post(f"{url}/mock/metrics-stall", json={"stalled": True}) as response:
            assert (await response.json()) == {"stalled": True}
        scrape = asyncio.create_task(http.get(f"{url}/metrics"))
        done, _ = await asyncio.wait({scrape}, timeout=0.3)
        assert not done  # the stalled scrape hangs
        async with http.post(f"{url}/mock/metrics-stall", json={"stalled": False}) as response:
            assert response.status == 200
        response = await asyncio.wait_for(scrape, 10)
        assert response.status == 200
        response.release()
        async with http.post(f"{url}/mock/metrics-stall", json={"stalled": "yes"}) as response:
            assert response.status == 400


def test_scrape_log_records_the_real_queue_and_a_stall_hangs_metrics() -> None:
    asyncio.run(_scrape_log_and_stall())


def test_tenant_arrivals_follow_their_rates_and_are_seeded() -> None:
    tenants = [Tenant("a", "x", 0, rate=30.0, prompt_tokens=4), Tenant("b", "y", -1, rate=10.0, prompt_tokens=4)]
    arrivals = tenant_arrivals(tenants, duration_s=100.0, seed=1)
    counts = {t.name: sum(1 for _, tenant, _ in arrivals if tenant is t) for t in tenants}
    assert 2700 < counts["a"] < 3300 and 850 < counts["b"] < 1150
    assert [a[0] for a in arrivals] == sorted(a[0] for a in arrivals)
    assert all(len(prompt) == 4 for _, _, prompt in arrivals)
    assert tenant_arrivals(tenants, 5.0, seed=1) == tenant_arrivals(tenants, 5.0, seed=1)


@pytest.mark.parametrize(("values", "index"), [([5, 5, 5], 1.0), ([1, 0], 0.5), ([3, 1], 0.8), ([], 1.0)])
def test_jain_index(values: list[float], index: float) -> None:
    assert jain_index(values) == pytest.approx(index)


def test_overload_plan_capacity_and_modes() -> None:
    plan = OverloadPlan(engines=2, max_num_seqs=4, max_tokens=50, decode_ms_per_token=20.0, prompt_tokens=0)
    assert plan.capacity == pytest.approx(8.0)
    loaded = plan.tenants(True)
    assert sum(t.rate for t in loaded) == pytest.approx(16.0)
    assert [t.priority for t in loaded] == [0, -1, -1] and loaded[1].rate == pytest.approx(3 * loaded[2].rate)
    assert "flowControl" not in router_config("off", plan)
    assert router_config("on", plan)["flowControl"]["inflightCredit"] is True
    llmd = router_config("llmd", plan)
    assert llmd["flowControl"]["inflightCredit"] is False
    assert next(p for p in llmd["plugins"] if p["type"] == "utilization-detector")["parameters"]["staleMetrics"] == "saturated"
    holdback = router_config("holdback", plan)
    assert holdback["flowControl"]["usageLimitPolicyPluginRef"] == "priority-holdback-policy"
    assert holdback["schedulingProfiles"][0]["plugins"][0] == {"pluginRef": "saturation"}


def test_service_counts_uncached_tokens_prefilled_while_arrivals_last() -> None:
    from ppc_extproc_lab.workload.tenants import TenantRecord, uncached_service

    early = TenantRecord("a", -1, 0.0, 100, status=200, first_token_at=1.0, done_at=2.0, cached_tokens=40)
    late = TenantRecord("a", -1, 0.0, 100, status=200, first_token_at=9.0, done_at=9.5)
    rejected = TenantRecord("b", -1, 0.0, 100, status=429)
    other_band = TenantRecord("c", 0, 0.0, 100, status=200, first_token_at=1.0, done_at=2.0)
    records = [early, late, rejected, other_band]
    assert uncached_service(records, -1) == {"a": 160, "b": 0}
    assert uncached_service(records, -1, until=5.0) == {"a": 60, "b": 0}
