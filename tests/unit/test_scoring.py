from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vectors import load_vectors

from ppc_extproc.index import InMemoryIndex, PodEntry
from ppc_extproc.matchinfo import PrefixCacheMatchInfo, score_prefix_runs
from ppc_extproc.plugins.scorers.prefix_cache import prefix_score

SCORER_VECTORS = load_vectors("scorer_vectors.json")["scorer_vectors"]


@pytest.mark.parametrize("vector", SCORER_VECTORS, ids=lambda v: v["source"].split()[-1][:40])
def test_llmd_scorer_vectors(vector: dict) -> None:
    index = InMemoryIndex(size=100, tier_weights=vector["weights"])
    for key, entries in vector["hits"].items():
        for pod, tier in entries:
            index.add(None, [int(key)], [PodEntry(pod, tier)])
    scores = score_prefix_runs(index.prefix_runs(vector["keys"]))
    assert {pod: s.weighted for pod, s in scores.items()} == vector["expected"]


@pytest.mark.parametrize(("blocks", "weighted", "truncated"), [(3, 2.4000000000000004, 2), (10, 7.999999999999999, 7), (15, 12.000000000000002, 12)])
def test_cpu_weights_accumulate_like_go(blocks: int, weighted: float, truncated: int) -> None:
    index = InMemoryIndex(size=100)
    keys = list(range(1, blocks + 1))
    index.add(None, keys, [PodEntry("b", "cpu")])
    score = score_prefix_runs(index.prefix_runs(keys))["b"]
    assert score.weighted == weighted and int(score.weighted) == truncated


def test_worked_example_tiers_counts_and_absent_endpoint() -> None:
    """llm-d's LongestPrefixScorer (llm-d/llm-d-router: pkg/kvcache/kvblock/scorer.go)."""
    index = InMemoryIndex(size=100)
    keys = list(range(1, 11))
    index.add(None, keys, [PodEntry("A", "gpu")])
    index.add(None, keys, [PodEntry("B", "cpu")])
    index.add(None, keys[:4], [PodEntry("C", "gpu")])
    scores = score_prefix_runs(index.prefix_runs(keys, ["A", "B", "C", "D"]))
    assert {p: (int(s.weighted), s.blocks, s.blocks_by_tier) for p, s in scores.items()} == {
        "A": (10, 10, {"gpu": 10}),
        "B": (7, 10, {"cpu": 10}),
        "C": (4, 4, {"gpu": 4}),
    }
    assert "D" not in scores


def test_tier_chain_continues_across_tiers_and_counts_each_tier_from_block_zero() -> None:
    index = InMemoryIndex(size=100, tier_weights={"gpu": 1.0, "cpu": 0.5})
    index.add(None, [1, 2], [PodEntry("A", "gpu")])
    index.add(None, [1, 2, 3], [PodEntry("A", "cpu")])
    index.add(None, [2], [PodEntry("A", "", speculative=True)])
    score = score_prefix_runs(index.prefix_runs([1, 2, 3, 4]))["A"]
    assert score.weighted == 2.5 and score.blocks == 3
    assert score.blocks_by_tier == {"gpu": 2, "cpu": 3}  # speculative not at block 0


def test_speculative_entries_weigh_one_and_count_apart() -> None:
    index = InMemoryIndex(size=100)
    index.add(None, [1, 2], [PodEntry("A", "", speculative=True)])
    score = score_prefix_runs(index.prefix_runs([1, 2]))["A"]
    assert score.weighted == 2.0 and score.blocks_by_tier == {"speculative": 2}


@pytest.mark.parametrize(
    ("info", "weight", "scale", "expected"),
    [
        (None, 0.0, 8192, 0.0),
        (PrefixCacheMatchInfo(0, 0, 16), 0.0, 8192, 0.0),
        (PrefixCacheMatchInfo(10, 10, 64), 0.0, 8192, 1.0),
        (PrefixCacheMatchInfo(7, 10, 64), 0.0, 8192, 0.7),
        (PrefixCacheMatchInfo(4, 10, 64), 0.5, 512, 0.5 * 0.4 + 0.5 * 0.25),  # 256/512 = 0.5, squared
        (PrefixCacheMatchInfo(10, 10, 64), 1.0, 320, 1.0),  # length saturates at the scale
    ],
)
def test_prefix_cache_scorer_formula(info, weight, scale, expected) -> None:
    assert prefix_score(info, weight, scale) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("ABCD"), st.sampled_from(["gpu", "", "storage"])), min_size=1, max_size=6), min_size=1, max_size=12))
def test_unit_weight_fast_path_equals_the_general_loop(blocks) -> None:
    from ppc_extproc.matchinfo.longest_prefix import _score_unit_weights, _score_weighted

    index = InMemoryIndex(size=1000)
    keys = list(range(1, len(blocks) + 1))
    for key, entries in zip(keys, blocks):
        for pod, tier in entries:
            index.add(None, [key], [PodEntry(pod, tier, speculative=tier == "")])
    runs = index.prefix_runs(keys)
    if runs:
        assert _score_unit_weights(runs) == _score_weighted(runs)
