"""The oracle: route client-side with perfect knowledge of the engines' caches.

For each request, ask every engine ``POST /mock/match`` with the prompt in the form the request
carries (token ids, text or chat messages: the engine tokenises it as it would the request) —
what it would serve from cache right now, no side effects — and send the request straight to
the engine with the most cached tokens; ties go to the engine with the fewest requests this
client has in flight there, then at random (seeded). No Envoy and no service in the path — same engines, same time model. It is the bound
on hit rate for this workload, not on latency: it does not trade cache for load.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

__all__ = ["OracleTarget"]


class OracleTarget:
    """A :class:`~ppc_extproc_lab.workload.runner.Target` over the engines' base URLs."""

    def __init__(self, engine_urls: Sequence[str], *, seed: int = 0, match_timeout_s: float = 10.0) -> None:
        if not engine_urls:
            raise ValueError("the oracle needs at least one engine")
        self.engine_urls = list(engine_urls)
        self.in_flight = {u: 0 for u in self.engine_urls}
        self._rng = random.Random(f"{seed}/oracle")
        self._timeout = aiohttp.ClientTimeout(total=match_timeout_s)
        #: Requests routed, and how many of them no engine could match (e.g. a request form
        #: its ``/mock/match`` does not take): those were routed by load alone.
        self.routed = 0
        self.unanswered = 0

    async def _cached(self, http: aiohttp.ClientSession, url: str, body: bytes) -> int:
        try:
            async with http.post(
                url + "/mock/match",
                data=body,
                headers={"content-type": "application/json"},
                timeout=self._timeout,
            ) as resp:
                if resp.status != 200:
                    return -1
                return int((await resp.json())["matched_tokens"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return -1  # an engine that does not answer is never preferred

    def choose(self, cached: Sequence[int]) -> str:
        """The engine for per-engine cached-token counts (in ``engine_urls`` order)."""
        best = max(cached)
        tied = [u for u, c in zip(self.engine_urls, cached, strict=True) if c == best]
        fewest = min(self.in_flight[u] for u in tied)
        least_loaded = [u for u in tied if self.in_flight[u] == fewest]
        return least_loaded[0] if len(least_loaded) == 1 else self._rng.choice(least_loaded)

    async def acquire(self, http: aiohttp.ClientSession, match: Mapping[str, Any]) -> str:
        body = orjson.dumps(match)
        cached = await asyncio.gather(*(self._cached(http, u, body) for u in self.engine_urls))
        if max(cached) < 0:
            self.unanswered += 1
        url = self.choose(cached)
        self.in_flight[url] += 1
        self.routed += 1
        return url

    def release(self, url: str) -> None:
        self.in_flight[url] -= 1
