"""Static endpoints (``--endpoints``) and llm-d's ``endpoint-notification-source`` data-layer type."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ppc_extproc.config.strict import Section
from ppc_extproc.plugins.registry import Services, register
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.types import Endpoint

__all__ = ["EndpointNotificationSource", "StaticDiscovery"]


class StaticDiscovery:
    """A fixed endpoint list, e.g. from ``--endpoints 10.0.0.1:8000,10.0.0.2:8000``."""

    name = "static"

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = list(endpoints)

    async def run(self, pool: EndpointPool, stop: asyncio.Event) -> None:
        pool.replace(self.endpoints)
        await stop.wait()


@register("endpoint-notification-source")
class EndpointNotificationSource:
    """llm-d's data-layer source that forwards endpoint add/update/delete to extractors. In
    ppc-extproc the endpoint pool does that for every producer, so this type only keeps llm-d
    configurations loading unchanged."""

    type_name: str

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def from_parameters(cls, name: str, params: Section, services: Services) -> EndpointNotificationSource:
        return cls(name)
