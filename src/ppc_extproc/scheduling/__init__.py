"""Scheduling: endpoints, requests, the plugin pipeline and the router."""

from __future__ import annotations

from ppc_extproc.scheduling.types import (
    Endpoint,
    EndpointEvent,
    EndpointEventKind,
    LLMRequest,
    SchedulingContext,
)

__all__ = ["Endpoint", "EndpointEvent", "EndpointEventKind", "LLMRequest", "SchedulingContext"]
