"""How a request leaves flow control, and the errors a dropped one is answered with
(``llm-d/llm-d-router: pkg/epp/flowcontrol/types/outcomes.go``, the mapping in
``pkg/epp/requestcontrol/admission.go`` ``translateFlowControlOutcome``)."""

from __future__ import annotations

import enum

from ppc_extproc.errors import RequestError

__all__ = ["FlowControlDropped", "Outcome", "dropped"]


class Outcome(enum.Enum):
    """llm-d's ``QueueOutcome`` names (the ``outcome`` label of the flow-control metrics)."""

    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    REJECTED_NO_ENDPOINTS = "RejectedNoEndpoints"
    REJECTED_OTHER = "RejectedOther"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_NO_ENDPOINTS = "EvictedNoEndpoints"
    EVICTED_CONTEXT_CANCELLED = "EvictedContextCancelled"
    EVICTED_OTHER = "EvictedOther"


class FlowControlDropped(RequestError):
    """A request flow control dropped: 429 (backpressure) or 503 (no serving capacity), with the
    ``x-llm-d-request-dropped-reason`` header."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_class = "ResourceExhausted" if status == 429 else "ServiceUnavailable"
        self.dropped_reason = reason


_MESSAGES = {
    "rejected-saturated": (429, "queue at capacity"),
    "rejected-ttl-expired": (429, "request timed out in queue: request TTL expired"),
    "rejected-no-endpoints": (503, "no endpoints available"),
    "rejected-context-cancelled": (503, "client disconnected: request context cancelled"),
    "rejected-shutting-down": (503, "flow controller shutting down: flow controller is not running"),
}


def dropped(reason: str, *, timed_out: bool = False, message: str | None = None) -> FlowControlDropped:
    """The error for a drop ``reason`` (llm-d's ``RequestDroppedReason`` values)."""
    status, text = _MESSAGES[reason]
    if timed_out:
        text = "request timed out in queue and no endpoints are available"
    return FlowControlDropped(status, reason, message or text)
