"""``endpoint-notification-source``: endpoint add / update / delete, delivered to its extractors.

Type        ``endpoint-notification-source`` (endpoint data source; wire it with ``dataLayer.sources``)
Behaviour   the endpoint pool notifies this source of every change (an endpoint created, its
            address, port, labels or rank changed, or it was released); the source forwards the
            event to the extractors listed under it — e.g. ``precise-prefix-cache-producer``, which
            opens a KV-event subscriber per endpoint and clears a deleted endpoint's index entries.
            An extractor's error is logged, never fatal.
Parameters  none

    plugins:
    - type: endpoint-notification-source
    - type: precise-prefix-cache-producer
    dataLayer:
      sources:
      - pluginRef: endpoint-notification-source
        extractors: [{pluginRef: precise-prefix-cache-producer}]

An endpoint extractor that no source lists still gets the events, through a source the loader adds
(``ppc-extproc check-config`` shows it): llm-d would give it none, so a precise producer would see
no KV events — the loader logs that difference once.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from ppc_extproc.framework import Consumes, EndpointEvent, EndpointExtractor, EndpointSource, plays
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, SourceWiring, register

__all__ = ["EndpointNotificationSource"]

log = structlog.get_logger(__name__)


@register("endpoint-notification-source")
class EndpointNotificationSource(EndpointSource):
    source_consumes: tuple[Consumes[object], ...] = ()

    def __init__(self, name: str = "endpoint-notification-source",
                 extractors: Sequence[EndpointExtractor] = ()) -> None:  # fmt: skip
        self.name = name
        self.extractors = tuple(dict.fromkeys(extractors))

    @classmethod
    def from_wiring(
        cls, name: str, params: Section, services: Services, wiring: SourceWiring
    ) -> EndpointNotificationSource:
        return cls(name, [e for e in wiring.extractors if plays(e, EndpointExtractor)])

    def on_endpoint_event(self, event: EndpointEvent) -> None:
        for extractor in self.extractors:
            try:
                extractor.extract(event)
            except Exception:  # one extractor's failure must not stop the others
                log.exception("endpoint_extractor_failed", extractor=extractor.name, endpoint=event.endpoint.id)
