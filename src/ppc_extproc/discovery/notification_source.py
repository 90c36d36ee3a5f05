"""``endpoint-notification-source``: llm-d's data-layer source for endpoint add/update/delete.

Type        ``endpoint-notification-source`` (data-layer source)
Role        In llm-d it forwards endpoint changes to the extractors listed under
            ``dataLayer.sources[].extractors``. In ppc-extproc the endpoint pool notifies every
            producer that consumes endpoint events, so this type has no behaviour of its own: it
            exists so llm-d configurations load unchanged.
Parameters  none

    plugins:
    - type: endpoint-notification-source
    dataLayer:
      sources:
      - pluginRef: endpoint-notification-source
        extractors: [{pluginRef: precise-prefix-cache-producer}]
"""

from __future__ import annotations

from ppc_extproc.config.strict import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["EndpointNotificationSource"]


@register("endpoint-notification-source")
class EndpointNotificationSource:
    type_name: str

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> EndpointNotificationSource:
        return cls(name)
