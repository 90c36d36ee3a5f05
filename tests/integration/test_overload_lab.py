"""The overload lab end to end (Envoy → ppc-extproc → mock engines), briefly: each phase's tenants
reach the engines with their identity headers, the engines log every scrape, and with every
engine's ``/metrics`` stalled the router still answers without a 5xx (flow control off)."""

from __future__ import annotations

from ppc_extproc_lab.workload.overload import OverloadPlan, run_overload


def test_overload_phases_run_through_envoy_and_a_stall_gives_no_5xx() -> None:
    plan = OverloadPlan(unloaded_s=2.0, loaded_s=3.0, stalled_s=2.0, max_tokens=10, decode_ms_per_token=10.0)
    result = run_overload("off", plan)
    unloaded, loaded, stalled = (result.phases[p] for p in ("unloaded", "loaded", "stalled"))
    assert unloaded.records and all(r.ok and r.priority == 0 and r.ttft is not None for r in unloaded.records)
    assert {r.tenant for r in loaded.records} == {"interactive", "batch-a", "batch-b"}
    assert all(r.ok for r in loaded.records if r.priority == 0)
    assert len(loaded.scrapes) == plan.engines and all(loaded.scrapes)
    assert len({r.endpoint for r in loaded.records if r.ok}) == plan.engines  # balanced over the pool
    assert stalled.records and stalled.server_errors() == 0
    assert all(engine == [] for engine in stalled.scrapes)  # no scrape completed while stalled
