"""Building blocks of the redis-syncer tests on a real Valkey: a syncer on the test's server, the
start that waits until every replica sees the store (and optionally its peers), and a routed
request as the scheduler hands it to ``coordinate``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, Endpoint, LLMRequest, SchedulingContext, SchedulingResult
from ppc_extproc.framework.context import ProfileResult
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import RequestKey
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.datalayer.redis_syncer import RedisSyncer
from ppc_extproc.plugins.producers.precise_prefix_cache import PRECISE_BLOCK_KEYS
from ppc_extproc.plugins.registry import Services
from ppc_extproc_lab.valkey import ValkeyServer

PRODUCER = "precise-prefix-cache-producer"


def syncer(server: ValkeyServer, services: Services | None = None, **params: Any) -> RedisSyncer:
    """A ``redis-syncer`` on ``server`` with ``params``, syncing every 50 ms (stateTTL 0.5 s)."""
    section = Section({"address": server.url, **params}, "plugins[0].parameters", "redis-syncer")
    plugin = RedisSyncer.from_parameters("redis-syncer", section, services or Services())
    plugin.configure(0.05, 0.5)
    return plugin


async def started(*plugins: RedisSyncer, peers: bool = False) -> None:
    """Start ``plugins``; return once each reaches the store (and, with ``peers``, hears the others)."""
    for plugin in plugins:
        await plugin.start()
    async with asyncio.timeout(10):
        while not all(p.up and (not peers or p.peers.live() == len(plugins) - 1) for p in plugins):
            await asyncio.sleep(0.01)


async def stopped(*plugins: RedisSyncer) -> None:
    for plugin in plugins:
        await plugin.stop()


def routed(
    endpoints: Sequence[Endpoint], keys: list[int], pick: Endpoint, known: dict[Endpoint, int] | None = None
) -> tuple[SchedulingContext, SchedulingResult]:
    """A request of block ``keys`` over ``endpoints``, picked ``pick``; ``known``: blocks each
    endpoint already holds (its match info)."""
    ctx = SchedulingContext(LLMRequest("r", "m"), list(endpoints))
    ctx.put(PRECISE_BLOCK_KEYS.of(PRODUCER), [[RequestKey(k) for k in keys]])
    for endpoint, blocks in (known or {}).items():
        info = PrefixCacheMatchInfo(blocks, len(keys), 16, blocks, {})
        ctx.put_endpoint_value(endpoint.id, PREFIX_CACHE_MATCH_INFO.of(PRODUCER), info)
    others = [e for e in endpoints if e != pick]
    totals = {e.id: 1.0 for e in endpoints}
    result = SchedulingResult("default", {"default": ProfileResult([pick, *others], totals=totals)},
                              [pick], [pick.id])  # fmt: skip
    return ctx, result


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Wait until ``condition()`` holds (TimeoutError after ``timeout`` seconds)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)
