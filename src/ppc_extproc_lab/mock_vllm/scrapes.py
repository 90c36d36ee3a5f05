"""What the overload lab needs of an engine's ``/metrics``: a log of every scrape, and a stall.

* ``GET /mock/scrapes`` → ``{"scrapes": [[t, waiting, served_waiting, running], …], "dropped": n}``:
  per scrape, the engine's monotonic time, its real waiting queue, the waiting count the (possibly
  lagging) gauge served, and its running count; ``?clear=1`` empties the log after reading.
  At most :data:`MAX_SCRAPES` are kept (older ones are dropped and counted).
* ``POST /mock/metrics-stall {"stalled": true}``: ``/metrics`` stops answering (each scrape waits
  until the stall is lifted, at most :data:`MAX_STALL_S`, then gets a 503), as an engine whose
  API server is wedged; ``{"stalled": false}`` lifts it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

from aiohttp import web

from ppc_extproc_lab.mock_vllm.engine import MockEngine
from ppc_extproc_lab.mock_vllm.metrics import EngineCollector

__all__ = ["MAX_SCRAPES", "MAX_STALL_S", "SCRAPES", "ScrapeLog", "add_scrape_routes"]

MAX_SCRAPES: Final = 200_000
MAX_STALL_S: Final = 60.0
SCRAPES: Final = web.AppKey("scrapes", object)


class ScrapeLog:
    """Every scrape's real and served queue; the stall switch."""

    def __init__(self, engine: MockEngine, collector: EngineCollector) -> None:
        self.engine = engine
        self.collector = collector
        self.entries: deque[tuple[float, int, int, int]] = deque(maxlen=MAX_SCRAPES)
        self.dropped = 0
        self._unstalled = asyncio.Event()
        self._unstalled.set()

    @property
    def stalled(self) -> bool:
        return not self._unstalled.is_set()

    def stall(self, stalled: bool) -> None:
        if stalled:
            self._unstalled.clear()
        else:
            self._unstalled.set()

    async def wait_unstalled(self) -> bool:
        """False when the stall outlasted :data:`MAX_STALL_S`."""
        try:
            await asyncio.wait_for(self._unstalled.wait(), MAX_STALL_S)
        except TimeoutError:
            return False
        return True

    def record(self) -> None:
        """Log the scrape being served (after ``collector`` produced its gauges)."""
        if len(self.entries) == self.entries.maxlen:
            self.dropped += 1
        _, served_waiting, _ = self.collector.gauges()
        self.entries.append((time.monotonic(), self.engine.num_waiting, served_waiting, self.engine.num_running))


def add_scrape_routes(app: web.Application, log: ScrapeLog) -> None:
    app[SCRAPES] = log

    async def scrapes(request: web.Request) -> web.Response:
        body = {"scrapes": list(log.entries), "dropped": log.dropped}
        if request.query.get("clear") == "1":
            log.entries.clear()
            log.dropped = 0
        return web.json_response(body)

    async def metrics_stall(request: web.Request) -> web.Response:
        body = await request.json()
        stalled = body.get("stalled") if isinstance(body, dict) else None
        if not isinstance(stalled, bool):
            return web.json_response({"error": "body must be {\"stalled\": true|false}"}, status=400)
        log.stall(stalled)
        return web.json_response({"stalled": log.stalled})

    app.router.add_get("/mock/scrapes", scrapes)
    app.router.add_post("/mock/metrics-stall", metrics_stall)
