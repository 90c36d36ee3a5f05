"""queue-scorer, running-requests-size-scorer, kv-cache-utilization-scorer, load-aware-scorer:
formulas and the missing / stale metrics policy."""

from __future__ import annotations

import pytest

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, create_plugin
from ppc_extproc.plugins.scorers import (
    KVCacheUtilizationScorer,
    LoadAwareScorer,
    QueueScorer,
    RunningRequestsScorer,
)

A, B, C, D = (Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5))


def metrics(waiting: int | None = 0, running: int | None = 0, kv: float | None = 0.0, stale: bool = False) -> EngineMetrics:
    return EngineMetrics(waiting, running, kv, 16, 1000, updated_at=1.0, stale=stale)


def fleet(**per_endpoint: EngineMetrics | None) -> EngineMetricsStore:
    by_name = {"A": A, "B": B, "C": C, "D": D}
    initial = {by_name[k].id: m for k, m in per_endpoint.items() if m is not None}
    return EngineMetricsStore(initial, stale_after_seconds=None)  # staleness is each snapshot's flag here


def score(scorer: object, *endpoints: Endpoint) -> dict[str, float]:
    ctx = SchedulingContext(LLMRequest("r", "m"), list(endpoints))
    return scorer.score(ctx, list(endpoints))  # type: ignore[attr-defined, no-any-return]


def build(type_name: str, reader: EngineMetricsStore, params: dict | None = None) -> object:
    return create_plugin(type_name, type_name, Section(params or {}, "parameters", type_name), Services(engine_metrics=reader))


# --- queue-scorer ---------------------------------------------------------------------------------


def test_queue_min_max_over_candidates() -> None:
    reader = fleet(A=metrics(waiting=0), B=metrics(waiting=5), C=metrics(waiting=10))
    assert score(QueueScorer("q", reader), A, B, C) == {A.id: 1.0, B.id: 0.5, C.id: 0.0}


def test_queue_all_equal_and_single_candidate_score_one() -> None:
    reader = fleet(A=metrics(waiting=7), B=metrics(waiting=7))
    assert score(QueueScorer("q", reader), A, B) == {A.id: 1.0, B.id: 1.0}
    assert score(QueueScorer("q", reader), A) == {A.id: 1.0}


def test_queue_missing_and_stale_score_the_mean_and_stay_out_of_the_range() -> None:
    reader = fleet(A=metrics(waiting=2), B=metrics(waiting=4), C=metrics(waiting=100, stale=True))
    scores = score(QueueScorer("q", reader), A, B, C, D)  # D: no scrape yet
    # C's huge stale queue does not stretch the range; C and D keep a share (neither best nor worst)
    assert scores == {A.id: 1.0, B.id: 0.0, C.id: 0.5, D.id: 0.5}


def test_an_endpoint_without_metrics_ties_with_idle_ones() -> None:
    """SGLang without --enable-metrics (404 on /metrics) still gets its share of an idle fleet."""
    reader = fleet(A=metrics(waiting=0), B=metrics(waiting=0))
    assert score(QueueScorer("q", reader), A, B, C) == {A.id: 1.0, B.id: 1.0, C.id: 1.0}


def test_queue_no_metrics_at_all_scores_nobody() -> None:
    assert score(QueueScorer("q", fleet()), A, B) == {}


def test_queue_scorer_from_config_uses_the_shared_source() -> None:
    reader = fleet(A=metrics(waiting=1))
    scorer = build("queue-scorer", reader)
    assert isinstance(scorer, QueueScorer) and scorer.metrics is reader
    with pytest.raises(ConfigError, match="unknown key 'threshold'"):
        build("queue-scorer", reader, {"threshold": 3})


def test_running_requests_min_max() -> None:
    reader = fleet(A=metrics(running=4), B=metrics(running=8), C=metrics(running=None))
    assert score(RunningRequestsScorer("r", reader), A, B, C) == {A.id: 1.0, B.id: 0.0, C.id: 0.5}


# --- kv-cache-utilization-scorer -------------------------------------------------------------------


def test_kv_utilization_is_one_minus_usage() -> None:
    reader = fleet(A=metrics(kv=0.0), B=metrics(kv=0.25), C=metrics(kv=1.0))
    assert score(KVCacheUtilizationScorer("kv", reader), A, B, C) == {A.id: 1.0, B.id: 0.75, C.id: 0.0}


def test_kv_utilization_all_equal_is_absolute_not_normalised() -> None:
    reader = fleet(A=metrics(kv=0.5), B=metrics(kv=0.5))
    assert score(KVCacheUtilizationScorer("kv", reader), A, B) == {A.id: 0.5, B.id: 0.5}


def test_kv_utilization_missing_stale_or_unexported_scores_the_mean() -> None:
    reader = fleet(A=metrics(kv=0.9), B=metrics(kv=0.0, stale=True), C=metrics(kv=None), D=metrics(kv=0.5))
    scores = score(KVCacheUtilizationScorer("kv", reader), A, B, C, D)
    assert scores == {A.id: pytest.approx(0.1), B.id: pytest.approx(0.3), C.id: pytest.approx(0.3), D.id: 0.5}
    assert score(KVCacheUtilizationScorer("kv", fleet()), A, B) == {}


# --- load-aware-scorer -----------------------------------------------------------------------------


def test_load_aware_formula() -> None:
    reader = fleet(A=metrics(waiting=0), B=metrics(waiting=64), C=metrics(waiting=128), D=metrics(waiting=500))
    assert score(LoadAwareScorer("la", reader, 128), A, B, C, D) == {A.id: 0.5, B.id: 0.25, C.id: 0.0, D.id: 0.0}


def test_load_aware_threshold_parameter_and_validation() -> None:
    reader = fleet(A=metrics(waiting=5))
    scorer = build("load-aware-scorer", reader, {"threshold": 10})
    assert score(scorer, A) == {A.id: 0.25}
    assert build("load-aware-scorer", reader).threshold == 128  # type: ignore[attr-defined]
    for value in (0, -3):  # llm-d's NewLoadAware: ≤ 0 falls back to 128
        assert build("load-aware-scorer", reader, {"threshold": value}).threshold == 128  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="threshold"):
        build("load-aware-scorer", reader, {"threshold": 1.5})


def test_load_aware_unknown_engines_score_the_mean() -> None:
    reader = fleet(A=metrics(waiting=0), B=metrics(waiting=0, stale=True), D=metrics(waiting=128))
    scores = score(LoadAwareScorer("la", reader), A, B, C, D)
    assert scores == {A.id: 0.5, B.id: 0.25, C.id: 0.25, D.id: 0.0}  # B stale, C never scraped
