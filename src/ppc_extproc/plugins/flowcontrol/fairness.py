"""Fairness policies: which flow of a priority band dispatches next
(``llm-d/llm-d-router: pkg/epp/framework/plugins/flowcontrol/fairness/``)."""

from __future__ import annotations

from collections.abc import Sequence

from ppc_extproc.flowcontrol.types import FairnessPolicy, FlowItem, FlowView, OrderingPolicy
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["GlobalStrictFairness", "RoundRobinFairness"]


class _NoAccounting:
    """Fairness policies that keep no per-flow service."""

    def dispatched(self, item: FlowItem) -> None:
        return None

    def charged(self, flow_id: str, priority: int, uncached_tokens: int) -> None:
        return None

    def completed(self, flow_id: str, priority: int, prompt_tokens: int | None, output_tokens: int | None) -> None:
        return None


@register("global-strict-fairness-policy")
class GlobalStrictFairness(_NoAccounting, FairnessPolicy):
    """``global-strict-fairness-policy``: no fairness between flows; the band is one logical queue.

    Type        ``global-strict-fairness-policy`` (flow-control fairness; the default of every band)
    Rule        the flow whose head request is best by the band's ordering policy dispatches
                (ties: the earlier arrival)
    Parameters  none

        plugins:
        - type: global-strict-fairness-policy
        flowControl:
          defaultPriorityBand: {fairnessPolicyRef: global-strict-fairness-policy}
    """

    type_name = "global-strict-fairness-policy"

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> GlobalStrictFairness:
        return cls(name)

    def pick(self, band: int, flows: Sequence[FlowView], ordering: OrderingPolicy) -> FlowView:
        return min(flows, key=lambda f: (ordering.key(f.head), f.head.seq))


@register("round-robin-fairness-policy")
class RoundRobinFairness(_NoAccounting, FairnessPolicy):
    """``round-robin-fairness-policy``: flows take turns, one dispatch each.

    Type        ``round-robin-fairness-policy`` (flow-control fairness)
    Rule        flows with queued requests sorted by fairness id; the one after the band's cursor
                (the last flow served) dispatches, so no flow can starve another
    Parameters  none

        plugins:
        - type: round-robin-fairness-policy
        flowControl:
          defaultPriorityBand: {fairnessPolicyRef: round-robin-fairness-policy}
    """

    type_name = "round-robin-fairness-policy"

    def __init__(self, name: str) -> None:
        self.name = name
        #: band priority → the flow id served last
        self._cursor: dict[int, str] = {}

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> RoundRobinFairness:
        return cls(name)

    def pick(self, band: int, flows: Sequence[FlowView], ordering: OrderingPolicy) -> FlowView:
        ordered = sorted(flows, key=lambda f: f.flow_id)
        last = self._cursor.get(band)
        chosen = ordered[0]
        if last is not None:
            chosen = next((f for f in ordered if f.flow_id > last), ordered[0])
        self._cursor[band] = chosen.flow_id
        return chosen
