"""A priority band's queues: one heap per flow, ordered by the band's ordering policy's key
(insertion order breaks ties); removed items stay in the heap, marked dead, until they reach its
top or the heap is compacted."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ppc_extproc.flowcontrol.config import BandSpec
from ppc_extproc.flowcontrol.types import FairnessPolicy, FlowItem, OrderingPolicy

__all__ = ["Band", "Flow"]


class Flow:
    """One flow's queue (a ``FlowView``)."""

    __slots__ = ("bytes", "flow_id", "heap", "live")

    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        self.heap: list[tuple[tuple[float, ...], int, FlowItem]] = []
        self.live = 0
        self.bytes = 0

    @property
    def head(self) -> FlowItem:
        heap = self.heap
        while heap[0][2].dead:
            heapq.heappop(heap)
        return heap[0][2]

    def __len__(self) -> int:
        return self.live

    def pop(self) -> FlowItem:
        item = self.head
        heapq.heappop(self.heap)
        return item

    def compact(self) -> None:
        if len(self.heap) > 2 * self.live + 16:
            self.heap = [e for e in self.heap if not e[2].dead]
            heapq.heapify(self.heap)


@dataclass(slots=True)
class Band:
    """One priority band: its flows, counts and policies."""

    spec: BandSpec
    fairness: FairnessPolicy
    ordering: OrderingPolicy
    flows: dict[str, Flow] = field(default_factory=dict)
    requests: int = 0
    bytes: int = 0
    #: Dispatches of other bands since this band last dispatched while it had queued requests.
    skipped: int = 0

    @property
    def priority(self) -> int:
        return self.spec.priority
