"""A scheduling profile: filters in order, weighted scorers, one picker.

    total[ep] = Σ_scorers weight × clamp(score(ep), 0, 1)     (not divided by Σ weights, as llm-d)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from ppc_extproc.errors import SaturatedError
from ppc_extproc.framework import Endpoint, Filter, Picker, ProfileResult, SchedulingContext, Scorer
from ppc_extproc.ids import EndpointId

__all__ = ["FILTER", "PICKER", "SCORER", "SchedulingProfile", "WeightedScorer"]

log = structlog.get_logger(__name__)

#: llm-d's extension point names (``llm-d/llm-d-router: pkg/epp/scheduling/scheduler.go``).
FILTER, SCORER, PICKER = "Filter", "Scorer", "Picker"


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0


@dataclass
class SchedulingProfile:
    name: str
    picker: Picker
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)

    def run(self, ctx: SchedulingContext, candidates: Sequence[Endpoint]) -> ProfileResult:
        """Filter, score and pick. Raises ``SaturatedError`` when filters leave nothing."""
        result = ProfileResult(targets=[])
        t0 = time.perf_counter()
        endpoints = list(candidates)
        now = t0
        for flt in self.filters:
            endpoints = flt.filter(ctx, endpoints)
            done = time.perf_counter()
            ctx.plugin_time(FILTER, flt.type_name, flt.name, done - now)
            now = done
            if not endpoints:
                raise SaturatedError(f"no endpoints available for the given request (filter {flt.name} left none)")
        t1 = now
        totals: dict[EndpointId, float] = {e.id: 0.0 for e in endpoints}
        for weighted in self.scorers:
            scorer = weighted.scorer
            try:
                raw = scorer.score(ctx, endpoints)
            except Exception:  # a broken scorer contributes nothing rather than failing the request
                log.exception("scorer_failed", scorer=scorer.name)
                raw = {}
            done = time.perf_counter()
            ctx.plugin_time(SCORER, scorer.type_name, scorer.name, done - now)
            now = done
            # One pass: clamp to [0, 1] (NaN counts as 0) and add the weighted score.
            clamped: dict[EndpointId, float] = {}
            weight, score_of = weighted.weight, raw.get
            for ep in totals:
                score = score_of(ep, 0.0)
                if not 0.0 <= score <= 1.0:
                    score = 1.0 if score > 1.0 else 0.0
                clamped[ep] = score
                totals[ep] += weight * score
            result.scores[scorer.name] = clamped
        t2 = time.perf_counter()
        result.targets = self.picker.pick(ctx, [(e, totals[e.id]) for e in endpoints])
        t3 = time.perf_counter()
        ctx.plugin_time(PICKER, self.picker.type_name, self.picker.name, t3 - t2)
        result.totals = totals
        result.timings = {"filter": t1 - t0, "score": t2 - t1, "pick": t3 - t2}
        return result
