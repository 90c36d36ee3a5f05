"""``max-score-picker``: the best total wins, ties are broken uniformly, more than one endpoint
comes back best first."""

from __future__ import annotations

import random
from collections import Counter

from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.pickers.max_score import MaxScorePicker

ENDPOINTS = [Endpoint(address=f"10.0.0.{i}", port=8000) for i in range(1, 7)]


def _ctx() -> SchedulingContext:
    return SchedulingContext(LLMRequest("r", "m"), list(ENDPOINTS))


def test_the_highest_total_wins_wherever_it_stands() -> None:
    picker = MaxScorePicker("p", rng=random.Random(1))
    for position in range(len(ENDPOINTS)):
        scored = [(e, 0.9 if i == position else 0.4) for i, e in enumerate(ENDPOINTS)]
        assert picker.pick(_ctx(), scored) == [ENDPOINTS[position]]


def test_ties_for_the_best_are_broken_uniformly_and_never_pick_a_lower_total() -> None:
    picker = MaxScorePicker("p", rng=random.Random(7))
    scored = [(e, 0.5 if i < 4 else 0.49) for i, e in enumerate(ENDPOINTS)]
    counts = Counter(picker.pick(_ctx(), scored)[0].address for _ in range(4000))
    assert set(counts) == {e.address for e in ENDPOINTS[:4]}
    assert all(800 <= n <= 1200 for n in counts.values()), counts  # 1,000 expected each


def test_several_endpoints_come_back_best_first() -> None:
    picker = MaxScorePicker("p", max_endpoints=3, rng=random.Random(3))
    totals = [0.1, 0.7, 0.3, 0.9, 0.5, 0.2]
    picked = picker.pick(_ctx(), list(zip(ENDPOINTS, totals, strict=True)))
    assert picked == [ENDPOINTS[3], ENDPOINTS[1], ENDPOINTS[4]]


def test_nothing_to_pick_from_gives_nothing() -> None:
    assert MaxScorePicker("p").pick(_ctx(), []) == []
    assert MaxScorePicker("p", max_endpoints=2).pick(_ctx(), []) == []
