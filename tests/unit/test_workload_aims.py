"""Issue #14's aims: which policy is ours' best, which peer is the best, level / 3× / oracle share."""

from __future__ import annotations

import math

import pytest

from ppc_extproc_lab.workload.aims import FAST_SCENARIOS, Aim, PolicyNumbers, best, scenario_aims


def n(name: str, kind: str, hit: float, p90: float) -> PolicyNumbers:
    return PolicyNumbers(name, kind, hit, p90)


RUNS = [
    n("round-robin", "ours", 0.40, 4.0),
    n("approximate", "ours", 0.70, 1.2),
    n("precise+load", "ours", 0.86, 0.25),
    n("vllm-router", "peer", 0.65, 3.4),
    n("sglang-router", "peer", 0.66, 7.5),
    n("oracle", "oracle", 0.87, 0.30),
]


def by_text(aims: list[Aim]) -> dict[str, Aim]:
    return {a.text: a for a in aims}


def test_best_is_per_kind_and_metric() -> None:
    runs = [n("a", "ours", 0.8, 0.3), n("b", "ours", 0.7, 0.2), n("c", "peer", 0.9, 0.1), n("d", "ours", math.nan, 9)]
    assert best(runs, "ours", "hit_rate") == runs[0]
    assert best(runs, "ours", "ttft_p90_s") == runs[1]
    assert best(runs, "peer", "hit_rate") == runs[2]
    assert best([n("x", "ours", math.nan, math.nan)], "ours", "hit_rate") is None


def test_each_aim_compares_our_best_with_the_best_peer_on_that_metric() -> None:
    runs = [n("approximate", "ours", 0.84, 0.70), n("precise+load", "ours", 0.86, 0.74),
            n("vllm-router", "peer", 0.86, 0.66), n("oracle", "oracle", 0.88, 0.5)]  # fmt: skip
    aims = by_text(scenario_aims("outside", runs))
    assert aims["hit rate precise+load − vllm-router"].met
    assert aims["TTFT p90 vllm-router / approximate"].value == pytest.approx(0.66 / 0.70)
    assert aims["hit rate precise+load / oracle"].value == pytest.approx(0.86 / 0.88)


def test_replicas_scenario_compares_with_the_best_peer_per_metric() -> None:
    aims = by_text(scenario_aims("replicas", RUNS))
    hit = aims["hit rate precise+load − sglang-router"]  # the peer with the higher hit rate
    assert hit.value == pytest.approx(20.0) and hit.met
    level = aims["TTFT p90 vllm-router / precise+load"]  # the peer with the lower p90
    assert level.value == pytest.approx(3.4 / 0.25) and level.met
    fast = aims["TTFT p90 vllm-router / precise+load (3× faster)"]
    assert fast.target == 3.0 and fast.met
    share = aims["hit rate precise+load / oracle"]
    assert share.value == pytest.approx(0.86 / 0.87) and share.met


def test_one_router_scenario_asks_only_for_level() -> None:
    aims = scenario_aims("single", RUNS)
    assert "single" not in FAST_SCENARIOS and "long" not in FAST_SCENARIOS
    assert not any("3×" in a.text for a in aims)
    assert len(aims) == 3


def test_level_allows_ten_percent() -> None:
    runs = [n("precise+load", "ours", 0.80, 0.50), n("vllm-router", "peer", 0.805, 0.46)]
    aims = by_text(scenario_aims("single", runs))
    assert aims["hit rate precise+load − vllm-router"].met  # −0.5 points
    assert aims["TTFT p90 vllm-router / precise+load"].met  # 0.92 ≥ 1 / 1.1


def test_misses_are_reported_as_not_met() -> None:
    runs = [n("precise+load", "ours", 0.80, 0.50), n("vllm-router", "peer", 0.82, 0.40), n("oracle", "oracle", 0.90, 1)]
    aims = by_text(scenario_aims("pressure", runs))
    assert not aims["hit rate precise+load − vllm-router"].met  # −2 points < −1
    level = aims["TTFT p90 vllm-router / precise+load"]
    assert level.value == pytest.approx(0.8) and not level.met  # ours 25 % slower: not level
    assert not aims["TTFT p90 vllm-router / precise+load (3× faster)"].met
    assert not aims["hit rate precise+load / oracle"].met  # 0.889 < 0.97
    assert "✗" in aims["hit rate precise+load / oracle"].line()


def test_missing_policies_leave_their_aims_out_and_nan_is_not_met() -> None:
    assert scenario_aims("replicas", [n("oracle", "oracle", 0.9, 0.2)]) == []
    only_ours = scenario_aims("replicas", [n("precise+load", "ours", 0.9, 0.2)])
    assert only_ours == []
    nan_peer = scenario_aims("single", [n("precise+load", "ours", 0.9, 0.2), n("vllm-router", "peer", math.nan, math.nan)])
    assert nan_peer == []
    assert not Aim("x", math.nan, 1.0).met
    assert Aim("y", 0.5, 1.0, at_least=False).met
