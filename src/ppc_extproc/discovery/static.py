"""Static endpoints (``--endpoints 10.0.0.1:8000,10.0.0.2:8000``): a fixed list, produced once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.types import Endpoint

__all__ = ["StaticDiscovery"]


class StaticDiscovery:
    """A fixed endpoint list, e.g. from ``--endpoints 10.0.0.1:8000,10.0.0.2:8000``."""

    name = "static"

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = list(endpoints)

    async def run(self, pool: EndpointPool, stop: asyncio.Event) -> None:
        pool.replace(self.endpoints)
        await stop.wait()
