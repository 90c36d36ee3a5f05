"""active-request-scorer: llm-d's formula, relative to the busiest candidate
(``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/scorer/activerequest/active_request.go``)."""

from __future__ import annotations

from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.scorers.active_request import ActiveRequestScorer
from ppc_extproc.scheduling.inflight import InflightTracker

A, B, C, D = (Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5))
ENDPOINTS = [A, B, C, D]


def scores(scorer: ActiveRequestScorer, counts: list[int]) -> list[float]:
    """The scores of A..D with ``counts`` requests in flight on each (real tracker and producer)."""
    tracker = InflightTracker()
    for endpoint, n in zip(ENDPOINTS, counts):
        for i in range(n):
            tracker.start(f"{endpoint.id}/{i}", endpoint.id)
    ctx = SchedulingContext(LLMRequest("r", "m"), ENDPOINTS)
    InflightLoadProducer("inflight-load-producer", tracker).produce(ctx)
    out = scorer.score(ctx, ENDPOINTS)
    return [out[e.id] for e in ENDPOINTS]


def test_llmd_formula_is_relative_to_the_busiest_candidate() -> None:
    s = ActiveRequestScorer("a")
    assert scores(s, [0, 0, 0, 0]) == [1.0] * 4
    assert scores(s, [2, 1, 1, 0]) == [0.0, 0.5, 0.5, 1.0]
    assert scores(s, [3, 3, 3, 3]) == [0.0] * 4
    # Scale-free: one request in flight is as "busy" as forty (llm-d's active_request.go).
    assert scores(s, [1, 0, 0, 0]) == scores(s, [40, 0, 0, 0]) == [0.0, 1.0, 1.0, 1.0]


def test_llmd_idle_threshold_and_max_busy_score() -> None:
    s = ActiveRequestScorer("a", idle_threshold=1, max_busy_score=0.5)
    assert scores(s, [4, 2, 1, 0]) == [0.0, 0.25, 1.0, 1.0]
