"""``random-picker``: ignore the scores; pick uniformly at random.

Type        ``random-picker`` (picker)
Parameters  ``maxNumOfEndpoints`` (default 1)

    plugins:
    - type: random-picker
"""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, SchedulingContext
from ppc_extproc.plugins.pickers._base import BasePicker
from ppc_extproc.plugins.registry import register

__all__ = ["RandomPicker"]


@register("random-picker")
class RandomPicker(BasePicker):
    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        with self._lock:
            return [e for e, _ in self._rng.sample(list(scored), min(self.max_endpoints, len(scored)))]
