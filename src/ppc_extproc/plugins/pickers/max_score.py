"""``max-score-picker``: the endpoint(s) with the highest weighted total.

Type        ``max-score-picker`` (picker; added to a profile that names none)
Rule        shuffle the candidates, stable-sort by total descending, take the first
            ``maxNumOfEndpoints`` — ties are broken uniformly at random (llm-d's order; for one
            endpoint, a uniform choice among the best, which is the same distribution)
Parameters  ``maxNumOfEndpoints`` (default 1): more than one yields a comma-separated fallback
            list in ``x-gateway-destination-endpoint`` (use Envoy's ``override_host`` for it)

    plugins:
    - type: max-score-picker
      parameters: {maxNumOfEndpoints: 1}
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.plugins.pickers._base import BasePicker
from ppc_extproc.plugins.registry import register

__all__ = ["MaxScorePicker"]


@register("max-score-picker")
class MaxScorePicker(BasePicker):
    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        if self.max_endpoints == 1 and scored:
            # The same distribution as the shuffle below (uniform over the tied best), without
            # shuffling and sorting every candidate on each request.
            best = max(total for _, total in scored)
            tied = [endpoint for endpoint, total in scored if total == best]
            if len(tied) == 1:
                return tied
            with self._lock:
                return [tied[self._rng.randrange(len(tied))]]
        shuffled = list(scored)
        with self._lock:
            self._rng.shuffle(shuffled)
        shuffled.sort(key=lambda item: item[1], reverse=True)  # stable: ties stay shuffled
        return [e for e, _ in shuffled[: self.max_endpoints]]
