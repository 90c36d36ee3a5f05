"""A scheduling profile's totals: each scorer's scores clamped to [0, 1] and weighted."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.pickers.max_score import MaxScorePicker
from ppc_extproc.scheduling.profile import SchedulingProfile, WeightedScorer

ENDPOINTS = [Endpoint(address=f"10.0.0.{i}", port=8000) for i in range(1, 6)]


class FixedScorer:
    """Returns the same scores for every request (out-of-range ones included)."""

    type_name = "fixed-scorer"

    def __init__(self, name: str, scores: dict[EndpointId, float]) -> None:
        self.name = name
        self.scores = scores

    def score(self, ctx: SchedulingContext, endpoints: Sequence[Endpoint]) -> dict[EndpointId, float]:
        return dict(self.scores)


def test_scores_are_clamped_and_weighted_into_the_totals() -> None:
    a, b, c, d, e = (endpoint.id for endpoint in ENDPOINTS)
    wild = FixedScorer("wild", {a: -3.0, b: 7.0, c: math.nan, d: 0.25, "10.9.9.9:8000": 1.0})  # e left out
    plain = FixedScorer("plain", {a: 1.0, b: 0.0, c: 0.5, d: 0.5, e: 0.75})
    profile = SchedulingProfile(
        "default", MaxScorePicker("picker", rng=random.Random(1)), scorers=[WeightedScorer(wild, 2.0), WeightedScorer(plain, 1.0)]
    )
    result = profile.run(SchedulingContext(LLMRequest("r", "m"), list(ENDPOINTS)), ENDPOINTS)
    assert result.scores["wild"] == {a: 0.0, b: 1.0, c: 0.0, d: 0.25, e: 0.0}
    assert result.scores["plain"] == {a: 1.0, b: 0.0, c: 0.5, d: 0.5, e: 0.75}
    assert result.totals == {a: 1.0, b: 2.0, c: 0.5, d: 1.0, e: 0.75}
    assert result.targets == [ENDPOINTS[1]]
