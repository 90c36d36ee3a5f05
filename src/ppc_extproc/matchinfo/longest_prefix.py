"""llm-d's ``LongestPrefixScorer``: tier-weighted length of each endpoint's consecutive prefix.

``score[p] = Σ_{k < run(p)} max(weight(tier) for p's entries at key k)``, where ``run(p)`` is the
number of consecutive blocks from block 0 that ``p`` holds. Sums are float64 additions in block
order, so results equal Go's bit for bit (10 cpu blocks at 0.8 give 7.999999999999999).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ppc_extproc.ids import EndpointId
from ppc_extproc.index.memory import PrefixRun

__all__ = ["PrefixScore", "score_prefix_runs"]


@dataclass(slots=True)
class PrefixScore:
    """One prompt's prefix match on one endpoint."""

    weighted: float = 0.0
    blocks: int = 0
    blocks_by_tier: dict[str, int] = field(default_factory=dict)


def score_prefix_runs(runs: Sequence[PrefixRun]) -> dict[EndpointId, PrefixScore]:
    """Scores of the endpoints present at block 0; an endpoint absent there gets no entry."""
    if not runs:
        return {}
    if all(run.info.unit_weights for run in runs):
        return _score_unit_weights(runs)
    return _score_weighted(runs)


def _score_weighted(runs: Sequence[PrefixRun]) -> dict[EndpointId, PrefixScore]:
    """The general case: per endpoint, the best tier weight of each block, added in block order."""
    first = runs[0].info
    scores = {endpoint: PrefixScore() for endpoint in first.weights}
    alive = set(first.weights)
    alive_tiers = set(first.tiers)
    for run in runs:
        info, count = run.info, run.count
        alive.intersection_update(info.weights)
        if not alive:
            break
        alive_tiers.intersection_update(info.tiers)
        for endpoint in alive:
            score = scores[endpoint]
            weight = info.weights[endpoint]
            score.blocks += count
            if weight == 1.0 and score.weighted.is_integer():
                score.weighted += count  # exact: integer-valued floats below 2**53
            else:
                total = score.weighted
                for _ in range(count):
                    total += weight
                score.weighted = total
        for endpoint, tier in alive_tiers:
            by_tier = scores[endpoint].blocks_by_tier
            by_tier[tier] = by_tier.get(tier, 0) + count
    return scores


def _score_unit_weights(runs: Sequence[PrefixRun]) -> dict[EndpointId, PrefixScore]:
    """Every weight is 1.0: an endpoint's score is the block count at which it drops out, so only
    the endpoints (and tiers) that leave between runs need any work."""
    first = runs[0].info
    blocks: dict[EndpointId, int] = {}
    tiers: dict[tuple[EndpointId, str], int] = {}
    alive = set(first.weights)
    alive_tiers = set(first.tiers)
    done = 0
    for run in runs:
        info = run.info
        if len(info.weights) != len(alive) or not alive.issubset(info.weights):
            for endpoint in alive.difference(info.weights):
                blocks[endpoint] = done
            alive.intersection_update(info.weights)
            if not alive:
                break
        if not alive_tiers.issubset(info.tiers):
            for pair in alive_tiers.difference(info.tiers):
                tiers[pair] = done
            alive_tiers.intersection_update(info.tiers)
        done += run.count
    for endpoint in alive:
        blocks[endpoint] = done
    for pair in alive_tiers:
        tiers[pair] = done
    scores = {endpoint: PrefixScore(float(n), n, {}) for endpoint, n in blocks.items()}
    for (endpoint, tier), n in tiers.items():
        if n:
            scores[endpoint].blocks_by_tier[tier] = n
    return scores
