"""Pickers: choose endpoints from the weighted totals.

``max-score-picker``   shuffle, then stable sort by total descending, take ``maxNumOfEndpoints``
                       (ties broken uniformly at random)
``random-picker``      uniform random
``weighted-random-picker``  A-Res sampling with key ``U^(1/score)``; all scores ≤ 0 ⇒ random
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

from ppc_extproc.config.strict import Section
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.types import Endpoint, SchedulingContext

__all__ = ["MaxScorePicker", "RandomPicker", "WeightedRandomPicker"]


class _Picker:
    type_name: str

    def __init__(self, name: str, max_endpoints: int = 1, rng: random.Random | None = None) -> None:
        self.name = name
        self.max_endpoints = max_endpoints
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> _Picker:
        return cls(name, params.integer("maxNumOfEndpoints", 1, minimum=1))


@register("max-score-picker")
class MaxScorePicker(_Picker):
    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        shuffled = list(scored)
        with self._lock:
            self._rng.shuffle(shuffled)
        shuffled.sort(key=lambda item: item[1], reverse=True)  # stable: ties stay shuffled
        return [e for e, _ in shuffled[: self.max_endpoints]]


@register("random-picker")
class RandomPicker(_Picker):
    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        with self._lock:
            return [e for e, _ in self._rng.sample(list(scored), min(self.max_endpoints, len(scored)))]


@register("weighted-random-picker")
class WeightedRandomPicker(_Picker):
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
