"""no-hit-lru-scorer: warm ⇒ 0.5; cold ⇒ never-used first, then least recently used."""

from __future__ import annotations

import random
from collections.abc import MutableSequence
from typing import Any

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, Endpoint, LLMRequest, SchedulingContext, SchedulingResult
from ppc_extproc.framework.params import Section
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers import NoHitLRUScorer

A, B, C, D = (Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5))
KEY = PREFIX_CACHE_MATCH_INFO.of("p")


class InOrder(random.Random):
    """Leaves the never-used candidates in candidate order (the formula's tests read it)."""

    def shuffle(self, x: MutableSequence[Any]) -> None:  # type: ignore[override]
        pass


def scorer(**kwargs: Any) -> NoHitLRUScorer:
    return NoHitLRUScorer("n", producer_name="p", rng=InOrder(), **kwargs)


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
    s = scorer()
    assert route(s, [A, B, C], target=A, warm=B) == {A.id: 0.5, B.id: 0.5, C.id: 0.5}
    assert s.lru_order() == []


def test_cold_never_used_in_candidate_order() -> None:
    s = scorer()
    assert route(s, [A, B, C]) == {A.id: 1.0, B.id: 0.5, C.id: 0.0}


def test_never_used_candidates_are_ranked_in_a_random_order_per_instance() -> None:
    """Replicas (one scorer each) do not all send their first cold requests to one endpoint."""
    firsts = set()
    for seed in range(3):
        s = NoHitLRUScorer("n", producer_name="p", rng=random.Random(seed))
        scores = route(s, [A, B, C, D])
        assert sorted(scores.values()) == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
        firsts.add(max(scores, key=scores.__getitem__))
    assert len(firsts) > 1
    s = NoHitLRUScorer("n", producer_name="p")
    for target in (A, B, C, D):  # still a rotation: the used ones rank after every never-used one
        scores = route(s, [A, B, C, D])
        used = s.lru_order()
        assert all(scores[e.id] > max((scores[u] for u in used), default=-1) for e in (A, B, C, D) if e.id not in used)
        route(s, [A, B, C, D], target=target)


def test_single_candidate_scores_one() -> None:
    assert route(scorer(), [A]) == {A.id: 1.0}


def test_cold_routing_moves_the_target_to_mru() -> None:
    s = scorer()
    route(s, [A, B, C, D], target=A)
    route(s, [A, B, C, D], target=B)
    assert s.lru_order() == [A.id, B.id]
    # never used C, D first (1, 2/3); then A (LRU, rank 2 ⇒ 1/3), B (MRU, rank 3 ⇒ 0)
    scores = route(s, [A, B, C, D])
    assert scores == pytest.approx({C.id: 1.0, D.id: 2 / 3, A.id: 1 / 3, B.id: 0.0})
    route(s, [A, B], target=A)  # A becomes MRU
    assert s.lru_order() == [B.id, A.id]


def test_lru_positions_count_all_keys_and_clamp_at_zero() -> None:
    s = scorer()
    for target in (C, D, A, B):
        route(s, [A, B, C, D], target=target)
    # candidates A, B only: N = 2; A at lru_pos 2 ⇒ 1 − 2 < 0 ⇒ 0; B at 3 ⇒ 0
    assert route(s, [A, B]) == {A.id: 0.0, B.id: 0.0}


def test_lru_size_bounds_memory() -> None:
    s = scorer(lru_size=2)
    for target in (A, B, C):
        route(s, [A, B, C], target=target)
    assert s.lru_order() == [B.id, C.id]


def test_no_match_info_at_all_is_cold() -> None:
    s = scorer()
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
