"""Flow control's roles and its unit of work, after llm-d's framework interfaces
(``llm-d/llm-d-router: pkg/epp/framework/interface/flowcontrol/plugins.go``).

    FairnessPolicy     which flow of a priority band dispatches next
    OrderingPolicy     which request of a flow's queue dispatches next (a sort key)
    UsageLimitPolicy   a dispatch ceiling per active band, from the pool's saturation
    SaturationDetector the pool's saturation (1.0 = at its set point)
    Admitter           may reject a request before it is queued

A queued request is a ``FlowItem``; its flow is ``(fairness id, priority)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ppc_extproc.framework import Plugin
from ppc_extproc.ids import EndpointId

__all__ = [
    "DEFAULT_FLOW",
    "FAIRNESS_HEADER",
    "SLO_TTFT_HEADERS",
    "Admitter",
    "FairnessPolicy",
    "FlowItem",
    "FlowView",
    "OrderingPolicy",
    "SaturationDetector",
    "UsageLimitPolicy",
]

#: The fairness id header (llm-d ``pkg/epp/metadata/consts.go``) and the flow of a request without one.
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
DEFAULT_FLOW = "default-flow"
#: The TTFT target header of ``slo-deadline-ordering-policy`` (the second is its deprecated alias).
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")


@dataclass(eq=False, slots=True)
class FlowItem:
    """One request in flow control: identity, size, times (the controller's monotonic clock)."""

    request_id: str
    flow_id: str
    priority: int
    byte_size: int
    #: When the request reached this service (the SLO deadline counts from here).
    received: float
    #: When it entered flow control (FCFS order).
    enqueued: float
    #: Queue-wait budget in seconds; 0: unbounded.
    ttl: float = 0.0
    #: ``x-llm-d-slo-ttft-ms`` in seconds, when the request carries a valid one.
    slo_ttft: float | None = None
    model: str = ""
    target_model: str = ""
    #: Set while queued: resolved by the dispatcher.
    future: asyncio.Future[None] | None = None
    #: Insertion order, the last tie-breaker of every ordering.
    seq: int = 0
    #: Removed from its queue (cancelled or expired) while its heap entry lingers.
    dead: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class FlowView(Protocol):
    """What a fairness policy sees of one flow with queued requests."""

    @property
    def flow_id(self) -> str: ...

    @property
    def head(self) -> FlowItem: ...

    def __len__(self) -> int: ...


class OrderingPolicy(Plugin, Protocol):
    def key(self, item: FlowItem) -> tuple[float, ...]:
        """Sort key: the smallest dispatches first (the item's ``seq`` breaks ties)."""
        ...


class FairnessPolicy(Plugin, Protocol):
    def pick(self, band: int, flows: Sequence[FlowView], ordering: OrderingPolicy) -> FlowView:
        """The flow that dispatches next among ``flows`` (non-empty, in a stable order)."""
        ...

    def dispatched(self, item: FlowItem) -> None:
        """``item`` left its queue for scheduling."""
        ...

    def charged(self, flow_id: str, priority: int, uncached_tokens: int) -> None:
        """A dispatched request of the flow was routed: its uncached prompt tokens."""
        ...

    def completed(self, flow_id: str, priority: int, prompt_tokens: int | None, output_tokens: int | None) -> None:
        """A dispatched request of the flow finished, with its usage when the engine reported it."""
        ...


class UsageLimitPolicy(Plugin, Protocol):
    def ceilings(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        """One ceiling in [0, 1] per priority (``priorities`` highest first); a band dispatches
        while ``saturation < ceiling``."""
        ...


class SaturationDetector(Plugin, Protocol):
    def saturation(self, endpoints: Iterable[EndpointId], extra: Mapping[EndpointId, int], unplaced: int) -> float:
        """The pool's saturation over ``endpoints``; ``extra`` is each endpoint's net change in
        requests since its metrics were taken (routed there minus finished there: the in-flight
        credit, possibly negative), ``unplaced`` requests dispatched but not routed yet. Empty
        pool: 1.0."""
        ...

    def stale_endpoints(self) -> int:
        """Endpoints whose metrics were stale or missing at the last ``saturation`` call."""
        ...

    #: Whether saturation comes from scraped engine metrics (which lag what was dispatched).
    reads_polled_metrics: bool

    def dispatch_weight(self, endpoints: int) -> float:
        """An upper bound on what one more request in flight adds to the saturation of a pool of
        ``endpoints`` (between two full computations, each dispatch adds this)."""
        ...

    def metrics_time(self, endpoint: EndpointId) -> float | None:
        """When the metrics this detector reads for ``endpoint`` were taken (None: it reads no
        polled metrics, so nothing dispatched is unaccounted)."""
        ...


class Admitter(Plugin, Protocol):
    def admit(self, priority: int, endpoints: Sequence[EndpointId]) -> str | None:
        """None to admit, else why the request is rejected (429)."""
        ...
