"""``weighted-random-picker``: random, in proportion to the weighted totals.

Type        ``weighted-random-picker`` (picker)
Rule        A-Res weighted sampling without replacement: key ``U^(1/total)``, highest keys win;
            every total ≤ 0 ⇒ uniform random
Parameters  ``maxNumOfEndpoints`` (default 1)

    plugins:
    - type: weighted-random-picker
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.plugins.pickers._base import BasePicker
from ppc_extproc.plugins.registry import register

__all__ = ["WeightedRandomPicker"]


@register("weighted-random-picker")
class WeightedRandomPicker(BasePicker):
    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        with self._lock:
            if all(score <= 0 for _, score in scored):
                return [e for e, _ in self._rng.sample(list(scored), min(self.max_endpoints, len(scored)))]
            keyed = [
                (self._rng.random() ** (1.0 / score) if score > 0 else -1.0, i, e)
                for i, (e, score) in enumerate(scored)
            ]
        keyed.sort(key=lambda item: item[0], reverse=True)
        return [e for _, _, e in keyed[: self.max_endpoints]]
