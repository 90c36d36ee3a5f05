"""Ordering policies: which request of a flow's queue dispatches next
(``llm-d/llm-d-router: pkg/epp/framework/plugins/flowcontrol/ordering/``). Each is a sort key;
the controller's insertion order breaks ties, so every queue is a heap."""

from __future__ import annotations

from ppc_extproc.flowcontrol.types import FlowItem, OrderingPolicy
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["EdfOrdering", "FcfsOrdering", "SloDeadlineOrdering"]

_NEVER = float("inf")


class _Ordering(OrderingPolicy):
    type_name = ""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> _Ordering:
        return cls(name)


@register("fcfs-ordering-policy")
class FcfsOrdering(_Ordering):
    """``fcfs-ordering-policy``: first come, first served.

    Type        ``fcfs-ordering-policy`` (flow-control ordering; the default of every band)
    Key         the time the request entered flow control
    Parameters  none

        plugins:
        - type: fcfs-ordering-policy
        flowControl:
          priorityBands: [{priority: 0, orderingPolicyRef: fcfs-ordering-policy}]
    """

    def key(self, item: FlowItem) -> tuple[float, ...]:
        return (item.enqueued,)


@register("edf-ordering-policy")
class EdfOrdering(_Ordering):
    """``edf-ordering-policy``: earliest deadline first.

    Type        ``edf-ordering-policy`` (flow-control ordering)
    Key         deadline = enqueue time + the request's TTL; no TTL (0) ⇒ after every deadline;
                ties ⇒ FCFS
    Parameters  none

        plugins:
        - type: edf-ordering-policy
        flowControl:
          defaultPriorityBand: {orderingPolicyRef: edf-ordering-policy}
    """

    def key(self, item: FlowItem) -> tuple[float, ...]:
        deadline = item.enqueued + item.ttl if item.ttl > 0 else _NEVER
        return (deadline, item.enqueued)


@register("slo-deadline-ordering-policy")
class SloDeadlineOrdering(_Ordering):
    """``slo-deadline-ordering-policy``: earliest TTFT deadline first.

    Type        ``slo-deadline-ordering-policy`` (flow-control ordering)
    Key         deadline = received + ``x-llm-d-slo-ttft-ms`` (deprecated ``x-slo-ttft-ms``);
                missing, empty or not an integer ⇒ after every deadline; ties ⇒ received time
    Parameters  none

        plugins:
        - type: slo-deadline-ordering-policy
        flowControl:
          defaultPriorityBand: {orderingPolicyRef: slo-deadline-ordering-policy}
    """

    def key(self, item: FlowItem) -> tuple[float, ...]:
        deadline = item.received + item.slo_ttft if item.slo_ttft is not None else _NEVER
        return (deadline, item.received)
