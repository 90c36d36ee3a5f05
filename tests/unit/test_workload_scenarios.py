"""The benchmark's scenarios (a)–(f) and the outside-traffic scheduler: pure functions of the setup."""

from __future__ import annotations

import dataclasses

import pytest

from ppc_extproc_lab.workload.disturbance import EngineRestart, OutsideTraffic
from ppc_extproc_lab.workload.generator import arrivals
from ppc_extproc_lab.workload.scenarios import SCENARIOS, BaseSetup, build_scenario, expected_seconds
from ppc_extproc_lab.workload.spec import Stage, WorkloadSpec

BASE = BaseSetup()


def test_every_scenario_builds_in_report_order() -> None:
    built = [build_scenario(k, BASE) for k in SCENARIOS]
    assert [s.letter for s in built] == list("abcdef")
    assert all(s.title.startswith(f"({s.letter}) ") for s in built)
    with pytest.raises(ValueError, match="unknown scenario"):
        build_scenario("nope", BASE)


def test_each_scenario_changes_only_its_knob() -> None:
    single = build_scenario("single", BASE)
    assert (single.replicas, single.restart, single.outside) == (1, None, None)
    assert build_scenario("replicas", BASE).replicas == 3
    restart = build_scenario("restart", BASE)
    assert restart.restart == EngineRestart(7.0) and restart.replicas == 1
    outside = build_scenario("outside", BASE)
    assert outside.outside == OutsideTraffic(0.3) and outside.profile == single.profile
    for key in ("replicas", "restart", "outside"):
        sc = build_scenario(key, BASE)
        assert (sc.spec, sc.profile, sc.stages, sc.warmup_s) == (single.spec, single.profile, single.stages, 4.0)


def test_pressure_sizes_the_cache_to_the_working_set_over_the_factor() -> None:
    assert build_scenario("single", BASE).cache_ratio < 1.0
    sc = build_scenario("pressure", BASE)
    assert sc.cache_ratio == pytest.approx(1.5, rel=0.02)
    assert build_scenario("pressure", dataclasses.replace(BASE, pressure=2.0)).cache_ratio == pytest.approx(2.0, rel=0.02)


def test_long_contexts_get_room_a_faster_prefill_and_a_lower_rate() -> None:
    sc = build_scenario("long", BASE)
    spec = sc.spec
    assert [spec.context_tokens_of(t) for t in range(spec.tenants)] == [2048] * 6 + [32_768] * 2
    longest = spec.max_prompt_tokens + spec.output_tokens
    assert sc.profile.capacity_tokens >= 2 * longest  # two long sequences fit one engine
    assert sc.profile.prefill_tokens_per_s == 16_000
    assert [s.rate_per_s for s in sc.stages] == pytest.approx([6.0])


def test_a_request_that_cannot_fit_or_a_warmup_past_the_end_fails_early() -> None:
    tiny = dataclasses.replace(BASE, profile=dataclasses.replace(BASE.profile, num_blocks=40))
    with pytest.raises(ValueError, match="blocks"):
        build_scenario("single", tiny)
    with pytest.raises(ValueError, match="warm-up"):
        build_scenario("single", dataclasses.replace(BASE, warmup_s=13.0))


def test_expected_seconds_counts_every_run() -> None:
    scs = [build_scenario(k, BASE) for k in ("single", "replicas")]
    assert expected_seconds(scs, 3, startup_s=2.0, drain_s=1.0) == pytest.approx(2 * 3 * (13 + 2 + 1))


def test_outside_traffic_is_a_seeded_share_spread_round_robin() -> None:
    spec = WorkloadSpec(tenants=4, users_per_tenant=4, seed=3)
    schedule = arrivals(spec, [Stage(50.0, 20.0)])
    urls = ["http://e0", "http://e1", "http://e2"]
    plan = OutsideTraffic(0.3).plan(schedule, urls, seed=3)
    assert plan == OutsideTraffic(0.3).plan(schedule, urls, seed=3)
    assert plan != OutsideTraffic(0.3).plan(schedule, urls, seed=4)
    assert 0.25 < len(plan) / len(schedule) < 0.35
    ordered = [plan[i] for i in sorted(plan)]
    assert ordered[:6] == urls * 2
    assert OutsideTraffic(0.0).plan(schedule, urls, seed=3) == {}
    assert len(OutsideTraffic(1.0).plan(schedule, urls, seed=3)) == len(schedule)
    with pytest.raises(ValueError):
        OutsideTraffic(1.5)
    with pytest.raises(ValueError):
        OutsideTraffic(0.3).plan(schedule, [], seed=0)


def test_long_tenants_change_lengths_and_the_working_set() -> None:
    spec = WorkloadSpec(tenants=4, users_per_tenant=1, context_tokens=100, question_tokens=10, output_tokens=5,
                        turns_per_session=2, long_tenants=1, long_context_tokens=1000)  # fmt: skip
    assert [spec.context_tokens_of(t) for t in range(4)] == [100, 100, 100, 1000]
    assert spec.prompt_tokens(1, tenant=3) == 1000 + 15 + 10
    assert spec.max_prompt_tokens == 1025
    history = 10 + 5 + 10 + 5
    assert spec.working_set_tokens == 3 * 100 + 1000 + 4 * history
    with pytest.raises(ValueError):
        WorkloadSpec(long_tenants=1)
