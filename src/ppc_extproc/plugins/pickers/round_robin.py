"""``round-robin-picker``: ignore the scores and take the candidates in turn.

Type        ``round-robin-picker`` (picker)
Formula     candidates sorted by endpoint id; the ``n``-th pick returns candidate ``n mod N``
            (and the following ones, cyclically, up to ``maxNumOfEndpoints``)
Inputs      none: scores are ignored, so a profile with only this picker is Envoy's ROUND_ROBIN
            behind the ext_proc hop — the baseline the demo and the routing benchmark compare with
Parameters  ``maxNumOfEndpoints`` (1)

    plugins:
    - type: round-robin-picker
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: round-robin-picker}]

The counter is shared by all requests of this router replica (thread-safe); when the candidate
set changes, the rotation continues over the new sorted set.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ppc_extproc.framework import Endpoint, Picker, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.pickers._base import max_num_of_endpoints
from ppc_extproc.plugins.registry import Services, register

__all__ = ["RoundRobinPicker"]


@register("round-robin-picker")
class RoundRobinPicker(Picker):
    """Cycles through the candidates in endpoint-id order, ignoring scores."""

    def __init__(self, name: str, max_endpoints: int = 1) -> None:
        self.name = name
        self.max_endpoints = max_endpoints
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> RoundRobinPicker:
        return cls(name, max_num_of_endpoints(name, params))

    def pick(self, ctx: SchedulingContext, scored: Sequence[tuple[Endpoint, float]]) -> list[Endpoint]:
        endpoints = sorted((e for e, _ in scored), key=lambda e: e.id)
        if not endpoints:
            return []
        with self._lock:
            start = self._next
            self._next += 1
        n = len(endpoints)
        return [endpoints[(start + i) % n] for i in range(min(self.max_endpoints, n))]
