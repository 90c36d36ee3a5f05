"""A metrics-data-source with a core-metrics-extractor writing into a store: the data-layer pair
the load scorers read, as tests drive it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind
from ppc_extproc.plugins.datalayer import CoreMetricsExtractor, MetricsDataSource, PollOptions


class Polled:
    def __init__(
        self,
        options: PollOptions,
        fetch: Callable[[str], Awaitable[bytes]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        stale_after_seconds: float = 1.0,
    ) -> None:
        self.store = EngineMetricsStore(clock=clock, stale_after_seconds=stale_after_seconds)
        extractor = CoreMetricsExtractor("core-metrics-extractor", self.store)
        self.source = MetricsDataSource("metrics-data-source", options, extractors=[extractor], clock=clock, fetch=fetch)

    def snapshot(self, endpoint: Endpoint) -> EngineMetrics | None:
        return self.store.snapshot(endpoint.id)

    def target(self, endpoint: Endpoint) -> dict[str, Any]:
        endpoints: dict[str, dict[str, Any]] = self.source.state().details["endpoints"]  # type: ignore[assignment]
        return endpoints[endpoint.id]

    def add(self, endpoint: Endpoint) -> None:
        self.source.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, endpoint))
