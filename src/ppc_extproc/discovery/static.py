"""Static endpoints (``--endpoints 10.0.0.1:8000,10.0.0.2:8000``): a fixed list, produced once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ppc_extproc.framework import Discovery, Endpoint, EndpointRegistry

__all__ = ["StaticDiscovery"]


class StaticDiscovery(Discovery):
    """A fixed endpoint list, e.g. from ``--endpoints 10.0.0.1:8000,10.0.0.2:8000``."""

    name = "static"
    type_name = "static"

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = list(endpoints)

    async def run(self, registry: EndpointRegistry, stop: asyncio.Event) -> None:
        registry.replace(self.endpoints)
        await stop.wait()
