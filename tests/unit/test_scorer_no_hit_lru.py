"""no-hit-lru-scorer: warm ⇒ 0.5; cold ⇒ never-used first, then least recently used."""

from __future__ import annotations

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, Endpoint, LLMRequest, SchedulingContext, SchedulingResult
from ppc_extproc.framework.params import Section
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers import NoHitLRUScorer

A, B, C, D = (Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5))
KEY = PREFIX_CACHE_MATCH_INFO.of("p")


def route(scorer: NoHitLRUScorer, endpoints: list[Endpoint], target: Endpoint | None = None,
          warm: Endpoint | None = None) -> dict[str, float]:
    ctx = SchedulingContext(LLMRequest("r", "m"), endpoints)
    for e in endpoints:
        ctx.put_endpoint_value(e.id, KEY, PrefixCacheMatchInfo(1 if e == warm else 0, 4, 64))
    scores = scorer.score(ctx, endpoints)
    if target is not None:
        scorer.pre_request(ctx, SchedulingResult.of([target]))
    return scores


def test_warm_request_is_neutral_and_does_not_touch_the_lru() -> None:
    s = NoHitLRUScorer("n", producer_name="p")
    assert route(s, [A, B, C], target=A, warm=B) == {A.id: 0.5, B.id: 0.5, C.id: 0.5}
    assert s.lru_order() == []


def test_cold_never_used_in_candidate_order() -> None:
    s = NoHitLRUScorer("n", producer_name="p")
    assert route(s, [A, B, C]) == {A.id: 1.0, B.id: 0.5, C.id: 0.0}


def test_single_candidate_scores_one() -> None:
    assert route(NoHitLRUScorer("n", producer_name="p"), [A]) == {A.id: 1.0}


def test_cold_routing_moves_the_target_to_mru() -> None:
    s = NoHitLRUScorer("n", producer_name="p")
    route(s, [A, B, C, D], target=A)
    route(s, [A, B, C, D], target=B)
    assert s.lru_order() == [A.id, B.id]
    # never used C, D first (1, 2/3); then A (LRU, rank 2 ⇒ 1/3), B (MRU, rank 3 ⇒ 0)
    scores = route(s, [A, B, C, D])
    assert scores == pytest.approx({C.id: 1.0, D.id: 2 / 3, A.id: 1 / 3, B.id: 0.0})
    route(s, [A, B], target=A)  # A becomes MRU
    assert s.lru_order() == [B.id, A.id]


def test_lru_positions_count_all_keys_and_clamp_at_zero() -> None:
    s = NoHitLRUScorer("n", producer_name="p")
    for target in (C, D, A, B):
        route(s, [A, B, C, D], target=target)
    # candidates A, B only: N = 2; A at lru_pos 2 ⇒ 1 − 2 < 0 ⇒ 0; B at 3 ⇒ 0
    assert route(s, [A, B]) == {A.id: 0.0, B.id: 0.0}


def test_lru_size_bounds_memory() -> None:
    s = NoHitLRUScorer("n", lru_size=2, producer_name="p")
    for target in (A, B, C):
        route(s, [A, B, C], target=target)
    assert s.lru_order() == [B.id, C.id]


def test_no_match_info_at_all_is_cold() -> None:
    s = NoHitLRUScorer("n", producer_name="p")
    ctx = SchedulingContext(LLMRequest("r", "m"), [A, B])
    assert s.score(ctx, [A, B]) == {A.id: 1.0, B.id: 0.0}


def test_parameters() -> None:
    s = NoHitLRUScorer.from_parameters(
        "n", Section({"lruSize": 8, "prefixPluginType": "x", "prefixPluginName": "y"}, "p"), Services()
    )
    assert s.lru_size == 8 and s.producer_name == ""
    assert s.match_key == PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")
    with pytest.raises(ConfigError, match="lruSize"):
        NoHitLRUScorer.from_parameters("n", Section({"lruSize": 0}, "p"), Services())
